"""rlkit vs Stable-Baselines3: time-to-solve, frames/s, wall time and peak RSS, side by side.

Usage (from the repository root, after ``bash benchmarks/peers/setup_sb3.sh``)::

    .venv/bin/python benchmarks/bench_vs_sb3.py --algo ppo --seeds 0 1 2 3 4
    .venv/bin/python benchmarks/bench_vs_sb3.py --algo ppo --seeds 0 1 --peer-only  # smoke

For every seed k, in this order, each in a fresh process (interleaved so that slow drift
in machine load hits both sides alike):

1. ``solve``: rlkit recipe seed k, then SB3 seed k, each training until the mean
   deterministic return over 10 evaluation episodes (every ``eval_every`` frames) first
   reaches the threshold, or the frame budget runs out. SB3 runs the shared protocol
   ``../shared/peers/sb3_solve.py`` (rl-zoo3 hyperparameters); rlkit runs its recipe and
   its result is read from ``<run-dir>/summary.json``. Time-to-solve is training seconds
   (evaluation excluded on both sides) at the first passing evaluation.
2. ``fps`` (PPO): a fixed frame budget with no evaluation and SB3's own hyperparameters
   (8 envs x 32 steps, 20 epochs, minibatch 256): rlkit's recipe vs
   ``benchmarks/peers/sb3_fps.py``. Frames per second = frames / training seconds.

Every process is measured from outside: whole-process wall time (imports, setup and
evaluation included) and peak RSS of its process tree (see ``benchmarks/common.py`` for
why the peak is taken as max(50 ms psutil tree-sum samples, wait4 ru_maxrss)). Children
get ``OMP_NUM_THREADS=1`` and ``MKL_NUM_THREADS=1``; both programs also call
``torch.set_num_threads(1)``.

Output: ``benchmarks/results/vs_sb3_<algo>.json`` (every raw run, medians, ratios, git
commit, package versions, host, command line, seeds) and ``.md`` (tables). Ratios are
rlkit / SB3 of the medians; an unsolved run counts as an infinite time-to-solve, so a
median that lands on an unsolved run is reported as ``null`` (not solved in the median).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import (
    REPO_ROOT,
    ProcessResult,
    command_line,
    git_commit,
    host_info,
    last_json_line,
    markdown_table,
    median_or_none,
    package_versions,
    ratio,
    run_measured,
    write_results,
)

# ---------------------------------------------------------------------------------------
# Commands. The ONE place to adjust when the recipes' CLI changes. Placeholders:
# {python} {algo} {env} {seed} {threshold} {budget} {eval_every} {frames} {run_dir}
# {protocol}. Values are shell-quoted before substitution, then the line is shlex-split.
# ---------------------------------------------------------------------------------------
RLKIT_SOLVE_TEMPLATE = (
    "{python} recipes/{algo}.py --seed {seed} --target-return {threshold}"
    " --total-frames {budget} --eval-every {eval_every} --eval-episodes 10 --run-dir {run_dir}"
)
RLKIT_FPS_TEMPLATES = {  # algo -> fixed-budget throughput run with SB3's hyperparameters
    "ppo": (
        "{python} recipes/ppo.py --seed {seed} --total-frames {frames} --num-envs 8"
        " --rollout-steps 32 --epochs 20 --minibatch-size 256 --eval-every 0"
        " --run-dir {run_dir}"
    ),
}
SB3_SOLVE_TEMPLATE = "{python} {protocol} {algo} {env} {threshold} {budget} {seed} {eval_every}"
SB3_FPS_TEMPLATE = (
    "{python} benchmarks/peers/sb3_fps.py {algo} {env} {frames} {seed} --protocol {protocol}"
)
RLKIT_SUMMARY = "summary.json"  # written by the recipe into --run-dir

RLKIT_PACKAGES = ["rlkit", "torch", "torchrl", "tensordict", "gymnasium", "lightning", "numpy"]
SB3_PACKAGES = ["stable-baselines3", "torch", "gymnasium", "numpy"]
ACCEPTANCE = [  # (ratio key, comparison, bound, meaning)
    ("time_to_solve", "<=", 1.0, "median train seconds to solve, rlkit / SB3"),
    ("fps", ">=", 1.0, "frames/s at a fixed budget, rlkit / SB3"),
    ("wall_solve", "<=", 1.5, "whole-process wall time, solve runs"),
    ("wall_fps", "<=", 1.5, "whole-process wall time, fixed-budget runs"),
    ("rss_solve", "<=", 2.0, "peak RSS, solve runs"),
    ("rss_fps", "<=", 2.0, "peak RSS, fixed-budget runs"),
]


@dataclass(frozen=True)
class Task:
    """A time-to-solve task: the SB3 protocol's arguments for one algorithm."""

    env: str
    threshold: float
    budget: int
    eval_every: int


TASKS = {  # thresholds and budgets follow the published SB3 zoo bars (ARCHITECTURE.md)
    "ppo": Task(env="CartPole-v1", threshold=475, budget=100_000, eval_every=5000),
    "dqn": Task(env="CartPole-v1", threshold=475, budget=100_000, eval_every=5000),
    "a2c": Task(env="CartPole-v1", threshold=475, budget=500_000, eval_every=10_000),
    "sac": Task(env="Pendulum-v1", threshold=-200, budget=20_000, eval_every=1000),
}


def build_command(template: str, **values: Any) -> list[str]:
    """Fill ``template`` with shell-quoted ``values`` and split it into an argv."""
    quoted = {
        k: shlex.quote(f"{v:g}" if isinstance(v, float) else str(v)) for k, v in values.items()
    }
    return shlex.split(template.format(**quoted))


def child_env() -> dict[str, str]:
    """The harness environment with single-threaded BLAS/OpenMP for every child."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def empty_record(side: str, phase: str, seed: int, proc: ProcessResult) -> dict[str, Any]:
    """A run record with the process measurements and no training outcome yet."""
    return dict(
        side=side,
        phase=phase,
        seed=seed,
        ok=proc.ok,
        solved=False,
        frames=None,
        frames_to_solve=None,
        time_to_solve=None,
        train_seconds=None,
        fps=None,
        eval_return=None,
        error=None,
        **proc.summary(),
    )


def parse_sb3(record: dict[str, Any], proc: ProcessResult) -> None:
    """Fill ``record`` from the JSON line printed by sb3_solve.py or sb3_fps.py."""
    out = last_json_line(proc.stdout)
    record.update(frames=out["frames"], train_seconds=out["train_seconds"], fps=out["fps"])
    if record["phase"] == "solve":
        solved = bool(out["solved"])
        record.update(solved=solved, eval_return=out.get("last_eval"))
        if solved:
            record.update(frames_to_solve=out["frames"], time_to_solve=out["train_seconds"])
    record["raw"] = out


def parse_rlkit(record: dict[str, Any], run_dir: Path, algo: str, env: str) -> None:
    """Fill ``record`` from ``<run_dir>/summary.json`` written by an rlkit recipe."""
    path = run_dir / RLKIT_SUMMARY
    if not path.is_file():
        raise FileNotFoundError(f"the recipe exited 0 but wrote no {path}")
    out = json.loads(path.read_text())
    if (out.get("algo"), out.get("env")) != (algo, env):
        raise ValueError(
            f"summary.json is for {(out.get('algo'), out.get('env'))}, expected {(algo, env)}:"
            " adjust RLKIT_SOLVE_TEMPLATE / RLKIT_FPS_TEMPLATES (e.g. add --env)"
        )
    record.update(frames=out["frames"], train_seconds=out["train_seconds"], fps=out["fps"])
    if record["phase"] == "solve":
        solved = bool(out["solved"])
        record.update(solved=solved, eval_return=out.get("eval_return_mean"))
        if solved:
            record.update(frames_to_solve=out["solved_frames"], time_to_solve=out["solved_seconds"])
    record["raw"] = {k: v for k, v in out.items() if k != "config"}
    record["rlkit_config"] = out.get("config")


def run_one(
    side: str, phase: str, seed: int, template: str, args: argparse.Namespace
) -> dict[str, Any]:
    """Run one process, measure it, and return its record; failures become records too."""
    task = args.task
    with tempfile.TemporaryDirectory(prefix=f"bench_{side}_{phase}_{seed}_") as tmp:
        run_dir = Path(tmp) / "run"
        values = dict(
            python=args.rlkit_python if side == "rlkit" else args.sb3_python,
            algo=args.algo,
            env=task.env,
            seed=seed,
            threshold=float(task.threshold),
            budget=task.budget,
            eval_every=task.eval_every,
            frames=args.fps_frames,
            run_dir=run_dir,
            protocol=args.protocol,
        )
        command = build_command(template, **values)
        load = round(os.getloadavg()[0], 2)
        proc = run_measured(command, env=child_env(), timeout_s=args.timeout)
        record = empty_record(side, phase, seed, proc)
        record["load_1min_before"] = load
        try:
            if not proc.ok:
                raise RuntimeError(proc.error_tail())
            if side == "sb3":
                parse_sb3(record, proc)
            else:
                parse_rlkit(record, run_dir, args.algo, task.env)
        except (RuntimeError, ValueError, KeyError, OSError) as err:
            record.update(ok=False, solved=False, frames_to_solve=None, time_to_solve=None)
            record["error"] = f"{type(err).__name__}: {err}"[-2000:]
    return record


def progress(record: dict[str, Any]) -> None:
    """One line per finished run on stderr."""
    fields = ["side", "phase", "seed", "ok", "solved", "frames", "train_seconds", "fps"]
    fields += ["wall_seconds", "peak_rss_mb"]
    line = " ".join(f"{k}={record[k]}" for k in fields)
    if record["error"]:
        line += f" error={record['error'][-300:]!r}"
    print(line, file=sys.stderr, flush=True)


def plan(args: argparse.Namespace) -> list[tuple[str, str, int, str]]:
    """The interleaved run order: per seed, solve (rlkit, sb3) then fps (rlkit, sb3)."""
    sides = [s for s in ("rlkit", "sb3") if s in args.sides]
    order = []
    for seed in args.seeds:
        for phase in args.phases:
            for side in sides:
                if side == "sb3":
                    template = SB3_SOLVE_TEMPLATE if phase == "solve" else SB3_FPS_TEMPLATE
                elif phase == "solve":
                    template = RLKIT_SOLVE_TEMPLATE
                else:
                    template = RLKIT_FPS_TEMPLATES[args.algo]
                order.append((side, phase, seed, template))
    return order


def median_time_to_solve(records: list[dict[str, Any]]) -> float | None:
    """Median time-to-solve with unsolved runs as +inf; None when the median is unsolved."""
    if not records:
        return None
    values = [r["time_to_solve"] if r["solved"] else math.inf for r in records]
    median = statistics.median(values)
    return None if math.isinf(median) else round(median, 3)


def aggregate(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians (and worst cases) over the runs of one side and phase."""

    def med(key: str) -> float | None:
        value = median_or_none(r[key] for r in records if r["ok"])
        return None if value is None else round(value, 3)

    rss = [r["peak_rss_mb"] for r in records]
    return dict(
        runs=len(records),
        ok=sum(r["ok"] for r in records),
        solved=sum(r["solved"] for r in records),
        median_time_to_solve=median_time_to_solve(records),
        median_frames_to_solve=median_or_none(r["frames_to_solve"] for r in records),
        median_fps=med("fps"),
        median_train_seconds=med("train_seconds"),
        median_wall_seconds=med("wall_seconds"),
        median_peak_rss_mb=med("peak_rss_mb"),
        max_peak_rss_mb=max(rss) if rss else None,
        median_cpu_seconds=med("cpu_seconds"),
    )


def summarise(records: list[dict[str, Any]], phases: list[str]) -> dict[str, Any]:
    """Aggregates per phase and side, the rlkit / SB3 ratios and the acceptance checks."""
    agg: dict[str, dict[str, Any]] = {}
    for phase in phases:
        agg[phase] = {
            side: aggregate([r for r in records if r["phase"] == phase and r["side"] == side])
            for side in ("rlkit", "sb3")
        }

    def side_ratio(phase: str, key: str) -> float | None:
        if phase not in agg:
            return None
        return ratio(agg[phase]["rlkit"][key], agg[phase]["sb3"][key])

    ratios = dict(
        time_to_solve=side_ratio("solve", "median_time_to_solve"),
        frames_to_solve=side_ratio("solve", "median_frames_to_solve"),
        fps=side_ratio("fps", "median_fps"),
        wall_solve=side_ratio("solve", "median_wall_seconds"),
        wall_fps=side_ratio("fps", "median_wall_seconds"),
        rss_solve=side_ratio("solve", "median_peak_rss_mb"),
        rss_fps=side_ratio("fps", "median_peak_rss_mb"),
    )
    acceptance = []
    for key, op, bound, meaning in ACCEPTANCE:
        value = ratios[key]
        passed = None if value is None else (value <= bound if op == "<=" else value >= bound)
        acceptance.append(
            dict(ratio=key, value=value, op=op, bound=bound, passed=passed, meaning=meaning)
        )
    return dict(aggregates=agg, ratios=ratios, acceptance=acceptance)


def _short_error(error: str | None) -> str:
    """The last 80 characters of an error, safe inside a Markdown table cell."""
    return (error or "")[-80:].replace("|", "/").replace("\n", " ")


def render_markdown(payload: dict[str, Any]) -> str:
    """The human-readable report: provenance, medians, ratios, raw runs."""
    meta, summary = payload["meta"], payload["summary"]
    lines = [
        f"# rlkit vs Stable-Baselines3: {meta['algo']} on {meta['task']['env']}",
        "",
        f"- commit `{meta['git']['commit'][:12]}`" + (" (dirty)" if meta["git"]["dirty"] else ""),
        f"- command: `{meta['command']}`",
        f"- seeds: {meta['seeds']}; date (UTC): {meta['date_utc']}",
        f"- host: {meta['host']['cpu_model']}, {meta['host']['logical_cpus']} logical CPUs,"
        f" load at start {meta['host']['load_average_at_start']}",
        f"- task: threshold {meta['task']['threshold']:g}, budget {meta['task']['budget']}"
        f" frames, eval every {meta['task']['eval_every']} (10 deterministic episodes);"
        f" fps budget {meta['fps_frames']} frames",
    ]
    if meta.get("note"):
        lines.append(f"- note: {meta['note']}")
    agg_cols = {  # header -> aggregate key
        "solved": "solved",
        "median time-to-solve s": "median_time_to_solve",
        "median frames-to-solve": "median_frames_to_solve",
        "median fps": "median_fps",
        "median wall s": "median_wall_seconds",
        "median peak RSS MB": "median_peak_rss_mb",
    }
    rows = [
        [phase, side, f"{a['ok']}/{a['runs']}", *(a[k] for k in agg_cols.values())]
        for phase, by_side in summary["aggregates"].items()
        for side, a in by_side.items()
        if a["runs"]
    ]
    lines += ["", "## Medians", ""]
    lines.append(markdown_table(["phase", "side", "ok/runs", *agg_cols], rows))
    verdict = {True: "pass", False: "FAIL", None: "—"}
    acc_rows = [
        [a["ratio"], a["meaning"], a["value"], f"{a['op']} {a['bound']:g}", verdict[a["passed"]]]
        for a in summary["acceptance"]
    ]
    lines += ["", "## Ratios rlkit / SB3", ""]
    lines.append(markdown_table(["ratio", "meaning", "value", "bound", "result"], acc_rows))
    run_cols = {  # header -> run record key
        "side": "side",
        "phase": "phase",
        "seed": "seed",
        "ok": "ok",
        "solved": "solved",
        "frames": "frames",
        "train s": "train_seconds",
        "fps": "fps",
        "wall s": "wall_seconds",
        "peak RSS MB": "peak_rss_mb",
        "CPU s": "cpu_seconds",
    }
    raw_rows = [
        [*(r[k] for k in run_cols.values()), _short_error(r["error"])] for r in payload["runs"]
    ]
    lines += ["", "## Runs (in execution order)", ""]
    lines.append(markdown_table([*run_cols, "error"], raw_rows))
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--algo", choices=sorted(TASKS), default="ppo")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument(
        "--phases",
        nargs="+",
        choices=["solve", "fps"],
        default=["solve", "fps"],
        help="fps runs only for algorithms with an rlkit fps template (PPO)",
    )
    who = p.add_mutually_exclusive_group()
    who.add_argument("--peer-only", action="store_true", help="run only the SB3 side")
    who.add_argument("--rlkit-only", action="store_true", help="run only the rlkit side")
    p.add_argument("--fps-frames", type=int, default=50_000)
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per process")
    p.add_argument("--rlkit-python", type=Path, default=REPO_ROOT / ".venv/bin/python")
    p.add_argument("--sb3-python", type=Path, default=REPO_ROOT / ".venv-sb3/bin/python")
    p.add_argument(
        "--protocol", type=Path, default=REPO_ROOT.parent / "shared" / "peers" / "sb3_solve.py"
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output stem (default benchmarks/results/vs_sb3_<algo>;"
        " sb3_<algo> with --peer-only, rlkit_<algo> with --rlkit-only)",
    )
    p.add_argument("--note", default="", help="free text stored with the results")
    args = p.parse_args(argv)
    args.task = TASKS[args.algo]
    args.sides = ["sb3"] if args.peer_only else ["rlkit"] if args.rlkit_only else ["rlkit", "sb3"]
    if "fps" in args.phases and args.algo not in RLKIT_FPS_TEMPLATES:
        p.error(
            f"--phases fps needs an rlkit fps template for {args.algo!r}: add one to "
            f"RLKIT_FPS_TEMPLATES or pass --phases solve"
        )
    if args.out is None:
        name = {("sb3",): "sb3_{}", ("rlkit",): "rlkit_{}"}.get(tuple(args.sides), "vs_sb3_{}")
        args.out = REPO_ROOT / "benchmarks" / "results" / name.format(args.algo)
    check_inputs(args)
    return args


def check_inputs(args: argparse.Namespace) -> None:
    """Fail fast, with the fix in the message, when an interpreter or script is missing."""
    if "sb3" in args.sides:
        if not args.sb3_python.exists():
            sys.exit(
                f"error: SB3 interpreter {args.sb3_python} not found: "
                "run `bash benchmarks/peers/setup_sb3.sh` (or pass --sb3-python)"
            )
        if not args.protocol.is_file():
            sys.exit(
                f"error: peer protocol {args.protocol} not found: it is the shared "
                "file ../shared/peers/sb3_solve.py next to the repository (or pass "
                "--protocol PATH); it is deliberately not copied into the repo"
            )
    if "rlkit" in args.sides:
        if not args.rlkit_python.exists():
            sys.exit(f"error: rlkit interpreter {args.rlkit_python} not found (--rlkit-python)")
        recipe = REPO_ROOT / "recipes" / f"{args.algo}.py"
        if not recipe.is_file():
            sys.exit(
                f"error: {recipe.relative_to(REPO_ROOT)} does not exist yet: "
                "use --peer-only to measure only SB3"
            )


def main(argv: list[str] | None = None) -> None:
    """Run the interleaved plan, then write the JSON and Markdown results."""
    args = parse_args(argv)
    meta = dict(
        algo=args.algo,
        task=dict(vars(args.task)),
        fps_frames=args.fps_frames,
        seeds=args.seeds,
        sides=args.sides,
        phases=args.phases,
        command=command_line(),
        date_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        git=git_commit(),
        host=host_info(),
        timeout_s=args.timeout,
        note=args.note,
        templates=dict(
            rlkit_solve=RLKIT_SOLVE_TEMPLATE,
            rlkit_fps=RLKIT_FPS_TEMPLATES.get(args.algo),
            sb3_solve=SB3_SOLVE_TEMPLATE,
            sb3_fps=SB3_FPS_TEMPLATE,
        ),
        versions={},
    )
    if "rlkit" in args.sides:
        meta["versions"]["rlkit_env"] = package_versions(args.rlkit_python, RLKIT_PACKAGES)
    if "sb3" in args.sides:
        meta["versions"]["sb3_env"] = package_versions(args.sb3_python, SB3_PACKAGES)
    runs = []
    for side, phase, seed, template in plan(args):
        record = run_one(side, phase, seed, template, args)
        progress(record)
        runs.append(record)
    payload = dict(meta=meta, summary=summarise(runs, args.phases), runs=runs)
    for path in write_results(args.out, payload, render_markdown(payload)):
        print(f"wrote {path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path}")


if __name__ == "__main__":
    main()
