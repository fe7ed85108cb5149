"""Two small tasks with structured actions, registered on ``import rlkit.envs``.

``rlkit/MultiPick-v0`` (:class:`MultiPickEnv`), MultiDiscrete actions with a mask: 3 slots,
each offering 4 items with values in ``[0, 1]``, 2 of them on offer (chosen at random). An
action picks one item per slot, ``MultiDiscrete([4, 4, 4])``; the observation is the
PettingZoo / gymnasium convention for masks, here of a MultiDiscrete action::

    {"observation": float32 [12]  (the values, slot by slot),
     "action_mask": int8 [12]     (sum(nvec) flags, slot by slot: 1 where the item is on offer)}

A pick on offer earns its value; one not on offer ends the episode with -1. 10 steps. Random
valid play scores 15 (3 slots x 0.5 x 10), the best valid play 20 (3 x 2/3 x 10, the mean of
the best of 2 uniform values); a policy that ignores the mask loses the episode at the first
step with probability 7/8.

``rlkit/HybridReach-v0`` (:class:`HybridReachEnv`), a parameterised (hybrid) action:
``Dict(kind=Discrete(3), params=Box(-1, 1, (2,)))``. The observation holds 3 values in
``[0, 1]`` and a target point ``t`` in ``[-0.8, 0.8]^2``; the reward is
``value[kind] - ||clip(params) - t||^2``, so both parts count: the best kind with the target
hit scores 7.5 over 10 steps (the mean of the best of 3 uniform values, 0.75, x 10), random
kinds with the target hit 5, the best kind aimed at the centre 3.2 (the mean squared distance
to the target is 0.43), random kinds with Normal(0, 1) aims about -10.

``rlkit/CopyBits-v0`` (:class:`CopyBitsEnv`), MultiBinary actions: the observation is 6 bits
(as floats in ``{-1, 1}``), the action ``MultiBinary(6)``; each bit copied pays 1/6, so a
perfect step pays 1 and 10 steps score 10, random play 5, a policy that copies each bit with
probability 0.9 scores 9.

Example:
    >>> import gymnasium, rlkit.envs
    >>> env = gymnasium.make("rlkit/HybridReach-v0")
    >>> obs, _ = env.reset(seed=0)
    >>> sorted(env.action_space.spaces), obs.shape
    (['kind', 'params'], (5,))
"""

from __future__ import annotations

import gymnasium
import numpy as np
from gymnasium import spaces

__all__ = ["CopyBitsEnv", "HybridReachEnv", "MultiPickEnv"]


class MultiPickEnv(gymnasium.Env):
    """One item per slot, among those on offer (a MultiDiscrete action with a mask).

    Args:
        slots: entries of the MultiDiscrete action.
        items: choices per slot.
        on_offer: items on offer per slot (the rest are masked).
        invalid_reward: the reward of a pick not on offer, which ends the episode.
        expose_mask: ``False`` hides the mask (the observation is the values alone).
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        slots: int = 3,
        items: int = 4,
        on_offer: int = 2,
        invalid_reward: float = -1.0,
        expose_mask: bool = True,
    ) -> None:
        if not 1 <= on_offer <= items:
            raise ValueError(f"on_offer must lie in [1, {items}], got {on_offer}")
        self.slots, self.items, self.on_offer = slots, items, on_offer
        self.invalid_reward, self.expose_mask = float(invalid_reward), bool(expose_mask)
        width = slots * items
        values = spaces.Box(0.0, 1.0, (width,), np.float32)
        self.observation_space = (
            spaces.Dict({"observation": values, "action_mask": spaces.Box(0, 1, (width,), np.int8)})
            if self.expose_mask
            else values
        )
        self.action_space = spaces.MultiDiscrete([items] * slots)
        self._values = np.zeros((slots, items), np.float32)
        self._mask = np.ones((slots, items), np.int8)

    def _draw(self):
        rng = self.np_random
        self._values = rng.random((self.slots, self.items), dtype=np.float32)
        self._mask = np.zeros((self.slots, self.items), np.int8)
        for s in range(self.slots):
            self._mask[s, rng.permutation(self.items)[: self.on_offer]] = 1
        values = self._values.reshape(-1).copy()
        if not self.expose_mask:
            return values
        return {"observation": values, "action_mask": self._mask.reshape(-1).copy()}

    def reset(self, *, seed: int | None = None, options=None):
        super().reset(seed=seed)
        return self._draw(), {}

    def step(self, action):
        picks = np.asarray(action, dtype=np.int64).reshape(self.slots)
        rows = np.arange(self.slots)
        valid = bool(self._mask[rows, picks].all())
        reward = float(self._values[rows, picks].sum()) if valid else self.invalid_reward
        return self._draw(), reward, not valid, False, {"invalid": not valid}


class HybridReachEnv(gymnasium.Env):
    """Choose a kind (its value is the reward) and a point (its squared distance to the
    target is the cost): ``Dict(kind=Discrete(n_kinds), params=Box(-1, 1, (2,)))``."""

    metadata = {"render_modes": []}

    def __init__(self, n_kinds: int = 3) -> None:
        self.n_kinds = n_kinds
        self.observation_space = spaces.Box(-1.0, 1.0, (n_kinds + 2,), np.float32)
        self.action_space = spaces.Dict(
            {
                "kind": spaces.Discrete(n_kinds),
                "params": spaces.Box(-1.0, 1.0, (2,), np.float32),
            }
        )
        self._obs = np.zeros(n_kinds + 2, np.float32)

    def _draw(self) -> np.ndarray:
        rng = self.np_random
        values = rng.random(self.n_kinds, dtype=np.float32)
        target = rng.uniform(-0.8, 0.8, 2).astype(np.float32)
        self._obs = np.concatenate([values, target])
        return self._obs.copy()

    def reset(self, *, seed: int | None = None, options=None):
        super().reset(seed=seed)
        return self._draw(), {}

    def step(self, action):
        kind = int(action["kind"])
        point = np.clip(np.asarray(action["params"], dtype=np.float32), -1.0, 1.0)
        target = self._obs[self.n_kinds :]
        reward = float(self._obs[kind] - np.square(point - target).sum())
        return self._draw(), reward, False, False, {}


class CopyBitsEnv(gymnasium.Env):
    """Copy the observed bits: ``MultiBinary(n_bits)`` actions, 1/n_bits per bit copied."""

    metadata = {"render_modes": []}

    def __init__(self, n_bits: int = 6) -> None:
        self.n_bits = n_bits
        self.observation_space = spaces.Box(-1.0, 1.0, (n_bits,), np.float32)
        self.action_space = spaces.MultiBinary(n_bits)
        self._bits = np.zeros(n_bits, np.int8)

    def _draw(self) -> np.ndarray:
        self._bits = self.np_random.integers(0, 2, self.n_bits).astype(np.int8)
        return (2.0 * self._bits - 1.0).astype(np.float32)

    def reset(self, *, seed: int | None = None, options=None):
        super().reset(seed=seed)
        return self._draw(), {}

    def step(self, action):
        copied = np.asarray(action).astype(np.int8) == self._bits
        return self._draw(), float(copied.mean()), False, False, {}


def _register() -> None:
    if "rlkit/MultiPick-v0" not in gymnasium.registry:
        gymnasium.register(id="rlkit/MultiPick-v0", entry_point=MultiPickEnv, max_episode_steps=10)
    if "rlkit/HybridReach-v0" not in gymnasium.registry:
        gymnasium.register(
            id="rlkit/HybridReach-v0", entry_point=HybridReachEnv, max_episode_steps=10
        )
    if "rlkit/CopyBits-v0" not in gymnasium.registry:
        gymnasium.register(id="rlkit/CopyBits-v0", entry_point=CopyBitsEnv, max_episode_steps=10)


_register()
