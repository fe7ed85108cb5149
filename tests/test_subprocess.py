"""Recipes as a user runs them: separate processes, DDP on CPU, SIGKILL and resume, CLI errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlkit.training import checkpoint as ckpt

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable


def _run(args, timeout: float = 600, **kw):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [PYTHON, *args], cwd=ROOT, capture_output=True, text=True, env=env, timeout=timeout, **kw
    )


def run_ddp(recipe: str, run_dir: Path, *flags: str, quiet: bool = False) -> dict:
    """Run ``recipes/<recipe>.py`` on two CPU ranks with DDP; check that it exited cleanly
    (``quiet``: without a warning), ran two ranks and ended with identical parameters on
    both; return its summary."""
    proc = _run(
        [f"recipes/{recipe}.py", "--accelerator", "cpu", "--devices", "2", "--strategy", "ddp"]
        + [*flags, "--run-dir", str(run_dir)]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    if quiet:
        assert "Warning" not in proc.stderr and "deprecated" not in proc.stderr, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2
    assert summary["rank_param_max_diff"] == 0.0
    return summary


@pytest.mark.slow
def test_sigkill_mid_training_then_resume_loses_and_repeats_no_frames(tmp_path):
    """SIGKILL after the 12k-frame checkpoint, then ``--resume last``: no frame is lost or
    logged twice, and the resumed run still solves CartPole (an evaluation >= 475 within the
    60k frames). This is also the suite's PPO-solves-CartPole learning test (it was
    tests/test_learning.py's, which trained the same bar without the kill)."""
    run_dir = tmp_path / "run"
    total = 60_000
    args = [
        "recipes/ppo.py",
        "--total-frames",
        str(total),
        "--checkpoint-every",
        "4096",
        "--eval-every",
        "0",
        "--progress",
        "false",
        "--run-dir",
        str(run_dir),
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [PYTHON, *args], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    last = run_dir / "checkpoints" / "last.pt"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if last.exists() and ckpt.load(last)["counters"]["frames"] >= 12_000:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = ckpt.load(last)["counters"]["frames"]
    assert 0 < killed_at < total, "the run was not killed mid-training"
    resumed = _run([*args, "--resume", "last", "--target-return", "475", "--eval-every", "10000"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = (run_dir / "metrics.csv").read_text().splitlines()
    frames = [int(r.split(",")[0]) for r in rows[1:]]
    assert frames == sorted(set(frames)), "frames logged twice after the resume"
    assert all(b - a == 256 for a, b in zip(frames, frames[1:])), "frames lost after the resume"
    assert frames[-1] == summary["frames"]
    evals = [int(r.split(",")[0]) for r in (run_dir / "eval.csv").read_text().splitlines()[1:]]
    assert evals == sorted(set(evals)), "an evaluation logged twice after the resume"
    assert summary["solved"], summary
    assert summary["eval_return_mean"] >= 475 and summary["frames"] <= total, summary


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--minibatch-size", "4096"], "larger than the batch"),
        (["--num-envs", "-1"], "--num-envs must be > 0"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_cli_bad_input_is_one_line_before_training(args, message, tmp_path):
    proc = _run(["recipes/ppo.py", *args, "--run-dir", str(tmp_path / "r"), "--progress", "false"])
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert message in lines[-1]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "r" / "metrics.csv").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--env", "CartPol-v1"], "did you mean 'CartPole-v1'"),
        (["--resume", "/nonexistent/last.pt"], "does not exist"),
        (["--resume", "{tmp}/last.pt"], "corrupt"),  # 64 zero bytes
    ],
)
def test_cli_bad_input_found_after_torch_is_one_line_before_training(args, message, tmp_path):
    """Refusals that come after the recipe has imported torch (the env id, the checkpoint to
    resume), through the recipe's own error handling in this process (a fresh process costs
    about 12 s of CPU for its imports here; the refusals above run in one)."""
    from rlkit import algorithms
    from tests.test_flags_property import run_cli

    (tmp_path / "last.pt").write_bytes(b"\x00" * 64)
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    code, stderr = run_cli(
        algorithms.load("ppo"), [*args, "--run-dir", str(tmp_path / "r"), "--progress", "false"]
    )
    assert code == 2, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], stderr
    assert not (tmp_path / "r" / "metrics.csv").exists()


def test_help_explains_flags():
    proc = _run(["recipes/ppo.py", "--help"])
    assert proc.returncode == 0
    for flag in (
        "--env",
        "--total-frames",
        "--seed",
        "--num-envs",
        "--target-return",
        "--run-dir",
        "--config",
        "--resume",
        "--accelerator",
        "--devices",
        "--strategy",
        "--num-nodes",
        "--clip-epsilon",
        "--gae-lambda",
        "--lr",
    ):
        assert flag in proc.stdout


@pytest.mark.slow
def test_import_prints_nothing():
    proc = _run(
        [
            "-W",
            "default",
            "-c",
            "import rlkit, rlkit.value, rlkit.modules, rlkit.envs, rlkit.objectives, "
            "rlkit.training, rlkit.data.collector",
        ]
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "" and proc.stderr == ""


def test_a_short_run_prints_no_warnings(tmp_path):
    proc = _run(
        [
            "recipes/ppo.py",
            "--total-frames",
            "512",
            "--eval-every",
            "256",
            "--eval-episodes",
            "2",
            "--run-dir",
            str(tmp_path),
        ]
    )
    assert proc.returncode == 0, proc.stderr
    assert "Warning" not in proc.stderr and "warn" not in proc.stderr.lower()
    assert "eval @" in proc.stderr  # progress and evaluation lines are there


@pytest.mark.slow
def test_ddp_spawn_strategy_runs_ranks_in_spawned_processes(tmp_path):
    run_dir = tmp_path / "spawn"
    proc = _run(
        [
            "recipes/appo.py",
            "--accelerator",
            "cpu",
            "--devices",
            "2",
            "--strategy",
            "ddp_spawn",
            "--total-frames",
            "4096",
            "--eval-every",
            "0",
            "--eval-episodes",
            "2",
            "--progress",
            "false",
            "--run-dir",
            str(run_dir),
        ]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["frames"] == 4096
    assert summary["rank_param_max_diff"] == 0.0


def _reward_stats(path: Path) -> dict:
    return ckpt.load(path)["modules"]["reward_norm"]


@pytest.mark.slow
@pytest.mark.ddp_jobs("ppo-rank-state", "ppo-rank-state-resume", "ppo-stale-rank", "ppo-mixed-pair")
def test_ddp_resume_gives_each_rank_its_own_per_rank_state(ddp_jobs):
    """Two PPO processes with DDP: they print no warning, count frames across ranks and end
    with identical parameters (observation statistics are all-gathered across ranks).
    Reward-scaling statistics are per rank (each rank's own envs): a DDP resume restores
    rank 1's from rank 1's file, not rank 0's; a stale rank file falls back with a warning.
    Every run is a shared launch (tests/ddp_shared.py: its flags and jobs)."""
    import torch

    first, resume = ddp_jobs["ppo-rank-state"], ddp_jobs["ppo-rank-state-resume"]
    summary = first.summary(quiet=True)
    # frames are counted across ranks: 2 ranks x 8 envs x 32 steps per batch, 4 batches
    assert summary["frames"] == 2048
    folder = first.dir / "checkpoints"
    zero, one = folder / "last.pt", folder / "rank1" / "last.pt"
    assert sorted(p.name for p in (folder / "rank1").iterdir()) == sorted(
        p.name for p in folder.iterdir() if p.is_file()
    )  # every checkpoint has its rank-1 copy
    s0, s1 = _reward_stats(zero), _reward_stats(one)
    assert s0.keys() == s1.keys()
    assert any(not torch.equal(s0[k], s1[k]) for k in s0), "ranks' reward statistics agree"
    p0, p1 = ckpt.load(zero), ckpt.load(one)
    assert p0["counters"]["frames"] == p1["counters"]["frames"] == 2048
    assert p0["counters"]["batches"] == p1["counters"]["batches"] == 4 and p1["world_size"] == 2
    assert all(torch.equal(p0["modules"]["actor"][k], v) for k, v in p1["modules"]["actor"].items())

    # resume with nothing left to train: the final checkpoint re-saves what each rank restored
    resume.summary()
    after = _reward_stats(resume.dir / "checkpoints" / "rank1" / "last.pt")
    assert all(torch.equal(after[k], s1[k]) for k in s1), "rank 1 did not restore its own"

    # a rank file from another frame count (a run killed between the ranks' writes): rank 1
    # falls back to rank 0's, with a warning (shared launch: resume_after_a_stale_rank_file)
    stale = ddp_jobs["ppo-stale-rank"]
    stale.summary()
    assert "rank 1" in stale.output and "does not match" in stale.output, stale.output[-3000:]
    fallback = _reward_stats(stale.dir / "checkpoints" / "rank1" / "last.pt")
    assert all(torch.equal(fallback[k], s0[k]) for k in s0)

    # a one-process resume from the 1024 snapshot rewrites last.pt at 2048 frames, next to
    # rank 1's last.pt of the two-rank run at the same frame count: a later two-rank resume
    # must not pair them (rank 1 would keep other parameters than rank 0); the one-process
    # resume and its check run in rank 0 (resume_after_a_one_process_resume)
    mixed = ddp_jobs["ppo-mixed-pair"]
    mixed.summary()
    assert "rank 1" in mixed.output and "does not match" in mixed.output, mixed.output[-3000:]
    assert "one-process resume: last.pt and rank1/last.pt both at 2048 frames" in mixed.output


def _on_rank_0_first(argv: list[str], prepare) -> None:
    """A shared launch's job (tests/ddp_shared.py), on both ranks: rank 0 runs
    ``prepare(run_dir)`` while rank 1 waits for it, then both resume the PPO run (``argv``:
    the two-rank flags, ``--resume last``, ``--run-dir``)."""
    from rlkit.algorithms import recipe

    run_dir = Path(argv[argv.index("--run-dir") + 1])
    ready = run_dir.with_name(f"{run_dir.name}.{prepare.__name__}.ready")
    if os.environ.get("LOCAL_RANK", "0") == "0":
        prepare(run_dir)
        ready.touch()
    else:
        deadline = time.monotonic() + 300
        while not ready.exists():
            assert time.monotonic() < deadline, f"rank 0 did not prepare {run_dir}"
            time.sleep(0.1)
    recipe("ppo", argv)


def resume_after_a_stale_rank_file(argv: list[str]) -> None:
    """The two-rank run of ``ppo-rank-state`` (after its resume) copied, with rank 1's
    last.pt replaced by its 1024-frame snapshot, then resumed on two ranks."""
    import shutil

    def stale_rank_file(run_dir: Path) -> None:
        shutil.copytree(run_dir.parent / "ppo-rank-state", run_dir)
        folder = run_dir / "checkpoints" / "rank1"
        (folder / "last.pt").write_bytes((folder / "frames_000000001024.pt").read_bytes())

    _on_rank_0_first(argv, stale_rank_file)


def resume_after_a_one_process_resume(argv: list[str]) -> None:
    """Rank 0 resumes that run in one process (its own) from the 1024-frame snapshot, which
    rewrites last.pt at 2048 frames; then both ranks resume it."""
    from rlkit.algorithms import recipe
    from tests.ddp_shared import BY_NAME

    def one_process_resume(run_dir: Path) -> None:
        folder = run_dir / "checkpoints"
        launch = ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
        saved = {k: os.environ.pop(k) for k in launch if k in os.environ}
        try:
            recipe("ppo", [*BY_NAME["ppo-rank-state"].argv, "--run-dir", str(run_dir),
                           "--resume", str(folder / "frames_000000001024.pt")])  # fmt: skip
        except SystemExit as exit_:
            assert exit_.code in (0, None), exit_.code
        finally:
            os.environ.update(saved)
        frames = [ckpt.load(f)["counters"]["frames"] for f in
                  (folder / "last.pt", folder / "rank1" / "last.pt")]  # fmt: skip
        assert frames == [2048, 2048], frames
        print("one-process resume: last.pt and rank1/last.pt both at 2048 frames", flush=True)

    _on_rank_0_first(argv, one_process_resume)


def _tensors(tree, prefix=""):
    """Every tensor of a nested checkpoint entry, by path."""
    import torch

    if isinstance(tree, torch.Tensor):
        return {prefix: tree}
    out = {}
    if isinstance(tree, dict):
        for k, v in tree.items():
            out |= _tensors(v, f"{prefix}/{k}")
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            out |= _tensors(v, f"{prefix}/{i}")
    return out


@pytest.mark.slow
@pytest.mark.ddp_jobs("dqn-buffers", "dqn-buffers-resume")
def test_ddp_resume_gives_each_rank_its_own_replay_buffer(ddp_jobs):
    """DQN on two ranks (a fractional update-to-data ratio): both ranks train, the same
    gradient steps, and end with identical parameters. --save-buffer: each rank's buffer
    holds its own envs' transitions, and a resume restores each rank's own (rank 1 does not
    get rank 0's). Both runs are shared launches (tests/ddp_shared.py: their flags)."""
    import csv

    import torch

    first, resume = ddp_jobs["dqn-buffers"], ddp_jobs["dqn-buffers-resume"]
    summary = first.summary()
    assert summary["frames"] == 512
    rows = list(csv.DictReader((first.dir / "metrics.csv").open()))
    assert float(rows[-1]["gradient_steps"]) > 0  # both ranks trained (same step count)
    zero = first.dir / "checkpoints" / "last.pt"
    one = first.dir / "checkpoints" / "rank1" / "last.pt"
    b0 = _tensors(ckpt.load(zero)["learner"]["buffer"])
    b1 = _tensors(ckpt.load(one)["learner"]["buffer"])
    assert b0.keys() == b1.keys() and b0
    assert any(not torch.equal(b0[k], b1[k]) for k in b0), "the ranks' buffers agree"
    resume.summary()  # nothing left: re-saves what it restored
    after0 = _tensors(ckpt.load(resume.dir / "checkpoints" / "last.pt")["learner"]["buffer"])
    one = resume.dir / "checkpoints" / "rank1" / "last.pt"
    after1 = _tensors(ckpt.load(one)["learner"]["buffer"])
    assert all(torch.equal(after1[k], b1[k]) for k in b1), "rank 1 did not restore its own"
    assert all(torch.equal(after0[k], b0[k]) for k in b0)


@pytest.mark.slow
def test_ddp_run_killed_at_a_random_point_resumes_without_losing_or_repeating_frames(tmp_path):
    """Two ranks with per-rank state (reward scaling), SIGKILL to the whole process group at a
    random moment after the first checkpoint, then ``--resume last`` with only the launch
    flags: the budget is reached, every frame count is logged once, each rank restores its
    own file (no fallback warning), and the ranks end with identical parameters."""
    import random

    run_dir = tmp_path / "ddp"
    ddp = ["--accelerator", "cpu", "--devices", "2", "--strategy", "ddp"]
    flags = ["--normalize-reward", "true", "--eval-every", "4096", "--eval-episodes", "2"]
    flags += ["--total-frames", "20480", "--checkpoint-every", "2048", "--progress", "false"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [PYTHON, "recipes/ppo.py", *ddp, *flags, "--run-dir", str(run_dir)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # rank 0 and the rank it launched share the group
    )
    last = run_dir / "checkpoints" / "last.pt"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not last.exists():
        time.sleep(0.1)
    time.sleep(random.Random().uniform(0.0, 3.0))  # a random moment after the first save
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = ckpt.load(last)["counters"]["frames"]
    assert 0 < killed_at < 20480, killed_at
    resumed = _run(["recipes/ppo.py", *ddp, "--resume", "last", "--run-dir", str(run_dir)])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "does not match" not in resumed.stderr  # each rank had its own file of that save
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["frames"] == 20480 and summary["rank_param_max_diff"] == 0.0
    assert summary["config"]["normalize_reward"] is True  # the stored run's settings
    rows = (run_dir / "metrics.csv").read_text().splitlines()
    frames = [int(r.split(",")[0]) for r in rows[1:]]
    assert frames == list(range(512, 20480 + 1, 512)), "a batch lost or logged twice"
    evals = [int(r.split(",")[0]) for r in (run_dir / "eval.csv").read_text().splitlines()[1:]]
    assert evals == [4096, 8192, 12288, 16384, 20480]


@pytest.mark.slow
@pytest.mark.ddp_jobs("resume-missing", "resume-corrupt")
def test_ddp_resume_from_a_bad_checkpoint_fails_on_every_rank_without_hanging(ddp_jobs):
    """Shared launches (tests/ddp_shared.py): ``--resume`` a missing file, then a file of 16
    bytes that is no checkpoint, on two ranks. Both ranks end with exit status 2 and name the
    file; a rank left waiting in a collective would stop the launch (300 s without a run
    ending)."""
    for name, file in (("resume-missing", "missing.pt"), ("resume-corrupt", "bad.pt")):
        run = ddp_jobs[name]
        run.check()  # exit status 2 on both ranks
        assert str(run.root / file) in run.output
