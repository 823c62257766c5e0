"""The run directory and what is written into it.

    <run dir>/
      config.yaml           the configuration as given, every key of the config layer filled in (what --resume
                            and the study runner read back)
      resolved.yaml         the same with every default made explicit: all of the algorithm's hyperparameters,
                            the model 'auto' picked with its options (loading it runs the same experiment)
      metrics.jsonl         one JSON object per evaluation: round, personalized and global accuracy/loss
                            (mean over clients, sample-weighted, 10th-percentile client), train loss, cumulative
                            bytes up/down, run_seconds (rounds and evaluations so far, compilation apart)
      summary.json          status, final and best metrics, rounds, setup/compile/run/other seconds adding up to
                            wall_seconds, client-steps/s, the clients evaluations scored (eval_clients of
                            num_clients; a sample's eval_client_ids), environment (versions, device, executor)
      accuracy_vs_round.png, accuracy_vs_bytes.png, client_accuracy.png
      checkpoints/<round>/  orbax checkpoints (see fljax.runner.checkpoint)

With several seeds, each seed has such a directory ``seed_<s>/`` and the top level holds the sweep's config,
``summary.json`` (mean ± std over seeds) and plots. Every file is written atomically (:mod:`fljax.runner.files`).
"""
from __future__ import annotations

import os

import numpy as np

from fljax.config import ConfigError, ExperimentConfig, to_dict
from fljax.engine import RunLog
from fljax.runner import files
from fljax.runner.report import sample_std

__all__ = ["RunDir", "make_summary", "aggregate_summaries", "seconds", "environment"]


class RunDir:
    """A run directory (``path``), or nowhere (``path=None``: a run from Python that writes nothing; every write
    is then skipped)."""

    def __init__(self, path: str | None):
        self.path = None if path is None else str(path)

    def file(self, name: str) -> str | None:
        return None if self.path is None else os.path.join(self.path, name)

    def child(self, name: str) -> "RunDir":
        return RunDir(self.file(name))

    @property
    def checkpoints(self) -> str | None:
        return self.file("checkpoints")

    def _exists(self, name: str) -> bool:
        return self.path is not None and os.path.exists(self.file(name))

    def holds_results(self) -> bool:
        """True when an earlier run left something here that a fresh start would destroy: a checkpoint, or a
        summary of a run that completed or was stopped by a guard. (A run that died or was interrupted before its
        first checkpoint has nothing to lose: its directory can be started afresh.)"""
        return self.has_checkpoint() or (self.holds_summary() and
                                         self.read_summary().get("status") in ("completed", "stopped"))

    def holds_config(self) -> bool:
        return self._exists("config.yaml")

    def holds_summary(self) -> bool:
        return self._exists("summary.json")

    def check_inside(self, inner: bool = False) -> None:
        """Refuse, in one line, a run directory whose ``checkpoints`` entry is a symbolic link (or not a directory),
        and an ``inner`` one (a seed's or a point's, inside the directory the user named) that is a link itself:
        fljax writes nothing outside the run directory it was given (checkpoints are written, moved aside and
        deleted in theirs; the files fljax writes are replaced by renaming, which replaces a link rather than
        following it)."""
        if inner and self.path is not None and os.path.islink(self.path):
            raise ConfigError(f"{self.path!r} is a symbolic link (to {os.readlink(self.path)!r}); fljax writes nothing "
                              f"outside the run directory it was given: remove the link.")
        d = self.checkpoints
        if d is None or not os.path.lexists(d):
            return
        if os.path.islink(d):
            raise ConfigError(f"{d!r} is a symbolic link (to {os.readlink(d)!r}); fljax writes, moves aside and "
                              f"deletes checkpoints there and writes nothing outside the run directory: remove the "
                              f"link (or move the checkpoints it points to into {d!r}).")
        if not os.path.isdir(d):
            raise ConfigError(f"{d!r} is a file, not the run's checkpoints directory; move it away.")

    def has_checkpoint(self) -> bool:
        d = self.checkpoints
        return d is not None and os.path.isdir(d) and any(n.isdigit() for n in os.listdir(d))

    def seed_dir(self, seed: int) -> "RunDir":
        return self.child(f"seed_{seed}")

    def write_config(self, cfg: ExperimentConfig) -> None:
        if self.path is not None:
            files.write_yaml(self.file("config.yaml"), to_dict(cfg))

    def write_resolved(self, values: dict) -> None:
        if self.path is not None:
            files.write_yaml(self.file("resolved.yaml"), values)

    def write_metrics(self, history: list[dict]) -> None:
        if self.path is not None:
            files.write_jsonl(self.file("metrics.jsonl"), history)

    def read_metrics(self) -> list[dict]:
        if not self._exists("metrics.jsonl"):
            return []
        records = files.read_jsonl(self.file("metrics.jsonl"))
        for number, record in enumerate(records, 1):
            if not isinstance(record.get("round"), int) or isinstance(record.get("round"), bool):
                raise files.DamagedFile(self.file("metrics.jsonl"), f"record {number} has no integer 'round'")
        return records

    def write_summary(self, summary: dict) -> None:
        if self.path is not None:
            files.write_json(self.file("summary.json"), summary)

    def read_summary(self) -> dict:
        return files.read_json(self.file("summary.json"), expect=dict)

    def write_text(self, name: str, text: str) -> None:
        if self.path is not None:
            files.write_text(self.file(name), text)


def _best(history: list[dict]) -> dict:
    """The best value of every accuracy (max) and loss (min) over the evaluations, with its round."""
    best = {}
    for key in history[0] if history else ():
        if key.endswith(("_acc", "_acc_weighted", "_acc_p10")) or key.endswith(("_loss", "_loss_weighted")):
            values = np.array([h[key] for h in history], dtype=float)
            if np.all(np.isnan(values)):
                continue
            i = int(np.nanargmax(values) if "_acc" in key else np.nanargmin(values))
            best[key] = {"value": float(values[i]), "round": history[i]["round"]}
    return best


def seconds(setup: float, log: RunLog) -> dict:
    """Where a run's time went, in parts that add up to ``wall_seconds``: ``setup_seconds`` (building the data
    and the simulation), ``compile_seconds`` (tracing and compiling, under every executor), ``run_seconds``
    (rounds and evaluations, compilation apart) and ``other_seconds`` (initialisation, checkpoints, result files,
    host transfers, progress output). The process's start (imports, JAX's start-up) comes before and is not
    counted."""
    other = max(0.0, log.loop_seconds - log.compile_seconds - log.run_seconds)
    return {"setup_seconds": setup, "compile_seconds": log.compile_seconds, "run_seconds": log.run_seconds,
            "other_seconds": other,
            "wall_seconds": setup + log.compile_seconds + log.run_seconds + other}


def environment(sim) -> dict:
    """Where and how it ran, beyond the config and the run's facts (model, size, executor): library versions,
    the device, and what ``auto`` resolved the convolutions and the local-step unroll to."""
    import flax
    import jax
    import jaxlib

    import fljax

    device = jax.devices()[0]
    return {"fljax": fljax.__version__, "jax": jax.__version__, "jaxlib": jaxlib.__version__,
            "flax": flax.__version__, "backend": jax.default_backend(), "device": device.device_kind,
            "device_count": jax.device_count(),
            "conv_impl": sim.model.conv_impl if sim.model is not None else None,
            "unroll": sim.unroll}


def evaluated(sim) -> dict:
    """What a run's evaluations score, for ``summary.json``: ``eval_clients`` (the number of clients every
    evaluation scores) and ``num_clients`` (the population), and with an evaluation sample its ids
    (``eval_client_ids``)."""
    facts = {"eval_clients": sim.eval_clients, "num_clients": sim.data.num_clients}
    if sim.eval_ids is not None:
        facts["eval_client_ids"] = [int(i) for i in sim.eval_ids]
    return facts


def sample_note(summary: dict) -> str:
    """'; evaluated on a fixed sample of 50 of 715 clients (eval_clients)' for a run with an evaluation sample
    (its ``summary.json`` or facts), else ''."""
    n, of = summary.get("eval_clients"), summary.get("num_clients")
    if n is None or of is None or n >= of:
        return ""
    return f"; evaluated on a fixed sample of {n} of {of} clients (eval_clients)"


def make_summary(cfg: ExperimentConfig, seed: int, log: RunLog, steps_per_round: int, status: str = "completed",
                 message: str | None = None, facts: dict | None = None, *, setup_seconds: float = 0.0,
                 env: dict | None = None) -> dict:
    """``summary.json`` of one run. ``status``: 'completed', 'stopped' (a guard stopped it) or 'interrupted'
    (a signal did); ``message`` says why; ``facts``: what the run was made of (model, its parameter count,
    executor); times: :func:`seconds`; ``env``: :func:`environment`."""
    rounds = log.history[-1]["round"] if log.history else 0
    summary = {"name": cfg.run_name, "algorithm": cfg.algorithm, "dataset": cfg.data.dataset, "seed": seed,
               "status": status, "rounds": rounds, "evaluations": len(log.history),
               "final": log.history[-1] if log.history else {}, "best": _best(log.history),
               **seconds(setup_seconds, log),
               "client_steps_per_second": steps_per_round * rounds / log.run_seconds if log.run_seconds > 0 else 0.0,
               **(facts or {}), "environment": env or {}}
    if message:
        summary["message"] = message
    return summary


def aggregate_summaries(summaries: list[dict], vectorised: bool) -> dict:
    """The sweep's ``summary.json``: mean and sample std over seeds of every final metric, and the throughput of
    the whole sweep (seeds run together share their seconds when ``vectorised``)."""
    finals = [s["final"] for s in summaries]
    keys = [k for k in finals[0] if k not in ("round",)] if finals and finals[0] else []
    stats = {}
    for k in keys:
        values = np.array([f[k] for f in finals], dtype=float)
        stats[k] = {"mean": float(np.mean(values)),
                    "std": float(sample_std(values)),
                    "values": values.tolist()}
    steps = sum(s["client_steps_per_second"] * s["run_seconds"] for s in summaries)
    # seeds run as lanes of one program share its compile, run and other seconds; their setups run one by one
    shared = max if vectorised else sum
    times = {"setup_seconds": float(sum(s.get("setup_seconds", 0.0) for s in summaries)),
             **{k: float(shared(s.get(k, 0.0) for s in summaries))
                for k in ("compile_seconds", "run_seconds", "other_seconds")}}
    times["wall_seconds"] = sum(times.values())
    status = "completed" if all(s["status"] == "completed" for s in summaries) else "stopped"
    return {"name": summaries[0]["name"], "algorithm": summaries[0]["algorithm"],
            "dataset": summaries[0]["dataset"], "seeds": [s["seed"] for s in summaries], "vectorised": vectorised,
            "status": status, "rounds": max(s["rounds"] for s in summaries), "final": stats, **times,
            "client_steps_per_second": steps / times["run_seconds"] if times["run_seconds"] > 0 else 0.0,
            **{k: summaries[0][k] for k in ("eval_clients", "num_clients", "eval_client_ids") if k in summaries[0]},
            "environment": summaries[0].get("environment", {})}
