"""One experiment on disk (any number of seeds), resumable; and a comparison of algorithms.

:func:`run_experiment` writes the run directory (:mod:`fljax.runner.results`), checkpoints every
``checkpoint_every`` rounds (:mod:`fljax.runner.checkpoint`) and, with ``resume=True``, continues from the latest
checkpoint: the state, the PRNG key, the round and the records so far are restored, ``metrics.jsonl`` is cut back to
the checkpoint's records, and the blocks of rounds end where the uninterrupted run's end, so the continued run gives
the same metrics and parameters bit for bit. A round that produces NaN/Inf stops the run; the last good checkpoint
and the metrics written so far stay, and ``summary.json`` says where it stopped.

:func:`compare_experiments` runs several algorithms on the same data, partition and seeds (one run directory each)
and writes ``compare.md`` (the table), ``compare.png`` and ``summary.json``.
"""
from __future__ import annotations

import dataclasses
import os
import re

import jax

from fljax import tree
from fljax.config import ConfigError, ExperimentConfig, algorithm_config, check_compare_algo
from fljax.engine import Lanes, NonFiniteError, RunLog, RunResult, Simulation
from fljax.engine.lanes import can_batch
from fljax.runner import files
from fljax.runner.checkpoint import Checkpointer, CheckpointTimer
from fljax.runner.plots import plot_compare, plot_run
from fljax.runner.report import Output, markdown_table, summary_row
from fljax.runner.results import RunDir, aggregate_summaries, make_summary
from fljax.runner.sweep import DataCache, seed_list

__all__ = ["ExperimentResult", "LaneResult", "run_experiment", "compare_experiments", "dir_name", "saved_config",
           "saved_algorithms"]


@dataclasses.dataclass
class LaneResult:
    """One seed of an experiment."""

    seed: int
    directory: RunDir
    result: RunResult
    summary: dict


@dataclasses.dataclass
class ExperimentResult:
    cfg: ExperimentConfig
    directory: RunDir
    lanes: list[LaneResult]
    summary: dict  # summary.json at the top of the run directory
    vectorised: bool

    @property
    def histories(self) -> list[list[dict]]:
        return [lane.result.history for lane in self.lanes]

    def row(self, label: str | None = None) -> dict:
        row = summary_row(label or self.cfg.run_name, [lane.summary for lane in self.lanes])
        row["client-steps/s"] = f"{self.summary['client_steps_per_second']:,.0f}"
        return row


def dir_name(label: str) -> str:
    """A file-system friendly directory name for a run label such as ``fedprox(mu=0.1)``."""
    return re.sub(r"[^A-Za-z0-9_.=+-]+", "_", label).strip("_")


class _Lanes:
    """The seeds of one experiment: their directories, data, simulations, checkpoints and logs."""

    def __init__(self, cfg: ExperimentConfig, root: RunDir, cache: DataCache, resume: bool):
        self.cfg = cfg
        self.seeds = seed_list(cfg)
        self.dirs = [root] if len(self.seeds) == 1 else [root.seed_dir(s) for s in self.seeds]
        self.datas = [cache(cfg, s) for s in self.seeds]
        self.shared_data = all(d is self.datas[0] for d in self.datas)
        self.sims: list[Simulation] = []
        for i, s in enumerate(self.seeds):  # seeds that share data share one simulation (and its compiled code)
            same = self.shared_data and i > 0
            self.sims.append(self.sims[0] if same else _build(dataclasses.replace(cfg, seed=s), self.datas[i]))
        self.steps_per_round = self.sims[0].work_per_round()[0]
        self.every = cfg.checkpoint_every  # None: timed (CheckpointTimer) and after the last round; 0: never
        self.checkpointers = [Checkpointer(d.checkpoints) if (self.every != 0 or resume) else None
                              for d in self.dirs]
        self.states: list = [None] * len(self.seeds)
        self.logs = [RunLog() for _ in self.seeds]

    def restore(self) -> None:
        """Load every seed's latest checkpoint (seeds without one start afresh) and cut its metrics file back to
        the checkpoint's records."""
        for i, ck in enumerate(self.checkpointers):
            if ck is not None and ck.latest_round() is not None:
                self.states[i], self.logs[i] = ck.restore(self.sims[i].state_shapes())
            self.dirs[i].write_metrics(self.logs[i].history)

    def can_vectorise(self) -> bool:
        """All seeds can run as one program now (see fljax.runner.sweep)."""
        rounds = {None if s is None else int(s.round) for s in self.states}
        return len(self.seeds) > 1 and len(rounds) == 1 and can_batch(
            self.sims[0], None if self.shared_data else self.datas)

    def last_checkpoint(self) -> int | None:
        """The latest round checkpointed by any seed (after pending saves finish)."""
        kept = []
        for ck in self.checkpointers:
            if ck is not None:
                ck.wait()
                kept.append(ck.latest_round())
        kept = [k for k in kept if k is not None]
        return max(kept) if kept else None

    def close(self) -> None:
        for i, ck in enumerate(self.checkpointers):
            if ck is not None:
                ck.close()
                self.checkpointers[i] = None


def _build(cfg: ExperimentConfig, data) -> Simulation:
    from fljax.api import build

    return build(cfg, data)


def run_experiment(cfg: ExperimentConfig, out: str, *, resume: bool = False, output: Output | None = None,
                   data_cache: DataCache | None = None, plots: bool = True,
                   missing_ok: bool = False) -> ExperimentResult:
    """Run ``cfg`` (all its seeds) into run directory ``out``.

    ``resume``: continue from the latest checkpoints in ``out`` (refused when there is none, unless
    ``missing_ok``: then seeds without a checkpoint start afresh). Without ``resume``, a directory that already
    holds a run is refused. Raises :class:`NonFiniteError` (after writing what it has) when a round produces
    NaN/Inf.
    """
    cfg.validate()
    output = output or Output()
    root = RunDir(out)
    seeds = seed_list(cfg)
    dirs = [root] if len(seeds) == 1 else [root.seed_dir(s) for s in seeds]
    if resume and not missing_ok and not any(d.has_checkpoint() for d in dirs):
        raise ConfigError(f"--resume: no checkpoint in {dirs[0].checkpoints!r}; start the run without --resume "
                          f"(or point --out at the run directory to continue).")
    if not resume and any(d.holds_run() for d in [root, *dirs]):
        raise ConfigError(f"run directory {root.path!r} already holds a run; continue it with --resume or choose "
                          f"another --out.")
    lanes = _Lanes(cfg, root, data_cache or DataCache(), resume)
    try:
        root.write_config(cfg)
        if len(seeds) > 1:
            for s, d in zip(seeds, dirs):
                d.write_config(dataclasses.replace(cfg, seed=s, seeds=1))
        if resume:
            lanes.restore()
        output.note(f"{cfg.run_name}: {lanes.sims[0].algorithm.summary or cfg.algorithm}")
        output.note(f"  data: {lanes.datas[0].summary()}; results in {root.path}")
        vectorised = lanes.can_vectorise()
        results = _run_lanes(lanes, output, vectorised)
    except NonFiniteError as e:
        kept = lanes.last_checkpoint()
        where = "no checkpoint yet" if kept is None else f"the last good checkpoint (round {kept})"
        raise NonFiniteError(f"{e} Kept in {root.path}: metrics.jsonl so far and {where}.") from None
    finally:
        lanes.close()
    lane_results = []
    for i, (seed, d, res) in enumerate(zip(lanes.seeds, lanes.dirs, results)):
        summary = make_summary(cfg, seed, lanes.logs[i], lanes.steps_per_round)
        d.write_summary(summary)
        output.event("summary", run=cfg.run_name, **summary)
        if plots and len(seeds) == 1:
            plot_run(d.path, [res.history], [res.per_client], cfg.run_name)
        lane_results.append(LaneResult(seed, d, res, summary))
    if len(seeds) > 1:
        top = aggregate_summaries([lr.summary for lr in lane_results], vectorised)
        root.write_summary(top)
        if plots:
            plot_run(root.path, [lr.result.history for lr in lane_results],
                     [lr.result.per_client for lr in lane_results], f"{cfg.run_name} ({len(seeds)} seeds)")
    else:
        top = lane_results[0].summary
    return ExperimentResult(cfg, root, lane_results, top, vectorised)


def _run_lanes(lanes: _Lanes, output: Output, vectorised: bool) -> list[RunResult]:
    """Run every seed to ``cfg.rounds``: together (``vectorised``) or one after another."""
    cfg = lanes.cfg

    timer = CheckpointTimer() if lanes.every is None else None

    def on_eval(i, record, state):
        lanes.dirs[i].write_metrics(lanes.logs[i].history)
        output.event("eval", run=cfg.run_name, seed=lanes.seeds[i], **record)
        if timer is not None and record["round"] < cfg.rounds and timer.due(record["round"]):
            on_checkpoint(i, state, lanes.logs[i])  # (the last round is checkpointed below)

    def on_checkpoint(i, state, log):
        lanes.checkpointers[i].save(state, log)

    def stopped(i, message):
        lanes.dirs[i].write_summary(make_summary(cfg, lanes.seeds[i], lanes.logs[i], lanes.steps_per_round,
                                                 "stopped", message))

    saving = lanes.every != 0
    common = dict(checkpoint_every=lanes.every or 0, progress=output.progress)
    if vectorised:
        batch = Lanes(lanes.sims[0], lanes.seeds, None if lanes.shared_data else lanes.datas)
        states = batch.init() if lanes.states[0] is None else tree.stack(lanes.states)
        try:
            results = batch.run(cfg.rounds, cfg.eval_every, states, lanes.logs, callback=on_eval,
                                on_checkpoint=on_checkpoint if saving else None, **common)
        except NonFiniteError as e:
            for i in range(len(lanes.seeds)):
                stopped(i, str(e))
            raise
    else:
        results = []
        for i, (seed, sim) in enumerate(zip(lanes.seeds, lanes.sims)):
            state = lanes.states[i] if lanes.states[i] is not None else sim.init(seed)
            save = (lambda st, lg, i=i: on_checkpoint(i, st, lg)) if saving else None
            try:
                results.append(sim.run(cfg.rounds, cfg.eval_every, state, log=lanes.logs[i],
                                       callback=lambda rec, st, i=i: on_eval(i, rec, st), on_checkpoint=save,
                                       **common))
            except NonFiniteError as e:
                message = f"seed {seed}: {e}" if len(lanes.seeds) > 1 else str(e)
                stopped(i, message)
                raise NonFiniteError(message) from None
    for i, res in enumerate(results):  # a resumed run that was already complete: evaluate for the plots
        if not res.per_client:
            _, per_client = lanes.sims[i].evaluate(res.state)
            results[i] = dataclasses.replace(res, per_client=jax.device_get(per_client))
    return results


def compare_experiments(cfg: ExperimentConfig, algorithms: list[str | tuple[str, dict]], out: str, *,
                        resume: bool = False, output: Output | None = None, plots: bool = True
                        ) -> tuple[list[dict], dict[str, ExperimentResult]]:
    """Run every algorithm on the data, partition and seeds of ``cfg`` into ``out/<label>/``; write the table
    (``compare.md``), ``compare.png`` and ``summary.json`` into ``out``. Every algorithm's config is validated
    before anything runs. Returns the table rows and the results by label."""
    from fljax.api import label as make_label

    output = output or Output()
    root = RunDir(out)
    entries = [(e, {}) if isinstance(e, str) else tuple(e) for e in algorithms]
    check_compare_algo(cfg, [name for name, _ in entries])
    configs = {}
    for name, hyper in entries:
        lbl = make_label(name, hyper)
        configs[lbl] = dataclasses.replace(algorithm_config(cfg, name, hyper), name=lbl)
    cache = DataCache()
    for one in configs.values():  # refuse a bad split or a model that does not fit the data before writing anything
        for seed in seed_list(one):
            _build(dataclasses.replace(one, seed=seed), cache(one, seed))
    if resume and not root.holds_run():
        raise ConfigError(f"--resume: {root.path!r} holds no comparison to continue; start it without --resume.")
    if not resume and root.holds_run():
        raise ConfigError(f"directory {root.path!r} already holds a comparison; continue it with --resume or choose "
                          f"another --out.")
    listing = [{"label": make_label(n, h), "algorithm": n, "hyperparameters": h} for n, h in entries]
    root.write_config(cfg)
    root.write_summary({"status": "running", "algorithms": listing})
    results = {}
    for lbl, one in configs.items():
        results[lbl] = run_experiment(one, root.file(dir_name(lbl)), resume=resume, missing_ok=True, output=output,
                                      data_cache=cache, plots=plots)
    rows = [r.row(lbl) for lbl, r in results.items()]
    table = markdown_table(rows)
    title = (f"{cfg.data.dataset}, {cfg.data.num_clients} clients, {cfg.rounds} rounds, "
             f"{cfg.seeds} seed{'s' if cfg.seeds > 1 else ''}")
    files.write_text(root.file("compare.md"), f"# {title}\n\n{table}\n")
    if plots:
        plot_compare(root.file("compare.png"), {lbl: r.histories for lbl, r in results.items()}, title)
    root.write_summary({"status": "completed", "algorithms": listing,
                        "results": {lbl: r.summary for lbl, r in results.items()}})
    return rows, results


def saved_config(directory: str) -> str:
    """The path of the resolved config a run directory was started with (for ``--resume``)."""
    path = RunDir(directory).file("config.yaml")
    if not os.path.exists(path):
        raise ConfigError(f"--resume: {directory!r} is not a run directory (no config.yaml); pass the --out of the "
                          f"run to continue.")
    return path


def saved_algorithms(directory: str) -> list[tuple[str, dict]]:
    """The algorithms (name, hyperparameters) of the comparison in ``directory`` (for ``--resume``)."""
    path = RunDir(directory).file("summary.json")
    if not os.path.exists(path):
        raise ConfigError(f"--resume: {directory!r} holds no comparison (no summary.json); pass the --out of the "
                          f"comparison to continue.")
    return [(a["algorithm"], a["hyperparameters"]) for a in files.read_json(path)["algorithms"]]

