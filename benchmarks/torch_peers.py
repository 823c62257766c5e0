"""PyTorch peers of benchmarks/throughput.py's FedAvg workload, on the same device: one round, every client, 10 local
SGD steps of batch 20 (lr 0.1), client-steps/s (median of ``repeats`` rounds after a warm-up).

* ``loop``: the PFLlib / FL-bench style — per client a ``copy.deepcopy`` of the global model, a fresh
  ``torch.optim.SGD`` and 10 steps, then the weighted average of the clients' parameters.
* ``vmap``: what a PyTorch expert writes to vectorise — the clients' parameters stacked
  (``torch.func.stack_module_state``), each step ``torch.func.vmap(torch.func.grad(loss))`` over the clients and an
  SGD update of the stacked tensors, then the mean.

Models mirror fljax's zoo: logistic regression (60→10), the MLP 784-200-200-10 and the 5×5 16-32 CNN (SAME,
max-pool 2, dense 128; ``cnn_s`` with ``kernel=5, width=128``). Float32 products run as PyTorch does by default on
the GPU for convolutions (TF32 allowed), and with TF32 allowed for matmuls too (``allow_tf32``, recorded), the
setting closest to JAX's default. Used by benchmarks/gpu.py when ``torch`` imports.
"""
from __future__ import annotations

import copy
import time

STEPS, BATCH, LR = 10, 20, 0.1


def available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def _model(name: str):
    import torch.nn as tnn

    if name == "logreg":
        return tnn.Sequential(tnn.Flatten(), tnn.Linear(60, 10)), (60,)
    if name == "mlp":
        return tnn.Sequential(tnn.Flatten(), tnn.Linear(784, 200), tnn.ReLU(), tnn.Linear(200, 200), tnn.ReLU(),
                              tnn.Linear(200, 10)), (1, 28, 28)
    if name == "cnn5":
        return tnn.Sequential(tnn.Conv2d(1, 16, 5, padding=2), tnn.ReLU(), tnn.MaxPool2d(2),
                              tnn.Conv2d(16, 32, 5, padding=2), tnn.ReLU(), tnn.MaxPool2d(2), tnn.Flatten(),
                              tnn.Linear(32 * 7 * 7, 128), tnn.ReLU(), tnn.Linear(128, 10)), (1, 28, 28)
    raise ValueError(f"no PyTorch peer for {name!r}")


def _median_round(fn, repeats: int) -> float:
    import torch

    fn()
    torch.cuda.synchronize() if torch.cuda.is_available() else None
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize() if torch.cuda.is_available() else None
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def measure(name: str, style: str, clients: int, repeats: int = 3, timed_clients: int | None = None) -> dict:
    """client-steps/s of one FedAvg round of ``clients`` clients in ``style`` ('loop' or 'vmap'). ``timed_clients``
    (loop only): time that many clients and scale, as a per-client loop's time grows linearly with the clients."""
    import torch
    import torch.nn.functional as F
    from torch.func import functional_call, grad, stack_module_state, vmap

    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    base, shape = _model(name)
    base = base.to(device)
    n = clients if style == "vmap" or timed_clients is None else min(clients, timed_clients)
    x = torch.rand((n, STEPS, BATCH, *shape), device=device)
    y = torch.randint(0, 10, (n, STEPS, BATCH), device=device)

    if style == "loop":
        def round_():
            states = []
            for i in range(n):
                local = copy.deepcopy(base)
                opt = torch.optim.SGD(local.parameters(), lr=LR)
                for k in range(STEPS):
                    opt.zero_grad()
                    F.cross_entropy(local(x[i, k]), y[i, k]).backward()
                    opt.step()
                states.append([p.detach() for p in local.parameters()])
            with torch.no_grad():
                for p, *ps in zip(base.parameters(), *states):
                    p.copy_(torch.stack(ps).mean(0))
    elif style == "vmap":
        def loss(params, buffers, xb, yb):
            return F.cross_entropy(functional_call(base, (params, buffers), (xb,)), yb)

        step = vmap(grad(loss), in_dims=(0, 0, 0, 0))

        def round_():
            params, buffers = stack_module_state([base] * n)
            params = {k: v.detach() for k, v in params.items()}
            for k in range(STEPS):
                g = step(params, buffers, x[:, k], y[:, k])
                params = {p: params[p] - LR * g[p] for p in params}
            with torch.no_grad():
                for key, p in base.named_parameters():
                    p.copy_(params[key].mean(0))
    else:
        raise ValueError(f"style must be 'loop' or 'vmap', got {style!r}")
    seconds = _median_round(round_, repeats) * clients / n
    return {"peer": "torch.func vmap" if style == "vmap" else "PyTorch loop", "model": name, "clients": clients,
            "timed_clients": n, "client_steps_per_s": clients * STEPS / seconds, "round_seconds": seconds,
            "torch": torch.__version__, "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
            "allow_tf32": True, "repeats": repeats}
