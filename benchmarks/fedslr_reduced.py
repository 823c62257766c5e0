"""Reduced-scale FedSLR reproduction (FedSLR spec §8): a thin wrapper around ``fljax.reproduce.fedslr``.

    python benchmarks/fedslr_reduced.py --jobs 2          # = python -m fljax.reproduce.fedslr --jobs 2

Writes benchmarks/results/fedslr/{results.json, README.md, curves.png, sweeps.png}; see ``--help``.
"""
import sys

from fljax.reproduce.fedslr import main

if __name__ == "__main__":
    sys.exit(main())
