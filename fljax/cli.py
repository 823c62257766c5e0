"""The ``fljax`` command line: run, compare, sweep, tune, list, reproduce.

Every error a user can cause (unknown names, wrong types, impossible values, bad partitions, a missing or broken
config file, nothing to resume) is printed as one line starting with ``fljax: error:`` and exit status 2, never as
a stack trace (set ``FLJAX_DEBUG=1`` to see the trace). A run stopped by NaN/Inf or divergence exits with status
3; an interrupted one (Ctrl-C: 130, SIGTERM: 143) is checkpointed first and prints a line saying how to resume it.
Full documentation: ``docs/cli.md``.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import io
import os
import signal
import sys
import textwrap
import threading

from fljax import __version__
from fljax.errors import ConfigError

# The rest of fljax (and JAX) is imported inside the commands: ``fljax --help``, ``--version`` and a command's
# ``--help`` parse without it (benchmarks/first_run.py, case "help").

EXAMPLES_RUN = """examples:
  fljax run configs/fedavg.yaml                              # one experiment from a config file
  fljax run configs/fedprox.yaml --set algo.mu=0.1 --set rounds=50
  fljax run --algorithm fedprox --dataset digits --set data.alpha=0.1
  fljax run configs/fedavg.yaml --seeds 5                    # 5 seeds, mean ± std
  fljax run configs/fedavg.yaml --out runs/a --checkpoint-every 10
  fljax run --resume --out runs/a                            # continue a killed run
  fljax run --resume --out runs/a --set rounds=200           # extend a finished run
  fljax run configs/fedavg.yaml --json > log.jsonl           # one JSON object per evaluation
"""
EXAMPLES_SWEEP = """examples:
  fljax sweep configs/fedprox.yaml --grid algo.lr=0.01,0.03,0.1 --grid algo.mu=0,0.01 --seeds 3
  fljax sweep --algorithm fedavg --dataset digits --grid algo.lr=1e-3,1e-2,1e-1 --out runs/lr
  fljax sweep --resume --out runs/lr                   # continue an interrupted sweep
"""
EXAMPLES_COMPARE = """examples:
  fljax compare                                   # the quick start: 8 representative algorithms (see below)
  fljax compare --algorithms all                  # every general-purpose algorithm
  fljax compare --algorithms fedavg,perfedavg --set algo.beta=0.1   # an algo.* key applies where declared
  fljax compare --algorithms fedavg,fedprox --set data.dataset=digits --set rounds=30
  fljax compare --style paper                     # figures as single-column vector PDF, serif fonts
  fljax compare configs/fedavg.yaml --algorithms fedavg,local --seeds 3 --out runs/cmp
  fljax compare --resume --out runs/cmp           # continue an interrupted comparison

{why}
"""
EXAMPLES_TUNE = """examples:
  fljax tune --algorithm fedavg --hp algo.lr --hp algo.server_lr --steps 0 --set rounds=20   # the hypergradient
  fljax tune configs/fedavg.yaml --hp algo.lr --hp algo.server_lr --steps 20 --set rounds=30
  fljax tune --algorithm fedprox --hp algo.mu --mode forward --split test --keys fixed
"""
EXAMPLES_REPRODUCE = """examples:
  fljax reproduce dfedalt                         # every study, the file's seeds, into a new runs/reproduce-dfedalt-*
  fljax reproduce dfedalt --only table --seeds 1 --rounds 20 --out /tmp/look   # a quick look
  fljax reproduce fedslr --jobs 2                 # two worker processes
  fljax reproduce dfedalt --update-report         # into the committed report, benchmarks/results/dfedalt
  fljax reproduce dfedalt --update-report --render   # rebuild the committed report from its results.json.gz
"""


JOBS_MAX = 1024  # fljax reproduce --jobs: worker processes (each holds its own JAX runtime)


def _overrides(args) -> list[str]:
    overrides = list(args.set or [])
    if getattr(args, "algorithm", None):
        overrides.append(f"algorithm={args.algorithm}")
    if getattr(args, "dataset", None):
        overrides.append(f"data.dataset={args.dataset}")
    if args.seeds is not None:
        overrides.append(f"seeds={args.seeds}")
    if args.checkpoint_every is not None:
        overrides.append(f"checkpoint_every={args.checkpoint_every}")
    if getattr(args, "rounds", None) is not None:
        overrides.append(f"rounds={args.rounds}")
    return overrides


def _parse(args, algorithm_keys: bool = True, grid: dict | None = None):
    """The parsed config file with the command line's overrides; without a file, the quick-start preset (the one
    ``fljax compare`` uses; with ``algorithm_keys``, only those of its ``algo`` keys that the algorithm declares),
    which yields to the overrides and to a sweep's ``grid`` (:func:`fljax.experiment.quickstart`)."""
    from fljax.config import apply_overrides, load_config
    from fljax.experiment import quickstart

    overrides = _overrides(args)
    return load_config(args.config, overrides, base=None if args.config else
                       quickstart(apply_overrides({}, overrides), algorithm_keys=algorithm_keys, grid=grid))


def _parse_sweep(args, grid: dict):
    """A sweep's base config and grid: as :func:`_parse`, the options of a section whose name the grid chooses
    moved into the grid (:func:`fljax.runner.sweep.swept_sections`)."""
    from fljax.config import ExperimentConfig, apply_overrides, config_values, from_dict
    from fljax.experiment import quickstart
    from fljax.runner.sweep import swept_sections

    overrides = _overrides(args)
    values = config_values(args.config, overrides, base=None if args.config else
                           quickstart(apply_overrides({}, overrides), grid=grid))
    values, grid = swept_sections(values, grid)
    return from_dict(ExperimentConfig, values), grid


def _load(args):
    """The experiment of the config file (or the quick-start preset) with the command line's overrides."""
    from fljax.experiment import resolve

    return resolve(_parse(args))


def _resume_config(args, kind: str = "run"):
    """On --resume the config is the run directory's own (only --set/--seeds/--checkpoint-every may change it); the
    directory must hold a ``kind`` (run, sweep, comparison: :mod:`fljax.runner.identity`), made from a config."""
    from fljax.config import load_config
    from fljax.runner.directories import saved_config

    if not args.out:
        raise ConfigError("--resume needs --out DIR: the directory of the run to continue.")
    if args.config or getattr(args, "algorithm", None) or getattr(args, "dataset", None):
        raise ConfigError(f"--resume reads the config from {os.path.join(args.out, 'config.yaml')}; drop the config "
                          f"file/--algorithm/--dataset (use --set, e.g. --set rounds=200, to extend the run).")
    return load_config(saved_config(args.out, kind), _overrides(args))


_CLAIMED: list[str] = []  # directories _default_out created, outermost last (removed again while empty)


def _default_out(name: str) -> str:
    """A new directory ``runs/<name>-<date>-<time>`` (``-2``, ``-3``, … after it when that one exists), created here:
    ``os.mkdir`` succeeds for one process only, so two commands started in the same second get a directory each
    (checking for a free name and creating it later let both pick one, and the second was told to wait for a
    directory it never chose). What this creates is removed again when the command leaves it empty
    (:func:`_release_claims`: a refusal writes nothing). Where ``runs`` cannot be created, the name is returned
    as it is and the run layer says why."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = os.path.join("runs", f"{name}-{stamp}")
    try:
        if not os.path.isdir("runs"):
            os.mkdir("runs")
            _CLAIMED.append("runs")
    except OSError:
        return base
    out, k = base, 2
    while True:
        try:
            os.mkdir(out)
        except FileExistsError:
            out, k = f"{base}-{k}", k + 1
            continue
        except OSError:
            return out
        _CLAIMED.insert(0, out)
        return out


def _release_claims() -> None:
    """Remove the directories :func:`_default_out` created that are still empty (the command wrote nothing)."""
    while _CLAIMED:
        with contextlib.suppress(OSError):
            os.rmdir(_CLAIMED.pop(0))


def _output(args):
    from fljax.runner import Output
    from fljax.runner.tensorboard import TensorBoard

    if getattr(args, "follower", False):  # a process other than 0 of a group: silent
        return Output("quiet", stdout=io.StringIO())
    return Output("json" if args.json else "quiet" if args.quiet else "bar",
                  tensorboard=TensorBoard(args.tensorboard) if getattr(args, "tensorboard", None) is not None
                  else None)


def _join(args, argv: list[str]) -> int | None:
    """``--processes N`` and the ``FLJAX_*`` group variables (:mod:`fljax.runner.launch`): join the group the
    environment names, or launch N processes of this command (returns their exit status), or nothing (None).
    Everything that can be checked in one process is checked before any process starts or joins: the group's
    variables against ``--processes``, and (the launcher) the whole command; then the processes meet within a
    short timeout (:func:`fljax.engine.processes.rendezvous`)."""
    from fljax.engine import processes
    from fljax.runner import launch

    n = args.processes
    if n is not None and n < 1:
        raise ConfigError(f"--processes must be >= 1, got {n}.")
    named = os.environ.get(processes.ENV["num_processes"])
    if named and named.strip().isdigit() and n is not None and n != int(named):
        raise ConfigError(f"--processes {n} disagrees with {processes.ENV['num_processes']}={named.strip()}; give "
                          f"one of them.")
    if named and args.resume and named.strip().isdigit() and int(named) > 1 or args.resume and (n or 1) > 1:
        raise ConfigError("--resume continues a run in one process; drop --processes.")
    if os.environ.get(launch.LAUNCHER_ENV, "").isdigit():
        launch.die_with_parent(int(os.environ[launch.LAUNCHER_ENV]))
    if named is None and (n or 1) > 1:
        out = _SETUP[args.command](args, check=True)[-1]
        return launch.spawn(argv if args.out else [*argv, "--out", out], n, out, args.command)
    if processes.from_environment():
        args.follower = not processes.is_lead()
    return None


def _signal_of(e: KeyboardInterrupt):
    """The :class:`~fljax.runner.interrupt.Interrupted` that stopped the command (a bare KeyboardInterrupt: Ctrl-C)."""
    from fljax.runner.interrupt import Interrupted

    return e if isinstance(e, Interrupted) else Interrupted(signal.SIGINT)


def _interrupted(command: str, out: str, e: KeyboardInterrupt) -> int:
    """Ctrl-C or SIGTERM (:mod:`fljax.runner.interrupt`): one line saying how to continue (when the run had
    started: its ``config.yaml`` exists); 128 + the signal."""
    e = _signal_of(e)
    if os.path.exists(os.path.join(out, "config.yaml")):
        print(f"fljax: interrupted by {e.name}; continue from the last checkpoint with: fljax {command} --resume "
              f"--out {out}", file=sys.stderr)
    else:
        print(f"fljax: interrupted by {e.name} before the run started; nothing to resume in {out}", file=sys.stderr)
    return e.exit_status


def _setup_run(args, check: bool = False):
    """The experiment of ``fljax run`` and its run directory (``check``: also every option of the output)."""
    from fljax.experiment import resolve

    exp = resolve(_resume_config(args)) if args.resume else _load(args)
    if check:
        _output(args)
    return exp, args.out or _default_out(exp.name)


def _setup_compare(args, check: bool = False):
    """The config, algorithms and directory of ``fljax compare`` (``check``: every algorithm's experiment
    resolved, and the output's options)."""
    from fljax.experiment import compare_points
    from fljax.runner.directories import saved_algorithms

    if args.resume:
        cfg = _resume_config(args, "comparison")
        entries = saved_algorithms(args.out)
        asked = [n.strip() for n in args.algorithms.split(",") if n.strip()] if args.algorithms is not None else None
        if asked is not None and asked != [name for name, _ in entries]:
            raise ConfigError(f"--resume continues the comparison of {', '.join(n for n, _ in entries)} in "
                              f"{args.out}; drop --algorithms (got {args.algorithms!r}), or compare other algorithms "
                              f"into another --out.")
    else:
        cfg = _parse(args, algorithm_keys=False)
        entries = [(n, {}) for n in _compared(args.algorithms)]
    if check:
        compare_points(cfg, entries)
        _output(args)
    return cfg, entries, args.out or _default_out("compare")


def _setup_sweep(args, check: bool = False):
    """The config, grid and directory of ``fljax sweep`` (``check``: every point's experiment resolved, and the
    output's options)."""
    from fljax.runner.collection import sweep_points
    from fljax.runner.directories import saved_grid
    from fljax.runner.sweep import parse_grid

    if args.resume:
        if args.grid:
            raise ConfigError("--resume reads the grid from the sweep's summary.json; drop --grid.")
        cfg = _resume_config(args, "sweep")
        grid = saved_grid(args.out)
    else:
        grid = parse_grid(args.grid or [])
        if not grid:
            raise ConfigError("a sweep needs at least one --grid KEY=V1,V2,... (for example --grid algo.lr=0.01,0.1).")
        cfg, grid = _parse_sweep(args, grid)
    if check:
        sweep_points(cfg, grid)
        _output(args)
    return cfg, grid, args.out or _default_out(f"sweep-{cfg.algorithm}")


def cmd_run(args) -> int:
    from fljax.runner import run_experiment
    from fljax.runner.report import distinct_table

    exp, out = _setup_run(args)
    output = _output(args)
    try:
        result = run_experiment(exp, out, resume=args.resume, output=output)
    except KeyboardInterrupt as e:
        return _interrupted("run", out, e)
    output.result(distinct_table([result.row()]))
    output.note(f"results: {out}")
    return 0


def cmd_compare(args) -> int:
    from fljax.algorithms.families import QUICKSTART
    from fljax.runner import compare_experiments

    cfg, entries, out = _setup_compare(args)
    output = _output(args)
    if not args.resume and args.algorithms is None:
        output.note(f"comparing the quick start's {len(QUICKSTART)} algorithms ({', '.join(QUICKSTART)}); "
                    f"--algorithms all runs all {len(_compared('all'))}")
    try:
        table, results = compare_experiments(cfg, entries, out, resume=args.resume, output=output)
    except KeyboardInterrupt as e:
        return _interrupted("compare", out, e)
    output.result(table)
    stopped = [label for label, r in results.items() if r.stopped]
    if stopped:
        output.note(f"stopped (NaN/Inf or divergence): {', '.join(stopped)}; see the status column and their "
                    f"summary.json")
    output.note(f"results: {out} (compare.md, compare.png, one directory per algorithm)")
    return 0


def _compared(names: str | None) -> list[str]:
    """The algorithms of ``--algorithms``: a comma-separated list, ``all`` (every general-purpose one), or None
    (the quick start's representatives, :data:`fljax.algorithms.families.QUICKSTART`)."""
    from fljax.algorithms import ALGORITHMS
    from fljax.algorithms.families import QUICKSTART

    if names is None:
        return list(QUICKSTART)
    if names.strip() == "all":
        return [n for n, c in ALGORITHMS.items() if c.generic]
    return [n.strip() for n in names.split(",") if n.strip()]


def cmd_sweep(args) -> int:
    from fljax.runner import sweep_experiments

    cfg, grid, out = _setup_sweep(args)
    output = _output(args)
    try:
        table, results = sweep_experiments(cfg, grid, out, resume=args.resume, output=output, lanes=args.lanes)
    except KeyboardInterrupt as e:
        return _interrupted("sweep", out, e)
    output.result(table)
    stopped = [label for label, r in results.items() if r.stopped]
    if stopped:
        output.note(f"stopped (NaN/Inf or divergence): {', '.join(stopped)}; see their summary.json")
    from fljax.runner.attack_table import is_attack_grid

    files = ("attacks.md, attacks.png, sweep.md" if is_attack_grid(grid) else
             f"sweep.md, sweep.png{', sweep_heatmap.png' if len(grid) == 2 else ''}")
    output.note(f"results: {out} ({files}, one directory per point)")
    return 0


def cmd_tune(args) -> int:
    """Hypergradient descent on ``--hp`` (docs/tuning.md): the trajectory's table, ``tune.json``, ``tune.md`` and
    ``tune.png`` in the output directory (with ``--steps 0``: the hypergradient at the start)."""
    from fljax import api, hypergrad
    from fljax.config import to_dict
    from fljax.errors import OptionError
    from fljax.experiment import resolve
    from fljax.runner import files

    for option, name in TUNE_CHOICES.items():
        if getattr(args, option) not in hypergrad_choices(name):
            raise ConfigError(f"--{option} must be one of {', '.join(hypergrad_choices(name))}, got "
                              f"{getattr(args, option)!r}.")
    if not args.hp:
        raise ConfigError("fljax tune needs at least one --hp KEY (a continuous hyperparameter, e.g. --hp algo.lr).")
    try:
        hypergrad.check_tuning(args.steps, args.hyper_lr, args.keys)
    except OptionError as e:
        raise ConfigError(f"--{e.key.replace('_', '-')} {e.message}") from None
    cfg = _parse(args)
    exp = resolve(cfg)
    out = args.out or _default_out(f"tune-{exp.name}")
    output = _output(args)
    objective = hypergrad.objective_of(exp, api.load_data(exp), args.hp, metric=args.metric, split=args.split,
                                       val_fraction=args.val_fraction, last=args.last, remat=args.remat)

    noted: set[str] = set()

    def show(step):
        output.event("step", **dataclasses.asdict(step))
        output.note(f"step {step.step:>3}  " + "  ".join(f"{k} {v:.4g}" for k, v in step.hp.items())
                    + f"  {args.metric} {step.value:.5g}  " + "  ".join(f"d/d{k} {g:.4g}" for k, g in step.grad.items())
                    + f"  ({step.tries} tries, step length {step.hyper_lr:.3g})")
        for key in sorted(k for k, g in step.grad.items() if g == 0.0 and k not in noted):
            noted.add(key)
            output.warn(hypergrad.zero_note(key))

    result = hypergrad.tune(objective, args.steps, hyper_lr=args.hyper_lr, keys=args.keys, seed=exp.seed,
                            mode=args.mode, callback=show)
    files.write_yaml(os.path.join(out, "config.yaml"), to_dict(cfg))
    files.write_json(os.path.join(out, "tune.json"), {"metric": args.metric, "split": args.split, **result.to_dict()})
    table = hypergrad.trajectory_table(result)
    files.write_text(os.path.join(out, "tune.md"), table + "\n")
    hypergrad.plot_trajectory(result, os.path.join(out, "tune.png"), f"{args.split} {args.metric}")
    output.result(table)
    output.note(f"results: {out} (tune.md, tune.json, tune.png)")
    return 0


_SETUP = {"run": _setup_run, "compare": _setup_compare, "sweep": _setup_sweep}


def cmd_list(args) -> int:
    if args.name:
        return _list_algorithm(args.name)
    from fljax.aggregation import ATTACKS, RULES
    from fljax.algorithms import ALGORITHMS
    from fljax.data import PARTITIONERS, SOURCES, DataConfig
    from fljax.engine import EXECUTORS
    from fljax.models import MODELS
    from fljax.models.model import model_options
    from fljax.ops.gossip import TOPOLOGIES
    from fljax.options import describe
    from fljax.participation import PARTICIPATIONS
    from fljax.runner.study import study_names

    common = [o for o in describe(DataConfig) if o[0] != "options"]
    model = {n: [(f.name, f.default, f.metadata.get("doc", "")) for f in model_options(n)] for n in MODELS}
    sections = [("algorithms", {n: (c.summary, []) for n, c in ALGORITHMS.items()}),
                ("data keys (every data set)", {k: (f"{doc} (default {_value(v)})", []) for k, v, doc in common}),
                ("datasets", {n: (s.summary, describe(s.options)) for n, s in SOURCES.items()}),
                ("partitioners", {n: (p.summary, describe(p.options)) for n, p in PARTITIONERS.items()}),
                ("models", {n: (text, model[n]) for n, text in MODELS.items()}),
                ("executors", {n: (text, []) for n, text in EXECUTORS.items()}),
                ("topologies", {n: (text, []) for n, text in TOPOLOGIES.items()}),
                *((f"{title} ({key}: {{name: NAME, ...}})", {n: (c.summary, describe(c)) for n, c in registry.items()})
                  for title, key, registry in (("participations", "participation", PARTICIPATIONS),
                                               ("aggregation rules", "aggregator", RULES),
                                               ("attacks", "attack", ATTACKS))),
                ("reproductions", {n: (_summary(n), []) for n in study_names()})]
    for title, entries in sections:
        print(f"{title}:")
        for name, (text, options) in entries.items():
            print(f"  {name:<14} {text}")
            for key, default, doc in options:
                print(f"      {key} (default {_value(default)}): {doc}")
    return 0


def _list_algorithm(name: str) -> int:
    """One algorithm: its registration (summary, family, example config), then every hyperparameter with its type,
    default and one line about it."""
    from fljax.algorithms.registry import get_algorithm, hyperparameter_docs

    cls = get_algorithm(name)
    print(f"{name}: {cls.summary}")
    print(f"family: {cls.family}; example: {cls.example or 'none (it runs in its own study)'}")
    print("hyperparameters (set them with --set algo.KEY=VALUE or a config's algo: section):")
    for key, (kind, default, doc) in hyperparameter_docs(cls).items():
        print(f"  {key} ({kind}, default {_value(default)}): {doc}")
    return 0


def _value(value) -> str:
    """A default as a config file writes it (null, true, [200, 200])."""
    import json

    return value if isinstance(value, str) else json.dumps(list(value) if isinstance(value, tuple) else value)


def _summary(reproduction: str) -> str:
    from fljax.runner.study import load_study

    return f"{load_study(reproduction).title} (fljax reproduce {reproduction})"


def cmd_reproduce(args) -> int:
    from fljax.config import INT32_MAX, RUNS_MAX
    from fljax.options import suggest
    from fljax.runner.study import load_study, study_names
    from fljax.runner.study_run import render_study, results_from_file, run_study

    available = study_names()
    if args.name not in available:
        raise ConfigError(f"unknown reproduction {args.name!r}; available: {available or 'none yet'}."
                          f"{suggest(args.name, available)}")
    if args.args:
        raise ConfigError(f"unrecognized arguments: {' '.join(args.args)} (see fljax reproduce --help).")
    study = load_study(args.name)
    only = _only(args.only, study)
    output = _output(args)
    if args.render:
        out = _report_out(args, study)
        text = render_study(results_from_file(study, out, only), out)
    else:
        for key, most in (("seeds", RUNS_MAX), ("rounds", INT32_MAX), ("jobs", JOBS_MAX)):
            value = getattr(args, key)
            if value is not None and not 1 <= value <= most:
                raise ConfigError(f"--{key} must be between 1 and {most:,}, got {value:,}.")
        out = _report_out(args, study)
        try:
            run_study(study, out, only=only, seeds=args.seeds, rounds=args.rounds, jobs=args.jobs or 1,
                      lanes=args.lanes, fresh=args.fresh, output=output)
        except KeyboardInterrupt as e:
            e = _signal_of(e)
            print(f"fljax: interrupted by {e.name}; runs finished so far are kept in {out}/runs and reused by: fljax "
                  f"reproduce {args.name} --out {out}", file=sys.stderr)
            return e.exit_status
        text = open(os.path.join(out, "README.md")).read()
    output.result(text)
    output.note(f"wrote {out}/README.md, results.json.gz and the plots")
    return 0


def _report_out(args, study) -> str:
    """Where ``fljax reproduce`` writes: ``--out DIR``; the committed report (the study file's ``out``,
    ``benchmarks/results/NAME``) only with ``--update-report``; else a new directory ``runs/reproduce-NAME-<date>-
    <time>``, as ``fljax run`` makes one (``--render`` rebuilds a report in place, so it names the one)."""
    if args.update_report and args.out:
        raise ConfigError(f"--update-report writes into the committed report ({study.spec.get('out')}); drop --out "
                          f"{args.out}, or drop --update-report to write into {args.out}.")
    if args.update_report:
        if "out" not in study.spec:
            raise ConfigError(f"--update-report: {study.name}'s study file names no committed report (no 'out:'); "
                              f"give --out DIR.")
        return study.spec["out"]
    if args.out:
        return args.out
    if args.render:
        raise ConfigError(f"--render rebuilds a report where it is: give --out DIR (a folder `fljax reproduce` wrote), "
                          f"or --update-report for the committed one ({study.spec.get('out', 'none')}).")
    return _default_out(f"reproduce-{study.name}")


def _only(text: str | None, study) -> list[str] | None:
    """``--only a,b``: the studies named (None: all of them, when the option is not given), checked
    (:meth:`~fljax.runner.study.Study.chosen`: each a study of the file, named once); a value that names none
    (``--only ,,,``) is refused rather than read as 'all'."""
    if text is None:
        return None
    only = [s.strip() for s in text.split(",") if s.strip()]
    if not only:
        raise ConfigError(f"--only {text!r} names no study; give comma-separated names from {study.studies}.")
    return study.chosen(only)


def hypergrad_choices(name: str) -> tuple[str, ...]:
    """The choices of a ``fljax tune`` option (:mod:`fljax.hypergrad`'s constants)."""
    from fljax import hypergrad

    return getattr(hypergrad, name)


# ``fljax tune``'s options with a choice among :mod:`fljax.hypergrad`'s constants, checked when the command runs
# (:func:`cmd_tune`; argparse's ``choices`` would import JAX to build every parser)
TUNE_CHOICES = {"keys": "KEYS", "split": "SPLITS", "mode": "MODES", "remat": "REMAT"}


class _Parser(argparse.ArgumentParser):
    """A parser whose epilog may be a function, called when its help is printed (the compare command's names the
    quick start's algorithms, from :mod:`fljax.algorithms`, which imports JAX)."""

    def format_help(self) -> str:
        if callable(self.epilog):
            self.epilog = self.epilog()
        return super().format_help()


def _reproduce_epilog() -> str:
    """The examples, then every reproduction with its title and the studies ``--only`` chooses from."""
    from fljax.runner.study import load_study, study_names

    studies = [load_study(name) for name in study_names()]
    listed = "\n".join(f"  {s.name:<14} {s.title}\n  {'':<14} --only {','.join(s.studies)}" for s in studies)
    return f"{EXAMPLES_REPRODUCE}\nreproductions (NAME) and their studies (--only):\n{listed}\n"


def _compare_epilog() -> str:
    from fljax.algorithms.families import QUICKSTART, QUICKSTART_WHY

    return EXAMPLES_COMPARE.format(why=textwrap.fill(
        f"The quick start (no --algorithms): {', '.join(QUICKSTART)}. {QUICKSTART_WHY}", 100))


def make_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="fljax", description="Vectorised federated learning simulation in JAX. "
                "See docs/cli.md.", epilog="run `fljax COMMAND --help` for a command's options")
    p.add_argument("--version", action="version", version=f"fljax {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    raw = argparse.RawDescriptionHelpFormatter

    def common(sp):
        sp.add_argument("config", nargs="?", help="YAML config file (optional; keys: see configs/README.md)")
        sp.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="override a config key, e.g. --set data.alpha=0.1 (repeatable; values are YAML)")
        sp.add_argument("--dataset", help="data set name (see fljax list)")
        sp.add_argument("--out", metavar="DIR", help="run directory (default: runs/<name>-<date>-<time>)")
        sp.add_argument("--resume", action="store_true",
                        help="continue the run in --out DIR from its latest checkpoint (same results bit for bit)")
        sp.add_argument("--seeds", type=int, metavar="N", help="run N seeds (seed, seed+1, ...) and report mean ± std")
        sp.add_argument("--rounds", type=int, metavar="T", help="rounds per run (the same as --set rounds=T)")
        sp.add_argument("--checkpoint-every", type=int, metavar="K",
                        help="checkpoint every K rounds (default: at an evaluation once a minute has passed, "
                        "and at the end; 0: never)")
        sp.add_argument("--processes", type=int, metavar="N",
                        help="run the simulation as N processes of this machine, clients sharded over all of them "
                        "(jax.distributed; on several hosts set FLJAX_COORDINATOR, FLJAX_NUM_PROCESSES and "
                        "FLJAX_PROCESS_ID instead: see the README)")
        sp.add_argument("--tensorboard", metavar="DIR",
                        help="also write every evaluation as TensorBoard scalars into DIR/<run>/seed_<s>/ "
                        "(needs tensorboardX: pip install 'fljax[explore]')")
        _style_option(sp)
        mode = sp.add_mutually_exclusive_group()
        mode.add_argument("--quiet", action="store_true", help="no progress bar or notes, only the final table")
        mode.add_argument("--json", action="store_true",
                          help="JSON-log mode: stdout carries one JSON object per evaluation and per finished run")

    r = sub.add_parser("run", help="run one experiment", description="Run one experiment (any number of seeds) "
                       "into a run directory: config.yaml, metrics.jsonl, summary.json, plots, checkpoints.",
                       epilog=EXAMPLES_RUN, formatter_class=raw)
    common(r)
    r.add_argument("--algorithm", help="algorithm name (see fljax list)")
    r.set_defaults(func=cmd_run)
    sw = sub.add_parser("sweep", help="run a grid of hyperparameters × seeds, vectorised where shapes allow",
                        description="Run every point of a grid of config overrides for the config's seeds. Points "
                        "that differ only in numeric hyperparameters (learning rates, mu, lambda, rho, ...) run with "
                        "the seeds as lanes of ONE compiled program; other points run as separate programs. Writes "
                        "sweep.md (mean ± std over seeds), sweep.png and one run directory per point.",
                        epilog=EXAMPLES_SWEEP, formatter_class=raw)
    common(sw)
    sw.add_argument("--algorithm", help="algorithm name (see fljax list)")
    sw.add_argument("--grid", action="append", metavar="KEY=V1,V2,...",
                    help="a grid axis, e.g. --grid algo.lr=0.01,0.03,0.1 (repeatable: the grid is their product)")
    sw.add_argument("--lanes", choices=("vmap", "map", "off"), default="vmap",
                    help="vmap: lanes batched (fastest); map: lanes one after another inside the program "
                    "(bit-identical to separate runs of it); off: one program per run")
    sw.set_defaults(func=cmd_sweep)
    c = sub.add_parser("compare", help="run several algorithms on the same data and seeds, print one table",
                       description="Run several algorithms on the same data, partition and seeds; print one table "
                       "and write compare.md, compare.png and one run directory per algorithm. Without a config "
                       "file: the packaged quick-start preset (digits, 50 clients).",
                       epilog=_compare_epilog, formatter_class=raw)
    common(c)
    c.add_argument("--algorithms", metavar="NAMES",
                   help="comma-separated names, or 'all' (every general-purpose algorithm); default: the quick "
                   "start's algorithms (below)")
    c.set_defaults(func=cmd_compare)
    ls = sub.add_parser("list", help="show algorithms, data sets, partitioners, models, executors, topologies, "
                        "participations, aggregation rules, attacks, reproductions",
                        description="Everything fljax knows by name, one line each; with an algorithm's name, its "
                        "hyperparameters with their types, defaults and one line each.")
    ls.add_argument("name", nargs="?", help="an algorithm: list its hyperparameters")
    ls.set_defaults(func=cmd_list)
    tn = sub.add_parser("tune", help="tune continuous hyperparameters by hypergradient descent through whole runs",
                        description="Differentiate a run's held-out loss with respect to continuous hyperparameters "
                        "(client and server learning rates, FedProx's mu, Ditto's lambda, the server optimizer's "
                        "betas, ...) through every round, and descend on them: steps on log h (logit h for values in "
                        "(0, 1)) along the negative hypergradient, each kept only where the run of the same key is "
                        "better, the run's key re-drawn every step. Writes tune.md, tune.json and "
                        "tune.png into --out. See docs/tuning.md.", epilog=EXAMPLES_TUNE, formatter_class=raw)
    tn.add_argument("config", nargs="?", help="YAML config file (optional; keys: see configs/README.md)")
    tn.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key (repeatable)")
    tn.add_argument("--algorithm", help="algorithm name (see fljax list)")
    tn.add_argument("--dataset", help="data set name (see fljax list)")
    tn.add_argument("--out", metavar="DIR", help="output directory (default: runs/tune-<name>-<date>-<time>)")
    tn.add_argument("--hp", action="append", metavar="KEY", help="a continuous hyperparameter to tune, e.g. "
                    "--hp algo.lr (repeatable)")
    tn.add_argument("--steps", type=int, default=10, metavar="S", help="hypergradient steps (default 10; 0: only "
                    "the value and gradient at the start)")
    tn.add_argument("--hyper-lr", type=float, default=0.2, metavar="A", help="the longest step in log h (default "
                    "0.2: a factor of 1.22); a step not better on its run is halved and tried again")
    tn.add_argument("--keys", metavar="K", default="redraw",
                    help="redraw: the run of seed + step at every step (default); fixed: the config's seed")
    tn.add_argument("--metric", default="global_loss", help="the evaluation loss to minimise (default global_loss; "
                    "personal_loss for personalized models)")
    tn.add_argument("--split", metavar="SPLIT", default="val", help="where the metric is "
                    "scored: val (rows held out of each client's training split; default), test or train")
    tn.add_argument("--val-fraction", type=float, default=0.2, metavar="F",
                    help="share of each client's training rows held out for validation (default 0.2)")
    tn.add_argument("--last", type=int, default=1, metavar="M", help="average the metric over the evaluations "
                    "after each of the last M rounds (default 1: the final one)")
    tn.add_argument("--mode", metavar="MODE", default="reverse",
                    help="reverse (one backward sweep; default) or forward (jvp per hyperparameter, memory "
                    "independent of the rounds)")
    tn.add_argument("--remat", metavar="R", default="round",
                    help="reverse mode: recompute each round (round; default), blocks of sqrt(T) rounds (block), or "
                    "store everything (none)")
    mode = tn.add_mutually_exclusive_group()
    mode.add_argument("--quiet", action="store_true", help="no progress lines, only the final table")
    mode.add_argument("--json", action="store_true", help="one JSON object per step on stdout")
    tn.set_defaults(func=cmd_tune, seeds=None, checkpoint_every=None)
    rp = sub.add_parser("reproduce", help="run a paper reproduction (fljax/reproduce/NAME.yaml)",
                        description="Run the studies of a paper reproduction (a study file: base config, axes of "
                        "overrides, seeds, the paper's numbers) through the path of `fljax run`; runs finished "
                        "before an interruption are reused. Writes README.md (tables, claims), results.json.gz and "
                        "plots into --out. The available ones and their studies are listed below.", epilog=_reproduce_epilog,
                        formatter_class=raw)
    rp.add_argument("name", help="reproduction name")
    rp.add_argument("--only", metavar="STUDIES", help="comma-separated studies of the file (default: all)")
    rp.add_argument("--seeds", type=int, metavar="N", help="seeds per cell (default: the file's)")
    rp.add_argument("--rounds", type=int, metavar="T", help="rounds per run (default: the file's; a quick look)")
    rp.add_argument("--jobs", type=int, metavar="N", help="worker processes (default 1)")
    rp.add_argument("--out", metavar="DIR", help="output folder (default: a new runs/reproduce-NAME-<date>-<time>)")
    rp.add_argument("--update-report", action="store_true",
                    help="write into the committed report, the study file's output folder (benchmarks/results/NAME), "
                    "reusing the runs it records; refused when it would drop runs it records (add --fresh to "
                    "replace it)")
    rp.add_argument("--render", action="store_true", help="only rebuild README.md and plots in --out DIR (or the "
                    "committed report, --update-report) from its results.json.gz (without it: from the runs finished "
                    "in DIR/runs)")
    rp.add_argument("--fresh", action="store_true", help="ignore the runs already in DIR/runs")
    rp.add_argument("--lanes", choices=("vmap", "map", "off"), default=None,
                    help="how runs that can share a program run (default: the study file's, else vmap; see fljax "
                    "sweep --help)")
    _style_option(rp)
    mode = rp.add_mutually_exclusive_group()
    mode.add_argument("--quiet", action="store_true", help="no progress bars or notes")
    mode.add_argument("--json", action="store_true", help="JSON-log mode (see fljax run --help)")
    rp.set_defaults(func=cmd_reproduce)
    return p


MESSAGE_MAX = 1000  # characters of an error line (a message quoting a huge value is cut in its middle)


def _one_line(e: BaseException) -> str:
    """The error's message as one line of at most :data:`MESSAGE_MAX` characters."""
    text = str(e).splitlines()[0] if str(e).strip() else type(e).__name__
    if len(text) > MESSAGE_MAX:
        text = f"{text[:MESSAGE_MAX // 2]} … {text[-MESSAGE_MAX // 2:]}"
    return text
def _style_option(parser) -> None:
    parser.add_argument("--style", choices=("screen", "paper"), default="screen",
                        help="figures: 'screen' (PNG and PDF to look at) or 'paper' (single-column width 3.3 in, "
                        "serif fonts, vector PDF with a PNG preview; fljax.runner.plots)")


def _run(args) -> int:
    """The command, its figures in the style ``--style`` names."""
    import contextlib

    from fljax.runner import plots

    with plots.use(args.style) if getattr(args, "style", None) else contextlib.nullcontext():
        return args.func(args)


def _on_sigterm(signum, frame):
    from fljax.runner.interrupt import Interrupted

    raise Interrupted(signum)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = make_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "reproduce":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.args = extra
    debug = bool(os.environ.get("FLJAX_DEBUG"))
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if main_thread else None  # SIGTERM acts as Ctrl-C
    try:
        launched = _join(args, argv) if hasattr(args, "processes") else None
        return launched if launched is not None else _run(args)
    except KeyboardInterrupt as e:  # outside a run (a run reports how to resume it)
        e = _signal_of(e)
        print(f"fljax: interrupted by {e.name}", file=sys.stderr)
        return e.exit_status
    except FloatingPointError as e:  # NaN/Inf during training (NonFiniteError)
        if debug:
            raise
        print(f"fljax: error: {_one_line(e)}", file=sys.stderr)
        return 3
    except (ValueError, OSError) as e:  # ConfigError, DataError, PartitionError, hyperparameter errors, files
        if debug:
            raise
        print(f"fljax: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - unexpected; a worker of --processes N reports it to its launcher
        from fljax.engine import processes
        from fljax.runner.launch import REPORT_ENV, UNEXPECTED_EXIT

        report = os.environ.get(REPORT_ENV)
        if debug:
            raise
        if report:
            with open(report, "w") as f:  # the launcher says it in one line (the others' errors follow from it)
                f.write(f"{type(e).__name__}: {_one_line(e)}\n")
            return UNEXPECTED_EXIT
        from fljax.engine.budget import out_of_memory

        line = processes.lost_group(e) or out_of_memory(e)  # a group started by hand (no launcher); no memory left
        if line is None:
            raise
        print(f"fljax: error: {line}", file=sys.stderr)
        return UNEXPECTED_EXIT
    finally:
        _release_claims()
        if main_thread:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


if __name__ == "__main__":
    sys.exit(main())
