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
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    REPO_ROOT,
    command_line,
    git_commit,
    markdown_table,
    median_or_none,
    run_measured,
    write_results,
)

RESULTS = REPO_ROOT / "benchmarks" / "results"
ARMS = ("scratch", "bonus", "pretrain", "finetune")


def _run(args: argparse.Namespace, arm: str, seed: int, root: Path) -> Path:
    run_dir = root / f"{arm}-s{seed}"
    cmd = [sys.executable, f"recipes/{args.algo}.py", "--env", args.env,
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
    result = run_measured(cmd, cwd=REPO_ROOT, timeout_s=args.timeout)
    if not (run_dir / "summary.json").is_file():
        raise RuntimeError(f"{arm} seed {seed} failed:\n{result.error_tail()}")
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
    ]
    summary = [
        [arm, f"{v['solved']}/{v['runs']}", v["median_frames"], v["median_frames_total"],
         v["median_final"]]
        for arm, v in payload["summary"].items()
    ]  # fmt: skip
    columns = ["arm", "solved", "median frames to threshold", "median counting pretraining",
               "median final eval"]  # fmt: skip
    lines.append(markdown_table(columns, summary))
    header = ["arm", "seed", "frames to threshold", "with pretraining", "evals at threshold",
              "best eval", "final eval"]  # fmt: skip
    keys = ("arm", "seed", "frames_to_threshold", "frames_to_threshold_total",
            "evals_at_threshold", "best_eval", "final_eval")  # fmt: skip
    lines += ["", markdown_table(header, [[r[k] for k in keys] for r in payload["rows"]])]
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
    p.add_argument("--timeout", type=float, default=3600, help="seconds per run")
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
            "median_frames": median_or_none(r["frames_to_threshold"] for r in mine),
            "median_frames_total": median_or_none(r["frames_to_threshold_total"] for r in mine),
            "median_final": median_or_none(r["final_eval"] for r in mine),
        }
    payload = {
        "command": command_line(),
        "commit": git_commit()["commit"][:10],
        "args": vars(args),
        "summary": summary,
        "rows": rows,
    }
    stem = args.out or f"pretraining_{args.algo}_{args.env.replace('/', '-')}"
    write_results(RESULTS / stem, payload, _markdown(payload))
    print(_markdown(payload))


if __name__ == "__main__":
    main()
