"""What ``--resume`` may change in a run directory's config.

A resumed run continues the simulation its checkpoints hold, so everything that decides what is simulated must
stay as the directory's ``config.yaml`` says: the data (data set, clients, partition and its options, data seed,
test split), the model, the algorithm and every hyperparameter, the seed and the number of seeds. Only the keys of
:data:`MAY_CHANGE` may differ: how long the run goes (``rounds``), how often it evaluates and checkpoints, when
the divergence guard stops it, how the client axis is executed and the run's name. (Changing the evaluation or
checkpoint cadence, or the executor, keeps the results correct but may change their last bits.)

:func:`check_resume` compares every key, the algorithm's declared defaults filled in, and refuses the first that
differs, in one line naming it, before anything is written.
"""
from __future__ import annotations

import os

from fljax.algorithms import ALGORITHMS
from fljax.algorithms.registry import defaults
from fljax.config import ExperimentConfig, load_config, nullable_sections, to_dict
from fljax.errors import ConfigError
from fljax.options import show

__all__ = ["MAY_CHANGE", "check_resume", "flat"]

MAY_CHANGE = ("rounds", "eval_every", "checkpoint_every", "diverge_factor", "executor", "chunk_size", "name",
              "model.conv_impl")


def flat(cfg: ExperimentConfig) -> dict:
    """Every key of ``cfg`` as a dotted name → value, with the algorithm's declared defaults for the
    hyperparameters it does not set (so that ``lr`` left at its default equals ``lr`` given as that default)."""
    values = to_dict(cfg)
    algo = values.pop("algo")
    if cfg.algorithm in ALGORITHMS:
        algo = {**to_dict(defaults(ALGORITHMS[cfg.algorithm])), **algo}
    return {**_flatten(values), **{f"algo.{k}": v for k, v in algo.items()}}


def _flatten(values: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in values.items():
        if isinstance(value, dict) and key in ("data", "model", "privacy", "compression"):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def check_resume(directory: str, cfg: ExperimentConfig) -> None:
    """Refuse ``cfg`` for resuming the run in ``directory`` when it changes a key outside :data:`MAY_CHANGE`
    (no ``config.yaml`` there: nothing to compare, nothing refused)."""
    path = os.path.join(directory, "config.yaml")
    if not os.path.exists(path):
        return
    before = load_config(path)
    saved, new = flat(before), flat(cfg)
    if saved.get("privacy.target_epsilon") is not None and saved.get("rounds") != new.get("rounds"):
        raise ConfigError(f"--resume cannot change rounds ({saved.get('rounds')} in {path}, {new.get('rounds')} now) "
                          f"of a run whose noise is calibrated to privacy.target_epsilon over its rounds: the rounds "
                          f"already run used that noise; start a new run (another --out) for another length.")
    for key in sorted(nullable_sections()):  # a section added or removed: named as a whole, not by a key of it
        was, now = getattr(before, key), getattr(cfg, key)
        if (was is None) != (now is None):
            raise ConfigError(f"--resume cannot {'add' if was is None else 'remove'} {key} ("
                              f"{'null' if was is None else 'set'} in {path}, {'set' if was is None else 'null'} "
                              f"now): it changes the simulation the checkpoints hold; start a new run (another "
                              f"--out) {'with' if was is None else 'without'} {key}.")
    for key in sorted(saved.keys() | new.keys(), key=_order):
        if key not in MAY_CHANGE and saved.get(key) != new.get(key):
            raise ConfigError(f"--resume cannot change {key} ({_shown(saved, key)} in {path}, {_shown(new, key)} "
                              f"now): it changes the simulation the checkpoints hold. A resume may change only "
                              f"{', '.join(MAY_CHANGE)}; start a new run (another --out) to change {key}.")


def _order(key: str) -> tuple:
    """Report the most telling key first: the algorithm before its hyperparameters, data and model before the
    rest."""
    first = ("algorithm", "seeds", "seed")
    return (first.index(key) if key in first else len(first), key)


def _shown(values: dict, key: str) -> str:
    return show(values[key]) if key in values else "unset"
