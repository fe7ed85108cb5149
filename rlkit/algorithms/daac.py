"""DAAC (Raileanu & Fergus 2021): networks, learner and :func:`train` (``recipes/daac.py``).

The config (:class:`DAACConfig`), its presets and the algorithm box that ``--help`` shows live
in the torch-free :mod:`rlkit.configs.daac`.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

import torch
from tensordict import TensorDictBase
from torch import nn

from rlkit.algorithms._parts import gae_part, make_part
from rlkit.algorithms._settings import config_optimizer
from rlkit.algorithms.onpolicy import (
    PolicyGradientLearner,
    attach_intrinsic_from_config,
    policy_gradient_settings,
    refuse_memory,
)
from rlkit.configs import daac as _config
from rlkit.configs.daac import PRESETS, DAACConfig
from rlkit.modules.composite import refuse_structured
from rlkit.modules.daac_networks import DAACNetworks, daac_networks
from rlkit.objectives.daac import DAACLoss, DAACValueLoss
from rlkit.training import parse_config, run, schedules
from rlkit.training.engine import Context
from rlkit.training.optim import unique_parameters
from rlkit.training.update import LossGroup
from rlkit.value import GAE


def build_daac_networks(cfg: DAACConfig, env) -> DAACNetworks:
    """:func:`rlkit.modules.daac_networks.daac_networks` with a config's network flags."""
    return daac_networks(
        env,
        hidden=cfg.hidden,
        activation=cfg.activation,
        adv_hidden=cfg.adv_hidden,
        normalize_obs=cfg.normalize_obs,
        init_log_std=cfg.init_log_std,
        bounded_mean=cfg.bounded_mean,
        actor_hidden=cfg.actor_layers,
        critic_hidden=cfg.critic_layers,
        encoder=cfg.encoder,
        feature_dim=cfg.feature_dim,
        obs_keys=cfg.obs_keys,
    )


# the learner ---------------------------------------------------------------------------------
# DAAC's networks and learner: decoupled policy and value networks, two optimisers.
#
# Decoupled Advantage Actor-Critic (Raileanu & Fergus 2021, Algorithm 1)::
#
#     for each batch
#         collect with pi_theta; GAE with the value network V_phi -> advantage, value target
#         standardise the advantage over the batch (--advantage-norm batch, the authors' code)
#         policy_epochs x minibatches:  theta <- theta - lr grad [ L_clip - alpha_s H
#                                                                  + alpha_a (A_theta(s,a) - A)^2 ]
#         every value_freq batches:
#             value_epochs x minibatches: phi <- phi - lr grad 1/2 (V_phi(s) - V_target)^2
#
# The policy network is a trunk with two heads: the policy and the advantage head
# :math:`A_\theta(s, a)`, conditioned on the action (one output per action gathered at the
# action for discrete spaces; an MLP on ``concat(features, action)`` for continuous ones). The
# value network shares nothing with it and has its own optimiser, so the policy's features are
# shaped by the policy and advantage losses only. The losses live in
# :mod:`rlkit.objectives.daac`; this file builds the networks and orders the steps.


class DAACLearner(PolicyGradientLearner):
    """DAAC on top of :class:`PolicyGradientLearner` (schedules, minibatching, obs norm).

    Args:
        nets: the networks (:func:`build_daac_networks`).
        estimator: writes ``advantage`` and ``value_target`` with the value network
            (``rlkit.value.GAE(..., value_network=nets.critic)``).
        loss: :class:`~rlkit.objectives.daac.DAACLoss` over the policy network.
        value_loss: :class:`~rlkit.objectives.daac.DAACValueLoss` over the value network.
        optimizer: over the policy network (trunk, policy head, advantage head).
        value_optimizer: over the value network.
        value_lr: the value network's initial rate (it follows the policy's schedule in
            proportion); None: the policy's.
        value_epochs: passes of the value loss in a value phase.
        value_freq: a value phase after every ``value_freq``-th batch (counting from the
            first).
        everything else: as for :class:`PolicyGradientLearner` (``loss_schedules``: loss
            attributes annealed linearly, e.g. ``{"clip_epsilon": (0.2, 0)}``).

    Optimisers: ``optimizer`` over the policy network (trunk, policy head, advantage head),
    ``value_optimizer`` over the value network, at ``--value-lr`` times the policy learning
    rate's schedule ratio. Per batch: the advantage standardised over the batch
    (``--advantage-norm batch``), ``--epochs`` passes of the policy loss, then (every
    ``--value-freq`` batches, counting from the first) ``--value-epochs`` passes of the value
    loss, each over the same GAE targets, in minibatches of ``--minibatch-size``: two
    :func:`~rlkit.training.update.update_loop` calls, one :class:`LossGroup` each
    (:meth:`loss_groups`).
    """

    def __init__(
        self,
        *,
        nets: DAACNetworks,
        estimator: nn.Module,
        loss: nn.Module,
        value_loss: nn.Module,
        optimizer: torch.optim.Optimizer,
        value_optimizer: torch.optim.Optimizer,
        value_epochs: int,
        value_freq: int = 1,
        value_lr: float | None = None,
        **kwargs: Any,
    ) -> None:
        policy = unique_parameters(nets.actor, nets.advantage_head)
        shared = {id(p) for p in policy} & {id(p) for p in nets.critic.parameters()}
        if shared:
            raise ValueError(
                "DAAC's value network must not share parameters with the policy network "
                f"({len(shared)} shared tensors): build them separately (build_daac_networks)"
            )
        super().__init__(
            algo="daac",
            actor=nets.actor,
            critic=nets.critic,
            estimator=estimator,
            loss=loss,
            optimizer=optimizer,
            obs_norm=nets.obs_norm,
            **kwargs,
        )
        self.advantage_head, self.value_loss = nets.advantage_head, value_loss
        self.nets["advantage_head"] = nets.advantage_head
        self.value_optimizer = value_optimizer
        self.value_epochs, self.value_freq, self.value_lr = value_epochs, value_freq, value_lr
        self.batches_seen = 0

    # ---------------------------------------------------------------- Learner interface
    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        optimizers = {"optimizer": self.optimizer, "value_optimizer": self.value_optimizer}
        return optimizers | self._intrinsic_optimizers()

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"batches_seen": self.batches_seen}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.batches_seen = int(state.get("batches_seen", 0))

    # ---------------------------------------------------------------- the update
    def apply_schedules(self, progress: float) -> dict[str, float]:
        out = super().apply_schedules(progress)
        base = self.lr_schedule.lr
        value_lr = (self.value_lr if self.value_lr is not None else base) * (out["lr"] / base)
        schedules.set_lr(self.value_optimizer, value_lr)
        return out | {"value_lr": value_lr}

    def loss_groups(self) -> list[LossGroup]:
        """``[policy, value]``: trained one after the other, not in lockstep."""
        if not hasattr(self, "_groups"):
            self._groups = [
                LossGroup(
                    "policy",
                    self.loss,
                    self.optimizer,
                    epochs=self.epochs,
                    max_grad_norm=self.max_grad_norm,
                    target_kl=self.target_kl,
                ),
                LossGroup(
                    "value",
                    self.value_loss,
                    self.value_optimizer,
                    epochs=self.value_epochs,
                    max_grad_norm=self.max_grad_norm,
                    grad_name="value_grad_norm",
                ),
            ]
        return self._groups

    def prepare(self, batch: TensorDictBase, ctx: Context):
        sched = self.apply_schedules(ctx.progress)
        with torch.no_grad():
            self.estimator(batch)  # GAE with the value network; writes state_value too
            sched |= self.intrinsic_advantage(batch, ctx)
        return self.loss.standardize_batch(batch.reshape(-1)), sched

    def phases(self) -> list[list[LossGroup]]:
        """The policy phase, then (every ``--value-freq`` batches) the value phase."""
        policy, value = self.loss_groups()
        first = [policy, *self.intrinsic_groups()]
        return [first, [value]] if self.batches_seen % self.value_freq == 0 else [first]

    def finish(self, batch: TensorDictBase, result: Mapping[str, float], ctx: Context):
        self.batches_seen += 1
        return super().finish(batch, result, ctx)


# 2-5. networks, estimator, losses, learner --------------------------------------------------
def build(cfg: DAACConfig, env, *, loss_cls=None, estimator_cls=None) -> DAACLearner:
    """DAAC's learner for ``cfg`` on ``env``: networks, GAE with the value network, the
    policy and value losses, the learner and ``--intrinsic``'s bonus.

    ``loss_cls`` (the policy network's loss; default :class:`~rlkit.objectives.daac.DAACLoss`)
    and ``estimator_cls`` (default :class:`~rlkit.value.GAE`): a subclass (or
    ``functools.partial`` of one) built in their place with exactly the recipe's arguments,
    ``loss_cls(actor, advantage_head, clip_epsilon=, entropy_coef=, adv_coef=,
    normalize_advantage=, advantage_target=, advantage_norm=)`` and ``estimator_cls(gamma=,
    lmbda=, value_network=critic)``; the value network's
    :class:`~rlkit.objectives.daac.DAACValueLoss` and everything else are built as the recipe
    builds them."""
    refuse_memory(cfg, "daac")
    refuse_structured(env, "daac (its networks take Discrete or Box actions)")
    nets = build_daac_networks(cfg, env)
    estimator = gae_part(estimator_cls, GAE, cfg, nets.critic, where="daac.build")
    loss = make_part(
        loss_cls,
        DAACLoss,
        nets.actor,
        nets.advantage_head,
        clip_epsilon=cfg.clip_epsilon,
        entropy_coef=cfg.entropy_coef,
        adv_coef=cfg.adv_coef,
        normalize_advantage=cfg.normalize_advantage,
        advantage_target=cfg.advantage_target,
        advantage_norm=cfg.advantage_norm,
        where="daac.build",
    )
    value_loss = DAACValueLoss(
        nets.critic, value_coef=cfg.value_coef, value_clip_epsilon=cfg.value_clip
    )
    learner = DAACLearner(
        nets=nets,
        estimator=estimator,
        loss=loss,
        value_loss=value_loss,
        optimizer=config_optimizer(cfg, unique_parameters(nets.actor, nets.advantage_head)),
        value_optimizer=config_optimizer(cfg, nets.critic.parameters()),
        value_epochs=cfg.value_epochs,
        value_freq=cfg.value_freq,
        value_lr=cfg.value_lr,
        **policy_gradient_settings(cfg, cfg.loss_schedules),
    )
    attach_intrinsic_from_config(learner, cfg, env)
    return learner


# 6. fit -------------------------------------------------------------------------------------
def train(cfg: DAACConfig, *, env=None, loss_cls=None, estimator_cls=None) -> dict:
    """Train DAAC under a parsed ``cfg`` (what ``recipes/daac.py`` runs after its
    flags); returns the run summary. ``loss_cls``, ``estimator_cls``: as for :func:`build`."""
    build_parts = partial(build, loss_cls=loss_cls, estimator_cls=estimator_cls)
    return run(cfg, build_parts, algo="daac", env=env)


def main(argv: list[str] | None = None) -> dict:
    """``recipes/daac.py`` from Python: parse ``argv`` (default: the command line), then
    :func:`train`."""
    cfg = parse_config(DAACConfig, argv, presets=PRESETS, description=_config.__doc__)
    return train(cfg)
