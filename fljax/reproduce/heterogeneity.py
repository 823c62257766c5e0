"""The heterogeneity study's claims (heterogeneity spec, "Claims for the study"; ``heterogeneity.yaml``, run by
``fljax reproduce heterogeneity``) and the check that is not a run: FedAvg's and FedNova's fixed points on quadratics
against their closed forms.

* claim 1 (FedProx Section 5): FedAvg that drops stragglers degrades as they grow; FedProx with their partial work (μ = 0)
  does better; μ > 0 better still and more stable (a smaller swing of the global loss over the last half) — measured
  as the paper does, on the global model's pooled test accuracy and loss (over every client's test samples together);
* claim 2 (FedNova): on f_i(x) = ½‖x − e_i‖² with local GD of step η and τ_i ∈ {2, …, 20}, FedAvg's fixed point is
  Σ p_i c_i e_i / Σ p_i c_i (c_i = 1 − (1 − η)^{τ_i}), FedNova's Σ p_i (c_i/τ_i) e_i / Σ p_i (c_i/τ_i), the
  optimum Σ p_i e_i; on Synthetic(1,1) FedAvg's global loss is higher;
* claim 3 (FedBuff, FedScale's virtual clock): under heavy-tailed latency buffered asynchrony reaches a target
  accuracy in less virtual time than synchronous FedAvg with as many clients in flight; at high concurrency the
  staleness weight reaches it sooner than none.
"""
from __future__ import annotations

import numpy as np

__all__ = ["claims", "sections", "quadratic_fixed_points", "QUADRATIC_TAUS"]

STRAGGLERS = ("0%", "50%", "90%")
FEDAVG, PROX0, PROX1 = "FedAvg (drop)", "FedProx μ=0 (partial)", "FedProx μ=1 (partial)"
SYNC = "FedAvg (sync, 50 a round)"
QUADRATIC_TAUS = (2, 20, 5, 11, 3, 17, 8, 14)  # τ_i ∈ {2, …, 20}, one per client
TARGET = 0.85


class _Quadratic:
    """f_i(x) = ½‖x − e_i‖² as a model: client i's one row is e_i (full-batch local GD)."""

    has_mode = False

    def loss(self, params, batch):
        import jax.numpy as jnp

        return 0.5 * jnp.sum(batch.mask[:, None] * (params["x"] - batch.x) ** 2)

    def train_loss(self, params, batch, variables=None, key=None):
        return self.loss(params, batch), variables


def quadratic_fixed_points(taus=QUADRATIC_TAUS, eta: float = 0.01, rounds: int = 400, dim: int = 3, seed: int = 0):
    """(e [m, d], FedAvg's and FedNova's models after ``rounds`` rounds, each a float64 array): the algorithms' own
    client updates (client i with budget τ_i, full-batch GD of step ``eta``) and servers (uniform weights) on
    f_i(x) = ½‖x − e_i‖², from x = 0."""
    import jax
    import jax.numpy as jnp

    from fljax import tree
    from fljax.algorithms import make_algorithm
    from fljax.data import pad_clients
    from fljax.engine.protocol import ClientInput

    m = len(taus)
    e = np.random.default_rng(seed).normal(size=(m, dim)).astype(np.float32)
    train = pad_clients([e[i:i + 1] for i in range(m)], [np.zeros(1, np.int32)] * m)
    model = _Quadratic()
    out = {}
    for name in ("fedavg", "fednova"):
        alg = make_algorithm(name, lr=eta, batch_size=None, local_steps=max(taus), cohort_size=None,
                             weighting="uniform")

        @jax.jit
        def one_round(x, alg=alg, name=name):
            def client(train_i, steps):
                return alg.client_update(ClientInput(state={}, train=train_i, key=jax.random.PRNGKey(0),
                                                     round=jnp.int32(0), down={"x": x}, model=model, steps=steps))

            result = jax.vmap(client)(train, jnp.asarray(taus, jnp.int32))
            if name == "fednova":
                return alg.server_update(None, {"params": {"x": x}}, None, None, result)["params"]["x"]
            return tree.weighted_mean_clients(result.upload, alg.aggregation_weights(result))["x"]

        x = jnp.zeros(dim, jnp.float32)
        for _ in range(rounds):
            x = one_round(x)
        out[name] = np.asarray(x, np.float64)
    return e.astype(np.float64), out["fedavg"], out["fednova"]


def _quadratic(eta: float = 0.01):
    """The quadratic claim's numbers: closed forms, the runs' fixed points and their distances."""
    e, avg, nova = quadratic_fixed_points(eta=eta)
    tau = np.asarray(QUADRATIC_TAUS, float)
    c = 1 - (1 - eta) ** tau
    closed_avg = c @ e / c.sum()
    closed_nova = (c / tau) @ e / np.sum(c / tau)
    optimum = e.mean(0)
    return {"avg": avg, "nova": nova, "closed_avg": closed_avg, "closed_nova": closed_nova, "optimum": optimum,
            "err_avg": float(np.abs(avg - closed_avg).max()), "err_nova": float(np.abs(nova - closed_nova).max()),
            "dist_avg": float(np.linalg.norm(avg - optimum)), "dist_nova": float(np.linalg.norm(nova - optimum))}


def _mean(values) -> float:
    values = np.asarray(values, float)
    return float(np.nanmean(values)) if values.size and not np.isnan(values).all() else float("nan")


def _swing(results, study: str, metric: str, **labels) -> float:
    """How much ``metric`` oscillates: the mean over seeds of its mean absolute change between consecutive
    evaluations over the last half of the run (a curve still falling steadily is not counted unstable, as a
    window's std would count it)."""
    out = []
    for run in results.seeds(study, **labels):
        values = np.array([r[metric] for r in run["history"] if metric in r], float)
        out.append(np.mean(np.abs(np.diff(values[len(values) // 2:]))))
    return _mean(out)


def _time_to(results, label: str, target: float = TARGET) -> float:
    """The mean over seeds of the virtual time at which ``label`` first reaches ``target`` (inf when a seed never
    does)."""
    times = results.first("async", "virtual_time", "global_acc", target, federation=label)
    return float(np.inf) if not times.size or np.isnan(times).any() else float(times.mean())


def claims(results) -> list[tuple[str, str, str]]:
    """(claim, measured, verdict) for the spec's three claims (module docstring)."""
    out = []
    if results.cell("stragglers") is not None:  # the paper's measures: pooled test accuracy and loss
        def final(metric, m, s, scale=1.0):
            return scale * _mean(results.final("stragglers", metric, method=m, stragglers=s))

        acc = {(m, s): final("global_acc_weighted", m, s, 100) for m in (FEDAVG, PROX0, PROX1) for s in STRAGGLERS}
        loss = {(m, s): final("global_loss_weighted", m, s) for m in (FEDAVG, PROX0, PROX1) for s in STRAGGLERS}
        mean = {(m, s): final("global_acc", m, s, 100) for m in (FEDAVG, PROX0, PROX1) for s in STRAGGLERS}
        row = lambda d, m, f=".1f": " / ".join(format(d[m, s], f) for s in STRAGGLERS)  # noqa: E731
        worse = loss[FEDAVG, "90%"] > loss[FEDAVG, "50%"] > loss[FEDAVG, "0%"]
        out.append(("1a. FedProx Section 5: FedAvg dropping stragglers degrades as they grow (0 / 50 / 90 %: the "
                    "global model's pooled test loss rises)",
                    f"FedAvg (drop): loss {row(loss, FEDAVG, '.3f')}; pooled accuracy {row(acc, FEDAVG)} %; "
                    f"mean over clients {row(mean, FEDAVG)} %", "holds" if worse else "fails"))
        better = all(acc[PROX0, s] > acc[FEDAVG, s] and loss[PROX0, s] < loss[FEDAVG, s] for s in ("50%", "90%"))
        out.append(("1b. FedProx μ = 0 keeping the stragglers' partial work beats FedAvg dropping them (50 %, 90 %: "
                    "pooled accuracy and loss)",
                    f"FedProx μ=0 {row(acc, PROX0)} % (loss {row(loss, PROX0, '.3f')}) against FedAvg "
                    f"{row(acc, FEDAVG)} % (loss {row(loss, FEDAVG, '.3f')})", "holds" if better else "fails"))
        swing = {m: _swing(results, "stragglers", "global_loss_weighted", method=m, stragglers="90%")
                 for m in (FEDAVG, PROX0, PROX1)}
        spread = {m: float(np.std(results.final("stragglers", "global_loss_weighted", method=m, stragglers="90%"),
                                  ddof=1)) for m in (FEDAVG, PROX0, PROX1)}
        stable = acc[PROX1, "90%"] > acc[PROX0, "90%"] and swing[PROX1] < swing[PROX0] and \
            spread[PROX1] < spread[PROX0]
        out.append(("1c. μ > 0 better still and more stable (90 % stragglers: pooled accuracy; the pooled test "
                    "loss's mean change between evaluations over the last half, and its std over seeds)",
                    "; ".join(f"{name} {acc[m, '90%']:.1f} % (change {swing[m]:.4f}, seeds' std {spread[m]:.3f})"
                              for name, m in (("μ=1", PROX1), ("μ=0", PROX0), ("FedAvg", FEDAVG))),
                    "holds" if stable else "fails"))
    q = _quadratic()
    exact = q["err_avg"] < 1e-4 and q["err_nova"] < 1e-4
    out.append(("2a. Quadratics, τ_i ∈ {2, …, 20}: FedAvg's fixed point is Σc_i e_i/Σc_i, FedNova's "
                "Σ(c_i/τ_i)e_i/Σ(c_i/τ_i), the latter near the optimum",
                f"|FedAvg − closed form| {q['err_avg']:.1e}, |FedNova − closed form| {q['err_nova']:.1e}; distance "
                f"to the optimum: FedAvg {q['dist_avg']:.4f}, FedNova {q['dist_nova']:.4f}",
                "holds" if exact and q["dist_nova"] < 0.25 * q["dist_avg"] else "fails"))
    if results.cell("fednova") is not None:
        loss = {n: _mean(results.final("fednova", "global_loss_weighted", nova=n)) for n in ("FedAvg", "FedNova")}
        acc = {n: 100 * _mean(results.final("fednova", "global_acc", nova=n)) for n in ("FedAvg", "FedNova")}
        out.append(("2b. Synthetic(1,1), τ_i = 2·⌈n_i/10⌉: FedAvg's global loss is higher than FedNova's",
                    f"FedAvg {loss['FedAvg']:.3f} ({acc['FedAvg']:.1f} %), FedNova {loss['FedNova']:.3f} "
                    f"({acc['FedNova']:.1f} %)", "holds" if loss["FedAvg"] > loss["FedNova"] else "fails"))
    if results.cell("async") is not None:
        sync, buff = _time_to(results, SYNC), _time_to(results, "FedBuff C=50, 1/√(1+τ)")
        out.append((f"3a. Heavy-tailed latency: FedBuff (50 in flight, K = 10) reaches {100 * TARGET:.0f} % in less "
                    f"virtual time than synchronous FedAvg with cohorts of 50 (FedScale: 18,913 s against 27,618 s on "
                    f"FEMNIST)", f"FedBuff {buff:.1f} s, FedAvg {sync:.1f} s (mean over seeds)",
                    "holds" if buff < sync else "fails"))
        weighted, plain = (_time_to(results, f"FedBuff C=150, {w}") for w in ("1/√(1+τ)", "no weight"))
        final = {w: 100 * _mean(results.final("async", "global_acc", federation=f"FedBuff C=150, {w}"))
                 for w in ("1/√(1+τ)", "no weight")}
        out.append((f"3b. At high concurrency (150 of 200 in flight) the staleness weight 1/√(1 + τ) beats none "
                    f"(time to {100 * TARGET:.0f} %)",
                    f"weighted {weighted:.1f} s (final {final['1/√(1+τ)']:.1f} %), none {plain:.1f} s (final "
                    f"{final['no weight']:.1f} %)", "holds" if weighted < plain else "fails"))
    return out


def sections(results) -> list[tuple[str, str]]:
    """The quadratic fixed points against their closed forms (claim 2a), coordinate by coordinate."""
    from fljax.runner.report import markdown_table

    q = _quadratic()
    rows = [[name, ", ".join(f"{v:+.5f}" for v in q[measured]), ", ".join(f"{v:+.5f}" for v in q[closed])]
            for name, measured, closed in (("FedAvg", "avg", "closed_avg"), ("FedNova", "nova", "closed_nova"),
                                           ("optimum Σ p_i e_i", "optimum", "optimum"))]
    text = ("f_i(x) = ½‖x − e_i‖² on 8 clients (e_i ~ N(0, I₃), seed 0), τ_i = "
            f"{', '.join(map(str, QUADRATIC_TAUS))}, local GD of step η = 0.01, uniform p_i, 400 rounds of each "
            "algorithm's own client and server updates from x = 0 (float32).\n\n"
            + markdown_table(rows, ["", "after 400 rounds", "closed form"]))
    return [("Claim 2 on quadratics: the fixed points", text)]
