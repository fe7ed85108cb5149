"""rlkit PPO against SB3-contrib's MaskablePPO on the masked task ``rlkit/MaskedPick-v0``, in
the same run: frames to the bar and frames/s.

    .venv/bin/python benchmarks/bench_masked.py --seeds 0 1 2 3 4 \\
        --out benchmarks/results/bench_masked.json

Both sides: PPO with rlkit's defaults, which are rl-zoo3's CartPole settings (8 envs x 32
steps, 20 epochs, minibatch 256, lr 1e-3 and clip 0.2 annealed linearly to 0, gamma 0.98,
GAE lambda 0.8, 64x64 tanh networks, no entropy bonus), one torch thread, the CPU. The
networks read the item values; the mask restricts the policy (rlkit: ``make_actor`` on the
Dict observation's ``"action_mask"``; SB3-contrib: ``ActionMasker`` over the same mask, the
values as a flat ``Box`` observation, so neither network is fed the mask).

Phase "solve": a deterministic evaluation of 10 episodes (seeds 10,000 + i) every
``--eval-every`` frames; the frames at the first one >= ``--bar`` (15: random legal play scores
10, the best legal play 16). Phase "fps": ``--fps-frames`` frames without evaluation, frames
per second of training (collection and updates). SB3-contrib is a benchmark-only dependency:
``pip install -e ".[bench]"``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import gymnasium
import numpy as np
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import rlkit.envs  # noqa: E402,F401  (registers rlkit/MaskedPick-v0)

ENV = "rlkit/MaskedPick-v0"
EVAL_SEED = 10_000


# ------------------------------------------------------------------------------ rlkit
def rlkit_run(seed: int, *, frames: int, eval_every: int, bar: float | None) -> dict:
    from rlkit.algorithms import ppo

    flags = ["--env", ENV, "--seed", str(seed), "--total-frames", str(frames)]
    flags += ["--progress", "false", "--eval-episodes", "10", "--run-dir", tempfile.mkdtemp()]
    flags += ["--eval-every", str(eval_every)]
    if bar is not None:
        flags += ["--target-return", str(bar)]
    summary = ppo.main(flags)
    return dict(
        solved=bool(summary["solved"]),
        frames=summary["solved_frames"] if summary["solved"] else summary["frames"],
        train_seconds=summary["solved_seconds"] if summary["solved"] else summary["train_seconds"],
        fps=summary["fps"],
        last_eval=summary["eval_return_mean"],
    )


# ------------------------------------------------------------------------------ SB3-contrib
class ValuesAndMask(gymnasium.Wrapper):
    """The Dict observation as SB3-contrib's MaskablePPO takes it: the values as the
    observation, the mask through ``action_masks()`` (read by its ``ActionMasker``)."""

    def __init__(self, env):
        super().__init__(env)
        self.observation_space = env.observation_space["observation"]
        self._mask = np.ones(env.action_space.n, bool)

    def _split(self, obs):
        self._mask = obs["action_mask"].astype(bool)
        return obs["observation"]

    def reset(self, **kw):
        obs, info = self.env.reset(**kw)
        return self._split(obs), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return self._split(obs), reward, terminated, truncated, info

    def action_masks(self) -> np.ndarray:
        return self._mask


def _sb3_env():
    from sb3_contrib.common.wrappers import ActionMasker

    return ActionMasker(ValuesAndMask(gymnasium.make(ENV)), lambda env: env.action_masks())


def sb3_run(seed: int, *, frames: int, eval_every: int, bar: float | None) -> dict:
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    def linear(v):
        return lambda progress: progress * v

    env = make_vec_env(_sb3_env, n_envs=8, seed=seed)
    model = MaskablePPO(
        "MlpPolicy",
        env,
        n_steps=32,
        batch_size=256,
        n_epochs=20,
        learning_rate=linear(1e-3),
        clip_range=linear(0.2),
        gamma=0.98,
        gae_lambda=0.8,
        ent_coef=0.0,
        policy_kwargs=dict(net_arch=[64, 64]),
        seed=seed,
        device="cpu",
        verbose=0,
    )
    eval_env = _sb3_env()

    def evaluate(n: int = 10) -> float:
        returns = []
        for i in range(n):
            obs, _ = eval_env.reset(seed=EVAL_SEED + i)
            done, ret = False, 0.0
            while not done:
                action, _ = model.predict(
                    obs, deterministic=True, action_masks=eval_env.action_masks()
                )
                obs, r, term, trunc, _ = eval_env.step(action)
                ret += float(r)
                done = term or trunc
            returns.append(ret)
        return float(np.mean(returns))

    class Probe(BaseCallback):
        def __init__(self):
            super().__init__()
            self.next_eval, self.solved, self.eval_time, self.last = eval_every, None, 0.0, None

        def _on_step(self):
            if bar is None or self.num_timesteps < self.next_eval:
                return True
            self.next_eval += eval_every
            t = time.perf_counter()
            self.last = evaluate()
            self.eval_time += time.perf_counter() - t
            if self.last >= bar:
                self.solved = (self.num_timesteps, time.perf_counter() - start - self.eval_time)
                return False
            return True

    probe = Probe()
    start = time.perf_counter()
    model.learn(total_timesteps=frames, callback=probe)
    wall = time.perf_counter() - start - probe.eval_time
    done_frames, seconds = probe.solved if probe.solved else (model.num_timesteps, wall)
    last = probe.last if bar is not None else evaluate()
    return dict(
        solved=probe.solved is not None,
        frames=done_frames,
        train_seconds=round(seconds, 2),
        fps=round(done_frames / seconds, 1),
        last_eval=last,
    )


# ------------------------------------------------------------------------------ main
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--bar", type=float, default=15.0)
    p.add_argument("--eval-every", type=int, default=1024)
    p.add_argument("--solve-frames", type=int, default=20480)
    p.add_argument("--fps-frames", type=int, default=20480)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    runs: list[dict] = []
    for seed in args.seeds:
        for side, fn in (("rlkit", rlkit_run), ("sb3-contrib", sb3_run)):
            solve = fn(seed, frames=args.solve_frames, eval_every=args.eval_every, bar=args.bar)
            fps = fn(seed, frames=args.fps_frames, eval_every=args.fps_frames, bar=None)
            row = dict(side=side, seed=seed, solve=solve, fps_run=fps)
            print(json.dumps(row), flush=True)
            runs.append(row)
    summary = {}
    for side in ("rlkit", "sb3-contrib"):
        rows = [r for r in runs if r["side"] == side]
        summary[side] = dict(
            solved=sum(r["solve"]["solved"] for r in rows),
            seeds=len(rows),
            frames_to_bar_median=statistics.median(r["solve"]["frames"] for r in rows),
            fps_median=statistics.median(r["fps_run"]["fps"] for r in rows),
            final_eval_median=statistics.median(r["fps_run"]["last_eval"] for r in rows),
        )
    ours, theirs = summary["rlkit"], summary["sb3-contrib"]
    summary["fps_ratio_rlkit_over_sb3"] = round(ours["fps_median"] / theirs["fps_median"], 2)
    summary["frames_ratio_sb3_over_rlkit"] = round(
        theirs["frames_to_bar_median"] / ours["frames_to_bar_median"], 2
    )
    print(json.dumps(summary, indent=2))
    if args.out:
        meta = dict(
            command=" ".join(sys.argv),
            env=ENV,
            bar=args.bar,
            eval_every=args.eval_every,
            versions={m: __import__(m).__version__ for m in ("torch", "sb3_contrib", "gymnasium")},
        )
        args.out.write_text(json.dumps(dict(meta=meta, summary=summary, runs=runs), indent=2))


if __name__ == "__main__":
    main()
