"""Which runs share one compiled program.

A run is one lane: a point's experiment with one seed. Runs go into one program (:class:`fljax.engine.Lanes`) when

* their resolved experiments are equal (:func:`program_key`) except for the seed, the point's name and *numeric*
  algorithm hyperparameters (learning rates, μ, λ, ρ, k0, …) or client-level privacy's noise multiplier (given or
  calibrated from a target ε), which then become traced arguments — the grid is one program;
* they share their data, or have data of identical shapes (stacked per lane);
* the executor is jitted on one device (not ``loop``, not ``sharded``);
* they start at the same round (resuming).

Everything else runs as separate programs (one per distinct config). A hyperparameter that Python control flow
inspects (``if momentum:``) cannot be traced: :func:`traceable` finds out by tracing one round, and the runner then
splits the program by that key.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any

from fljax.aggregation import traced as traced_options
from fljax.config import to_dict
from fljax.privacy import TRACED_NOISE

__all__ = ["Program", "group_runs", "program_key", "family_key", "numeric", "traceable", "lane_data", "COMPONENTS",
           "SECTIONS"]

COMPONENTS = ("aggregator", "attack", "participation")  # resolved components of an Experiment
SECTIONS = ("data", "server", "privacy", "compression")  # config sections a program is built from as given


def numeric(value) -> bool:
    """An int or float that can become a traced scalar (not a bool, not None)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def program_key(exp, traced: set[str] = frozenset()) -> str:
    """What a compiled program is made of, read off the resolved experiment (:class:`fljax.experiment.Experiment`):
    the algorithm with its hyperparameters as it holds them, the model, client groups, aggregator, attack and
    participation as resolved, the run settings (:class:`fljax.experiment.RunSettings`) but the per-lane seeds, and
    the data, server, privacy and compression sections — the traced values (``traced``: hyperparameter names, and
    dotted keys of other sections — ``privacy.noise_multiplier``, whose resolved value a grid of noise levels traces,
    ``attack.fraction``, ``aggregator.beta`` — ) left out. (The run's name is not part of it.)"""
    cfg = exp.config
    values = {"algorithm": cfg.algorithm,
              "hyperparameters": {k: v for k, v in exp.algorithm.hyperparameters().items() if k not in traced},
              "model": to_dict(exp.model), "groups": [dataclasses.asdict(g) for g in exp.groups],
              "settings": {k: v for k, v in dataclasses.asdict(exp.settings).items() if k not in exp.settings.PER_LANE},
              **{section: to_dict(getattr(cfg, section)) for section in SECTIONS}}
    for section in COMPONENTS:  # by name and options, the traced ones left out
        value = getattr(exp, section)
        values[section] = None if value is None else {"name": value.name, **{
            k: v for k, v in to_dict(value).items() if f"{section}.{k}" not in traced}}
    if TRACED_NOISE in traced and values.get("privacy"):  # given or calibrated from a target ε
        values["privacy"] = {k: v for k, v in values["privacy"].items()
                             if k not in ("noise_multiplier", "target_epsilon")}
    return json.dumps(values, sort_keys=True, default=_written)


def family_key(exp) -> str:
    """:func:`program_key` without any value a program may trace per lane (the algorithm's hyperparameters, the
    rule's and the attack's numeric options): runs with one family key may share a program, as :func:`group_runs`
    then decides (a study's grid points run as lanes this way)."""
    return program_key(exp, set(exp.algorithm.hyperparameters()) | set(traced_options("aggregator", exp.aggregator))
                       | set(traced_options("attack", exp.attack)))


def _written(value) -> str:
    """A value JSON does not know as text: a consensus-regression loss by its config, anything else by repr."""
    return value.to_config() if hasattr(value, "to_config") else repr(value)


def _private(run) -> dict:
    """The values of other sections than ``algo`` the run may trace, by dotted key: client-level privacy's noise
    multiplier (:meth:`fljax.privacy.Privacy.traced`), the aggregator's and the attack's numeric options
    (:func:`fljax.aggregation.traced`)."""
    privacy = getattr(run, "privacy", None)
    out = {} if privacy is None else dict(privacy.traced())
    exp = getattr(run, "exp", None)
    if exp is not None:
        out.update(traced_options("aggregator", exp.aggregator), **traced_options("attack", exp.attack))
    return out


@dataclasses.dataclass
class Program:
    """Runs of one compiled program: ``runs`` (lanes), the algorithm keys traced per lane, whether the lanes
    share one data set."""

    runs: list
    traced: tuple[str, ...] = ()

    def hps(self) -> list[dict] | None:
        """Per-lane values of the traced keys (None when nothing is traced)."""
        if not self.traced:
            return None
        return [{k: _value(run, k) for k in self.traced} for run in self.runs]


def group_runs(runs: list, *, batchable, lanes: str = "vmap", split: set[str] = frozenset(),
               trace: set[str] = frozenset()) -> list[Program]:
    """Programs for ``runs`` (:class:`~fljax.runner.runs.Run`: a resolved experiment ``.exp``, its ``.cfg``, and
    ``.progress.start``, the round it resumes from).
    ``batchable(runs, traced)`` says whether a set of runs can share a program that traces ``traced`` (executor,
    data shapes). ``lanes='off'``: every run alone.
    ``split``: algorithm keys that must not be traced (found untraceable); ``trace``: keys traced even where every
    run has the same value (a sweep's grid keys, so that a one-point sweep runs the very program of a larger one)."""
    if lanes == "off":
        return [Program([r]) for r in runs]
    groups: dict[tuple, list] = {}
    for run in runs:  # same algorithm, same everything but the algorithm's hyperparameters, same start round
        key = program_key(run.exp, _all_fields(run) | set(_private(run)))
        groups.setdefault((key, run.progress.start), []).append(run)
    programs = []
    for members in groups.values():
        candidates = _differing(members) | set(trace)
        traced = {k for k in candidates if all(numeric(_value(r, k)) for r in members)} - set(split)
        by_rest: dict[str, list] = {}
        for run in members:  # the keys that cannot be traced separate programs
            by_rest.setdefault(program_key(run.exp, traced), []).append(run)
        for rest in by_rest.values():
            programs.extend(_by_data(rest, tuple(sorted(traced)), batchable))
    return programs


def _all_fields(run) -> set[str]:
    return set(run.exp.algorithm.hyperparameters())


def _value(run, key: str) -> Any:
    """The run's value of hyperparameter ``key`` (the one its algorithm holds: a default when the config leaves it;
    ``privacy.noise_multiplier``: the resolved one)."""
    private = _private(run)
    return private[key] if key in private else run.exp.algorithm.hyperparameters()[key]


def _differing(runs: list) -> set[str]:
    keys = set().union(*(_all_fields(r) for r in runs), *(_private(r) for r in runs))
    return {k for k in keys if len({json.dumps(_value(r, k), default=str) for r in runs}) > 1}


def lane_data(runs: list) -> list | None:
    """The runs' data as lanes take it (:class:`fljax.engine.Lanes`): None when they share one data set, else each
    run's own."""
    datas = [r.data for r in runs]
    return None if all(d is datas[0] for d in datas) else datas


def _by_data(runs: list, traced: tuple, batchable) -> list[Program]:
    """One program if the runs can share it (data of one shape, a jitted executor); else one per data set (e.g. a
    grid's points for each seed when every seed draws its own partition); else one per run (tracing ``traced``
    only under a jitted executor). Splitting by data is tried only when it splits (several data sets, fewer than
    runs): runs that share one data set under an executor that cannot batch (``loop``, ``sharded``) go one per
    run at once."""
    if batchable(runs, traced):
        return [Program(runs, traced)]
    by_data: dict[int, list] = {}
    for run in runs:
        by_data.setdefault(id(run.data), []).append(run)
    if 1 < len(by_data) < len(runs):
        return [p for group in by_data.values() for p in _by_data(group, traced, batchable)]
    return [Program([r], traced if batchable([r], traced) else ()) for r in runs]


def traceable(sim, hp: dict) -> str | None:
    """None when one round and one evaluation of ``sim`` trace with ``hp`` as traced values, else the message of
    the tracing error (a Python branch on a traced hyperparameter)."""
    import jax
    import jax.numpy as jnp

    hp = {k: jnp.asarray(v) for k, v in hp.items()}
    try:
        state = jax.eval_shape(lambda h: sim.init_fn(jax.random.PRNGKey(0), h), hp)
        jax.eval_shape(lambda s, h: sim.block_fn(s, sim.data, 1, h), state, hp)
        jax.eval_shape(lambda s, h: sim.evaluate_fn(s, sim.data, h), state, hp)
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerBoolConversionError,
            jax.errors.TracerIntegerConversionError, TypeError) as e:
        return str(e).splitlines()[0]
    return None
