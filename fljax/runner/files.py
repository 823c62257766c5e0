"""Atomic file writes: the content goes to a temporary file in the same directory, which then replaces the target
with ``os.replace`` (atomic on POSIX and Windows). A crash at any moment leaves either the old file or the new one,
never a truncated one, and no temporary file behind when the write fails with an exception."""
from __future__ import annotations

import contextlib
import gzip
import json
import os
import uuid

from fljax import yaml_io

__all__ = ["atomic_path", "write_text", "write_json", "write_jsonl", "write_yaml", "write_png", "write_figure", "read_json",
           "read_jsonl"]


@contextlib.contextmanager
def atomic_path(path: str):
    """Yield a temporary path next to ``path``; on normal exit it replaces ``path``, on an exception it is removed."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise


def write_text(path: str, text: str) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())


def write_json(path: str, value, indent: int | None = 2) -> None:
    """JSON text; gzip-compressed when ``path`` ends with ``.gz`` (large result files)."""
    text = json.dumps(value, indent=indent) + "\n"
    if not str(path).endswith(".gz"):
        return write_text(path, text)
    with atomic_path(path) as tmp:
        with gzip.open(tmp, "wt") as f:
            f.write(text)


def write_jsonl(path: str, records: list[dict]) -> None:
    """One JSON object per line (the whole file is rewritten atomically)."""
    write_text(path, "".join(json.dumps(r) + "\n" for r in records))


def write_yaml(path: str, value) -> None:
    """YAML that :func:`fljax.yaml_io.load` (hence ``--resume``) reads back to the same values."""
    write_text(path, yaml_io.dump(value))


def write_png(path: str, fig) -> None:
    """Save a matplotlib figure as PNG (110 dpi, tight bounding box)."""
    write_figure(path, fig)


def write_figure(path: str, fig, dpi: int = 110) -> None:
    """Save a matplotlib figure in the format its extension names (.png at ``dpi``, .pdf, .svg; tight bounding
    box)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if fig.canvas is None or not hasattr(fig.canvas, "print_png"):
        FigureCanvasAgg(fig)
    fmt = os.path.splitext(path)[1].lstrip(".").lower()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=fmt, dpi=dpi, bbox_inches="tight")


def read_json(path: str):
    with (gzip.open(path, "rt") if str(path).endswith(".gz") else open(path)) as f:
        return json.load(f)


def read_jsonl(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
