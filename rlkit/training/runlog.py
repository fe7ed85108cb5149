"""The run directory: metrics CSV, TensorBoard, progress line, learning curve, summary.

Layout of ``<run-dir>``::

    config.yaml      the resolved config
    metrics.csv      training metrics, one row per logged batch, x-axis ``frames``
    eval.csv         evaluation results: frames, train_seconds, return_mean, return_std
    tb/              TensorBoard events (when tensorboard is installed)
    checkpoints/     last.pt and snapshots
    curve.png        learning curve (evaluation and training episode returns vs frames)
    summary.json     final figures of the run
    eval.gif         an evaluation episode (with --video)

Only rank 0 writes. Lightning's ``CSVLogger`` deletes an existing ``metrics.csv`` when it is
constructed, which would lose a resumed run's history, so the CSV is appended here; rows
beyond the resumed checkpoint's frame count are dropped so no frame appears twice.
"""

from __future__ import annotations

import csv
import json
import math
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class CsvLog:
    """Append-only CSV whose header grows when new metric names appear."""

    def __init__(self, path: Path, *, resume_frames: int | None = None) -> None:
        self.path = path
        self.fields: list[str] = []
        self.rows: list[dict[str, Any]] = []
        if path.is_file():
            with path.open(newline="") as f:
                reader = csv.DictReader(f)
                self.fields = list(reader.fieldnames or [])
                old = list(reader)
            if resume_frames is not None:
                old = [r for r in old if float(r.get("frames") or 0) <= resume_frames]
            self._rewrite(old)

    def _rewrite(self, rows: list[Mapping[str, Any]]) -> None:
        tmp = self.path.with_suffix(".csv.tmp")
        with tmp.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self.fields, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
        tmp.replace(self.path)

    def write(self, row: Mapping[str, Any]) -> None:
        new = [k for k in row if k not in self.fields]
        if new or not self.path.is_file():
            old = []
            if self.path.is_file():
                with self.path.open(newline="") as f:
                    old = list(csv.DictReader(f))
            self.fields = ["frames"] + sorted((set(self.fields) | set(row)) - {"frames"})
            self._rewrite(old)
        with self.path.open("a", newline="") as f:
            csv.DictWriter(f, fieldnames=self.fields, extrasaction="ignore").writerow(row)

    def read(self) -> list[dict[str, str]]:
        if not self.path.is_file():
            return []
        with self.path.open(newline="") as f:
            return list(csv.DictReader(f))


def _tensorboard(run_dir: Path):
    try:
        import tensorboard  # noqa: F401
        from lightning.fabric.loggers import TensorBoardLogger
    except ImportError:
        return None
    return TensorBoardLogger(root_dir=str(run_dir), name="", version="tb")


class Progress:
    """A one-line progress display: a live bar on a terminal, periodic lines otherwise."""

    def __init__(self, total: int, *, enabled: bool, start: int = 0) -> None:
        self.total, self.enabled = total, enabled
        self.tty = enabled and sys.stderr.isatty()
        self.last_print = 0.0
        self.bar = None
        if self.tty:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=start, unit="frames", unit_scale=True, leave=True)

    def update(self, frames: int, fields: Mapping[str, str]) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.n = min(frames, self.total)
            self.bar.set_postfix(fields, refresh=False)
            self.bar.refresh()
            return
        now = time.monotonic()
        if now - self.last_print >= 5.0 or frames >= self.total:
            self.last_print = now
            text = "  ".join(f"{k} {v}" for k, v in fields.items())
            print(f"[{frames:>10,}/{self.total:,} frames] {text}", file=sys.stderr, flush=True)

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class RunLog:
    """Everything a run writes to its directory (rank 0 only; other ranks get a no-op)."""

    def __init__(
        self,
        run_dir: Path,
        *,
        total_frames: int,
        enabled: bool,
        progress: bool,
        resume_frames: int | None = None,
    ) -> None:
        self.run_dir, self.enabled = run_dir, enabled
        self.progress = Progress(
            total_frames, enabled=enabled and progress, start=resume_frames or 0
        )
        if not enabled:
            return
        run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics = CsvLog(run_dir / "metrics.csv", resume_frames=resume_frames)
        self.evals = CsvLog(run_dir / "eval.csv", resume_frames=resume_frames)
        self.tb = _tensorboard(run_dir)

    def log(self, frames: int, metrics: Mapping[str, float]) -> None:
        if not self.enabled:
            return
        row = {"frames": frames, **{k: _clean(v) for k, v in metrics.items()}}
        self.metrics.write(row)
        if self.tb is not None:
            self.tb.log_metrics({k: v for k, v in row.items() if k != "frames"}, step=frames)

    def log_eval(self, frames: int, train_seconds: float, mean: float, std: float) -> None:
        if not self.enabled:
            return
        row = {"frames": frames, "train_seconds": round(train_seconds, 3)}
        row |= {"return_mean": mean, "return_std": std}
        self.evals.write(row)
        if self.tb is not None:
            self.tb.log_metrics({"eval/return_mean": mean, "eval/return_std": std}, step=frames)
        self.progress.message(
            f"eval @ {frames:,} frames: return {mean:.1f} +- {std:.1f} ({train_seconds:.1f} s)"
        )

    def finish(self, summary: Mapping[str, Any]) -> None:
        self.progress.close()
        if not self.enabled:
            return
        if self.tb is not None:
            self.tb.finalize("success")
        path = self.run_dir / "summary.json"
        path.write_text(json.dumps(summary, indent=2, default=str) + "\n")
        try:
            plot_curve(
                self.run_dir,
                title=f"{summary.get('algo')} on {summary.get('env')}",
                deterministic=summary.get("config", {}).get("eval_deterministic", True),
            )
        except Exception as err:  # a missing plot must never fail a finished run
            self.progress.message(f"could not draw curve.png: {err}")


def _clean(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and math.isfinite(v):
        return float(f"{v:.6g}")
    return v


def plot_curve(run_dir: Path, *, title: str, deterministic: bool = True) -> Path | None:
    """Draw ``curve.png``: evaluation mean +- std and training episode returns vs frames."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    evals = CsvLog(run_dir / "eval.csv").read()
    train = [r for r in CsvLog(run_dir / "metrics.csv").read() if r.get("episode_return")]
    if not evals and not train:
        return None
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    if train:
        x = [float(r["frames"]) for r in train]
        ax.plot(x, [float(r["episode_return"]) for r in train], lw=1, alpha=0.6, label="train")
    if evals:
        x = [float(r["frames"]) for r in evals]
        m = [float(r["return_mean"]) for r in evals]
        s = [float(r["return_std"]) for r in evals]
        ax.plot(
            x,
            m,
            marker="o",
            ms=3,
            label="eval (deterministic)" if deterministic else "eval (sampled actions)",
        )
        ax.fill_between(x, [a - b for a, b in zip(m, s)], [a + b for a, b in zip(m, s)], alpha=0.2)
    ax.set(xlabel="environment frames", ylabel="episode return", title=title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    out = run_dir / "curve.png"
    fig.savefig(out)
    plt.close(fig)
    return out
