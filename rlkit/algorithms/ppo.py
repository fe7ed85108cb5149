"""PPO (Schulman et al. 2017): networks, learner and :func:`train`, what ``recipes/ppo.py`` runs.

The config (:class:`PPOConfig`), its presets and the algorithm box that ``--help`` shows live
in the torch-free :mod:`rlkit.configs.ppo`.
"""

from __future__ import annotations

from functools import partial

from rlkit.algorithms._parts import gae_part, make_part
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
def build(cfg: PPOConfig, env, *, loss_cls=None, estimator_cls=None) -> PolicyGradientLearner:
    """PPO's learner for ``cfg`` on ``env``: networks, GAE, the clipped loss, the learner
    (with a critic group under ``--value-*``) and ``--intrinsic``'s bonus.

    ``loss_cls`` (default :class:`~rlkit.objectives.PPOLoss`) and ``estimator_cls`` (default
    :class:`~rlkit.value.GAE`): a subclass (or ``functools.partial`` of one) built in their
    place with exactly the recipe's arguments, ``loss_cls(actor, critic, clip_epsilon=,
    entropy_coef=, value_coef=, value_clip_epsilon=, normalize_advantage=)`` and
    ``estimator_cls(gamma=, lmbda=, value_network=critic, empirical_returns=)``; everything
    else is built as the recipe builds it."""
    actor, critic, obs_norm = build_actor_critic(cfg, env)
    estimator = gae_part(
        estimator_cls,
        GAE,
        cfg,
        critic,
        where="ppo.build",
        empirical_returns=cfg.empirical_returns,
    )
    loss = make_part(
        loss_cls,
        PPOLoss,
        actor,
        critic,
        clip_epsilon=cfg.clip_epsilon,
        entropy_coef=cfg.entropy_coef,
        value_coef=cfg.value_coef,
        value_clip_epsilon=cfg.value_clip,
        normalize_advantage=cfg.normalize_advantage,
        where="ppo.build",
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
def train(cfg: PPOConfig, *, env=None, loss_cls=None, estimator_cls=None) -> dict:
    """Train PPO under a parsed ``cfg`` (what ``recipes/ppo.py`` runs after its
    flags); returns the run summary. ``loss_cls``, ``estimator_cls``: as for :func:`build`."""
    build_parts = partial(build, loss_cls=loss_cls, estimator_cls=estimator_cls)
    return run(cfg, build_parts, algo="ppo", env=env)


def main(argv: list[str] | None = None) -> dict:
    """``recipes/ppo.py`` from Python: parse ``argv`` (default: the command line), then
    :func:`train`."""
    cfg = parse_config(PPOConfig, argv, presets=PRESETS, description=_config.__doc__)
    return train(cfg)
