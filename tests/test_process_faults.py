"""Faults of the process around a run (issue 51): a full disk while logging is one line like
one while checkpointing; a dead DDP rank stops the others with one line naming it; Ctrl-C
twice ends a run whose worker is stopped (SIGSTOP)."""

from __future__ import annotations

import errno
import os
import sys
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
