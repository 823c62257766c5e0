"""Several runs of one experiment as one compiled program: lanes.

A lane is one run: a seed, its data (shared by every lane, or its own of the same shapes) and its values of the
*traced* hyperparameters (the algorithm's own when there are none). The block of rounds and the evaluation are
``vmap``-ed over a leading lane axis of :class:`State`, of the data when each lane has its own, and of the traced
hyperparameters, so seeds, trials and a grid of learning rates all run as ONE program.

The lanes' programs are built from the simulation's pure functions (:meth:`~fljax.engine.Simulation.init_fn`,
:meth:`~fljax.engine.Simulation.block_fn`, :meth:`~fljax.engine.Simulation.evaluate_fn`) and compiled through its
cache (:meth:`~fljax.engine.Simulation.compiled`). Lane i's state starts from ``Simulation.init(seeds[i], hps[i])``
on its own data (an algorithm's ``init`` may read the data: FedGiA's precomputation), so it draws exactly the random
numbers a separate run with that seed draws; the results agree with separate runs to floating-point tolerance
(batched matmuls may round differently).
:func:`stack_data` refuses data of different shapes; such runs go one after another. The stopping-rule driver
(:func:`fljax.engine.run_until`) runs lanes too, each until its own stop.
"""
from __future__ import annotations

import copy

import jax
import jax.numpy as jnp
import numpy as np

from fljax import tree
from fljax.engine.driver import RunResult, Simulation
from fljax.engine.executors import ShardedExecutor
from fljax.engine.loop import NonFiniteGuard, RunLog, drive

__all__ = ["Lanes", "stack_data", "stack_hyperparameters", "can_batch"]


def can_batch(sim: Simulation, datas: list | None = None) -> bool:
    """True when ``sim``'s rounds can run vmapped over lanes: a jitted, single-device executor, the clients' state
    on the device (a store keeps one run's: :mod:`fljax.engine.store`) and (when each lane has its own data) data of
    identical shapes."""
    if not sim.executor.jittable or isinstance(sim.executor, ShardedExecutor) or sim.store_engine is not None:
        return False
    return datas is None or stack_data(datas) is not None


def stack_data(datas: list):
    """The per-lane data stacked along a new leading axis, or None when their shapes or static fields differ."""
    structures = {jax.tree.structure(d) for d in datas}
    shapes = {tuple(x.shape for x in jax.tree.leaves(d)) for d in datas}
    if len(structures) > 1 or len(shapes) > 1:
        return None
    return tree.stack(datas)


def stack_hyperparameters(sim: Simulation, hps: list[dict]) -> dict:
    """``[{"lr": 0.1}, {"lr": 0.3}]`` → ``{"lr": Array([0.1, 0.3])}`` in each field's dtype (JAX's default float
    for floats: float32, float64 under x64, as a Python float is traced in a separate run; int32 for ints). Every
    lane must set the same keys."""
    keys = {tuple(sorted(h)) for h in hps}
    if len(keys) != 1:
        raise ValueError(f"every lane must set the same hyperparameters, got {sorted(keys)}.")
    out = {}
    for key in sorted(hps[0]):
        values = [h[key] for h in hps]
        dtype = jnp.int32 if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values) \
            else jax.dtypes.canonicalize_dtype(jnp.float64)
        out[key] = jnp.asarray(values, dtype)
    return out


LANE_MAPS = ("vmap", "map")


class Lanes:
    """``sim`` run for every lane at once: ``seeds[i]``, data ``datas[i]`` (None: ``sim.data`` for all) and traced
    hyperparameters ``hps[i]`` (None: the algorithm's own values, not traced). ``mode``: 'vmap' batches the lanes
    (fastest; batched reductions may round differently from a separate run), 'map' runs them one after another
    inside the one program (``lax.map``: each lane is bit-identical to its own run of the traced program).
    ``data`` holds the lanes' data, stacked along a leading axis ``data_axis`` = 0 when each lane has its own (None:
    one data set for all); ``hp`` the stacked traced hyperparameters (None: none)."""

    def __init__(self, sim: Simulation, seeds: list[int], datas: list | None = None, hps: list[dict] | None = None,
                 mode: str = "vmap"):
        if mode not in LANE_MAPS:
            raise ValueError(f"mode must be one of {LANE_MAPS}, got {mode!r}.")
        if not can_batch(sim, datas):
            raise ValueError("these runs cannot run as one program (loop or sharded executor, a client-state store, "
                             "or data of different shapes per lane); run them one after another.")
        self.sim = sim
        self.seeds = list(seeds)
        self.data = sim.data if datas is None else stack_data(datas)
        self.data_axis = None if datas is None else 0
        self.hp = self._stacked(hps)
        self.mode = mode

    def _stacked(self, hps: list[dict] | None):
        if hps is not None and len(hps) != len(self.seeds):
            raise ValueError(f"{len(self.seeds)} seeds but {len(hps)} hyperparameter settings.")
        return None if not hps or not hps[0] else stack_hyperparameters(self.sim, hps)

    @property
    def side_by_side(self) -> int:
        """Lanes that run at once ('vmap': all, so each lane's client maps get that share of a program's memory
        budget; 'map': one at a time)."""
        return len(self.seeds) if self.mode == "vmap" else 1

    @property
    def compile_seconds(self) -> float:
        return self.sim.compile_seconds

    def with_hyperparameters(self, hps: list[dict] | None) -> "Lanes":
        """The same seeds and (already stacked) data with other traced hyperparameter values ``hps[i]``."""
        other = copy.copy(self)
        other.hp = self._stacked(hps)
        return other

    def _over_lanes(self, fn):
        """``fn(x, data, hp)`` over the lane axis of ``x``, of the data (if per lane) and of hp."""
        data_axis = self.data_axis
        hp_axis = None if self.hp is None else 0
        if self.mode == "vmap":
            return jax.vmap(fn, in_axes=(0, data_axis, hp_axis))

        def mapped(x, data, hp):
            per_lane = (x, data if data_axis == 0 else None, hp if hp_axis == 0 else None)
            return jax.lax.map(lambda a: fn(a[0], data if data_axis is None else a[1], hp if hp_axis is None
                                             else a[2]), per_lane)

        return mapped

    def init(self):
        """The lanes' initial states, stacked: lane i is exactly ``Simulation.init(seeds[i], hps[i])`` on its own
        data."""
        keys = self._keys()
        return self.sim.compiled("lanes_init", self._init_fn(), (keys, self.data, self.hp), (self.mode,),
                                 self.side_by_side)(keys, self.data, self.hp)

    def run_rounds(self, states, n: int, capacity: int | None = None):
        """n rounds of every lane as one compiled program; metrics have shape [lanes, n] (``capacity``: one program
        for every n up to it, the metrics [lanes, capacity], as :meth:`Simulation.run_rounds`)."""
        capacity = n if capacity is None else capacity
        if not 1 <= n <= capacity:
            raise ValueError(f"run_rounds: n = {n} rounds must be between 1 and capacity = {capacity}.")
        return self.sim.compiled("lanes_block", self._block_fn(capacity), (states, self.data, self.hp, jnp.int32(n)),
                                 (capacity, self.mode), self.side_by_side)(states, self.data, self.hp, jnp.int32(n))

    def evaluate(self, states):
        return self.sim.compiled("lanes_evaluate", self._evaluate_fn(), (states, self.data, self.hp), (self.mode,),
                                 self.side_by_side)(states, self.data, self.hp)

    def prepare(self, capacity: int) -> None:
        """Ask for the lanes' programs (initialisation, blocks of up to ``capacity`` rounds, evaluation) from shapes:
        traced now, compiled in the background (:meth:`Simulation.request`)."""
        keys = jax.eval_shape(self._keys)
        states = jax.eval_shape(self._init_fn(), keys, self.data, self.hp)
        n = jax.ShapeDtypeStruct((), jnp.int32)
        for name, fn, args, static in (
                ("lanes_block", self._block_fn(capacity), (states, self.data, self.hp, n), (capacity, self.mode)),
                ("lanes_init", self._init_fn(), (keys, self.data, self.hp), (self.mode,)),
                ("lanes_evaluate", self._evaluate_fn(), (states, self.data, self.hp), (self.mode,))):
            self.sim.request(name, fn, args, static, self.side_by_side)

    def pending(self) -> list[str]:
        return self.sim.pending()

    def wait(self, report=None) -> None:
        self.sim.wait(report)

    def _keys(self):
        return jnp.stack([jax.random.PRNGKey(s) for s in self.seeds])

    def _init_fn(self):
        return self._over_lanes(lambda k, d, h: self.sim.init_fn(k, h, d))

    def _block_fn(self, capacity: int):
        """The lanes' block of ``n`` rounds (an argument shared by the lanes) in rows of ``capacity``."""
        def block(states, data, hp, n):
            return self._over_lanes(lambda s, d, h: self.sim.block_fn(s, d, n, h, capacity=capacity))(states, data, hp)

        return block

    def _evaluate_fn(self):
        return self._over_lanes(self.sim.evaluate_fn)

    def run(self, rounds: int, eval_every: int, states=None, logs: list[RunLog] | None = None, *,
            checkpoint_every: int = 0, callback=None, on_checkpoint=None, on_stop=None,
            guards: tuple = (NonFiniteGuard(),), progress: bool | str = True, should_stop=None
            ) -> tuple[list[RunResult], dict]:
        """Like :meth:`Simulation.run` for every lane; ``callback(lane, record, state)``, ``on_checkpoint(lane, state,
        log)`` and ``on_stop(lane, message)`` receive the lane index; ``should_stop``: see :func:`drive`. A lane a
        guard stops is frozen out of the records while the others go on. Resuming: pass the stacked states and the
        lanes' logs from checkpoints taken at the same round. Returns the lanes' results and {lane: message} of the
        stopped lanes."""
        states = states if states is not None else self.init()
        logs = logs if logs is not None else [RunLog() for _ in self.seeds]
        states, per_client, stopped = drive(self, states, logs, rounds, eval_every, checkpoint_every, lanes=True,
                                            callback=callback, on_checkpoint=on_checkpoint, on_stop=on_stop,
                                            guards=guards, progress=progress, should_stop=should_stop)
        per_client = jax.device_get(per_client)
        return [RunResult(jax.tree.map(lambda x: x[i], states), log.history,
                          {k: v[i] for k, v in per_client.items()}, self.compile_seconds, log.run_seconds)
                for i, log in enumerate(logs)], stopped
