"""Recurrent PPO frames/s: rlkit ``--recurrent lstm`` against SB3-contrib's ``RecurrentPPO``
at matched settings, in the same run, interleaved.

    python benchmarks/bench_memory.py --frames 16384 --repeats 3 \\
        --out benchmarks/results/bench_memory

Both sides: PPO on ``--env`` (default ``popgym-PositionOnlyCartPoleEasy-v0``), ``--num-envs``
envs x ``--rollout-steps`` steps per batch, ``--epochs`` epochs, minibatches of
``--minibatch-size`` frames (rlkit: whole env rows, ``minibatch / rollout_steps`` rows;
SB3-contrib: ``batch_size`` frames of whole sequences), an LSTM of ``--size`` units for the
actor and one for the critic (SB3-contrib's default ``shared_lstm=False,
enable_critic_lstm=True``), one 64-unit tanh layer per head, lr 3e-4, one torch thread, the
CPU, no evaluation. Frames/s is total frames over the wall time of ``learn`` / ``train``
(collection and updates). Needs ``pip install -e ".[bench,popgym]"``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))


def rlkit_fps(a, seed: int) -> float:
    from rlkit.algorithms import ppo

    flags = [
        "--env", a.env, "--seed", str(seed), "--total-frames", str(a.frames),
        "--num-envs", str(a.num_envs), "--rollout-steps", str(a.rollout_steps),
        "--epochs", str(a.epochs), "--minibatch-size", str(a.minibatch_size),
        "--recurrent", "lstm", "--recurrent-size", str(a.size), "--hidden", "64",
        "--lr", "3e-4", "--progress", "false", "--run-dir", tempfile.mkdtemp(),
    ]  # fmt: skip
    return float(ppo.main(flags)["fps"])  # frames over training time (evaluation apart)


def sb3_fps(a, seed: int) -> float:
    import gymnasium
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.env_util import make_vec_env

    from rlkit.envs import suites

    suites.register_suite(a.env)

    def make():  # the observation rlkit's networks see (POPGym's flattened to floats)
        env = gymnasium.make(a.env)
        for wrap in suites.suite_wrappers(a.env, training=True):
            env = wrap(env)
        return env

    env = make_vec_env(make, n_envs=a.num_envs, seed=seed)
    model = RecurrentPPO(
        "MlpLstmPolicy",
        env,
        n_steps=a.rollout_steps,
        batch_size=a.minibatch_size,
        n_epochs=a.epochs,
        learning_rate=3e-4,
        policy_kwargs=dict(lstm_hidden_size=a.size, net_arch=[64]),
        seed=seed,
        device="cpu",
        verbose=0,
    )
    tick = time.perf_counter()
    model.learn(total_timesteps=a.frames)
    return model.num_timesteps / (time.perf_counter() - tick)


def rlkit_return(a, seed: int) -> dict:
    """rlkit PPO with an LSTM (RecurrentPPO's kind of core) at the ``POPGym/*`` preset's
    settings, ``a.frames`` frames; the final deterministic evaluation (10 episodes)."""
    from rlkit.algorithms import ppo

    flags = [
        "--env", a.env, "--seed", str(seed), "--total-frames", str(a.frames),
        "--recurrent", "lstm", "--eval-every", "0", "--eval-episodes", "10",
        "--progress", "false", "--run-dir", tempfile.mkdtemp(),
    ]  # fmt: skip
    summary = ppo.main(flags)
    return {"return": float(summary["eval_return_mean"]), "fps": float(summary["fps"])}


def sb3_return(a, seed: int) -> dict:
    """RecurrentPPO with the same settings as the ``POPGym/*`` preset (32 envs x 64 steps, 4
    epochs, minibatches of 512 frames, lr 3e-4, gamma 0.99, GAE lambda 0.95, an LSTM of 64
    units for the actor and one for the critic, 64-unit heads), then the same evaluation:
    the deterministic policy, its LSTM state carried and reset at episode start, 10 episodes
    on seeds 10000 + i."""
    import gymnasium
    import numpy as np
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.env_util import make_vec_env

    from rlkit.envs import suites

    suites.register_suite(a.env)

    def make():
        env = gymnasium.make(a.env)
        for wrap in suites.suite_wrappers(a.env, training=True):
            env = wrap(env)
        return env

    model = RecurrentPPO(
        "MlpLstmPolicy",
        make_vec_env(make, n_envs=32, seed=seed),
        n_steps=64,
        batch_size=512,
        n_epochs=4,
        learning_rate=3e-4,
        gamma=0.99,
        gae_lambda=0.95,
        policy_kwargs=dict(lstm_hidden_size=64, net_arch=[64]),
        seed=seed,
        device="cpu",
        verbose=0,
    )
    tick = time.perf_counter()
    model.learn(total_timesteps=a.frames)
    fps = model.num_timesteps / (time.perf_counter() - tick)
    returns = []
    for i in range(10):
        env = make()
        obs, _ = env.reset(seed=10000 + i)
        state, start, total, done = None, np.ones((1,), bool), 0.0, False
        while not done:
            action, state = model.predict(obs, state=state, episode_start=start, deterministic=True)
            obs, reward, term, trunc, _ = env.step(action)
            total, done, start = total + float(reward), term or trunc, np.zeros((1,), bool)
        returns.append(total)
    return {"return": float(np.mean(returns)), "fps": fps}


def returns_phase(a) -> None:
    """Final returns at ``a.frames``, seed by seed, rlkit then RecurrentPPO (interleaved)."""
    rows = []
    for seed in a.seeds:
        rows.append(
            {"seed": seed, "rlkit": rlkit_return(a, seed), "sb3_contrib": sb3_return(a, seed)}
        )
        print(rows[-1], flush=True)
    med = {k: statistics.median(r[k]["return"] for r in rows) for k in ("rlkit", "sb3_contrib")}
    print(f"median final return over seeds {a.seeds}: rlkit {med['rlkit']:.3f}, "
          f"RecurrentPPO {med['sb3_contrib']:.3f}")  # fmt: skip
    if a.out:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO_ROOT
        ).stdout.strip()
        result = dict(vars(a), rows=rows, median=med, commit=commit, cpu=_cpu())
        Path(a.out + ".json").write_text(json.dumps(result, indent=2))
        lines = [
            f"# Recurrent PPO final return on {a.env} at {a.frames:,} frames: rlkit vs "
            "SB3-contrib RecurrentPPO",
            "",
            f"`python benchmarks/bench_memory.py {' '.join(sys.argv[1:])}`; commit `{commit}`;"
            f" CPU {_cpu()}; both with an LSTM of 64 and the POPGym/* preset's settings.",
            "",
            "| seed | rlkit return | RecurrentPPO return | rlkit frames/s "
            "| RecurrentPPO frames/s |",
            "| --- | --- | --- | --- | --- |",
            *(
                f"| {r['seed']} | {r['rlkit']['return']:.3f} | {r['sb3_contrib']['return']:.3f} | "
                f"{r['rlkit']['fps']:.0f} | {r['sb3_contrib']['fps']:.0f} |"
                for r in rows
            ),
            "",
            f"Median: rlkit **{med['rlkit']:.3f}**, RecurrentPPO **{med['sb3_contrib']:.3f}**.",
        ]
        Path(a.out + ".md").write_text("\n".join(lines) + "\n")


def _cpu() -> str:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError, StopIteration):
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    return cpu


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--env", default="popgym-PositionOnlyCartPoleEasy-v0")
    p.add_argument("--frames", type=int, default=16384)
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--rollout-steps", type=int, default=128)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--minibatch-size", type=int, default=256)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=None, help="write <out>.json and <out>.md")
    p.add_argument(
        "--phase",
        choices=("fps", "returns"),
        default="fps",
        help="fps: frames/s at matched settings; returns: final returns at --frames",
    )
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    a = p.parse_args()
    torch.set_num_threads(1)
    if a.phase == "returns":
        returns_phase(a)
        return
    rows = []
    for r in range(a.repeats):  # interleaved, so both sides see the same machine load
        rows.append({"repeat": r, "rlkit": rlkit_fps(a, r), "sb3_contrib": sb3_fps(a, r)})
        print(rows[-1], flush=True)
    ratio = statistics.median(x["rlkit"] / x["sb3_contrib"] for x in rows)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO_ROOT
    ).stdout.strip()
    cpu = _cpu()
    result = dict(vars(a), rows=rows, median_ratio=ratio, commit=commit, cpu=cpu)
    print(f"rlkit / RecurrentPPO frames/s, median of {a.repeats}: {ratio:.2f}")
    if a.out:
        Path(a.out + ".json").write_text(json.dumps(result, indent=2))
        lines = [
            "# Recurrent PPO frames/s: rlkit vs SB3-contrib RecurrentPPO",
            "",
            f"`python benchmarks/bench_memory.py {' '.join(sys.argv[1:])}`; commit `{commit}`;"
            f" CPU {cpu}; torch {torch.__version__}, one thread.",
            "",
            "| repeat | rlkit frames/s | RecurrentPPO frames/s | ratio |",
            "| --- | --- | --- | --- |",
            *(
                f"| {x['repeat']} | {x['rlkit']:.0f} | {x['sb3_contrib']:.0f} | "
                f"{x['rlkit'] / x['sb3_contrib']:.2f} |"
                for x in rows
            ),
            "",
            f"Median ratio: **{ratio:.2f}**.",
        ]
        Path(a.out + ".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
