"""The engine's exception classes, importable without torch.

The command line (:mod:`rlkit.training.cli`) matches them to print one-line errors, and it
must not import torch before its flags are parsed (``--help`` answers at once). Exit status:
2 for a bad input and for a run file that could not be written (:class:`CheckpointWriteError`,
:class:`LogWriteError`), 3 for a run that failed while training (:class:`RunFailedError`:
:class:`NonFiniteError`, :class:`EnvFaultError`, :class:`ActorLostError`,
:class:`RankLostError`). They are
re-exported where they are raised: :class:`CheckpointError` from
:mod:`rlkit.training.checkpoint`, :class:`NonFiniteError` and :class:`CheckpointWriteError`
from :mod:`rlkit.training.engine` (and :class:`CheckpointError` and :class:`NonFiniteError`
from :mod:`rlkit.training`).
"""

from __future__ import annotations


class CheckpointError(ValueError):
    """A checkpoint is missing, corrupt, or does not match the run that loads it."""


class RunFailedError(Exception):
    """A run failed while training (exit status 3); the message is one line and says what
    became of the checkpoints."""


class NonFiniteError(RunFailedError, FloatingPointError):
    """A loss or gradient became NaN or inf; training stopped before any checkpoint.

    ``advice`` is the fix the message ends with (the engine's default: lower the learning rate
    or clip gradients; a loss term that is NaN on its own, without a graph, needs its loss
    fixed instead)."""

    def __init__(self, message: str = "", *, advice: str | None = None) -> None:
        super().__init__(message)
        self.advice = advice


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (disk full, permissions); the previous one is
    intact."""


class LogWriteError(CheckpointWriteError):
    """A log of the run (``metrics.csv``, ``eval.csv``, TensorBoard events) could not be
    written (disk full, permissions); the last checkpoint is intact. A
    :class:`CheckpointWriteError` for the command line: one line, exit status 2."""


class EnvFaultError(RunFailedError):
    """The env failed: its ``step()`` or ``reset()`` raised, or it returned a non-finite
    observation or reward, or an observation of another shape than its spec's. The message
    names the env, the sub-env and the key or exception."""


class ActorLostError(RunFailedError):
    """A collector worker process (IMPALA's, APPO's actors) died or hung after the restarts
    ``--max-actor-restarts`` allows were used; the message names the worker and why."""


class RankLostError(RunFailedError):
    """Another rank of a multi-process run ended (killed, crashed) and the collective
    operations with it failed; the message names the rank."""


class RunInterrupted(KeyboardInterrupt):
    """A run stopped on SIGINT or SIGTERM after writing a checkpoint at a batch boundary
    (:mod:`rlkit.training.signals`); ``--resume last`` continues it."""

    def __init__(self, message: str, *, signum: int, frames: int) -> None:
        super().__init__(message)
        self.signum, self.frames = signum, frames
