"""Collection speed: rlkit's VectorEnvCollector vs TorchRL's Collector over the same env.

CartPole-v1 from ``make_env`` (optionally with observation and reward normalisation),
rlkit's categorical actor (64x64 tanh MLP, a TorchRL ``ProbabilisticActor``: sampled
action, log-prob, logits), one torch thread, batches of ``num_envs x 32`` steps as in the
PPO CartPole setting. Three ways to fill a batch are measured round-robin (repeat r of every
configuration before repeat r+1), so load on the shared CPU hits them alike:

- ``torchrl``: ``torchrl.collectors.Collector(env, actor, ...)``;
- ``rlkit``: ``rlkit.data.collector.VectorEnvCollector(env, actor, ...)``;
- ``floor``: the policy forward and the gymnasium vector step alone in a bare loop
  (no storage, no transforms): what any collector with this policy must pay.

The report gives median frames/s, the median of the per-repeat ratios rlkit / torchrl
(paired, measured back to back) and the share of the floor each reaches.

    .venv/bin/python benchmarks/bench_collect.py            # writes results/bench_collect.*
    .venv/bin/python benchmarks/bench_collect.py --quick    # a smoke run, writes nothing
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import gymnasium
import tensordict
import torch
import torchrl
from tensordict import TensorDict
from torchrl.collectors import Collector

from rlkit import keys
from rlkit.data.collector import VectorEnvCollector
from rlkit.envs import make_env
from rlkit.modules.actors import make_actor

ENV_ID = "CartPole-v1"
STEPS_PER_BATCH = 32
RESULTS = Path(__file__).parent / "results"
KINDS = ("torchrl", "rlkit", "floor")


def floor_batches(env, actor, steps: int) -> Iterator[int]:
    """Policy forward + gymnasium step (+ masked reset) per step, nothing else."""
    venv, n = env.base_env._env, env.batch_size.numel()
    obs = torch.as_tensor(venv.reset()[0])
    while True:
        with torch.no_grad():
            for _ in range(steps):
                out = actor(TensorDict._new_unsafe({keys.OBSERVATION: obs}, torch.Size([n])))
                obs_np, _, term, trunc, _ = venv.step(out[keys.ACTION].numpy())
                done = term | trunc
                if done.any():
                    obs_np, _ = venv.reset(options={"reset_mask": done})
                obs = torch.from_numpy(obs_np)
        yield n * steps


def build(kind: str, n: int, normalize: bool, seed: int) -> Iterator[int]:
    env = make_env(
        ENV_ID, num_envs=n, seed=seed, normalize_obs=normalize, normalize_reward=normalize
    )
    torch.manual_seed(seed)
    actor = make_actor(env.observation_spec, env.action_spec)
    if kind == "floor":
        return floor_batches(env, actor, STEPS_PER_BATCH)
    kw = {"auto_register_policy_transforms": False} if kind == "torchrl" else {}
    cls = Collector if kind == "torchrl" else VectorEnvCollector
    collector = cls(env, actor, frames_per_batch=n * STEPS_PER_BATCH, total_frames=-1, **kw)
    return (batch.numel() for batch in collector)


def configurations(sizes: list[int], seed: int) -> dict[str, Callable[[], Iterator[int]]]:
    configs = {}
    for normalize in (False, True):
        for n in sizes:
            for kind in KINDS:
                name = f"{kind} x{n}" + (" norm" if normalize else "")
                configs[name] = lambda k=kind, n=n, z=normalize: build(k, n, z, seed)
    return configs


def measure(configs: dict, *, frames: int, repeats: int) -> dict[str, list[float]]:
    iterators = {name: make() for name, make in configs.items()}
    for it in iterators.values():
        next(it)  # warm-up: lazy initialisation
    fps: dict[str, list[float]] = {name: [] for name in configs}
    for _ in range(repeats):
        for name, it in iterators.items():
            done, start = 0, time.perf_counter()
            while done < frames:
                done += next(it)
            fps[name].append(done / (time.perf_counter() - start))
    return fps


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def uncommitted() -> list[str]:
    """Tracked source files that differ from the recorded commit (they were measured too)."""
    cmd = ["git", "status", "--porcelain", "--untracked-files=no", "--", "rlkit", "benchmarks"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).parent)
    except OSError:
        return []
    return [line[3:] for line in out.stdout.splitlines() if line.endswith(".py")]


def summarize(fps: dict[str, list[float]]) -> list[dict]:
    rows = []
    for name in fps:
        if not name.startswith("rlkit"):
            continue
        ref, floor = name.replace("rlkit", "torchrl"), name.replace("rlkit", "floor")
        paired = [a / b for a, b in zip(fps[name], fps[ref])]
        rows.append(
            {
                "config": name.replace("rlkit ", ""),
                "torchrl_fps": round(statistics.median(fps[ref])),
                "rlkit_fps": round(statistics.median(fps[name])),
                "floor_fps": round(statistics.median(fps[floor])),
                "ratio_median_paired": round(statistics.median(paired), 2),
                "ratio_min_paired": round(min(paired), 2),
                "ratio_max_paired": round(max(paired), 2),
            }
        )
    return rows


def markdown(rows: list[dict], meta: dict) -> str:
    v = meta["versions"]
    load = meta["load_average_1_5_15min"]
    lines = [
        "# Collection speed: VectorEnvCollector vs TorchRL Collector (CartPole-v1)",
        "",
        f"Command: `{meta['command']}`  ",
        f"Commit: `{meta['commit']}` (uncommitted changes: "
        f"{', '.join(meta['uncommitted']) or 'none'}), seed "
        f"{meta['seed']}, torch threads 1, batches of num_envs x {STEPS_PER_BATCH} steps, "
        f"{meta['repeats']} interleaved repeats of >= {meta['frames_per_repeat']} frames, "
        "median.  ",
        f"Versions: torch {v['torch']}, torchrl {v['torchrl']}, tensordict {v['tensordict']}, "
        f"gymnasium {v['gymnasium']}, Python {v['python']}.  ",
        "The CPU (2 cores) is shared with other work: compare ratios, not absolute numbers "
        f"(1-min load average {load['before'][0]:.2f} before, {load['after'][0]:.2f} after).  ",
        "Policy: rlkit categorical actor (64x64 tanh MLP, TorchRL ProbabilisticActor). "
        "`norm`: make_env with normalize_obs and normalize_reward. `floor`: policy forward + "
        "gymnasium vector step only (no storage, no transforms).",
        "",
        "| env config | TorchRL Collector fps | VectorEnvCollector fps | speed-up (paired "
        "median, min-max) | floor fps | rlkit / floor |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['config']} | {r['torchrl_fps']} | {r['rlkit_fps']} | "
            f"{r['ratio_median_paired']:.2f}x ({r['ratio_min_paired']:.2f}-"
            f"{r['ratio_max_paired']:.2f}) | {r['floor_fps']} | "
            f"{r['rlkit_fps'] / r['floor_fps']:.0%} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--frames", type=int, default=2048, help="frames per repeat")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="tiny run, nothing written")
    args = parser.parse_args()
    if args.quick:
        args.frames, args.repeats = 256, 2
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    fps = measure(configurations(args.sizes, args.seed), frames=args.frames, repeats=args.repeats)
    meta = {
        "benchmark": "bench_collect",
        "env_id": ENV_ID,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "commit": git_commit(),
        "uncommitted": uncommitted(),
        "seed": args.seed,
        "repeats": args.repeats,
        "frames_per_repeat": args.frames,
        "steps_per_batch": STEPS_PER_BATCH,
        "torch_threads": 1,
        "load_average_1_5_15min": {"before": load_before, "after": os.getloadavg()},
        "versions": {
            "torch": torch.__version__,
            "torchrl": torchrl.__version__,
            "tensordict": tensordict.__version__,
            "gymnasium": gymnasium.__version__,
            "python": platform.python_version(),
        },
    }
    rows = summarize(fps)
    text = markdown(rows, meta)
    print(text)
    if not args.quick:
        result = {
            **meta,
            "results": rows,
            "raw_fps": {k: [round(x) for x in v] for k, v in fps.items()},
        }
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "bench_collect.json").write_text(json.dumps(result, indent=2) + "\n")
        (RESULTS / "bench_collect.md").write_text(text)


if __name__ == "__main__":
    main()
