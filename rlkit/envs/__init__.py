"""Environments: gymnasium ids -> batched, truncation-correct TorchRL envs."""

from rlkit.envs.make import get_obs_norm, get_reward_norm, make_env, make_eval_env

__all__ = ["get_obs_norm", "get_reward_norm", "make_env", "make_eval_env"]
