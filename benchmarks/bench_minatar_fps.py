"""rlkit's PPO on MinAtar against a plain single-file torch PPO: frames/s, same session.

For every repeat r (``--repeats``, default 3, seed ``--seed + r``) and every game
(``--games``, default Breakout-v1 and SpaceInvaders-v1), one after the other, each in a fresh
process:

* **rlkit**: ``recipes/ppo.py --env MinAtar/<game> --total-frames F --eval-every 0
  --progress false --seed s --run-dir DIR`` (the ``MinAtar/*`` preset: 64 envs x 128 steps,
  4 epochs of 1024, ``rlkit.configs.suites.MINATAR_PPO``), its ``fps`` read from
  ``DIR/summary.json``;
* **plain**: ``benchmarks/plain_ppo_minatar.py --env MinAtar/<game> --total-frames F --seed s``,
  the same algorithm, hyperparameters, network, observation layout and vector env in one
  file of plain torch, its ``fps`` read from the JSON line it prints.

Both define frames/s the same way: frames / training seconds, where training seconds sum
the collection and the update of every batch and leave out start-up (imports, env and
network construction), logging, checkpoints and evaluation. The side that goes first
alternates between repeats, so slow drift in machine load hits both alike. Children get
``OMP_NUM_THREADS=1``, ``MKL_NUM_THREADS=1`` and the repository first on ``PYTHONPATH``; both
programs run one torch thread. Each process is also measured from outside (wall time, peak
RSS, CPU seconds; ``benchmarks/common.py``) with the 1-minute load average before it.

Output: ``benchmarks/results/fps_minatar_ppo.json`` (every raw run, medians, ratios, commit,
versions, host, command line) and ``.md`` (tables)::

    .venv/bin/python benchmarks/bench_minatar_fps.py                       # F = 262,144, R = 3
    .venv/bin/python benchmarks/bench_minatar_fps.py --games Breakout-v1 --repeats 1 \\
        --frames 65536 --out /tmp/fps_smoke                                # smoke test
    .venv/bin/python benchmarks/bench_minatar_fps.py --device cuda         # both on a GPU
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    REPO_ROOT,
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

#: the command of each side; placeholders {python} {env} {frames} {seed} {run_dir}
TEMPLATES = {
    "rlkit": (
        "{python} recipes/ppo.py --env {env} --total-frames {frames} --eval-every 0"
        " --progress false --seed {seed} --run-dir {run_dir} --accelerator {accelerator}"
    ),
    "plain": (
        "{python} benchmarks/plain_ppo_minatar.py --env {env} --total-frames {frames} --seed {seed}"
        " --device {device}"
    ),
}
SIDES = ("rlkit", "plain")
PACKAGES = ["rlkit", "torch", "torchrl", "tensordict", "gymnasium", "minatar", "numpy"]


def default_python() -> Path:
    """The repository's ``.venv`` interpreter, else the one running this script."""
    venv = REPO_ROOT / ".venv" / "bin" / "python"
    return venv if venv.exists() else Path(sys.executable)


def child_env() -> dict[str, str]:
    """Single-threaded BLAS/OpenMP, unbuffered output, this checkout first on the path."""
    env = dict(os.environ)
    path = [str(REPO_ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env.update(
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(path),
    )
    return env


def run_one(side: str, env_id: str, repeat: int, seed: int, args: argparse.Namespace) -> dict:
    """One measured process; a failure becomes a record with ``ok=False`` and its error."""
    with tempfile.TemporaryDirectory(prefix=f"fps_minatar_{side}_") as tmp:
        run_dir = Path(tmp) / "run"
        values = dict(python=args.python, env=env_id, frames=args.frames, seed=seed)
        values |= dict(device=args.device, accelerator="gpu" if args.device == "cuda" else "cpu")
        values["run_dir"] = run_dir
        command = shlex.split(
            TEMPLATES[side].format(**{k: shlex.quote(str(v)) for k, v in values.items()})
        )
        load = round(os.getloadavg()[0], 2)
        proc = run_measured(command, env=child_env(), timeout_s=args.timeout)
        record: dict[str, Any] = dict(side=side, env=env_id, repeat=repeat, seed=seed)
        record.update(ok=proc.ok, load_1min_before=load, error=None)
        record.update(frames=None, train_seconds=None, fps=None, train_return=None)
        record.update(proc.summary())
        try:
            if not proc.ok:
                raise RuntimeError(proc.error_tail())
            out = read_rlkit(run_dir, env_id) if side == "rlkit" else last_json_line(proc.stdout)
            record.update({k: out[k] for k in ("frames", "train_seconds", "fps")})
            record["train_return"] = out.get("train_return", out.get("mean_return_last100"))
            record["raw"] = out
        except (RuntimeError, ValueError, KeyError, OSError) as err:
            record.update(ok=False, error=f"{type(err).__name__}: {err}"[-2000:])
    return record


def read_rlkit(run_dir: Path, env_id: str) -> dict[str, Any]:
    """``summary.json`` of an rlkit run (config dropped), with ``train_return``: the mean
    training return of the last batch that finished episodes (``metrics.csv``)."""
    out = json.loads((run_dir / "summary.json").read_text())
    if (out.get("algo"), out.get("env")) != ("ppo", env_id):
        raise ValueError(f"summary.json is for {(out.get('algo'), out.get('env'))}")
    out.pop("config", None)
    returns = []
    with open(run_dir / "metrics.csv") as f:
        header = f.readline().strip().split(",")
        col = header.index("episode_return")
        for line in f:
            cell = line.strip().split(",")[col]
            if cell:
                returns.append(float(cell))
    out["train_return"] = returns[-1] if returns else None
    return out


def plan(args: argparse.Namespace) -> list[tuple[str, str, int, int]]:
    """``(side, env, repeat, seed)`` in run order: per repeat every game, both sides, the
    first side alternating between repeats."""
    order = []
    for repeat in range(args.repeats):
        sides = SIDES if repeat % 2 == 0 else SIDES[::-1]
        for game in args.games:
            env_id = game if "/" in game else f"MinAtar/{game}"
            order += [(side, env_id, repeat, args.seed + repeat) for side in sides]
    return order


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per game: medians per side and the ratios rlkit / plain."""
    out: dict[str, Any] = {}
    for env_id in dict.fromkeys(r["env"] for r in runs):
        per: dict[str, Any] = {}
        for side in SIDES:
            ok = [r for r in runs if r["env"] == env_id and r["side"] == side and r["ok"]]
            per[side] = dict(
                runs=sum(r["env"] == env_id and r["side"] == side for r in runs),
                ok=len(ok),
                fps=[r["fps"] for r in ok],
                median_fps=median_or_none(r["fps"] for r in ok),
                median_train_seconds=median_or_none(r["train_seconds"] for r in ok),
                median_wall_seconds=median_or_none(r["wall_seconds"] for r in ok),
                median_peak_rss_mb=median_or_none(r["peak_rss_mb"] for r in ok),
                median_train_return=median_or_none(r["train_return"] for r in ok),
            )
        per["ratio_fps"] = ratio(per["rlkit"]["median_fps"], per["plain"]["median_fps"])
        per["ratio_wall"] = ratio(
            per["rlkit"]["median_wall_seconds"], per["plain"]["median_wall_seconds"]
        )
        out[env_id] = per
    return out


def render_markdown(payload: dict[str, Any]) -> str:
    meta, summary, runs = payload["meta"], payload["summary"], payload["runs"]
    host = meta["host"]
    loads = [r["load_1min_before"] for r in runs]
    lines = [
        "# rlkit PPO vs a plain torch PPO on MinAtar: frames/s",
        "",
        f"- commit `{meta['git']['commit'][:12]}`" + (" (dirty)" if meta["git"]["dirty"] else ""),
        f"- command: `{meta['command']}`",
        f"- date (UTC): {meta['date_utc']}; {meta['frames']:,} frames per run "
        f"({meta['frames'] // (64 * 128)} updates of 64 envs x 128 steps); repeats "
        f"{meta['repeats']}, seeds {meta['seeds']}; device {meta.get('device', 'cpu')}",
        f"- host: {host['cpu_model']}, {host['logical_cpus']} logical CPUs, load at start "
        f"{host['load_average_at_start']}; 1-minute load before each run "
        f"{min(loads):.2f} to {max(loads):.2f} (shared machine)",
        f"- versions: {meta['versions']}",
        "- fps: frames / training seconds (collection + update; start-up, logging, "
        "checkpoints and evaluation excluded), as rlkit's `summary.json`",
    ]
    if meta.get("note"):
        lines.append(f"- note: {meta['note']}")
    rows = []
    for env_id, per in summary.items():
        rlkit, plain = per["rlkit"], per["plain"]
        rows.append(
            [
                env_id,
                ", ".join(f"{v:.0f}" for v in rlkit["fps"]),
                rlkit["median_fps"],
                ", ".join(f"{v:.0f}" for v in plain["fps"]),
                plain["median_fps"],
                per["ratio_fps"],
                rlkit["median_wall_seconds"],
                plain["median_wall_seconds"],
            ]
        )
    header = ["env", "rlkit fps (runs)", "rlkit median", "plain fps (runs)", "plain median"]
    header += ["rlkit / plain", "rlkit wall s", "plain wall s"]
    lines += ["", "## Frames/s, medians and ratio", "", markdown_table(header, rows)]
    cols = ["side", "env", "repeat", "seed", "ok", "frames", "train_seconds", "fps"]
    cols += ["train_return", "wall_seconds", "peak_rss_mb", "cpu_seconds", "load_1min_before"]
    raw = [[r[c] for c in cols] + [(r["error"] or "")[-80:].replace("|", "/")] for r in runs]
    lines += ["", "## Runs (in execution order)", "", markdown_table([*cols, "error"], raw)]
    lines += [
        "",
        "`train_return`: rlkit, the mean return of the episodes that ended in the last batch "
        "(`metrics.csv`); plain, the mean of the last 100 training episodes. A sanity check "
        "that both learn alike, not a learning result.",
    ]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--games", nargs="+", default=["Breakout-v1", "SpaceInvaders-v1"])
    p.add_argument("--frames", type=int, default=262_144, help="frames per run")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0, help="repeat r runs seed + r")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per process")
    p.add_argument("--python", type=Path, default=default_python())
    p.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks/results/fps_minatar_ppo")
    p.add_argument("--note", default="", help="free text stored with the results")
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where both sides keep their networks and batches (rlkit: --accelerator gpu)",
    )
    args = p.parse_args(argv)
    if args.frames % (64 * 128) or args.repeats < 1:
        p.error("--frames must be a multiple of 8192 (64 envs x 128 steps); --repeats >= 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    meta = dict(
        frames=args.frames,
        repeats=args.repeats,
        seeds=[args.seed + r for r in range(args.repeats)],
        games=args.games,
        command=command_line(),
        date_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        git=git_commit(),
        host=host_info(),
        versions=package_versions(args.python, PACKAGES),
        templates=TEMPLATES,
        timeout_s=args.timeout,
        device=args.device,
        note=args.note,
    )
    runs = []
    for side, env_id, repeat, seed in plan(args):
        record = run_one(side, env_id, repeat, seed, args)
        fields = ("side", "env", "seed", "ok", "fps", "train_seconds", "wall_seconds")
        line = " ".join(f"{k}={record[k]}" for k in (*fields, "load_1min_before"))
        print(line + (f" error={record['error'][-300:]!r}" if record["error"] else ""), flush=True)
        runs.append(record)
    payload = dict(meta=meta, summary=summarise(runs), runs=runs)
    for path in write_results(args.out, payload, render_markdown(payload)):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
