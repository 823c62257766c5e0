"""Evaluation histories as pandas DataFrames: one row per evaluation, one column per metric (``round`` first),
with label columns (``run``, ``seed``) in front when given. pandas is imported on first use: it comes with the
``explore`` extra (``pip install 'fljax[explore]'``)."""
from __future__ import annotations

__all__ = ["pandas", "history_frame", "concat", "headline"]

HEADLINE = ("personal_acc", "global_acc")


def pandas():
    """The pandas module, or a one-line error saying how to get it."""
    try:
        import pandas as pd
    except ImportError:
        raise ImportError("results as DataFrames need pandas: pip install 'fljax[explore]' (or pip install "
                          "pandas).") from None
    return pd


def history_frame(history: list[dict], **labels):
    """The evaluation records of one run as a DataFrame; every ``labels`` item becomes a constant column in
    front (``seed=0`` → a ``seed`` column)."""
    pd = pandas()
    frame = pd.DataFrame.from_records(history)
    for i, (name, value) in enumerate(labels.items()):
        frame.insert(i, name, [value] * len(frame))
    return frame


def concat(frames: list):
    """Frames of several runs stacked, with a fresh 0..n-1 index."""
    pd = pandas()
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def headline(record: dict) -> str:
    """``round=5, personal_acc=0.708, global_acc=0.708``: where a result stands, for its repr."""
    keys = ["round", *(k for k in HEADLINE if k in record)]
    return ", ".join(f"{k}={record[k]}" if k == "round" else f"{k}={record[k]:.4f}" for k in keys if k in record)
