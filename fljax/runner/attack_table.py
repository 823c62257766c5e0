"""The attack table of a sweep (robust spec; issue 35): what a paper's attack × defence table shows, from one command.

A sweep whose grid chooses attacks (``attack.name``), rules (``aggregator.name``) or malicious fractions
(``attack.fraction``) writes, beside ``sweep.md``:

* ``attacks.md``: a row per point — its attack, rule and fraction (and any other key the grid varies), the **clean
  accuracy** (the honest clients' own test splits: ``honest_global_acc``, else ``honest_personal_acc`` for an
  algorithm without a global model; ``global_acc``/``personal_acc`` for a grid without an attack), mean ± std over
  the seeds in percent; its **drop**, the mean clean accuracy of the no-attack reference minus its own (points); a
  backdoor's **ASR** (``global_asr``, else ``personal_asr``); a selecting rule's **malicious share** (how much of its
  aggregate came from malicious uploads);
* ``attacks.png`` (and ``.pdf``): the clean accuracy as a heatmap, attacks down and rules across, one panel per
  fraction, each cell annotated with the accuracy and its drop — when the grid varies nothing else.

The no-attack reference of a point is the point with the same values and ``attack.name=none``
(:class:`fljax.aggregation.NoAttack`: the same clients marked, R4, none of them misbehaving, the rule told the same
f, R3): put ``none`` among the grid's attacks and the table has its drops.
"""
from __future__ import annotations

import numpy as np

from fljax.runner import plots
from fljax.runner.report import markdown_table, mean_std
from fljax.runner.sweep import grid_columns

__all__ = ["KEYS", "is_attack_grid", "attack_rows", "attack_markdown", "plot_attacks"]

KEYS = ("attack.name", "aggregator.name", "attack.fraction")  # what an attack table is made of
NONE = "none"  # the no-attack reference (fljax.aggregation.NoAttack)
CLEAN = ("honest_global_acc", "honest_personal_acc", "global_acc", "personal_acc")  # first present in every point
ASR = ("global_asr", "personal_asr")


def is_attack_grid(grid: dict[str, list]) -> bool:
    """A grid that chooses attacks, rules or malicious fractions."""
    return any(k in grid for k in KEYS)


def _finals(result, metric: str) -> np.ndarray:
    """The metric's final value of every seed that has it."""
    return np.array([h[-1][metric] for h in result.histories if h and metric in h[-1]], float)


def _first(metrics: tuple[str, ...], results) -> str | None:
    """The first of ``metrics`` that every point's final records hold (None: none)."""
    return next((m for m in metrics if all(_finals(r, m).size for r in results)), None)


def attack_rows(points: list[tuple[str, dict, object]], results: list) -> list[dict]:
    """One row per point (``points``: (label, its grid values, its resolved experiment); ``results`` in the same
    order): ``values`` (attack, rule, fraction as run, and the other grid values), ``clean`` (per seed, %),
    ``metric`` (its name), ``reference`` (the no-attack point's mean, or None), ``asr`` and ``share`` (per seed; empty
    when the point has none) and ``status``."""
    metric = _first(CLEAN, results) or CLEAN[0]
    asr = next((m for m in ASR if any(_finals(r, m).size for r in results)), None)
    rows = []
    for (label, values, exp), result in zip(points, results):
        described = {"attack": exp.attack.name if exp.attack is not None else "-",
                     "defence": exp.aggregator.name if exp.aggregator is not None else "mean",
                     "fraction": exp.attack.fraction if exp.attack is not None else 0.0}
        rows.append({"label": label, "grid": values, "values": described, "metric": metric,
                     "clean": 100 * _finals(result, metric), "asr": 100 * _finals(result, asr) if asr else np.array([]),
                     "share": _finals(result, "malicious_share"), "status": result.status})
    by_grid = {_frozen(r["grid"]): r for r in rows}
    for r in rows:  # the reference: the same grid values with attack.name = none
        if r["grid"].get("attack.name") not in (None, NONE):
            ref = by_grid.get(_frozen({**r["grid"], "attack.name": NONE}))
            r["reference"] = float(ref["clean"].mean()) if ref is not None and ref["clean"].size else None
        else:
            r["reference"] = None
    return rows


def _frozen(values: dict) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in values.items()))


def _varying(grid: dict[str, list]) -> list[str]:
    return [k for k, v in grid.items() if len(v) > 1]


def attack_markdown(grid: dict[str, list], rows: list[dict], title: str) -> str:
    """``attacks.md``: the rows as a Markdown table, with a line saying what the values are."""
    names = {"attack.name": "attack", "aggregator.name": "defence", "attack.fraction": "fraction"}
    columns = grid_columns(grid)
    keys = [k for k in KEYS if k in grid] + [k for k in _varying(grid) if k not in KEYS]
    has_ref = any(r["reference"] is not None for r in rows)
    has_asr = any(r["asr"].size for r in rows)
    has_share = any(r["share"].size for r in rows)
    table = []
    for r in rows:
        row = {names.get(k, columns[k]): r["grid"][k] for k in keys}
        row["clean acc (%)"] = mean_std(r["clean"], 2)
        if has_ref:
            row["drop"] = "-" if r["reference"] is None or not r["clean"].size else \
                f"{r['reference'] - r['clean'].mean():+.2f}"
        if has_asr:
            row["ASR (%)"] = mean_std(r["asr"], 2) if r["asr"].size else "-"
        if has_share:
            row["malicious share"] = mean_std(r["share"], 2) if r["share"].size else "-"
        row["status"] = r["status"]
        table.append(row)
    seeds = max((r["clean"].size for r in rows), default=0)
    what = (f"Clean accuracy: final `{rows[0]['metric']}` (the honest clients' own test splits), mean ± std over "
            f"{seeds} seed{'s' * (seeds != 1)} (sample std). ")
    what += ("Drop: the mean clean accuracy of the same point with attack.name=none minus this one's (points). "
             if has_ref else "Add none to --grid attack.name for each point's drop against its no-attack reference. ")
    if has_share:
        what += "Malicious share: the share of a selecting rule's aggregate taken by malicious uploads."
    return f"# {title}\n\n{what.strip()}\n\n{markdown_table(table)}\n"


def plot_attacks(path: str, grid: dict[str, list], rows: list[dict], title: str) -> list[str]:
    """``attacks.png``: the clean accuracy (%) of every (attack, rule) as a heatmap, attacks down, rules across, a
    panel per fraction, one colour scale; each cell shows the accuracy and, with a reference, its drop. Nothing
    (``[]``) when the grid varies other keys too (the cells would mix their values)."""
    if set(_varying(grid)) - set(KEYS) or not rows:
        return []
    attacks = list(dict.fromkeys(r["values"]["attack"] for r in rows))
    rules = list(dict.fromkeys(r["values"]["defence"] for r in rows))
    fractions = list(dict.fromkeys(r["values"]["fraction"] for r in rows))
    cell = {(r["values"]["attack"], r["values"]["defence"], r["values"]["fraction"]): r for r in rows}
    finite = [r["clean"].mean() for r in rows if r["clean"].size]
    low, high = (min(finite), max(finite)) if finite else (0.0, 100.0)
    with plots.rc_context():
        fig, axes = plots.figure(len(fractions), rows=1, cols=len(fractions))
        fig.set_size_inches(max(3.2, 0.9 * len(rules) + 1.6) * len(fractions) + 1.0, 0.5 * len(attacks) + 1.8)
        image = None
        for ax, fraction in zip(axes, fractions):
            values = np.full((len(attacks), len(rules)), np.nan)
            texts = [[""] * len(rules) for _ in attacks]
            for i, a in enumerate(attacks):
                for j, d in enumerate(rules):
                    r = cell.get((a, d, fraction))
                    if r is None or not r["clean"].size:
                        continue
                    values[i, j] = r["clean"].mean()
                    drop = None if r["reference"] is None else r["reference"] - values[i, j]
                    texts[i][j] = f"{values[i, j]:.1f}" + ("" if drop is None else
                                                         f"\n{'↓' if drop >= 0 else '↑'}{abs(drop):.1f}")
            image = plots.heatmap(ax, values, attacks, rules, "", texts=texts, vmin=low, vmax=high, colorbar=False)
            ax.set_xticks(range(len(rules)), rules, rotation=30, ha="right")
            ax.set_title(f"{fraction:.0%} malicious" if len(fractions) > 1 or fraction else title, fontsize="medium")
            ax.set_xlabel("defence")
        axes[0].set_ylabel("attack")
        fig.colorbar(image, ax=axes, label="clean accuracy (%)", shrink=0.9)
        seeds = max((r["clean"].size for r in rows), default=1)
        note = (f"cell: clean accuracy (%), mean over {seeds} seed{'s' * (seeds != 1)}"
                + ("; below it ↓ its drop (↑ gain) against attack = none, points" if any(r["reference"] is not None
                                                                                  for r in rows) else ""))
        fig.suptitle(f"{title}\n{note}", fontsize="medium")
        return plots.save(fig, path)
