"""One run, one directory: a new run never writes over another run, a live run holds a lock,
results come before optional extras, and a quiet run still says what it did."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rlkit.algorithms import load
from rlkit.training import engine

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--num-envs", "4", "--rollout-steps", "16", "--minibatch-size", "32", "--epochs", "2"]
QUIET = ["--progress", "false", "--eval-episodes", "2"]


@pytest.fixture(scope="module")
def ppo():
    return load("ppo")


def _snapshot(run_dir: Path) -> dict[str, bytes]:
    """Every file of a run directory and its bytes."""
    return {
        str(p.relative_to(run_dir)): p.read_bytes()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


@pytest.fixture
def old_run(ppo, tmp_path):
    run_dir = tmp_path / "old"
    ppo.main(
        [*TINY, *QUIET, "--total-frames", "128", "--eval-every", "64", "--run-dir", str(run_dir)]
    )
    return run_dir


def test_config_round_trip_starts_a_new_run_and_leaves_the_old_one_alone(
    ppo, old_run, tmp_path, monkeypatch
):
    before = _snapshot(old_run)
    stored = yaml.safe_load((old_run / "config.yaml").read_text())
    assert stored["run_dir"] == str(old_run)  # the file names its run; it must not be replayed
    monkeypatch.chdir(tmp_path)
    summary = ppo.main(["--config", str(old_run / "config.yaml"), "--seed", "7"])
    assert _snapshot(old_run) == before, "the old run's files changed"
    new_dir = Path(summary["run_dir"])
    assert new_dir.parent == Path("runs") and new_dir.name.startswith("ppo-CartPole-v1-s7-")
    assert summary["config"]["hidden"] == stored["hidden"]  # the settings did come from the file
    assert summary["frames"] == 128


def test_a_new_run_refuses_a_directory_that_holds_a_run(ppo, old_run):
    before = _snapshot(old_run)
    with pytest.raises(ValueError, match="already holds a run: continue it with --resume last"):
        ppo.main([*TINY, *QUIET, "--total-frames", "64", "--run-dir", str(old_run)])
    assert _snapshot(old_run) == before


def test_overwrite_moves_the_old_run_aside(ppo, old_run, capsys):
    before = _snapshot(old_run)
    ppo.main(
        [*TINY, *QUIET, "--total-frames", "64", "--seed", "3", "--run-dir", str(old_run)]
        + ["--overwrite"]
    )
    aside = [p for p in old_run.parent.iterdir() if p.name.startswith("old.old-")]
    assert len(aside) == 1 and _snapshot(aside[0]) == before
    evals = (old_run / "eval.csv").read_text().splitlines()
    assert [line.split(",")[0] for line in evals[1:]] == ["64"]  # nothing of the old run mixed in
    assert "moved the old run to" in capsys.readouterr().err


def test_default_names_are_unique_within_one_second(ppo, monkeypatch):
    from datetime import datetime

    class Frozen(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime(2026, 1, 1, 12, 0, 0)

    monkeypatch.setattr(engine, "datetime", Frozen)
    cfg = ppo.PPOConfig()
    names = {engine.resolve_run_dir(cfg, "ppo") for _ in range(50)}
    assert len(names) == 50
    assert all(n.name.startswith("ppo-CartPole-v1-s0-20260101-120000-") for n in names)


@pytest.mark.slow  # two recipe processes
def test_two_launches_in_the_same_second_get_two_directories(tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    args = [*TINY, *QUIET, "--total-frames", "64", "--eval-every", "0"]
    procs = [
        subprocess.Popen(
            [sys.executable, str(ROOT / "recipes" / "ppo.py"), *args, "--lr", lr],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for lr in ("0.001", "0.0003")
    ]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
    runs = sorted((tmp_path / "runs").iterdir())
    assert len(runs) == 2
    lrs = sorted(yaml.safe_load((r / "config.yaml").read_text())["lr"] for r in runs)
    assert lrs == [0.0003, 0.001]
    for r in runs:
        evals = (r / "eval.csv").read_text().splitlines()
        assert [line.split(",")[0] for line in evals[1:]] == ["64"]


def test_a_live_run_holds_its_directory(ppo, old_run):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from rlkit.training.runlog import "
            "RunDirLock; RunDirLock(Path(sys.argv[1])); print('held', flush=True); time.sleep(60)",
            str(old_run),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ValueError, match="in use by a live run \\(process \\d+ on "):
            ppo.main(
                [
                    *TINY,
                    *QUIET,
                    "--total-frames",
                    "192",
                    "--resume",
                    "last",
                    "--run-dir",
                    str(old_run),
                ]
            )
    finally:
        holder.kill()
        holder.wait()
    # a lock left by a killed process does not block: the kernel released it
    assert (old_run / ".lock").exists()
    summary = ppo.main(
        [*TINY, *QUIET, "--total-frames", "192", "--resume", "last", "--run-dir", str(old_run)]
    )
    assert summary["frames"] == 192


def test_a_stale_lock_file_does_not_block_a_resume(ppo, old_run):
    (old_run / ".lock").write_text("12345 on a-host-that-died\n")
    summary = ppo.main(
        [*QUIET, "--total-frames", "192", "--resume", "last", "--run-dir", str(old_run)]
    )
    assert summary["frames"] == 192
    from rlkit.training.runlog import RunDirLock

    assert RunDirLock.held(old_run / ".lock") is False  # released at the end of the run


def test_refusals_the_flags_decide_write_nothing(ppo, tmp_path):
    run_dir = tmp_path / "never"
    with pytest.raises(ValueError, match="--eval-env 'Acrobot-v1' does not match --env"):
        ppo.main([*TINY, *QUIET, "--eval-env", "Acrobot-v1", "--run-dir", str(run_dir)])
    assert not run_dir.exists()
    with pytest.raises(ValueError, match="unknown environment id"):
        ppo.main([*TINY, *QUIET, "--env", "NoSuchEnv-v0", "--run-dir", str(run_dir)])
    assert not run_dir.exists()
    with pytest.raises(ValueError, match="DQN needs a discrete action space"):
        load("dqn").main([*QUIET, "--env", "Pendulum-v1", "--run-dir", str(run_dir)])
    assert not run_dir.exists()


@pytest.mark.parametrize("kind", ["file", "under-a-file"])
def test_a_run_dir_that_cannot_be_a_directory_is_refused_before_anything(ppo, tmp_path, kind):
    path = tmp_path / "taken"
    path.write_text("not a directory\n")
    target = path if kind == "file" else path / "sub"
    with pytest.raises(ValueError, match="is a file, not a directory"):
        ppo.main([*TINY, *QUIET, "--run-dir", str(target)])
    assert path.read_text() == "not a directory\n"


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_a_read_only_run_dir_is_refused(ppo, tmp_path):
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o500)
    try:
        with pytest.raises(ValueError, match="is not writable"):
            ppo.main([*TINY, *QUIET, "--run-dir", str(parent / "run")])
    finally:
        parent.chmod(0o700)


@pytest.mark.slow  # a recipe process (tests/test_subprocess.py keeps one in the fast lane)
def test_quiet_run_prints_its_directory_evaluations_and_result(tmp_path):
    run_dir = tmp_path / "quiet"
    args = [*TINY, "--eval-episodes", "2", "--total-frames", "128", "--eval-every", "64"]
    proc = subprocess.run(
        [
            sys.executable,
            "recipes/ppo.py",
            *args,
            "--progress",
            "false",
            "--video",
            "--max-episode-steps",  # a short GIF: encoding a 500-step episode took 15 s
            "30",
            "--run-dir",
            str(run_dir),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert len(lines) == 4, lines  # no progress bar, no stray library output (SDL, warnings)
    assert (
        lines[0].startswith("ppo on CartPole-v1 (defaults): 128 frames")
        and str(run_dir) in lines[0]
    )
    assert lines[1].startswith("eval @ 64 frames: return ")
    assert lines[2].startswith("eval @ 128 frames: return ")
    assert lines[3].startswith("done: 128 frames in ") and str(run_dir) in lines[3]
    assert (run_dir / "eval.gif").is_file()


# --------------------------------------------------------------------------- every recipe

#: a time limit for runs that write videos (stored with the run, so a resume keeps it): the
#: GIF of a 200- or 500-step episode took 5-15 s to encode
SHORT_EPISODES = ["--max-episode-steps", "30"]

#: per recipe: small flags and the frames of one batch (or a few), so two of them are a run
RECIPES = {
    "ppo": (TINY, 64),
    "a2c": (["--num-envs", "2", "--rollout-steps", "8"], 16),
    "ppg": (["--num-envs", "2", "--rollout-steps", "16", "--minibatch-size", "16"], 32),
    "impala": ([], 256),
    "appo": ([], 256),
    "dqn": (["--learning-starts", "64"], 256),
    "sac": (["--learning-starts", "32"], 64),
    "daac": (["--num-envs", "2", "--rollout-steps", "16", "--minibatch-size", "16"], 32),
    "svpg": (["--eval-episodes", "4"], 160),
    "rnd": (["--num-envs", "2", "--rollout-steps", "16", "--minibatch-size", "16"], 32),
}


@pytest.mark.parametrize("algo", sorted(RECIPES))
def test_every_recipe_resumes_its_stored_run_and_writes_a_video(algo, tmp_path):
    """Each recipe: a run of two checkpoint periods "killed" after the first (its last.pt the
    first snapshot), resumed with ``--resume last --run-dir`` and ``--video`` only: the stored
    settings come back, the budget is reached, each evaluation is logged once, and the video
    and the results are written."""
    recipe = load(algo)
    flags, every = RECIPES[algo]
    run_dir = tmp_path / algo
    first = recipe.main(
        [*QUIET, *flags, "--seed", "3", "--total-frames", str(2 * every), *SHORT_EPISODES]
        + ["--eval-every", str(every), "--checkpoint-every", str(every), "--run-dir", str(run_dir)]
    )
    folder = run_dir / "checkpoints"
    snapshots = sorted(folder.glob("frames_*.pt"))
    shutil.copy(snapshots[0], folder / "last.pt")
    for later in snapshots[1:]:
        later.unlink()
    evals_before = _eval_frames(run_dir)
    resumed = recipe.main(["--resume", "last", "--run-dir", str(run_dir), "--video"])
    assert _same_settings(resumed["config"], first["config"])
    assert resumed["config"]["seed"] == 3 and resumed["config"]["total_frames"] == 2 * every
    assert resumed["frames"] == first["frames"]
    assert _eval_frames(run_dir) == evals_before  # each evaluation once, at the same frames
    for name in ("summary.json", "eval.csv", "curve.png", "eval.gif"):
        assert (run_dir / name).is_file(), name
    assert (run_dir / "eval.gif").read_bytes()[:6] in (b"GIF87a", b"GIF89a")


def _eval_frames(run_dir: Path) -> list[int]:
    rows = (run_dir / "eval.csv").read_text().splitlines()[1:]
    return [int(float(r.split(",")[0])) for r in rows]


def _same_settings(a: dict, b: dict) -> bool:
    launch = {"resume", "video", "progress", "run_dir", "config"}
    return {k: v for k, v in a.items() if k not in launch} == {
        k: v for k, v in b.items() if k not in launch
    }


def test_sac_continuous_video_and_eval_only_video(tmp_path):
    sac = load("sac")
    run_dir = tmp_path / "train"
    sac.main(
        [*QUIET, "--env", "Pendulum-v1", "--total-frames", "128", "--learning-starts", "64"]
        + ["--eval-every", "0", "--video", *SHORT_EPISODES, "--run-dir", str(run_dir)]
    )
    assert (run_dir / "eval.gif").is_file() and (run_dir / "summary.json").is_file()
    out = tmp_path / "eval"
    result = sac.main(
        [
            "--progress",
            "false",
            "--eval-only",
            "--init-from",
            str(run_dir / "checkpoints" / "last.pt"),
        ]
        + ["--eval-episodes", "2", "--video", "--run-dir", str(out)]
    )
    assert json.loads((out / "evaluation.json").read_text())["returns"] == result["returns"]
    assert (out / "eval.gif").is_file()


def test_a_failing_video_warns_and_keeps_the_results(ppo, tmp_path, monkeypatch, capsys):
    from rlkit.training import evaluation

    def broken(*args, **kwargs):
        raise RuntimeError("no renderer here\nsecond line")

    monkeypatch.setattr(evaluation, "record_gif", broken)
    run_dir = tmp_path / "run"
    summary = ppo.main(
        [*TINY, *QUIET, "--total-frames", "64", "--video", "--run-dir", str(run_dir)]
    )
    assert json.loads((run_dir / "summary.json").read_text())["frames"] == summary["frames"] == 64
    assert (run_dir / "curve.png").is_file()
    err = capsys.readouterr().err
    assert "warning: could not record eval.gif (RuntimeError: no renderer here)" in err
    assert "second line" not in err


def test_snapshot_best_keeps_the_checkpoint_of_the_best_evaluation(ppo, tmp_path):
    import csv

    from rlkit.training import checkpoint as ckpt

    run_dir = tmp_path / "run"
    ppo.main(
        [*TINY, *QUIET, "--total-frames", "512", "--eval-every", "64", "--snapshot-best"]
        + ["--run-dir", str(run_dir)]
    )
    rows = list(csv.DictReader((run_dir / "eval.csv").open()))
    returns = [float(r["return_mean"]) for r in rows]
    first_best = int(rows[returns.index(max(returns))]["frames"])  # ties: the earliest
    best = ckpt.load(run_dir / "checkpoints" / "best.pt")
    assert best["counters"]["frames"] == first_best
    assert best["counters"]["best_eval_return"] == max(returns)


def test_video_every_and_log_scalars_false(ppo, tmp_path):
    run_dir = tmp_path / "run"
    ppo.main(
        [*TINY, *QUIET, "--total-frames", "256", "--eval-every", "64", "--video-every", "128"]
        + ["--log-scalars", "false", *SHORT_EPISODES, "--run-dir", str(run_dir)]
    )
    videos = sorted(p.name for p in (run_dir / "videos").iterdir())
    assert videos == ["eval_000000000128.gif", "eval_000000000256.gif"]
    assert not (run_dir / "metrics.csv").exists()
    assert (run_dir / "eval.csv").is_file() and (run_dir / "curve.png").is_file()


def test_lightnings_tensor_core_notice_is_dropped_inside_quiet_only(caplog):
    """On a GPU with Tensor Cores Lightning logs a suggestion to lower float32 matmul
    precision; rlkit keeps full precision, so a recipe hides the notice (and only it)."""
    import logging

    from rlkit import _quiet

    log = logging.getLogger("lightning.fabric.utilities.rank_zero")
    log.removeFilter(_quiet._DROP)  # a recipe run earlier in this process installed it
    notice = "You are using a CUDA device ('H100') that has Tensor Cores. To properly utilize"
    with caplog.at_level(logging.INFO, logger=log.name):
        with _quiet.quiet():
            log.info(notice)
            log.info("another notice")
        log.info(notice)
    assert [r.getMessage() for r in caplog.records] == ["another notice", notice]


def test_torchs_no_cuda_notice_is_dropped_inside_quiet_only(caplog):
    """A first --compile on a machine without CUDA logs torch's "No CUDA runtime is found"
    (torch.utils.cpp_extension); a recipe hides it (and only it)."""
    import logging

    from rlkit import _quiet

    log = logging.getLogger("torch.utils.cpp_extension")
    log.removeFilter(_quiet._DROP)
    notice = "No CUDA runtime is found, using CUDA_HOME='/usr/local'"
    with caplog.at_level(logging.WARNING, logger=log.name):
        with _quiet.quiet():
            log.warning(notice)
            log.warning("another warning")
        log.warning(notice)
    assert [r.getMessage() for r in caplog.records] == ["another warning", notice]
