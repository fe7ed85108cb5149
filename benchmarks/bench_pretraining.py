"""Pretraining benchmark: does exploring first (intrinsic reward only) help a recipe later?

For every seed, four arms of ``recipes/<algo>.py`` on one task (default: PPG on sparse
MountainCar, reward 1 at the goal, scored on MountainCar-v0 with sampled actions):

* ``scratch``: the recipe alone, ``BUDGET`` frames;
* ``bonus``: the recipe with ``--intrinsic NAME`` (both rewards), ``BUDGET`` frames;
* ``pretrain``: ``--intrinsic NAME --pretraining`` (intrinsic reward only, extrinsic return
  evaluated), ``--pretrain-frames`` frames;
* ``finetune``: the recipe alone from the pretraining checkpoint (``--init-from``),
  ``BUDGET`` frames.

It reports, per seed and arm, the frames to the first evaluation at or above ``THRESHOLD``
(fine-tuning: also counting the pretraining frames) and the final evaluation, and writes
``benchmarks/results/pretraining_<algo>_<env>.json/.md``::

    .venv/bin/python benchmarks/bench_pretraining.py ppg rlkit/MountainCarSparse-v0 -160 \\
        1000000 --pretrain-frames 200000 --seeds 0 1 2 3 4

Every arm trains its whole budget (no early stop), two runs at a time by default (learning
is measured in frames, so sharing the cores changes seconds, not results).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
ARMS = ("scratch", "bonus", "pretrain", "finetune")


def _run(args: argparse.Namespace, arm: str, seed: int, root: Path) -> Path:
    run_dir = root / f"{arm}-s{seed}"
    cmd = [sys.executable, str(ROOT / "recipes" / f"{args.algo}.py"), "--env", args.env,
           "--seed", str(seed), "--eval-every", str(args.eval_every), "--progress", "false",
           "--run-dir", str(run_dir)]  # fmt: skip
    if arm == "pretrain":
        cmd += ["--intrinsic", args.intrinsic, "--pretraining", "true"]
        cmd += ["--total-frames", str(args.pretrain_frames)]
    else:
        cmd += ["--total-frames", str(args.budget)]
    if arm == "bonus":
        cmd += ["--intrinsic", args.intrinsic]
    if arm == "finetune":
        cmd += ["--init-from", str(root / f"pretrain-s{seed}" / "checkpoints" / "last.pt")]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"{arm} seed {seed} failed:\n{done.stderr[-2000:]}")
    return run_dir


def _curve(run_dir: Path) -> list[tuple[int, float]]:
    with open(run_dir / "eval.csv") as f:
        return [(int(r["frames"]), float(r["return_mean"])) for r in csv.DictReader(f)]


def _row(arm: str, seed: int, run_dir: Path, threshold: float, offset: int) -> dict:
    curve = _curve(run_dir)
    hits = [frames for frames, ret in curve if ret >= threshold]
    first = hits[0] if hits else None
    return {
        "arm": arm,
        "seed": seed,
        "frames_to_threshold": first,
        "frames_to_threshold_total": None if first is None else first + offset,
        "evals_at_threshold": f"{len(hits)}/{len(curve)}",
        "final_eval": curve[-1][1] if curve else None,
        "best_eval": max(r for _, r in curve) if curve else None,
        "curve": curve,
    }


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _markdown(payload: dict) -> str:
    a = payload["args"]
    lines = [
        f"# Pretraining: {a['algo']} on {a['env']}, threshold {a['threshold']}",
        "",
        f"Command: `{payload['command']}`; commit `{payload['commit']}`.",
        "",
        f"Arms (each seed): `scratch` ({a['budget']:,} frames), `bonus` (`--intrinsic "
        f"{a['intrinsic']}`, {a['budget']:,}), `pretrain` (`--intrinsic {a['intrinsic']} "
        f"--pretraining`, {a['pretrain_frames']:,}: the extrinsic return evaluated, not learned "
        f"from) and `finetune` (`--init-from` the pretraining checkpoint, {a['budget']:,}; "
        "frames to the threshold also counted with the pretraining frames added).",
        "",
        "| arm | solved | median frames to threshold | median counting pretraining "
        "| median final eval |",
        "|---|---|---|---|---|",
    ]
    for arm, s in payload["summary"].items():
        lines.append(
            f"| {arm} | {s['solved']}/{s['runs']} | {s['median_frames']} | "
            f"{s['median_frames_total']} | {s['median_final']} |"
        )
    lines += ["", "| arm | seed | frames to threshold | with pretraining | evals at threshold "
              "| best eval | final eval |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in payload["rows"]:
        lines.append(
            f"| {r['arm']} | {r['seed']} | {r['frames_to_threshold']} | "
            f"{r['frames_to_threshold_total']} | {r['evals_at_threshold']} | "
            f"{r['best_eval']:.1f} | {r['final_eval']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("algo")
    p.add_argument("env")
    p.add_argument("threshold", type=float)
    p.add_argument("budget", type=int)
    p.add_argument("--pretrain-frames", type=int, default=200_000)
    p.add_argument("--intrinsic", default="rnd")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--eval-every", type=int, default=25_000)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--out", default=None, help="result stem (default: pretraining_<algo>_<env>)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlkit-pretrain-") as tmp:
        root = Path(tmp)
        first = [(arm, s) for s in args.seeds for arm in ("scratch", "bonus", "pretrain")]
        with ThreadPoolExecutor(args.jobs) as pool:
            dirs = dict(zip(first, pool.map(lambda j: _run(args, *j, root), first), strict=True))
            then = [("finetune", s) for s in args.seeds]
            dirs |= dict(zip(then, pool.map(lambda j: _run(args, *j, root), then), strict=True))
        rows = [
            _row(arm, s, dirs[(arm, s)], args.threshold,
                 args.pretrain_frames if arm == "finetune" else 0)
            for s in args.seeds for arm in ARMS
        ]  # fmt: skip
    summary = {}
    for arm in ARMS:
        mine = [r for r in rows if r["arm"] == arm]
        summary[arm] = {
            "runs": len(mine),
            "solved": sum(r["frames_to_threshold"] is not None for r in mine),
            "median_frames": _median([r["frames_to_threshold"] for r in mine]),
            "median_frames_total": _median([r["frames_to_threshold_total"] for r in mine]),
            "median_final": _median([r["final_eval"] for r in mine]),
        }
    commit = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], capture_output=True,
                            text=True, cwd=ROOT).stdout.strip()  # fmt: skip
    payload = {
        "command": "python benchmarks/bench_pretraining.py " + " ".join(sys.argv[1:]),
        "commit": commit,
        "args": vars(args),
        "summary": summary,
        "rows": rows,
    }
    stem = args.out or f"pretraining_{args.algo}_{args.env.replace('/', '-')}"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(payload, indent=1) + "\n")
    (RESULTS / f"{stem}.md").write_text(_markdown(payload))
    print(_markdown(payload))


if __name__ == "__main__":
    main()
