"""A plain single-file PyTorch PPO for MinAtar (CleanRL style), the reference that
``bench_minatar_fps.py`` times rlkit's ``recipes/ppo.py`` against. It imports nothing from
rlkit.

It does the same work per frame as rlkit's ``MinAtar/*`` PPO preset
(``rlkit.configs.suites.MINATAR_PPO``):

* env: a gymnasium ``SyncVectorEnv`` of 64 ``MinAtar/<Game>-v1`` envs, each wrapped to give
  ``uint8`` ``{0, 255}`` frames ``[10, 10, C]`` (rlkit's ``MinAtarUint8``), auto-reset
  disabled and finished envs reset through ``reset(options={"reset_mask": done})``, as
  ``rlkit.envs.make_env`` builds it;
* networks: a separate actor and critic on ``frames.movedim(-1, -3).float() / 255``, each
  ``flatten -> Linear(256) -> ReLU -> Linear(256) -> ReLU -> head`` (gymnax-blines'
  Categorical-MLP, the preset's ``--encoder flatten --hidden 256 256 --activation relu``),
  or with ``--network conv`` ``conv(16, 3x3) -> ReLU -> Linear(128) -> ReLU -> head``
  (Young & Tian 2019, the preset's network until 2026-11-26); orthogonal init, gain sqrt(2),
  heads 0.01 (policy) and 1 (value);
* PPO: 64 envs x 128 steps, GAE(0.999, 0.95), 4 epochs of 1024-sample minibatches,
  advantages standardised per minibatch, clip 0.2, value loss
  ``0.5 * 0.5 * max((V - target)^2, (V_clipped - target)^2)`` with ``V`` clipped to
  ``V_old +- 0.2``, entropy 0.01, gradient norm 0.5, Adam lr 5e-4 eps 1e-5;
* one torch thread (rlkit's ``--threads 1``); ``--device cuda`` keeps the networks and the
  rollout batch on the GPU (rlkit's ``--accelerator gpu``).

Printed at the end: frames/s as rlkit's ``summary.json`` defines ``fps`` (frames / training
seconds, where training seconds sum the collection and update of every batch and leave out
start-up, logging and evaluation) and the mean return of the training episodes that finished,
then one JSON line with the same numbers::

    python benchmarks/plain_ppo_minatar.py --env MinAtar/Breakout-v1 --total-frames 262144
"""

from __future__ import annotations

import argparse
import json
import time

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical

NUM_ENVS, ROLLOUT_STEPS, EPOCHS, MINIBATCH = 64, 128, 4, 1024
LR, ADAM_EPS, GAMMA, GAE_LAMBDA = 5e-4, 1e-5, 0.999, 0.95
CLIP, ENTROPY_COEF, VALUE_COEF, MAX_GRAD_NORM = 0.2, 0.01, 0.5, 0.5


class Uint8Frames(gym.ObservationWrapper):
    """MinAtar's boolean planes as uint8 {0, 255}."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        shape = env.observation_space.shape
        self.observation_space = gym.spaces.Box(0, 255, shape=shape, dtype=np.uint8)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return np.asarray(observation, dtype=np.uint8) * np.uint8(255)


def make_envs(env_id: str, num_envs: int) -> gym.vector.SyncVectorEnv:
    if env_id not in gym.registry:
        import minatar.gym

        minatar.gym.register_envs()
    return gym.vector.SyncVectorEnv(
        [lambda: Uint8Frames(gym.make(env_id)) for _ in range(num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.DISABLED,
    )


def layer(module: nn.Module, gain: float = 2**0.5) -> nn.Module:
    nn.init.orthogonal_(module.weight, gain)
    nn.init.zeros_(module.bias)
    return module


def network(kind: str, shape: tuple, outputs: int, head_gain: float) -> nn.Sequential:
    """On channels-first floats ``shape`` = (C, H, W): gymnax-blines' MLP (``mlp``: two
    256-unit layers on the flattened frame) or MinAtar's (``conv``: conv(16, 3x3), dense
    128), then the head."""
    if kind == "mlp":
        return nn.Sequential(
            nn.Flatten(),
            layer(nn.Linear(int(np.prod(shape)), 256)),
            nn.ReLU(),
            layer(nn.Linear(256, 256)),
            nn.ReLU(),
            layer(nn.Linear(256, outputs), head_gain),
        )
    channels = shape[0]
    return nn.Sequential(
        layer(nn.Conv2d(channels, 16, 3)),
        nn.ReLU(),
        nn.Flatten(),
        layer(nn.Linear(16 * 8 * 8, 128)),
        nn.ReLU(),
        layer(nn.Linear(128, outputs), head_gain),
    )


class ActorCritic(nn.Module):
    def __init__(self, kind: str, shape: tuple, actions: int) -> None:
        super().__init__()
        self.actor = network(kind, shape, actions, head_gain=0.01)
        self.critic = network(kind, shape, 1, head_gain=1.0)

    def forward(self, frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``frames`` uint8 ``[B, 10, 10, C]`` -> (logits ``[B, A]``, value ``[B]``)."""
        x = frames.movedim(-1, -3).float().div_(255.0)
        return self.actor(x), self.critic(x).squeeze(-1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="MinAtar/Breakout-v1")
    p.add_argument("--total-frames", type=int, default=262_144)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--network", choices=("mlp", "conv"), default="mlp")
    p.add_argument("--device", default="cpu", help="cpu or cuda: where the networks and batch live")
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)

    envs = make_envs(args.env, NUM_ENVS)
    obs_shape = envs.single_observation_space.shape
    chw = (obs_shape[-1], *obs_shape[:-1])
    model = ActorCritic(args.network, chw, int(envs.single_action_space.n)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR, eps=ADAM_EPS)

    n, t = NUM_ENVS, ROLLOUT_STEPS
    obs = torch.zeros((t, n, *obs_shape), dtype=torch.uint8, device=device)
    actions = torch.zeros((t, n), dtype=torch.int64, device=device)
    log_probs, rewards, dones, values = (torch.zeros((t, n), device=device) for _ in range(4))

    next_obs, _ = envs.reset(seed=args.seed)  # env i gets seed + i
    next_done = np.zeros(n, dtype=bool)
    episode_return = np.zeros(n, dtype=np.float64)
    finished: list[float] = []
    frames, train_seconds = 0, 0.0

    while frames < args.total_frames:
        tick = time.perf_counter()
        # collect t steps of n envs
        for step in range(t):
            obs[step] = torch.from_numpy(next_obs).to(device)
            dones[step] = torch.from_numpy(next_done).to(device)
            with torch.no_grad():
                logits, value = model(obs[step])
                dist = Categorical(logits=logits)
                action = dist.sample()
            actions[step], log_probs[step], values[step] = action, dist.log_prob(action), value
            next_obs, reward, terminated, truncated, _ = envs.step(action.cpu().numpy())
            rewards[step] = torch.from_numpy(reward).to(device)
            next_done = terminated | truncated  # MinAtar has no time limit: all terminations
            episode_return += reward
            if next_done.any():
                finished.extend(episode_return[next_done].tolist())
                episode_return[next_done] = 0.0
                next_obs, _ = envs.reset(options={"reset_mask": next_done})
        frames += n * t

        # GAE(gamma, lambda), bootstrapped from the value of the last observation
        with torch.no_grad():
            _, next_value = model(torch.from_numpy(next_obs).to(device))
            advantages = torch.zeros_like(rewards)
            last = torch.zeros(n, device=device)
            not_done = 1.0 - torch.from_numpy(next_done).float().to(device)
            for step in reversed(range(t)):
                delta = rewards[step] + GAMMA * next_value * not_done - values[step]
                last = delta + GAMMA * GAE_LAMBDA * not_done * last
                advantages[step] = last
                next_value, not_done = values[step], 1.0 - dones[step]
            returns = advantages + values

        # EPOCHS passes over the batch in shuffled minibatches
        b_obs, b_actions = obs.reshape(-1, *obs_shape), actions.reshape(-1)
        b_log_probs, b_adv, b_ret, b_val = (
            x.reshape(-1) for x in (log_probs, advantages, returns, values)
        )
        for _ in range(EPOCHS):
            for idx in torch.randperm(n * t, device=device).split(MINIBATCH):
                logits, value = model(b_obs[idx])
                dist = Categorical(logits=logits)
                ratio = (dist.log_prob(b_actions[idx]) - b_log_probs[idx]).exp()
                adv = b_adv[idx]
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                clipped = ratio.clamp(1.0 - CLIP, 1.0 + CLIP)
                policy_loss = -torch.min(ratio * adv, clipped * adv).mean()
                clipped_value = b_val[idx] + (value - b_val[idx]).clamp(-CLIP, CLIP)
                value_loss = (
                    0.5
                    * torch.max((value - b_ret[idx]).pow(2), (clipped_value - b_ret[idx]).pow(2))
                ).mean()
                entropy = dist.entropy().mean()
                loss = policy_loss + VALUE_COEF * value_loss - ENTROPY_COEF * entropy
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
                optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        train_seconds += time.perf_counter() - tick

    envs.close()
    fps = frames / train_seconds
    mean_return = float(np.mean(finished)) if finished else float("nan")
    print(
        f"{args.env}: {frames:,} frames in {train_seconds:.1f} s ({fps:,.0f} frames/s), "
        f"{len(finished)} training episodes, mean return {mean_return:.2f}"
    )
    result = dict(
        env=args.env,
        seed=args.seed,
        network=args.network,
        device=args.device,
        frames=frames,
        train_seconds=round(train_seconds, 3),
        fps=round(fps, 1),
        episodes=len(finished),
        mean_return=mean_return if finished else None,
        mean_return_last100=float(np.mean(finished[-100:])) if finished else None,
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
