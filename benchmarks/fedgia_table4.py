"""FedGiA's Table IV and Figures 1–6, side by side with the paper (thin wrapper around fljax.reproduce.fedgia).

    python benchmarks/fedgia_table4.py               # full run -> benchmarks/results/fedgia/{table4.md,json,fig*.png}
    python benchmarks/fedgia_table4.py --quick       # a small smoke run
    python benchmarks/fedgia_table4.py --help        # every option (conventions, D1–D24 switches, grids)
"""
import sys

from fljax.reproduce.fedgia import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
