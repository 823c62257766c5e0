"""Plots a researcher would keep: distinct styles for any number of runs, log-scale bytes, no plot of a quantity
that is zero throughout, the logged extras, PDF beside PNG."""
import os

import numpy as np

from fljax.runner import plots
from fljax.runner.plots import style
from fljax.runner.plots import plot_heatmap
from fljax.runner.run_plots import constants, extras, plot_compare, plot_run


def _history(bytes_per_round: float, extra: dict | None = None, evaluations: int = 4) -> list[dict]:
    return [{"round": r, "personal_acc": 0.1 + 0.2 * r, "personal_loss": 2.0 - r, "bytes_up": bytes_per_round * r,
             "bytes_down": bytes_per_round * r, "run_seconds": 0.1 * r, **({"train_loss": 2.0 - r} if r else {}),
             **(extra or {})} for r in range(evaluations)]


def test_styles_differ_for_many_runs():
    """Colour x line style x marker: the first 308 lines all differ, neighbours differ in colour and marker, the
    first 7 are solid lines in the Okabe-Ito colours."""
    styles = [(style(i)["color"], style(i)["linestyle"], style(i)["marker"]) for i in range(308)]
    assert len(set(styles)) == 308
    assert all(style(i)["marker"] != style(i + 1)["marker"] and style(i)["color"] != style(i + 1)["color"]
               for i in range(307))
    assert {style(i)["linestyle"] for i in range(7)} == {"-"}
    assert {style(i)["color"] for i in range(7)} == set(plots.PALETTE)


def test_extras_are_the_logged_quantities_that_change():
    h = _history(1e3, {"consensus": 0.5, "rank/head/kernel": 3, "zero_thing": 0.0})
    h[1]["consensus"], h[2]["rank/head/kernel"] = 0.25, 2
    assert extras([h]) == ["train_loss", "consensus", "rank/head/kernel"]
    h = _history(1e3, {"consensus": 0.5, "zero_thing": 0.0, "gkr_params": 1234})
    assert extras([h]) == ["train_loss"]  # constant metrics are not drawn
    assert constants([h]) == {"consensus": 0.5, "zero_thing": 0.0, "gkr_params": 1234.0}


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


class _Saved(dict):
    """Figures saved, by the file name they were written to (a temporary name that contains it, for atomic
    writes, counts as that name)."""

    def __getitem__(self, name):
        hits = [fig for path, fig in self.items() if path == name or f"{name}." in path]
        assert hits, (name, sorted(self))
        return hits[-1]


def _captured(monkeypatch):
    """Every figure saved while the test runs (the figure objects themselves, to read their data back)."""
    from matplotlib.figure import Figure

    saved = _Saved()
    original = Figure.savefig

    def savefig(self, fname, *args, **kwargs):
        dict.__setitem__(saved, os.path.basename(str(fname)), self)
        return original(self, fname, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    return saved


def _lines(fig):
    return [line for ax in fig.axes for line in ax.get_lines() if len(line.get_xdata())]


def _curve(fig, x, y):
    """The drawn line with these data (x, y), or None."""
    for line in _lines(fig):
        lx, ly = np.asarray(line.get_xdata(), float), np.asarray(line.get_ydata(), float)
        if lx.shape == np.shape(x) and np.allclose(lx, x) and np.allclose(ly, y):
            return line
    return None


def test_run_plots_draw_the_seed_mean_its_band_and_the_histogram_of_the_clients(tmp_path, monkeypatch):
    """What the figures show, read back from them: accuracy against rounds is the mean over seeds at each
    evaluation with a band of ±1 std; against communication, x is the cumulative MB (up + down) averaged over
    seeds; the client histogram counts every client of every seed; a metric that is zero throughout is not drawn
    while the train loss is (its mean over seeds)."""
    import matplotlib.collections

    def history(seed):
        rng = np.random.default_rng(seed)
        return [{"round": r, "personal_acc": float(rng.uniform(0.2, 0.9)), "global_acc": float(rng.uniform(0, 1)),
                 "bytes_up": 1e5 * r * (1 + seed), "bytes_down": 2e5 * r, "run_seconds": 0.1 * r,
                 "zero_thing": 0.0, **({"train_loss": float(rng.uniform(0.5, 2))} if r else {})}
                for r in range(0, 10, 3)]

    histories = [history(s) for s in (0, 1, 2)]
    per_client = [{"personal_acc": np.random.default_rng(10 + s).uniform(0, 1, 7)} for s in range(3)]
    saved = _captured(monkeypatch)
    plot_run(str(tmp_path), histories, per_client, "test")
    rounds = np.array([0, 3, 6, 9])
    acc = np.array([[r["personal_acc"] for r in h] for h in histories])
    mean, std = acc.mean(0), acc.std(0, ddof=1)  # the sample std, the convention of every table and band
    fig = saved["accuracy_vs_round.png"]
    assert _curve(fig, rounds, mean) is not None
    assert _curve(fig, rounds, np.array([[r["global_acc"] for r in h] for h in histories]).mean(0)) is not None
    bands = [c for ax in fig.axes for c in ax.collections if isinstance(c, matplotlib.collections.PolyCollection)]
    vertices = np.concatenate([p.vertices for band in bands for p in band.get_paths()])
    for x, lo, hi in zip(rounds, mean - std, mean + std):
        ys = vertices[np.isclose(vertices[:, 0], x), 1]
        assert np.isclose(ys, lo).any() and np.isclose(ys, hi).any(), (x, lo, hi)
    mb = np.array([[(r["bytes_up"] + r["bytes_down"]) / 1e6 for r in h] for h in histories]).mean(0)
    assert _curve(saved["accuracy_vs_bytes.png"], mb[1:], mean[1:]) is not None  # round 0 sent nothing (log axis)
    hist_ax = saved["client_accuracy.png"].axes[0]
    values = np.concatenate([p["personal_acc"] for p in per_client])
    heights = [(bar.get_x(), bar.get_x() + bar.get_width(), bar.get_height()) for bar in hist_ax.patches]
    assert sum(h for _, _, h in heights) == len(values) == 21
    for lo, hi, h in heights:
        assert h == np.sum((values >= lo) & ((values < hi) | np.isclose(hi, 1.0) & (values <= hi)))
    metrics = saved["metrics.png"]
    loss = np.array([[r["train_loss"] for r in h[1:]] for h in histories]).mean(0)
    assert _curve(metrics, rounds[1:], loss) is not None
    assert not any(np.allclose(np.asarray(line.get_ydata(), float), 0.0) for line in _lines(metrics))


def _look(artist) -> tuple:
    return artist.get_color(), artist.get_linestyle(), artist.get_marker()


def test_compare_plot_draws_each_run_labelled_with_its_own_data(tmp_path, monkeypatch):
    """In a comparison every run has its own curve of its own accuracies, labelled with its own name, in the same
    look against rounds and against communication, and the legend's entry of that name shows that look; a run that
    communicated nothing has no curve against communication."""
    runs = {f"algo{k}": [[{**r, "personal_acc": 0.1 * k + 0.01 * r["round"]} for r in _history(10.0 ** k)]]
            for k in range(1, 4)}
    runs["local"] = [_history(0.0)]
    saved = _captured(monkeypatch)
    plot_compare(str(tmp_path / "compare.png"), runs, "digits")
    fig = saved["compare.png"]
    (legend,) = fig.legends
    entries = {t.get_text(): _look(h) for t, h in zip(legend.get_texts(), legend.legend_handles)}
    assert sorted(entries) == sorted(runs) and len(set(entries.values())) == len(runs)
    for name, (h,) in runs.items():
        x, y = np.array([r["round"] for r in h]), np.array([r["personal_acc"] for r in h])
        line = _curve(fig, x, y)
        assert line is not None and line.get_label() == name and _look(line) == entries[name], name
        mb = np.array([(r["bytes_up"] + r["bytes_down"]) / 1e6 for r in h])
        by_bytes = _curve(fig, mb[mb > 0], y[mb > 0])
        assert (by_bytes is not None) == (name != "local"), name
        assert by_bytes is None or (by_bytes.get_label(), _look(by_bytes)) == (name, entries[name]), name


def test_heatmap_shows_the_mean_final_value_of_every_grid_point(tmp_path, monkeypatch):
    """A two-key sweep's heatmap: cell (i, j) is the mean over seeds of the final value at the i-th value of the
    first key and the j-th of the second, with a labelled colour bar and the grid values as ticks."""
    grid = {"algo.lr": [0.01, 0.1], "algo.mu": [0, 0.1, 1]}
    finals = {(i, j): [0.1 * i + 0.01 * j, 0.1 * i + 0.03 * j] for i in range(2) for j in range(3)}
    saved = _captured(monkeypatch)
    plot_heatmap(str(tmp_path / "sweep_heatmap.png"), grid, finals, "fedprox")
    fig = saved["sweep_heatmap.png"]
    ax = fig.axes[0]
    image = ax.get_images()[0].get_array()
    assert np.allclose(image, [[np.mean(finals[i, j]) for j in range(3)] for i in range(2)])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "0.1", "1"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["0.01", "0.1"]
    assert "lr" in ax.get_ylabel() and "mu" in ax.get_xlabel()
    assert "accuracy" in fig.axes[1].get_ylabel()  # the colour bar says what it shows


def test_many_runs_are_small_multiples_by_group_and_the_legend_is_outside(tmp_path, monkeypatch):
    runs = {f"a{k}": [[{**r, "personal_acc": 0.05 * k + 0.01 * r["round"]} for r in _history(10.0)]]
            for k in range(12)}
    groups = {f"a{k}": "first" if k < 5 else "second" for k in range(12)}
    saved = _captured(monkeypatch)
    plot_compare(str(tmp_path / "compare.png"), runs, "digits", groups=groups)
    fig = saved["compare.png"]
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert len(visible) == 4  # two groups x (vs round, vs MB)
    assert [ax.get_title(loc="left") for ax in visible[::2]] == ["first", "second"]
    for ax in visible:
        for legend in [ax.get_legend()] if ax.get_legend() else []:
            box = legend.get_window_extent(fig.canvas.get_renderer())
            assert box.x0 >= ax.get_window_extent(fig.canvas.get_renderer()).x1 - 1  # right of the data


def test_paper_style_writes_a_vector_pdf_in_a_single_column(tmp_path, monkeypatch):
    saved = _captured(monkeypatch)
    with plots.use("paper"):
        paths = plot_run(str(tmp_path), [_history(1e3), _history(2e3)], [], "fedavg")
    assert any(p.endswith("accuracy_vs_round.pdf") for p in paths)
    fig = saved["accuracy_vs_round.pdf"]
    assert np.isclose(fig.get_size_inches()[0], 3.3)
    assert "serif" in fig.axes[0].xaxis.label.get_fontfamily()
    assert "2 seeds" in fig._suptitle.get_text() and "std" in fig._suptitle.get_text()
    assert plots.current().name == "screen"  # only inside use()


def _labelled_ticks(ax, which: str = "x") -> dict[float, str]:
    """The ticks inside the axis's view with a written label: position → text (the figure drawn first)."""
    ax.figure.draw_without_rendering()
    axis = ax.xaxis if which == "x" else ax.yaxis
    lo, hi = sorted(axis.get_view_interval())
    return {float(t.get_position()[0 if which == "x" else 1]): t.get_text() for t in axis.get_majorticklabels()
            if t.get_text() and lo <= t.get_position()[0 if which == "x" else 1] <= hi}


def test_a_short_run_has_whole_round_ticks_and_a_narrow_log_axis_several_labels(tmp_path, monkeypatch):
    """Three rounds: the round axis ticks 0, 1, 2, 3 only (no 0.5); communication from 0.8 to 2.4 MB (less than
    a decade) on a log axis: at least three labelled ticks, each label the value at its tick."""
    saved = _captured(monkeypatch)
    plot_run(str(tmp_path), [_history(4e5)], [], "fedavg")  # MB after round r: 2 × 0.4 r = 0.8, 1.6, 2.4
    rounds = _labelled_ticks(saved["accuracy_vs_round.png"].axes[0])
    assert sorted(rounds) == [0, 1, 2, 3], rounds
    mb = _labelled_ticks(saved["accuracy_vs_bytes.png"].axes[0])
    assert len(mb) >= 3, mb
    assert all(np.isclose(float(text), x) for x, text in mb.items()), mb


def test_log_ticks_label_at_least_three_round_values_over_any_span():
    """Whatever a log axis spans (a fiftieth of a decade to sixteen decades), 3 to 9 ticks fall inside it, in
    order, each a round value (at most three significant digits)."""
    for lo, hi in [(3.1, 3.9), (0.77, 2.5), (0.33, 5.0), (0.9, 35), (1, 1000), (2e-3, 40), (1e-13, 1e2), (7, 7.5),
                   (7, 7.05)]:
        ticks = plots._log_ticks(lo, hi)
        assert 3 <= len(ticks) <= 9 and all(lo <= t <= hi * (1 + 1e-9) for t in ticks), (lo, hi, ticks)
        mantissas = [t / 10.0 ** np.floor(np.log10(t) + 1e-9) for t in ticks]
        assert all(np.isclose(m * 100, round(m * 100)) for m in mantissas), ticks
        assert np.all(np.diff(ticks) > 0)


def _boxes_overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_in_the_paper_style_legends_clear_every_axis_label_and_panel(tmp_path, monkeypatch):
    """Stacked panels (paper style), legends below the data: no legend overlaps any panel, x label or tick label
    — a run of three rounds and a comparison drawn as small multiples."""
    saved = _captured(monkeypatch)
    runs = {f"a{k}": [[{**r, "personal_acc": 0.05 * k + 0.01 * r["round"]} for r in _history(10.0 ** k)]]
            for k in range(12)}
    with plots.use("paper"):
        plot_run(str(tmp_path), [_history(4e5)], [], "fedavg")
        plot_compare(str(tmp_path / "compare.png"), runs, "digits", groups={k: k[:2] for k in runs})
    for name in ("accuracy_vs_round.pdf", "accuracy_vs_bytes.pdf", "compare.pdf"):
        fig = saved[name]
        fig.draw_without_rendering()
        renderer = fig.canvas.get_renderer()
        axes = [ax for ax in fig.axes if ax.get_visible()]
        legends = [lg for lg in [*fig.legends, *(ax.get_legend() for ax in axes)] if lg is not None]
        assert legends, name
        for legend in legends:
            box = legend.get_window_extent(renderer)
            for ax in axes:
                texts = [ax.xaxis.label, *ax.get_xticklabels()]
                others = [ax.get_window_extent(renderer)] + [t.get_window_extent(renderer) for t in texts
                                                              if t.get_text()]
                assert not any(_boxes_overlap(box, other) for other in others), (name, ax.get_xlabel())


def _padded_clients(rng, sizes, num_classes, n_max):
    """Padded train arrays of clients with ``sizes`` samples of random labels (padding rows hold label 0)."""
    from fljax.data.federated import ClientArrays

    y = np.zeros((len(sizes), n_max), np.int32)
    mask = np.zeros((len(sizes), n_max), bool)
    for i, n in enumerate(sizes):
        y[i, :n] = rng.integers(0, num_classes, n)
        mask[i, :n] = True
    return ClientArrays(x=np.zeros((len(sizes), n_max, 1), np.float32), y=y, mask=mask,
                        count=np.asarray(sizes, np.int32), n_min=int(min(sizes)), n_max=n_max)


def _loop_counts(train, num_classes):
    """Label counts by a plain loop over every client's valid rows."""
    counts = np.zeros((train.num_clients, num_classes), int)
    for i in range(train.num_clients):
        for j in range(int(train.count[i])):
            counts[i, int(train.y[i, j])] += 1
    return counts


def test_the_partition_figure_draws_every_clients_label_counts_and_size(tmp_path, monkeypatch):
    """The partition figure of a run (partition.png): the heat map's cells are the clients' train label counts and
    the bars their sizes, both counted here by a plain loop over the clients' rows; the title says all are shown."""
    from fljax.data.federated import FederatedData
    from fljax.runner.partition_plot import partition_counts

    rng = np.random.default_rng(0)
    train = _padded_clients(rng, [5, 0, 9, 3, 12], 4, n_max=12)
    data = FederatedData(train=train, test=train, num_classes=4, input_shape=(1,), name="toy")
    expected = _loop_counts(train, 4)
    saved = _captured(monkeypatch)
    paths = plot_run(str(tmp_path), [_history(1.0)], [], "fedavg: toy, 5 clients", ("png",), partition_counts(data))
    assert str(tmp_path / "partition.png") in paths
    fig = saved["partition.png"]
    image = [im for ax in fig.axes for im in ax.get_images()][0]
    np.testing.assert_array_equal(np.asarray(image.get_array()), expected.T)  # classes × clients
    bars = [p.get_height() for ax in fig.axes for p in ax.patches]
    np.testing.assert_array_equal(bars, [5, 0, 9, 3, 12])
    assert "all 5 clients" in fig._suptitle.get_text()


def test_a_large_population_shows_an_evenly_spaced_sample_in_order_of_size(tmp_path, monkeypatch):
    """More clients than MAX_CLIENTS: that many, at evenly spaced ranks of size (largest first), each column the
    label counts of a client of that size, as the title says."""
    from fljax.runner.partition_plot import MAX_CLIENTS, plot_partition

    rng = np.random.default_rng(1)
    clients = MAX_CLIENTS + 57
    counts = rng.integers(0, 9, (clients, 3)) * rng.integers(0, 2, (clients, 3))
    saved = _captured(monkeypatch)
    plot_partition(str(tmp_path / "partition.png"), counts, "t", ("png",))
    fig = saved["partition.png"]
    ranked = sorted((int(c.sum()) for c in counts), reverse=True)
    expected = [ranked[round(k * (clients - 1) / (MAX_CLIENTS - 1))] for k in range(MAX_CLIENTS)]
    bars = [p.get_height() for ax in fig.axes for p in ax.patches]
    assert bars == expected
    columns = np.asarray([im for ax in fig.axes for im in ax.get_images()][0].get_array()).T
    rows = {tuple(c) for c in counts}
    assert all(tuple(col) in rows and col.sum() == size for col, size in zip(columns, bars))
    assert f"{MAX_CLIENTS} of {clients} clients, evenly spaced in order of size" in fig._suptitle.get_text()


def test_no_partition_figure_without_class_labels():
    """Per-token text (next-token targets), data with no classes, more classes than MAX_CLASSES, and data that are
    not a classification population (no label counts) have no partition figure."""
    from fljax.data.federated import FederatedData
    from fljax.data.text import TokenShape
    from fljax.runner.partition_plot import MAX_CLASSES, partition_counts

    train = _padded_clients(np.random.default_rng(2), [3, 4], 5, n_max=4)
    data = FederatedData(train=train, test=train, num_classes=5, input_shape=(1,))
    np.testing.assert_array_equal(partition_counts(data), _loop_counts(train, 5))
    assert partition_counts(data.replace(input_shape=TokenShape(4, 5, per_token=True))) is None
    assert partition_counts(data.replace(num_classes=0)) is None
    assert partition_counts(data.replace(num_classes=MAX_CLASSES + 1)) is None
    assert partition_counts(object()) is None


def _legend_texts(fig):
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)]
    return [t.get_text() for legend in legends for t in legend.get_texts()]


def test_identical_runs_are_one_line_with_one_legend_entry(tmp_path, monkeypatch):
    """Runs whose curves are equal to the tables' 4 decimals (here b and d equal a, d off by 1e-6; e equals c) are
    drawn once, the legend listing the identical ones after '='; distinct runs (g off by 1e-3, f one evaluation
    short) keep their own lines; the metrics figure keeps a line per run."""
    from fljax.runner.run_plots import ties

    def shifted(history, by):
        return [{**r, "personal_acc": r["personal_acc"] + by} for r in history]

    base, other = _history(1e3), _history(2e3)
    runs = {"a": [base], "b": [shifted(base, 0.0)], "c": [other], "d": [shifted(base, 1e-6)],
            "e": [shifted(other, 0.0)], "f": [_history(1e3, evaluations=3)], "g": [shifted(base, 1e-3)]}
    # written out: group the labels by their records' accuracy (4 decimals), MB and clock
    expected: dict[tuple, list[str]] = {}
    for label, (h,) in runs.items():
        expected.setdefault(tuple((r["round"], round(r["personal_acc"], 4), r["bytes_up"] + r["bytes_down"])
                                  for r in h), []).append(label)
    assert list(ties(runs).values()) == list(expected.values()) == [["a", "b", "d"], ["c", "e"], ["f"], ["g"]]
    saved = _captured(monkeypatch)
    plot_compare(str(tmp_path / "compare.png"), runs, "t")
    fig = saved["compare.png"]
    assert sorted(set(_legend_texts(fig))) == ["a = b, d", "c = e", "f", "g"]
    rounds = np.arange(4)
    assert len(fig.axes[0].get_lines()) == 4  # accuracy against rounds: one line per distinct run
    assert _curve(fig, rounds, 0.1 + 0.2 * rounds) is not None
    assert sorted(set(_legend_texts(saved["compare_metrics.png"]))) == list("abcdefg")


def test_a_sweeps_lines_take_a_colour_per_value_of_its_first_key(tmp_path, monkeypatch):
    """A sweep's groups (its first key's values) each have one colour, different groups different colours, and
    the lines within a group differ in line style and every line in marker."""
    groups = {"lr=0.1,mu=0": "lr = 0.1", "lr=0.1,mu=1": "lr = 0.1", "lr=0.1,mu=2": "lr = 0.1",
              "lr=0.3,mu=0": "lr = 0.3", "lr=0.3,mu=1": "lr = 0.3", "lr=1,mu=0": "lr = 1"}
    runs = {label: [_history(10.0 ** i)] for i, label in enumerate(groups)}
    saved = _captured(monkeypatch)
    plot_compare(str(tmp_path / "sweep.png"), runs, "t", groups=groups, colour_groups=True)
    fig = saved["sweep.png"]
    drawn = {line.get_label(): line for line in fig.axes[0].get_lines()}
    assert set(drawn) == set(groups)
    colours = {}
    for label, group in groups.items():
        colours.setdefault(group, set()).add(drawn[label].get_color())
    assert all(len(c) == 1 for c in colours.values()) and len(set.union(*colours.values())) == len(colours)
    for group in set(groups.values()):
        members = [drawn[k] for k, g in groups.items() if g == group]
        assert len({line.get_linestyle() for line in members}) == len(members)
    assert len({line.get_marker() for line in drawn.values()}) == len(drawn)


def test_epsilon_is_labelled_with_the_runs_delta(tmp_path, monkeypatch):
    """Papers report (ε, δ): the ε panel of a private run's metrics names its δ; the δ the runs share, none when
    they differ or none is private."""
    from types import SimpleNamespace

    from fljax.runner.run_plots import shared_delta

    def run(delta):
        return SimpleNamespace(privacy=None if delta is None else SimpleNamespace(plan=SimpleNamespace(delta=delta)))

    assert shared_delta([run(0.0135), run(None), run(0.0135)]) == 0.0135
    assert shared_delta([run(0.0135), run(1e-5)]) is None and shared_delta([run(None)]) is None
    history = _history(1e3)
    for i, r in enumerate(history):
        r["epsilon"] = 0.5 * i
    saved = _captured(monkeypatch)
    plot_run(str(tmp_path), [history], [], "dp", ("png",), delta=0.0135)
    labels = [ax.get_ylabel() for ax in saved["metrics.png"].axes]
    assert "privacy loss ε\n(at δ = 0.0135)" in labels
