"""A2C (Mnih et al. 2016): networks, learner and :func:`train`, what ``recipes/a2c.py`` runs.

The config (:class:`A2CConfig`), its presets and the algorithm box that ``--help`` shows live
in the torch-free :mod:`rlkit.configs.a2c`.
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
from rlkit.configs import a2c as _config
from rlkit.configs.a2c import PRESETS, A2CConfig
from rlkit.objectives import A2CLoss
from rlkit.training import parse_config, run
from rlkit.value import GAE


# 2-5. networks, estimator, loss, learner ----------------------------------------------------
def build(cfg: A2CConfig, env, *, loss_cls=None, estimator_cls=None) -> PolicyGradientLearner:
    """A2C's learner for ``cfg`` on ``env``: networks, GAE, the loss, the learner (with a
    critic group under ``--value-*``) and ``--intrinsic``'s bonus.

    ``loss_cls`` (default :class:`~rlkit.objectives.A2CLoss`) and ``estimator_cls`` (default
    :class:`~rlkit.value.GAE`): a subclass (or ``functools.partial`` of one) built in their
    place with exactly the recipe's arguments, ``loss_cls(actor, critic, entropy_coef=,
    value_coef=, normalize_advantage=)`` and ``estimator_cls(gamma=, lmbda=,
    value_network=critic, empirical_returns=)``; everything else is built as the recipe
    builds it."""
    actor, critic, obs_norm = build_actor_critic(cfg, env)
    estimator = gae_part(
        estimator_cls,
        GAE,
        cfg,
        critic,
        where="a2c.build",
        empirical_returns=cfg.empirical_returns,
    )
    loss = make_part(
        loss_cls,
        A2CLoss,
        actor,
        critic,
        entropy_coef=cfg.entropy_coef,
        value_coef=cfg.value_coef,
        normalize_advantage=cfg.normalize_advantage,
        where="a2c.build",
    )
    learner = policy_gradient_learner(
        cfg,
        algo="a2c",
        actor=actor,
        critic=critic,
        estimator=estimator,
        loss=loss,
        obs_norm=obs_norm,
    )
    attach_intrinsic_from_config(learner, cfg, env)
    return learner


# 6. fit -------------------------------------------------------------------------------------
def train(cfg: A2CConfig, *, env=None, loss_cls=None, estimator_cls=None) -> dict:
    """Train A2C under a parsed ``cfg`` (what ``recipes/a2c.py`` runs after its
    flags); returns the run summary. ``loss_cls``, ``estimator_cls``: as for :func:`build`."""
    build_parts = partial(build, loss_cls=loss_cls, estimator_cls=estimator_cls)
    return run(cfg, build_parts, algo="a2c", env=env)


def main(argv: list[str] | None = None) -> dict:
    """``recipes/a2c.py`` from Python: parse ``argv`` (default: the command line), then
    :func:`train`."""
    cfg = parse_config(A2CConfig, argv, presets=PRESETS, description=_config.__doc__)
    return train(cfg)
