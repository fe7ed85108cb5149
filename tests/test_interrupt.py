"""Stopping a run with SIGINT (Ctrl-C) or SIGTERM (``kill``, a scheduler's pre-emption):
the run finishes its update, checkpoints that batch boundary, shuts its workers down and
exits with 128 + the signal; ``--resume last`` continues it (rlkit.training.signals)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rlkit.training import checkpoint as ckpt
from rlkit.training.signals import StopRequest

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def test_first_signal_is_a_request_the_second_stops_at_once_and_handlers_come_back():
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    lines: list[str] = []
    with StopRequest(lines.append) as stop:
        assert stop.signum is None
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # the handler runs in this thread between bytecodes
        assert stop.signum == signal.SIGTERM
        assert lines == [
            "SIGTERM received: stopping after this update and writing a checkpoint (send it "
            "again to stop at once)"
        ]
        with pytest.raises(KeyboardInterrupt, match="SIGINT received twice"):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
        assert stop.signum == signal.SIGTERM  # the first signal is the one reported
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_a_launcher_with_no_rank_left_stops_on_a_signal_and_a_rank_stopped_at_once_reports():
    """ForwardStop passes signals on to the ranks; with none left alive it stops its own
    process, as without it. A rank stopped at once (a second signal, or Ctrl-C before its
    loop) returns that stop instead of raising it into torch's spawn wrapper, which would
    swallow it and leave the launcher waiting for a result for ever."""
    from rlkit.training.engine import Engine, _Stopped
    from rlkit.training.signals import ForwardStop

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt, match="SIGTERM received"), ForwardStop():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
    assert signal.getsignal(signal.SIGTERM) == before

    engine = Engine.__new__(Engine)

    def at_once(fabric):
        raise KeyboardInterrupt("SIGTERM received twice: stopped at once")

    engine._run_rank = at_once
    stopped = engine._run_launched_rank(None)
    assert stopped == _Stopped("SIGTERM received twice: stopped at once", None, None)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    signal.signal(signal.SIGTERM, before)


def test_a_repeat_of_the_first_signal_at_once_is_the_same_request(monkeypatch):
    """A terminal's Ctrl-C reaches every process of the job, and a launcher passes it on:
    the copy that follows within SAME_REQUEST_S is not a second request; a later one is."""
    from rlkit.training import signals

    lines: list[str] = []
    with StopRequest(lines.append) as stop:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        assert stop.signum == signal.SIGINT and len(lines) == 1
        monkeypatch.setattr(signals, "SAME_REQUEST_S", 0.0)
        with pytest.raises(KeyboardInterrupt, match="SIGINT received twice"):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)


def _signal_during_final_evaluation(monkeypatch, *signums: int) -> None:
    """Every evaluation sends these signals to this process before it plays (with
    --eval-every 0 the final evaluation is the only one)."""
    from rlkit.training import evaluation, signals

    monkeypatch.setattr(signals, "SAME_REQUEST_S", 0.0)
    play = evaluation.Evaluator.returns

    def returns(self, policy):
        for signum in signums:
            os.kill(os.getpid(), signum)
            time.sleep(0.05)
        return play(self, policy)

    monkeypatch.setattr(evaluation.Evaluator, "returns", returns)


FINAL = ["--total-frames", "1024", "--eval-every", "0", "--checkpoint-every", "0"]
FINAL += ["--num-envs", "4", "--rollout-steps", "64", "--progress", "false"]


def test_a_signal_during_the_final_evaluation_waits_for_it_and_the_run_completes(
    tmp_path, monkeypatch, capsys
):
    from tests.test_engine import load_recipe

    _signal_during_final_evaluation(monkeypatch, signal.SIGTERM)
    summary = load_recipe("ppo").main([*FINAL, "--run-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert "SIGTERM came after the last batch: the run is complete" in err, err
    assert summary["frames"] == 1024 and (tmp_path / "summary.json").is_file()
    counters = ckpt.load(tmp_path / "checkpoints" / "last.pt")["counters"]
    assert counters["frames"] == counters["last_eval_frames"] == 1024
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers restored


def test_a_signal_during_the_last_batch_lets_the_run_complete(tmp_path, monkeypatch, capsys):
    """Signalled while its last batch trains, a run has nothing left to stop: it evaluates,
    checkpoints and writes its summary rather than saying it stopped at N of N frames."""
    from rlkit.training import engine
    from tests.test_engine import load_recipe

    real = engine._LoopState.maybe_checkpoint

    def maybe_checkpoint(self, **kwargs):
        if self.counters.frames >= self.cfg.total_frames:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
        return real(self, **kwargs)

    monkeypatch.setattr(engine._LoopState, "maybe_checkpoint", maybe_checkpoint)
    summary = load_recipe("ppo").main([*FINAL, "--run-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert summary["frames"] == 1024 and (tmp_path / "summary.json").is_file()
    assert "stopped at" not in err and "SIGTERM came after the last batch" in err, err


def test_a_second_signal_during_the_final_evaluation_keeps_every_frame_trained(
    tmp_path, monkeypatch
):
    """With --checkpoint-every 0 the run's frames reach disk before the final evaluation, so
    stopping at once there (or a SIGKILL) loses none; --resume last only evaluates."""
    from tests.test_engine import load_recipe

    ppo = load_recipe("ppo")
    _signal_during_final_evaluation(monkeypatch, signal.SIGTERM, signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt, match="SIGTERM received twice"):
        ppo.main([*FINAL, "--run-dir", str(tmp_path)])
    assert not (tmp_path / "summary.json").exists()
    payload = ckpt.load(tmp_path / "checkpoints" / "last.pt")
    assert payload["counters"]["frames"] == 1024
    monkeypatch.undo()
    summary = ppo.main([*FINAL, "--run-dir", str(tmp_path), "--resume", "last"])
    assert summary["frames"] == 1024 and (tmp_path / "summary.json").is_file()
    rows = (tmp_path / "metrics.csv").read_text().splitlines()[1:]
    assert [int(r.split(",")[0]) for r in rows] == list(range(256, 1025, 256))  # none again
    assert len((tmp_path / "eval.csv").read_text().splitlines()) == 2  # one evaluation


def _wait_for_frames(proc, metrics: Path, frames: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the run ended before it was interrupted"
        if metrics.is_file():
            rows = metrics.read_text().splitlines()[1:]
            if rows and int(rows[-1].split(",")[0]) >= frames:
                return
        time.sleep(0.05)
    raise AssertionError(f"no {frames} frames within {timeout} s")


def _modules(path: Path) -> dict[str, torch.Tensor]:
    payload = ckpt.load(path)
    return {
        f"{name}/{k}": v for name, state in payload["modules"].items() for k, v in state.items()
    }


@pytest.mark.slow
def test_sigint_checkpoints_the_batch_it_stops_at_and_resume_loses_no_frames(tmp_path):
    """The checkpoint an interrupt writes is the state of an uninterrupted run at the same
    frame count, bit for bit (the same seed; the uninterrupted run snapshots every batch).
    With --checkpoint-every 0 there would be no checkpoint at all after a SIGKILL."""
    common = ["recipes/ppo.py", "--eval-every", "0", "--progress", "false"]
    common += ["--total-frames", "60000"]  # the same schedules (learning rate, ...)
    run_dir = tmp_path / "run"
    args = [*common, "--checkpoint-every", "0"]
    args += ["--run-dir", str(run_dir)]
    proc = subprocess.Popen(
        [PYTHON, *args],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait_for_frames(proc, run_dir / "metrics.csv", 1024)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "warning" not in err.lower(), err
    last = run_dir / "checkpoints" / "last.pt"
    assert f"continue with --resume last --run-dir {run_dir}" in err
    stopped = ckpt.load(last)["counters"]["frames"]
    rows = (run_dir / "metrics.csv").read_text().splitlines()[1:]
    assert int(rows[-1].split(",")[0]) == stopped, "the checkpoint is not the last batch logged"
    assert 1024 <= stopped <= 16384, stopped
    assert f"stopped at {stopped:,} of 60,000 frames" in err
    assert not (run_dir / "summary.json").exists()  # not finished
    # the uninterrupted run, snapshotting every batch, as far as that frame count
    reference = tmp_path / "reference"
    snapshot = reference / "checkpoints" / f"frames_{stopped:012d}.pt"
    ref = subprocess.Popen(
        [PYTHON, *common, "--checkpoint-every", "256", "--run-dir", str(reference)],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for_frames(ref, reference / "metrics.csv", stopped + 256)
    finally:
        ref.kill()
        ref.wait()
    mine, theirs = _modules(last), _modules(snapshot)
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine), "not the batch boundary's state"

    resumed = subprocess.run(
        [PYTHON, *args, "--resume", "last", "--total-frames", str(stopped + 2048)],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed at {stopped:,} of" in resumed.stderr
    frames = [int(r.split(",")[0]) for r in (run_dir / "metrics.csv").read_text().splitlines()[1:]]
    assert frames == list(range(frames[0], stopped + 2048 + 1, 256)), "frames lost or repeated"


def _group_gone(pgid: int, timeout: float = 20.0) -> bool:
    """True once no process of the group is left (the workers and forkserver included)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "to_group"),
    [("SIGINT", True), ("SIGTERM", False)],  # Ctrl-C in a terminal; `kill PID`
)
def test_asynchronous_impala_stops_cleanly_with_its_workers(name, to_group, tmp_path):
    """IMPALA's collector workers ignore the signal (Ctrl-C reaches them too) and stop when
    the learner tells them; nothing is left running, nothing leaks, nothing is printed but
    the two lines that say what happened."""
    sig = getattr(signal, name)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [PYTHON, "recipes/impala.py", "--eval-every", "0", "--progress", "false"]
        + ["--checkpoint-every", "0", "--run-dir", str(run_dir)],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a shell gives a job
    )
    try:
        _wait_for_frames(proc, run_dir / "metrics.csv", 2048)
        if to_group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + sig, err[-3000:]
    assert _group_gone(proc.pid), "a worker outlived the run"
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines[1:] == [
        f"{name} received: stopping after this update and writing a checkpoint (send it again "
        "to stop at once)",
        lines[2],
    ], err
    assert lines[2].startswith(f"{name}: stopped at "), err
    frames = ckpt.load(run_dir / "checkpoints" / "last.pt")["counters"]["frames"]
    assert frames >= 2048 and f"stopped at {frames:,} of 500,000 frames" in lines[2]


def _stop_two_ranks(strategy: str, run_dir: Path, sig: int, *, to_group: bool):
    """PPO on two CPU ranks under ``strategy``, signalled after 2,048 frames (the whole job,
    or the process started alone): its exit status and stderr, once nothing of it is left;
    and both ranks' checkpoints, which must be the same save."""
    proc = subprocess.Popen(
        [PYTHON, "recipes/ppo.py", "--accelerator", "cpu", "--devices", "2"]
        + ["--strategy", strategy, "--eval-every", "0", "--progress", "false"]
        + ["--checkpoint-every", "0", "--total-frames", "200000", "--run-dir", str(run_dir)],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _wait_for_frames(proc, run_dir / "metrics.csv", 2048)
        if to_group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + sig, err[-3000:]
    assert _group_gone(proc.pid), "a rank outlived the run"
    zero = ckpt.load(run_dir / "checkpoints" / "last.pt")
    one = ckpt.load(run_dir / "checkpoints" / "rank1" / "last.pt")
    assert zero["save_id"] == one["save_id"]
    assert zero["counters"]["frames"] == one["counters"]["frames"] >= 2048
    a, b = zero["modules"]["actor"], one["modules"]["actor"]
    assert all(torch.equal(a[k], b[k]) for k in a), "the ranks stopped at different batches"
    return err, zero["counters"]["frames"]


@pytest.mark.slow
def test_ddp_ranks_agree_on_the_batch_when_only_one_is_signalled(tmp_path):
    """SIGTERM to rank 0 alone: rank 1 learns of it through the all-reduce after the batch and
    both write the same save (same frames, same save id) and exit; nobody waits forever."""
    _stop_two_ranks("ddp", tmp_path / "ddp", signal.SIGTERM, to_group=False)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "to_group"),
    [("SIGTERM", False), ("SIGINT", True)],  # a scheduler's `kill` of the launcher; Ctrl-C
)
def test_spawned_ranks_stop_together_and_the_launcher_reports_it(name, to_group, tmp_path):
    """--strategy ddp_spawn: the launching process is not a rank. A signal to it alone is
    passed on to the ranks; Ctrl-C, which reaches every process, is one request, not two.
    Either way both ranks write the same save and the launcher exits 128 + the signal
    (before, torch's spawn wrapper swallowed the ranks' stop and the launcher waited for a
    result forever)."""
    err, frames = _stop_two_ranks(
        "ddp_spawn", tmp_path / "spawn", getattr(signal, name), to_group=to_group
    )
    assert "Traceback" not in err and "received twice" not in err, err
    assert f"{name}: stopped at {frames:,} of 200,000 frames" in err
