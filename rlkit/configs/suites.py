"""Presets per pixel suite (``MinAtar/*``, ``ALE/*``), torch-free, the one place every recipe's
preset lookup reads (:func:`preset_for`, called by :func:`rlkit.training.parse_config`).

A recipe's ``PRESETS`` may hold a suite key such as ``"MinAtar/*"``: it applies to every id
of that suite that has no preset of its own. A recipe with ``--encoder`` but no suite key
gets :data:`SUITE_NETWORKS` (the suite's encoder, no hidden layers after it), so
``--env MinAtar/Breakout-v1`` alone builds a network that fits the observations.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

__all__ = ["ATARI_PPO", "MINATAR_PPO", "SUITE_NETWORKS", "preset_for", "suite_key"]

#: the network of each suite: MinAtar's (Young & Tian 2019: one 16-filter 3x3 conv, 128
#: units) and the Nature CNN (Mnih et al. 2015: 512 units), with the policy and value heads
#: right after the encoder's features (as both papers and CleanRL's ppo_atari.py)
SUITE_NETWORKS: dict[str, dict[str, Any]] = {
    "MinAtar/*": dict(encoder="minatar", hidden=(), target_return=None),
    "ALE/*": dict(encoder="nature", hidden=(), target_return=None),
}

#: PPO on MinAtar after gymnax-blines' MinAtar PPO config (train_config: 64 envs x 128 steps,
#: 4 epochs of 8 minibatches, lr 5e-4 constant, clip 0.2, GAE lambda 0.95, entropy 0.01,
#: value 0.5, gradient norm 0.5, Adam eps 1e-5, 10M steps), with gamma 0.99
MINATAR_PPO: dict[str, Any] = dict(
    SUITE_NETWORKS["MinAtar/*"],
    total_frames=10_000_000,
    num_envs=64,
    rollout_steps=128,
    epochs=4,
    minibatch_size=1024,
    lr=5e-4,
    lr_schedule="constant",
    adam_eps=1e-5,
    gamma=0.99,
    gae_lambda=0.95,
    clip_epsilon=0.2,
    clip_epsilon_final=None,
    entropy_coef=0.01,
    value_coef=0.5,
    max_grad_norm=0.5,
    eval_every=250_000,
)

#: PPO on Atari: CleanRL's ppo_atari.py (Huang et al. 2022, "The 37 implementation details
#: of PPO"): 8 envs x 128 steps, 4 epochs of 4 minibatches, lr 2.5e-4 annealed to 0, Adam eps
#: 1e-5, gamma 0.99, lambda 0.95, clip 0.1 with the value loss clipped at 0.1, entropy 0.01,
#: value 0.5, gradient norm 0.5, 10M frames
ATARI_PPO: dict[str, Any] = dict(
    SUITE_NETWORKS["ALE/*"],
    total_frames=10_000_000,
    num_envs=8,
    rollout_steps=128,
    epochs=4,
    minibatch_size=256,
    lr=2.5e-4,
    lr_schedule="linear",
    adam_eps=1e-5,
    gamma=0.99,
    gae_lambda=0.95,
    clip_epsilon=0.1,
    clip_epsilon_final=None,
    value_clip=0.1,
    entropy_coef=0.01,
    value_coef=0.5,
    max_grad_norm=0.5,
    eval_every=500_000,
)


def suite_key(env: Any) -> str | None:
    """``"MinAtar/*"`` / ``"ALE/*"`` for an id of those suites, else ``None``."""
    if isinstance(env, str) and "/" in env:
        key = env.split("/", 1)[0] + "/*"
        if key in SUITE_NETWORKS:
            return key
    return None


def preset_for(
    presets: Mapping[str, Mapping[str, Any]] | None, env: Any, cls: type | None = None
) -> dict[str, Any]:
    """The preset of ``env``: its own, else its suite's in ``presets``, else (for a config
    class with an ``encoder`` field) :data:`SUITE_NETWORKS`' entry, else none."""
    presets = presets or {}
    if env in presets:
        return dict(presets[env])
    key = suite_key(env)
    if key is None:
        return {}
    if key in presets:
        return dict(presets[key])
    names = {f.name for f in dataclasses.fields(cls)} if cls is not None else set()
    if "encoder" in names:
        return {k: v for k, v in SUITE_NETWORKS[key].items() if k in names}
    return {}
