"""The data layer's own error (the engine's :class:`rlkit.training.errors.EnvFaultError` wraps
it with what became of the checkpoints; collectors know no engine)."""

from __future__ import annotations

__all__ = ["EnvFault"]


class EnvFault(RuntimeError):
    """The env failed: its ``step()`` or ``reset()`` raised, or it returned a non-finite
    observation or reward, or an observation of another shape than its spec's. The message
    names the env, the sub-env and the key or exception."""
