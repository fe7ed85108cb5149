"""Faults of the process around a run (issue 51): a full disk while logging is one line like
one while checkpointing; a dead DDP rank stops the others with one line naming it; Ctrl-C
twice ends a run whose worker is stopped (SIGSTOP)."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlkit.training import checkpoint as ckpt
from rlkit.training.cli import cli

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}

SMALL = ["--env", "CartPole-v1", "--num-envs", "2", "--rollout-steps", "8", "--minibatch-size",
         "16", "--epochs", "1", "--eval-every", "0", "--eval-episodes", "1", "--progress",
         "false", "--threads", "1", "--checkpoint-every", "16", "--log-every", "1"]  # fmt: skip


def _run(capsys, argv: list[str]) -> tuple[int, list[str]]:
    from rlkit.algorithms import ppo

    capsys.readouterr()
    try:
        cli(lambda _: ppo.main(argv))
        code = 0
    except SystemExit as err:
        code = int(err.code)
    return code, capsys.readouterr().err.strip().splitlines()


def _full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("target", ["metrics.csv", "tensorboard"])
def test_a_full_disk_while_logging_is_one_line_and_the_run_resumes(
    target, tmp_path, capsys, monkeypatch
):
    """The disk fills after the second batch's checkpoint: the third batch's metrics row
    (or its TensorBoard event) cannot be written."""
    from rlkit.training import runlog

    run_dir = tmp_path / "run"
    argv = [*SMALL, "--total-frames", "64", "--run-dir", str(run_dir)]
    if target == "metrics.csv":
        write = runlog.CsvLog.write_many

        def write_many(self, rows):
            if self.path.name == "metrics.csv" and rows[0]["frames"] > 32:
                _full_disk()
            write(self, rows)

        monkeypatch.setattr(runlog.CsvLog, "write_many", write_many)
        what = "metrics.csv"
    else:
        pytest.importorskip("tensorboard")
        from tensorboard.summary.writer import record_writer

        write = record_writer.RecordWriter.write
        calls = {"n": 0}

        def write_record(self, data):
            calls["n"] += 1
            if calls["n"] > 40:  # past the first batches' events
                _full_disk()
            write(self, data)

        monkeypatch.setattr(record_writer.RecordWriter, "write", write_record)
        what = runlog.TB_EVENTS
    code, lines = _run(capsys, argv)
    assert code == 2
    errors = [line for line in lines if "rror" in line or "Traceback" in line]
    last = run_dir / "checkpoints" / "last.pt"
    assert len(errors) == 1 and errors[0] == lines[-1], lines
    assert lines[-1].startswith(f"error: could not write {what} in {str(run_dir)!r} (No space ")
    assert lines[-1].endswith(
        f"frames; training stopped, the last checkpoint {str(last)!r} is intact: free space "
        f"and continue with --resume last --run-dir {run_dir}"
    )
    stopped_at = ckpt.load(last)["counters"]["frames"]
    assert 16 <= stopped_at < 64
    monkeypatch.undo()
    code, lines = _run(capsys, [*argv, "--resume", "last"])
    assert code == 0, lines
    assert ckpt.load(last)["counters"]["frames"] == 64


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, f"no {path} after {timeout} s"
        time.sleep(0.1)


def _children(pid: int) -> list[int]:
    """The pids of ``pid``'s child processes (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


@pytest.mark.slow
def test_a_dead_ddp_rank_stops_the_others_with_one_line_naming_it(tmp_path):
    """``--strategy ddp`` on two CPU ranks; rank 1 (a child of rank 0) killed by SIGKILL once
    a checkpoint exists: rank 0 ends within 30 s with one line naming rank 1 (exit 3), the
    last checkpoint loads and the run resumes on two ranks."""
    run_dir = tmp_path / "run"
    argv = [PYTHON, str(ROOT / "recipes" / "ppo.py"), *SMALL, "--devices", "2", "--strategy",
            "ddp", "--accelerator", "cpu", "--run-dir", str(run_dir)]  # fmt: skip
    proc = subprocess.Popen(
        [*argv, "--total-frames", "1000000"], env=ENV, stderr=subprocess.PIPE, text=True
    )
    try:
        last = run_dir / "checkpoints" / "last.pt"
        _wait_for(last, proc, timeout=300)
        (rank1,) = _children(proc.pid)
        os.kill(rank1, signal.SIGKILL)
        killed = time.monotonic()
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = err.strip().splitlines()
    assert proc.returncode == 3, lines
    assert took < 30, took
    errors = [line for line in lines if "rror" in line or "Traceback" in line]
    assert len(errors) == 1 and errors[0] == lines[-1], lines
    assert lines[-1].startswith(f"error: rank 1 (pid {rank1}) ended: ")
    assert lines[-1].endswith(
        f"the other ranks stopped: training stopped, the last checkpoint {str(last)!r} is "
        f"intact; continue with --resume last --run-dir {run_dir}"
    )
    frames = ckpt.load(last)["counters"]["frames"]
    resumed = subprocess.run(
        [*argv, "--total-frames", str(frames + 64), "--resume", "last"],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert ckpt.load(last)["counters"]["frames"] == frames + 64


def _state(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


@pytest.mark.slow
@pytest.mark.parametrize("sync", ["false", "true"])
def test_ctrl_c_twice_ends_an_appo_run_whose_worker_is_stopped(sync, tmp_path):
    """One of two collector workers stopped by SIGSTOP: SIGINT, then SIGINT again 1.5 s later
    (a second request, SAME_REQUEST_S), ends the run within 10 s, and the stopped worker
    with it (Python's exit joined it for ever before)."""
    run_dir = tmp_path / "run"
    argv = [PYTHON, str(ROOT / "recipes" / "appo.py"), "--env", "CartPole-v1", "--workers",
            "2", "--num-envs", "4", "--eval-every", "0", "--eval-episodes", "1", "--progress",
            "false", "--threads", "1", "--checkpoint-every", "2048", "--total-frames",
            "10000000", "--sync-collect", sync, "--run-dir", str(run_dir)]  # fmt: skip
    proc = subprocess.Popen(argv, env=ENV, stderr=subprocess.PIPE, text=True)
    worker = server = None
    try:
        _wait_for(run_dir / "checkpoints" / "last.pt", proc, timeout=300)
        (server,) = [p for p in _children(proc.pid) if "forkserver" in _cmdline(p)]
        worker = sorted(_children(server))[0]
        os.kill(worker, signal.SIGSTOP)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        time.sleep(1.5)
        proc.send_signal(signal.SIGINT)
        second = time.monotonic()
        try:
            _, err = proc.communicate(timeout=30)
            took = time.monotonic() - second
        except subprocess.TimeoutExpired:
            took, err = time.monotonic() - second, "(still running after 30 s)"
    finally:
        # the stopped worker holds the stderr pipe open: end it (and the run) by pid
        for pid in (worker, server):
            if pid is not None and _state(pid) not in ("gone", "Z"):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)
    assert took < 10, (took, err)
    # asynchronous workers keep the learner fed: the first SIGINT has stopped the run at a
    # batch (checkpoint written) and the second comes while it exits, where Python's own
    # handler ends it by SIGINT; synchronous collection waits for the stopped worker until
    # the second stops it at once
    assert proc.returncode in (130, -signal.SIGINT), err
    assert "Traceback" not in err
    if proc.returncode == 130:
        assert err.strip().splitlines()[-1] == (
            "interrupted: SIGINT received twice: stopped at once, the last checkpoint written is "
            "kept"
        )
    assert _state(worker) in ("gone", "Z")  # killed with the run, not left stopped
    assert ckpt.load(run_dir / "checkpoints" / "last.pt")["counters"]["frames"] > 0


def _cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""
