"""Stopping a run on request (Ctrl-C, ``kill``, a cluster's pre-emption notice) without losing it.

The first SIGINT or SIGTERM only sets a flag: the engine finishes the update under way,
writes ``checkpoints/last.pt`` at that batch boundary, shuts its collectors down and raises
:class:`~rlkit.training.errors.RunInterrupted`; the command line then exits with status
``128 + signal`` (130 for SIGINT, 143 for SIGTERM) after one line that says how to continue
(``--resume last``). A second signal stops at once (``KeyboardInterrupt``), keeping the last
checkpoint written.

Without this, SIGTERM ended a run where it stood: nothing since the last periodic
checkpoint was kept, and an asynchronous IMPALA run's worker queues were never released
(Python's resource tracker then warned of 16 leaked semaphores at exit).

On several ranks each rank may see the signal at a different batch, so they agree (an
all-reduce of the flag after every batch) and all stop at the same one. Under the spawning
strategies (``ddp_spawn``, ``ddp_fork``, ``ddp_notebook``) the launching process is not a rank:
it passes the signal on to the ranks and waits for them (:class:`ForwardStop`).

One request can reach a process twice: a terminal's Ctrl-C goes to every process of the job,
and a launcher passes it on as well. A repeat of the signal within :data:`SAME_REQUEST_S`
seconds of the first is therefore the same request; a later one stops at once.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

#: the signals that ask a run to stop
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: a repeat of the first signal this soon after it is the same request (see the module text)
SAME_REQUEST_S = 1.0


class _Handlers:
    """Installs :meth:`_handle` for SIGINT and SIGTERM on entry and restores the handlers it
    replaced on exit; outside the main thread (where Python cannot install handlers) it does
    nothing."""

    def __init__(self) -> None:
        self._previous: dict[int, object] = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        raise NotImplementedError


class StopRequest(_Handlers):
    """A context manager that turns SIGINT and SIGTERM into a request checked between
    batches; the handlers it replaced are restored on exit.

    ``notify`` is called once, from the handler, with a line for the person watching.
    Outside the main thread (where Python cannot install handlers) it does nothing and
    :attr:`signum` stays ``None``.
    """

    def __init__(self, notify: Callable[[str], None] = print) -> None:
        super().__init__()
        self.notify = notify
        #: the first stop signal received, or None
        self.signum: int | None = None
        self._first_at = 0.0

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:  # asked twice: stop now, unless it is the same request
            if signum == self.signum and time.monotonic() - self._first_at < SAME_REQUEST_S:
                return
            raise KeyboardInterrupt(
                f"{signal.Signals(signum).name} received twice: stopped at once, the last "
                "checkpoint written is kept"
            )
        self.signum, self._first_at = signum, time.monotonic()
        self.notify(
            f"{signal.Signals(signum).name} received: stopping after this update and writing a "
            "checkpoint (send it again to stop at once)"
        )

    def agreed(self, fabric) -> int:
        """The stop signal this rank or any other received (the largest number on several
        ranks), or 0. Every rank must call it after the same batch: on several ranks it is
        a collective."""
        mine = self.signum or 0
        if fabric.world_size == 1:
            return mine
        import torch

        flag = torch.tensor(float(mine), device=fabric.device)
        return int(fabric.all_reduce(flag, reduce_op="max"))


class ForwardStop(_Handlers):
    """A context manager for a process that launched the ranks and waits for them: SIGINT
    and SIGTERM are passed on to its live child processes (which stop as
    :class:`StopRequest` says) instead of ending this one, so the ranks can checkpoint and
    report. The handlers it replaced are restored on exit; outside the main thread it does
    nothing."""

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        children = [c for c in multiprocessing.active_children() if c.pid is not None]
        if not children:  # nobody to pass it to: stop this process, as without the handler
            raise KeyboardInterrupt(f"{signal.Signals(signum).name} received")
        for child in children:
            with contextlib.suppress(ProcessLookupError):  # it has just ended
                os.kill(child.pid, signum)


# --------------------------------------------------------------------------- lost ranks


class RankWatch:
    """Names a rank of a multi-process run that ended under the others (killed, crashed).

    Without it, a rank killed by SIGKILL ended the others with a gloo ``Connection reset by
    peer`` traceback, or (on rank 0 under ``--strategy ddp``) with Lightning's watchdog
    killing rank 0 itself within 5 s (exit 137, a line naming a pid). Every rank records the
    host and pid of every rank at start (:meth:`start`, a collective); when a rank's
    collective fails, :meth:`lost` names the ranks whose process is gone, and Lightning's
    watchdog on rank 0 reports through :meth:`report` instead of its own line. One line is
    printed per process, whichever of the two sees the loss first.
    """

    def __init__(self) -> None:
        self.peers: list[tuple[str, int]] = []  # (host, pid) per rank
        self.rank = 0
        self.where: Callable[[], str] = _no_checkpoint_yet
        self._claimed = False
        self._lock = threading.Lock()
        self._children: dict[int, Any] = {}  # pid: Popen of the ranks rank 0 started

    def __getstate__(self) -> dict:
        """``--strategy ddp_spawn`` pickles the engine for its ranks: the lock, the watched
        children and the checkpoint reporter stay in the launching process."""
        state = dict(self.__dict__)
        state.update(where=_no_checkpoint_yet, _lock=None, _children={})
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def start(self, rank: int, world_size: int) -> None:
        import socket

        import torch.distributed as dist

        self.rank = rank
        self.peers = [("", 0)] * world_size
        dist.all_gather_object(self.peers, (socket.gethostname(), os.getpid()))
        self._hook_watchdog()

    def _hook_watchdog(self) -> None:
        """Lightning's watchdog of the ranks rank 0 started (``--strategy ddp``) kills rank 0
        when one ends; it reports here first (one line, exit status 3)."""
        for thread in threading.enumerate():
            if type(thread).__name__ == "_ChildProcessObserver":
                children = thread._child_processes
                self._children = {child.pid: child for child in children}

                def stop_all(children=children) -> None:
                    lost = [(i + 1, p.pid, p.returncode) for i, p in enumerate(children)]
                    lost = [entry for entry in lost if entry[2]]
                    if self.claim():
                        line = self.message([(r, pid, _how(code)) for r, pid, code in lost])
                        print(f"error: {line}", file=sys.stderr, flush=True)
                        for child in children:
                            with contextlib.suppress(OSError):
                                child.kill()
                        os._exit(3)
                    # the main thread is reporting it: it ends the process

                thread._terminate_all = stop_all

    def claim(self) -> bool:
        """True for the first caller only (the one that reports the loss)."""
        with self._lock:
            claimed, self._claimed = self._claimed, True
            return not claimed

    def lost(self, *, wait_s: float = 2.0) -> list[tuple[int, int, str]]:
        """The ranks (rank, pid, how) on this host whose process is gone, waiting up to
        ``wait_s`` for one to be (a process killed a moment ago may still be closing)."""
        import socket

        host = socket.gethostname()
        deadline = time.monotonic() + wait_s
        while True:
            gone = [
                (r, pid, self._how(pid))
                for r, (h, pid) in enumerate(self.peers)
                if r != self.rank and h == host and not _alive(pid)
            ]
            if gone or time.monotonic() >= deadline:
                return gone
            time.sleep(0.1)

    def _how(self, pid: int) -> str:
        child = self._children.get(pid)
        code = child.poll() if child is not None else None
        return "its process is gone" if code is None else _how(code)

    def message(self, lost: list[tuple[int, int, str]]) -> str:
        named = ", ".join(f"rank {r} (pid {pid}) ended: {how}" for r, pid, how in lost)
        return (
            f"{named or 'another rank ended'}; the other ranks stopped: training stopped, "
            f"{self.where()}"
        )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a child not reaped yet is a zombie
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _how(code: int | None) -> str:
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"


def _no_checkpoint_yet() -> str:
    return "no checkpoint had been written yet"
