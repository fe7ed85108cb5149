"""Score finished runs' final checkpoints under several evaluation protocols.

A published figure is measured under its own protocol (gymnax's MinAtar has no sticky
actions and a 1,000-step cap; MinAtar's own package has sticky actions 0.1 and no cap), so
a run is only comparable when scored the same way. For every run directory and every
``--protocol NAME=FLAGS`` this runs ``recipes/<algo>.py --eval-only --init-from
RUN/checkpoints/last.pt --eval-episodes N FLAGS`` (the checkpoint's own settings otherwise,
e.g. sampled or greedy actions) and writes every return, the per-protocol median over runs
and the table to ``--out`` (``.json`` and ``.md``)::

    .venv/bin/python benchmarks/eval_protocols.py ppo RUN_S0 RUN_S1 RUN_S2 \\
        --protocol "minatar=" \\
        --protocol "gymnax=--env-kwargs sticky_action_prob=0.0 --max-episode-steps 1000" \\
        --episodes 10 100 --anchor 28 --out benchmarks/results/minatar_ppo_Breakout-v1_protocols
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
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
    write_results,
)

OWN = "(the settings the run trained with)"


def evaluate(algo: str, run: Path, flags: list[str], episodes: int, python: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            python,
            str(REPO_ROOT / "recipes" / f"{algo}.py"),
            "--eval-only",
            "--init-from",
            str(run / "checkpoints" / "last.pt"),
            "--eval-episodes",
            str(episodes),
            "--progress",
            "false",
            "--run-dir",
            str(Path(tmp) / "eval"),
            *flags,
        ]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        return json.loads((Path(tmp) / "eval" / "evaluation.json").read_text())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("algo", help="the recipe that trained the runs (ppo, impala, ...)")
    parser.add_argument("runs", nargs="+", type=Path, help="run directories")
    parser.add_argument(
        "--protocol",
        action="append",
        required=True,
        help="NAME=FLAGS: a name and the recipe flags of one protocol (repeatable)",
    )
    parser.add_argument("--episodes", type=int, nargs="+", default=[10])
    parser.add_argument("--anchor", type=float, default=None, help="a published figure")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--out", required=True, help="output stem (.json and .md)")
    args = parser.parse_args(argv)

    protocols = []
    for item in args.protocol:
        name, sep, flags = item.partition("=")
        if not sep or not name:
            parser.error(f"--protocol {item!r} is not NAME=FLAGS")
        protocols.append((name, shlex.split(flags)))

    rows, results = [], []
    for run in args.runs:
        for name, flags in protocols:
            for n in args.episodes:
                r = evaluate(args.algo, run, flags, n, args.python)
                r.update(run=str(run), protocol=name, flags=flags)
                results.append(r)
                mean, std = r["eval_return_mean"], r["eval_return_std"]
                print(f"{run.name} {name} {n} episodes: {mean:.2f} +- {std:.2f}", flush=True)
                rows.append([run.name, r["trained_frames"], name, n, f"{mean:.1f} +- {std:.1f}"])
    medians = []
    for name, _ in protocols:
        for n in args.episodes:
            values = [
                r["eval_return_mean"]
                for r in results
                if r["protocol"] == name and r["episodes"] == n
            ]
            median = median_or_none(values)
            medians.append({"protocol": name, "episodes": n, "median": median})
    payload = {
        "command": command_line(),
        "commit": git_commit(),
        "host": host_info(),
        "protocols": {name: flags for name, flags in protocols},
        "anchor": args.anchor,
        "medians": medians,
        "results": results,
    }
    anchor = "" if args.anchor is None else f"; published figure {args.anchor:g}"
    md = [
        f"# {args.algo}: final checkpoints under {len(protocols)} evaluation protocols",
        "",
        f"Command: `{command_line()}`; commit `{git_commit().get('commit', '')[:10]}`.",
        "",
        "Protocols (recipe flags added to `--eval-only`): "
        + "; ".join(f"**{n}** `{' '.join(f) or OWN}`" for n, f in protocols),
        "",
        "## Median over runs" + anchor,
        "",
        markdown_table(
            ["protocol", "episodes", "median return"],
            [[m["protocol"], m["episodes"], f"{m['median']:.1f}"] for m in medians],
        ),
        "",
        "## Every run",
        "",
        markdown_table(["run", "trained frames", "protocol", "episodes", "return"], rows),
        "",
    ]
    for path in write_results(args.out, payload, "\n".join(md)):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
