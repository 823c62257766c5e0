"""The reduced-scale DFedAlt reproduction (DFedAlt spec §9); a thin wrapper of ``fljax.reproduce.dfedalt``.

    python benchmarks/dfedalt_reduced.py                 # all studies, 3 seeds -> benchmarks/results/dfedalt/
    python benchmarks/dfedalt_reduced.py --help          # options (--only, --seeds, --rounds, --render, --resume)

The same as ``fljax reproduce dfedalt`` and ``python -m fljax.reproduce.dfedalt``.
"""
import sys

from fljax.reproduce.dfedalt import main

if __name__ == "__main__":
    sys.exit(main())
