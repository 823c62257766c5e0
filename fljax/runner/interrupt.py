"""Stopping runs cleanly on Ctrl-C (SIGINT) and SIGTERM (how ``kill`` and job schedulers stop a job).

Within :func:`graceful` the first of these signals only asks the runs to stop: the run loop finishes the block of
rounds it is in, checkpoints every running run there, writes their status ('interrupted' in ``summary.json``) and
:class:`Interrupted` is raised; ``fljax`` then exits with 128 + the signal number (130 for SIGINT, 143 for SIGTERM).
A second signal raises :class:`Interrupted` at once (the last checkpoint written is the resume point). A signal that
arrives after the run loop's last look at the request (while the checkpointers are closed, say) is not lost: leaving
:func:`graceful` raises :class:`Interrupted` for it. Outside the main thread, where Python cannot handle signals,
nothing is installed and the signals keep their usual effect.
"""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Callable

__all__ = ["Interrupted", "StopRequest", "graceful", "SIGNALS"]

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """The run was stopped by signal ``signum``; ``exit_status`` is the shell's convention, 128 + ``signum``."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


class StopRequest:
    """Whether a stop was asked for (``signum``: the first signal received, else None)."""

    def __init__(self):
        self.signum: int | None = None

    def __bool__(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str | None:
        return None if self.signum is None else signal.Signals(self.signum).name

    def check(self) -> None:
        """Raise :class:`Interrupted` if a stop was asked for."""
        if self.signum is not None:
            raise Interrupted(self.signum)

    def agreed(self) -> bool:
        """Whether a stop was asked for — in this process, or (on several processes) in any process of the group,
        which then all stop after the same block (:func:`fljax.engine.processes.agree`; the request is recorded
        here too)."""
        from fljax.engine.processes import agree

        signum = agree(self.signum or 0)
        if signum and not self:
            self.signum = signum
        return bool(signum)


@contextlib.contextmanager
def graceful(warn: Callable[[str], None]):
    """Handle SIGINT and SIGTERM as above for the duration of the ``with`` block, which receives the
    :class:`StopRequest`; ``warn`` tells the person what is happening. The previous handlers are restored after,
    and a block that ends normally with a stop requested raises :class:`Interrupted` (a signal received anywhere in
    the block is honoured, also one the block did not look for)."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return

    def handler(signum, frame):
        if request:
            raise Interrupted(signum)
        request.signum = signum
        warn(f"{signal.Signals(signum).name}: stopping after the current block of rounds (checkpoint and status); "
             f"send it again to stop at once")

    previous = {s: signal.getsignal(s) for s in SIGNALS}
    for s in SIGNALS:
        signal.signal(s, handler)
    try:
        yield request
    finally:
        for s, h in previous.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
    request.check()
