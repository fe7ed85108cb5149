"""PPO (Schulman et al. 2017): networks, learner and :func:`train`, what ``recipes/ppo.py`` runs.

The config (:class:`PPOConfig`), its presets and the algorithm box that ``--help`` shows live
in the torch-free :mod:`rlkit.configs.ppo` and are imported here under their old names.
"""

from __future__ import annotations

from rlkit.algorithms.critic import policy_gradient_learner
from rlkit.algorithms.onpolicy import (
    PolicyGradientLearner,
    attach_intrinsic_from_config,
    build_actor_critic,
)
from rlkit.configs import ppo as _config
from rlkit.configs.ppo import PRESETS, PPOConfig
from rlkit.objectives import PPOLoss
from rlkit.training import parse_config, run
from rlkit.value import GAE


# 2-5. networks, estimator, loss, learner ----------------------------------------------------
def build(cfg: PPOConfig, env) -> PolicyGradientLearner:
    actor, critic, obs_norm = build_actor_critic(cfg, env)
    estimator = GAE(
        gamma=cfg.gamma,
        lmbda=cfg.gae_lambda,
        value_network=critic,
        empirical_returns=getattr(cfg, "empirical_returns", False),
    )
    loss = PPOLoss(
        actor,
        critic,
        clip_epsilon=cfg.clip_epsilon,
        entropy_coef=cfg.entropy_coef,
        value_coef=cfg.value_coef,
        value_clip_epsilon=cfg.value_clip,
        normalize_advantage=cfg.normalize_advantage,
    )
    learner = policy_gradient_learner(
        cfg,
        algo="ppo",
        actor=actor,
        critic=critic,
        estimator=estimator,
        loss=loss,
        obs_norm=obs_norm,
        loss_schedules=cfg.loss_schedules,
        value_clip=cfg.value_clip,
    )
    attach_intrinsic_from_config(learner, cfg, env)
    return learner


# 6. fit -------------------------------------------------------------------------------------
def train(cfg: PPOConfig) -> dict:
    """Train PPO under a parsed ``cfg`` (what ``recipes/ppo.py`` runs after its
    flags); returns the run summary."""
    return run(cfg, build, algo="ppo")


def main(argv: list[str] | None = None) -> dict:
    """``recipes/ppo.py`` from Python: parse ``argv`` (default: the command line), then
    :func:`train`."""
    cfg = parse_config(PPOConfig, argv, presets=PRESETS, description=_config.__doc__)
    return train(cfg)
