"""APPO (IMPACT, Luo et al. 2020): networks, learner and :func:`train` (``recipes/appo.py``).

The config (:class:`APPOConfig`), its presets and the algorithm box that ``--help`` shows live
in the torch-free :mod:`rlkit.configs.appo`.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from tensordict import TensorDictBase
from torch import nn

from rlkit.algorithms._parts import make_part
from rlkit.algorithms.impala import (
    attach_reward_norm,
    lag_metrics,
    normalize_rewards,
    worker_settings,
)
from rlkit.algorithms.onpolicy import (
    PolicyGradientLearner,
    build_actor_critic,
    policy_gradient_settings,
    policy_optimizer,
)
from rlkit.configs import appo as _config
from rlkit.configs.appo import PRESETS, APPOConfig
from rlkit.data.async_collect import WorkerEnvs, worker_collector_factory
from rlkit.modules import BatchRewardNorm
from rlkit.objectives import APPOLoss
from rlkit.training import parse_config, run
from rlkit.training.engine import Context
from rlkit.value import VTrace


# 0. the learner -----------------------------------------------------------------------------
class APPOLearner(PolicyGradientLearner):
    """APPO's update (see the module docstring). ``loss`` is an
    :class:`~rlkit.objectives.APPOLoss`; ``estimator`` a ``rlkit.value.VTrace`` whose
    ``target_actor`` is ``loss.target_actor.module``. ``modules()`` adds the target network
    (parameters and step count) so checkpoints and resumes keep it. ``reward_norm`` and
    ``worker_envs``: as for :class:`~rlkit.algorithms.impala.IMPALALearner`; everything else
    as for :class:`~rlkit.algorithms.onpolicy.PolicyGradientLearner`."""

    supports_running_advantage_norm = True  # its update runs the shared one
    #: a population (``--population`` with ``--sync-collect true``) runs each member's own
    #: update in turn (rlkit.training.population): it also steps the member's target network
    population_sequential = True

    def __init__(
        self,
        *,
        algo: str = "appo",
        actor: nn.Module,
        critic: nn.Module,
        estimator: nn.Module,
        loss: nn.Module,
        reward_norm: BatchRewardNorm | None = None,
        worker_envs: WorkerEnvs | None = None,
        **kwargs: Any,
    ) -> None:
        if getattr(estimator, "target_actor", None) is not loss.target_actor.module:
            raise ValueError(
                "APPOLearner: the V-trace estimator must score rho with the loss's target "
                "network: build it with VTrace(..., target_actor=loss.target_actor.module)"
            )
        super().__init__(
            algo=algo,
            actor=actor,
            critic=critic,
            estimator=estimator,
            loss=loss,
            **kwargs,
        )
        self.reward_norm = attach_reward_norm(self, reward_norm)
        self.worker_envs = worker_envs

    def modules(self) -> dict[str, nn.Module]:
        return super().modules() | {"target_actor": self.loss.target_actor}

    def update(self, batch: TensorDictBase, ctx: Context) -> dict[str, float]:
        normalize_rewards(self.reward_norm, batch)  # before V-trace reads them
        self.loss.record_target_log_prob(batch)
        metrics = super().update(batch, ctx)  # V-trace, epochs x minibatches, KL lr, obs norm
        self.loss.step_target()
        if self.obs_norm is not None:
            self.loss.sync_target_buffers()
        return metrics | lag_metrics(batch)


# 2-5. networks, estimator, loss, learner ----------------------------------------------------
def build(cfg: APPOConfig, env, *, loss_cls=None, estimator_cls=None) -> APPOLearner:
    """APPO's learner for ``cfg`` on ``env``: networks, the clipped loss with its target
    network, V-trace scored with that target network, the learner.

    ``loss_cls`` (default :class:`~rlkit.objectives.APPOLoss`) and ``estimator_cls`` (default
    :class:`~rlkit.value.VTrace`): a subclass (or ``functools.partial`` of one) built in their
    place with exactly the recipe's arguments, ``loss_cls(actor, critic, tau=,
    target_update_freq=, clip_epsilon=, entropy_coef=, value_coef=, value_clip_epsilon=,
    normalize_advantage=)`` and ``estimator_cls(gamma=, actor=, target_actor=
    loss.target_actor.module, lmbda=, rho_clip=, c_clip=, pg_rho_clip=, adv_mode=,
    value_network=critic)``; everything else is built as the recipe builds it."""
    actor, critic, obs_norm = build_actor_critic(cfg, env)
    loss = make_part(
        loss_cls,
        APPOLoss,
        actor,
        critic,
        tau=cfg.tau,
        target_update_freq=cfg.target_update_freq,
        clip_epsilon=cfg.clip_epsilon,
        entropy_coef=cfg.entropy_coef,
        value_coef=cfg.value_coef,
        value_clip_epsilon=cfg.value_clip,
        normalize_advantage=cfg.normalize_advantage,
        where="appo.build",
    )
    estimator = make_part(
        estimator_cls,
        VTrace,
        gamma=cfg.gamma,
        actor=actor,
        target_actor=loss.target_actor.module,
        lmbda=cfg.vtrace_lambda,
        rho_clip=cfg.rho_clip,
        c_clip=cfg.c_clip,
        pg_rho_clip=cfg.pg_rho_clip,
        adv_mode=cfg.adv_mode,
        value_network=critic,
        role="estimator_cls",
        where="appo.build",
    )
    return APPOLearner(
        actor=actor,
        critic=critic,
        estimator=estimator,
        loss=loss,
        optimizer=policy_optimizer(cfg, actor, critic, obs_norm),
        obs_norm=obs_norm,
        **policy_gradient_settings(cfg),
        **worker_settings(cfg),
    )


# 6-7. collector, fit ------------------------------------------------------------------------
def train(cfg: APPOConfig, *, env=None, loss_cls=None, estimator_cls=None) -> dict:
    """Train APPO under a parsed ``cfg`` (what ``recipes/appo.py`` runs after its
    flags); returns the run summary. ``loss_cls``, ``estimator_cls``: as for :func:`build`."""
    collector = worker_collector_factory(
        num_workers=cfg.workers,
        sync=cfg.sync_collect,
        actor_timeout=cfg.actor_timeout,
        max_restarts=cfg.max_actor_restarts,
    )
    build_parts = partial(build, loss_cls=loss_cls, estimator_cls=estimator_cls)
    return run(cfg, build_parts, algo="appo", env=env, make_collector=collector)


def main(argv: list[str] | None = None) -> dict:
    """``recipes/appo.py`` from Python: parse ``argv`` (default: the command line), then
    :func:`train`."""
    cfg = parse_config(APPOConfig, argv, presets=PRESETS, description=_config.__doc__)
    return train(cfg)
