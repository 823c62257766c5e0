"""The run layer: what a person touches around the engine.

The one path (:func:`run_points`) and its named parts, in the order a call takes them:

* :mod:`~fljax.runner.points` — :func:`run_points` (points × seeds → runs → programs → directories) and
  :func:`run_experiment` (one point: ``fljax run``); the set-up of each run;
* :mod:`~fljax.runner.sweep` — points and seeds: grids, labels, the data each run needs (built once, shared);
* :mod:`~fljax.runner.runs` — the records: a run as set up (immutable), its progress, a point's result;
* :mod:`~fljax.runner.directories` — where each run is written, what is checked there, what is written first;
* :mod:`~fljax.runner.resume` — what ``--resume`` may change; completed runs reused, the others restored;
* :mod:`~fljax.runner.schedule` and :mod:`~fljax.runner.plan` — which runs share a compiled program (lanes), one
  simulation per program, program after program;
* :mod:`~fljax.runner.execute` — a program's runs driven by their stopping rule (fixed rounds, or until a
  tolerance), lanes set up in one place;
* :mod:`~fljax.runner.callbacks` — what the run loop calls back: evaluation records, checkpoints, stops;
* :mod:`~fljax.runner.collection` — ``fljax compare`` and ``fljax sweep``: their points, table, figures, summary;
* :mod:`~fljax.runner.study` and :mod:`~fljax.runner.study_run` — paper reproductions as data: the study file and
  its results; running it and writing its report (:mod:`~fljax.runner.tables`, the one renderer).

Around them: :mod:`~fljax.runner.files` (atomic writes), :mod:`~fljax.runner.results` (the run directory's files:
``config.yaml``, ``metrics.jsonl``, ``summary.json``), :mod:`~fljax.runner.checkpoint` (orbax checkpoints),
:mod:`~fljax.runner.lock` (one owner per directory), :mod:`~fljax.runner.identity` (what a directory holds),
:mod:`~fljax.runner.memory` (a simulation that cannot fit is refused before it starts),
:mod:`~fljax.runner.interrupt` (Ctrl-C and SIGTERM: checkpoint, status, exit), :mod:`~fljax.runner.launch`
(``--processes N``), :mod:`~fljax.runner.report` (progress, JSON lines, Markdown tables),
:mod:`~fljax.runner.plots` (the figure style) and :mod:`~fljax.runner.run_plots` (the figures of runs,
comparisons, sweeps), :mod:`~fljax.runner.load` (run directories back as DataFrames),
:mod:`~fljax.runner.pretrained` (the server's pretrained model), :mod:`~fljax.runner.tensorboard`.

(The package is not called ``fljax.run``: that name is the :func:`fljax.run` function.)
"""
from fljax.runner.collection import compare_experiments, sweep_experiments
from fljax.runner.points import run_experiment, run_points
from fljax.runner.report import Output
from fljax.runner.runs import ExperimentResult

__all__ = ["ExperimentResult", "Output", "compare_experiments", "run_experiment", "run_points", "sweep_experiments"]
