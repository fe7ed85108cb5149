"""Dict observations (an image plus a vector) with rlkit's collector: frames/s against the same
run on a flat observation of the same size, and frames to a bar on a task where both entries
matter (issue 47, "Dict observations").

    PYTHONPATH=. .venv/bin/python benchmarks/bench_dictobs.py --phase fps --repeats 3 \\
        --out benchmarks/results/bench_dictobs_fps.json
    PYTHONPATH=. .venv/bin/python benchmarks/bench_dictobs.py --phase learn --seeds 0 1 2 3 4 \\
        --out benchmarks/results/bench_dictobs_learn.json

The task is :class:`tests.dictobs_task.ImageVector`: an image with one lit pixel in channel
``a`` and a vector holding a bit ``b``; action ``2 a + b`` pays 1, 8 steps an episode. Reading
both entries scores 8, one of them at most 4 (half the steps), random play 2.

Phase "fps": PPO (rlkit's defaults: 8 envs x 32 steps, 20 epochs, minibatch 256, 64x64 tanh
networks), ``--fps-frames`` frames without evaluation, frames/s of training (collection and
updates, the run summary's ``fps``), one torch thread; and frames per CPU second of this
process (``time.process_time`` around the whole run: build, collection, updates, the final
one-episode evaluation), which other jobs on a shared machine disturb far less than the wall
clock. Pairs, run alternately in one process
(the order swapped every repeat), so a busy machine slows both sides alike:

- ``dict`` ``{"image": uint8 [10, 10, 4], "vector": float32 [16]}`` with ``--encoder flatten``
  (the image's 400 pixels scaled to [0, 1], then the vector: 416 features into the 64x64 MLP)
  against ``flat``: the same task as one float32 ``[416]`` observation, ``--encoder mlp``.
  The networks are the same size: the ratio is the cost of the Dict observation itself (two
  entries collected, stored and minibatched, the uint8 cast, the concatenation);
- ``dict_minatar`` (``--pairs dict flat dict_minatar``): the same Dict observation with
  ``--encoder minatar`` (a 3x3 conv of 16 filters, a 128-wide layer: a bigger network, for
  information).

Phase "learn": PPO (defaults, ``--encoder minatar``) and DQN (``--encoder minatar``, 4 envs, one
64-wide layer, a gradient step per 4 frames, gamma 0.5) on the default task
(``image`` [6, 6, 2], ``vector`` [4]): frames until a deterministic evaluation of 10 episodes
scores at least ``--bar`` (7.5), evaluated every ``--eval-every`` frames, up to
``--max-frames``.
"""

from __future__ import annotations

import argparse
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

ENV = "tests.dictobs_task:ImageVector"
SIZES = ["image=[10,10,4]", "vector=16"]
PAIRS = {
    "dict": ["--env-kwargs", *SIZES, "--encoder", "flatten"],
    "flat": ["--env-kwargs", *SIZES, "flat=true"],
    "dict_minatar": ["--env-kwargs", *SIZES, "--encoder", "minatar"],
}
DQN_FLAGS = ["--num-envs", "4", "--hidden", "64", "--utd-ratio", "0.25", "--gamma", "0.5"]


def _run(recipe: str, flags: list[str]) -> dict:
    from tests.test_engine import load_recipe

    base = ["--env", ENV, "--progress", "false", "--run-dir", tempfile.mkdtemp()]
    return load_recipe(recipe).main([*base, *flags])


def fps_phase(args) -> dict:
    names = args.pairs
    rows: dict[str, list[float]] = {name: [] for name in names}
    cpu_rows: dict[str, list[float]] = {name: [] for name in names}
    for name in names:  # warm-up, not recorded: imports and first-call costs
        _run("ppo", [*PAIRS[name], "--total-frames", "512", "--eval-every", "0"])
    for r in range(args.repeats):
        order = list(names) if r % 2 == 0 else list(reversed(names))
        for name in order:
            flags = [*PAIRS[name], "--total-frames", str(args.fps_frames), "--eval-every", "0"]
            flags += ["--eval-episodes", "1", "--checkpoint-every", "0", "--seed", str(r)]
            cpu = time.process_time()
            summary = _run("ppo", flags)
            cpu = time.process_time() - cpu
            rows[name].append(summary["fps"])
            cpu_rows[name].append(summary["frames"] / cpu)
            print(
                f"repeat {r} {name}: {summary['fps']:.0f} frames/s, "
                f"{summary['frames'] / cpu:.0f} frames per CPU second",
                flush=True,
            )
    out: dict = {"fps": rows, "median_fps": {k: statistics.median(v) for k, v in rows.items()}}
    out["frames_per_cpu_second"] = cpu_rows
    out["median_frames_per_cpu_second"] = {k: statistics.median(v) for k, v in cpu_rows.items()}
    for name in names:
        if name != "flat":
            ratios = [d / f for d, f in zip(rows[name], rows["flat"], strict=True)]
            out[f"ratio_{name}_over_flat"] = ratios
            out[f"median_ratio_{name}_over_flat"] = statistics.median(ratios)
            cpu = [d / f for d, f in zip(cpu_rows[name], cpu_rows["flat"], strict=True)]
            out[f"cpu_ratio_{name}_over_flat"] = cpu
            out[f"median_cpu_ratio_{name}_over_flat"] = statistics.median(cpu)
    return out


def learn_phase(args) -> dict:
    out: dict[str, list[dict]] = {"ppo": [], "dqn": []}
    for recipe in ("ppo", "dqn"):
        for seed in args.seeds:
            flags = ["--encoder", "minatar", "--seed", str(seed)]
            flags += ["--total-frames", str(args.max_frames), "--eval-every", str(args.eval_every)]
            flags += ["--eval-episodes", "10", "--target-return", str(args.bar)]
            if recipe == "dqn":
                flags += DQN_FLAGS
            start = time.perf_counter()
            s = _run(recipe, flags)
            row = dict(
                seed=seed,
                solved=bool(s["solved"]),
                frames=s["solved_frames"] if s["solved"] else s["frames"],
                train_seconds=s["solved_seconds"] if s["solved"] else s["train_seconds"],
                fps=s["fps"],
                eval_return=s["eval_return_mean"],
                wall_seconds=round(time.perf_counter() - start, 1),
            )
            out[recipe].append(row)
            print(recipe, row, flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--phase", choices=("fps", "learn"), required=True)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--pairs", nargs="+", choices=list(PAIRS), default=["dict", "flat"])
    parser.add_argument("--fps-frames", type=int, default=8192)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--bar", type=float, default=7.5)
    parser.add_argument("--eval-every", type=int, default=1024)
    parser.add_argument("--max-frames", type=int, default=16384)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO_ROOT
    ).stdout.strip()
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    result = fps_phase(args) if args.phase == "fps" else learn_phase(args)
    record = {
        "command": " ".join(sys.argv),
        "commit": commit,
        "cpu": cpu,
        "cores": len(__import__("os").sched_getaffinity(0)),
        "torch": torch.__version__,
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        **result,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k.startswith("median")}, indent=2))


if __name__ == "__main__":
    main()
