"""Environments: gymnasium ids -> batched, truncation-correct TorchRL envs.

Importing this package also registers rlkit's own gymnasium ids (:mod:`rlkit.envs.sparse`);
MinAtar and ALE ids are registered on first use (:mod:`rlkit.envs.suites`).
"""

from rlkit.envs import sparse  # noqa: F401  (registers rlkit/MountainCarSparse-v0)
from rlkit.envs.make import (
    TruncationAsTermination,
    check_same_spaces,
    get_obs_norm,
    get_reward_norm,
    make_env,
    make_eval_env,
    reseed,
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
