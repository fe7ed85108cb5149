"""Environments: gymnasium ids, gymnasium's ``module:Env-vN`` and env factories -> batched,
truncation-correct TorchRL envs.

Importing this package also registers rlkit's own gymnasium ids (:mod:`rlkit.envs.sparse`,
:mod:`rlkit.envs.masked`, :mod:`rlkit.envs.structured`);
MinAtar and ALE ids are registered on first use (:mod:`rlkit.envs.suites`). The env builders
(:mod:`rlkit.envs.make`, which imports torch and TorchRL) load on first access, so the
config layer reads what ``--env`` names (:mod:`rlkit.envs.ids`) without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from rlkit.envs import (
    masked,  # noqa: F401  (registers rlkit/MaskedPick-v0)
    sparse,  # noqa: F401  (registers rlkit/MountainCarSparse-v0)
    structured,  # noqa: F401  (registers rlkit/MultiPick-v0, rlkit/HybridReach-v0)
)

__all__ = [
    "TruncationAsTermination",
    "check_same_spaces",
    "get_obs_norm",
    "get_reward_norm",
    "make_env",
    "make_eval_env",
    "reseed",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("rlkit.envs.make"), name)
    raise AttributeError(f"module 'rlkit.envs' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
