"""The PyTorch peer of benchmarks/robust.py: an attack × defence cell run the way Blades and FLPoison run one, a
Python loop over the clients (each a ``copy.deepcopy`` of the global model, a fresh ``torch.optim.SGD`` and its local
steps), then the attack on the stacked updates and the defence, once per round.

The workload is fljax's (benchmarks/robust.py writes it to an ``.npz``): the same clients' padded train and test
rows, the same MLP shape, local steps, batch, learning rate and rounds, full participation, each client's update
weighted by its sample count in the mean. The attacks and defences are written out from the robust spec's
definitions (docs/robust.md; Blades' and FLPoison's code is not used), on flattened updates ``[n, d]``; the
``.npz`` also holds one random cohort's updates with fljax.ops' outputs for every attack and defence, and
:func:`check` reports the largest difference from them (the peer computes what fljax computes).

Runs under an interpreter with ``torch`` and ``numpy`` only (no JAX):

    python benchmarks/robust_torch.py WORKLOAD.npz CELLS_JSON [--threads 1]

prints one JSON object: per cell its wall seconds (the rounds only; torch's import and the data's load once, apart),
its final global accuracy, and the check's errors. The cells run on the GPU when torch sees one (as the peers of
benchmarks/torch_peers.py do), else on the CPU with ``--threads`` threads.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


# ------------------------------------------------------------------------------------------------ defences


def mean(d, w, state, f):
    return (w[:, None] * d).sum(0) / w.sum(), state


def median(d, w, state, f):
    s, n = d.sort(0).values, d.shape[0]
    return (s[(n - 1) // 2] + s[n // 2]) / 2, state


def trimmed_mean(d, w, state, f, beta=0.1):
    n = d.shape[0]
    k = math.floor(beta * n + 1e-9)
    return d.sort(0).values[k:n - k].mean(0), state


def _krum_scores(d, f):
    n = d.shape[0]
    d2 = torch.cdist(d, d).pow(2)
    d2.fill_diagonal_(float("inf"))
    return d2.sort(1).values[:, :n - f - 2].sum(1)


def krum(d, w, state, f):
    return d[_krum_scores(d, f).argmin()], state


def multi_krum(d, w, state, f):
    m = d.shape[0] - f
    return d[_krum_scores(d, f).argsort()[:m]].mean(0), state


def centered_clip(d, w, state, f, tau=1.0, iters=1):
    v = torch.zeros(d.shape[1], device=d.device) if state is None else state
    for _ in range(iters):
        diff = d - v
        scale = torch.clamp(tau / diff.norm(dim=1).clamp_min(1e-30), max=1.0)
        v = v + (diff * scale[:, None]).mean(0)
    return v, v


DEFENCES = {"mean": mean, "median": median, "trimmed_mean": trimmed_mean, "krum": krum, "multi_krum": multi_krum,
            "centered_clip": centered_clip}


# ------------------------------------------------------------------------------------------------- attacks


def sign_flip(d, mal, gen, s=4.0):
    d = d.clone()
    d[mal] = -s * d[mal]
    return d


def gaussian(d, mal, gen, sigma=1.0):
    d = d.clone()
    d[mal] = sigma * torch.randn(int(mal.sum()), d.shape[1], generator=gen).to(d.device)
    return d


def _benign(d, mal):
    b = d[~mal]
    return b, b.mean(0), b.std(0, unbiased=True)


def alie(d, mal, gen):
    n, f = d.shape[0], int(mal.sum())
    s = max(n // 2 + 1 - f, 1)
    z = float(torch.distributions.Normal(0.0, 1.0).icdf(torch.tensor((n - s) / n)))
    _, mu, sigma = _benign(d, mal)
    d = d.clone()
    d[mal] = mu - z * sigma
    return d


def ipm(d, mal, gen, eps=0.1):
    d = d.clone()
    d[mal] = -eps * d[~mal].mean(0)
    return d


def _halving(ok, start=10.0, steps=20):
    gamma, step, good = start, start, 0.0
    for _ in range(steps):
        if ok(gamma):
            good, gamma = gamma, gamma + step / 2
        else:
            gamma -= step / 2
        step /= 2
    return good


def _min_max_or_sum(d, mal, objective):
    b, mu, _ = _benign(d, mal)
    p = -mu / mu.norm()
    pair = torch.cdist(b, b).pow(2)
    if objective == "max":
        bound = pair.max()
        ok = lambda g: (mu + g * p - b).pow(2).sum(1).max() <= bound  # noqa: E731
    else:
        bound = pair.sum(1).max()
        ok = lambda g: (mu + g * p - b).pow(2).sum(1).sum() <= bound  # noqa: E731
    d = d.clone()
    d[mal] = mu + _halving(ok) * p
    return d


def min_max(d, mal, gen):
    return _min_max_or_sum(d, mal, "max")


def min_sum(d, mal, gen):
    return _min_max_or_sum(d, mal, "sum")


ATTACKS = {"sign_flip": sign_flip, "gaussian": gaussian, "alie": alie, "ipm": ipm, "min_max": min_max,
           "min_sum": min_sum}


def check(work) -> dict:
    """The largest |difference| of every attack and defence from fljax.ops' output on the same random cohort
    (gaussian draws its own noise: its crafted rows' std minus σ = 1 instead)."""
    d = torch.as_tensor(work["check_deltas"])
    w = torch.as_tensor(work["check_weights"])
    mal = torch.as_tensor(work["check_malicious"])
    f, options = int(work["check_f"]), json.loads(str(work["options"]))
    out = {}
    for name, fn in DEFENCES.items():
        got, _ = fn(d, w, None, f, **options.get(name, {}))
        out[name] = float((got - torch.as_tensor(work[f"check_{name}"])).abs().max())
    for name, fn in ATTACKS.items():
        got = fn(d, mal, torch.Generator().manual_seed(0))
        if name == "gaussian":
            out[name] = float(got[mal].std()) - 1.0
        else:
            out[name] = float((got - torch.as_tensor(work[f"check_{name}"])).abs().max())
    return out


# ------------------------------------------------------------------------------------------------ training


def _model(inputs: int, hidden: list[int], classes: int):
    layers, width = [nn.Flatten()], inputs
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    return nn.Sequential(*layers, nn.Linear(width, classes))


def _flat(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _load(model, vector) -> None:
    with torch.no_grad():
        i = 0
        for p in model.parameters():
            p.copy_(vector[i:i + p.numel()].view_as(p))
            i += p.numel()


def _batches(gen, count: int, steps: int, batch: int) -> torch.Tensor:
    """Rows of ``steps`` minibatches from shuffles of the client's ``count`` rows (fljax's 'shuffle' sampling)."""
    need = steps * batch
    order = torch.cat([torch.randperm(count, generator=gen) for _ in range(-(-need // count))])
    return order[:need].view(steps, batch)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def run_cell(work, attack: str, defence: str, fraction: float, seed: int, device: str = "cpu") -> dict:
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)  # on the CPU: the shuffles and the malicious draw
    x, y = (torch.as_tensor(work[k]).to(device) for k in ("train_x", "train_y"))
    count = torch.as_tensor(work["train_count"])
    n = x.shape[0]
    steps, batch, lr, rounds = (int(work["local_steps"]), int(work["batch_size"]), float(work["lr"]),
                                int(work["rounds"]))
    options = json.loads(str(work["options"]))
    model = _model(int(np.prod(x.shape[2:])), [int(h) for h in work["hidden"]], int(work["classes"])).to(device)
    malicious = torch.zeros(n, dtype=torch.bool)
    malicious[torch.randperm(n, generator=gen)[:math.ceil(fraction * n - 1e-6)]] = True
    malicious = malicious.to(device)
    f = math.ceil(fraction * n - 1e-9)
    weights = count.float().to(device)
    state = None
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(rounds):
        w = _flat(model)
        deltas = []
        for i in range(n):  # the per-client loop
            local = copy.deepcopy(model)
            opt = torch.optim.SGD(local.parameters(), lr=lr)
            for rows in _batches(gen, int(count[i]), steps, batch).to(device):
                opt.zero_grad()
                F.cross_entropy(local(x[i, rows]), y[i, rows]).backward()
                opt.step()
            deltas.append(_flat(local) - w)
        d = ATTACKS[attack](torch.stack(deltas), malicious, gen, **options.get(attack, {}))
        step, state = DEFENCES[defence](d, weights, state, f, **options.get(defence, {}))
        _load(model, w + step)
    _sync(device)
    seconds = time.perf_counter() - t0
    with torch.no_grad():
        tx, ty = (torch.as_tensor(work[k]).to(device) for k in ("test_x", "test_y"))
        tc = torch.as_tensor(work["test_count"])
        accs = [float((model(tx[i, :c]).argmax(1) == ty[i, :c]).float().mean()) for i, c in enumerate(tc.tolist())]
    return {"attack": attack, "defence": defence, "fraction": fraction, "seed": seed, "seconds": seconds,
            "rounds": rounds, "global_acc": float(np.mean(accs))}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("workload")
    p.add_argument("cells", help="JSON list of [attack, defence, fraction, seed]")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    work = np.load(args.workload)
    out = {"torch": torch.__version__, "threads": args.threads, "check": check(work),
           "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
           "cells": [run_cell(work, *cell, device=device) for cell in json.loads(args.cells)]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
