"""The env layer's fault (re-exported by :mod:`rlkit.data.errors`, where the collectors raise
it too): :func:`rlkit.envs.make_env` raises it when an env fails its first, seeded reset."""

from __future__ import annotations

__all__ = ["EnvFault"]


class EnvFault(RuntimeError):
    """The env failed: its ``step()`` or ``reset()`` raised, or it returned a non-finite
    observation or reward, or an observation of another shape than its spec's. The message
    names the env, the sub-env and the key or exception."""
