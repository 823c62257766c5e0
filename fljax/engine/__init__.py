"""fljax.engine: the algorithm contract, state, executors, client populations in groups, client sampling, the round driver,
lanes, the stopping-rule driver, evaluation summaries, multi-process runs (fljax.engine.processes) and the memory
plan of every compiled program (fljax.engine.budget)."""
from fljax.engine.context import ClientCall, RoundContext
from fljax.engine.driver import RunResult, Simulation
from fljax.engine.evaluation import summarize
from fljax.engine.executors import (EXECUTORS, ChunkedExecutor, Executor, LoopExecutor, ShardedExecutor, VmapExecutor,
                                    choose_executor, make_executor)
from fljax.engine.population import ClientGroup, Population
from fljax.engine.protocol import ClientInput, ClientResult, FederatedAlgorithm, SimulationData
from fljax.engine.sampling import bernoulli_mask, sample_cohort
from fljax.engine.lanes import Lanes
from fljax.engine.loop import DivergenceGuard, NonFiniteError, NonFiniteGuard, RunLog, block_schedule, drive
from fljax.engine.state import State
from fljax.engine.stopping import Stopping, StoppingRule, StopResult, Tolerance, run_until

__all__ = ["ClientCall", "RoundContext", "NonFiniteError", "NonFiniteGuard", "DivergenceGuard", "RunLog", "block_schedule", "drive", "RunResult", "Lanes", "Simulation",
           "summarize", "EXECUTORS", "ChunkedExecutor", "Executor", "LoopExecutor",
           "ShardedExecutor", "VmapExecutor", "make_executor", "choose_executor", "ClientInput", "ClientResult",
           "FederatedAlgorithm", "SimulationData", "bernoulli_mask", "sample_cohort", "State", "ClientGroup",
           "Population", "Stopping", "StoppingRule", "StopResult", "Tolerance", "run_until"]
