"""Plots a researcher would keep: distinct styles for any number of runs, log-scale bytes, no plot of a quantity
that is zero throughout, the logged extras, PDF beside PNG."""
import os

from fljax.runner.plots import extras, plot_compare, plot_run, style


def _history(bytes_per_round: float, extra: dict | None = None, evaluations: int = 4) -> list[dict]:
    return [{"round": r, "personal_acc": 0.1 + 0.2 * r, "personal_loss": 2.0 - r, "bytes_up": bytes_per_round * r,
             "bytes_down": bytes_per_round * r, "run_seconds": 0.1 * r, **({"train_loss": 2.0 - r} if r else {}),
             **(extra or {})} for r in range(evaluations)]


def test_styles_differ_for_many_runs():
    styles = [(tuple(style(i)["color"]), style(i)["marker"]) for i in range(110)]
    assert len(set(styles)) == 110
    assert all(style(i)["marker"] != style(i + 1)["marker"] for i in range(109))


def test_extras_are_the_logged_quantities_that_are_not_zero_throughout():
    h = _history(1e3, {"consensus": 0.5, "rank/head/kernel": 3, "zero_thing": 0.0})
    assert extras([h]) == ["train_loss", "consensus", "rank/head/kernel"]


def test_a_run_without_communication_has_no_bytes_plot(tmp_path):
    paths = plot_run(str(tmp_path), [_history(0.0)], [], "local: digits, 4 clients")
    names = sorted(os.path.basename(p) for p in paths)
    assert names == ["accuracy_vs_round.pdf", "accuracy_vs_round.png", "metrics.pdf", "metrics.png"]
    assert open(tmp_path / "accuracy_vs_round.pdf", "rb").read(5) == b"%PDF-"


def test_compare_writes_png_pdf_and_the_extras(tmp_path):
    runs = {f"algo{i}": [_history(10.0 ** i, {"sparse_nnz_frac": 0.5} if i == 2 else None)] for i in range(12)}
    runs["local"] = [_history(0.0)]
    paths = plot_compare(str(tmp_path / "compare.png"), runs, "digits, 4 clients")
    assert sorted(os.path.basename(p) for p in paths) == ["compare.pdf", "compare.png", "compare_metrics.pdf",
                                                          "compare_metrics.png"]
