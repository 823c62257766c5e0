"""The devices of a population: how fast each one trains and communicates, and when it is available.

:class:`Devices` holds one entry per training client as host (NumPy) arrays, made once per participation and
population (:meth:`fljax.participation.Participation.devices`); inside a compiled round they are constants. Its
methods are the virtual clock's arithmetic, traced:

* :meth:`Devices.seconds` — a client's round time (heterogeneity spec, "a virtual clock"), for s local steps of b
  samples each, D bytes down and U bytes up::

      time_i = s · b · ms_i · factor / 1000  +  8 · (D + U) / (1000 · kbps_i)      seconds

  ``ms_i`` the device's milliseconds per training sample (× ``compute_factor``), ``kbps_i`` its bandwidth in kbit/s;
* :meth:`Devices.available` — who may be selected at virtual time t; :meth:`Devices.until` — when the availability
  a client has at t ends (H1: a client that becomes unavailable before it reports fails); :meth:`Devices.next_start`
  — the first moment from t on when some client is available (a round that finds nobody waits until then).

Availability models: ``always``; ``diurnal`` — client i is available while frac(t/P + φ_i) < f (period P, on-fraction
f, phase φ_i ~ U[0, 1) from the participation's seed); ``trace`` — FedScale's intervals
(:mod:`fljax.participation.traces`), client i available at t iff active_k ≤ t mod finish_i ≤ inactive_k for some k.
Times are float32 seconds, the engine's precision.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["Devices", "add"]


def add(a, b):
    """a + b with both rounded first: XLA may otherwise fuse a product into the sum (a fused multiply-add rounds
    once), and clocks computed in two places would differ in the last bit."""
    a, b = jax.lax.optimization_barrier((a, b))
    return a + b


@dataclasses.dataclass(frozen=True, eq=False)
class Devices:
    """The devices of ``n`` training clients. ``ms_per_sample``, ``kbps``: [n] (None: no clock, every time 0).
    ``availability``: 'always', 'diurnal' (``phase`` [n], ``period``, ``on_fraction``) or 'trace' (``active``,
    ``inactive`` [n, K], ``finish`` [n])."""

    n: int
    ms_per_sample: np.ndarray | None = None
    kbps: np.ndarray | None = None
    availability: str = "always"
    phase: np.ndarray | None = None
    period: float = 1.0
    on_fraction: float = 1.0
    active: np.ndarray | None = None
    inactive: np.ndarray | None = None
    finish: np.ndarray | None = None

    @property
    def clocked(self) -> bool:
        return self.kbps is not None

    @property
    def seconds_per_sample(self) -> np.ndarray:
        """[n] float32: ms_i/1000, computed on the host."""
        return (np.asarray(self.ms_per_sample, np.float64) / 1000).astype(np.float32)

    @property
    def bytes_per_second(self) -> np.ndarray:
        """[n] float32: 1000·kbps_i/8, computed on the host."""
        return (np.asarray(self.kbps, np.float64) * 125).astype(np.float32)

    # ------------------------------------------------------------------------------------------------ time
    def step_seconds(self, ids, samples_per_step):
        """Seconds of one local step of ``samples_per_step`` samples on each of the devices ``ids``."""
        return jnp.asarray(samples_per_step, jnp.float32) * jnp.asarray(self.seconds_per_sample)[ids]

    def comm_seconds(self, ids, nbytes):
        """Seconds to download and upload ``nbytes`` bytes in all on each of the devices ``ids``."""
        return jnp.asarray(nbytes, jnp.float32) / jnp.asarray(self.bytes_per_second)[ids]

    def seconds(self, ids, steps, samples_per_step, nbytes):
        """A round's time on each device ``ids``: ``steps`` local steps of ``samples_per_step`` samples, then
        ``nbytes`` bytes down and up (module docstring); zeros without a clock. Float32, every operation rounded
        on its own (no fused multiply-add), so that a plain loop computing the same products and sums in float32
        gets the same times, ties included."""
        if not self.clocked:
            return jnp.zeros(jnp.shape(ids), jnp.float32)
        compute = jnp.asarray(steps, jnp.float32) * self.step_seconds(ids, samples_per_step)
        return add(compute, self.comm_seconds(ids, nbytes))

    # ------------------------------------------------------------------------------------------------ availability
    def _diurnal_position(self, t):
        """frac(t/P + φ_i) of every client."""
        return jnp.mod(jnp.asarray(t, jnp.float32) / self.period + jnp.asarray(self.phase, jnp.float32), 1.0)

    def _trace_position(self, t):
        """(t mod finish_i [n, 1], the intervals holding it [n, K])."""
        tau = jnp.mod(jnp.asarray(t, jnp.float32), jnp.asarray(self.finish, jnp.float32))[:, None]
        on = (jnp.asarray(self.active, jnp.float32) <= tau) & (tau <= jnp.asarray(self.inactive, jnp.float32))
        return tau, on

    def available(self, t):
        """[n] bool: who is available at virtual time ``t`` (None: everyone, always)."""
        if self.availability == "diurnal":
            return self._diurnal_position(t) < self.on_fraction
        if self.availability == "trace":
            return jnp.any(self._trace_position(t)[1], axis=1)
        return None

    def until(self, t):
        """[n] float32: when the availability each client has at ``t`` ends (+inf: always available; a client
        unavailable at ``t`` gets ``t``)."""
        t = jnp.asarray(t, jnp.float32)
        if self.availability == "diurnal":
            pos = self._diurnal_position(t)
            return jnp.where(pos < self.on_fraction, t + (self.on_fraction - pos) * self.period, t)
        if self.availability == "trace":
            tau, on = self._trace_position(t)
            left = jnp.max(jnp.where(on, jnp.asarray(self.inactive, jnp.float32) - tau, -jnp.inf), axis=1)
            return jnp.where(jnp.isfinite(left), t + left, t)
        return jnp.full((self.n,), jnp.inf, jnp.float32)

    def next_start(self, t):
        """The first moment from ``t`` on when some client is available (``t`` when one is)."""
        t = jnp.asarray(t, jnp.float32)
        if self.availability == "diurnal":
            pos = self._diurnal_position(t)
            wait = jnp.where(pos < self.on_fraction, 0.0, (1.0 - pos) * self.period)
        elif self.availability == "trace":
            tau, on = self._trace_position(t)
            active = jnp.asarray(self.active, jnp.float32)
            later = jnp.min(jnp.where(active > tau, active - tau, jnp.inf), axis=1)  # this period
            first = jnp.min(active, axis=1)  # next period (+inf: never available)
            period = jnp.asarray(self.finish, jnp.float32)
            wait = jnp.where(jnp.any(on, axis=1), 0.0, jnp.minimum(later, period - tau[:, 0] + first))
        else:
            return t
        return t + jnp.min(wait)
