"""The run directory: metrics CSV, TensorBoard, progress line, learning curve, summary.

Layout of ``<run-dir>``::

    config.yaml      the resolved config
    metrics.csv      training metrics, one row per logged batch, x-axis ``frames``
    eval.csv         evaluation results: frames, train_seconds, return_mean, return_std
    tb/              TensorBoard events (when tensorboard is installed; --logger)
    wandb/, mlruns/  --logger wandb / mlflow: the W&B offline run, MLflow's file store
    trackers.json    the trackers' run ids (a resume logs on into the same runs)
    checkpoints/     last.pt, snapshots and best.pt (with --snapshot-best)
    curve.png        learning curve (evaluation and training episode returns vs frames)
    summary.json     final figures of the run
    eval.gif         an evaluation episode (with --video)
    videos/          eval_<frames>.gif every --video-every frames
    .lock            held by the live process of the run (see :class:`RunDirLock`)

A run owns its directory: a new run refuses a directory that holds another run's files
(:func:`check_run_dir`), ``--overwrite`` moves the old run aside first, and a live run
holds ``.lock`` so that a second process on the same directory is refused.

Only rank 0 writes. Lightning's ``CSVLogger`` deletes an existing ``metrics.csv`` when it is
constructed, which would lose a resumed run's history, so the CSV is appended here; rows
beyond the resumed checkpoint's frame count are dropped so no frame appears twice.
"""

from __future__ import annotations

import csv
import json
import math
import os
import socket
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from rlkit.training.errors import LogWriteError, RunFailedError

#: how a failed write to TensorBoard's events names them
TB_EVENTS = "the TensorBoard events (tb/)"

#: Files whose presence marks a directory as holding a run.
RUN_FILES = ("config.yaml", "metrics.csv", "eval.csv", "summary.json", "checkpoints")


def holds_run(run_dir: Path) -> bool:
    """True when ``run_dir`` holds another run's files."""
    return run_dir.is_dir() and any((run_dir / name).exists() for name in RUN_FILES)


def _lock_owner(path: Path) -> str:
    try:
        text = path.read_text().strip()
    except OSError:
        return "another process"
    return f"process {text}" if text else "another process"


def check_run_dir(
    run_dir: Path, *, new_run: bool, overwrite: bool = False, check_lock: bool = True
) -> None:
    """Refuse a run directory this run cannot own, before anything is written.

    Raises ``ValueError`` with one line naming the problem and the fix when ``run_dir`` is a
    file, is not writable, is in use by a live run, or (for a new run, unless ``overwrite``)
    already holds another run's files.
    """
    flag = f"--run-dir {str(run_dir)!r}"
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"{flag} is a file, not a directory: pass a directory path")
    ancestor = run_dir
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ValueError(f"{flag}: {str(ancestor)!r} is a file, not a directory; pick another path")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ValueError(
            f"{flag} is not writable (no write permission on {str(ancestor)!r}): pick a "
            "directory you can write to"
        )
    lock = run_dir / RunDirLock.NAME
    if check_lock and lock.is_file() and RunDirLock.held(lock):
        raise ValueError(
            f"{flag} is in use by a live run ({_lock_owner(lock)}): wait for it to end or "
            "pick another --run-dir"
        )
    if new_run and holds_run(run_dir) and not overwrite:
        raise ValueError(
            f"{flag} already holds a run: continue it with --resume last {flag}, pick a "
            "fresh --run-dir, or pass --overwrite to move the old run aside and start anew"
        )


class RunDirLock:
    """An advisory ``flock`` on ``<run-dir>/.lock`` held while a run lives.

    The kernel releases it when the process ends, however it ends (SIGKILL included), so a
    lock left by a killed run never blocks a resume; the file's text (pid and host) only
    names the holder in the refusal.
    """

    NAME = ".lock"

    def __init__(self, run_dir: Path) -> None:
        import fcntl

        self.path = run_dir / self.NAME
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self.fd)
            self.fd = None
            raise ValueError(
                f"--run-dir {str(run_dir)!r} is in use by a live run ({_lock_owner(self.path)}): "
                "wait for it to end or pick another --run-dir"
            ) from None
        os.ftruncate(self.fd, 0)
        os.write(self.fd, f"{os.getpid()} on {socket.gethostname()}\n".encode())

    @staticmethod
    def held(path: Path) -> bool:
        """True when a live process holds the lock file at ``path``."""
        import fcntl

        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return True
        finally:
            os.close(fd)
        return False

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor releases the flock
            self.fd = None


def claim_run_dir(run_dir: Path, *, new_run: bool, overwrite: bool = False) -> RunDirLock:
    """Create ``run_dir`` (moving an old run aside first with ``overwrite``) and lock it.

    Checks again under the lock, so two processes started on the same directory at once
    cannot both write into it.
    """
    if overwrite and holds_run(run_dir):
        RunDirLock(run_dir).release()  # refuses a directory a live run holds
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        aside = run_dir.with_name(f"{run_dir.name}.old-{stamp}")
        n = 1
        while aside.exists():
            aside, n = run_dir.with_name(f"{run_dir.name}.old-{stamp}-{n}"), n + 1
        run_dir.rename(aside)
        print(f"--overwrite: moved the old run to {aside}", file=sys.stderr, flush=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = RunDirLock(run_dir)
    try:
        check_run_dir(run_dir, new_run=new_run, check_lock=False)
    except ValueError:
        lock.release()
        raise
    return lock


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
        self.write_many([row])

    def write_many(self, rows: list[Mapping[str, Any]]) -> None:
        """Append ``rows`` (one file open; the header grows once for all their names)."""
        names = {k for row in rows for k in row}
        new = [k for k in names if k not in self.fields]
        if new or not self.path.is_file():
            old = []
            if self.path.is_file():
                with self.path.open(newline="") as f:
                    old = list(csv.DictReader(f))
            self.fields = ["frames"] + sorted((set(self.fields) | names) - {"frames"})
            self._rewrite(old)
        with self.path.open("a", newline="") as f:
            csv.DictWriter(f, fieldnames=self.fields, extrasaction="ignore").writerows(rows)

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


#: what the run directory keeps of its trackers' runs, so that a resumed run logs on into them
TRACKERS_FILE = "trackers.json"


def _tracker_ids(run_dir: Path) -> dict[str, str]:
    try:
        ids = json.loads((run_dir / TRACKERS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in ids.items()} if isinstance(ids, dict) else {}


def _wandb(run_dir: Path, run_id: str | None):
    """Lightning's ``WandbLogger``: offline unless ``WANDB_MODE`` says otherwise, its files in
    ``<run-dir>/wandb``, project ``WANDB_PROJECT`` (else ``rlkit``), named after the run
    directory; a resumed run logs on into the same W&B run (its id)."""
    from lightning.pytorch.loggers import WandbLogger

    os.environ.setdefault("WANDB_SILENT", "true")
    kwargs: dict[str, Any] = {"id": run_id, "resume": "allow"} if run_id else {}
    logger = WandbLogger(
        name=run_dir.name,
        save_dir=str(run_dir),
        project=os.environ.get("WANDB_PROJECT", "rlkit"),
        offline=os.environ.get("WANDB_MODE", "offline") == "offline",
        **kwargs,
    )
    # Lightning 2.6 passes anonymous=None, which wandb 0.31 answers with a deprecation warning
    init = getattr(logger, "_wandb_init", None)
    if isinstance(init, dict) and init.get("anonymous") is None:
        init.pop("anonymous", None)
    return logger


def _mlflow(run_dir: Path, uri: str | None, run_id: str | None):
    """Lightning's ``MLFlowLogger`` on ``uri`` (default: the file store ``<run-dir>/mlruns``;
    MLflow 3 refuses a file store unless ``MLFLOW_ALLOW_FILE_STORE`` is set, which is set here
    for a ``file:`` URI), experiment ``MLFLOW_EXPERIMENT_NAME`` (else ``rlkit``), run named
    after the run directory; a resumed run logs on into the same MLflow run."""
    from lightning.pytorch.loggers import MLFlowLogger

    uri = uri or (run_dir / "mlruns").resolve().as_uri()
    if uri.startswith("file:"):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return MLFlowLogger(
        experiment_name=os.environ.get("MLFLOW_EXPERIMENT_NAME", "rlkit"),
        run_name=run_dir.name,
        tracking_uri=uri,
        run_id=run_id,
    )


def _scalars(row: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of a row as a tracker takes them (no ``frames``: it is the step)."""
    return {
        k: float(v)
        for k, v in row.items()
        if k != "frames" and isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def _member_scalars(rows: list[Mapping[str, Any]]) -> dict[str, float]:
    """A population's per-member rows as one tracker row, ``member<i>/<name>``."""
    out: dict[str, float] = {}
    for row in rows:
        i = row.get("member")
        out |= {f"member{i}/{k}": v for k, v in _scalars(row).items() if k != "member"}
    return out


class CallbackError(RunFailedError):
    """A callback passed to the run (``callbacks=``) raised; the message names it, and the run
    stopped (exit status 3 on the command line)."""


class Callback:
    """Hooks of research code into a run: ``run(cfg, build, algo=..., callbacks=[...])``.

    Override any of the three; an object with any of these methods (no base class) works as
    well. They are called on rank 0 only (with DDP the metrics are already the same on every
    rank), in the order the callbacks were given. An exception in one stops the run with one
    line naming the callback and the hook (:class:`CallbackError`); the last checkpoint is
    kept, as after any fault.
    """

    def on_batch(self, frames: int, metrics: Mapping[str, float]) -> None:
        """After each batch's update: the frames so far (all ranks, one member's for a
        population) and the batch's metrics (the update's, ``episode_return`` and
        ``episode_length`` when episodes ended, ``fps``, ``train_seconds``; a population's
        per-member values as ``name/member<i>``), whether or not ``--log-every`` writes
        them to ``metrics.csv``."""

    def on_eval(self, frames: int, metrics: Mapping[str, float]) -> None:
        """After each evaluation: the row of ``eval.csv`` (``return_mean``, ``return_std``,
        ``train_seconds`` and the learner's details)."""

    def on_end(self, summary: Mapping[str, Any]) -> None:
        """Once the run is complete: ``summary.json``'s content (written already)."""


#: the hooks of a :class:`Callback`
HOOKS = ("on_batch", "on_eval", "on_end")


def check_callbacks(callbacks: Any) -> tuple[Any, ...]:
    """``callbacks`` as a tuple, each refused in one line (``TypeError``) unless it has at
    least one of :data:`HOOKS`, callable."""
    if callbacks is None:
        return ()
    if not isinstance(callbacks, (list, tuple)):
        callbacks = [callbacks]
    for cb in callbacks:
        hooks = [h for h in HOOKS if callable(getattr(cb, h, None))]
        if not hooks:
            raise TypeError(
                f"callbacks: {type(cb).__name__} has none of on_batch, on_eval, on_end; pass "
                "objects with those methods (subclass rlkit.training.Callback)"
            )
    return tuple(callbacks)


def call_back(callbacks: tuple[Any, ...], hook: str, *args: Any, run_dir: Path, frames: int):
    """``hook(*args)`` of every callback that has it; an exception becomes one
    :class:`CallbackError` line naming the callback, the hook and what the run kept."""
    for cb in callbacks:
        method = getattr(cb, hook, None)
        if method is None:
            continue
        try:
            method(*args)
        except Exception as err:
            name = f"{type(cb).__name__}.{hook}"
            last = run_dir / "checkpoints" / "last.pt"
            if hook == "on_end":
                kept = f"the run is complete, its results are in {run_dir}"
            elif last.exists():
                kept = (
                    f"training stopped, the last checkpoint {str(last)!r} is intact; continue "
                    f"with --resume last --run-dir {run_dir}"
                )
            else:
                kept = "training stopped, no checkpoint had been written yet"
            raise CallbackError(
                f"callback {name} raised {type(err).__name__} at {frames:,} frames: "
                f"{_first_line(err)}; {kept}"
            ) from err


class Progress:
    """A one-line progress display: a live bar on a terminal, periodic lines otherwise.

    ``enabled=False`` (ranks other than 0) prints nothing; ``bar=False`` (``--progress
    false``) drops the bar and the periodic lines but keeps :meth:`message` (the run
    directory, evaluations, the result).
    """

    def __init__(self, total: int, *, enabled: bool, start: int = 0, bar: bool = True) -> None:
        self.total, self.enabled, self.show_progress = total, enabled, enabled and bar
        self.tty = self.show_progress and sys.stderr.isatty()
        self.last_print = 0.0
        self.bar = None
        if self.tty:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=start, unit="frames", unit_scale=True, leave=True)

    def update(self, frames: int, fields: Mapping[str, str]) -> None:
        if not self.show_progress:
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


def _os_error(err: BaseException) -> OSError | None:
    """The ``OSError`` behind ``err`` (itself, or its cause or context: Lightning's TensorBoard
    logger turns a failed write into ``ValueError: you tried to log ...``), or None."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, OSError):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


def _quiet_tensorboard_thread() -> None:
    """TensorBoard writes its events from a thread of its own; a failed write (a full disk)
    there printed that thread's traceback, then failed the next write in the main thread,
    which :class:`RunLog` reports in one line. The thread's ``OSError`` is left to that."""
    previous = threading.excepthook
    if getattr(previous, "_rlkit_quiet_tensorboard", False):
        return

    def hook(args: threading.ExceptHookArgs) -> None:
        thread = type(args.thread).__name__ if args.thread is not None else ""
        if thread == "_AsyncWriterThread" and isinstance(args.exc_value, OSError):
            return
        previous(args)

    hook._rlkit_quiet_tensorboard = True  # type: ignore[attr-defined]
    threading.excepthook = hook


class RunLog:
    """Everything a run writes to its directory (rank 0 only; other ranks get a no-op).

    A write that fails (a full disk, permissions: an ``OSError`` from ``metrics.csv``,
    ``eval.csv``, ``summary.json`` or TensorBoard's events) raises
    :class:`~rlkit.training.errors.LogWriteError`, one line naming the file, like a failed
    checkpoint write."""

    def __init__(
        self,
        run_dir: Path,
        *,
        total_frames: int,
        enabled: bool,
        progress: bool,
        resume_frames: int | None = None,
        scalars: bool = True,
        loggers: tuple[str, ...] = ("csv", "tensorboard"),
        mlflow_uri: str | None = None,
    ) -> None:
        self.run_dir, self.enabled, self.scalars = run_dir, enabled, scalars
        self._closed = False
        #: the trackers besides TensorBoard (``--logger wandb,mlflow``), by name
        self.trackers: dict[str, Any] = {}
        self.progress = Progress(
            total_frames, enabled=enabled, bar=progress, start=resume_frames or 0
        )
        if not enabled:
            return
        run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics = CsvLog(run_dir / "metrics.csv", resume_frames=resume_frames)
        self.evals = CsvLog(run_dir / "eval.csv", resume_frames=resume_frames)
        self.tb = _tensorboard(run_dir) if "tensorboard" in loggers else None
        if self.tb is not None:
            _quiet_tensorboard_thread()
        ids = _tracker_ids(run_dir) if resume_frames is not None else {}
        if "wandb" in loggers:
            self.trackers["wandb"] = _wandb(run_dir, ids.get("wandb"))
        if "mlflow" in loggers:
            self.trackers["mlflow"] = _mlflow(run_dir, mlflow_uri, ids.get("mlflow"))

    def _tracked(self, call: str, *args: Any, skip: tuple[str, ...] = ()) -> None:
        """``call`` on every tracker (``--logger wandb,mlflow``) but those in ``skip``. A
        tracker that fails warns in one line and is dropped for the rest of the run: the run
        directory holds everything it would have."""
        for name, tracker in list(self.trackers.items()):
            if name in skip:
                continue
            try:
                getattr(tracker, call)(*args)
            except Exception as err:
                del self.trackers[name]
                self.progress.message(
                    f"warning: --logger {name} failed ({type(err).__name__}: "
                    f"{_first_line(err)}); logging on without it, the run directory has "
                    "every row"
                )

    def start(self, config: Mapping[str, Any], *, resumed: bool = False) -> None:
        """The run's config as every tracker's hyperparameters, and the trackers' run ids in
        ``trackers.json`` (a resumed run logs on into the same runs). MLflow refuses to change
        a logged parameter, so a resumed run's MLflow run keeps the values it started with
        (a resume may change only the budget, cadences and logging; ``config.yaml`` has the
        current values)."""
        if not (self.enabled and self.trackers):
            return
        self._tracked("log_hyperparams", dict(config), skip=("mlflow",) if resumed else ())
        ids = {}
        if "wandb" in self.trackers:
            ids["wandb"] = self.trackers["wandb"].experiment.id
        if "mlflow" in self.trackers:
            ids["mlflow"] = self.trackers["mlflow"].run_id
        path = self.run_dir / TRACKERS_FILE
        text = json.dumps(ids, indent=2) + "\n"
        self._write(TRACKERS_FILE, 0, _replace_text, path.with_suffix(".json.tmp"), path, text)

    def log_rows(self, frames: int, rows: list[Mapping[str, Any]]) -> None:
        """A population's per-member rows of ``metrics.csv`` (a ``member`` column); the
        trackers get them as one row of ``member<i>/<name>`` metrics."""
        if not (self.enabled and self.scalars):
            return
        self._write("metrics.csv", frames, self.metrics.write_many, rows)
        self._tracked("log_metrics", _member_scalars(rows), frames)

    def log_eval_rows(self, frames: int, rows: list[Mapping[str, Any]]) -> None:
        """A population's per-member rows of ``eval.csv``; the trackers get
        ``member<i>/eval/<column>``."""
        if not self.enabled:
            return
        self._write("eval.csv", frames, self.evals.write_many, rows)
        self._tracked("log_metrics", _member_scalars([_prefixed(r, "eval/") for r in rows]), frames)

    def _write(self, what: str, frames: int, write, *args: Any, **kwargs: Any) -> None:
        """``write(*args, **kwargs)``; an ``OSError`` (itself or behind another error) becomes
        one :class:`LogWriteError` line naming ``what`` and what to do."""
        try:
            write(*args, **kwargs)
        except Exception as err:
            cause = _os_error(err)
            if cause is None:
                raise
            reason = cause.strerror or str(cause) or type(cause).__name__
            last = self.run_dir / "checkpoints" / "last.pt"
            kept = (
                f"the last checkpoint {str(last)!r} is intact"
                if last.exists()
                else "no checkpoint had been written yet"
            )
            raise LogWriteError(
                f"could not write {what} in {str(self.run_dir)!r} ({reason}) at {frames:,} "
                f"frames; training stopped, {kept}: free space and continue with --resume last "
                f"--run-dir {self.run_dir}"
            ) from None

    def log(self, frames: int, metrics: Mapping[str, float]) -> None:
        if not (self.enabled and self.scalars):
            return
        row = {"frames": frames, **{k: _clean(v) for k, v in metrics.items()}}
        self._write("metrics.csv", frames, self.metrics.write, row)
        if self.tb is not None:
            scalars = {k: v for k, v in row.items() if k != "frames"}
            self._write(
                "the TensorBoard events (tb/)", frames, self.tb.log_metrics, scalars, frames
            )
        self._tracked("log_metrics", _scalars(row), frames)

    def log_eval(
        self,
        frames: int,
        train_seconds: float,
        mean: float,
        std: float,
        *,
        extra: Mapping[str, float] | None = None,
        text: str | None = None,
    ) -> None:
        """One evaluation: a row of ``eval.csv``, the trackers, and the progress line
        ``eval @ N frames: <text>`` (``text``: default ``return <mean> +- <std>``)."""
        if not self.enabled:
            return
        row = {"frames": frames, "train_seconds": round(train_seconds, 3)}
        row |= {"return_mean": mean, "return_std": std} | dict(extra or {})
        self._write("eval.csv", frames, self.evals.write, row)
        if self.tb is not None:
            scalars = {"eval/return_mean": mean, "eval/return_std": std}
            self._write(
                "the TensorBoard events (tb/)", frames, self.tb.log_metrics, scalars, frames
            )
        self._tracked("log_metrics", _scalars(_prefixed(row, "eval/")), frames)
        text = text or f"return {mean:.1f} +- {std:.1f}"
        self.progress.message(f"eval @ {frames:,} frames: {text} ({train_seconds:.1f} s)")

    def finish(self, summary: Mapping[str, Any]) -> None:
        """Results first: ``summary.json`` and ``curve.png``, then the TensorBoard flush (a
        failing extra warns in one line and the results stay)."""
        self.progress.close()
        if not self.enabled:
            return
        path = self.run_dir / "summary.json"
        tmp = path.with_suffix(".json.tmp")
        text = json.dumps(summary, indent=2, default=str) + "\n"
        self._write("summary.json", summary.get("frames", 0), _replace_text, tmp, path, text)
        # a population's settings (summary["population"]: one aggregate per setting, with
        # its members), each drawn on its own in curve.png
        groups = {a["settings"]: a["members"] for a in summary.get("population") or ()}
        try:
            plot_curve(
                self.run_dir,
                title=f"{summary.get('algo')} on {summary.get('env')}",
                deterministic=summary.get("config", {}).get("eval_deterministic", True),
                groups=groups or None,
            )
        except Exception as err:  # a missing plot must never fail a finished run
            self.progress.message(f"warning: could not draw curve.png: {_first_line(err)}")
        self._summarise(summary, path)
        self.close("success")

    def _summarise(self, summary: Mapping[str, Any], path: Path) -> None:
        """The summary's numbers to the trackers: W&B's run summary; MLflow's metrics
        ``summary/<name>`` at the last step, and ``summary.json`` as an artifact."""
        if not self.trackers:
            return
        numbers = _scalars({k: v for k, v in summary.items() if k != "config"})
        frames = int(summary.get("frames", 0) or 0)
        for name, tracker in list(self.trackers.items()):
            try:
                if name == "wandb":
                    tracker.experiment.summary.update(numbers)
                else:
                    tracker.log_metrics({f"summary/{k}": v for k, v in numbers.items()}, frames)
                    tracker.experiment.log_artifact(tracker.run_id, str(path))
            except Exception as err:
                del self.trackers[name]
                self.progress.message(
                    f"warning: --logger {name} could not take the summary "
                    f"({type(err).__name__}: {_first_line(err)}); it is in {path}"
                )

    def close(self, status: str) -> None:
        """Close the progress bar and the TensorBoard events (``status``: ``"success"`` from
        :meth:`finish`, or why a run stopped before it); the CSV logs are written row by row
        already. Once: a later call does nothing."""
        if self._closed:
            return
        self._closed = True
        self.progress.close()
        if self.enabled and self.tb is not None:
            try:
                self.tb.finalize(status)
            except Exception as err:
                self.progress.message(f"warning: TensorBoard flush failed: {_first_line(err)}")
        if self.enabled and self.trackers:
            self._tracked("finalize", status)
            wandb = self.trackers.get("wandb")
            if wandb is not None:  # Lightning's finalize leaves the W&B run open
                try:
                    wandb.experiment.finish(exit_code=0 if status == "success" else 1)
                except Exception as err:
                    self.progress.message(
                        f"warning: W&B could not finish its run: {_first_line(err)}"
                    )


def _prefixed(row: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """An ``eval.csv`` row's columns as ``eval/<column>`` (``frames`` and ``member`` kept)."""
    keep = ("frames", "member")
    return {k if k in keep else prefix + k: v for k, v in row.items()}


def _replace_text(tmp: Path, path: Path, text: str) -> None:
    tmp.write_text(text)
    tmp.replace(path)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _clean(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and math.isfinite(v):
        return float(f"{v:.6g}")
    return v


#: runs of a setting below which no interval is computed or drawn: a percentile bootstrap
#: over two runs is their [min, max], which is no 95% interval
MIN_RUNS_FOR_INTERVAL = 3


def plot_settings(
    run_dir: Path,
    groups: Mapping[str, Sequence[int]],
    *,
    title: str,
    name: str,
    train: bool = False,
) -> Path | None:
    """Draw ``<run-dir>/<name>`` for a population: per setting (``groups``: its label and its
    members' indices), the IQM over its members of the evaluation return at each evaluation,
    with the IQM's 95% bootstrap interval as a band from :data:`MIN_RUNS_FOR_INTERVAL`
    members up, else each member's own curve, thin; with ``train``, the mean training
    episode return of its members, dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rlkit.training.stats import bootstrap_ci, iqm

    rows = [r for r in CsvLog(run_dir / "eval.csv").read() if r.get("member") not in (None, "")]
    trains = []
    if train:
        trains = [
            r
            for r in CsvLog(run_dir / "metrics.csv").read()
            if r.get("member") not in (None, "") and r.get("episode_return")
        ]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    for label, indices in groups.items():
        members = {str(i) for i in indices}
        points: dict[float, list[float]] = {}
        for r in rows:
            if r["member"] in members and math.isfinite(float(r["return_mean"])):
                points.setdefault(float(r["frames"]), []).append(float(r["return_mean"]))
        xs = sorted(points)
        mid = [iqm(points[x]) for x in xs]
        n = len(members)
        line = ax.plot(xs, mid, marker="o", ms=3, label=f"{label} ({n} seed{'s' * (n != 1)})")
        color = line[0].get_color()
        if n >= MIN_RUNS_FOR_INTERVAL:
            bands = [bootstrap_ci(points[x], reps=500) for x in xs]
            ax.fill_between(
                xs, [b[0] for b in bands], [b[1] for b in bands], alpha=0.2, color=color
            )
        elif n > 1:  # no interval from so few runs: each member's own curve
            for i in sorted(members, key=int):
                mine = [r for r in rows if r["member"] == i]
                xm, ym = [float(r["frames"]) for r in mine], [float(r["return_mean"]) for r in mine]
                ax.plot(xm, ym, lw=0.8, alpha=0.5, color=color)
        by_frames: dict[float, list[float]] = {}
        for r in trains:
            if r["member"] in members:
                by_frames.setdefault(float(r["frames"]), []).append(float(r["episode_return"]))
        if by_frames:
            xt = sorted(by_frames)
            yt = [sum(by_frames[x]) / len(by_frames[x]) for x in xt]
            ax.plot(xt, yt, lw=1, ls="--", alpha=0.5, color=color)
    ylabel = "eval return (IQM over seeds)" + ("; train, dashed" if train else "")
    ax.set(xlabel="environment frames per member", ylabel=ylabel, title=title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=7)
    fig.tight_layout()
    out = run_dir / name
    fig.savefig(out)
    plt.close(fig)
    return out


def plot_curve(
    run_dir: Path,
    *,
    title: str,
    deterministic: bool = True,
    groups: Mapping[str, Sequence[int]] | None = None,
) -> Path | None:
    """Draw ``curve.png``: evaluation mean +- std and training episode returns vs frames; for
    a population (``groups``: each setting's members), one curve per setting
    (:func:`plot_settings`), never an average over settings."""
    if groups:
        return plot_settings(run_dir, groups, title=title, name="curve.png", train=True)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # a population's per-member rows (a ``member`` column) are drawn in population.png
    evals = [r for r in CsvLog(run_dir / "eval.csv").read() if not r.get("member")]
    train = [
        r
        for r in CsvLog(run_dir / "metrics.csv").read()
        if r.get("episode_return") and not r.get("member")
    ]
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
