"""``python -m fljax``: the ``fljax`` command line (:func:`fljax.cli.main`), e.g. from a checkout without the
console script on the path."""
import sys

from fljax.cli import main

sys.exit(main())
