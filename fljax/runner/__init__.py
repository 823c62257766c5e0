"""The run layer: what a person touches around the engine.

* :mod:`~fljax.runner.files` — atomic writes (a crash never leaves a truncated file);
* :mod:`~fljax.runner.results` — the run directory: resolved config, ``metrics.jsonl``, ``summary.json``;
* :mod:`~fljax.runner.checkpoint` — orbax checkpoints of the whole state and the metrics so far;
* :mod:`~fljax.runner.lock` — one owner per run directory (an OS lock);
* :mod:`~fljax.runner.memory` — a simulation that cannot fit in memory is refused before it starts;
* :mod:`~fljax.runner.resume` — what ``--resume`` may change in a run's config;
* :mod:`~fljax.runner.interrupt` — Ctrl-C and SIGTERM: checkpoint, status, exit;
* :mod:`~fljax.runner.launch` — ``--processes N``: one simulation as N local processes (process 0 writes);
* :mod:`~fljax.runner.plots` — PNG plots of one run and of a comparison;
* :mod:`~fljax.runner.report` — progress output modes, JSON log lines, Markdown tables with mean ± std;
* :mod:`~fljax.runner.sweep` — seeds: which run vectorised, which one after another;
* :mod:`~fljax.runner.experiment` — one experiment (any number of seeds) or a comparison, on disk, resumable.

(The package is not called ``fljax.run``: that name is the :func:`fljax.run` function.)
"""
from fljax.runner.experiment import ExperimentResult, compare_experiments, run_experiment, run_points, sweep_experiments
from fljax.runner.report import Output

__all__ = ["ExperimentResult", "Output", "compare_experiments", "run_experiment", "run_points", "sweep_experiments"]
