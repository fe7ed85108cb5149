"""On-policy ``--lr-schedule exponential`` and ``cosine`` (pyrado's lr_scheduler), and
``PolicyGradientLearner.attach_lr_scheduler`` for any ``torch.optim.lr_scheduler``: the rate of
each update against hand-written formulas, through whole recipe runs and a resume."""

from __future__ import annotations

import csv
import math

import pytest
import torch

from rlkit.algorithms import ppo
from rlkit.configs.ppo import PPOConfig

# 4 envs x 16 steps = 64 frames a batch; 4 batches in 256 frames
RUN = ["--num-envs", "4", "--rollout-steps", "16", "--minibatch-size", "32", "--epochs", "1",
       "--lr", "0.001", "--eval-every", "0", "--eval-episodes", "1", "--progress", "false",
       "--log-every", "1", "--threads", "1", "--total-frames", "256"]  # fmt: skip


def _rates(run_dir) -> list[tuple[int, float]]:
    """(frames after the batch, lr the batch was trained at) per batch of metrics.csv (which
    keeps about 7 significant digits)."""
    with open(run_dir / "metrics.csv") as f:
        return [(int(r["frames"]), float(r["lr"])) for r in csv.DictReader(f)]


def test_exponential_multiplies_by_gamma_after_every_update_and_resumes(tmp_path):
    run = ["--lr-schedule", "exponential", "--lr-gamma", "0.5", "--run-dir", str(tmp_path)]
    ppo.main([*RUN, *run, "--total-frames", "128"])
    ppo.main([*RUN, *run, "--resume", "last"])  # the update count comes from the checkpoint
    rates = _rates(tmp_path)
    assert [f for f, _ in rates] == [64, 128, 192, 256]
    # by hand: 0.001 x 0.5^n for the n-th update (n from 0)
    assert [lr for _, lr in rates] == pytest.approx([0.001, 0.0005, 0.00025, 0.000125], rel=1e-12)


def test_cosine_anneals_to_lr_final_over_the_run_or_the_decay_frames(tmp_path):
    ppo.main([*RUN, "--lr-schedule", "cosine", "--lr-final", "0.0001",
              "--run-dir", str(tmp_path / "run")])  # fmt: skip
    for (frames, lr), before in zip(_rates(tmp_path / "run"), [0, 64, 128, 192], strict=True):
        expected = 0.0001 + 0.5 * (0.001 - 0.0001) * (1 + math.cos(math.pi * before / 256))
        assert lr == pytest.approx(expected, rel=1e-6), frames
    ppo.main([*RUN, "--lr-schedule", "cosine", "--lr-final", "0.0001", "--lr-decay-frames",
              "128", "--run-dir", str(tmp_path / "span")])  # fmt: skip
    # 0 and 64 frames of a 128-frame span: 1e-3, (1e-3 + 1e-4) / 2; then held at 1e-4
    got = [lr for _, lr in _rates(tmp_path / "span")]
    assert got == pytest.approx([0.001, 0.00055, 0.0001, 0.0001], rel=1e-6)


@pytest.mark.parametrize(
    "kw,message",
    [
        (dict(lr_schedule="exponential"), "--lr-schedule exponential multiplies .* set it"),
        (dict(lr_schedule="exponential", lr_gamma=0.0), r"--lr-gamma must be in \(0, 1\]"),
        (dict(lr_schedule="exponential", lr_gamma=-0.5), r"--lr-gamma must be in \(0, 1\]"),
        (dict(lr_schedule="exponential", lr_gamma=1.5), r"--lr-gamma must be in \(0, 1\]"),
        (dict(lr_schedule="linear", lr_gamma=0.9), "--lr-gamma 0.9 is the factor of"),
        (
            dict(lr_schedule="exponential", lr_gamma=0.9, lr_decay_frames=100),
            "shapes --lr-schedule linear",
        ),
    ],
)
def test_impossible_schedule_settings_are_refused(kw, message):
    with pytest.raises(ValueError, match=message):
        PPOConfig(**kw)


def test_an_attached_torch_scheduler_drives_every_update(tmp_path):
    """Research code: any torch scheduler on ``learner.optimizer``, stepped per update and
    checkpointed; StepLR halving every 2 updates gives 1e-3, 1e-3, 5e-4, 5e-4."""
    from rlkit.training import run

    def build(cfg, env):
        learner = ppo.build(cfg, env)
        sched = torch.optim.lr_scheduler.StepLR(learner.optimizer, step_size=2, gamma=0.5)
        learner.attach_lr_scheduler(sched)
        return learner

    argv = [*RUN, "--lr-schedule", "constant", "--run-dir", str(tmp_path)]
    cfg = ppo.parse_config(PPOConfig, argv, presets=ppo.PRESETS)
    run(cfg, build, algo="ppo")
    assert [lr for _, lr in _rates(tmp_path)] == pytest.approx([1e-3, 1e-3, 5e-4, 5e-4])
    payload = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=False)
    assert payload["learner"]["lr_scheduler"]["last_epoch"] == 4


def test_attach_lr_scheduler_refuses_a_built_in_schedule_or_another_optimizer():
    from rlkit.envs import make_env

    env = make_env("CartPole-v1", num_envs=1, seed=0)
    learner = ppo.build(PPOConfig(lr_schedule="linear"), env)
    sched = torch.optim.lr_scheduler.StepLR(learner.optimizer, step_size=1)
    with pytest.raises(ValueError, match="already follows --lr-schedule linear"):
        learner.attach_lr_scheduler(sched)
    learner = ppo.build(PPOConfig(lr_schedule="constant"), env)
    with pytest.raises(ValueError, match="must be built on learner.optimizer"):
        learner.attach_lr_scheduler(sched)
    env.close()


def test_schedules_return_python_floats():
    """The rate goes into param_groups as a float, as the linear schedule's does (the
    optimiser step is not compiled, so a changing float recompiles nothing)."""
    from rlkit.training import schedules

    assert type(schedules.cosine(1e-3, 0.0, 0.3)) is float
    exp = schedules.ExponentialLR(1e-3, 0.9)
    exp.step()
    assert type(exp.lr) is float and exp.lr == 1e-3 * 0.9
