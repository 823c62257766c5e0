"""Atomic file writes: the content goes to a temporary file in the same directory, which then replaces the target
with ``os.replace`` (atomic on POSIX and Windows). A crash at any moment leaves either the old file or the new one,
never a truncated one, and no temporary file behind when the write fails with an exception."""
from __future__ import annotations

import contextlib
import gzip
import json
import os
import uuid
import zlib

from fljax import yaml_io
from fljax.errors import ConfigError

__all__ = ["atomic_path", "write_text", "write_json", "write_jsonl", "write_yaml", "write_png", "write_figure", "read_json",
           "read_jsonl", "read_yaml", "DamagedFile", "WriteError"]


class WriteError(OSError):
    """A file that could not be written (a full disk, a file-size limit, no permission): the message names it."""

    def __str__(self) -> str:
        return self.args[1] if len(self.args) > 1 else super().__str__()


@contextlib.contextmanager
def atomic_path(path: str):
    """Yield a temporary path next to ``path``; on normal exit it replaces ``path``, on an exception it is removed
    (an operating-system error becomes a :class:`WriteError` naming ``path``)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        if isinstance(e, OSError) and not isinstance(e, WriteError):
            reason = (e.strerror or str(e)).lower()
            raise WriteError(e.errno, f"could not write {path}: {reason}; the file as it was before is kept") \
                from None
        raise


def write_text(path: str, text: str) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())


def write_json(path: str, value, indent: int | None = 2) -> None:
    """JSON text; gzip-compressed when ``path`` ends with ``.gz`` (large result files), with neither a file name
    nor a time in its header, so that the same value is written as the same bytes."""
    text = json.dumps(value, indent=indent) + "\n"
    if not str(path).endswith(".gz"):
        return write_text(path, text)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as f:
            f.write(text.encode())  # no name or time in the header: the same value gives the same bytes


def write_jsonl(path: str, records: list[dict]) -> None:
    """One JSON object per line (the whole file is rewritten atomically)."""
    write_text(path, "".join(json.dumps(r) + "\n" for r in records))


def write_yaml(path: str, value) -> None:
    """YAML that :func:`fljax.yaml_io.load` (hence ``--resume``) reads back to the same values."""
    write_text(path, yaml_io.dump(value))


def read_yaml(path: str) -> dict:
    """A YAML mapping fljax wrote (config.yaml, resolved.yaml), read as configs are (:func:`fljax.yaml_io.load`);
    one that does not parse, or is not a mapping, raises :class:`DamagedFile` naming it."""
    import yaml

    try:
        with open(path, "rb") as f:
            value = yaml_io.load(f)
    except FileNotFoundError:
        raise
    except (yaml.YAMLError, ConfigError, *_UNREADABLE) as e:
        raise DamagedFile(path, f"not valid YAML: {(str(e).splitlines() or [type(e).__name__])[0][:120]}") from None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise DamagedFile(path, f"it holds a {type(value).__name__}, not a mapping of keys")
    return value


def write_png(path: str, fig) -> None:
    """Save a matplotlib figure as PNG (110 dpi, tight bounding box)."""
    write_figure(path, fig)


def write_figure(path: str, fig, dpi: int = 110) -> None:
    """Save a matplotlib figure in the format its extension names (.png at ``dpi``, .pdf, .svg; tight bounding
    box), without a creation date: rendering a report again rewrites no figure whose content did not change."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if fig.canvas is None or not hasattr(fig.canvas, "print_png"):
        FigureCanvasAgg(fig)
    fmt = os.path.splitext(path)[1].lstrip(".").lower()
    dateless = {"pdf": {"CreationDate": None}, "svg": {"Date": None}}.get(fmt)  # the same figure, the same bytes
    with atomic_path(path) as tmp, matplotlib.rc_context({"svg.hashsalt": "fljax"}):  # SVG ids: not random
        fig.savefig(tmp, format=fmt, dpi=dpi, bbox_inches="tight", metadata=dateless)


class DamagedFile(ConfigError):
    """A file fljax wrote that no longer reads as it wrote it (changed or cut afterwards: fljax writes whole
    files, :func:`atomic_path`); the message names the file and what is wrong with it."""

    def __init__(self, path: str, why: str):
        super().__init__(f"{path} is damaged ({why}); fljax writes its files whole, so it was changed after the "
                         f"run wrote it: restore it from a copy, or move it away.")
        self.path = path


_UNREADABLE = (ValueError, EOFError, gzip.BadGzipFile, zlib.error)  # JSON and UTF-8 errors are ValueErrors


def _why(e: BaseException) -> str:
    if isinstance(e, json.JSONDecodeError):
        return f"not valid JSON: {e.msg} at line {e.lineno} column {e.colno}"
    if isinstance(e, UnicodeDecodeError):
        return "not text"
    return (str(e).splitlines() or [type(e).__name__])[0][:120]


def read_json(path: str, expect: type | None = None):
    """The JSON value in ``path`` (gzip-compressed when it ends with ``.gz``). A file that does not parse, or (with
    ``expect``) holds another type of value, raises :class:`DamagedFile` naming it; a missing file raises
    FileNotFoundError."""
    try:
        with (gzip.open(path, "rt") if str(path).endswith(".gz") else open(path)) as f:
            value = json.load(f)
    except FileNotFoundError:
        raise
    except _UNREADABLE as e:
        raise DamagedFile(path, _why(e)) from None
    if expect is not None and not isinstance(value, expect):
        raise DamagedFile(path, f"it holds a JSON {type(value).__name__}, not a{'n' if expect is dict else ''} "
                                f"{'object' if expect is dict else expect.__name__}")
    return value


def read_jsonl(path: str) -> list[dict]:
    """One JSON object per line (blank lines skipped); a line that does not parse, or is not an object, raises
    :class:`DamagedFile` naming the file and the line (a file cut in the middle of a line included)."""
    records = []
    try:
        with open(path) as f:
            lines = list(f)
    except FileNotFoundError:
        raise
    except _UNREADABLE as e:
        raise DamagedFile(path, _why(e)) from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as e:
            cut = number == len(lines) and not line.endswith("\n")
            raise DamagedFile(path, f"line {number} is {'cut short' if cut else 'not valid JSON'}: "
                                    f"{getattr(e, 'msg', _why(e))}") from None
        if not isinstance(record, dict):
            raise DamagedFile(path, f"line {number} is a JSON {type(record).__name__}, not an object")
        records.append(record)
    return records
