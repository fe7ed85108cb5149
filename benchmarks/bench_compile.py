"""Where ``--compile`` pays: the same recipe run eagerly and compiled, in the same session.

For every case (a recipe, its flags and a frame budget) and seed, the eager and the compiled
run alternate (eager first, then compiled, one at a time by default), and each run's
``metrics.csv`` gives its training seconds against frames. Reported per case, medians over
seeds:

* whole-process wall time and training seconds, compiled / eager;
* steady frames/s: over the second half of the budget, once every graph is compiled;
* the compile overhead: the extra seconds of the compiled run beyond its steady rate,
  less the eager run's start-up beyond its own;
* break-even frames: where the steady gain has paid the overhead back
  (``overhead / (1 / fps_eager - 1 / fps_compiled)``; none when compiled is not faster).

Results go to ``benchmarks/results/compile.json/.md``::

    .venv/bin/python benchmarks/bench_compile.py                     # every case, seeds 0 1
    .venv/bin/python benchmarks/bench_compile.py --cases ppo-cartpole --seeds 0
"""

from __future__ import annotations

import argparse
import csv
import os
import shlex
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    REPO_ROOT,
    command_line,
    git_commit,
    host_info,
    markdown_table,
    median_or_none,
    ratio,
    run_measured,
    write_results,
)

#: name -> (recipe, flags, frames). SB3's hyperparameters where bench_vs_sb3 uses them.
CASES: dict[str, tuple[str, str, int]] = {
    "ppo-cartpole": (
        "ppo",
        "--env CartPole-v1 --num-envs 8 --rollout-steps 32 --epochs 20 --minibatch-size 256",
        300_000,
    ),
    "ppo-halfcheetah": ("ppo", "--env HalfCheetah-v5", 200_000),
    "appo-halfcheetah": ("appo", "--env HalfCheetah-v5", 200_000),
    "dqn-cartpole": ("dqn", "--env CartPole-v1", 100_000),
    "sac-pendulum": ("sac", "--env Pendulum-v1 --batch-size 256", 15_000),
}


def _rows(run_dir: Path) -> list[tuple[int, float]]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return [
            (int(float(r["frames"])), float(r["train_seconds"]))
            for r in csv.DictReader(f)
            if r.get("train_seconds")
        ]


def steady(rows: list[tuple[int, float]]) -> tuple[float, float]:
    """``(frames/s over the second half of the run, seconds beyond that rate)``."""
    frames, seconds = rows[-1]
    mid = next(r for r in rows if r[0] >= frames / 2)
    fps = (frames - mid[0]) / (seconds - mid[1])
    return fps, seconds - frames / fps


def run_case(
    name: str,
    seed: int,
    compile: bool,
    python: str,
    timeout: float,
    extra: str = "",
    frames: int | None = None,
) -> dict:
    recipe, flags, default_frames = CASES[name]
    frames = frames or default_frames
    flags = f"{flags} {extra}"
    with tempfile.TemporaryDirectory(prefix="rlkit-compile-") as tmp:
        run_dir = Path(tmp) / "run"
        argv = [
            python, f"recipes/{recipe}.py", *shlex.split(flags), "--seed", str(seed),
            "--total-frames", str(frames), "--eval-every", "0", "--checkpoint-every", "0",
            "--progress", "false", "--run-dir", str(run_dir), "--compile", str(compile).lower(),
        ]  # fmt: skip
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        result = run_measured(argv, cwd=REPO_ROOT, env=env, timeout_s=timeout)
        if not result.ok:
            raise RuntimeError(f"{name} seed {seed} compile={compile}: {result.error_tail()}")
        rows = _rows(run_dir)
    fps, beyond = steady(rows)
    return {
        "case": name,
        "seed": seed,
        "compile": compile,
        "frames": rows[-1][0],
        "wall_seconds": round(result.wall_seconds, 2),
        "train_seconds": round(rows[-1][1], 2),
        "steady_fps": round(fps, 1),
        "seconds_beyond_steady": round(beyond, 2),
        "peak_rss_mb": round(result.peak_rss_mb, 1),
    }


def summarise(runs: list[dict]) -> list[dict]:
    out = []
    for name in dict.fromkeys(r["case"] for r in runs):

        def med(key: str, compiled: bool, name=name) -> float | None:
            return median_or_none(
                r[key] for r in runs if r["case"] == name and r["compile"] == compiled
            )

        fps_e, fps_c = med("steady_fps", False), med("steady_fps", True)
        overhead = med("seconds_beyond_steady", True) - med("seconds_beyond_steady", False)
        gain = 1 / fps_e - 1 / fps_c
        out.append(
            {
                "case": name,
                "frames": med("frames", False),
                "wall_ratio": ratio(med("wall_seconds", True), med("wall_seconds", False)),
                "train_ratio": ratio(med("train_seconds", True), med("train_seconds", False)),
                "steady_fps_eager": fps_e,
                "steady_fps_compiled": fps_c,
                "steady_speedup": ratio(fps_c, fps_e),
                "compile_overhead_seconds": round(overhead, 1),
                "break_even_frames": round(overhead / gain) if gain > 0 else None,
            }
        )
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cases", nargs="+", choices=sorted(CASES), default=list(CASES))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--python", default=str(REPO_ROOT / ".venv/bin/python"))
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    p.add_argument("--out", default=str(REPO_ROOT / "benchmarks/results/compile"))
    p.add_argument("--extra", default="", help="flags added to every run, e.g. '--accelerator gpu'")
    p.add_argument(
        "--frames", nargs="+", default=[], metavar="CASE=N",
        help="frame budgets that replace a case's default, e.g. ppo-cartpole=65536",
    )  # fmt: skip
    args = p.parse_args(argv)
    frames = {k: int(v) for k, v in (f.split("=", 1) for f in args.frames)}
    runs = []
    for name in args.cases:
        for seed in args.seeds:
            for compile in (False, True):
                runs.append(
                    run_case(
                        name, seed, compile, args.python, args.timeout, args.extra,
                        frames.get(name),
                    )
                )  # fmt: skip
                r = runs[-1]
                print(
                    f"{name} seed {seed} {'compiled' if compile else 'eager   '}: "
                    f"wall {r['wall_seconds']:.1f} s, steady {r['steady_fps']:.0f} frames/s",
                    flush=True,
                )
    summary = summarise(runs)
    header = [
        "case", "frames", "wall, compiled / eager", "train s, compiled / eager",
        "steady frames/s eager", "compiled", "speed-up", "compile overhead (s)",
        "break-even frames",
    ]  # fmt: skip
    table = markdown_table(
        header,
        [
            [
                s["case"], s["frames"], s["wall_ratio"], s["train_ratio"], s["steady_fps_eager"],
                s["steady_fps_compiled"], s["steady_speedup"], s["compile_overhead_seconds"],
                s["break_even_frames"],
            ]
            for s in summary
        ],
    )  # fmt: skip
    cases = "\n".join(
        f"- `{n}`: `recipes/{CASES[n][0]}.py {CASES[n][1]} {args.extra}`".rstrip("` ") + "`"
        for n in args.cases
    )
    commit = git_commit()
    md = (
        "# `--compile` against eager, same session\n\n"
        f"Command: `{command_line()}`\n\nCommit: `{commit['commit']}`"
        f"{' (dirty)' if commit.get('dirty') else ''}; seeds {args.seeds}; one run at a time, "
        "eager then compiled; medians over seeds.\n\n"
        f"{table}\n\nCases:\n{cases}\n"
    )
    payload = {"command": command_line(), "git": commit, "host": host_info(), "runs": runs}
    payload["summary"] = summary
    for path in write_results(args.out, payload, md):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
