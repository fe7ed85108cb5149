"""Collection speed of ``make_env`` against TorchRL's own ways to batch CartPole.

Every configuration is stepped by a TorchRL ``Collector`` with the same small MLP
categorical policy (64x64 tanh, sampled actions), one torch thread. Configurations are
measured round-robin (repeat r of every configuration before repeat r+1) so load on the
shared CPU hits them alike; the report gives the median frames/s and the ratio to
``SerialEnv`` with the same number of envs, measured in the same run.

    .venv/bin/python benchmarks/bench_env.py            # writes benchmarks/results/bench_env.*
    .venv/bin/python benchmarks/bench_env.py --quick    # a smoke run, writes nothing
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
from collections.abc import Callable
from pathlib import Path

import gymnasium
import tensordict
import torch
import torchrl
from gymnasium.vector import AutoresetMode
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.collectors import Collector
from torchrl.envs import EnvBase, GymEnv, GymWrapper, SerialEnv

from rlkit import keys
from rlkit.envs import make_env

ENV_ID = "CartPole-v1"
RESULTS = Path(__file__).parent / "results"


def policy() -> nn.Module:
    net = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2))

    def sample(logits: torch.Tensor) -> torch.Tensor:
        return torch.distributions.Categorical(logits=logits).sample()

    return TensorDictModule(
        nn.Sequential(net, _Lambda(sample)), in_keys=[keys.OBSERVATION], out_keys=[keys.ACTION]
    )


class _Lambda(nn.Module):
    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


def bare_wrapper(n: int, mode: AutoresetMode) -> EnvBase:
    """A sync gymnasium vector env in a bare GymWrapper (no return / step tracking).

    SAME_STEP is the path ARCHITECTURE.md measured first; DISABLED is make_env's, bare.
    """
    venv = gymnasium.make_vec(
        ENV_ID, num_envs=n, vectorization_mode="sync", vector_kwargs={"autoreset_mode": mode}
    )
    return GymWrapper(venv, categorical_action_encoding=True)


def configurations(sizes: list[int], seed: int) -> dict[str, Callable[[], EnvBase]]:
    configs: dict[str, Callable[[], EnvBase]] = {
        "GymEnv x1": lambda: GymEnv(ENV_ID, categorical_action_encoding=True)
    }
    for n in sizes:
        configs |= {
            f"SerialEnv x{n}": lambda n=n: SerialEnv(
                n, lambda: GymEnv(ENV_ID, categorical_action_encoding=True)
            ),
            f"GymWrapper SAME_STEP x{n}": lambda n=n: bare_wrapper(n, AutoresetMode.SAME_STEP),
            f"GymWrapper DISABLED x{n}": lambda n=n: bare_wrapper(n, AutoresetMode.DISABLED),
            f"make_env x{n}": lambda n=n: make_env(ENV_ID, num_envs=n, seed=seed),
            f"make_env normalize_obs x{n}": lambda n=n: make_env(
                ENV_ID, num_envs=n, seed=seed, normalize_obs=True
            ),
        }
    return configs


def measure(
    configs: dict[str, Callable[[], EnvBase]], *, frames: int, repeats: int, seed: int
) -> dict[str, list[float]]:
    torch.manual_seed(seed)
    iterators = {}
    for name, build in configs.items():
        env = build()
        n = env.batch_size.numel() or 1
        collector = Collector(
            env,
            policy(),
            frames_per_batch=max(n, frames // n * n),
            total_frames=-1,
            auto_register_policy_transforms=False,
        )
        iterators[name] = iter(collector)
        next(iterators[name])  # warm-up: first resets, lazy initialisation
    # many short repeats, round-robin: a burst of load on the shared CPU spoils few of them
    fps: dict[str, list[float]] = {name: [] for name in configs}
    for _ in range(repeats):
        for name, it in iterators.items():
            start = time.perf_counter()
            batch = next(it)
            fps[name].append(batch.numel() / (time.perf_counter() - start))
    return fps


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def report(fps: dict[str, list[float]], sizes: list[int], meta: dict) -> tuple[dict, str]:
    medians = {name: statistics.median(v) for name, v in fps.items()}
    rows = []
    for name, median in medians.items():
        n = int(name.rsplit("x", 1)[1])
        serial = medians.get(f"SerialEnv x{n}")
        ratio = None if serial is None else median / serial
        rows.append(
            {"config": name, "num_envs": n, "median_fps": round(median), "vs_serial": ratio}
        )
    result = {
        **meta,
        "results": rows,
        "raw_fps": {k: [round(x) for x in v] for k, v in fps.items()},
    }
    lines = [
        "# make_env collection speed (CartPole-v1, TorchRL Collector, MLP policy)",
        "",
        f"Command: `{meta['command']}`  ",
        f"Commit: `{meta['commit']}`, seed {meta['seed']}, torch threads 1, "
        f"{meta['repeats']} repeats of {meta['frames_per_repeat']} frames, median.  ",
        f"Versions: torch {meta['versions']['torch']}, torchrl {meta['versions']['torchrl']}, "
        f"tensordict {meta['versions']['tensordict']}, gymnasium "
        f"{meta['versions']['gymnasium']}, Python {meta['versions']['python']}.  ",
        "The CPU (2 cores) is shared with other work: compare ratios, not absolute numbers "
        f"(1-min load average {meta['load_average_1_5_15min']['before'][0]:.2f} before, "
        f"{meta['load_average_1_5_15min']['after'][0]:.2f} after).",
        "",
        "| configuration | envs | frames/s (median) | vs SerialEnv same envs |",
        "| --- | ---: | ---: | ---: |",
    ]
    for row in rows:
        ratio = "" if row["vs_serial"] is None else f"{row['vs_serial']:.2f}x"
        lines.append(f"| {row['config']} | {row['num_envs']} | {row['median_fps']} | {ratio} |")
    return result, "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--frames", type=int, default=2048, help="frames per repeat")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="tiny run, nothing written")
    args = parser.parse_args()
    if args.quick:
        args.frames, args.repeats = 256, 1
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    fps = measure(
        configurations(args.sizes, args.seed),
        frames=args.frames,
        repeats=args.repeats,
        seed=args.seed,
    )
    meta = {
        "benchmark": "bench_env",
        "env_id": ENV_ID,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "commit": git_commit(),
        "seed": args.seed,
        "repeats": args.repeats,
        "frames_per_repeat": args.frames,
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
    result, markdown = report(fps, args.sizes, meta)
    print(markdown)
    if not args.quick:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "bench_env.json").write_text(json.dumps(result, indent=2) + "\n")
        (RESULTS / "bench_env.md").write_text(markdown)


if __name__ == "__main__":
    main()
