"""The data layer's own errors (the engine's :class:`rlkit.training.errors.EnvFaultError` and
:class:`rlkit.training.errors.ActorLostError` wrap them with what became of the checkpoints;
collectors know no engine)."""

from __future__ import annotations

from rlkit.envs.errors import EnvFault

__all__ = ["ActorLost", "EnvFault"]


class ActorLost(RuntimeError):
    """A collector worker process died or hung once more than its collector's restart limit
    allows (:class:`~rlkit.data.async_collect.WorkerCollector`, ``max_restarts``). The message
    names the worker, why it was lost and the limit."""
