"""Refusing a simulation that cannot fit in memory, before anything is written.

An absurd model (``model.options.hidden=[1000000000]``) or minibatch (``algo.batch_size=1000000000``) passes
every range check, then fails minutes later with an allocator error, after the run directory was started.
:func:`check_fits` compares a lower bound of what one run holds with the memory of the device it runs on:

    need = bytes(state) + 4 · K · B

where the state is the server's and every client's pytree (:meth:`~fljax.engine.Simulation.state_shapes`, from
shapes only: nothing is allocated) and K · B the local steps times the minibatch width of one client in a round,
whose int32 minibatch indices are materialised at once (:class:`~fljax.data.batching.BatchPlan`). Both terms are
held whatever the executor, so a run refused here could never have run. What a run computes on the way (the
activations of the clients running side by side, in training and evaluation, lanes) is planned per compiled
program by :mod:`fljax.engine.budget`: client maps run in chunks that fit the device, and a program that cannot fit
even one client at a time is refused in one line; :func:`check_fits` traces the run's programs under their budgets
first (:meth:`~fljax.engine.Simulation.plan_memory`), so that refusal too comes before anything is written.
"""
from __future__ import annotations

import jax  # noqa: F401  (device_memory reads jax.local_devices; tests replace it here)

from fljax import tree
from fljax.data.memory import size_text, sizes_apart
from fljax.engine.budget import device_memory
from fljax.errors import ConfigError

__all__ = ["check_fits", "device_memory"]

INDEX_BYTES = 4  # one int32 minibatch index per sample drawn


def check_fits(sim) -> None:
    """Raise :class:`~fljax.errors.ConfigError` naming the keys to change when one run of ``sim`` (a
    :class:`~fljax.engine.Simulation`) needs more memory than :func:`device_memory`."""
    state = tree.nbytes(sim.state_shapes())
    _, samples = sim.work_per_round()
    cohort = max(1, sim.algorithm.participants(sim.data.num_clients))
    indices = INDEX_BYTES * (samples // cohort)
    where, have = device_memory()
    if state + indices <= have:
        sim.plan_memory()  # a program that cannot fit one client at a time (fljax.engine.budget), refused now
        return
    if indices > state:
        what = (f"one client's round draws {samples // cohort:,} samples ({size_text(indices)} of minibatch "
                f"indices); lower algo.batch_size or the local steps (algo.local_steps, algo.local_epochs)")
    else:
        what = (f"the server's and clients' states take {size_text(state)}; choose a smaller model (model.name, "
                f"model.options) or fewer clients (data.num_clients)")
    need, has = sizes_apart(state + indices, have)
    raise ConfigError(f"the simulation needs at least {need} of memory, more than the {has} of {where}: {what}.")
