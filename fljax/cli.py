"""The ``fljax`` command line: run, compare, list.

Every error a user can cause (unknown names, wrong types, impossible values, bad partitions) is printed as one
line starting with ``fljax: error:`` and exit status 2, never as a stack trace.
"""
from __future__ import annotations

import argparse
import sys
from importlib import resources

from fljax.config import ConfigError, load_config

EXAMPLES_RUN = """examples:
  fljax run --algorithm fedprox --dataset digits --set algo.mu=0.01 --set data.alpha=0.1
  fljax run configs/fedavg.yaml --set rounds=50
"""
EXAMPLES_COMPARE = """examples:
  fljax compare                                   # the built-in quick-start comparison
  fljax compare --algorithms fedavg,fedprox --set data.dataset=digits --set rounds=30
"""


def _quickstart_path() -> str:
    return str(resources.files("fljax").joinpath("configs/quickstart.yaml"))


def _config(args, base: dict | None = None):
    overrides = list(args.set or [])
    if getattr(args, "algorithm", None):
        overrides.append(f"algorithm={args.algorithm}")
    if getattr(args, "dataset", None):
        overrides.append(f"data.dataset={args.dataset}")
    return load_config(args.config, overrides, base)


def _table(rows: list[dict]) -> str:
    cols = list(rows[0])
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in cols]
    line = lambda vals: "| " + " | ".join(str(v).ljust(w) for v, w in zip(vals, widths)) + " |"
    return "\n".join([line(cols), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] +
                     [line([r[c] for c in cols]) for r in rows])


def _row(label: str, result, sim=None) -> dict:
    f = result.final
    fmt = lambda k: f"{f[k]:.4f}" if k in f else "-"
    row = {"algorithm": label, "personal acc": fmt("personal_acc"), "weighted": fmt("personal_acc_weighted"),
           "p10 client": fmt("personal_acc_p10"), "global acc": fmt("global_acc"), "rounds": f.get("round", 0),
           "MB up+down": f"{(f.get('bytes_up', 0) + f.get('bytes_down', 0)) / 1e6:.1f}",
           "run s": f"{result.run_seconds:.1f}", "compile s": f"{result.compile_seconds:.1f}"}
    if sim is not None and result.run_seconds > 0:
        steps, _ = sim.work_per_round()
        row["client-steps/s"] = f"{steps * f.get('round', 0) / result.run_seconds:,.0f}"
    return row


def cmd_run(args) -> int:
    from fljax.api import build

    cfg = _config(args)
    sim = build(cfg)
    print(sim.data.summary(), file=sys.stderr)
    result = sim.run(cfg.rounds, cfg.eval_every, progress=not args.quiet)
    print(_table([_row(cfg.name or cfg.algorithm, result, sim)]))
    return 0


def cmd_compare(args) -> int:
    import dataclasses

    from fljax.algorithms import ALGORITHMS
    from fljax.api import build, load_data

    args.config = args.config or _quickstart_path()
    cfg = _config(args)
    names = args.algorithms.split(",") if args.algorithms else [n for n, c in ALGORITHMS.items() if c.generic]
    data = load_data(cfg)
    print(data.summary(), file=sys.stderr)
    rows = []
    for name in names:
        from fljax.api import _fields

        one = dataclasses.replace(cfg, algorithm=name, algo={k: v for k, v in cfg.algo.items() if k in _fields(name)})
        one.validate()
        sim = build(one, data)
        if not args.quiet:
            print(f"{name}: {sim.algorithm.summary}", file=sys.stderr)
        rows.append(_row(name, sim.run(cfg.rounds, cfg.eval_every, progress=not args.quiet), sim))
    print(_table(rows))
    return 0


def cmd_list(args) -> int:
    from fljax.algorithms import ALGORITHMS
    from fljax.data import PARTITIONERS, SOURCES
    from fljax.engine import EXECUTORS
    from fljax.models import MODELS

    sections = [("algorithms", {n: c.summary for n, c in ALGORITHMS.items()}), ("datasets", SOURCES),
                ("partitioners", PARTITIONERS), ("models", MODELS), ("executors", EXECUTORS)]
    try:
        from fljax.ops.gossip import TOPOLOGIES
        sections.append(("topologies", TOPOLOGIES))
    except ImportError:
        pass
    for title, entries in sections:
        print(f"{title}:")
        for name, text in entries.items():
            print(f"  {name:<14} {text}")
    return 0


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fljax", description="Vectorised federated learning simulation in JAX.")
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp):
        sp.add_argument("config", nargs="?", help="YAML config file (optional)")
        sp.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="override a config key, e.g. --set data.alpha=0.1 (repeatable)")
        sp.add_argument("--quiet", action="store_true", help="no progress bar")

    r = sub.add_parser("run", help="run one experiment", epilog=EXAMPLES_RUN,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    common(r)
    r.add_argument("--algorithm", help="algorithm name (see fljax list)")
    r.add_argument("--dataset", help="data set name (see fljax list)")
    r.set_defaults(func=cmd_run)
    c = sub.add_parser("compare", help="run several algorithms on the same data and print one table",
                       epilog=EXAMPLES_COMPARE, formatter_class=argparse.RawDescriptionHelpFormatter)
    common(c)
    c.add_argument("--algorithms", help="comma-separated names (default: every general-purpose algorithm)")
    c.add_argument("--dataset", help="data set name (see fljax list)")
    c.set_defaults(func=cmd_compare)
    ls = sub.add_parser("list", help="show algorithms, data sets, partitioners, models, executors, topologies")
    ls.set_defaults(func=cmd_list)
    return p


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, ValueError) as e:
        print(f"fljax: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    except FloatingPointError as e:
        print(f"fljax: error: {e}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
