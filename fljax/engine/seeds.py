"""Several seeds of one experiment as one compiled program: the block of rounds and the evaluation are ``vmap``-ed
over a leading seed axis of :class:`State`.

Seed s's state starts from ``Simulation.init(s)``, so lane s draws exactly the random numbers a separate run with
seed s draws; the results agree with separate runs to floating-point tolerance (batched matmuls may round
differently). The data are shared by all seeds, or stacked along the seed axis when every seed has its own data of
the same shapes (:func:`stack_data` refuses other cases; run those seeds one after another).
"""
from __future__ import annotations

import jax

from fljax import tree
from fljax.data.federated import FederatedData
from fljax.engine.driver import RunLog, RunResult, Simulation, drive
from fljax.engine.executors import ShardedExecutor

__all__ = ["SeedBatch", "stack_data", "can_batch"]


def can_batch(sim: Simulation, datas: list[FederatedData] | None = None) -> bool:
    """True when ``sim``'s rounds can run vmapped over seeds: a jitted, single-device executor and (when each
    seed has its own data) data of identical shapes."""
    if not sim.executor.jittable or isinstance(sim.executor, ShardedExecutor):
        return False
    return datas is None or stack_data(datas) is not None


def stack_data(datas: list[FederatedData]) -> FederatedData | None:
    """The per-seed data stacked along a new leading axis, or None when their shapes or static fields differ."""
    structures = {jax.tree.structure(d) for d in datas}
    shapes = {tuple(x.shape for x in jax.tree.leaves(d)) for d in datas}
    if len(structures) > 1 or len(shapes) > 1:
        return None
    return tree.stack(datas)


class SeedBatch:
    """``sim`` run for every seed in ``seeds`` at once. ``datas``: one data set per seed (same shapes), or None to
    share ``sim.data``."""

    def __init__(self, sim: Simulation, seeds: list[int], datas: list[FederatedData] | None = None):
        if not can_batch(sim, datas):
            raise ValueError("these seeds cannot run as one program (loop or sharded executor, or data of different "
                             "shapes per seed); run them one after another.")
        self.sim = sim
        self.seeds = list(seeds)
        self.data = sim.data if datas is None else stack_data(datas)
        self._data_axis = None if datas is None else 0

    @property
    def compile_seconds(self) -> float:
        return self.sim.compile_seconds

    def init(self):
        """The seeds' initial states, stacked: lane i is exactly ``Simulation.init(seeds[i])``."""
        return tree.stack([self.sim.init(s) for s in self.seeds])

    def run_rounds(self, states, n: int):
        """n rounds of every seed as one compiled, vmapped scan; metrics have shape [seeds, n]."""
        block = jax.vmap(lambda s, d: self.sim._block(s, d, n), in_axes=(0, self._data_axis))
        return self.sim._compiled_fn("seed_block", block, (states, self.data), (n,))(states, self.data)

    def evaluate(self, states):
        fn = jax.vmap(self.sim._evaluate, in_axes=(0, self._data_axis))
        return self.sim._compiled_fn("seed_evaluate", fn, (states, self.data))(states, self.data)

    def run(self, rounds: int, eval_every: int, states=None, logs: list[RunLog] | None = None, *,
            checkpoint_every: int = 0, callback=None, on_checkpoint=None, progress: bool = True,
            stop_on_nonfinite: bool = True) -> list[RunResult]:
        """Like :meth:`Simulation.run` for every seed; ``callback(lane, record, state)`` and
        ``on_checkpoint(lane, state, log)`` receive the lane index and that seed's state. Resuming: pass the
        stacked states and the seeds' logs from checkpoints taken at the same round."""
        states = states if states is not None else self.init()
        logs = logs if logs is not None else [RunLog() for _ in self.seeds]
        states, per_client = drive(self, states, logs, rounds, eval_every, checkpoint_every, lanes=True,
                                   callback=callback, on_checkpoint=on_checkpoint, progress=progress,
                                   stop_on_nonfinite=stop_on_nonfinite, labels=[f"seed {s}" for s in self.seeds])
        per_client = jax.device_get(per_client)
        return [RunResult(jax.tree.map(lambda x: x[i], states), log.history,
                          {k: v[i] for k, v in per_client.items()}, self.compile_seconds, log.run_seconds)
                for i, log in enumerate(logs)]
