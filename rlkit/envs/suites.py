"""Pixel suites: MinAtar (``MinAtar/<Game>-v1``) and the Arcade Learning Environment
(``ALE/<Game>-v5``), registered on first use and wrapped with their standard protocol.

Registration is lazy: :func:`register_suite` runs only when :func:`rlkit.envs.make_env` is
asked for such an id, so ``import rlkit`` stays fast and needs neither package. minatar 1.0.15
declares its gymnasium ids through an entry point that gymnasium 1.4 does not load
(``minatar.gym.register_envs()`` has to be called); ALE ids need
``gymnasium.register_envs(ale_py)``.

**MinAtar** (Young & Tian 2019): the game's ``[10, 10, C]`` boolean planes become ``uint8``
with values ``{0, 255}``, so the image encoders' one rule (``uint8 / 255``) gives exactly
``{0, 1}`` and a stored frame costs one byte per cell. And a reset forgets the last action
(:class:`MinAtarFreshReset`): minatar's ``Environment.reset`` keeps it, so with sticky
actions an episode's first step could repeat the previous episode's last action, and an
episode was not a function of its reset seed and actions (a reused evaluator scored a
SpaceInvaders policy 151.7 where a fresh one scored 135.2). Nothing else changes (MinAtar's
own sticky actions, 0.1, and its difficulty ramping stay on; no time limit).

**ALE** (Machado et al. 2018, "Revisiting the Arcade Learning Environment"; the preprocessing
of CleanRL's ``ppo_atari.py`` and SB3's ``AtariWrapper``): the v5 id made with ``frameskip=1``
(sticky actions stay at v5's default ``repeat_action_probability=0.25``, Machado's
recommendation; CleanRL's v4 ``NoFrameskip`` ids have none), then gymnasium's
``AtariPreprocessing`` (up to 30 no-op starts, frame skip 4 with a max over the last two
frames, 84x84 grayscale), for training envs only :class:`EpisodicLife` (a life loss ends the
episode but not the game, SB3's ``EpisodicLifeEnv``), :class:`FireReset` for games whose
second action is FIRE, and gymnasium's ``FrameStackObservation(4)``: observations
``uint8 [4, 84, 84]``. Rewards are sign-clipped for training by TorchRL's ``SignTransform``
*after* the return tracker, so logged returns are raw scores (of one life, in training).
Until 2026-11-26 training used ``AtariPreprocessing(terminal_on_life_loss=True)``, whose
next reset starts a new game: training never played past the first life.
"""

from __future__ import annotations

import importlib
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

__all__ = [
    "ATARI_FRAME_STACK",
    "EpisodicLife",
    "FireReset",
    "MinAtarFreshReset",
    "MinAtarUint8",
    "atari_wrappers",
    "register_suite",
    "suite_of",
]

#: (id prefix, importable module, pip extra) of each suite rlkit registers on demand
_SUITES = {"MinAtar": ("minatar", "minatar"), "ALE": ("ale_py", "atari")}
#: frames stacked into one ALE observation (Mnih et al. 2015)
ATARI_FRAME_STACK = 4


def suite_of(env_id: Any) -> str | None:
    """``"MinAtar"``, ``"ALE"``, ``"POPGym"`` (``popgym:popgym-<Task>-v0`` or
    ``popgym-<Task>-v0``) or ``None`` for any other id."""
    if isinstance(env_id, str) and env_id.removeprefix("popgym:").startswith("popgym-"):
        return "POPGym"
    if not isinstance(env_id, str) or "/" not in env_id:
        return None
    prefix = env_id.split("/", 1)[0]
    return prefix if prefix in _SUITES else None


def register_suite(env_id: str) -> None:
    """Register the ids of ``env_id``'s suite with gymnasium (once); no-op for other ids.

    Raises:
        ModuleNotFoundError: the suite's package is missing (the message names the extra).
    """
    suite = suite_of(env_id)
    if suite is None or env_id in gymnasium.registry:
        return
    if suite == "POPGym":
        try:
            importlib.import_module("popgym")  # registers its popgym-* ids
        except ModuleNotFoundError as err:
            raise ModuleNotFoundError(
                f'--env {env_id} needs popgym: pip install -e ".[popgym]"'
            ) from err
        return
    module, extra = _SUITES[suite]
    try:
        package = importlib.import_module(module)
    except ModuleNotFoundError as err:
        raise ModuleNotFoundError(
            f'--env {env_id} needs {module.replace("_", "-")}: pip install -e ".[{extra}]"'
        ) from err
    if suite == "MinAtar":
        if not any(k.startswith("MinAtar/") for k in gymnasium.registry):
            importlib.import_module("minatar.gym").register_envs()
    else:
        gymnasium.register_envs(package)


class MinAtarFreshReset(gymnasium.Wrapper):
    """Every reset starts from no previous action (see module doc): minatar 1.0.15's
    ``Environment.reset`` leaves ``last_action``, which its sticky actions repeat."""

    def reset(self, **kwargs):
        self.env.unwrapped.game.last_action = 0  # as a newly built minatar Environment
        return self.env.reset(**kwargs)


class MinAtarUint8(gymnasium.ObservationWrapper):
    """MinAtar's boolean ``[10, 10, C]`` planes as ``uint8`` ``{0, 255}`` (see module doc)."""

    def __init__(self, env: gymnasium.Env) -> None:
        super().__init__(env)
        shape = env.observation_space.shape
        self.observation_space = spaces.Box(0, 255, shape=shape, dtype=np.uint8)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return np.asarray(observation, dtype=np.uint8) * np.uint8(255)


class FireReset(gymnasium.Wrapper):
    """Press FIRE after a reset, for games that wait for it (SB3's ``FireResetEnv``,
    CleanRL's ``ppo_atari.py``): actions 1 (FIRE) then 2, resetting again if either ends
    the episode."""

    def reset(self, **kwargs):
        self.env.reset(**kwargs)
        for action in (1, 2):
            obs, _, terminated, truncated, info = self.env.step(action)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        return obs, info


class EpisodicLife(gymnasium.Wrapper):
    """A life loss ends the episode (``terminated``: the value bootstraps no further) but not
    the game: the next reset continues the same game with one no-op step, and only a game
    over resets it (SB3's ``EpisodicLifeEnv``, CleanRL's ``ppo_atari.py``). For training envs:
    evaluation plays whole games."""

    def __init__(self, env: gymnasium.Env) -> None:
        super().__init__(env)
        self.lives, self.game_over = 0, True

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = terminated or truncated
        lives = self.env.unwrapped.ale.lives()
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs):
        if self.game_over or kwargs.get("seed") is not None:  # a seed asks for a new game
            obs, info = self.env.reset(**kwargs)
        else:  # a life was lost: play on (a no-op step) from where it was
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        self.game_over = False
        self.lives = self.env.unwrapped.ale.lives()
        return obs, info


def needs_fire(env: gymnasium.Env) -> bool:
    meanings = env.unwrapped.get_action_meanings()
    return len(meanings) >= 3 and meanings[1] == "FIRE"


def atari_wrappers(env: gymnasium.Env, *, training: bool) -> gymnasium.Env:
    """The ALE protocol of the module docstring on an env made with ``frameskip=1``."""
    env = gymnasium.wrappers.AtariPreprocessing(
        env,
        noop_max=30,
        frame_skip=4,
        screen_size=84,
        terminal_on_life_loss=False,  # its next reset would start a new game: EpisodicLife
        grayscale_obs=True,
        scale_obs=False,
    )
    if training:
        env = EpisodicLife(env)
    if needs_fire(env):
        env = FireReset(env)
    return gymnasium.wrappers.FrameStackObservation(env, ATARI_FRAME_STACK)


def suite_make_kwargs(env_id: str) -> dict[str, Any]:
    """Extra ``gymnasium.make`` arguments the suite's protocol needs."""
    return {"frameskip": 1} if suite_of(env_id) == "ALE" else {}


def suite_wrappers(env_id: str, *, training: bool) -> list:
    """Gymnasium wrappers of the suite's protocol, applied before the caller's."""
    suite = suite_of(env_id)
    if suite == "MinAtar":
        return [MinAtarFreshReset, MinAtarUint8]
    if suite == "ALE":
        return [lambda env: atari_wrappers(env, training=training)]
    if suite == "POPGym":  # Discrete / MultiDiscrete / Tuple observations as one float vector
        return [_flat_float_observation]
    return []


def _flat_float_observation(env: gymnasium.Env) -> gymnasium.Env:
    """POPGym's observations (Box, Discrete, MultiDiscrete, Tuple of them) as one float32
    vector: gymnasium's ``FlattenObservation`` (one-hot for the discrete parts)."""
    if isinstance(env.observation_space, spaces.Box) and env.observation_space.dtype == np.float32:
        return env
    flat = gymnasium.wrappers.FlattenObservation(env)
    return gymnasium.wrappers.TransformObservation(
        flat,
        lambda obs: np.asarray(obs, dtype=np.float32),
        spaces.Box(
            flat.observation_space.low.astype(np.float32),
            flat.observation_space.high.astype(np.float32),
            dtype=np.float32,
        ),
    )
