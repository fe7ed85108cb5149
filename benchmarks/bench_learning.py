"""Learning benchmark: does a recipe reach a return threshold within a frame budget?

Runs ``recipes/<algo>.py`` once per seed (``--jobs`` at a time; learning is measured in
frames, so running two at once on two cores changes seconds, not results), reads each run's
``summary.json`` and ``eval.csv``, and writes every raw number plus a table to
``benchmarks/results/learning_<algo>_<env>.json/.md``.

    .venv/bin/python benchmarks/bench_learning.py ppo CartPole-v1 475 100000 --seeds 0 1 2 3 4
    .venv/bin/python benchmarks/bench_learning.py ppo Pendulum-v1 -250 300000 --eval-every 20000
    .venv/bin/python benchmarks/bench_learning.py a2c CartPole-v1 475 500000 --eval-every 10000

A run counts as solved when an evaluation (mean of ``--eval-episodes`` episodes, played as
the recipe's ``--eval-deterministic`` says) reaches the threshold within the budget; the
recipe stops there (``--target-return``).

With ``--full-budget`` every run trains for the whole budget (no ``--target-return``); a run
still counts as solved at its first evaluation at or above the threshold, and the table adds
how many evaluations reached it and the mean training-episode return (stochastic policy) over
the last 10% of the budget. Use it where one lucky evaluation says little (MountainCar-v0,
whose deterministic evaluation an untrained policy sometimes passes):

    .venv/bin/python benchmarks/bench_learning.py rnd MountainCar-v0 -160 1000000 \
        --eval-every 25000 --jobs 1 --full-budget
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    REPO_ROOT,
    command_line,
    git_commit,
    host_info,
    markdown_table,
    median_or_none,
    package_versions,
    run_measured,
    write_results,
)


def run_seed(args: argparse.Namespace, seed: int, root: Path) -> dict:
    run_dir = root / f"{args.algo}-{args.env.replace('/', '-')}-s{seed}"  # no nested dirs
    command = [
        sys.executable,
        f"recipes/{args.algo}.py",
        "--env",
        args.env,
        "--seed",
        str(seed),
        *(() if args.full_budget else ("--target-return", str(args.threshold))),
        "--total-frames",
        str(args.budget),
        "--eval-every",
        str(args.eval_every),
        "--eval-episodes",
        str(args.eval_episodes),
        "--progress",
        "false",
        "--run-dir",
        str(run_dir),
        *args.extra,
    ]
    result = run_measured(command, cwd=REPO_ROOT, timeout_s=args.timeout)
    row = {
        "seed": seed,
        "ok": result.ok,
        "wall_seconds": result.wall_seconds,
        "peak_rss_mb": result.peak_rss_mb,
    }
    summary_file = run_dir / "summary.json"
    if summary_file.is_file():
        summary = json.loads(summary_file.read_text())
        row |= {
            k: summary[k]
            for k in (
                "frames",
                "train_seconds",
                "fps",
                "solved",
                "solved_frames",
                "solved_seconds",
                "eval_return_mean",
            )
        }
        row["eval_deterministic"] = summary["config"].get("eval_deterministic", True)
        row["eval_env"] = summary["config"].get("eval_env") or args.env
        with (run_dir / "eval.csv").open() as f:
            row["curve"] = [(int(r["frames"]), float(r["return_mean"])) for r in csv.DictReader(f)]
        row["best_eval"] = max((m for _, m in row["curve"]), default=None)
        if args.full_budget:
            row |= _full_budget_stats(run_dir, row["curve"], args.threshold, row["frames"])
    else:
        row |= {"solved": False, "error": result.error_tail()}
    status = "solved" if row.get("solved") else "not solved"
    print(
        f"seed {seed}: {status} frames={row.get('solved_frames')} "
        f"best={row.get('best_eval')} train_s={row.get('train_seconds')}",
        flush=True,
    )
    return row


def _full_budget_stats(run_dir: Path, curve, threshold: float, frames: int) -> dict:
    """Solved at the first evaluation >= threshold; evaluations at the threshold; the mean
    training-episode return over the last 10% of the frames (from metrics.csv)."""
    hits = [(f, m) for f, m in curve if m >= threshold]
    out = {
        "solved": bool(hits),
        "solved_frames": hits[0][0] if hits else None,
        "solved_seconds": None,
        "evals_at_threshold": f"{len(hits)}/{len(curve)}",
    }
    with (run_dir / "eval.csv").open() as f:
        seconds = {int(r["frames"]): float(r["train_seconds"]) for r in csv.DictReader(f)}
    if hits:
        out["solved_seconds"] = seconds.get(hits[0][0])
    returns = []
    with (run_dir / "metrics.csv").open() as f:
        for r in csv.DictReader(f):
            if int(r["frames"]) >= 0.9 * frames and r.get("episode_return"):
                returns.append(float(r["episode_return"]))
    out["last_train_return"] = round(sum(returns) / len(returns), 1) if returns else None
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("algo")
    p.add_argument("env")
    p.add_argument("threshold", type=float)
    p.add_argument("budget", type=int)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--eval-every", type=int, default=5000)
    p.add_argument("--eval-episodes", type=int, default=10)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--required", type=int, default=None, help="seeds that must solve (bar)")
    p.add_argument("--out", default=None)
    p.add_argument(
        "--full-budget",
        action="store_true",
        help="train every seed for the whole budget (no early stop at the threshold)",
    )
    # flags this script does not know (after "--" or anywhere) go to the recipe
    args, extra = p.parse_known_args()
    args.extra = [a for a in extra if a != "--"]
    with (
        tempfile.TemporaryDirectory(prefix="rlkit-bench-") as tmp,
        ThreadPoolExecutor(args.jobs) as pool,
    ):
        rows = list(pool.map(lambda s: run_seed(args, s, Path(tmp)), args.seeds))
    solved = sum(bool(r.get("solved")) for r in rows)
    required = args.required if args.required is not None else len(args.seeds)
    payload = {
        "benchmark": "learning",
        "algo": args.algo,
        "env": args.env,
        "threshold": args.threshold,
        "budget_frames": args.budget,
        "seeds": args.seeds,
        "solved": solved,
        "required": required,
        "passed": solved >= required,
        "full_budget": args.full_budget,
        "median_solved_frames": median_or_none(r.get("solved_frames") for r in rows),
        "median_solved_seconds": median_or_none(r.get("solved_seconds") for r in rows),
        "runs": rows,
        "command": command_line(),
        "commit": git_commit(),
        "host": host_info(),
        "versions": package_versions(
            sys.executable, ["torch", "torchrl", "tensordict", "gymnasium", "lightning"]
        ),
    }
    columns = ["seed", "solved", "frames to solve", "train s to solve", "best eval", "final eval"]
    fields = ["seed", "solved", "solved_frames", "solved_seconds", "best_eval", "eval_return_mean"]
    if args.full_budget:
        columns += ["evals >= threshold", "train return (last 10%)"]
        fields += ["evals_at_threshold", "last_train_return"]
    table = markdown_table(
        [*columns, "fps"], [[r.get(k) for k in fields] + [r.get("fps")] for r in rows]
    )
    modes = sorted(
        {
            f"{'deterministic' if r['eval_deterministic'] else 'sampled-action'} evaluation "
            f"on {r['eval_env']}"
            for r in rows
            if "eval_deterministic" in r
        }
    )
    evaluation = f" Evaluation: {', '.join(modes)}, {args.eval_episodes} episodes." if modes else ""
    md = (
        f"# {args.algo} on {args.env}: threshold {args.threshold:g} "
        f"within {args.budget:,} frames\n\n"
        f"Solved {solved}/{len(rows)} seeds (bar: {required}).{evaluation} Command: "
        f"`{command_line()}`; commit `{payload['commit']['commit'][:10]}`.\n\n{table}\n"
    )
    env_name = args.env.replace("/", "-")  # namespaced ids such as rlkit/MountainCarSparse-v0
    stem = args.out or REPO_ROOT / "benchmarks" / "results" / f"learning_{args.algo}_{env_name}"
    for path in write_results(stem, payload, md):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
