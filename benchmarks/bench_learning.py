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

Every result also gives the final returns' median, interquartile mean (IQM) and its 95%
percentile-bootstrap interval over seeds (Agarwal et al. 2021), and ``<stem>.png``: each seed's
evaluation curve, their IQM, the threshold and any ``--anchor`` (a published figure), plus the
policy entropy over training where the recipe logs one. For field benchmarks (MuJoCo at 1M
frames) the final return is the point, so train the whole budget:

    .venv/bin/python benchmarks/bench_learning.py ppo Hopper-v5 2382.9 1000000 --full-budget \
        --eval-every 100000 --anchor "CleanRL PPO (v4, 3 seeds)=2382.9"

``--from-runs DIR [DIR ...]`` reads run directories trained elsewhere (``summary.json``,
``eval.csv``, ``metrics.csv``: e.g. long runs queued by hand) instead of training, and writes
the same report; an entry ending in ``.json`` is a file of recorded runs
(``{"source": ..., "runs": [{"seed", "frames", "eval_return_mean", "curve", ...}]}``) for
runs whose directories were not kept, each row keeping its source.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
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

from rlkit.training.stats import bootstrap_ci, iqm  # noqa: E402 (torch-free)


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
    if not (run_dir / "summary.json").is_file():
        row |= {"solved": False, "error": result.error_tail()}
    return _report_seed(row | read_run(run_dir, args))


def run_peer(args: argparse.Namespace, seed: int) -> dict:
    """SB3 with rl-zoo3's settings on the same task, budget and seed
    (``benchmarks/peers/sb3_final.py``): its final return and curve."""
    command = [
        args.sb3_python,
        str(REPO_ROOT / "benchmarks" / "peers" / "sb3_final.py"),
        args.algo,
        args.env,
        str(args.budget),
        str(seed),
        str(args.eval_every),
    ]
    result = run_measured(command, cwd=REPO_ROOT, timeout_s=args.timeout)
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith("{")]
    if not result.ok or not lines:
        print(f"sb3 seed {seed}: failed", flush=True)
        return {"seed": seed, "ok": False, "error": result.error_tail()}
    row = json.loads(lines[-1]) | {"ok": True, "wall_seconds": result.wall_seconds}
    print(f"sb3 seed {seed}: final={row['final_return']:.1f}", flush=True)
    return row


def read_run(run_dir: Path, args: argparse.Namespace) -> dict:
    """What one finished run directory says: its summary's figures, the evaluation curve and
    the policy entropy over training (every ~2% of the frames); {} without a summary."""
    summary_file = run_dir / "summary.json"
    if not summary_file.is_file():
        return {}
    summary = json.loads(summary_file.read_text())
    row = {"seed": summary["config"].get("seed")}
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
    row["entropy_curve"] = _entropy_curve(run_dir / "metrics.csv", row["frames"])
    if args.full_budget:
        row |= _full_budget_stats(run_dir, row["curve"], args.threshold, row["frames"])
    return row


def _curve_hits(curve, threshold: float) -> dict:
    """Solved at the first evaluation >= threshold, and how many evaluations reached it."""
    hits = [(f, m) for f, m in curve if m >= threshold]
    return {
        "solved": bool(hits),
        "solved_frames": hits[0][0] if hits else None,
        "solved_seconds": None,
        "evals_at_threshold": f"{len(hits)}/{len(curve)}",
    }


def _recorded_runs(path: Path) -> list[dict]:
    """Runs recorded in a JSON file, ``{"source": ..., "runs": [{seed, frames,
    eval_return_mean, curve, ...}]}`` (runs whose directories were not kept); each row
    carries the file's ``source``."""
    data = json.loads(path.read_text())
    return [dict(r, source=data.get("source", str(path))) for r in data["runs"]]


def _report_seed(row: dict) -> dict:
    status = "solved" if row.get("solved") else "not solved"
    print(
        f"seed {row.get('seed')}: {status} frames={row.get('solved_frames')} "
        f"best={row.get('best_eval')} final={row.get('eval_return_mean')} "
        f"train_s={row.get('train_seconds')}",
        flush=True,
    )
    return row


def _entropy_curve(metrics: Path, frames: int, points: int = 50) -> list[tuple[int, float]]:
    """``(frames, entropy)`` about every ``frames / points`` frames from ``metrics.csv``."""
    if not metrics.is_file():
        return []
    out: list[tuple[int, float]] = []
    with metrics.open() as f:
        for r in csv.DictReader(f):
            if not r.get("entropy"):
                continue
            step = int(r["frames"])
            if not out or step - out[-1][0] >= frames / points:
                out.append((step, float(r["entropy"])))
    return out


def final_stats(rows: list[dict]) -> dict:
    """Median, IQM and the IQM's 95% bootstrap interval of the runs' final evaluations."""
    finals = [r["eval_return_mean"] for r in rows if r.get("eval_return_mean") is not None]
    if not finals:
        return {}
    low, high = bootstrap_ci(finals)
    return {
        "final_returns": finals,
        "final_median": statistics.median(finals),
        "final_iqm": iqm(finals),
        "final_iqm_ci95": [low, high],
    }


def plot_curves(rows: list[dict], path: Path, *, title: str, threshold, anchors) -> Path | None:
    """Each seed's evaluation curve (thin), their IQM at each evaluation (a run that stopped
    at the threshold holds its last value), the threshold and the anchors; a second panel
    with the policy entropy over training when the runs logged it."""
    curves = [r["curve"] for r in rows if r.get("curve")]
    if not curves:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    entropy = [r["entropy_curve"] for r in rows if r.get("entropy_curve")]
    panels = 2 if entropy else 1
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4), dpi=100, squeeze=False)
    ax = axes[0][0]
    for i, row in enumerate(rows):  # colour C{i}: the same seed in both panels
        if row.get("curve"):
            xs, ys = zip(*row["curve"], strict=True)
            ax.plot(xs, ys, lw=0.8, alpha=0.5, color=f"C{i % 10}", label=f"seed {row['seed']}")
    grid = sorted({x for c in curves for x, _ in c})
    mid = [iqm([_held(c, x) for c in curves]) for x in grid]
    ax.plot(grid, mid, color="black", lw=2, label=f"IQM ({len(curves)} seeds)")
    ax.axhline(threshold, color="grey", ls=":", lw=1, label=f"threshold {threshold:g}")
    for (label, value), style in zip(anchors, ("--", "-.", (0, (5, 1)), (0, (1, 1))), strict=False):
        ax.axhline(value, color="tab:red", ls=style, lw=1, label=f"{label}: {value:g}")
    ax.set(xlabel="environment frames", ylabel="evaluation return", title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, loc="best")
    if entropy:
        ax2 = axes[0][1]
        for i, row in enumerate(rows):
            if row.get("entropy_curve"):
                xs, ys = zip(*row["entropy_curve"], strict=True)
                ax2.plot(xs, ys, lw=0.8, color=f"C{i % 10}", label=f"seed {row['seed']}")
        ax2.set(xlabel="environment frames", ylabel="policy entropy", title="entropy")
        ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _held(curve: list[tuple[int, float]], x: int) -> float:
    """The curve's value at frame ``x``: its last evaluation at or before ``x`` (its first
    when ``x`` precedes it)."""
    value = curve[0][1]
    for frames, ret in curve:
        if frames > x:
            break
        value = ret
    return value


def _anchor(text: str) -> tuple[str, float]:
    label, sep, value = text.rpartition("=")
    try:
        if not sep or not label:
            raise ValueError
        return label.strip(), float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--anchor takes LABEL=VALUE (e.g. 'CleanRL PPO=1442.6'), got {text!r}"
        ) from None


def _full_budget_stats(run_dir: Path, curve, threshold: float, frames: int) -> dict:
    """Solved at the first evaluation >= threshold; evaluations at the threshold; the mean
    training-episode return over the last 10% of the frames (from metrics.csv)."""
    out = _curve_hits(curve, threshold)
    with (run_dir / "eval.csv").open() as f:
        seconds = {int(r["frames"]): float(r["train_seconds"]) for r in csv.DictReader(f)}
    if out["solved"]:
        out["solved_seconds"] = seconds.get(out["solved_frames"])
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
    p.add_argument(
        "--anchor",
        type=_anchor,
        action="append",
        default=[],
        help="a published figure to show next to the results, LABEL=VALUE (repeatable)",
    )
    p.add_argument(
        "--note",
        default=None,
        help="a sentence for the report (e.g. how and at which commit --from-runs runs trained)",
    )
    p.add_argument(
        "--sb3-python",
        default=None,
        metavar="PY",
        help="also run SB3 (rl-zoo3 settings, benchmarks/peers/sb3_final.py) with this python "
        "for the same seeds and budget, interleaved, and compare final returns",
    )
    p.add_argument(
        "--from-runs",
        nargs="+",
        type=Path,
        default=None,
        metavar="DIR",
        help="report these finished run directories instead of training (seeds from them)",
    )
    p.add_argument(
        "--sb3-from",
        type=Path,
        default=None,
        metavar="FILE",
        help="with --from-runs: SB3's runs from an earlier report's .json (its sb3 section, "
        "e.g. when an rlkit run of it had to be resumed elsewhere)",
    )
    # flags this script does not know (after "--" or anywhere) go to the recipe
    args, extra = p.parse_known_args()
    args.extra = [a for a in extra if a != "--"]
    peer_rows: list[dict] = []
    if args.from_runs:
        missing = [
            str(d)
            for d in args.from_runs
            if not (d / "summary.json").is_file() and not (d.suffix == ".json" and d.is_file())
        ]
        if missing:
            p.error(
                f"--from-runs: no summary.json in {', '.join(missing)} (unfinished runs?), "
                "and not a .json file of recorded runs"
            )
        rows = []
        for d in args.from_runs:
            if d.suffix == ".json":
                rows += [r | _curve_hits(r["curve"], args.threshold) for r in _recorded_runs(d)]
            else:
                rows.append(read_run(d, args))
        rows = [_report_seed(r) for r in rows]
        args.seeds = [r["seed"] for r in rows]
        if args.sb3_from:
            recorded = json.loads(args.sb3_from.read_text()).get("sb3") or {}
            peer_rows = [r for r in recorded.get("runs", []) if r.get("seed") in args.seeds]
    else:
        sides = ["rlkit", "sb3"] if args.sb3_python else ["rlkit"]
        jobs = [(side, seed) for seed in args.seeds for side in sides]  # interleaved
        with (
            tempfile.TemporaryDirectory(prefix="rlkit-bench-") as tmp,
            ThreadPoolExecutor(args.jobs) as pool,
        ):
            done = list(
                pool.map(
                    lambda job: (
                        run_seed(args, job[1], Path(tmp))
                        if job[0] == "rlkit"
                        else run_peer(args, job[1])
                    ),
                    jobs,
                )
            )
        rows = [r for (side, _), r in zip(jobs, done, strict=True) if side == "rlkit"]
        peer_rows = [r for (side, _), r in zip(jobs, done, strict=True) if side == "sb3"]
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
        **final_stats(rows),
        "anchors": dict(args.anchor),
        "note": args.note,
        "from_runs": [str(d) for d in args.from_runs] if args.from_runs else None,
        "runs": rows,
        "sb3": _peer_payload(peer_rows) if peer_rows else None,
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
    columns, fields = [*columns, "fps"], [*fields, "fps"]
    if any(r.get("source") for r in rows):  # some rows recorded elsewhere (--from-runs .json)
        columns, fields = [*columns, "source"], [*fields, "source"]
    table = markdown_table(columns, [[r.get(k) for k in fields] for r in rows])
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
        f"`{command_line()}`; commit `{payload['commit']['commit'][:10]}`.\n\n"
        f"{args.note + chr(10) * 2 if args.note else ''}"
        f"{_summary_lines(payload)}{table}\n{_peer_lines(payload)}"
    )
    env_name = args.env.replace("/", "-")  # namespaced ids such as rlkit/MountainCarSparse-v0
    stem = Path(
        args.out or REPO_ROOT / "benchmarks" / "results" / f"learning_{args.algo}_{env_name}"
    )
    title = f"{args.algo} on {args.env}"
    plot = plot_curves(
        rows, stem.with_suffix(".png"), title=title, threshold=args.threshold, anchors=args.anchor
    )
    if plot is not None:
        md += f"\n![{title}]({plot.name})\n"
    for path in [*write_results(stem, payload, md), *([plot] if plot else [])]:
        print(f"wrote {path}")


def _peer_payload(peer_rows: list[dict]) -> dict:
    finals = [{"eval_return_mean": r.get("final_return")} for r in peer_rows]
    return {"runs": peer_rows, **final_stats(finals)}


def _peer_lines(payload: dict) -> str:
    """SB3's final returns for the same seeds and the ratio of the medians, as Markdown."""
    peer = payload.get("sb3")
    if not peer:
        return ""
    rows = [
        [r["seed"], r.get("final_return"), r.get("train_seconds"), r.get("fps")]
        for r in peer["runs"]
    ]
    text = "\n## Stable-Baselines3, rl-zoo3 settings, same seeds and budget (interleaved)\n\n"
    text += markdown_table(["seed", "final eval", "train s", "fps"], rows) + "\n"
    if "final_median" in peer and "final_median" in payload:
        low, high = peer["final_iqm_ci95"]
        text += (
            f"\nSB3 final: median {peer['final_median']:.1f}, IQM {peer['final_iqm']:.1f} "
            f"(95% CI {low:.1f} to {high:.1f}). rlkit median - SB3 median: "
            f"{payload['final_median'] - peer['final_median']:+.1f}.\n"
        )
    return text


def _summary_lines(payload: dict) -> str:
    """The final returns' median and IQM with its interval, and the anchors, as Markdown."""
    if "final_iqm" not in payload:
        return ""
    low, high = payload["final_iqm_ci95"]
    finals = ", ".join(f"{v:.1f}" for v in payload["final_returns"])
    text = (
        f"Final evaluation: median {payload['final_median']:.1f}, IQM {payload['final_iqm']:.1f} "
        f"(95% bootstrap CI {low:.1f} to {high:.1f}) over {len(payload['final_returns'])} "
        f"runs ({finals}).\n\n"
    )
    if payload["anchors"]:
        text += "Published anchors: " + "; ".join(
            f"{label} {value:g}" for label, value in payload["anchors"].items()
        )
        text += ".\n\n"
    return text


if __name__ == "__main__":
    main()
