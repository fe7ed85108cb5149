"""Presets by suite, torch-free: the one place every recipe's preset lookup reads
(:func:`preset_for` and :func:`preset_key`, called by :func:`rlkit.training.parse_config`).

A task's **suite** comes from its id: ``MinAtar/*`` and ``ALE/*`` by prefix, ``MuJoCo/*``,
``Box2D/*`` and ``ClassicControl/*`` from the module of its gymnasium registry entry (so every
MuJoCo task gymnasium registers is one, also those no preset names). Its **kind** comes from
its spaces: ``continuous`` or ``discrete`` actions, or ``pixels`` (image observations).

A recipe's ``PRESETS`` maps keys to settings; the first key that exists applies
(:func:`preset_candidates`): the id itself (a per-task override, each citing its source),
``"<Suite>/*:<kind>"``, ``"<Suite>/*"``, then ``"*:<kind>"`` (any task of that kind the recipe
has no better preset for: an unknown continuous-control id gets continuous-control settings,
not CartPole's). No key: the config's defaults. A recipe with ``--encoder`` but no key for a
pixel suite gets :data:`SUITE_NETWORKS` (the suite's encoder, no hidden layers after it), so
``--env MinAtar/Breakout-v1`` alone builds a network that fits the observations. The run's
opening line names the key that applied.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

__all__ = [
    "ATARI_PPO",
    "MINATAR_PPO",
    "MUJOCO_PPO",
    "SUITE_NETWORKS",
    "UNTIMED_SUITES",
    "action_kind",
    "env_suite",
    "preset_candidates",
    "preset_for",
    "preset_key",
    "only_fields",
    "preset_name",
    "suite_key",
]

#: the suite of a gymnasium id, from the module its registry entry points to
ENTRY_POINT_SUITES: dict[str, str] = {
    "gymnasium.envs.mujoco": "MuJoCo",
    "gymnasium.envs.box2d": "Box2D",
    "gymnasium.envs.classic_control": "ClassicControl",
}
#: the kind of every task of a suite, where one kind covers them all (no env is made for it)
SUITE_KINDS: dict[str, str] = {"MuJoCo": "continuous", "MinAtar": "pixels", "ALE": "pixels"}

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


#: PPO on continuous control (every MuJoCo task; pip install -e ".[mujoco]"): CleanRL's
# ppo_continuous_action.py settings (benchmark tag pr-424), the one script CleanRL runs on
# every MuJoCo task: 1 env x 2048 steps, 10 epochs of 32 minibatches, lr 3e-4 annealed to 0,
# gamma 0.99, lambda 0.95, clip 0.2 with clipped value loss, no entropy bonus, gradient norm
# 0.5, observation and reward normalisation; Gaussian policy with state-independent log-std,
# actions clipped to the env's bounds
MUJOCO_PPO: dict[str, Any] = dict(
    total_frames=1_000_000,
    num_envs=1,
    rollout_steps=2048,
    epochs=10,
    minibatch_size=64,
    lr=3e-4,
    lr_schedule="linear",
    gamma=0.99,
    gae_lambda=0.95,
    clip_epsilon=0.2,
    clip_epsilon_final=None,
    value_clip=0.2,
    entropy_coef=0.0,
    value_coef=0.5,
    max_grad_norm=0.5,
    normalize_obs=True,
    normalize_reward=True,
    eval_every=50_000,
    target_return=None,
)


def only_fields(preset: Mapping[str, Any], cls: type, **changes: Any) -> dict[str, Any]:
    """``preset`` with ``changes``, restricted to the fields of config class ``cls`` (a
    suite's PPO settings given to a recipe that shares only some of them)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in {**preset, **changes}.items() if k in names}


def suite_key(env: Any) -> str | None:
    """``"MinAtar/*"`` / ``"ALE/*"`` for an id of those pixel suites, else ``None``."""
    if isinstance(env, str) and "/" in env:
        key = env.split("/", 1)[0] + "/*"
        if key in SUITE_NETWORKS:
            return key
    return None


def env_suite(env: Any) -> str | None:
    """``"MinAtar"``, ``"ALE"``, ``"POPGym"``, ``"MuJoCo"``, ``"Box2D"``,
    ``"ClassicControl"`` or ``None`` (an id of no known suite, or not an id)."""
    key = suite_key(env)
    if key is not None:
        return key[:-2]
    if not isinstance(env, str):
        return None
    if env.removeprefix("popgym:").startswith("popgym-"):
        return "POPGym"
    import gymnasium  # torch-free; only where an id is resolved

    spec = gymnasium.registry.get(env)
    entry = getattr(spec, "entry_point", None)
    if not isinstance(entry, str):
        return None
    module = entry.split(":", 1)[0]
    return next(
        (suite for prefix, suite in ENTRY_POINT_SUITES.items() if module.startswith(prefix)),
        None,
    )


@functools.lru_cache(maxsize=64)
def action_kind(env: Any) -> str | None:
    """``"continuous"`` (Box actions), ``"discrete"`` or ``"pixels"`` (image observations);
    ``None`` when the env cannot be made here (its package is missing, an unknown id: making
    it later names the problem). A suite in :data:`SUITE_KINDS` is answered without making an
    env; any other id is made once (``gymnasium.make``, also for ``module:Env-v0`` ids) and
    closed."""
    suite = env_suite(env)
    if suite in SUITE_KINDS:
        return SUITE_KINDS[suite]
    if not isinstance(env, str):
        return None
    import gymnasium

    try:
        made = gymnasium.make(env)
    except Exception:  # noqa: BLE001  (any failure here is reported when the run makes it)
        return None
    try:
        obs, act = made.observation_space, made.action_space
    finally:
        made.close()
    if isinstance(obs, gymnasium.spaces.Box) and len(obs.shape) == 3:
        return "pixels"
    if isinstance(act, gymnasium.spaces.Box):
        return "continuous"
    if isinstance(act, gymnasium.spaces.Discrete):
        return "discrete"
    return None


def preset_candidates(env: Any, *, kind: bool = True) -> list[str]:
    """The keys :func:`preset_key` tries for ``env``, in order: the id, ``"<Suite>/*:<kind>"``,
    ``"<Suite>/*"``, ``"*:<kind>"``. ``kind=False`` leaves out the keys that need the env's
    kind (no env is made)."""
    out = [env] if isinstance(env, str) else []
    suite = env_suite(env)
    k = action_kind(env) if kind else None
    if suite is not None and k is not None:
        out.append(f"{suite}/*:{k}")
    if suite is not None:
        out.append(f"{suite}/*")
    if k is not None:
        out.append(f"*:{k}")
    return out


def preset_key(presets: Mapping[str, Mapping[str, Any]] | None, env: Any) -> str | None:
    """The key of ``presets`` that applies to ``env`` (:func:`preset_candidates`' first that
    exists), or ``None`` for the config's defaults. The env is made (once, to read its spaces)
    only when ``presets`` has a kind key and neither the id nor its suite has a preset."""
    presets = presets or {}
    if not isinstance(env, str):
        return None
    quick = preset_candidates(env, kind=False)
    if quick and quick[0] in presets:
        return quick[0]
    if not any(":" in key for key in presets):
        return next((key for key in quick if key in presets), None)
    return next((key for key in preset_candidates(env) if key in presets), None)


def preset_for(
    presets: Mapping[str, Mapping[str, Any]] | None, env: Any, cls: type | None = None
) -> dict[str, Any]:
    """The preset of ``env``: the entry of :func:`preset_key` in ``presets``, else (for a
    config class with an ``encoder`` field and a pixel suite) :data:`SUITE_NETWORKS`' entry,
    else none."""
    key = preset_key(presets, env)
    if key is not None:
        return dict(presets[key])
    pixel = suite_key(env)
    if pixel is None:
        return {}
    names = {f.name for f in dataclasses.fields(cls)} if cls is not None else set()
    if "encoder" in names:
        return {k: v for k, v in SUITE_NETWORKS[pixel].items() if k in names}
    return {}


def preset_name(
    presets: Mapping[str, Mapping[str, Any]] | None, env: Any, cls: type | None = None
) -> str:
    """What the run's opening line says applied: ``"preset HalfCheetah-v5"``, ``"preset
    MuJoCo/*"``, ``"preset *:continuous"``, ``"MinAtar/*'s network"`` or ``"defaults"``."""
    key = preset_key(presets, env)
    if key is not None:
        return f"preset {key}"
    if preset_for(presets, env, cls):
        return f"{suite_key(env)}'s network"
    return "defaults"
