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
import threading
import time
from collections.abc import Callable
from types import FrameType

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
