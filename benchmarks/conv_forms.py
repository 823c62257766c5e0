"""Convolution forms under vmap over clients: what each compiles to, how fast each runs, and the table ``auto`` reads.

1. **HLO** (``--hlo``): for CNN1 (28×28×1, 5×5 convolutions) and CNN1-S (3×3) with per-client weights under
   ``vmap`` over 4 clients, the forward pass (logits) and the backward pass (gradient of the loss) of each form
   (:data:`fljax.models.layers.CONV_FORMS`) are lowered (StableHLO, the program every backend receives) and
   compiled for this backend; the script counts in each the convolutions (with ``feature_group_count`` > 1: a
   grouped convolution, one group per client; ``batch_group_count`` > 1: the grouped kernel gradient) and the
   products (``dot_general`` with batch dimensions: batched matmuls). Writes ``results/conv_forms_hlo.md``.
2. **Throughput** (default): FedAvg rounds (10 local SGD steps of batch 20, every client) of each form under a
   vectorised executor (``vmap``) and one client at a time (``loop``) for CNN1 and CNN1-S, each in its own
   process (``benchmarks/throughput.py --one``). Writes ``results/conv_forms_<backend>.{json,md}``;
   ``--update-table`` replaces this backend's rows of ``fljax/models/conv_forms.json``, the table
   ``conv_impl: auto`` reads (:mod:`fljax.models.conv_table`).

    python benchmarks/conv_forms.py --hlo
    python benchmarks/conv_forms.py --clients 8 --repeats 2 --update-table     # this 2-core CPU
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import throughput  # noqa: E402

MODELS = {"cnn1": "cnn1-28x28-64", "cnn1_s": "cnn1_s-28x28-64"}


def hlo_counts(text: str) -> dict:
    """Convolutions (plain, grouped by feature, grouped by batch) and products (plain, batched) in an HLO or
    StableHLO module's text."""
    convs = re.findall(r"(?:stablehlo\.convolution|= \S+ convolution\()[^\n]*", text)
    feature = sum(1 for c in convs if re.search(r"feature_group_count\s*=\s*([2-9]|\d\d+)", c))
    batch = sum(1 for c in convs if re.search(r"batch_group_count\s*=\s*([2-9]|\d\d+)", c))
    dots = re.findall(r"(?:stablehlo\.dot_general|= \S+ dot\()[^\n]*", text)
    batched = sum(1 for d in dots if re.search(r"batching_dims\s*=\s*\[\d|lhs_batch_dims=\{\d", d))
    return {"convolutions": len(convs), "grouped_by_feature": feature, "grouped_by_batch": batch,
            "products": len(dots), "batched_products": batched}


def hlo_table(clients: int = 4) -> str:
    import jax
    import jax.numpy as jnp

    from fljax.data import Batch
    from fljax.models import make_model
    from fljax.models.layers import CONV_FORMS

    lines = [f"# Convolution forms under vmap over {clients} clients' weights: what they compile to", "",
             f"jax {jax.__version__}, compiled for {jax.default_backend()}; command `python benchmarks/conv_forms.py "
             f"--hlo`. Counts in the lowered StableHLO (what every backend receives) and in the module XLA compiled "
             f"for this backend (after its rewrites). grouped: `feature_group_count` > 1 (the client axis folded into "
             f"the channels: one group per client); batch-grouped: `batch_group_count` > 1; batched products: "
             f"`dot_general` with batch dimensions. The patches form's one grouped convolution per layer after the "
             f"first is its patch extraction (`conv_general_dilated_patches`: a fixed one-hot kernel, one group per "
             f"input channel, the clients folded into its batch), not a per-client convolution; the dense layers "
             f"give 3 batched products forward in every form.", ""]
    for name in MODELS:
        model = make_model(name, (28, 28, 1), 10)
        keys = jax.random.split(jax.random.PRNGKey(0), clients)
        x = jnp.zeros((clients, 20, 28, 28, 1))
        y = jnp.zeros((clients, 20), jnp.int32)
        lines += [f"## {name}", "", "| form | pass | stage | convolutions | grouped | batch-grouped | products | "
                  "batched products |", "|---|---|---|---|---|---|---|---|"]
        for form in CONV_FORMS:
            m = model.with_conv(form)
            params = jax.vmap(m.init)(keys)
            passes = {"forward": jax.vmap(m.apply),
                      "backward": jax.vmap(jax.grad(lambda p, xi, yi: m.loss(p, Batch(xi, yi, jnp.ones(20, bool)))))}
            for what, fn in passes.items():
                args = (params, x) if what == "forward" else (params, x, y)
                lowered = jax.jit(fn).lower(*args)
                for stage, text in (("StableHLO", lowered.as_text()), ("compiled", lowered.compile().as_text())):
                    c = hlo_counts(text)
                    lines.append(f"| {form} | {what} | {stage} | {c['convolutions']} | {c['grouped_by_feature']} | "
                                 f"{c['grouped_by_batch']} | {c['products']} | {c['batched_products']} |")
        lines.append("")
    return "\n".join(lines)


def table_rows(rows: list[dict], source: str) -> list[dict]:
    """The rows of ``fljax/models/conv_forms.json`` from throughput rows."""
    kind = lambda ex: "loop" if ex == "loop" else "vectorised"  # noqa: E731
    return [{"backend": r["backend"], "model": throughput.WORKLOADS[r["workload"]]["model"],
             "executor": kind(r["executor"]), "clients": r["clients"], "form": r["conv"],
             "precision": r.get("precision", "tf32"), "client_steps_per_s": round(r["client_steps_per_s"], 1),
             "source": source} for r in rows if r["conv"] != "-"]


def update_table(rows: list[dict], backend: str) -> None:
    """Put ``rows`` into the committed table, replacing the rows of the same backend, model, executor kind, number
    of clients and form."""
    path = os.path.join(ROOT, "fljax", "models", "conv_forms.json")
    with open(path) as f:
        table = json.load(f)
    key = lambda r: (r["backend"], r["model"], r["executor"], r["clients"], r["form"])  # noqa: E731
    new = {key(r) for r in rows}
    table["rows"] = [r for r in table["rows"] if key(r) not in new] + rows
    with open(path, "w") as f:
        json.dump(table, f, indent=1)
        f.write("\n")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hlo", action="store_true", help="count the HLO operations of each form (nothing timed)")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--executors", default="vmap,loop")
    ap.add_argument("--update-table", action="store_true", help="write this backend's rows into the table auto reads")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args(argv)
    from fljax.runner.files import write_json, write_text

    if args.hlo:
        text = hlo_table()
        write_text(os.path.join(args.out, "conv_forms_hlo.md"), text + "\n")
        print(text)
        return
    from fljax.models.layers import CONV_FORMS

    import jax

    peak = throughput.matmul_peak(1024)
    configs = [(w, ex, form, "auto") for w in MODELS.values() for ex in args.executors.split(",")
               for form in CONV_FORMS]
    rows = throughput.measure_all(configs, args.repeats, False, peak, clients=args.clients)
    command = " ".join(["python benchmarks/conv_forms.py"] + (argv if argv is not None else sys.argv[1:]))
    meta = throughput.describe(command, peak, args.repeats)
    name = os.path.join(args.out, f"conv_forms_{jax.default_backend()}")
    write_json(name + ".json", {"meta": meta, "rows": rows})
    text = throughput.markdown(meta, rows)
    write_text(name + ".md", text)
    print(text)
    if args.update_table:
        update_table(table_rows(rows, f"benchmarks/results/conv_forms_{jax.default_backend()}.json"),
                     jax.default_backend())


if __name__ == "__main__":
    main()
