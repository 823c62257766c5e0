"""fljax.engine: state, executors, client sampling, the round driver and evaluation."""
from fljax.engine.context import RoundContext
from fljax.engine.driver import NonFiniteError, RunLog, RunResult, Simulation, default_model
from fljax.engine.evaluation import evaluate, summarize
from fljax.engine.executors import (EXECUTORS, ChunkedExecutor, Executor, LoopExecutor, ShardedExecutor, choose_executor,
                                    VmapExecutor, make_executor)
from fljax.engine.sampling import bernoulli_mask, sample_cohort
from fljax.engine.seeds import SeedBatch
from fljax.engine.state import State

__all__ = ["RoundContext", "NonFiniteError", "RunLog", "RunResult", "SeedBatch", "Simulation", "default_model", "evaluate", "summarize",
           "EXECUTORS", "ChunkedExecutor", "Executor", "LoopExecutor", "ShardedExecutor", "VmapExecutor",
           "make_executor", "choose_executor", "bernoulli_mask", "sample_cohort", "State"]
