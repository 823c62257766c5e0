"""Which array store keeps the clients' state on disk (issue 38): NumPy memory maps against tensorstore.

A client-state store reads the rows of a block's cohorts (a few thousand random clients out of up to a million) and
writes them back after the block; nothing else touches it during training, and an evaluation reads it through in
contiguous chunks. This measures exactly those accesses on one float32 array [N, D] (D = 2,282: a small MLP's
parameters, 9.1 KB a client):

* ``create``: an array of N rows on disk, its space reserved (memory map: ``posix_fallocate`` of the raw file;
  tensorstore: a zarr3 array, ``fill_value`` 0, nothing written);
* ``write K``: K random client rows (sorted ids) written (tensorstore: its write future complete, the data in its
  files), the third of three such writes (the later ones land on rows written before: a run's steady state);
  ``flush``: the memory map's ``msync`` (what a checkpoint of the store pays);
* ``read K``: K other random rows read (the page cache dropped is not possible here without root: the file was
  written by this process, so reads come from memory as they do in a run whose store fits the page cache);
* ``scan``: every row read in chunks of 16,384 rows (the evaluation's pass).

Tensorstore is measured as zarr3 with a sharding codec (shards of 4,096 clients, inner chunks of one client: one file
per shard, a random row is one inner chunk) and as zarr3 with plain chunks of 64 clients (one file per chunk).

    python benchmarks/store_backends.py                       # -> benchmarks/results/store_backends.{json,md}
    python benchmarks/store_backends.py --clients 20000 --rows 1000 --out /tmp/x   # a quick look
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

REPEATS = 3
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def _ids(rng, n: int, k: int) -> np.ndarray:
    return np.sort(rng.choice(n, k, replace=False))


def memmap(path: str, n: int, d: int, k: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    file = os.path.join(path, "rows.bin")
    t0 = time.perf_counter()
    with open(file, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, n * d * 4)
    arr = np.memmap(file, np.float32, "r+", shape=(n, d))
    create = time.perf_counter() - t0
    write, flush, read = [], [], []
    for _ in range(REPEATS):  # the later writes land on rows (pages) written before: a run's steady state
        ids, values = _ids(rng, n, k), rng.standard_normal((k, d), np.float32)
        t0 = time.perf_counter()
        arr[ids] = values
        write.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        arr.flush()
        flush.append(time.perf_counter() - t0)
        other = _ids(rng, n, k)
        t0 = time.perf_counter()
        got = np.asarray(arr[other])
        read.append(time.perf_counter() - t0)
        assert got.shape == (k, d)
    t0 = time.perf_counter()
    total = 0.0
    for lo in range(0, n, 16384):
        total += float(np.asarray(arr[lo:lo + 16384])[:, 0].sum())
    scan = time.perf_counter() - t0
    np.testing.assert_array_equal(np.asarray(arr[ids]), values)
    return {"create_s": create, "write_s": write[-1], "flush_s": flush[-1], "read_s": read[-1], "scan_s": scan}


def tensorstore(path: str, n: int, d: int, k: int, seed: int, sharded: bool) -> dict:
    import tensorstore as ts

    rng = np.random.default_rng(seed)
    codecs = ([{"name": "sharding_indexed", "configuration": {"chunk_shape": [1, d], "codecs": [{"name": "bytes"}],
                                                               "index_codecs": [{"name": "bytes"}, {"name": "crc32c"}]}}]
              if sharded else [{"name": "bytes"}])
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": os.path.join(path, "ts")},
            "metadata": {"shape": [n, d], "data_type": "float32", "fill_value": 0,
                         "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4096 if sharded else 64,
                                                                                             d]}},
                         "codecs": codecs}}
    t0 = time.perf_counter()
    arr = ts.open(spec, create=True, delete_existing=True).result()
    create = time.perf_counter() - t0
    write, read = [], []
    for _ in range(REPEATS):  # the later writes land in shards written before (read, modified, rewritten)
        ids, values = _ids(rng, n, k), rng.standard_normal((k, d), np.float32)
        t0 = time.perf_counter()
        arr.oindex[ids].write(values).result()
        write.append(time.perf_counter() - t0)
        other = _ids(rng, n, k)
        t0 = time.perf_counter()
        got = arr.oindex[other].read().result()
        read.append(time.perf_counter() - t0)
        assert got.shape == (k, d)
    t0 = time.perf_counter()
    for lo in range(0, n, 16384):
        arr[lo:min(n, lo + 16384)].read().result()
    scan = time.perf_counter() - t0
    np.testing.assert_array_equal(arr.oindex[ids].read().result(), values)
    return {"create_s": create, "write_s": write[-1], "flush_s": 0.0, "read_s": read[-1], "scan_s": scan}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=200_000)
    ap.add_argument("--dim", type=int, default=2282)
    ap.add_argument("--rows", type=int, default=10_000)
    ap.add_argument("--dir", default=None, help="where the arrays are written (default: a temporary directory)")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args(argv)
    root = tempfile.mkdtemp(prefix="fljax-store-bench-", dir=args.dir)
    rows = []
    try:
        for name, fn in (("numpy memmap", lambda p: memmap(p, args.clients, args.dim, args.rows, 0)),
                         ("tensorstore zarr3, sharded (4,096 × inner 1)",
                          lambda p: tensorstore(p, args.clients, args.dim, args.rows, 0, True)),
                         ("tensorstore zarr3, chunks of 64",
                          lambda p: tensorstore(p, args.clients, args.dim, args.rows, 0, False))):
            path = os.path.join(root, name.split()[0] + str(len(rows)))
            os.makedirs(path)
            row = {"store": name, **fn(path)}
            row["disk_bytes"] = sum(os.stat(os.path.join(d, f)).st_blocks * 512 for d, _, fs in os.walk(path)
                                    for f in fs)
            shutil.rmtree(path)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    meta = {"clients": args.clients, "dim": args.dim, "rows": args.rows, "row_bytes": args.dim * 4,
            "command": " ".join(["python benchmarks/store_backends.py"] + (argv if argv is not None else sys.argv[1:])),
            "date": time.strftime("%Y-%m-%d"), "cpu_count": os.cpu_count()}
    lines = [f"{args.clients:,} clients × {args.dim:,} float32 ({args.dim * 4 / 1024:.1f} KiB a client), "
             f"{args.rows:,} random rows written and read. Command: `{meta['command']}`.", "",
             "| store | create s | write K s | flush s | read K s | scan all s | disk GB |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['store']} | {r['create_s']:.2f} | {r['write_s']:.2f} | {r['flush_s']:.2f} | {r['read_s']:.2f} | "
                     f"{r['scan_s']:.2f} | {r['disk_bytes'] / 1e9:.2f} |")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "store_backends.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    with open(os.path.join(args.out, "store_backends.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
