"""Classic control and Box2D, recipe by task: does each recipe, with its defaults, reach the
published solve within a stated budget on seeds 0-4?

Tasks, solve thresholds (the published ones: gymnasium's ``reward_threshold``, Pendulum's
-200 and LunarLander's 200 as the field uses them) and budgets (frames; about what the
published tuned agents train for, rl-zoo3's ``n_timesteps``, with room for defaults):

    CartPole-v1 475 in 500k, Acrobot-v1 -100 in 500k, MountainCar-v0 -110 in 1M,
    Pendulum-v1 -200 in 500k, MountainCarContinuous-v0 90 in 500k, LunarLander-v3 200 in 2M

Each missing cell runs ``bench_learning.py RECIPE TASK THRESHOLD BUDGET --seeds 0 1 2 3 4
--required 5`` (a seed stops at its first evaluation at or above the threshold) and writes
``benchmarks/results/classic/<recipe>_<task>.json|md|png``. Resumable: a cell with an existing
result (that file, or the recipe's default bar ``learning_<recipe>_<task>.json`` when it
settles the cell, see :func:`cell_from_report`) is skipped.

    # the table in docs/benchmarks.md, from the result files (runs nothing):
    .venv/bin/python benchmarks/bench_classic.py --table
    # every missing cell (LunarLander needs box2d: /work/benchvenv has it), or some of them:
    PYTHONPATH=. /work/benchvenv/bin/python benchmarks/bench_classic.py
    PYTHONPATH=. /work/benchvenv/bin/python benchmarks/bench_classic.py --only ppo:Acrobot-v1
    # smoke test (tiny budget, out of benchmarks/results):
    .venv/bin/python benchmarks/bench_classic.py --only a2c:CartPole-v1 --frames 2000 \\
        --seeds 0 --out-dir /tmp/classic_smoke
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import REPO_ROOT, markdown_table  # noqa: E402

RECIPES = ["ppo", "a2c", "appo", "impala", "ppg", "daac", "rnd", "svpg", "dqn", "sac"]
#: task: (solve threshold, frame budget, evaluation interval)
TASKS: dict[str, tuple[float, int, int]] = {
    "CartPole-v1": (475.0, 500_000, 10_000),
    "Acrobot-v1": (-100.0, 500_000, 10_000),
    "MountainCar-v0": (-110.0, 1_000_000, 20_000),
    "Pendulum-v1": (-200.0, 500_000, 10_000),
    "MountainCarContinuous-v0": (90.0, 500_000, 10_000),
    "LunarLander-v3": (200.0, 2_000_000, 40_000),
}
#: tasks with Box actions, and the recipes that refuse them
CONTINUOUS = {"Pendulum-v1", "MountainCarContinuous-v0"}
DISCRETE_ONLY = {"dqn"}
SEEDS = [0, 1, 2, 3, 4]
RESULTS = REPO_ROOT / "benchmarks" / "results"


#: default-bar reports that are not the recipe's defaults of today (docs/benchmarks.md says so)
NOT_DEFAULTS = {
    "learning_ppo_MountainCar-v0.json": "PPO with RND's settings, no bonus",
    "learning_rnd_MountainCar-v0.json": "RND's twin critic, before 2026-11",
}
#: bench_learning's own options; any other flag in a report's command went to the recipe
BENCH_FLAGS = {
    "--seeds",
    "--eval-every",
    "--eval-episodes",
    "--jobs",
    "--timeout",
    "--required",
    "--out",
    "--full-budget",
    "--anchor",
    "--note",
    "--sb3-python",
    "--from-runs",
    "--sb3-from",
}


def _k(frames: int) -> str:
    return f"{frames / 1e6:g}M" if frames >= 1_000_000 else f"{frames / 1e3:.0f}k"


def with_defaults(path: Path, report: dict) -> bool:
    """Whether ``report`` measured the recipe's defaults: no recipe flag in its command and
    not in :data:`NOT_DEFAULTS`."""
    if path.name in NOT_DEFAULTS:
        return False
    commands = report.get("command") or ""
    words = " ".join(commands if isinstance(commands, list) else [commands]).split()
    return not any(w.startswith("--") and w.split("=")[0] not in BENCH_FLAGS for w in words)


def cell_from_report(report: dict, threshold: float, budget: int, seeds=SEEDS) -> dict | None:
    """What a ``bench_learning`` report says about one cell, from each seed's evaluation
    curve: a seed solved if an evaluation within ``budget`` reached ``threshold``; failed if
    it trained to ``budget`` without; otherwise unknown (it stopped early at a lower
    threshold, or its budget was shorter). ``None`` unless the report settles every seed."""
    runs = {r.get("seed"): r for r in report.get("runs", [])}
    if not all(s in runs for s in seeds):
        return None
    solved_at = []
    for seed in seeds:
        run = runs[seed]
        hits = [f for f, m in run.get("curve") or [] if f <= budget and m >= threshold]
        if hits:
            solved_at.append(min(hits))
        elif (run.get("frames") or 0) < budget:
            return None  # neither solved nor trained the whole budget: unsettled
    return {"solved": len(solved_at), "of": len(seeds), "latest": max(solved_at, default=None)}


def find_cell(recipe: str, task: str, out_dir: Path) -> tuple[dict | None, Path | None]:
    """The cell's result and its file: this script's own result first, then the recipe's
    default bar (``learning_<recipe>_<task>.json``, its defaults)."""
    threshold, budget, _ = TASKS[task]
    for path in (out_dir / f"{recipe}_{task}.json", RESULTS / f"learning_{recipe}_{task}.json"):
        if path.is_file():
            report = json.loads(path.read_text())
            if not with_defaults(path, report):
                continue
            cell = cell_from_report(report, threshold, budget)
            if cell is not None:
                return cell, path
    return None, None


def cell_text(recipe: str, task: str, out_dir: Path) -> str:
    if recipe in DISCRETE_ONLY and task in CONTINUOUS:
        return "cannot take the space (Box actions)"
    cell, path = find_cell(recipe, task, out_dir)
    if cell is None:
        return "not measured yet"
    budget = TASKS[task][1]
    name = path.relative_to(RESULTS).with_suffix(".md").as_posix()
    latest = f", last at {_k(cell['latest'])}" if cell["latest"] else ""
    return f"{cell['solved']}/{cell['of']} within {_k(budget)}{latest} (`{name}`)"


def table(out_dir: Path) -> str:
    header = ["recipe", *(f"{t} {TASKS[t][0]:g}" for t in TASKS)]
    return markdown_table(
        header, [[r, *(cell_text(r, t, out_dir) for t in TASKS)] for r in RECIPES]
    )


def parse_only(items: list[str], parser: argparse.ArgumentParser) -> list[tuple[str, str]]:
    cells = []
    for item in items:
        recipe, sep, task = item.partition(":")
        if not sep or recipe not in RECIPES or task not in TASKS:
            parser.error(
                f"--only takes RECIPE:TASK (e.g. ppo:Acrobot-v1), got {item!r}; recipes: "
                f"{', '.join(RECIPES)}; tasks: {', '.join(TASKS)}"
            )
        if recipe in DISCRETE_ONLY and task in CONTINUOUS:
            parser.error(f"{recipe} cannot take {task}'s Box actions; pick a discrete task")
        cells.append((recipe, task))
    return cells


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--only", nargs="+", default=None, metavar="RECIPE:TASK")
    p.add_argument("--table", action="store_true", help="print the table; run nothing")
    p.add_argument("--seeds", type=int, nargs="+", default=SEEDS)
    p.add_argument("--frames", type=int, default=None, help="override every budget (smoke tests)")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--timeout", type=float, default=6 * 3600, help="seconds per run")
    p.add_argument("--out-dir", type=Path, default=RESULTS / "classic")
    args = p.parse_args()
    if args.table:
        print(table(args.out_dir))
        return
    cells = (
        parse_only(args.only, p)
        if args.only
        else [
            (r, t) for r in RECIPES for t in TASKS if not (r in DISCRETE_ONLY and t in CONTINUOUS)
        ]
    )
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for recipe, task in cells:
        threshold, budget, eval_every = TASKS[task]
        if args.frames:
            budget, eval_every = args.frames, max(args.frames // 2, 1)
        if (args.out_dir / f"{recipe}_{task}.json").is_file() or (
            not args.frames and find_cell(recipe, task, args.out_dir)[0] is not None
        ):
            print(f"== {recipe} {task}: has a result, skipped", flush=True)
            continue
        command = [
            sys.executable,
            str(REPO_ROOT / "benchmarks" / "bench_learning.py"),
            recipe,
            task,
            repr(threshold),
            str(budget),
            "--seeds",
            *map(str, args.seeds),
            "--required",
            str(len(args.seeds)),
            "--eval-every",
            str(eval_every),
            "--jobs",
            str(args.jobs),
            "--timeout",
            str(args.timeout),
            "--out",
            str(args.out_dir / f"{recipe}_{task}"),
        ]
        print(f"== {recipe} {task}: {' '.join(command[1:])}", flush=True)
        rc = subprocess.run(command, cwd=REPO_ROOT, check=False).returncode
        if rc != 0:
            print(f"== {recipe} {task}: bench_learning exited {rc}", flush=True)
    print(table(args.out_dir))


if __name__ == "__main__":
    main()
