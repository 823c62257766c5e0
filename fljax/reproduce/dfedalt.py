"""Reduced-scale reproduction of DFedAlt / DFedSalt (Shi et al. 2023) on noisy digits (DFedAlt spec §9).

    python -m fljax.reproduce.dfedalt                                  # all three studies, 3 seeds, 100 rounds
    python -m fljax.reproduce.dfedalt --only table --seeds 1 --rounds 20   # a quick look

Protocol (spec §9): scikit-learn digits scaled to [0, 1] with fixed N(0, 0.5²) pixel noise per seed, a stratified
test pool of 54 images per class (30%); m = 20 clients of n_i = 20 samples from the client-centric sampler (D15;
Dirichlet redraws, Pathological refills), per-client test sets of 40 following each client's labels (ceil rounding);
MLP 64-128-128-10 with the last layer ``head`` personal; batch 10; lr 0.1 (η_v = 0.001 for the DFedAlt head), momentum
0.9 reset every phase, weight decay 5e-3, clipping at 10; K_u = 5 epochs, K_v = 1 (Dirichlet) or 5 (Pathological)
epochs; DFL on ``random_k`` with k = 4, CFL with 4 of 20 clients per round; T = 100 rounds, evaluated every round;
the headline is the final round's personal accuracy, unweighted over clients, mean ± std (ddof 0) over seeds.

Studies (``--only``; all by default, 986 s measured on the 2-core CPU):
* ``table``: Table 1 (all methods on Pat c=2, Pat c=5, Dir α=0.1, Dir α=0.3) and Table 3 (SAM placements).
* ``topology``: DFedAvgM, DFedAlt, DFedSalt on ring, torus 4×5, exp, random_k (k = 4) and full: accuracy and the
  post-gossip consensus distance vs round.
* ``neighbours``: DFedAvgM and DFedAlt on random_k with k = 2..20 over m = 50 clients (k = 20 needs m > 20).
* ``rho``: DFedSalt with ρ ∈ {0.01, 0.05, 0.2, 0.7} on Pat c=5 and Dir α=0.3 (does any SAM radius help?).
* ``long``: the CFL methods, DFedAvgM and DFedAlt on Dir α=0.3 with 3× the rounds (is CFL just slower?).
* ``ceiling``: the same MLP trained centrally on the whole train pool, scored per client with its label set known.
* ``more_seeds``: claim 1's methods on Pat c=2 with 10 seeds, compared seed by seed.
Then the gated claims 1–4 of spec §9 are checked on these results (claim 5, the exact identities, is
``tests/test_dfedalt.py``). Outputs in ``--out`` (default ``benchmarks/results/dfedalt``): ``results.json.gz``
(every run's history, gzip-compressed), ``README.md`` (tables and claims, with the commands), ``curves.png``, ``topology.png``,
``neighbours.png``. ``--render`` rebuilds the tables and plots from an existing ``results.json.gz``; ``--resume`` adds
studies to it.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

from fljax.runner.files import read_json, write_json, write_png, write_text

__all__ = ["main", "SPLITS", "methods", "make_data", "run_one"]

SPLITS = {  # name: (partition, parameter, value)
    "pat2": ("client_pathological", "classes_per_client", 2),
    "pat5": ("client_pathological", "classes_per_client", 5),
    "dir0.1": ("client_dirichlet", "alpha", 0.1),
    "dir0.3": ("client_dirichlet", "alpha", 0.3),
}
SPLIT_TITLES = {"pat2": "Pat c=2", "pat5": "Pat c=5", "dir0.1": "Dir α=0.1", "dir0.3": "Dir α=0.3"}
MAIN_SPLITS = ("pat2", "dir0.3")
TEST_PER_CLASS = 54  # of ~180 digits per class: the stratified 30% test pool
TEST_PER_CLIENT = 40
TEST_ROWS = TEST_PER_CLIENT + 10  # ceil rounding adds at most one image per class; one shape for every seed
SAMPLES_PER_CLIENT = 20
HIDDEN = (128, 128)
TOPOLOGIES = ("ring", "torus", "exp", "random_k", "full")
NEIGHBOURS = (2, 4, 6, 10, 15, 20)
NEIGHBOUR_CLIENTS = 50
TRAIN = dict(lr=0.1, momentum=0.9, weight_decay=5e-3, clip_norm=10.0, batch_size=10, local_epochs=5)
CFL = dict(TRAIN, cohort_size=4)
DFL = dict(TRAIN, topology="random_k", k=4)
TABLE_METHODS = ("Local", "FedAvg", "FedPer", "FedRep", "FedBABU", "Fed-RoD", "Ditto", "DFedAvgM", "DisPFL",
                 "DFedSAM", "DFedAlt", "DFedSalt")
SAM_METHODS = ("DFedAlt", "DFedSalt", "DFedSalt-V", "DFedSalt-UV")
TOPOLOGY_METHODS = ("DFedAvgM", "DFedAlt", "DFedSalt")
NEIGHBOUR_METHODS = ("DFedAvgM", "DFedAlt")
RHOS = (0.01, 0.05, 0.2, 0.7)
RHO_SPLITS = ("pat5", "dir0.3")
LONG_FACTOR = 3  # the `long` study runs LONG_FACTOR × rounds
LONG_METHODS = ("FedAvg", "FedPer", "FedRep", "FedBABU", "Fed-RoD", "Ditto", "DFedAvgM", "DFedAlt")
ORACLE_EPOCHS, ORACLE_BATCH = 60, 32
MORE_SEEDS = 10  # the `more_seeds` study: claim 1's methods on Pat c=2 with this many seeds, compared seed by seed
SEED_METHODS = ("DFedAlt", "DFedAvgM", "FedAvg", "Local")
STUDIES = ("table", "topology", "neighbours", "rho", "long", "ceiling", "more_seeds")
DEFAULT_OUT = os.path.join("benchmarks", "results", "dfedalt")


def methods(split: str, rounds: int) -> dict[str, tuple[str, dict]]:
    """Label → (registered algorithm, hyperparameters) for one split (spec §4, §7, §9)."""
    alt = dict(DFL, personal_epochs=5 if split.startswith("pat") else 1, personal_lr=0.001)
    return {
        "Local": ("local", dict(TRAIN, cohort_size=None)),
        "FedAvg": ("fedavg", dict(CFL, eval_model="stored")),
        "FedPer": ("fedper", CFL),
        "FedRep": ("fedrep", dict(CFL, head_epochs=10, body_epochs=5)),
        "FedBABU": ("fedbabu", dict(CFL, finetune_epochs=5)),
        "Fed-RoD": ("fedrod", CFL),
        "Ditto": ("ditto", dict(CFL, lam=0.75, personal_epochs=5, prox_mode="decoupled")),
        "DFedAvgM": ("dfedavgm", DFL),
        "DisPFL": ("dispfl", dict(DFL, density=0.5, anneal_rounds=rounds)),
        "DFedSAM": ("dfedsam", dict(DFL, rho=0.01)),
        "DFedAlt": ("dfedalt", alt),
        "DFedSalt": ("dfedsalt", dict(alt, rho=0.7)),
        "DFedSalt-V": ("dfedalt", dict(alt, sam_on="v", rho=0.7)),
        "DFedSalt-UV": ("dfedalt", dict(alt, sam_on="uv", rho=0.7)),
    }


def make_data(split: str, seed: int, num_clients: int = 20):
    """The federated noisy-digits split of spec §9 for one seed (test rows padded to one shape)."""
    from fljax.data.build import federate
    from fljax.data.sources import digits

    partition, param, value = SPLITS[split]
    source = digits(seed, test_per_class=TEST_PER_CLASS, noise=0.5)
    data = federate(source, num_clients, partition, seed, samples_per_client=SAMPLES_PER_CLIENT,
                    on_exhausted="redraw" if partition == "client_dirichlet" else "refill",
                    test_per_client=TEST_PER_CLIENT, test_rounding="ceil", **{param: value})
    return data.replace(test=data.test.padded(TEST_ROWS))


def run_one(algorithm: str, hyper: dict, data, seed: int, rounds: int, eval_every: int) -> dict:
    """One run; returns its evaluation history (personal accuracy, consensus distances, loss per evaluation)."""
    from fljax.algorithms import make_algorithm
    from fljax.engine import Simulation
    from fljax.models import make_model

    model = make_model("mlp", data.input_shape, data.num_classes, hidden=HIDDEN)
    sim = Simulation(make_algorithm(algorithm, **hyper), data, model, executor="vmap", seed=seed)
    result = sim.run(rounds, eval_every, progress=False)
    keys = ("round", "personal_acc", "global_acc", "consensus", "consensus_local", "train_loss")
    history = {k: [rec[k] for rec in result.history] for k in keys if k in result.history[0]}
    return {"history": history, "run_seconds": result.run_seconds, "compile_seconds": result.compile_seconds}


def oracle_accuracy(data, seed: int) -> float:
    """Centralized reference: the MLP trained on the whole pooled train set (ORACLE_EPOCHS epochs, batch
    ORACLE_BATCH, the protocol's optimizer), then each client's test set scored with the logits of the classes absent
    from its train split masked; unweighted mean over clients."""
    import jax
    import jax.numpy as jnp

    from fljax import tree
    from fljax.algorithms import make_algorithm
    from fljax.data import FederatedData, pad_clients
    from fljax.data.sources import digits
    from fljax.engine import Simulation
    from fljax.models import make_model

    source = digits(seed, test_per_class=TEST_PER_CLASS, noise=0.5)
    pooled = pad_clients([source.x_train], [source.y_train])
    central = FederatedData(train=pooled, test=pooled, num_classes=10, input_shape=source.x_train.shape[1:])
    model = make_model("mlp", central.input_shape, 10, hidden=HIDDEN)
    algo = make_algorithm("local", **dict(TRAIN, cohort_size=None, batch_size=ORACLE_BATCH, local_epochs=1))
    sim = Simulation(algo, central, model, executor="vmap", seed=seed)
    state, _ = sim.run_rounds(sim.init(), ORACLE_EPOCHS)
    params = tree.take_clients(state.clients["params"], 0)
    present = jnp.asarray(data.train_label_counts() > 0)
    logits = jax.vmap(model.apply, in_axes=(None, 0))(params, data.test.x)
    pred = jnp.argmax(jnp.where(present[:, None, :], logits, -jnp.inf), axis=-1)
    correct = jnp.sum((pred == data.test.y) & data.test.mask, axis=1)
    count = jnp.sum(data.test.mask, axis=1)
    return float(jnp.mean(correct / jnp.maximum(count, 1)))


# ---------------------------------------------------------------------------------------------------- studies


class Runner:
    """Runs (study, label, split, seed) cells once, keeping every history in ``results``."""

    def __init__(self, seeds: int, rounds: int, eval_every: int, log=print):
        self.seeds, self.rounds, self.eval_every, self.log = seeds, rounds, eval_every, log
        self.results: dict = {"runs": {}, "seconds": {}}
        self._data: dict = {}

    def data(self, split: str, seed: int, num_clients: int):
        key = (split, seed, num_clients)
        if key not in self._data:
            self._data[key] = make_data(split, seed, num_clients)
        return self._data[key]

    def cell(self, study: str, label: str, split: str, algorithm: str, hyper: dict, num_clients: int = 20,
             rounds: int | None = None, seeds: int | None = None):
        for seed in range(seeds or self.seeds):
            key = f"{study}|{label}|{split}|{seed}"
            if key in self.results["runs"]:
                continue
            out = run_one(algorithm, hyper, self.data(split, seed, num_clients), seed, rounds or self.rounds,
                          self.eval_every)
            self.results["runs"][key] = out
            acc = out["history"]["personal_acc"][-1]
            self.log(f"  {study:10s} {label:18s} {split:6s} seed {seed}: personal acc {acc:.4f} "
                     f"({out['run_seconds']:.1f}s run, {out['compile_seconds']:.1f}s compile)")

    def table(self):
        for split in SPLITS:
            ms = methods(split, self.rounds)
            for label in TABLE_METHODS + SAM_METHODS[2:]:
                self.cell("table", label, split, *ms[label])

    def topology(self):
        for split in MAIN_SPLITS:
            ms = methods(split, self.rounds)
            for label in TOPOLOGY_METHODS:
                algorithm, hyper = ms[label]
                for topo in TOPOLOGIES:
                    self.cell("topology", f"{label}@{topo}", split, algorithm, dict(hyper, topology=topo))

    def neighbours(self):
        for split in MAIN_SPLITS:
            ms = methods(split, self.rounds)
            for label in NEIGHBOUR_METHODS:
                algorithm, hyper = ms[label]
                for k in NEIGHBOURS:
                    self.cell("neighbours", f"{label}@k={k}", split, algorithm, dict(hyper, k=k),
                              num_clients=NEIGHBOUR_CLIENTS)

    def rho(self):
        """DFedSalt's SAM radius: the paper's ρ = 0.7 against smaller ones."""
        for split in RHO_SPLITS:
            algorithm, hyper = methods(split, self.rounds)["DFedSalt"]
            for rho in RHOS:
                self.cell("rho", f"DFedSalt@rho={rho:g}", split, algorithm, dict(hyper, rho=rho))

    def long(self):
        """CFL and DFL methods on Dir α=0.3 with LONG_FACTOR × the rounds (a CFL client trains in ~20% of them)."""
        rounds = LONG_FACTOR * self.rounds
        ms = methods("dir0.3", rounds)
        for label in LONG_METHODS:
            self.cell("long", label, "dir0.3", *ms[label], rounds=rounds)

    def more_seeds(self):
        """Claim 1's comparison on Pat c=2 with MORE_SEEDS seeds (the first ones are the table's)."""
        ms = methods("pat2", self.rounds)
        for label in SEED_METHODS:
            self.cell("more_seeds", label, "pat2", *ms[label], seeds=MORE_SEEDS)

    def ceiling(self):
        """A reference point per split: the same MLP trained centrally on the whole train pool, scored on each
        client's test set with the classes absent from the client's train data masked."""
        for split in SPLITS:
            for seed in range(self.seeds):
                key = f"ceiling|oracle|{split}|{seed}"
                if key not in self.results["runs"]:
                    acc = oracle_accuracy(self.data(split, seed, 20), seed)
                    self.results["runs"][key] = {"history": {"round": [ORACLE_EPOCHS], "personal_acc": [acc]}}
                    self.log(f"  ceiling    oracle             {split:6s} seed {seed}: personal acc {acc:.4f}")


# ---------------------------------------------------------------------------------------------------- summaries


def _runs(results: dict, study: str, label: str, split: str) -> list[dict]:
    prefix = f"{study}|{label}|{split}|"
    return [v for k, v in sorted(results["runs"].items()) if k.startswith(prefix)]


def final(results: dict, study: str, label: str, split: str, metric: str = "personal_acc") -> np.ndarray:
    """The final evaluation's ``metric`` of every seed."""
    return np.array([r["history"][metric][-1] for r in _runs(results, study, label, split)])


def at_round(results: dict, study: str, label: str, split: str, round_: int, metric: str) -> np.ndarray:
    out = []
    for r in _runs(results, study, label, split):
        rounds = r["history"]["round"]
        out.append(r["history"][metric][rounds.index(round_)] if round_ in rounds else np.nan)
    return np.array(out)


def curve(results: dict, study: str, label: str, split: str, metric: str) -> tuple[np.ndarray, np.ndarray]:
    runs = _runs(results, study, label, split)
    return np.array(runs[0]["history"]["round"]), np.mean([r["history"][metric] for r in runs], axis=0)


def fmt(values: np.ndarray, scale: float = 100.0, digits: int = 2) -> str:
    """'mean ± std' (ddof 0, D26), or '-' when there are no runs."""
    if values.size == 0:
        return "-"
    return f"{scale * values.mean():.{digits}f} ± {scale * values.std():.{digits}f}"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def table1(results: dict) -> str:
    rows = [[label] + [fmt(final(results, "table", label, s)) for s in SPLITS] for label in TABLE_METHODS]
    return markdown_table(["method"] + [SPLIT_TITLES[s] for s in SPLITS], rows)


def table3(results: dict) -> str:
    sam = {"DFedAlt": ("", ""), "DFedSalt": ("✓", ""), "DFedSalt-V": ("", "✓"), "DFedSalt-UV": ("✓", "✓")}
    rows = [[label if label != "DFedSalt" else "DFedSalt-U", *sam[label]] +
            [fmt(final(results, "table", label, s)) for s in SPLITS] for label in SAM_METHODS]
    return markdown_table(["method", "SAM on body u", "SAM on head v"] + [SPLIT_TITLES[s] for s in SPLITS], rows)


def topology_gaps() -> dict[str, str]:
    """1 − λ of each static topology's W at m = 20 (random_k: W is not symmetric; the contraction ‖W − 11ᵀ/m‖₂
    of one draw is given instead)."""
    import jax

    from fljax.ops import gossip

    out = {}
    for name in TOPOLOGIES:
        topo = gossip.make_topology(name, 20, **({"k": 4} if name == "random_k" else {}))
        if topo.static:
            out[name] = f"1−λ = {float(gossip.spectral_gap(topo.sample())):.3f}"
        else:
            out[name] = f"‖W−J‖ = {float(gossip.contraction(topo.sample(jax.random.PRNGKey(0)))):.3f}"
    return out


def topology_table(results: dict) -> str:
    gaps = topology_gaps()
    header = ["method", "split"] + [f"{t} ({gaps[t]})" for t in TOPOLOGIES]
    rows = []
    for split in MAIN_SPLITS:
        for label in TOPOLOGY_METHODS:
            rows.append([label, SPLIT_TITLES[split]] +
                        [fmt(final(results, "topology", f"{label}@{t}", split)) for t in TOPOLOGIES])
    return markdown_table(header, rows)


def consensus_table(results: dict, round_: int = 20) -> str:
    rows = []
    for split in MAIN_SPLITS:
        for label in TOPOLOGY_METHODS:
            rows.append([label, SPLIT_TITLES[split]] + [
                f"{np.nanmean(at_round(results, 'topology', f'{label}@{t}', split, round_, 'consensus')):.3g}"
                for t in TOPOLOGIES])
    return markdown_table(["method", "split"] + list(TOPOLOGIES), rows)


def neighbours_table(results: dict) -> str:
    header = ["k"] + [f"{label} {SPLIT_TITLES[s]}" for s in MAIN_SPLITS for label in NEIGHBOUR_METHODS] + \
             [f"CD DFedAlt {SPLIT_TITLES[s]}" for s in MAIN_SPLITS]
    rows = []
    for k in NEIGHBOURS:
        row = [str(k)] + [fmt(final(results, "neighbours", f"{label}@k={k}", s))
                          for s in MAIN_SPLITS for label in NEIGHBOUR_METHODS]
        row += [f"{final(results, 'neighbours', f'DFedAlt@k={k}', s, 'consensus').mean():.3g}" for s in MAIN_SPLITS]
        rows.append(row)
    return markdown_table(header, rows)


def topology_speed_table(results: dict, round_: int = 20) -> str:
    rows = []
    for split in MAIN_SPLITS:
        for label in TOPOLOGY_METHODS:
            rows.append([label, SPLIT_TITLES[split]] + [
                fmt(at_round(results, "topology", f"{label}@{t}", split, round_, "personal_acc")) for t in TOPOLOGIES])
    return markdown_table(["method", "split"] + list(TOPOLOGIES), rows)


def rho_table(results: dict) -> str:
    rows = [["DFedAlt (no SAM)"] + [fmt(final(results, "table", "DFedAlt", s)) for s in RHO_SPLITS]]
    rows += [[f"DFedSalt ρ = {rho:g}"] + [fmt(final(results, "rho", f"DFedSalt@rho={rho:g}", s)) for s in RHO_SPLITS]
             for rho in RHOS]
    return markdown_table(["method"] + [SPLIT_TITLES[s] for s in RHO_SPLITS], rows)


def long_table(results: dict) -> str:
    rounds = results.get("meta", {}).get("rounds", 0)
    rows = [[label, fmt(final(results, "table", label, "dir0.3")), fmt(final(results, "long", label, "dir0.3"))]
            for label in LONG_METHODS]
    return markdown_table(["method", f"T = {rounds}", f"T = {LONG_FACTOR * rounds}"], rows)


def seeds_table(results: dict) -> str:
    """Pat c=2 over MORE_SEEDS seeds: each method, and DFedAlt minus it seed by seed (same data and init per seed)."""
    alt = final(results, "more_seeds", "DFedAlt", "pat2")
    rows = []
    for label in SEED_METHODS:
        acc = final(results, "more_seeds", label, "pat2")
        diff = alt - acc
        rows.append([label, fmt(acc), "-" if label == "DFedAlt" else fmt(diff),
                     "-" if label == "DFedAlt" else f"{int(np.sum(diff > 0))}/{diff.size}"])
    return markdown_table(["method", "personal acc", "DFedAlt − method (paired)", "seeds DFedAlt ahead"], rows)


def ceiling_table(results: dict) -> str:
    best = {s: max(TABLE_METHODS, key=lambda m: final(results, "table", m, s).mean()) for s in SPLITS}
    rows = [["centralized oracle (label set known)"] + [fmt(final(results, "ceiling", "oracle", s)) for s in SPLITS],
            ["best method of Table 1"] + [f"{best[s]}: {fmt(final(results, 'table', best[s], s))}" for s in SPLITS],
            ["Local"] + [fmt(final(results, "table", "Local", s)) for s in SPLITS]]
    return markdown_table(["reference"] + [SPLIT_TITLES[s] for s in SPLITS], rows)


# ---------------------------------------------------------------------------------------------------- claims


def pure_gossip_bound(t_max: int = 20, m: int = 20, dim: int = 50) -> tuple[bool, str]:
    """Spec §9 claim 4, second part: pure gossip with a static symmetric W satisfies CD_t ≤ λ^{2t}·CD_0."""
    import jax

    from fljax.ops import gossip

    x0 = jax.random.normal(jax.random.PRNGKey(0), (m, dim))
    worst = []
    for name in ("ring", "torus", "exp", "full"):
        topo = gossip.make_topology(name, m)
        lam = 1 - float(gossip.spectral_gap(topo.sample()))
        x, cd0, ratio = x0, float(gossip.consensus_distance(x0)), 0.0
        for t in range(1, t_max + 1):
            x = gossip.gossip(topo.sample(), x)
            bound = lam ** (2 * t) * cd0
            ratio = max(ratio, float(gossip.consensus_distance(x)) / max(bound, 1e-30) if bound > 1e-20 else 0.0)
        worst.append(f"{name} {ratio:.3f}")
    ok = all(float(w.split()[1]) <= 1 + 1e-4 for w in worst)
    return ok, "max CD_t / (λ^{2t}·CD_0) over t ≤ 20: " + ", ".join(worst)


def claims(results: dict, margin: float = 2.0, local_margin: float = 1.0) -> list[tuple[str, str, str]]:
    """(claim, measured, verdict) for spec §9 gated claims 1–4 (points of accuracy; means over seeds)."""
    out = []
    mean = lambda label, split: 100 * final(results, "table", label, split).mean()
    if _runs(results, "table", "DFedAlt", "pat2"):
        alt, avg, avgm = mean("DFedAlt", "pat2"), mean("FedAvg", "pat2"), mean("DFedAvgM", "pat2")
        ok = alt - avg >= margin and alt - avgm >= margin
        out.append((f"1. Pat c=2: DFedAlt ≥ FedAvg + {margin:g} and ≥ DFedAvgM + {margin:g}",
                    f"DFedAlt {alt:.2f}, FedAvg {avg:.2f} (+{alt - avg:.2f}), DFedAvgM {avgm:.2f} "
                    f"(+{alt - avgm:.2f})", "holds" if ok else "fails"))
        gaps = {s: mean("DFedAlt", s) - mean("Local", s) for s in SPLITS}
        out.append((f"2. DFedAlt ≥ Local − {local_margin:g} on every split",
                    ", ".join(f"{SPLIT_TITLES[s]} {g:+.2f}" for s, g in gaps.items()),
                    "holds" if min(gaps.values()) >= -local_margin else "fails"))
        p2, p5, d1, d3 = (mean("DFedAlt", s) for s in ("pat2", "pat5", "dir0.1", "dir0.3"))
        out.append(("3. DFedAlt: Pat c=2 > Pat c=5 and Dir 0.1 > Dir 0.3",
                    f"Pat {p2:.2f} vs {p5:.2f}; Dir {d1:.2f} vs {d3:.2f}",
                    "holds" if p2 > p5 and d1 > d3 else "fails"))
    if _runs(results, "topology", "DFedAlt@ring", "pat2"):
        for split in MAIN_SPLITS:
            cd = {t: np.nanmean(at_round(results, "topology", f"DFedAlt@{t}", split, 20, "consensus"))
                  for t in ("full", "exp", "torus", "ring")}
            ok = cd["full"] < 1e-6 < cd["exp"] < cd["torus"] < cd["ring"]
            out.append((f"4a. DFedAlt {SPLIT_TITLES[split]}: post-gossip CD at t = 20, full ≈ 0 < exp < torus < ring",
                        ", ".join(f"{t} {v:.3g}" for t, v in cd.items()), "holds" if ok else "fails"))
    ok, text = pure_gossip_bound()
    out.append(("4b. pure gossip on a symmetric W: CD_t ≤ λ^{2t}·CD_0", text, "holds" if ok else "fails"))
    return out


def reported(results: dict) -> list[tuple[str, str]]:
    """The spec's reported-not-gated comparisons."""
    out = []
    mean = lambda label, split: 100 * final(results, "table", label, split).mean()
    if _runs(results, "table", "DFedAlt", "pat2"):
        out.append(("DFedSalt − DFedAlt", ", ".join(f"{SPLIT_TITLES[s]} {mean('DFedSalt', s) - mean('DFedAlt', s):+.2f}"
                                                     for s in SPLITS)))
        for other in ("FedRep", "FedPer", "Fed-RoD", "DFedAvgM"):
            out.append((f"DFedAlt − {other}", ", ".join(f"{SPLIT_TITLES[s]} {mean('DFedAlt', s) - mean(other, s):+.2f}"
                                                         for s in SPLITS)))
    if _runs(results, "topology", "DFedAlt@ring", "pat2"):
        for split in MAIN_SPLITS:
            for label in TOPOLOGY_METHODS:
                accs = [100 * final(results, "topology", f"{label}@{t}", split).mean() for t in TOPOLOGIES]
                out.append((f"{label} {SPLIT_TITLES[split]}: accuracy ring → full",
                            ", ".join(f"{t} {a:.2f}" for t, a in zip(TOPOLOGIES, accs))))
    return out


# ---------------------------------------------------------------------------------------------------- outputs


def _compact(value):
    """Floats to 9 significant digits, which round-trip the float32 metrics exactly (a smaller results file)."""
    if isinstance(value, float):
        return float(f"{value:.9g}")
    if isinstance(value, dict):
        return {k: _compact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_compact(v) for v in value]
    return value


def plots(results: dict, out: str) -> list[str]:
    """curves.png (Table-1 methods vs round), topology.png, neighbours.png; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []

    def save(fig, name):
        path = os.path.join(out, name)
        write_png(path, fig)
        plt.close(fig)
        written.append(path)

    if _runs(results, "table", "DFedAlt", "pat2"):
        fig, axes = plt.subplots(1, len(MAIN_SPLITS), figsize=(12, 4), sharey=True)
        colors = plt.get_cmap("tab20").colors
        cfl = ("FedAvg", "FedPer", "FedRep", "FedBABU", "Fed-RoD", "Ditto")
        for ax, split in zip(axes, MAIN_SPLITS):
            for c, label in enumerate(TABLE_METHODS):  # CFL dashed, DFL solid, the paper's methods thick
                r, acc = curve(results, "table", label, split, "personal_acc")
                ax.plot(r, 100 * acc, label=label, color=colors[c], ls="--" if label in cfl else "-",
                        lw=2.4 if label in ("DFedAlt", "DFedSalt") else 1.1)
            ax.set_title(f"{SPLIT_TITLES[split]}: personal accuracy (mean of seeds)")
            ax.set_xlabel("round")
        axes[0].set_ylabel("%")
        axes[-1].legend(fontsize=7, ncol=2, loc="lower right")
        save(fig, "curves.png")
    if _runs(results, "topology", "DFedAlt@ring", "pat2"):
        fig, axes = plt.subplots(len(MAIN_SPLITS), 3, figsize=(15, 8))
        for row, split in zip(axes, MAIN_SPLITS):
            for t in TOPOLOGIES:
                r, acc = curve(results, "topology", f"DFedAlt@{t}", split, "personal_acc")
                row[0].plot(r, 100 * acc, label=t)
                for ax, label in ((row[1], "DFedAlt"), (row[2], "DFedAvgM")):
                    r, cd = curve(results, "topology", f"{label}@{t}", split, "consensus")
                    if t != "full":  # full: CD ≈ 1e-13 (exact averaging), off the log axis
                        ax.semilogy(r, cd, label=t)
            row[0].set_title(f"DFedAlt, {SPLIT_TITLES[split]}: personal acc. (%)")
            row[1].set_title(f"DFedAlt, {SPLIT_TITLES[split]}: CD(u) after gossip")
            row[2].set_title(f"DFedAvgM, {SPLIT_TITLES[split]}: CD after gossip")
            row[0].legend(fontsize=8)
            row[1].legend(fontsize=8, title="full: CD ≈ 1e-13", title_fontsize=8)
        for ax in axes[-1]:
            ax.set_xlabel("round")
        save(fig, "topology.png")
    if _runs(results, "neighbours", "DFedAlt@k=2", "pat2"):
        fig, axes = plt.subplots(1, 2, figsize=(12, 4))
        for split in MAIN_SPLITS:
            for label in NEIGHBOUR_METHODS:
                accs = [final(results, "neighbours", f"{label}@k={k}", split) for k in NEIGHBOURS]
                axes[0].errorbar(NEIGHBOURS, [100 * a.mean() for a in accs], [100 * a.std() for a in accs],
                                 marker="o", capsize=3, label=f"{label} {SPLIT_TITLES[split]}")
                cds = [final(results, "neighbours", f"{label}@k={k}", split, "consensus").mean() for k in NEIGHBOURS]
                axes[1].semilogy(NEIGHBOURS, cds, marker="o", label=f"{label} {SPLIT_TITLES[split]}")
        axes[0].set_title(f"final personal accuracy (%) vs neighbours k (m = {NEIGHBOUR_CLIENTS})")
        axes[1].set_title("final post-gossip consensus distance vs k")
        for ax in axes:
            ax.set_xlabel("k (random_k in-neighbours)")
            ax.legend(fontsize=8)
        save(fig, "neighbours.png")
    return written


def report(results: dict, command: str) -> str:
    """The Markdown report: tables and claims (only the studies present in ``results``)."""
    meta = results.get("meta", {})
    parts = [f"# DFedAlt reduced-scale reproduction (noisy digits)\n\nCommand(s): `{command}`  \n"
             f"Seeds: {meta.get('seeds')}, rounds: {meta.get('rounds')}, evaluated every {meta.get('eval_every')} "
             f"round(s). Wall time per study (s): "
             f"{', '.join(f'{k} {v:.0f}' for k, v in results.get('seconds', {}).items())}.  \n"
             "Values: final-round personal accuracy (%), unweighted mean over clients, mean ± std over seeds "
             "(ddof 0)."]
    if _runs(results, "table", "DFedAlt", "pat2"):
        parts += ["## Table 1 (reduced): personal accuracy\n\n" + table1(results),
                  "## Table 3 (reduced): SAM placement\n\n" + table3(results)]
    if _runs(results, "topology", "DFedAlt@ring", "pat2"):
        parts += ["## Topology study: personal accuracy (m = 20)\n\n" + topology_table(results),
                  "## Topology study: personal accuracy at round 20 (convergence speed)\n\n" +
                  topology_speed_table(results),
                  "## Topology study: post-gossip consensus distance of u at round 20 (mean of seeds)\n\n" +
                  consensus_table(results)]
    if _runs(results, "neighbours", "DFedAlt@k=2", "pat2"):
        parts += [f"## Neighbours study: random_k with k in-neighbours, m = {NEIGHBOUR_CLIENTS}\n\n" +
                  neighbours_table(results)]
    if _runs(results, "rho", f"DFedSalt@rho={RHOS[0]:g}", RHO_SPLITS[0]) and _runs(results, "table", "DFedAlt", "pat5"):
        parts += ["## DFedSalt's SAM radius ρ\n\n" + rho_table(results)]
    if _runs(results, "long", "DFedAlt", "dir0.3") and _runs(results, "table", "DFedAlt", "dir0.3"):
        parts += [f"## Longer runs (Dir α=0.3): final personal accuracy at T and {LONG_FACTOR}·T\n\n" +
                  long_table(results)]
    if _runs(results, "more_seeds", "DFedAlt", "pat2"):
        parts += [f"## Claim 1 with {MORE_SEEDS} seeds (Pat c=2)\n\n" + seeds_table(results)]
    if _runs(results, "ceiling", "oracle", "pat2") and _runs(results, "table", "DFedAlt", "pat2"):
        parts += ["## How close to the ceiling\n\n" + ceiling_table(results)]
    rows = [list(c) for c in claims(results)]
    parts += ["## Gated claims (spec §9)\n\n" + markdown_table(["claim", "measured", "verdict"], rows) +
              "\n\nClaim 5 (exact identities) is tested in `tests/test_dfedalt.py`."]
    rep = reported(results)
    if rep:
        parts += ["## Reported, not gated (points)\n\n" + markdown_table(["comparison", "measured"],
                                                                         [list(r) for r in rep])]
    return "\n\n".join(parts) + "\n"


def parse_args(argv):
    p = argparse.ArgumentParser(prog="fljax reproduce dfedalt", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default=",".join(STUDIES),
                   help=f"comma-separated studies: {', '.join(STUDIES)} (default: all)")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--eval-every", type=int, default=1)
    p.add_argument("--out", default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    p.add_argument("--render", action="store_true", help="only rebuild README.md and plots from OUT/results.json.gz")
    p.add_argument("--resume", action="store_true",
                   help="keep the runs already in OUT/results.json.gz (same seeds, rounds, eval-every) and add the rest")
    p.add_argument("--compile-cache", default=os.path.join(tempfile.gettempdir(), "fljax-jax-cache"),
                   help="JAX persistent compilation cache folder (seeds and splits share programs); '' disables")
    args = p.parse_args(argv)
    studies = [s for s in args.only.split(",") if s]
    bad = [s for s in studies if s not in STUDIES]
    if bad:
        p.error(f"unknown study {bad[0]!r}; choose from {', '.join(STUDIES)}.")
    if args.seeds < 1 or args.rounds < 20 and "topology" in studies:
        p.error("--seeds must be >= 1, and the topology study needs --rounds >= 20 (claim 4 reads round 20).")
    args.studies = studies
    return args


def _commands(results: dict) -> list[str]:
    meta = results.get("meta", {})
    return meta.get("commands") or ([meta["command"].strip()] if "command" in meta else [])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    command = " ".join(["python -m fljax.reproduce.dfedalt"] + list(sys.argv[1:] if argv is None else argv))
    path = os.path.join(args.out, "results.json.gz")
    if args.render:
        if not os.path.exists(path):
            print(f"fljax: error: {path} does not exist; run the studies first (without --render).", file=sys.stderr)
            return 2
        results = read_json(path)
        command = " && ".join(_commands(results) or [command])
    else:
        if args.compile_cache:
            import jax

            jax.config.update("jax_compilation_cache_dir", args.compile_cache)
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
        runner = Runner(args.seeds, args.rounds, args.eval_every)
        meta = {"seeds": args.seeds, "rounds": args.rounds, "eval_every": args.eval_every}
        commands = [command]
        if args.resume and os.path.exists(path):
            runner.results = read_json(path)
            old = {k: runner.results.get("meta", {}).get(k) for k in meta}
            if old != meta:
                print(f"fljax: error: {path} was made with {old}, not {meta}; drop --resume or match them.",
                      file=sys.stderr)
                return 2
            commands = _commands(runner.results) + commands
        runner.results["meta"] = {**meta, "commands": commands}
        for study in args.studies:
            t0 = time.perf_counter()
            print(f"{study} study ...", flush=True)
            getattr(runner, study)()
            runner.results["seconds"][study] = runner.results["seconds"].get(study, 0) + time.perf_counter() - t0
            write_json(path, _compact(runner.results), indent=None)  # an interruption loses at most one study
        results = runner.results
        command = " && ".join(commands)
    text = report(results, command)
    write_text(os.path.join(args.out, "README.md"), text)
    files = plots(results, args.out)
    print(text)
    print("wrote", ", ".join([path, os.path.join(args.out, "README.md")] + files))
    return 0


if __name__ == "__main__":
    sys.exit(main())
