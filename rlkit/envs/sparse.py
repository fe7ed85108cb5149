"""Sparse-reward variants of gymnasium tasks, registered on ``import rlkit.envs``.

``rlkit/MountainCarSparse-v0``: MountainCar-v0's dynamics, observations, actions, start
states and 200-step limit, but the reward is **1 on the step that reaches the goal and 0 on
every other step**. MountainCar-v0's own reward (-1 per step) is not sparse in the sense that
matters for exploration: with a value function that starts near 0, every state the agent has
visited less looks better than the ones it has learned to be costly, which is optimism in the
face of uncertainty, and PPO with reward scaling solves MountainCar-v0 through it alone
(``benchmarks/results/learning_ppo_MountainCar-v0.md``). With 0/1 rewards nothing but reaching
the goal carries information, the setting exploration bonuses such as RND are meant for.

Train on the sparse task and score the policy on MountainCar-v0's return (-steps to the goal)
with ``--eval-env``::

    python recipes/rnd.py --env rlkit/MountainCarSparse-v0 --eval-env MountainCar-v0
"""

from __future__ import annotations

import gymnasium
from gymnasium.envs.classic_control.mountain_car import MountainCarEnv

__all__ = ["MountainCarSparseEnv"]


class MountainCarSparseEnv(MountainCarEnv):
    """MountainCar with reward 1 on reaching the goal and 0 otherwise."""

    def step(self, action: int):
        obs, _, terminated, truncated, info = super().step(action)
        return obs, 1.0 if terminated else 0.0, terminated, truncated, info


def _register() -> None:
    if "rlkit/MountainCarSparse-v0" not in gymnasium.registry:
        gymnasium.register(
            id="rlkit/MountainCarSparse-v0",
            entry_point=MountainCarSparseEnv,
            max_episode_steps=200,
            reward_threshold=0.9,
        )


_register()
