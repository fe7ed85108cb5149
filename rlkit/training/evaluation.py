"""Evaluation episodes (deterministic by default) and evaluation videos."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from torch import nn
from torchrl.envs.utils import ExplorationType, set_exploration_type

from rlkit import keys
from rlkit.data.collector import check_finite, env_fault

#: Evaluation environments are seeded from here, apart from every training seed.
EVAL_SEED = 10_000
#: an env fault in evaluation is the collector's line (rlkit.data.collector.env_fault) + this
_DURING = " during evaluation"
#: Without ``max_steps``, an evaluation that runs this long means the env never ends.
_NO_TIME_LIMIT = 100_000


@contextmanager
def evaluation_mode(deterministic: bool, device: torch.device) -> Iterator[None]:
    """How evaluation episodes act: the policy's mode, or (``deterministic=False``) sampled
    actions from torch's generator seeded with :data:`EVAL_SEED`. Either way inside
    :func:`torch.random.fork_rng`, so training's random stream is restored afterwards."""
    mode = ExplorationType.DETERMINISTIC if deterministic else ExplorationType.RANDOM
    cuda = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda), set_exploration_type(mode):
        torch.manual_seed(EVAL_SEED)
        yield


class Evaluator:
    """Runs ``episodes`` evaluation episodes at once, one per sub-environment.

    Each sub-environment of a ``make_env(env_id, num_envs=episodes)`` batch plays exactly one
    episode (its first); the mean and standard deviation of those returns are reported.
    The environment is re-seeded with the same seed at every evaluation, so successive
    evaluations score policies on the same start states.

    ``deterministic=True`` plays the policy's mode (``ExplorationType.DETERMINISTIC``: argmax
    of the logits, the Gaussian's mean). ``deterministic=False`` samples the policy's actions
    (``ExplorationType.RANDOM``), with torch's generator seeded with :data:`EVAL_SEED` at
    every evaluation inside :func:`torch.random.fork_rng` (restored afterwards), so the
    training random stream is the same whichever mode evaluates. Policies without a
    distribution (DQN's greedy actor) act the same in both modes.

    ``max_steps`` (``--eval-max-steps``, RLlib's ``max_val_steps``) cuts every episode off
    after that many steps and scores it with the return collected so far; without it an
    episode runs to its end (the env's time limit).
    """

    def __init__(
        self,
        env_id: str | Callable[..., Any],
        *,
        episodes: int,
        device: torch.device | str = "cpu",
        max_steps: int | None = None,
        deterministic: bool = True,
        repeats: int = 1,
        env_kwargs: Mapping[str, Any] | None = None,
        max_episode_steps: int | None = None,
    ) -> None:
        from rlkit.envs import make_env

        if episodes < 1:
            raise ValueError(f"--eval-episodes must be >= 1, got {episodes}")
        if max_steps is not None and max_steps < 1:
            raise ValueError(f"--eval-max-steps must be >= 1, got {max_steps}")
        self.episodes, self.max_steps = episodes, max_steps
        self.deterministic = deterministic
        self.device = torch.device(device)
        self.env_id, self.repeats = env_id, repeats
        # ``repeats`` blocks of the same ``episodes`` start states (a population's members,
        # each scored on the episodes its standalone run is scored on)
        self._seeds = [EVAL_SEED + i for _ in range(repeats) for i in range(episodes)]
        seed = EVAL_SEED if repeats == 1 else self._seeds
        # the training env's gymnasium.make arguments (--env-kwargs, --max-episode-steps)
        self.make_kwargs = {"env_kwargs": env_kwargs, "max_episode_steps": max_episode_steps}
        self.env = make_env(
            env_id,
            num_envs=episodes * repeats,
            seed=seed,
            device=device,
            evaluation=True,
            **self.make_kwargs,
        )

    @torch.no_grad()
    def __call__(self, policy: nn.Module) -> tuple[float, float]:
        returns = self.returns(policy)
        mean = float(returns.mean())
        std = float(returns.std(unbiased=False)) if returns.numel() > 1 else 0.0
        return mean, std

    @torch.no_grad()
    def returns(self, policy: nn.Module) -> torch.Tensor:
        with evaluation_mode(self.deterministic, self.device):
            return self._play(policy)

    def _play(self, policy: nn.Module) -> torch.Tensor:
        from rlkit.envs import reseed

        env, n = self.env, self.episodes * self.repeats
        try:
            # what make_env(..., seed=EVAL_SEED or the seeds) seeded: the same start states
            reseed(env, EVAL_SEED if self.repeats == 1 else self._seeds)
            td = env.reset()
        except Exception as err:
            raise env_fault(env, "reset", err, during=_DURING) from err
        memory = Carry(policy, td)
        running = torch.zeros(n, dtype=torch.float64)
        final = torch.full((n,), math.nan, dtype=torch.float64)
        finished = torch.zeros(n, dtype=torch.bool)
        for _ in range(self.max_steps or _NO_TIME_LIMIT):
            td = policy(memory.start(td))
            memory.after(td)
            try:
                td, td_next = env.step_and_maybe_reset(td)
            except Exception as err:
                raise env_fault(env, "step", err, during=_DURING) from err
            check_finite(env, td, "step", during=_DURING)
            reward = td.get(keys.REWARD).reshape(n).double().cpu()
            done = td.get(keys.DONE).reshape(n).cpu()
            running += torch.where(finished, 0.0, reward)
            newly = done & ~finished
            final[newly] = running[newly]
            finished |= done
            if finished.all():
                break
            td = td_next
            memory.done(done.view(n, 1))
        if not finished.all():
            if self.max_steps is not None:  # cut off: scored with the return so far
                final[~finished] = running[~finished]
                return final
            raise RuntimeError(
                f"evaluation episodes did not end within {_NO_TIME_LIMIT:,} steps: give the "
                "environment a time limit (max_episode_steps) or cut evaluation episodes "
                "off with --eval-max-steps"
            )
        return final


class Carry:
    """A recurrent policy's memory between evaluation steps (nothing for other policies):
    zero at the start and where an episode ends (``is_init`` True on the next step), the
    state the policy wrote under ``("next", key)`` carried to the next step otherwise."""

    def __init__(self, policy: nn.Module, td) -> None:
        from rlkit.modules.recurrent import carried_state, initial_state

        self.shapes = carried_state(policy)
        batch = tuple(td.batch_size)
        self.state = initial_state(self.shapes, batch, device=td.device)
        self.is_init = torch.ones(*batch, 1, dtype=torch.bool, device=td.device)

    def start(self, td):
        """``td`` with the state the step starts from."""
        if self.shapes:
            td.set(keys.IS_INIT, self.is_init)
            for k, v in self.state.items():
                td.set(k, v)
        return td

    def after(self, td) -> None:
        """Keep the state the policy wrote for the next step."""
        for k in self.shapes:
            self.state[k] = td.get((keys.NEXT, k))

    def done(self, done: torch.Tensor) -> None:
        """Episodes that ended (``done`` ``[*, 1]``) start the next step from zero."""
        if not self.shapes:
            return
        from rlkit.modules.recurrent import reset_rows

        self.is_init = done.reshape(self.is_init.shape).bool()
        self.state = reset_rows(self.state, self.is_init)


@torch.no_grad()
def record_gif(
    env_id: str | Callable[..., Any],
    policy: nn.Module,
    path: Path,
    *,
    max_frames: int = 1000,
    fps: int = 30,
    deterministic: bool = True,
    env_kwargs: Mapping[str, Any] | None = None,
    max_episode_steps: int | None = None,
    device: torch.device | str | None = None,
) -> Path | None:
    """Render one evaluation episode to an animated GIF (frames from ``rgb_array``), played
    as :class:`Evaluator` plays it: the policy's mode, or (``deterministic=False``) actions
    sampled from a generator seeded with :data:`EVAL_SEED`, apart from training's stream.
    ``env_kwargs`` and ``max_episode_steps`` go to ``gymnasium.make`` (the run's
    ``--env-kwargs`` and ``--max-episode-steps``). An env factory (or its ``module:qualname``)
    is called with them and ``render_mode="rgb_array"``, and must return a gymnasium env."""
    import os

    from PIL import Image

    # off-screen rendering: without a display SDL (through pygame) would print
    # "error: XDG_RUNTIME_DIR is invalid or not set" on every run
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    import rlkit.envs  # noqa: F401  (registers the rlkit/ namespaced ids)

    env = _render_env(env_id, dict(env_kwargs or {}), max_episode_steps)
    obs, _ = env.reset(seed=EVAL_SEED)
    # a policy may hold no parameters of its own (a tanh-squashed head around a network
    # registered elsewhere): then its buffers, else the CPU
    if device is None:
        tensors = [*policy.parameters(), *policy.buffers()]
        device = tensors[0].device if tensors else torch.device("cpu")
    device = torch.device(device)
    frames = []
    memory = Carry(policy, TensorDict({}, batch_size=[1], device=device))
    with evaluation_mode(deterministic, device):
        for _ in range(max_frames):
            frames.append(Image.fromarray(env.render()))
            td = TensorDict(_observation(obs, device), batch_size=[1])
            td = policy(memory.start(td))
            memory.after(td)
            memory.done(torch.zeros(1, 1, dtype=torch.bool))
            action = td.get(keys.ACTION)[0].cpu().numpy()
            obs, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                break
    env.close()
    if not frames:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=int(1000 / fps), loop=0)
    return path


def _observation(obs: Any, device: torch.device) -> dict[str, torch.Tensor]:
    """One gymnasium observation as the policy reads it, batch ``[1]``: ``"observation"``
    float32, or a Dict observation's entries under their own keys (float64 cast to float32,
    other dtypes kept: uint8 images are scaled by their encoder), as ``make_env`` writes them."""
    if not isinstance(obs, dict):
        return {keys.OBSERVATION: torch.as_tensor(obs, dtype=torch.float32, device=device)[None]}
    out = {}
    for k, v in obs.items():
        x = torch.as_tensor(np.asarray(v), device=device)
        out[k] = (x.float() if x.dtype == torch.float64 else x)[None]
    return out


def _render_env(env_id: str | Callable[..., Any], kwargs: dict[str, Any], max_episode_steps):
    """One gymnasium env rendering ``rgb_array`` frames, of an id or an env factory."""
    import gymnasium as gym

    from rlkit.envs.ids import resolve_env

    source = resolve_env(env_id) if isinstance(env_id, str) else env_id
    if isinstance(source, str):
        if max_episode_steps is not None:
            kwargs["max_episode_steps"] = max_episode_steps
        return gym.make(source, render_mode="rgb_array", **kwargs)
    env = source(render_mode="rgb_array", **kwargs)
    if not isinstance(env, gym.Env):
        name = getattr(source, "__qualname__", type(source).__name__)
        raise TypeError(
            f"the env factory {name} returned {type(env).__name__}: videos record a "
            "gymnasium env rendering rgb_array frames"
        )
    if max_episode_steps is not None:
        env = gym.wrappers.TimeLimit(env, max_episode_steps)
    return env
