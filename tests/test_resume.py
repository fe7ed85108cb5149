"""Resume continues the run it resumes, and every bad input is one line (exit 2)."""

from __future__ import annotations

import errno
import shutil
import sys

import pytest
import yaml

from rlkit.algorithms import load
from rlkit.training import checkpoint as ckpt
from rlkit.training import cli

TINY = ["--num-envs", "4", "--rollout-steps", "16", "--minibatch-size", "32", "--epochs", "2"]
QUIET = ["--progress", "false", "--eval-episodes", "2"]


@pytest.fixture(scope="module")
def ppo():
    return load("ppo")


def _frames(path) -> list[int]:
    lines = path.read_text().splitlines()
    return [int(float(line.split(",")[0])) for line in lines[1:]]


@pytest.fixture
def killed_run(ppo, tmp_path):
    """A run of 256 frames "killed" after its checkpoint at 128 frames: its last.pt is the
    128-frame snapshot and its logs hold rows beyond it, as a SIGKILL leaves them."""
    run_dir = tmp_path / "run"
    flags = [*TINY, *QUIET, "--hidden", "32", "--normalize-obs", "true", "--lr", "0.001"]
    flags += ["--total-frames", "256", "--eval-every", "128", "--checkpoint-every", "128"]
    ppo.main([*flags, "--run-dir", str(run_dir)])
    folder = run_dir / "checkpoints"
    shutil.copy(folder / "frames_000000000128.pt", folder / "last.pt")
    (folder / "frames_000000000256.pt").unlink()
    (run_dir / "summary.json").unlink()
    return run_dir


def test_resume_last_continues_the_stored_run_not_the_recipe_defaults(ppo, killed_run):
    # the README's command, with none of the run's flags typed again
    summary = ppo.main(["--resume", "last", "--run-dir", str(killed_run), "--progress", "false"])
    cfg = summary["config"]
    assert summary["frames"] == 256  # the run's budget, not the recipe's 100,000
    assert (cfg["total_frames"], cfg["eval_every"], cfg["hidden"]) == (256, 128, [32])
    assert (cfg["lr"], cfg["normalize_obs"], cfg["eval_episodes"]) == (0.001, True, 2)
    assert _frames(killed_run / "eval.csv") == [128, 256]  # each frame count once
    metrics = _frames(killed_run / "metrics.csv")
    assert metrics == sorted(set(metrics)) and metrics[-1] == 256
    assert all(b - a == 64 for a, b in zip(metrics, metrics[1:])), "a batch lost or repeated"
    stored = yaml.safe_load((killed_run / "config.yaml").read_text())
    assert stored["hidden"] == [32] and stored["total_frames"] == 256


def test_flags_safe_to_change_mid_run_win_on_resume(ppo, killed_run):
    summary = ppo.main(
        ["--resume", "last", "--run-dir", str(killed_run), "--progress", "false"]
        + ["--total-frames", "384", "--eval-every", "64", "--checkpoint-every", "64"]
        + ["--hidden", "32", "--lr", "1e-3"]  # the run's own values: not a change
    )
    assert summary["frames"] == 384
    assert _frames(killed_run / "eval.csv") == [128, 192, 256, 320, 384]
    assert summary["config"]["hidden"] == [32]


def _cli(monkeypatch, capsys, algo: str, argv: list[str]) -> tuple[int, list[str]]:
    """Run a recipe as the command line does; its exit status and non-empty stderr lines."""
    monkeypatch.setattr(sys, "argv", [f"recipes/{algo}.py", *argv])
    capsys.readouterr()
    code = 0
    try:
        cli(load(algo).main)
    except SystemExit as stop:
        code = stop.code
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return code, [line for line in err.splitlines() if line.strip()]


def test_a_flag_that_would_change_the_algorithm_is_refused_on_resume(
    killed_run, monkeypatch, capsys
):
    before = (killed_run / "eval.csv").read_text()
    code, lines = _cli(
        monkeypatch,
        capsys,
        "ppo",
        ["--resume", "last", "--run-dir", str(killed_run), "--lr", "0.5"],
    )
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("error: --lr 0.5 would change the resumed run")
    assert "which has 0.001" in lines[0] and "--init-from" in lines[0]
    assert (killed_run / "eval.csv").read_text() == before
    # a --config file typed at resume is checked the same way
    other = killed_run.parent / "other.yaml"
    other.write_text("gamma: 0.5\n")
    code, lines = _cli(
        monkeypatch,
        capsys,
        "ppo",
        ["--resume", "last", "--run-dir", str(killed_run), "--config", str(other)],
    )
    assert code == 2 and lines[0].startswith("error: --gamma 0.5 would change the resumed run")


@pytest.mark.parametrize("algo", ["ppo", "appo", "sac", "dqn"])
def test_invalid_yaml_is_one_line_naming_file_and_line(algo, tmp_path, monkeypatch, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("lr: 0.001\ngamma: [0.99\nseed: 3\n")
    code, lines = _cli(monkeypatch, capsys, algo, ["--config", str(bad)])
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: --config '{bad}' is not valid YAML (line 3, column")


def test_a_run_dir_that_is_a_file_is_one_line(tmp_path, monkeypatch, capsys):
    path = tmp_path / "file"
    path.write_text("x")
    for algo in ("ppo", "dqn", "impala"):
        code, lines = _cli(monkeypatch, capsys, algo, [*QUIET, "--run-dir", str(path)])
        assert code == 2 and len(lines) == 1, lines
        assert "is a file, not a directory" in lines[0]


def test_a_checkpoint_of_another_algorithm_or_env_is_one_line(tmp_path, monkeypatch, capsys):
    a2c = tmp_path / "a2c"
    load("a2c").main([*QUIET, "--total-frames", "80", "--run-dir", str(a2c)])
    last = str(a2c / "checkpoints" / "last.pt")
    code, lines = _cli(monkeypatch, capsys, "ppo", [*QUIET, "--resume", last])
    assert code == 2 and len(lines) == 1, lines
    assert "written by algorithm 'a2c', but this recipe is 'ppo'" in lines[0]
    # a CartPole network warm-started into Acrobot (other observation and action sizes)
    code, lines = _cli(
        monkeypatch,
        capsys,
        "a2c",
        [*QUIET, "--env", "Acrobot-v1", "--init-from", last, "--run-dir", str(tmp_path / "x")],
    )
    assert code == 2 and len(lines) == 1, lines
    assert "does not fit module" in lines[0] and "shape mismatch" in lines[0]
    assert not (tmp_path / "x").exists()


def test_a_disk_that_fills_during_a_checkpoint_keeps_the_previous_one(
    tmp_path, monkeypatch, capsys
):
    import os

    real_fsync, calls = os.fsync, {"n": 0}

    def fsync(fd):
        calls["n"] += 1
        if calls["n"] > 2:  # the first save (last.pt and its snapshot) fits, the next does not
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(ckpt.os, "fsync", fsync)
    run_dir = tmp_path / "run"
    flags = [*TINY, *QUIET, "--total-frames", "256", "--eval-every", "0"]
    code, lines = _cli(
        monkeypatch, capsys, "ppo", [*flags, "--checkpoint-every", "64", "--run-dir", str(run_dir)]
    )
    assert code == 2, lines
    errors = [line for line in lines if line.startswith("error:")]
    assert errors == [lines[-1]], lines
    assert "No space left on device" in lines[-1] and "--resume last" in lines[-1]
    monkeypatch.setattr(ckpt.os, "fsync", real_fsync)
    kept = ckpt.load(run_dir / "checkpoints" / "last.pt")
    assert kept["counters"]["frames"] == 64
    assert not [p for p in (run_dir / "checkpoints").iterdir() if p.suffix == ".tmp"]
    # and the run goes on from it
    summary = load("ppo").main(
        ["--resume", "last", "--run-dir", str(run_dir), "--progress", "false"]
    )
    assert summary["frames"] == 256


def test_a_multi_line_error_is_printed_as_one_line_with_the_matter_first():
    from rlkit.training.cli import _one_line

    message = "the batch holds obs, reward\nPPOLoss declares 'advantage' ...: run GAE first"
    assert _one_line(message) == (
        "PPOLoss declares 'advantage' ...: run GAE first (the batch holds obs, reward)"
    )
    assert _one_line("one line only") == "one line only"


def test_checkpoints_keep_their_structure_and_state_dict_metadata_through_to_cpu(tmp_path):
    """``atomic_save`` writes tensors from the CPU (a GPU run's file loads anywhere) and keeps
    everything else: dict order, a state_dict's version metadata, lists, tuples, numbers."""
    import collections

    import torch

    from rlkit.training.checkpoint import atomic_save, to_cpu

    net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.LayerNorm(3))
    state = net.state_dict()
    Pair = collections.namedtuple("Pair", "a b")
    payload = {"modules": {"net": state}, "rows": [torch.ones(2), 3], "pair": (1, "x")}
    assert to_cpu(Pair(torch.zeros(1), 2)).b == 2
    out = to_cpu(payload)
    assert isinstance(out["modules"]["net"], collections.OrderedDict)
    assert out["modules"]["net"]._metadata == state._metadata
    assert list(out["modules"]["net"]) == list(state)
    assert out["rows"][1] == 3 and out["pair"] == (1, "x")
    assert out["rows"][0].data_ptr() == payload["rows"][0].data_ptr()  # on the CPU: no copy
    path = atomic_save(payload, tmp_path / "c.pt")
    back = torch.load(path, weights_only=True)
    fresh = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.LayerNorm(3))
    fresh.load_state_dict(back["modules"]["net"])
    for a, b in zip(fresh.state_dict().values(), state.values(), strict=True):
        assert torch.equal(a, b)


def test_a_setting_newer_than_the_checkpoint_resumes_at_its_default(
    killed_run, monkeypatch, capsys
):
    """A checkpoint written before a setting existed trained with that setting's default:
    a resume keeps it (whatever a preset now says) and refuses a typed change of it."""
    from rlkit.training import checkpoint as ckpt

    last = killed_run / "checkpoints" / "last.pt"
    payload = ckpt.load(last)
    for name in ("bootstrap_truncated", "init"):  # as a checkpoint from before both flags
        del payload["config"][name]
    ckpt.atomic_save(payload, last)
    code, lines = _cli(
        monkeypatch,
        capsys,
        "ppo",
        ["--resume", "last", "--run-dir", str(killed_run), "--bootstrap-truncated", "false"],
    )
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("error: --bootstrap-truncated False would change the resumed run")
    assert "which has True" in lines[0]
    # without the flag it resumes, with the defaults of the settings it did not name
    summary = load("ppo").main(["--resume", "last", "--run-dir", str(killed_run), *QUIET])
    assert summary["frames"] == 256
    assert summary["config"]["bootstrap_truncated"] is True
    assert summary["config"]["init"] == "orthogonal"
