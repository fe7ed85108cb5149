"""A lost IMPALA/APPO collector worker is never silent (issue 49, local workers): one killed
(SIGKILL) or stopped (SIGSTOP, a hung actor) mid-run is replaced with one warning line and the
run finishes with its frames exact; past ``--max-actor-restarts`` the run stops with one line
(exit 3) after a checkpoint at the last complete batch.

The runs are in this process (``cli(appo.main)``); a patched ``WorkerCollector._gather``
signals worker 1 when the learner asks for a chosen batch."""

from __future__ import annotations

import contextlib
import csv
import os
import re
import signal
import time

import pytest

from rlkit.data import async_collect
from rlkit.training import checkpoint as ckpt
from rlkit.training.cli import cli

FRAMES_PER_BATCH = 2 * 8  # --num-envs 2 x --rollout-steps 8
ARGS = ["--env", "CartPole-v1", "--workers", "2", "--num-envs", "2", "--rollout-steps", "8",
        "--minibatch-size", "16", "--epochs", "1", "--eval-every", "0", "--eval-episodes", "1",
        "--progress", "false", "--threads", "1", "--log-every", "1",
        "--actor-timeout", "2"]  # fmt: skip

WARNING = re.compile(
    r"warning: collector worker 1 \(pid (\d+)\) (.+): replaced by pid (\d+) "
    r"\(restart (\d) of (\d); its unfinished batch dropped\)"
)


def _run(
    capsys, monkeypatch, argv, faults: dict[int, int], slow_learner: bool = False
) -> tuple[int, list[str], list]:
    """``recipes/appo.py argv`` in this process, sending ``faults[k]`` (a signal) to worker 1
    when the learner asks for its batch ``k`` (1-based; later if worker 1 has delivered no
    batch yet, which a hang timeout 60 s longer covers); the exit status, the stderr lines
    (with the collector's logged warnings, which pytest captures apart) and the pids
    signalled (stopped ones are killed afterwards). ``slow_learner``: after a fault, each
    batch is asked for a hang timeout late until a worker was replaced (asynchronous
    collection: the healthy worker alone would feed a short run before the hang shows)."""
    from rlkit.algorithms import appo

    gather, asked, signalled = async_collect.WorkerCollector._gather, [0], []

    def faulty_gather(self):
        asked[0] += 1
        if slow_learner and signalled and not self.restarts:
            time.sleep(self.hang_timeout() + 0.5)
        if asked[0] in faults and not self._workers[1].delivered:
            faults[asked[0] + 1] = faults.pop(asked[0])  # mid-run: once it has delivered
        if asked[0] in faults:
            pid = self.pids[1]
            os.kill(pid, faults[asked[0]])
            signalled.append(pid)
        return gather(self)

    monkeypatch.setattr(async_collect.WorkerCollector, "_gather", faulty_gather)
    warned: list[str] = []
    monkeypatch.setattr(async_collect._log, "warning", warned.append)
    capsys.readouterr()
    try:
        cli(lambda _: appo.main(argv))
        code = 0
    except SystemExit as err:
        code = int(err.code)
    finally:
        for pid in signalled:  # a stopped worker the run did not end
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    lines = capsys.readouterr().err.strip().splitlines()
    return code, [*warned, *lines], signalled


def _frames(run_dir) -> list[int]:
    with open(run_dir / "metrics.csv") as f:
        return [int(float(row["frames"])) for row in csv.DictReader(f) if row.get("frames")]


@pytest.mark.slow  # two APPO runs with worker processes (~15 s each on 2 busy cores)
@pytest.mark.parametrize("sync", ["true", "false"])
@pytest.mark.parametrize("fault", ["SIGKILL", "SIGSTOP"])
def test_a_lost_worker_is_replaced_with_one_line_and_the_frames_stay_exact(
    fault, sync, tmp_path, capsys, monkeypatch
):
    run_dir = tmp_path / "run"
    # asynchronous: worker 0 alone may feed the first batches while worker 1 starts up (the
    # fault waits for worker 1's first batch), so the run is long enough for it to deliver
    batches = 6 if sync == "true" else 12
    total = FRAMES_PER_BATCH * batches
    argv = [*ARGS, "--sync-collect", sync, "--total-frames", str(total), "--run-dir", str(run_dir)]
    slow = fault == "SIGSTOP" and sync == "false"
    code, lines, (lost,) = _run(capsys, monkeypatch, argv, {2: getattr(signal, fault)}, slow)
    assert code == 0, lines
    warnings = [line for line in lines if line.startswith("warning: collector worker")]
    assert len(warnings) == 1, lines
    assert not any("Traceback" in line or line.startswith("error") for line in lines), lines
    old, why, new, restart, limit = WARNING.fullmatch(warnings[0]).groups()
    assert int(old) == lost and int(new) != lost and (restart, limit) == ("1", "3")
    if fault == "SIGKILL":
        assert why == "was killed by SIGKILL"
    else:  # no batch for longer than --actor-timeout 2 (or 10x the slowest batch)
        waited = float(
            re.fullmatch(r"delivered no batch for (\d+) s \(hung; limit \d+ s\)", why)[1]
        )
        assert waited >= 2
    # every batch the learner used counted once: batches of 16 frames, one row each
    assert _frames(run_dir) == [FRAMES_PER_BATCH * k for k in range(1, batches + 1)]
    assert ckpt.load(run_dir / "checkpoints" / "last.pt")["counters"]["frames"] == total


@pytest.mark.slow  # an APPO run with worker processes, then its resume
def test_past_the_restart_limit_the_run_stops_with_one_line_and_a_checkpoint(
    tmp_path, capsys, monkeypatch
):
    run_dir = tmp_path / "run"
    argv = [*ARGS, "--sync-collect", "true", "--max-actor-restarts", "1", "--run-dir",
            str(run_dir), "--checkpoint-every", "100000"]  # fmt: skip
    kill = signal.SIGKILL
    code, lines, (first, second) = _run(
        capsys, monkeypatch, [*argv, "--total-frames", "160"], {3: kill, 5: kill}
    )
    assert code == 3, lines
    warnings = [line for line in lines if line.startswith("warning:")]
    errors = [line for line in lines if line.startswith("error:")]
    assert len(warnings) == 1 and WARNING.fullmatch(warnings[0])[1] == str(first), lines
    assert len(errors) == 1 and errors[0] == lines[-1], lines
    last = run_dir / "checkpoints" / "last.pt"
    # batches 1-4 were learned from; the second loss came while the learner waited for 5
    assert errors[0] == (
        f"error: collector worker 1 (pid {second}) was killed by SIGKILL, and the 1 restart(s) "
        "--max-actor-restarts allows were used; training stopped: checkpoint "
        f"{str(last)!r} at the last complete batch (64 frames); see why the workers were "
        f"lost and continue with --resume last --run-dir {run_dir}"
    )
    assert ckpt.load(last)["counters"]["frames"] == 4 * FRAMES_PER_BATCH
    assert _frames(run_dir) == [FRAMES_PER_BATCH * k for k in range(1, 5)]
    code, lines, _ = _run(capsys, monkeypatch, [*argv, "--total-frames", "96", "--resume",
                                                "last"], {})  # fmt: skip
    assert code == 0, lines
    assert ckpt.load(last)["counters"]["frames"] == 96
