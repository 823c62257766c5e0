"""fljax.engine: the algorithm contract, state, executors, client sampling, the round driver and evaluation summaries."""
from fljax.engine.context import ClientCall, RoundContext
from fljax.engine.driver import NonFiniteError, RunLog, RunResult, Simulation, default_model
from fljax.engine.evaluation import summarize
from fljax.engine.executors import (EXECUTORS, ChunkedExecutor, Executor, LoopExecutor, ShardedExecutor, VmapExecutor,
                                    choose_executor, make_executor)
from fljax.engine.protocol import ClientInput, ClientResult, FederatedAlgorithm
from fljax.engine.sampling import bernoulli_mask, sample_cohort
from fljax.engine.seeds import SeedBatch
from fljax.engine.state import State

__all__ = ["ClientCall", "RoundContext", "NonFiniteError", "RunLog", "RunResult", "SeedBatch", "Simulation",
           "default_model", "summarize", "EXECUTORS", "ChunkedExecutor", "Executor", "LoopExecutor",
           "ShardedExecutor", "VmapExecutor", "make_executor", "choose_executor", "ClientInput", "ClientResult",
           "FederatedAlgorithm", "bernoulli_mask", "sample_cohort", "State"]
