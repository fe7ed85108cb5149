"""Populations: P PPO members in one process against one member's standalone run.

PPO on CartPole-v1 at SB3's settings (8 envs x 32 steps, 20 epochs of one 256-row
minibatch), ``--total-frames`` frames per member, no evaluation during training and a short
final one (1 episode, at most 100 steps) on both sides. For each population size P, in
round-robin rounds (so load on the shared CPU hits every size alike), one fresh process of

    recipes/ppo.py --population P ...        (P = 1 runs the plain recipe: no population)

and the report gives the median training seconds (the engine's ``train_seconds``, collection
and updates), whole-process wall seconds and peak RSS per size, and the ratio to P = 1: the
population is worth it when P members cost less than P standalone runs (the issue's bar:
P = 16 within 6.4x one run, i.e. 2.5x the throughput of 16 separate runs).

    .venv/bin/python benchmarks/bench_population.py          # writes results/population_ppo.*
    .venv/bin/python benchmarks/bench_population.py --quick  # smoke run, writes nothing
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from common import (
    REPO_ROOT,
    command_line,
    git_commit,
    host_info,
    markdown_table,
    run_measured,
    write_results,
)

RESULTS = Path(__file__).parent / "results"
FLAGS = [
    "--num-envs", "8", "--rollout-steps", "32", "--epochs", "20", "--minibatch-size", "256",
    "--eval-every", "0", "--eval-episodes", "1", "--eval-max-steps", "100",
    "--progress", "false", "--checkpoint-every", "0",
]  # fmt: skip


def _run(
    python: str, size: int, frames: int, seed: int, threads: int, extra: list[str] = ()
) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        argv = [python, "recipes/ppo.py", *FLAGS, "--total-frames", str(frames)]
        argv += ["--seed", str(seed), "--threads", str(threads), "--run-dir", str(run_dir)]
        argv += list(extra)
        if size > 1:
            argv += ["--population", str(size)]
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        result = run_measured(argv, env=env, timeout_s=3600)
        if result.returncode != 0:
            raise RuntimeError(f"P={size} failed:\n{result.stderr[-2000:]}")
        summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "size": size,
        "seed": seed,
        "train_seconds": summary["train_seconds"],
        "wall_seconds": round(result.wall_seconds, 2),
        "peak_rss_mb": round(result.peak_rss_mb),
        "member_frames": summary["frames"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=[1, 4, 16, 64],
        help="population sizes; P = 1 (the plain recipe, the reference) is always run",
    )  # fmt: skip
    parser.add_argument("--frames", type=int, default=20480, help="frames per member")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="P = 1, 4 at 2,048 frames; no files")
    parser.add_argument(
        "--extra", default="", help="flags added to every run, e.g. '--accelerator gpu'"
    )
    parser.add_argument("--out", default=str(RESULTS / "population_ppo"), help="results stem")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.frames, args.rounds = [1, 4], 2048, 1
    args.sizes = sorted(set(args.sizes) | {1})  # every ratio is to P = 1
    runs = []
    for r in range(args.rounds):
        for size in args.sizes:
            run = _run(
                sys.executable, size, args.frames, seed=r, threads=args.threads,
                extra=args.extra.split(),
            )  # fmt: skip
            runs.append(run)
            print(json.dumps(run), flush=True)

    def median(size: int, key: str) -> float:
        return statistics.median(x[key] for x in runs if x["size"] == size)

    base_train, base_wall = median(1, "train_seconds"), median(1, "wall_seconds")
    rows, summary = [], {}
    for size in args.sizes:
        train, wall = median(size, "train_seconds"), median(size, "wall_seconds")
        summary[size] = {
            "train_seconds": train,
            "wall_seconds": wall,
            "peak_rss_mb": median(size, "peak_rss_mb"),
            "train_ratio_to_one": round(train / base_train, 2),
            "wall_ratio_to_one": round(wall / base_wall, 2),
            "throughput_vs_separate_runs": round(size * base_train / train, 2),
            "member_frames_per_second": round(size * args.frames / train),
        }
        s = summary[size]
        rows.append([
            size, train, s["train_ratio_to_one"], wall, s["wall_ratio_to_one"],
            s["throughput_vs_separate_runs"], s["member_frames_per_second"], s["peak_rss_mb"],
        ])  # fmt: skip
    table = markdown_table(
        [
            "P", "train s", "train / P=1", "wall s", "wall / P=1",
            "throughput vs P separate runs", "frames/s (all members)", "peak RSS MB",
        ],
        rows,
    )  # fmt: skip
    print(table)
    if args.quick:
        return
    payload = {
        "benchmark": "population_ppo",
        "command": command_line(),
        "commit": git_commit(REPO_ROOT),
        "host": host_info(),
        "settings": {"frames_per_member": args.frames, "rounds": args.rounds,
                     "threads": args.threads, "flags": FLAGS + args.extra.split()},
        "seeds": list(range(args.rounds)),
        "summary": summary,
        "runs": runs,
    }  # fmt: skip
    host = payload["host"]
    markdown = "\n".join(
        [
            "# PPO populations on CartPole-v1 (SB3's settings) against one standalone run",
            "",
            f"- commit `{payload['commit'].get('commit', '?')[:12]}`",
            f"- command: `{payload['command']}`",
            f"- host: {host.get('cpu_model', '?')}, load at start "
            f"{host.get('load_average_at_start')}; {args.threads} torch thread(s)",
            f"- {args.frames:,} frames per member; medians over {args.rounds} round(s), sizes "
            "round-robin in each; seeds 0..rounds-1; P = 1 is the plain recipe",
            "- `train s`: the engine's training seconds (collection and updates); `wall s`: the "
            "whole process (imports, set-up, final evaluation)",
            "",
            table,
            "",
        ]
    )
    write_results(args.out, payload, markdown)


if __name__ == "__main__":
    main()
