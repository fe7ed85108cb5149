"""Collection speed of an env given as a factory: a gymnasium env vs a TorchRL env.

CartPole-v1, 8 sub-envs, one torch thread, rlkit's categorical actor (64x64 tanh MLP),
batches of 8 x 32 steps, through :func:`rlkit.data.collector.make_collector` as a run
collects:

- ``gymnasium``: ``make_env(lambda: gymnasium.make("CartPole-v1"), num_envs=8)``: copies in
  one gymnasium ``SyncVectorEnv``, stepped by rlkit's ``VectorEnvCollector``;
- ``torchrl``: ``make_env(lambda: GymEnv("CartPole-v1"), num_envs=8)``: TorchRL envs batched
  by ``SerialEnv``, stepped by TorchRL's ``Collector`` (the fallback that warns).

Repeats alternate between the two (load on the shared CPU hits both alike); the median
frames/s and the median of the paired ratios are printed.

    .venv/bin/python benchmarks/bench_own_env.py [--repeats 7] [--frames 4096]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time

import gymnasium
import torch
from torchrl.envs import GymEnv

from rlkit.data.collector import make_collector
from rlkit.envs import make_env
from rlkit.modules.actors import make_actor

FACTORIES = {
    "gymnasium": lambda: gymnasium.make("CartPole-v1"),
    "torchrl": lambda: GymEnv("CartPole-v1"),
}


def fps(kind: str, frames: int) -> float:
    env = make_env(FACTORIES[kind], num_envs=8, seed=0)
    actor = make_actor(env.observation_spec, env.action_spec, hidden=(64, 64))
    collector = make_collector(env, actor, frames_per_batch=8 * 32)
    batches = iter(collector)
    next(batches)  # warm-up
    start, done = time.perf_counter(), 0
    while done < frames:
        done += next(batches).numel()
    seconds = time.perf_counter() - start
    collector.shutdown()
    env.close(raise_if_closed=False)
    return done / seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--frames", type=int, default=4096)
    args = parser.parse_args()
    torch.set_num_threads(1)
    logging.getLogger("rlkit.data.collector").setLevel(logging.ERROR)
    results: dict[str, list[float]] = {k: [] for k in FACTORIES}
    for _ in range(args.repeats):
        for kind in FACTORIES:
            results[kind].append(fps(kind, args.frames))
    ratios = [g / t for g, t in zip(results["gymnasium"], results["torchrl"], strict=True)]
    for kind, values in results.items():
        print(
            f"{kind}: median {statistics.median(values):,.0f} frames/s "
            f"({min(values):,.0f}-{max(values):,.0f})"
        )
    print(
        f"gymnasium / torchrl: median {statistics.median(ratios):.2f}x "
        f"({min(ratios):.2f}-{max(ratios):.2f})"
    )


if __name__ == "__main__":
    main()
