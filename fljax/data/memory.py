"""The host's memory, and refusing data that would not fit in it before it is allocated.

Every size a config, a command-line flag or a data file can set (a sequence length, a vocabulary, samples per
client, the rows a padded client array gets, a shape declared in a client's ``.npz``) reaches an allocation. Each
such allocation is preceded by an estimate of its bytes from the numbers alone, and :func:`check_bytes` refuses,
in one line naming the key and the bytes, what exceeds :func:`host_memory` — instead of the kernel killing the
process (exit 137, no message) or NumPy's ``_ArrayMemoryError`` traceback once the allocation fails.

The limit is the machine's memory as this process may use it: the physical memory, or less where a limit says so —
the address-space limit (``ulimit -v``, ``prlimit --as``) and the cgroup's memory limit (``memory.max``, a
container's). An estimate counts what is held at once at the allocation's peak (for example the per-client pieces
and their concatenation), so it is a floor of the real peak, not a bound: what passes can still fail later for
other reasons, but what is refused could never have been built.
"""
from __future__ import annotations

import os
import resource

from fljax.data.types import DataError

__all__ = ["host_memory", "check_bytes", "size_text", "sizes_apart"]


def _cgroup_limit() -> int | None:
    """The cgroup v2 memory limit of this process (``memory.max``), None where there is none or it is unreadable."""
    try:
        with open("/proc/self/cgroup") as f:
            path = next((line.strip().split(":", 2)[2] for line in f if line.startswith("0::")), None)
        if path is None:
            return None
        with open(os.path.join("/sys/fs/cgroup", path.lstrip("/"), "memory.max")) as f:
            value = f.read().strip()
    except (OSError, IndexError):
        return None
    return int(value) if value.isdigit() else None


def host_memory() -> tuple[str, int]:
    """(what, bytes) of the memory this process may use: the machine's physical memory, or the smaller of the
    address-space limit (``ulimit -v``) and the cgroup's ``memory.max`` where they are set."""
    limits = [("this machine", os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))]
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        limits.append(("this process's address-space limit (ulimit -v)", soft))
    cgroup = _cgroup_limit()
    if cgroup is not None:
        limits.append(("this cgroup's memory limit (memory.max)", cgroup))
    return min(limits, key=lambda item: item[1])


def size_text(n: float) -> str:
    """``n`` bytes as a message gives them: '13.4 TiB', '512.0 MiB', '200 bytes'."""
    if not n < float("inf"):
        return "more bytes than any machine has"
    if n >= 2 ** 60:
        return f"{n / 2 ** 40:.3g} TiB"
    for unit, size in (("TiB", 2 ** 40), ("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n:,.0f} bytes" if n >= 1 or n == 0 else f"{n:.2g} bytes"


def sizes_apart(need: float, have: float) -> tuple[str, str]:
    """:func:`size_text` of both, or of both in bytes where they would read the same (a message never says it
    needs '0.0 GiB', more than '0.0 GiB')."""
    a, b = size_text(need), size_text(have)
    return (a, b) if a != b or not need < float("inf") else (f"{need:,.0f} bytes", f"{have:,.0f} bytes")


def check_bytes(nbytes: float, advice: str, what: str) -> None:
    """Refuse (a one-line :class:`~fljax.data.types.DataError`) building ``what`` when its estimated ``nbytes``
    exceed :func:`host_memory`; ``advice`` names the settings that make it that large (``lower data.seq_len``)."""
    where, have = host_memory()
    if nbytes > have:
        need, has = sizes_apart(nbytes, have)
        raise DataError(f"{what} would take {need}, more than the {has} of {where}; {advice}.")
