"""Literal NumPy references for the FedGiA tests: the losses on unpadded client rows, Algorithm 1 iterated per
iteration k (not per round), and the baselines' local loops. Written from the paper and spec §2–§6 independently of
the library code they check."""
from __future__ import annotations

import jax
import numpy as np

from fljax.algorithms.fedgia import selection


def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def loss_np(kind: str, mu: float):
    """(f_i, ∇f_i) on one client's unpadded (A, b) for 'ls', 'log' or 'ncv'."""

    def f(x, a, b):
        z, d = a @ x, len(b)
        if kind == "ls":
            return 0.5 * np.sum((z - b) ** 2) / d
        data = np.sum(np.logaddexp(0.0, z) - b * z) / d
        reg = 0.5 * mu * (x @ x if kind == "log" else np.sum(x ** 2 / (1 + x ** 2)))
        return data + reg / d

    def g(x, a, b):
        z, d = a @ x, len(b)
        if kind == "ls":
            return a.T @ (z - b) / d
        reg = mu * x if kind == "log" else mu * x / (1 + x ** 2) ** 2
        return (a.T @ (sigmoid(z) - b) + reg) / d

    return f, g


def table3(kind: str, variant: str, a, mu: float, shift_v2: bool = False):
    """H_i of Table III (dense n×n) for one client."""
    d, n = a.shape
    kappa = 1.0 if kind == "ls" else 4.0
    shift = mu / d if (kind == "ncv" or (kind == "log" and shift_v2)) else 0.0
    if variant == "G":
        return a.T @ a / (kappa * d) + shift * np.eye(n)
    return (np.linalg.eigvalsh(a.T @ a)[-1] / (kappa * d) + shift) * np.eye(n)


def lipschitz(kind: str, a, mu: float):
    d = a.shape[0]
    lam = np.linalg.eigvalsh(a.T @ a)[-1]
    return lam / d if kind == "ls" else lam / (4 * d) + mu / d


def fedgia_literal(kind, clients, variant, k0, alpha, selection_key, iters, t, mu=0.0, shift_v2=False, record=None):
    """Algorithm 1 per iteration k = 0..iters−1 with x_i⁰ = π_i⁰ = 0. Aggregation (11), gradients and selection at
    k ∈ {0, k0, 2k0, …} (the selection of aggregation s = k/k0 from the key ``selection_key(s)``). Returns the list
    of aggregates x^{τ} and the client z at every aggregation; ``record(k, x, X, Pi, sigma)`` is called after every
    iteration."""
    f, g = loss_np(kind, mu)
    m, n = len(clients), clients[0][0].shape[1]
    r = max(lipschitz(kind, a, mu) for a, _ in clients)
    sigma = t * r / m
    S = [table3(kind, variant, a, mu, shift_v2) / m + sigma * np.eye(n) for a, _ in clients]
    X, Pi, Z = np.zeros((m, n)), np.zeros((m, n)), np.zeros((m, n))
    aggregates, zs = [], []
    for k in range(iters):
        if k % k0 == 0:
            s = k // k0
            x = Z.mean(axis=0)                                                        # (11)
            gbar = np.array([g(x, a, b) for a, b in clients]) / m
            with jax.enable_x64(True):                                                # as the solver draws them
                sel = np.asarray(selection(selection_key(s), m, alpha))
            aggregates.append(x)
            zs.append(Z.copy())
        for i in range(m):
            if sel[i]:
                X[i] = x - np.linalg.solve(S[i], gbar[i] + Pi[i])                     # (12)
                Pi[i] = Pi[i] + sigma * (X[i] - x)                                    # (13)
                Z[i] = X[i] + Pi[i] / sigma                                           # (14)
            else:
                X[i], Pi[i], Z[i] = x, -gbar[i], x - gbar[i] / sigma                  # (15)–(17)
        if record is not None:
            record(k, x, X.copy(), Pi.copy(), sigma)
    return aggregates, zs


def gamma(a, k):
    return a / np.log2(k + 2.0)


def baseline_literal(method, kind, clients, k0, rounds, a, mu=0.0, prox_mu=1e-4, eta=1.0, iters=5,
                     lr_index="global", local_scale="1", agg="mean", steps=None):
    """FedAvg / FedProx / FedPD (spec §6, options D16–D17) for ``rounds`` rounds; returns the aggregate at the start
    of every round (x for FedAvg and FedProx, x0 for FedPD). ``steps``: the local steps of each round (FedPD's
    random aggregation) instead of k0."""
    _, grad = loss_np(kind, mu)
    m, n = len(clients), clients[0][0].shape[1]
    g = grad if local_scale == "1" else (lambda x, a_, b_: grad(x, a_, b_) / m)
    w = np.ones(m) if agg == "mean" else np.array([len(b) for _, b in clients], float)
    X, lam, X0 = np.zeros((m, n)), np.zeros((m, n)), np.zeros((m, n))
    k, out = 0, []
    for s in range(rounds):
        x = w @ (X0 if method == "fedpd" else X) / w.sum()
        out.append(x)
        if method == "fedpd":
            X0[:] = x
        else:
            X[:] = x
        for _ in range(k0 if steps is None else steps[s]):
            lr = lambda inner: gamma(a, {"global": k, "inner": inner, "round": s}[lr_index])
            for i, (ai, bi) in enumerate(clients):
                if method == "fedavg":
                    X[i] = X[i] - lr(0) * g(X[i], ai, bi)
                elif method == "fedprox":
                    y = X[i].copy()
                    for j in range(iters):
                        y = y - lr(j) * (g(y, ai, bi) + prox_mu * (y - x))
                    X[i] = y
                else:
                    y = X[i].copy()
                    for j in range(iters):
                        y = y - lr(j) * (g(y, ai, bi) + lam[i] + (y - X0[i]) / eta)
                    X[i] = y
                    lam[i] = lam[i] + (X[i] - X0[i]) / eta
                    X0[i] = X[i] + eta * lam[i]
            k += 1
    return out
