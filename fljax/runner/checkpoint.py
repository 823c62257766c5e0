"""Checkpoints of a whole run with orbax: the :class:`~fljax.engine.State` pytree (server, clients, round and the
PRNG key) and the :class:`~fljax.engine.RunLog` (the evaluation records so far, cumulative communication, time).

One checkpoint per saved round under ``<run dir>/checkpoints/<round>/``; orbax writes each into a temporary
directory and renames it when complete, so a crash never leaves a half-written checkpoint that a resume would
read (the temporary directories of a crashed save are removed when the run directory is next opened). Saves are
asynchronous (the next rounds run while the files are written). The last ``max_to_keep`` are kept. A checkpoint
damaged afterwards (a disk error, a file changed by hand) is not trusted: :meth:`Checkpointer.restore_newest` falls
back to the newest one that reads, moving the damaged ones aside.

When: ``checkpoint_every: K`` saves every K rounds (the blocks of rounds end there too); the default (``null``)
saves at an evaluation when :data:`CHECKPOINT_SECONDS` have passed since the last save, and after the last round,
so short runs pay for one save and a long run loses at most a minute of work. Either way checkpoints sit on block
boundaries of the same schedule, so a resumed run repeats the uninterrupted one bit for bit.
"""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import sys
import time
from typing import Callable

import jax

from fljax.engine import RunLog, State
from fljax.engine.store import StoredClients

__all__ = ["Checkpointer", "CheckpointTimer", "CheckpointError", "CHECKPOINT_SECONDS"]

CHECKPOINT_SECONDS = 60.0


class CheckpointError(OSError):
    """A checkpoint could not be written (a full disk, a read-only or vanished directory): one line naming the
    round, the directory and the cause; the checkpoints written before it are intact (orbax commits a checkpoint by
    renaming its temporary directory once complete)."""


# tensorstore, which writes orbax's arrays, reports an operating-system error as a ValueError without errno, cause
# or context, its status naming the error number only in its text (tensorstore 0.1.86 under orbax-checkpoint 0.12.8:
# 'OUT_OF_RANGE: Error writing "a/0" in OCDBT database ...: Failed to write 349950 bytes to file 11: File too large
# [os_error_code='27']'); orbax's own file operations raise OSErrors with an errno.
_TENSORSTORE_ERRNO = re.compile(r"\[os_error_code='(\d+)'\]")
_HINTS = {errno.EFBIG: " (the file-size limit, ulimit -f)"}


def _errno(e: BaseException) -> int | None:
    """The operating-system error number behind ``e``: the first :class:`OSError` with one along its chain of causes
    and contexts, else the number in a tensorstore status (see above); None when there is none."""
    chain, seen = [], set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        chain.append(e)
        e = e.__cause__ or e.__context__
    for link in chain:
        if isinstance(link, OSError) and link.errno is not None:
            return link.errno
    for link in chain:
        if match := _TENSORSTORE_ERRNO.search(str(link)):
            return int(match.group(1))
    return None


def _cause(e: BaseException) -> str:
    """Why a checkpoint write failed, in a few words: the operating system's own (``no space left on device``,
    ``disk quota exceeded``, ``read-only file system``, ``permission denied``, ``file too large …``), else the first
    line of the error."""
    number = _errno(e)
    if number is not None:
        return os.strerror(number).lower() + _HINTS.get(number, "")
    return ((str(e).strip().splitlines() or [type(e).__name__])[0])[:160]


_QUIET = {"installed": False}


def _orbax_quiet() -> None:
    """Keep orbax's and tensorstore's own reports off the terminal (once per process; ``FLJAX_DEBUG=1`` keeps
    them): orbax logs a failed background save or restore with its traceback (absl ``ERROR`` records), and after a
    failed restore tensorstore's completion callbacks reach an asyncio loop orbax has closed, which Python prints as
    'Event loop is closed' tracebacks. Each failure that matters reaches fljax as an exception —
    :class:`CheckpointError` for a save, the fallback of :meth:`Checkpointer.restore_newest` for a restore — and is
    reported there in one line."""
    if _QUIET["installed"] or os.environ.get("FLJAX_DEBUG"):
        return
    _QUIET["installed"] = True
    logging.getLogger("absl").addFilter(lambda record: f"{os.sep}orbax{os.sep}" not in record.pathname)
    previous = sys.unraisablehook

    def unraisable(args):
        if isinstance(args.exc_value, RuntimeError) and str(args.exc_value) == "Event loop is closed":
            return  # a late tensorstore callback of an abandoned (failed) restore: nothing is lost
        previous(args)

    sys.unraisablehook = unraisable


class Checkpointer:
    """Save and restore (state, log) pairs in ``directory``; ``with Checkpointer(d) as c:`` waits for pending
    saves on exit."""

    def __init__(self, directory: str, max_to_keep: int = 2):
        import orbax.checkpoint as ocp

        _orbax_quiet()
        self._ocp = ocp
        self.directory = os.path.abspath(directory)
        # only this process takes part (on several processes, process 0 alone checkpoints: fljax.engine.processes)
        alone = ocp.options.MultiprocessingOptions(primary_host=jax.process_index(),
                                                   active_processes={jax.process_index()})
        os.makedirs(self.directory, exist_ok=True)  # orbax creates no folder for a subset of the processes
        options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, enable_async_checkpointing=True,
                                               create=False, cleanup_tmp_directories=True,
                                               multiprocessing_options=alone)
        self._manager = ocp.CheckpointManager(self.directory, options=options)
        self._saved: int | None = None

    @contextlib.contextmanager
    def _writing(self, round_: int | None):
        """Turn a failed write — of ``round_`` or of the asynchronous save still pending — into one
        :class:`CheckpointError` line."""
        try:
            yield
        except CheckpointError:
            raise
        except Exception as e:  # noqa: BLE001 - whatever orbax or tensorstore raise, the checkpoint is not on disk
            failed = self._saved if self._saved is not None else round_
            try:
                kept = [r for r in self.rounds() if failed is None or r < failed]
            except Exception:  # noqa: BLE001 - the directory itself is gone or unreadable
                kept = []
            raise CheckpointError(f"could not write the checkpoint of round {failed} into {self.directory}: "
                                  f"{_cause(e)}; "
                                  + (f"the last checkpoint (round {max(kept)}) is intact: make room and continue with "
                                     f"--resume" if kept else "no earlier checkpoint: make room and start again")
                                  + ".") from None

    def save(self, state: State, log: RunLog) -> None:
        """Checkpoint after round ``state.round`` (asynchronous; a pending save finishes first). Saving the round
        this checkpointer saved last again does nothing. A client-state store (:mod:`fljax.engine.store`) is
        flushed first and saves what it keeps in a checkpoint (a host store its rows, a disk store nothing: its
        journals return it to this round)."""
        round_ = int(state.round)
        if round_ == self._saved:
            return
        args = self._ocp.args
        with self._writing(round_):
            self._manager.wait_until_finished()  # the pending save's failure is reported as its own round's
            if isinstance(state.clients, StoredClients):
                store = state.clients.store
                if self.rounds():
                    store.forget_before(min(self.rounds()))  # no older checkpoint is left to return to
                store.commit(round_)
                state = state.replace(clients=store.checkpoint_tree())
            self._saved = round_
            self._manager.save(round_, args=args.Composite(state=args.StandardSave(jax.device_get(state)),
                                                           log=args.JsonSave(log.to_json())), force=True)

    def rounds(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def latest_round(self) -> int | None:
        return self._manager.latest_step()

    def restore(self, template: State | None = None, round_: int | None = None) -> tuple[State, RunLog]:
        """The (state, log) saved after ``round_`` (default: the latest). ``template`` (a state or its
        ``jax.eval_shape``) gives the pytree structure, shapes and dtypes; without it the state comes back as
        nested dicts of arrays (enough to inspect a checkpoint without building the simulation)."""
        round_ = self.latest_round() if round_ is None else round_
        if round_ is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        args = self._ocp.args
        store = template.clients.store if template is not None and isinstance(template.clients,
                                                                                StoredClients) else None
        if store is not None:  # what the store saved in the checkpoint
            template = template.replace(clients=store.checkpoint_tree())
        abstract = None if template is None else jax.tree.map(self._ocp.utils.to_shape_dtype_struct, template)
        out = self._manager.restore(round_, args=args.Composite(state=args.StandardRestore(abstract),
                                                                log=args.JsonRestore()))
        state = out.state
        if store is not None:  # the store returned to this round (a disk store's journals applied)
            store.restore(round_, state.clients)
            state = state.replace(clients=StoredClients(store))
        return state, RunLog.from_json(out.log)

    def restore_newest(self, template: State | None = None, warn: Callable[[str], None] = print,
                       at_most: int | None = None) -> tuple[State, RunLog] | None:
        """The newest checkpoint that can be read (of a round <= ``at_most``, when given), or None when none can
        (then nothing is moved). Each newer one that cannot be read is renamed ``<round>.unreadable`` (kept for
        inspection, no longer a checkpoint) and reported by ``warn`` in one line."""
        rounds = sorted((r for r in self.rounds() if at_most is None or r <= at_most), reverse=True)
        failures = []
        for round_ in rounds:
            try:
                restored = self.restore(template, round_)
            except Exception as e:  # noqa: BLE001 - whatever fails while reading, the checkpoint is unusable
                failures.append((round_, (str(e).strip().splitlines() or [type(e).__name__])[0][:160]))
                continue
            for bad, why in failures:
                os.rename(os.path.join(self.directory, str(bad)), os.path.join(self.directory, f"{bad}.unreadable"))
                warn(f"the checkpoint of round {bad} in {self.directory} cannot be read ({why}); moved it to "
                     f"{bad}.unreadable and resumed from round {round_}")
            return restored
        return None

    def delete_after(self, round_: int) -> None:
        """Delete the checkpoints of rounds after ``round_`` (a run continued from ``round_`` saves them again)."""
        for later in self.rounds():
            if later > round_:
                self._manager.delete(later)

    def wait(self) -> None:
        with self._writing(None):
            self._manager.wait_until_finished()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            with contextlib.suppress(Exception):  # noqa: BLE001 - a failed save is reported by wait() above
                self._manager.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class CheckpointTimer:
    """The default policy: is a checkpoint due at this evaluation? True when ``seconds`` have passed since the last
    one (then the clock restarts). Asked again for the same round (the other seeds of a sweep), it gives the same
    answer, so seeds that run together checkpoint together."""

    def __init__(self, seconds: float = CHECKPOINT_SECONDS, clock: Callable[[], float] = time.monotonic):
        self.seconds, self.clock = seconds, clock
        self.last = clock()
        self._round, self._due = None, False

    def due(self, round_: int) -> bool:
        if round_ != self._round:
            now = self.clock()
            self._round, self._due = round_, now - self.last >= self.seconds
            if self._due:
                self.last = now
        return self._due
