"""Several algorithms' runs on one task, side by side: one table and one plot.

Reads run directories (``eval.csv``, ``config.yaml``, ``summary.json`` when finished; runs
still training or stopped early count with the frames they reached) grouped by a label, and
writes ``<out>.json``, ``<out>.md`` and ``<out>.png``:

- per run: seed, frames reached, finished or not, final and best evaluation, and the
  evaluation at each ``--at`` frame count (the nearest one, within 5%);
- per label: the median over its runs at each ``--at`` frame count, over the runs that reached
  it, so algorithms are compared at equal frames;
- the plot: every run's curve (thin) and each label's median (thick), one colour per label,
  with the ``--anchor`` figures.

    .venv/bin/python benchmarks/compare_runs.py MinAtar/Breakout-v1 \\
        --runs ppo runs/ppo-s0 runs/ppo-s1 runs/ppo-s2 --runs ppg runs/ppg-s0 \\
        --at 1000000 2500000 5000000 10000000 --anchor "gymnax PPO=28" \\
        --out benchmarks/results/minatar_compare_Breakout-v1

A ``.json`` in place of a run directory is an earlier report of this script: its runs under
the same label are read from it (their stored curves), so a report can be extended after
the run directories are gone.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_learning import _held as curve_at  # noqa: E402 (last evaluation at or before x)
from common import command_line, git_commit, markdown_table, write_results  # noqa: E402


def read_run(run_dir: Path) -> dict:
    """One run directory: its seed, evaluation curve and whether it finished."""
    config = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    with (run_dir / "eval.csv").open() as f:
        rows = list(csv.DictReader(f))
    curve = [(int(r["frames"]), float(r["return_mean"])) for r in rows if r.get("return_mean")]
    if not curve:
        raise SystemExit(f"error: {run_dir} has no evaluation yet")
    summary = run_dir / "summary.json"
    finished = summary.is_file()
    final = json.loads(summary.read_text())["eval_return_mean"] if finished else curve[-1][1]
    return {
        "run_dir": str(run_dir),
        "seed": config.get("seed"),
        "frames": curve[-1][0],
        "finished": finished,
        "final": final,
        "best": max(v for _, v in curve),
        "curve": curve,
    }


def read_runs(path: Path, label: str) -> list[dict]:
    """A run directory (:func:`read_run`), or an earlier report's runs under ``label``."""
    if path.suffix != ".json":
        return [read_run(path)]
    groups = json.loads(path.read_text()).get("groups", {})
    if label not in groups:
        raise SystemExit(
            f"error: {path} has no runs labelled {label!r} (it has {sorted(groups)}): use one "
            "of its labels"
        )
    return [dict(r, curve=[tuple(p) for p in r["curve"]]) for r in groups[label]]


def held(curve: list[tuple[int, float]], frames: int) -> float | None:
    """The evaluation nearest to ``frames`` within 5% of it (evaluations land up to a batch
    past their nominal frame count); None when the run has none there."""
    x, y = min(curve, key=lambda point: abs(point[0] - frames))
    return y if abs(x - frames) <= 0.05 * frames else None


def plot(groups: dict[str, list[dict]], path: Path, *, title: str, anchors) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    for i, (label, runs) in enumerate(groups.items()):
        colour = f"C{i % 10}"
        for run in runs:
            xs, ys = zip(*run["curve"], strict=True)
            ax.plot(xs, ys, lw=0.7, alpha=0.35, color=colour)
        end = min(r["frames"] for r in runs)
        grid = sorted({x for r in runs for x, _ in r["curve"] if x <= end})
        mid = [statistics.median(curve_at(r["curve"], x) for r in runs) for x in grid]
        ax.plot(grid, mid, lw=2, color=colour, label=f"{label} (median of {len(runs)})")
    for (name, value), style in zip(anchors, ("--", "-.", ":"), strict=False):
        ax.axhline(value, color="grey", ls=style, lw=1, label=f"{name}: {value:g}")
    ax.set(xlabel="environment frames", ylabel="evaluation return", title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("env", help="the task, for the titles")
    parser.add_argument(
        "--runs",
        nargs="+",
        action="append",
        required=True,
        metavar="LABEL DIR",
        help="a label, then its run directories (repeat for each algorithm)",
    )
    parser.add_argument("--at", nargs="+", type=int, default=[], help="frame counts to compare")
    parser.add_argument("--anchor", action="append", default=[], help="NAME=VALUE, a figure")
    parser.add_argument("--note", default="", help="a paragraph for the report")
    parser.add_argument("--out", required=True, help="output stem (.json, .md, .png)")
    args = parser.parse_args()

    groups: dict[str, list[dict]] = {}
    for label, *dirs in args.runs:
        if not dirs:
            parser.error(f"--runs {label}: give at least one run directory")
        runs = [r for d in dirs for r in read_runs(Path(d), label)]
        dirs_seen = [r["run_dir"] for r in runs]
        twice = sorted({d for d in dirs_seen if dirs_seen.count(d) > 1})
        if twice:  # a report and one of its own run directories, or a report given twice
            parser.error(f"--runs {label}: runs given twice: {', '.join(twice)}")
        groups[label] = runs
    anchors = []
    for text in args.anchor:
        name, _, value = text.rpartition("=")
        anchors.append((name, float(value)))

    at = sorted(args.at)
    run_rows, summary_rows = [], []
    for label, runs in groups.items():
        for r in runs:
            run_rows.append(
                [label, r["seed"], f"{r['frames']:,}", "yes" if r["finished"] else "no"]
                + [r["final"], r["best"]]
                + [held(r["curve"], x) for x in at]
            )
        medians = []
        for x in at:
            values = [v for v in (held(r["curve"], x) for r in runs) if v is not None]
            medians.append(f"{statistics.median(values):.1f} ({len(values)})" if values else None)
        summary_rows.append([label, len(runs), *medians])

    stem = Path(args.out)
    stem.parent.mkdir(parents=True, exist_ok=True)
    png = stem.with_suffix(".png")
    plot(groups, png, title=args.env, anchors=anchors)
    commit = git_commit()
    columns = [f"at {x / 1e6:g}M" for x in at]
    md = [
        f"# {args.env}: {', '.join(groups)} side by side",
        "",
        f"Command: `{command_line()}`; commit `{commit.get('commit', '?')[:10]}`.",
        "",
        args.note,
        "",
        "Median evaluation return at equal frames (over the runs that reached them; how many "
        "in brackets):",
        "",
        markdown_table(["algorithm", "runs", *columns], summary_rows),
        "",
        "Every run (at each frame count the evaluation nearest to it, within 5%; a run not "
        "finished reports its last evaluation as final):",
        "",
        markdown_table(
            ["algorithm", "seed", "frames", "finished", "final", "best", *columns], run_rows
        ),
        "",
        f"![{args.env}]({png.name})",
    ]
    if anchors:
        md[5:5] = ["Published: " + "; ".join(f"{n} {v:g}" for n, v in anchors) + ".", ""]
    payload = {
        "env": args.env,
        "command": command_line(),
        "commit": commit,
        "at": at,
        "anchors": anchors,
        "groups": groups,
    }
    text = "\n".join(md).replace("\n\n\n\n", "\n\n").replace("\n\n\n", "\n\n")
    for path in write_results(stem, payload, text):
        print(path)
    print(png)


if __name__ == "__main__":
    main()
