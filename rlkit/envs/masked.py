"""A small masked-action task, registered on ``import rlkit.envs``: ``rlkit/MaskedPick-v0``.

Each step offers ``n_actions`` items (8 by default), each with a value drawn uniformly from
``[0, 1]``, and a random subset of them may be picked: ``n_valid`` of them (half by default;
``n_valid=None`` draws how many, from 1 to ``n_actions``, at every step). The observation is
the PettingZoo / gymnasium convention for masked actions::

    {"observation": float32 [n_actions]  (the values),
     "action_mask": int8 [n_actions]      (1 where the action may be taken)}

Picking a valid item earns its value; picking an invalid one **ends the episode** with reward
``invalid_reward`` (-1 by default), as an illegal move ends a game. Episodes last 20 steps
(``max_episode_steps``, a truncation).

The mask is not part of ``"observation"``: a policy that does not read ``"action_mask"`` cannot
tell which items are on offer, and with half of them invalid loses the episode on about one
step in two (a return near 1), while a policy restricted to the valid actions scores 10 by
picking at random and 16 (the mean of the best of 4 uniform values, 0.8, times 20 steps) by
picking the best item. ``docs/actions.md`` trains PPO and DQN on it.

Example:
    >>> import gymnasium, rlkit.envs
    >>> env = gymnasium.make("rlkit/MaskedPick-v0")
    >>> obs, _ = env.reset(seed=0)
    >>> sorted(obs), obs["action_mask"].sum()
    (['action_mask', 'observation'], np.int64(4))
"""

from __future__ import annotations

import gymnasium
import numpy as np
from gymnasium import spaces

__all__ = ["MaskedPickEnv"]

#: the Dict observation entry PettingZoo and gymnasium envs put their action mask under
MASK_ENTRY = "action_mask"


class MaskedPickEnv(gymnasium.Env):
    """Pick the most valuable of the items on offer; an item not on offer ends the episode.

    Args:
        n_actions: items (and actions) per step, >= 2.
        n_valid: items on offer per step, 1 to ``n_actions``; None: a random count at every
            step (1 to ``n_actions``, uniformly).
        invalid_reward: the reward of an invalid pick, which ends the episode.
        expose_mask: ``False`` hides the mask: the observation is the values alone (a flat
            ``Box``), the same task for a policy that cannot read the mask (the control runs
            of ``tests/test_masks_learning.py``).
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        n_actions: int = 8,
        n_valid: int | None = None,
        invalid_reward: float = -1.0,
        expose_mask: bool = True,
    ) -> None:
        if n_actions < 2:
            raise ValueError(f"n_actions must be >= 2, got {n_actions}")
        if n_valid is not None and not 1 <= n_valid <= n_actions:
            raise ValueError(f"n_valid must lie in [1, {n_actions}] or be None, got {n_valid}")
        self.n_actions, self.n_valid = n_actions, n_valid
        self.invalid_reward = float(invalid_reward)
        self.expose_mask = bool(expose_mask)
        values = spaces.Box(0.0, 1.0, (n_actions,), np.float32)
        self.observation_space = (
            spaces.Dict(
                {"observation": values, MASK_ENTRY: spaces.Box(0, 1, (n_actions,), np.int8)}
            )
            if self.expose_mask
            else values
        )
        self.action_space = spaces.Discrete(n_actions)
        self._values = np.zeros(n_actions, np.float32)
        self._mask = np.ones(n_actions, np.int8)

    def _draw(self) -> dict[str, np.ndarray] | np.ndarray:
        rng, n = self.np_random, self.n_actions
        self._values = rng.random(n, dtype=np.float32)
        count = self.n_valid if self.n_valid is not None else int(rng.integers(1, n + 1))
        self._mask = np.zeros(n, np.int8)
        self._mask[rng.permutation(n)[:count]] = 1
        if not self.expose_mask:
            return self._values.copy()
        return {"observation": self._values.copy(), MASK_ENTRY: self._mask.copy()}

    def reset(self, *, seed: int | None = None, options=None):
        super().reset(seed=seed)
        return self._draw(), {}

    def step(self, action):
        a = int(action)
        valid = bool(self._mask[a])
        reward = float(self._values[a]) if valid else self.invalid_reward
        return self._draw(), reward, not valid, False, {"invalid": not valid}


def _register() -> None:
    if "rlkit/MaskedPick-v0" not in gymnasium.registry:
        gymnasium.register(
            id="rlkit/MaskedPick-v0",
            entry_point=MaskedPickEnv,
            max_episode_steps=20,
            kwargs={"n_actions": 8, "n_valid": 4},
        )


_register()
