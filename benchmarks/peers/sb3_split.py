"""Peer time split: Stable-Baselines3 PPO milliseconds per batch in collection and in update.

Runs in ``.venv-sb3`` (``benchmarks/peers/setup_sb3.sh``)::

    .venv-sb3/bin/python benchmarks/peers/sb3_split.py CartPole-v1 0 --batches 60

Builds PPO with the rl-zoo3 settings of the shared protocol (read from
``../shared/peers/sb3_solve.py`` by ``sb3_fps.load_zoo``), one torch thread, and times every
``collect_rollouts`` and every ``train`` call of ``model.learn`` (the first ``--warmup``
batches dropped). Prints one JSON line with the per-batch times in ms.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from sb3_fps import DEFAULT_PROTOCOL, load_zoo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("env_id")
    parser.add_argument("seed", type=int)
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--protocol", type=Path, default=DEFAULT_PROTOCOL)
    args = parser.parse_args()
    cfg = load_zoo(args.protocol)[("ppo", args.env_id)]

    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(1)
    env = make_vec_env(args.env_id, n_envs=cfg["n_envs"], seed=args.seed)
    model = PPO("MlpPolicy", env, seed=args.seed, device="cpu", verbose=0, **cfg["kw"])
    times: dict[str, list[float]] = {"collect": [], "update": []}

    def timed(name, fn):
        def wrapper(*a, **k):
            start = time.perf_counter()
            out = fn(*a, **k)
            times[name].append((time.perf_counter() - start) * 1e3)
            return out

        return wrapper

    model.collect_rollouts = timed("collect", model.collect_rollouts)
    model.train = timed("update", model.train)
    frames_per_batch = cfg["n_envs"] * cfg["kw"]["n_steps"]
    model.learn(total_timesteps=args.batches * frames_per_batch)
    result = {
        "peer": "sb3",
        "env": args.env_id,
        "seed": args.seed,
        "frames_per_batch": frames_per_batch,
        **{f"{k}_ms": round(statistics.median(v[args.warmup :]), 3) for k, v in times.items()},
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
