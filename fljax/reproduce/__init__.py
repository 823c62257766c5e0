"""Paper reproductions, one module per paper: ``fljax reproduce NAME [args...]`` imports ``fljax.reproduce.NAME``
and calls its ``main(argv: list[str]) -> int`` with the remaining arguments."""
