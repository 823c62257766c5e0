"""Paper reproductions: ``fljax.reproduce.<name>.main(argv)`` reruns a paper's experiments and writes its report."""
