"""Unit tests of the training layer's small parts: config, checkpoints, schedules, logs."""

from __future__ import annotations

import csv
import os
import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from rlkit.configs.base import TrainConfig
from rlkit.configs.onpolicy import OnPolicyConfig
from rlkit.data.minibatch import minibatch_indices
from rlkit.training import checkpoint as ckpt
from rlkit.training import parse_config, schedules
from rlkit.training.runlog import CsvLog


@dataclass(frozen=True)
class _Cfg(OnPolicyConfig):
    extra: float = field(default=1.5, metadata={"help": "an extra flag"})


# ------------------------------------------------------------------------------ config
def test_flags_override_defaults_and_types_are_parsed():
    cfg = parse_config(_Cfg, ["--lr", "0.01", "--hidden", "32", "16", "--normalize-obs", "true"])
    assert cfg.lr == 0.01 and isinstance(cfg.lr, float)
    assert cfg.hidden == (32, 16)
    assert cfg.normalize_obs is True
    assert cfg.extra == 1.5
    assert parse_config(_Cfg, ["--target-return", "none"]).target_return is None


def test_bare_bool_flag_means_true():
    assert parse_config(_Cfg, ["--video"]).video is True
    assert parse_config(_Cfg, ["--video", "false"]).video is False


def test_yaml_then_flags_then_presets_precedence(tmp_path):
    file = tmp_path / "c.yaml"
    file.write_text("lr: 0.002\nepochs: 3\nhidden: [8, 8]\n")
    presets = {"CartPole-v1": {"lr": 0.5, "epochs": 7, "minibatch_size": 64}}
    cfg = parse_config(_Cfg, ["--config", str(file), "--epochs", "5"], presets=presets)
    assert cfg.lr == 0.002  # YAML beats the preset
    assert cfg.epochs == 5  # the flag beats YAML
    assert cfg.minibatch_size == 64  # the preset beats the default
    assert cfg.hidden == (8, 8)


def test_preset_applies_only_to_its_env():
    presets = {"Pendulum-v1": {"lr": 0.5}}
    assert parse_config(_Cfg, [], presets=presets).lr == _Cfg.lr
    assert parse_config(_Cfg, ["--env", "Pendulum-v1"], presets=presets).lr == 0.5


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--minibatch-size", "100000"], "larger than the batch"),
        (["--num-envs", "0"], "--num-envs must be > 0"),
        (["--total-frames", "-5"], "--total-frames must be > 0"),
        (["--gamma", "1.5"], "--gamma must be in"),
        (["--strategy", "fsdp"], "not supported"),
        (["--devices", "two"], "devices must be"),
        (["--lr", "abc"], "expected float"),
        (["--no-such-flag", "1"], "unrecognized arguments"),
        (["--hidden", "0"], "--hidden needs positive"),
    ],
)
def test_bad_flags_exit_with_a_one_line_message(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_config(_Cfg, argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err


def test_bad_yaml_key_is_named(tmp_path, capsys):
    file = tmp_path / "c.yaml"
    file.write_text("lrr: 0.1\n")
    with pytest.raises(SystemExit):
        parse_config(_Cfg, ["--config", str(file)])
    assert "unknown keys ['lrr']" in capsys.readouterr().err


def test_missing_yaml_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit):
        parse_config(_Cfg, ["--config", str(tmp_path / "nope.yaml")])
    assert "no such file" in capsys.readouterr().err


def test_help_lists_every_field(capsys):
    with pytest.raises(SystemExit):
        parse_config(_Cfg, ["--help"])
    out = capsys.readouterr().out
    for name in ("--env", "--total-frames", "--resume", "--strategy", "--extra", "--lr"):
        assert name in out
    assert "an extra flag" in out


def test_base_config_is_valid_by_default():
    assert TrainConfig().env == "CartPole-v1"


# ------------------------------------------------------------------------------ checkpoints
def test_atomic_save_never_leaves_a_partial_file(tmp_path, monkeypatch):
    path = tmp_path / "ck" / "last.pt"
    ckpt.atomic_save({"format": ckpt.FORMAT, "v": torch.ones(3)}, path)

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError):
        ckpt.atomic_save({"format": ckpt.FORMAT, "v": torch.zeros(3)}, path)
    monkeypatch.undo()
    assert torch.equal(ckpt.safe_load(path)["v"], torch.ones(3))  # old file intact
    assert [p.name for p in path.parent.iterdir()] == ["last.pt"]  # no temp file left


def test_load_rejects_missing_corrupt_and_foreign_files(tmp_path):
    with pytest.raises(ckpt.CheckpointError, match="does not exist"):
        ckpt.load(tmp_path / "nope.pt")
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"\x00garbage" * 10)
    with pytest.raises(ckpt.CheckpointError, match="corrupt"):
        ckpt.load(bad)
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.ones(2)}, foreign)
    with pytest.raises(ckpt.CheckpointError, match="not an rlkit checkpoint"):
        ckpt.load(foreign)


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_load_never_executes_code(tmp_path):
    evil = tmp_path / "evil.pt"
    torch.save({"format": ckpt.FORMAT, "x": _Evil()}, evil)
    with pytest.raises(ckpt.CheckpointError, match="corrupt or not a safe"):
        ckpt.load(evil)


def test_truncated_checkpoint_is_reported(tmp_path):
    path = tmp_path / "t.pt"
    ckpt.atomic_save({"format": ckpt.FORMAT, "w": torch.randn(1000)}, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ckpt.CheckpointError, match="corrupt"):
        ckpt.load(path)


def test_algo_and_shape_mismatch_messages(tmp_path):
    with pytest.raises(ckpt.CheckpointError, match="written by algorithm 'dqn'"):
        ckpt.check_compatible({"algo": "dqn"}, algo="ppo", path="x.pt")
    small, big = nn.Linear(4, 2), nn.Linear(8, 2)
    with pytest.raises(ckpt.CheckpointError, match=r"shape mismatch.*weight"):
        ckpt.load_module_state(big, small.state_dict(), name="actor", path="x.pt")


def test_rng_state_round_trip_through_a_safe_checkpoint(tmp_path):
    torch.manual_seed(1)
    np.random.seed(2)
    random.seed(3)
    path = tmp_path / "rng.pt"
    ckpt.atomic_save({"format": ckpt.FORMAT, "rng": ckpt.rng_state()}, path)
    expected = (torch.rand(3), np.random.rand(3), random.random())
    ckpt.set_rng_state(ckpt.safe_load(path)["rng"])
    assert torch.equal(torch.rand(3), expected[0])
    assert np.array_equal(np.random.rand(3), expected[1])
    assert random.random() == expected[2]


def test_all_finite_detects_nan():
    m = nn.Linear(2, 2)
    assert ckpt.all_finite({"m": m})
    with torch.no_grad():
        m.weight[0, 0] = float("nan")
    assert not ckpt.all_finite({"m": m})


# ------------------------------------------------------------------------------ schedules
def test_linear_schedule_endpoints_and_midpoint():
    assert schedules.linear(1.0, 0.0, 0.0) == 1.0
    assert schedules.linear(1.0, 0.0, 0.25) == 0.75
    assert schedules.linear(1.0, 0.0, 2.0) == 0.0


def test_kl_adaptive_rule_against_hand_trace():
    s = schedules.KLAdaptiveLR(lr=1e-3, target=0.01)
    assert s.update(0.03) == pytest.approx(1e-3 / 1.5)  # kl > 2 * target: decrease
    assert s.update(0.01) == pytest.approx(1e-3 / 1.5)  # in band: unchanged
    assert s.update(0.001) == pytest.approx(1e-3)  # kl < target / 2: increase
    s2 = schedules.KLAdaptiveLR(lr=1e-3, target=0.01)
    s2.load_state_dict(s.state_dict())
    assert s2.lr == s.lr
    with pytest.raises(ValueError, match="kl-target"):
        schedules.KLAdaptiveLR(lr=1e-3, target=0.0)


# ------------------------------------------------------------------------------ minibatches
def test_minibatches_partition_the_batch():
    idx = minibatch_indices(10, 4, generator=torch.Generator().manual_seed(0))
    assert [len(i) for i in idx] == [4, 4, 2]
    assert sorted(torch.cat(idx).tolist()) == list(range(10))
    with pytest.raises(ValueError, match="larger than the batch"):
        minibatch_indices(10, 11)


# ------------------------------------------------------------------------------ logs
def test_csv_log_grows_header_and_truncates_on_resume(tmp_path):
    path = tmp_path / "m.csv"
    log = CsvLog(path)
    log.write({"frames": 10, "a": 1.0})
    log.write({"frames": 20, "a": 2.0, "b": 5.0})
    log.write({"frames": 30, "a": 3.0})
    with path.open() as f:
        rows = list(csv.DictReader(f))
    assert [r["frames"] for r in rows] == ["10", "20", "30"]
    assert rows[0]["b"] == "" and rows[1]["b"] == "5.0"
    resumed = CsvLog(path, resume_frames=20)
    resumed.write({"frames": 25, "a": 9.0})
    assert [r["frames"] for r in resumed.read()] == ["10", "20", "25"]


def test_plot_curve_writes_png(tmp_path):
    from rlkit.training.runlog import plot_curve

    CsvLog(tmp_path / "eval.csv").write(
        {"frames": 1, "train_seconds": 0.1, "return_mean": 1.0, "return_std": 0.5}
    )
    out = plot_curve(Path(tmp_path), title="t")
    assert out is not None and out.read_bytes()[:4] == b"\x89PNG"


def test_a_subclass_that_only_changes_a_default_keeps_the_base_flag_help_and_choices(capsys):
    import dataclasses

    from rlkit.configs.base import build_parser
    from rlkit.configs.onpolicy import OnPolicyConfig

    @dataclasses.dataclass(frozen=True)
    class Child(OnPolicyConfig):
        epochs: int = 3
        lr_schedule: str = "linear"

    parser = build_parser(Child)
    actions = {a.dest: a for a in parser._actions}
    assert actions["epochs"].help == "passes over each batch (default: 3)"
    assert actions["lr_schedule"].choices == ("constant", "linear", "cosine", "exponential", "kl")
    with pytest.raises(SystemExit):
        parser.parse_args(["--lr-schedule", "step"])
    assert "invalid choice" in capsys.readouterr().err


# ------------------------------------------------------------------------------ evaluation
class _Recorder(nn.Module):
    """Calls ``policy`` and keeps every action it chose."""

    def __init__(self, policy: nn.Module) -> None:
        super().__init__()
        self.policy, self.actions = policy, []

    def forward(self, td):
        td = self.policy(td)
        self.actions.append(td.get("action").clone())
        return td


def _fixed_policy(probs: list[float]):
    """CartPole actor from ``make_actor`` whose logits are ``log(probs)`` at every state."""
    from rlkit.envs import make_env
    from rlkit.modules import make_actor

    env = make_env("CartPole-v1", num_envs=1, seed=0)
    actor = make_actor(env.observation_spec, env.action_spec, hidden=(8,))
    last = [m for m in actor.modules() if isinstance(m, nn.Linear)][-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.copy_(torch.tensor(probs).log())
    env.close()
    return actor


def test_evaluation_plays_the_mode_or_samples_the_policy():
    from rlkit.training.evaluation import Evaluator

    actor = _fixed_policy([0.3, 0.7])
    deterministic = _Recorder(actor)
    Evaluator("CartPole-v1", episodes=8)(deterministic)
    taken = torch.cat([a.flatten() for a in deterministic.actions])
    assert taken.eq(1).all()  # argmax of (0.3, 0.7) at every step

    sampled = _Recorder(actor)
    Evaluator("CartPole-v1", episodes=8, deterministic=False)(sampled)
    taken = torch.cat([a.flatten() for a in sampled.actions]).double()
    # action 1 with probability 0.7: the frequency over n draws is within 4 binomial stds
    # (steps of episodes that already ended are counted too: they are draws all the same)
    n = taken.numel()
    assert n >= 100
    assert abs(taken.mean().item() - 0.7) < 4 * (0.7 * 0.3 / n) ** 0.5


def test_sampled_evaluation_is_seeded_and_leaves_the_training_random_stream_alone():
    from rlkit.training.evaluation import Evaluator

    actor = _fixed_policy([0.5, 0.5])
    evaluator = Evaluator("CartPole-v1", episodes=32, deterministic=False)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    first = evaluator.returns(actor)
    assert torch.equal(torch.get_rng_state(), before)
    torch.rand(5)  # whatever training draws in between, the next evaluation is the same
    assert torch.equal(evaluator.returns(actor), first)
    # a uniform random CartPole policy: ~22 steps per episode, far from the always-right
    # policy's ~9-10 (the deterministic mode of a uniform tie is the first action, argmax)
    always = Evaluator("CartPole-v1", episodes=32).returns(actor)
    assert first.mean() > always.mean() + 5


def test_video_plays_the_episode_as_the_evaluation_mode_says(tmp_path):
    import gymnasium as gym
    from PIL import Image

    from rlkit.training.evaluation import EVAL_SEED, record_gif

    actor = _fixed_policy([0.5, 0.5])  # a tie: the mode is the first action (argmax)
    env = gym.make("CartPole-v1")
    env.reset(seed=EVAL_SEED)
    always_left = 1
    while not any(env.step(0)[2:4]):
        always_left += 1
    env.close()

    before = torch.get_rng_state()
    mode = record_gif("CartPole-v1", actor, tmp_path / "mode.gif")
    sampled = [
        record_gif("CartPole-v1", actor, tmp_path / f"s{i}.gif", deterministic=False)
        for i in range(2)
    ]
    assert torch.equal(torch.get_rng_state(), before)  # training's random stream untouched

    def steps(path) -> int:  # the GIF merges identical frames and adds up their durations
        gif = Image.open(path)
        durations = []
        for i in range(gif.n_frames):
            gif.seek(i)
            durations.append(gif.info["duration"])
        return round(sum(durations) / min(durations))

    played = [steps(p) for p in (mode, *sampled)]
    assert played[0] == always_left  # one frame per step of the always-left episode
    assert played[1] == played[2] != always_left  # seeded sampling: the same episode twice


class _Coast(torch.nn.Module):
    """MountainCar's "no push" action for every sub-environment: the car never reaches the
    goal, so every step costs -1 and an episode's return is minus its length."""

    def forward(self, td):
        td.set("action", torch.ones(td.batch_size, dtype=torch.long))
        return td


@pytest.mark.parametrize(("max_steps", "expected"), [(None, -200.0), (37, -37.0), (1, -1.0)])
def test_eval_max_steps_cuts_episodes_off_and_scores_the_return_so_far(max_steps, expected):
    from rlkit.training.evaluation import Evaluator

    evaluator = Evaluator("MountainCar-v0", episodes=3, max_steps=max_steps)
    assert evaluator.returns(_Coast()).tolist() == [expected] * 3


def test_eval_max_steps_flag_reaches_the_evaluator(tmp_path):
    from rlkit.algorithms import load

    summary = load("ppo").main(
        ["--total-frames", "64", "--num-envs", "4", "--rollout-steps", "16"]
        + ["--minibatch-size", "32", "--eval-max-steps", "5", "--eval-episodes", "3"]
        + ["--progress", "false", "--run-dir", str(tmp_path / "run")]
    )
    assert summary["eval_return_mean"] <= 5.0
    with pytest.raises(SystemExit):
        load("ppo").main(["--eval-max-steps", "0", "--run-dir", str(tmp_path / "x")])


def test_none_for_an_optional_tuple_flag_and_a_non_finite_target_return(capsys):
    from rlkit.algorithms import daac

    cfg = parse_config(daac.DAACConfig, ["--adv-hidden", "none"])
    assert cfg.adv_hidden is None
    assert parse_config(daac.DAACConfig, ["--adv-hidden", "32", "32"]).adv_hidden == (32, 32)
    for value in ("nan", "inf"):
        with pytest.raises(SystemExit):
            parse_config(TrainConfig, ["--target-return", value])
        assert "--target-return must be a finite return" in capsys.readouterr().err


@pytest.mark.parametrize(("text", "value"), [("-1.5e2", -150.0), ("-200", -200.0), ("-.5", -0.5)])
def test_a_negative_value_in_scientific_form_is_a_value_not_a_flag(text, value):
    # argparse alone reads "-1.5e2" as an unknown option ("expected one argument")
    assert parse_config(TrainConfig, ["--target-return", text]).target_return == value


def test_minus_infinity_as_its_own_token_reaches_validation(capsys):
    from rlkit.algorithms import ppo

    with pytest.raises(SystemExit):
        parse_config(ppo.PPOConfig, ["--lr", "-inf"])
    assert "--lr must be finite" in capsys.readouterr().err
