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
all-reduce of the flag after every batch) and all stop at the same one.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType

#: the signals that ask a run to stop
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequest:
    """A context manager that turns SIGINT and SIGTERM into a request checked between
    batches; the handlers it replaced are restored on exit.

    ``notify`` is called once, from the handler, with a line for the person watching.
    Outside the main thread (where Python cannot install handlers) it does nothing and
    :attr:`signum` stays ``None``.
    """

    def __init__(self, notify: Callable[[str], None] = print) -> None:
        self.notify = notify
        #: the first stop signal received, or None
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:  # asked twice: stop now
            raise KeyboardInterrupt(
                f"{signal.Signals(signum).name} received twice: stopped at once, the last "
                "checkpoint written is kept"
            )
        self.signum = signum
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
