"""Start-up time of the recipes: ``--help``, and launch to the first environment step.

Two numbers per recipe, each the median over ``--repeats`` fresh processes:

- **help**: wall time of ``python recipes/<name>.py --help`` (interpreter start, imports,
  parser, exit), timed around a blocking ``subprocess.run``;
- **first step**: from just before ``Popen`` (the parent's ``time.time()``) to the recipe's
  first ``gymnasium.vector.SyncVectorEnv.step`` (the child's ``time.time()``). The child is a
  small wrapper that imports gymnasium, patches ``SyncVectorEnv.step`` to print the time of
  its first call, and runs the recipe with ``runpy`` as ``__main__``, with
  ``--total-frames 256 --eval-every 0 --progress false --run-dir <tmp> --overwrite true``
  (``OMP_NUM_THREADS=1``). It includes imports, config parsing, Fabric, env and network
  construction. IMPALA and APPO step their envs in worker processes, so only their
  ``--help`` is measured.

With ``--baseline-commit REV`` the same measurements run on that commit's tree too
(``git archive`` into a temporary directory, imported through ``PYTHONPATH``), interleaved
with this tree's (repeat r of every recipe and tree before repeat r + 1), so load on the
shared machine hits both alike; the report gives both medians. ``--commit REV`` measures
that commit's tree instead of the working tree (uncommitted edits left out).

    .venv/bin/python benchmarks/bench_startup.py --commit HEAD --baseline-commit HEAD~1
    .venv/bin/python benchmarks/bench_startup.py --quick     # one repeat of ppo, nothing written
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    REPO_ROOT,
    command_line,
    git_commit,
    host_info,
    markdown_table,
    package_versions,
    write_results,
)

RECIPES = ("a2c", "appo", "daac", "dqn", "impala", "ppg", "ppo", "rnd", "sac", "svpg")
#: recipes whose envs step in worker processes: the in-process patch cannot see them
WORKER_RECIPES = frozenset({"impala", "appo"})
RUN_FLAGS = ["--total-frames", "256", "--eval-every", "0", "--progress", "false"]
TARGETS = {"help_s": 1.5, "first_step_s": 3.0}
MARK = "BENCH_FIRST_STEP"

#: the child of a first-step measurement: argv = [recipe path, recipe flags...]
WRAPPER = f"""
import runpy, sys, time
import gymnasium.vector

_step = gymnasium.vector.SyncVectorEnv.step
_seen = []

def step(self, actions):
    if not _seen:
        _seen.append(time.time())
        sys.stderr.write("\\n{MARK} " + repr(_seen[0]) + "\\n")
        sys.stderr.flush()
    return _step(self, actions)

gymnasium.vector.SyncVectorEnv.step = step
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _env(root: Path) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("RLKIT_TRACEBACK", None)
    if root != REPO_ROOT:  # that tree's rlkit, not the editable install of this one
        env["PYTHONPATH"] = str(root)
    return env


def help_seconds(python: str, root: Path, recipe: str) -> float:
    """Wall seconds of ``python recipes/<recipe>.py --help`` run from ``root``."""
    start = time.perf_counter()
    done = subprocess.run(
        [python, f"recipes/{recipe}.py", "--help"],
        cwd=root,
        env=_env(root),
        capture_output=True,
        text=True,
        timeout=120,
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0 or "--total-frames" not in done.stdout:
        raise RuntimeError(f"{recipe} --help failed in {root}: {done.stderr[-2000:]}")
    return seconds


def first_step_seconds(python: str, root: Path, recipe: str) -> tuple[float, float]:
    """(launch to the first env step, launch to exit) of a 256-frame run, in seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        argv = [python, "-c", WRAPPER, f"recipes/{recipe}.py", *RUN_FLAGS]
        argv += ["--run-dir", str(Path(tmp) / "run"), "--overwrite", "true"]
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            launched = time.time()
            proc = subprocess.Popen(argv, cwd=root, env=_env(root), stdout=out, stderr=err)
            code = proc.wait(timeout=600)
            finished = time.time()
            err.seek(0)
            stderr = err.read().decode(errors="replace")
    stamps = [line.split()[1] for line in stderr.splitlines() if line.startswith(MARK)]
    if code != 0 or not stamps:
        raise RuntimeError(f"{recipe} run failed in {root} (exit {code}): {stderr[-2000:]}")
    return float(stamps[0]) - launched, finished - launched


def tree_at(commit: str, into: Path) -> Path:
    """The tracked files of ``commit`` (``git archive``) under ``into``."""
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "archive", commit], cwd=REPO_ROOT, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def _resolved(rev: str) -> dict:
    """``{"commit": full hash of rev, "dirty": False}`` (an archived tree is clean)."""
    done = subprocess.run(
        ["git", "rev-parse", rev], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    return {"commit": done.stdout.strip(), "dirty": False}


def measure(trees: dict[str, Path], recipes: list[str], repeats: int, python: str) -> list:
    rows = []
    for repeat in range(repeats):
        for recipe in recipes:
            for label, root in trees.items():
                row = {"tree": label, "recipe": recipe, "repeat": repeat}
                row["help_s"] = round(help_seconds(python, root, recipe), 3)
                if recipe not in WORKER_RECIPES:
                    first, total = first_step_seconds(python, root, recipe)
                    row["first_step_s"], row["run_s"] = round(first, 3), round(total, 3)
                row["load_average_1min"] = round(os.getloadavg()[0], 2)
                print(row, flush=True)
                rows.append(row)
    return rows


def summarise(rows: list[dict], trees: dict[str, Path], recipes: list[str]) -> list[dict]:
    out = []
    for recipe in recipes:
        entry: dict = {"recipe": recipe}
        for label in trees:
            mine = [r for r in rows if r["recipe"] == recipe and r["tree"] == label]
            for key in ("help_s", "first_step_s", "run_s"):
                values = [r[key] for r in mine if key in r]
                entry[f"{label}_{key}"] = round(statistics.median(values), 3) if values else None
        out.append(entry)
    return out


def report(summary: list[dict], trees: dict[str, Path], meta: dict) -> str:
    labels = list(trees)
    header = ["recipe"]
    for key in ("help_s", "first_step_s"):
        header += [f"{key.removesuffix('_s').replace('_', ' ')} s ({label})" for label in labels]
    rows = [
        [s["recipe"]]
        + [s[f"{label}_{key}"] for key in ("help_s", "first_step_s") for label in labels]
        for s in summary
    ]
    now = [s for s in summary if s["recipe"] not in WORKER_RECIPES]
    worst_help = max(s["current_help_s"] for s in summary)
    worst_first = max((s["current_first_step_s"] for s in now), default=None)
    commit = meta["commit"]
    dirty = " (uncommitted changes)" if commit.get("dirty") else ""
    baseline = (
        f" Baseline: commit `{meta['baseline_commit']}` (`git archive`, via PYTHONPATH)."
        if "baseline" in trees
        else ""
    )
    return (
        "# Recipe start-up: --help and launch to the first env step\n\n"
        f"`{meta['command']}`, commit `{commit['commit'][:10]}`{dirty}, median of "
        f"{meta['repeats']} fresh processes per cell, OMP_NUM_THREADS=1, "
        f"{meta['host']['logical_cpus']} CPUs ({meta['host']['cpu_model']}), 1-minute load "
        f"average {meta['load_before']:.2f} before and {meta['load_after']:.2f} after (the "
        f"machine is shared: compare trees within this run).{baseline}\n\n"
        "help: wall time of `python recipes/<name>.py --help`. first step: parent's "
        "`time.time()` before `Popen` to the child's first `SyncVectorEnv.step` of "
        f"`recipes/<name>.py {' '.join(RUN_FLAGS)} --run-dir <tmp> --overwrite true` (a "
        "wrapper imports gymnasium and runs the recipe with runpy); IMPALA and APPO step in "
        "worker processes: help only.\n\n"
        f"{markdown_table(header, rows)}\n\n"
        f"Targets: --help <= {TARGETS['help_s']} s (slowest now: **{worst_help:.3f} s**), "
        f"first step <= {TARGETS['first_step_s']} s (slowest now: "
        f"**{worst_first if worst_first is None else f'{worst_first:.3f}'} s**).\n"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=RECIPES)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--commit", help="measure this commit's tree, not the working tree")
    p.add_argument("--baseline-commit", help="also measure this commit's tree (git archive)")
    p.add_argument("--python", default=sys.executable, help="interpreter of the recipes")
    p.add_argument("--quick", action="store_true", help="1 repeat of ppo, nothing written")
    args = p.parse_args()
    if args.quick:
        args.recipes, args.repeats = ["ppo"], 1
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"current": REPO_ROOT}
        if args.commit:
            trees["current"] = tree_at(args.commit, Path(tmp) / "current")
        if args.baseline_commit:
            trees["baseline"] = tree_at(args.baseline_commit, Path(tmp) / "baseline")
        rows = measure(trees, args.recipes, args.repeats, args.python)
    summary = summarise(rows, trees, args.recipes)
    meta = {
        "benchmark": "bench_startup",
        "command": command_line(),
        "commit": _resolved(args.commit) if args.commit else git_commit(),
        "baseline_commit": args.baseline_commit and _resolved(args.baseline_commit)["commit"],
        "repeats": args.repeats,
        "run_flags": RUN_FLAGS,
        "targets": TARGETS,
        "host": host_info(),
        "packages": package_versions(
            args.python, ["torch", "tensordict", "torchrl", "lightning", "gymnasium"]
        ),
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
    }
    markdown = report(summary, trees, meta)
    print(markdown)
    if not args.quick:
        payload = meta | {"summary": summary, "rows": rows}
        write_results(REPO_ROOT / "benchmarks" / "results" / "startup", payload, markdown)


if __name__ == "__main__":
    main()
