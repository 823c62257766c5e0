"""Reduced-scale paper reproductions: ``fljax.reproduce.<name>.main(argv)`` runs one and writes its tables."""
