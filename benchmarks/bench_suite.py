"""Suite benchmark: one recipe on every MuJoCo v5 task gymnasium registers, against the
published figures and, where rl-zoo3 tunes the task, SB3 in the same run.

For each task it runs ``bench_learning.py ALGO TASK BAR FRAMES --full-budget`` (every seed
trains the whole budget; with ``--sb3-python``, SB3 with the zoo's settings,
``peers/sb3_final.py``, interleaved for the same seeds) and writes
``<out-dir>/<task>.json|md|png``; then the summary table ``<out-dir>.md`` (and ``.json``):
median final return over the seeds, SB3's in the same run, CleanRL's and rl-zoo3's published
figures and the ratios. Resumable: a task whose ``<task>.json`` exists is not run again (delete
it to rerun); ``--summary-only`` just rewrites the table from what is there.

    # the lead's runs (mujoco and SB3 live in /work/benchvenv; hours, not minutes):
    PYTHONPATH=. /work/benchvenv/bin/python benchmarks/bench_suite.py ppo \\
        --sb3-python /work/benchvenv/bin/python
    PYTHONPATH=. /work/benchvenv/bin/python benchmarks/bench_suite.py sac \\
        --sb3-python /work/benchvenv/bin/python
    PYTHONPATH=. /work/benchvenv/bin/python benchmarks/bench_suite.py appo
    # smoke test (a few thousand frames, out of benchmarks/results):
    PYTHONPATH=. /work/benchvenv/bin/python benchmarks/bench_suite.py ppo --tasks Hopper-v5 \\
        --frames 4096 --seeds 0 --eval-every 2048 --out-dir /tmp/suite_smoke \\
        --sb3-python /work/benchvenv/bin/python

Defaults per recipe (``ALGOS``): PPO at 1M frames on every task, seeds 0-2; SAC at 300k on
the four tasks both CleanRL and the zoo publish (HalfCheetah, Hopper, Walker2d, Ant's zoo
figure); APPO at 1M on HalfCheetah, Hopper and Walker2d. The bar a seed "solves" in each
task report is the issue's: at least CleanRL's published figure and at least 0.8x the zoo's
(the larger of the two where both exist), else gymnasium's ``reward_threshold`` for the task;
the summary's verdict is on the median.

Published figures (mean final return of the deterministic policy):

- CleanRL: ``ppo_continuous_action.py`` and ``sac_continuous_action.py`` (benchmark tag
  pr-424, MuJoCo v4, 3 seeds, 1M frames), vwxyzjn/cleanrl ``docs/benchmark/
  ppo_continuous_action.md`` and ``docs/benchmark/sac.md`` at commit 35896b1, included in
  docs.cleanrl.dev/rl-algorithms/ppo/ and /sac/.
- rl-zoo3: ``benchmark.md`` ("Performance of trained agents", one run, MuJoCo v3, its
  ``n_timesteps``: 1M for these), DLR-RM/rl-baselines3-zoo at commit 0088472.

The v3/v4 figures compare levels on the v5 tasks, not digits (v5 changes model details).
SAC's figures are at 1M frames, the suite runs it at 300k: there SB3 in the same run is
the comparison, the published figures a ceiling.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    REPO_ROOT,
    command_line,
    git_commit,
    host_info,
    markdown_table,
    write_results,
)

#: CleanRL's published PPO (ppo_continuous_action.py) and SAC figures, MuJoCo v4, 3 seeds,
#: 1M frames (docs/benchmark/ppo_continuous_action.md and sac.md, cleanrl@35896b1)
CLEANRL = {
    "ppo": {
        "HalfCheetah-v5": 1442.64,
        "Walker2d-v5": 2287.95,
        "Hopper-v5": 2382.86,
        "InvertedPendulum-v5": 963.09,
        "Humanoid-v5": 716.11,
        "Pusher-v5": -40.38,
    },
    "sac": {
        "HalfCheetah-v5": 9634.89,
        "Walker2d-v5": 3591.45,
        "Hopper-v5": 2310.46,
        "InvertedPendulum-v5": 909.37,
        "Humanoid-v5": 4996.29,
        "Pusher-v5": -22.45,
    },
}
CLEANRL["appo"] = CLEANRL["ppo"]  # APPO is held to CleanRL's PPO figures

#: rl-zoo3's published figures (benchmark.md, one run, MuJoCo v3, rl-baselines3-zoo@0088472);
#: PPO's and SAC's rows for the MuJoCo tasks (1M frames each)
ZOO_PUBLISHED = {
    "ppo": {
        "Ant-v5": 1327.158,
        "HalfCheetah-v5": 5819.099,
        "Hopper-v5": 2410.435,
        "Swimmer-v5": 281.561,
        "Walker2d-v5": 3478.798,
    },
    "sac": {
        "Ant-v5": 4615.791,
        "HalfCheetah-v5": 9535.451,
        "Hopper-v5": 2325.547,
        "Swimmer-v5": 345.568,
        "Walker2d-v5": 3863.203,
    },
}
ZOO_PUBLISHED["appo"] = ZOO_PUBLISHED["ppo"]

#: per recipe: frame budget, evaluation interval, default tasks (None: the whole suite) and
#: what the summary's verdict compares with ("published" figures, the default, or "sb3": SB3
#: in the same run, for SAC, whose budget is not the published figures')
ALGOS = {
    "ppo": dict(frames=1_000_000, eval_every=50_000, tasks=None),
    "sac": dict(
        versus="sb3",
        frames=300_000,
        eval_every=20_000,
        tasks=["HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5"],
    ),
    "appo": dict(
        frames=1_000_000, eval_every=50_000, tasks=["HalfCheetah-v5", "Hopper-v5", "Walker2d-v5"]
    ),
}
#: the issue's bar on the zoo's published figure
ZOO_FRACTION = 0.8
#: the "threshold" bench_learning gets for a task with no published figure and no
#: reward_threshold (a number argparse reads, unlike -inf)
NO_BAR = -1e9


def mujoco_tasks() -> list[str]:
    """Every MuJoCo v5 id gymnasium registers (its registry entry's module is
    ``gymnasium.envs.mujoco``), sorted."""
    import gymnasium

    return sorted(
        env_id
        for env_id, spec in gymnasium.registry.items()
        if isinstance(spec.entry_point, str)
        and spec.entry_point.startswith("gymnasium.envs.mujoco")
        and env_id.endswith("-v5")
    )


def bar_for(algo: str, task: str) -> tuple[float, str]:
    """The return the median must reach on ``task`` and where it comes from."""
    bars = []
    if task in CLEANRL.get(algo, {}):
        bars.append((CLEANRL[algo][task], "CleanRL"))
    zoo = ZOO_PUBLISHED.get(algo, {}).get(task)
    if zoo is not None:
        bars.append((round(ZOO_FRACTION * zoo, 2), f"{ZOO_FRACTION:g}x rl-zoo3"))
    if bars:
        return max(bars)
    import gymnasium

    threshold = gymnasium.spec(task).reward_threshold
    if threshold is not None:
        return float(threshold), "gymnasium reward_threshold"
    return NO_BAR, "none published"


def zoo_pairs(sb3_python: str) -> set[str]:
    """The ``algo:task`` pairs ``peers/sb3_final.py`` has rl-zoo3 settings for."""
    out = subprocess.run(
        [sb3_python, str(REPO_ROOT / "benchmarks" / "peers" / "sb3_final.py"), "--known"],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        sys.exit(f"error: {sb3_python} cannot run peers/sb3_final.py --known: {out.stderr[-300:]}")
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def run_task(args: argparse.Namespace, task: str, stem: Path, with_sb3: bool) -> int:
    bar, _ = bar_for(args.algo, task)
    command = [
        sys.executable,
        str(REPO_ROOT / "benchmarks" / "bench_learning.py"),
        args.algo,
        task,
        repr(bar),
        str(args.frames),
        "--full-budget",
        "--seeds",
        *map(str, args.seeds),
        "--eval-every",
        str(args.eval_every),
        "--jobs",
        str(args.jobs),
        "--timeout",
        str(args.timeout),
        "--out",
        str(stem),
    ]
    figures_of = "PPO" if args.algo == "appo" else args.algo.upper()  # APPO: PPO's figures
    for label, table in (("CleanRL", CLEANRL), ("rl-zoo3", ZOO_PUBLISHED)):
        if task in table.get(args.algo, {}):
            command += [
                "--anchor",
                f"{label} {figures_of} (published)={table[args.algo][task]}",
            ]
    if with_sb3:
        command += ["--sb3-python", args.sb3_python]
    print(f"== {args.algo} {task}: {' '.join(command[1:])}", flush=True)
    return subprocess.run(command, cwd=REPO_ROOT, check=False).returncode


def _ratio(value: float | None, reference: float | None) -> float | None:
    """value / reference where both are known and the reference is positive (a ratio of
    negative returns reads backwards)."""
    if value is None or reference is None or reference <= 0:
        return None
    return round(value / reference, 2)


def summary_row(algo: str, task: str, report: dict | None) -> dict:
    cleanrl = CLEANRL.get(algo, {}).get(task)
    zoo = ZOO_PUBLISHED.get(algo, {}).get(task)
    row = {"task": task, "cleanrl": cleanrl, "zoo": zoo, "bar": bar_for(algo, task)[0]}
    if report is None:
        return row | {"status": "not run"}
    median = report.get("final_median")
    sb3 = report.get("sb3") or {}
    row |= {
        "status": "measured",
        "seeds": report.get("seeds"),
        "frames": report.get("budget_frames"),
        "final_returns": report.get("final_returns"),
        "median": median,
        "sb3_median": sb3.get("final_median"),
        "vs_cleanrl": _ratio(median, cleanrl),
        "vs_zoo": _ratio(median, zoo),
        "vs_sb3": _ratio(median, sb3.get("final_median")),
    }
    if median is None:
        return row
    if ALGOS[algo].get("versus") == "sb3":  # the verdict: at least SB3's median, same run
        row["bar_met"] = None if row["sb3_median"] is None else median >= row["sb3_median"]
    elif cleanrl is not None or zoo is not None:
        row["bar_met"] = (cleanrl is None or median >= cleanrl) and (
            zoo is None or median >= ZOO_FRACTION * zoo
        )
    return row


def write_summary(args: argparse.Namespace, tasks: list[str]) -> list[Path]:
    rows = []
    for task in tasks:
        path = args.out_dir / f"{task}.json"
        rows.append(
            summary_row(args.algo, task, json.loads(path.read_text()) if path.is_file() else None)
        )

    def fmt(v: float | None, digits: int = 1) -> str | None:
        return None if v is None else f"{v:.{digits}f}"

    table = markdown_table(
        [
            "task",
            "rlkit median",
            "final returns",
            "SB3 (zoo settings) same run",
            "CleanRL published",
            "rl-zoo3 published",
            "rlkit / CleanRL",
            "rlkit / zoo",
            "rlkit / SB3",
            "bar met",
            "report",
        ],
        [
            [
                r["task"],
                fmt(r.get("median")) or r["status"],
                ", ".join(f"{v:.0f}" for v in r.get("final_returns") or []) or None,
                fmt(r.get("sb3_median")),
                r["cleanrl"],
                r["zoo"],
                r.get("vs_cleanrl"),
                r.get("vs_zoo"),
                r.get("vs_sb3"),
                {True: "yes", False: "**no**", None: None}[r.get("bar_met")],
                f"[{r['task']}]({args.out_dir.name}/{r['task']}.md)"
                if r["status"] == "measured"
                else None,
            ]
            for r in rows
        ],
    )
    measured = [r for r in rows if r["status"] == "measured"]
    met = [r for r in measured if r.get("bar_met")]
    with_bar = [r for r in measured if r.get("bar_met") is not None]
    seeds = " ".join(map(str, args.seeds))
    verdict = (
        "at least SB3's median in the same run"
        if ALGOS[args.algo].get("versus") == "sb3"
        else f"CleanRL's published figure and {ZOO_FRACTION:g}x rl-zoo3's, where published"
    )
    md = (
        f"# {args.algo} on the MuJoCo v5 suite, {args.frames:,} frames, seeds {seeds}\n\n"
        f"{len(measured)}/{len(rows)} tasks measured; the median reaches the bar ({verdict}) "
        f"on {len(met)}/{len(with_bar)} that have one. Final return: mean of 10 "
        "deterministic evaluation episodes at the budget, median over seeds. Ratios only "
        "against positive figures. Published figures are MuJoCo v3 (zoo) / v4 (CleanRL) at 1M "
        "frames (sources: `benchmarks/bench_suite.py`'s docstring)"
        f"{'; APPO is held to the published PPO figures' if args.algo == 'appo' else ''}.\n\n"
        f"Command: `{command_line()}`; commit `{git_commit()['commit'][:10]}`; "
        f"CPU: {host_info().get('cpu_model', 'unknown')}.\n\n{table}\n"
    )
    payload = {
        "benchmark": "suite",
        "suite": "MuJoCo v5",
        "algo": args.algo,
        "frames": args.frames,
        "seeds": args.seeds,
        "rows": rows,
        "medians_measured": statistics.median([r["median"] for r in measured])
        if measured
        else None,
        "command": command_line(),
        "commit": git_commit(),
        "host": host_info(),
    }
    return write_results(args.out_dir.with_suffix(""), payload, md)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("algo", choices=sorted(ALGOS))
    p.add_argument("--tasks", nargs="+", default=None, help="default: the recipe's (ALGOS)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--frames", type=int, default=None, help="default: the recipe's budget")
    p.add_argument("--eval-every", type=int, default=None)
    p.add_argument("--jobs", type=int, default=2, help="runs at once (rlkit and SB3 interleaved)")
    p.add_argument("--timeout", type=float, default=8 * 3600, help="seconds per run")
    p.add_argument(
        "--sb3-python", default=None, metavar="PY", help="also run SB3 where the zoo tunes the task"
    )
    p.add_argument(
        "--out-dir", type=Path, default=None, help="default: benchmarks/results/suite_mujoco_<algo>"
    )
    p.add_argument("--summary-only", action="store_true", help="only rewrite the summary table")
    p.add_argument(
        "--list", action="store_true", help="print the tasks, bars and SB3 pairs; run nothing"
    )
    args = p.parse_args()
    defaults = ALGOS[args.algo]
    args.frames = args.frames or defaults["frames"]
    args.eval_every = args.eval_every or defaults["eval_every"]
    suite = mujoco_tasks()
    if not suite:
        p.error("gymnasium registers no MuJoCo v5 task here; run with a python that has mujoco")
    tasks = args.tasks or defaults["tasks"] or suite
    unknown = [t for t in tasks if t not in suite]
    if unknown:
        p.error(f"not MuJoCo v5 tasks: {', '.join(unknown)}; known: {', '.join(suite)}")
    args.out_dir = (
        args.out_dir or REPO_ROOT / "benchmarks" / "results" / f"suite_mujoco_{args.algo}"
    )
    pairs = zoo_pairs(args.sb3_python) if args.sb3_python else set()
    if args.list:
        for task in tasks:
            bar, source = bar_for(args.algo, task)
            sb3 = "SB3" if f"{args.algo}:{task}" in pairs else "-"
            print(f"{task:28s} bar {bar:10.2f} ({source}); {sb3}")
        return
    if not args.summary_only:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        for task in tasks:
            stem = args.out_dir / task
            if stem.with_suffix(".json").is_file():
                print(f"== {args.algo} {task}: done ({stem}.json), skipped", flush=True)
                continue
            rc = run_task(args, task, stem, with_sb3=f"{args.algo}:{task}" in pairs)
            if rc != 0:
                print(f"== {args.algo} {task}: bench_learning exited {rc}", flush=True)
    for path in write_summary(args, tasks):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
