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

__all__ = [
    "ATARI_PPO",
    "MINATAR_PPO",
    "SUITE_NETWORKS",
    "UNTIMED_SUITES",
    "preset_for",
    "suite_key",
]

#: the network of each suite: MinAtar's (Young & Tian 2019: one 16-filter 3x3 conv, 128
#: units) and the Nature CNN (Mnih et al. 2015: 512 units), with the policy and value heads
#: right after the encoder's features (as both papers and CleanRL's ppo_atari.py)
SUITE_NETWORKS: dict[str, dict[str, Any]] = {
    "MinAtar/*": dict(encoder="minatar", hidden=(), target_return=None),
    "ALE/*": dict(encoder="nature", hidden=(), target_return=None),
}

#: the suites whose ids never truncate an episode unless ``--max-episode-steps`` sets a time
#: limit: MinAtar registers none (gymnax's ports cut at 1,000 steps). ALE's ids are not here:
#: they truncate at their own frame cap without a ``TimeLimit``
UNTIMED_SUITES: frozenset[str] = frozenset({"MinAtar/*"})

#: PPO on MinAtar: gymnax-blines' MinAtar PPO config (``agents/<Game>-MinAtar/ppo.yaml`` and
#: ``utils/ppo.py``, the source of gymnax's published PPO returns: Breakout 28, SpaceInvaders
#: 131 at 10M steps): 64 envs x 128 steps, 4 epochs of 8 minibatches, Adam lr 5e-4 constant
#: (its warm-up runs from 5e-4 to 5e-4) and eps 1e-5, gamma 0.999, GAE lambda 0.95,
#: advantages standardised per minibatch, clip 0.2 on the ratio and on the value (PPO2's
#: value clipping), entropy 0.01, value 0.5, gradient norm 0.5, 10M steps; its network
#: ("Categorical-MLP", ``flatten_3d``): the frame flattened, separate actor and critic MLPs of
#: two 256-unit ReLU layers; and its evaluation, which samples the policy's actions. Until
#: 2026-11-26 this preset used MinAtar's conv network, gamma 0.99, no value clip and greedy
#: evaluation: seed 1 stalled at 6.5 from 1.2M frames on (docs/pixels.md).
MINATAR_PPO: dict[str, Any] = dict(
    encoder="flatten",
    hidden=(256, 256),
    activation="relu",
    target_return=None,
    total_frames=10_000_000,
    num_envs=64,
    rollout_steps=128,
    epochs=4,
    minibatch_size=1024,
    lr=5e-4,
    lr_schedule="constant",
    adam_eps=1e-5,
    gamma=0.999,
    gae_lambda=0.95,
    clip_epsilon=0.2,
    clip_epsilon_final=None,
    value_clip=0.2,
    entropy_coef=0.01,
    value_coef=0.5,
    max_grad_norm=0.5,
    eval_every=250_000,
    eval_deterministic=False,
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
