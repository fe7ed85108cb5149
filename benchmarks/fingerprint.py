"""The ten recipes' default runs, fingerprinted: every network's parameters after 4,096 frames.

A change that is meant to leave training alone (a refactor of the engine, the config layer or
the update loop) must leave these bit for bit as they were. Run it at the commit before the
change, then after it, and compare::

    .venv/bin/python benchmarks/fingerprint.py --out /tmp/before.pt          # old commit
    .venv/bin/python benchmarks/fingerprint.py --out /tmp/after.pt --compare /tmp/before.pt

Each recipe runs in its own process with its defaults, ``--total-frames 4096 --eval-every 0``
(IMPALA and APPO with ``--sync-collect true``: asynchronous collection is not reproducible
by design), and the modules of its final checkpoint are stored. ``--compare`` prints, per
recipe, ``same`` or the modules and tensors that differ, and exits 1 when any differ.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ("ppo", "a2c", "ppg", "impala", "appo", "dqn", "sac", "daac", "svpg", "rnd")
SYNC = {"impala", "appo"}


def run_recipe(name: str, run_dir: Path) -> dict[str, dict[str, torch.Tensor]]:
    argv = [sys.executable, str(ROOT / "recipes" / f"{name}.py"), "--total-frames", "4096"]
    argv += ["--eval-every", "0", "--eval-episodes", "4", "--progress", "false"]
    argv += ["--run-dir", str(run_dir)]
    if name in SYNC:
        argv += ["--sync-collect", "true"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"error: {name} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    payload = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    return {
        "modules": payload["modules"],
        "frames": torch.tensor(payload["counters"]["frames"]),
    }


def flatten(tree, prefix: str = "") -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    if isinstance(tree, torch.Tensor):
        out[prefix] = tree
    elif isinstance(tree, dict):
        for k, v in tree.items():
            out |= flatten(v, f"{prefix}.{k}" if prefix else str(k))
    return out


def compare(before: dict, after: dict) -> list[str]:
    lines, failed = [], False
    for name in sorted(set(before) | set(after)):
        if name not in before or name not in after:
            lines.append(f"{name}: only in {'after' if name in after else 'before'}")
            failed = True
            continue
        a, b = flatten(before[name]), flatten(after[name])
        diff = sorted(
            k for k in set(a) | set(b) if k not in a or k not in b or not _equal(a[k], b[k])
        )
        lines.append(
            f"{name}: same ({len(a)} tensors)" if not diff else f"{name}: DIFFER {diff[:8]}"
        )
        failed |= bool(diff)
    return lines + (["FAIL"] if failed else ["all same"])


def _equal(x: torch.Tensor, y: torch.Tensor) -> bool:
    return x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="where to store the fingerprints (.pt)")
    parser.add_argument("--compare", help="fingerprints of another commit to compare with")
    parser.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=RECIPES)
    args = parser.parse_args()
    prints = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.recipes:
            prints[name] = run_recipe(name, Path(tmp) / name)
            print(f"{name}: {int(prints[name]['frames']):,} frames", flush=True)
            torch.save(prints, args.out)  # after each recipe: a failure keeps the others
    if args.compare:
        before = torch.load(args.compare, weights_only=True)
        before = {k: v for k, v in before.items() if k in prints}
        lines = compare(before, prints)
        print("\n".join(lines))
        if lines[-1] == "FAIL":
            raise SystemExit(1)


if __name__ == "__main__":
    main()
