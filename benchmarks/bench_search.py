"""Search: ``--search N`` as populations against N separate trials run one after another.

In one process (so the load of the shared CPU hits both sides in the same run):

1. the search: ``recipes/ppo.py --search N --search-space lr=log:1e-5:1e-2
   entropy_coef=0:0.05`` on CartPole-v1 (TPE, MedianPruner, batches of ``--search-batch``
   trials trained as one population each), its wall time;
2. the same N trials (each trial's settings, seed and frame budget) as N separate runs
   one after another, the old path (an Optuna loop over ``ppo.main``, without the processes'
   start-up), the first of them the best trial's ``best_config.yaml`` run alone with
   ``--config``: its final evaluation return is the "best config rerun alone" figure.

Writes ``results/bench_search.{json,md}`` with the command, commit and CPU.

    .venv/bin/python benchmarks/bench_search.py            # N=16, 16,384 frames per trial
    .venv/bin/python benchmarks/bench_search.py --quick    # smoke run, writes nothing
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO_ROOT, command_line, git_commit, host_info, markdown_table, write_results

RESULTS = Path(__file__).parent / "results"


def _process(python: str, argv: list[str]) -> float:
    """Run ``recipes/ppo.py argv`` in a fresh process; its wall seconds."""
    tick = time.perf_counter()
    done = subprocess.run(
        [python, "recipes/ppo.py", *argv], capture_output=True, text=True, check=False
    )
    seconds = time.perf_counter() - tick
    if done.returncode != 0:
        raise RuntimeError(f"recipes/ppo.py {' '.join(argv)} failed:\n{done.stderr[-2000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--pruner", default="halving")
    parser.add_argument("--frames", type=int, default=16_384)
    parser.add_argument("--eval-every", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="4 trials of 2,048 frames")
    parser.add_argument("--out", default=str(RESULTS / "bench_search"))
    args = parser.parse_args()
    if args.quick:
        args.trials, args.batch, args.frames, args.eval_every = 4, 4, 2048, 1024
    os.chdir(REPO_ROOT)
    python = sys.executable
    common = ["--env", "CartPole-v1", "--total-frames", str(args.frames), "--seed", str(args.seed)]
    common += ["--eval-every", str(args.eval_every), "--progress", "false"]
    common += ["--checkpoint-every", "0", "--threads", "1"]
    space = ["--search-space", "lr=log:1e-5:1e-2", "entropy_coef=0:0.05"]
    host = host_info()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        search_dir = root / "search"
        argv = [*common, "--search", str(args.trials), "--search-batch", str(args.batch)]
        argv += ["--search-pruner", args.pruner, *space, "--run-dir", str(search_dir)]
        search_s = _process(python, argv)
        summary = json.loads((search_dir / "search.json").read_text())
        with (search_dir / "trials.csv").open() as f:
            trials = list(csv.DictReader(f))
        best = summary["best"]
        # the old path: every trial as its own process, full budget, one after another; the
        # best trial's first, from its best_config.yaml as a user reruns it
        order = sorted(trials, key=lambda t: int(t["number"]) != best["number"])
        separate = []
        tick = time.perf_counter()
        for t in order:
            run_dir = root / f"trial_{int(t['number']):02d}"
            if int(t["number"]) == best["number"]:
                flags = [
                    "--config",
                    str(search_dir / "best_config.yaml"),
                    "--run-dir",
                    str(run_dir),
                ]
                flags += ["--progress", "false"]
            else:
                flags = [*common, "--run-dir", str(run_dir), "--lr", t["params_lr"]]
                flags += ["--entropy-coef", t["params_entropy_coef"]]
            seconds = _process(python, flags)
            s = json.loads((run_dir / "summary.json").read_text())
            separate.append(
                {
                    "number": int(t["number"]),
                    "state_in_search": t["state"],
                    "value_in_search": float(t["value"]) if t["value"] else None,
                    "frames_in_search": int(t["frames"]) if t["frames"] else None,
                    "lr": float(t["params_lr"]),
                    "entropy_coef": float(t["params_entropy_coef"]),
                    "separate_return": s["eval_return_mean"],
                    "separate_seconds": round(seconds, 2),
                    "separate_train_seconds": s["train_seconds"],
                }
            )
        separate_s = time.perf_counter() - tick
    train_s = sum(r["separate_train_seconds"] for r in separate)
    best_rerun = next(r for r in separate if r["number"] == best["number"])
    payload = {
        "command": command_line(),
        "commit": git_commit(),
        "host": host,
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "settings": {
            "trials": args.trials,
            "search_batch": args.batch,
            "frames_per_trial": args.frames,
            "eval_every": args.eval_every,
            "seed": args.seed,
            "space": space[1:],
            "sampler": summary["sampler"],
            "pruner": summary["pruner"],
        },
        "search_seconds": round(search_s, 2),
        "separate_seconds": round(separate_s, 2),
        "speedup": round(separate_s / search_s, 3),
        "separate_train_seconds_sum": round(train_s, 2),
        "speedup_vs_train_seconds_only": round(train_s / search_s, 3),
        "search": {k: v for k, v in summary.items() if k not in ("study", "best_config")},
        "best_rerun_alone_return": best_rerun["separate_return"],
        "trials": separate,
    }
    print(json.dumps({k: payload[k] for k in ("search_seconds", "separate_seconds", "speedup")}))
    print(json.dumps({"best_rerun_alone_return": best_rerun["separate_return"]}))
    if args.quick:
        return
    rows = [
        [
            r["number"],
            r["state_in_search"],
            r["value_in_search"],
            r["frames_in_search"],
            f"{r['lr']:.3g}",
            f"{r['entropy_coef']:.3g}",
            r["separate_return"],
            r["separate_seconds"],
        ]
        for r in sorted(separate, key=lambda r: r["number"])
    ]
    md = f"""# Search: {args.trials} trials as populations vs {args.trials} separate runs

Command: `{payload["command"]}` at commit {payload["commit"]["commit"][:10]}
(dirty: {payload["commit"]["dirty"]}); CPU: {host["cpu_model"]}, {host["logical_cpus"]} logical
CPUs, load average at start {host["load_average_at_start"]} and at end
{payload["load_average_at_end"]} (a shared machine).

PPO on CartPole-v1, {args.frames:,} frames per trial, evaluation every {args.eval_every:,}
frames, seed {args.seed}, space `{" ".join(space[1:])}`, sampler {summary["sampler"]}, pruner
{summary["pruner"]}, batches of {args.batch} trials as one population.

| | wall seconds |
|---|---|
| `--search {args.trials}` (populations of {args.batch}) | {search_s:.1f} |
| the same {args.trials} trials as separate runs, one after another | {separate_s:.1f} |
| speed-up | {separate_s / search_s:.2f}x |
| the separate runs' training seconds only (no start-up, set-up or final evaluation) | {
        train_s:.1f} |
| speed-up against those alone | {train_s / search_s:.2f}x |

Search: {summary["complete"]} complete, {summary["pruned"]} pruned, {summary["failed"]} failed;
best trial {best["number"]} (lr {best["params"]["lr"]:.3g}, entropy_coef
{best["params"]["entropy_coef"]:.3g}): {best["value"]:.1f} in the search, and
{best_rerun["separate_return"]:.1f} rerun alone with `--config best_config.yaml`.

{
        markdown_table(
            [
                "trial",
                "state",
                "value in search",
                "frames in search",
                "lr",
                "entropy_coef",
                "return run alone",
                "seconds alone",
            ],
            rows,
        )
    }
"""
    for path in write_results(args.out, payload, md):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
