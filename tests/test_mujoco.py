"""MuJoCo presets (the optional ``[mujoco]`` extra): CleanRL's PPO settings, rl-zoo3's SAC
settings, and short runs.

The presets are compared with CleanRL's ``ppo_continuous_action.py`` defaults (benchmark tag
pr-424) and rl-zoo3's SAC ``mujoco-defaults`` written out here; the runs are skipped where the
extra is not installed (CI).
"""

from __future__ import annotations

import pytest

from rlkit.configs import ppo as ppo_config
from rlkit.configs import sac as sac_config

TASKS = ("HalfCheetah-v5", "Hopper-v5", "Walker2d-v5")

#: CleanRL ppo_continuous_action.py: num_envs 1, num_steps 2048, num_minibatches 32,
#: update_epochs 10, learning_rate 3e-4 annealed, gamma 0.99, gae_lambda 0.95, clip_coef 0.2,
#: clip_vloss, ent_coef 0, vf_coef 0.5, max_grad_norm 0.5, NormalizeObservation and
#: NormalizeReward, 1M steps
CLEANRL = dict(
    num_envs=1, rollout_steps=2048, minibatch_size=2048 // 32, epochs=10, lr=3e-4,
    lr_schedule="linear", gamma=0.99, gae_lambda=0.95, clip_epsilon=0.2, value_clip=0.2,
    entropy_coef=0.0, value_coef=0.5, max_grad_norm=0.5, normalize_obs=True,
    normalize_reward=True, total_frames=1_000_000,
)  # fmt: skip


@pytest.mark.parametrize("task", TASKS)
def test_presets_are_cleanrls_settings(task):
    from rlkit.training import parse_config

    cfg = parse_config(ppo_config.CONFIG, ["--env", task], presets=ppo_config.PRESETS)
    assert {k: getattr(cfg, k) for k in CLEANRL} == CLEANRL
    assert cfg.clip_epsilon_final is None and cfg.lr_final == 0.0  # clip fixed, lr to 0


@pytest.mark.parametrize("task", TASKS)
def test_appo_presets_are_cleanrls_settings_with_vtrace(task):
    """APPO's MuJoCo preset: CleanRL's PPO settings, V-trace lambda for GAE's, collected
    synchronously with the target network copied after every batch."""
    from rlkit.configs import appo as appo_config
    from rlkit.training import parse_config

    cfg = parse_config(appo_config.CONFIG, ["--env", task], presets=appo_config.PRESETS)
    expected = {k: v for k, v in CLEANRL.items() if k != "gae_lambda"}
    assert {k: getattr(cfg, k) for k in expected} == expected
    assert cfg.vtrace_lambda == CLEANRL["gae_lambda"]
    assert (cfg.sync_collect, cfg.tau, cfg.target_update_freq, cfg.workers) == (True, 1.0, 1, 1)
    assert cfg.lr_final == 0.0  # annealed to 0


def test_a_short_halfcheetah_run(tmp_path):
    pytest.importorskip("mujoco")
    from rlkit.algorithms import ppo

    summary = ppo.main(
        ["--env", "HalfCheetah-v5", "--total-frames", "2048", "--eval-every", "0",
         "--eval-episodes", "2", "--eval-max-steps", "50", "--progress", "false",
         "--run-dir", str(tmp_path)]
    )  # fmt: skip
    assert summary["frames"] == 2048 and summary["config"]["normalize_obs"] is True


#: rl-zoo3 hyperparams/sac.yml mujoco-defaults: learning_starts 10000 on SB3's SAC defaults
#: (learning_rate 3e-4, buffer_size 1e6, batch_size 256, tau 0.005, gamma 0.99, train_freq 1,
#: gradient_steps 1, ent_coef "auto" from 1.0, target_entropy -dim(A), net_arch [256, 256],
#: ReLU), 1M steps
ZOO_SAC = dict(
    learning_starts=10_000, lr=3e-4, buffer_size=1_000_000, batch_size=256, tau=0.005,
    gamma=0.99, steps_per_batch=1, utd_ratio=1.0, alpha_init=1.0, learn_alpha=True,
    target_entropy=None, hidden=(256, 256), activation="relu", total_frames=1_000_000,
)  # fmt: skip


@pytest.mark.parametrize("task", TASKS)
def test_sac_presets_are_zoos_settings(task):
    from rlkit.training import parse_config

    cfg = parse_config(sac_config.CONFIG, ["--env", task], presets=sac_config.PRESETS)
    assert {k: getattr(cfg, k) for k in ZOO_SAC} == ZOO_SAC
    assert cfg.actor_lr is None and cfg.alpha_lr is None  # both follow --lr, as SB3's


def test_a_short_hopper_sac_run(tmp_path):
    pytest.importorskip("mujoco")
    from rlkit.algorithms import sac

    summary = sac.main(
        ["--env", "Hopper-v5", "--total-frames", "600", "--learning-starts", "500",
         "--eval-every", "0", "--eval-episodes", "2", "--eval-max-steps", "50",
         "--progress", "false", "--run-dir", str(tmp_path)]
    )  # fmt: skip
    assert summary["frames"] == 600 and summary["config"]["batch_size"] == 256
