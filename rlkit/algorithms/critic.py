"""The critic as a loss group of its own (pyrado's ``GAE`` settings on PPO and A2C).

By default PPO's and A2C's critic trains inside the policy's loss: one optimiser over actor
and critic, the policy's epochs, minibatches and gradient clip
(:class:`~rlkit.algorithms.onpolicy.PolicyGradientLearner`). With any of ``--value-lr``,
``--value-epochs``, ``--value-minibatch-size`` or ``--value-max-grad-norm``
(:class:`~rlkit.configs.critic.CriticConfig`) the learner is :class:`CriticGroupLearner`:

* ``optimizer`` steps the actor (and anything else that is not the critic's) at ``--lr``,
  clipped at ``--max-grad-norm``; ``value_optimizer`` steps the critic at ``--value-lr``
  (else ``--lr``) on the same schedule, clipped at ``--value-max-grad-norm`` (else
  ``--max-grad-norm``);
* on the policy's minibatches (no ``--value-minibatch-size``, or the policy's size), the
  ``value`` group takes the loss's ``loss_value`` in lockstep with the ``policy`` group, for
  ``--value-epochs`` (else ``--epochs``) passes, as PPG's policy phase does;
* with minibatches of its own, the critic trains after the policy, in a second phase: the
  ``value`` group over :class:`~rlkit.objectives.DAACValueLoss` (the same regression, clipped
  with ``--value-clip`` where PPO has it), ``--value-epochs`` passes of
  ``--value-minibatch-size`` samples. In the policy's phase the loss's ``loss_value`` is then
  claimed by a ``value`` group of 0 epochs (the policy does not train on it).

Both phases run on the one :func:`~rlkit.training.update.update_loop`; value targets and
advantages are computed once per batch, before either phase (pyrado refits the critic first
and recomputes the advantages with it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from types import SimpleNamespace
from typing import Any

import torch
from tensordict import TensorDictBase
from torch import nn

from rlkit.algorithms.onpolicy import PolicyGradientLearner, make_optimizer
from rlkit.objectives.common import LOSS_VALUE
from rlkit.objectives.daac import DAACValueLoss
from rlkit.training import schedules
from rlkit.training.update import LossGroup

__all__ = ["CriticGroupLearner", "policy_gradient_learner"]


def _unique(params: Iterable[nn.Parameter]) -> list[nn.Parameter]:
    return list({id(p): p for p in params}.values())


class CriticGroupLearner(PolicyGradientLearner):
    """:class:`PolicyGradientLearner` whose critic is a loss group of its own.

    Args:
        value_loss: the critic's regression over ``critic`` alone (``loss_value``), trained
            in the second phase when the critic has minibatches of its own
            (:class:`~rlkit.objectives.DAACValueLoss`).
        everything else: as for :class:`PolicyGradientLearner`; ``cfg`` holds the
            :class:`~rlkit.configs.critic.CriticConfig` flags.

    Loss groups: ``policy`` (every term of ``loss`` but ``loss_value``; ``optimizer``;
    ``--epochs``; ``--max-grad-norm``) and ``value`` (``value_optimizer``; the critic's
    epochs, clip and minibatches); see the module docstring for how they are scheduled.
    """

    def __init__(self, *, value_loss: nn.Module, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        cfg = self.cfg
        actor = {id(p) for p in self.actor.parameters()}
        value = [p for p in _unique(self.critic.parameters()) if id(p) not in actor]
        if not value:
            raise ValueError(
                "the critic shares every parameter with the actor, so it cannot train as a "
                "loss group of its own: drop the --value-* flags or build separate networks"
            )
        owned = {id(p) for p in value}
        policy = [p for p in _unique(self.nets.parameters()) if id(p) not in owned]
        self.optimizer = make_optimizer(cfg, policy)
        settings = dict(optimizer=cfg.optimizer, lr=cfg.critic_lr, adam_eps=cfg.adam_eps)
        settings["weight_decay"] = getattr(cfg, "weight_decay", None)
        self.value_optimizer = make_optimizer(SimpleNamespace(**settings), value)
        self.value_loss = value_loss

    @property
    def own_minibatches(self) -> bool:
        """Whether the critic trains on minibatches of another size (a phase of its own)."""
        return self.cfg.critic_minibatch != self.cfg.minibatch

    # ---------------------------------------------------------------- Learner interface
    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        out = {"optimizer": self.optimizer, "value_optimizer": self.value_optimizer}
        return out | self._intrinsic_optimizers()

    # ---------------------------------------------------------------- the update
    def apply_schedules(self, progress: float) -> dict[str, float]:
        """The policy's schedules, and the critic's rate on the same schedule: ``--value-lr``
        times the policy's current rate over ``--lr``."""
        out = super().apply_schedules(progress)
        value_lr = self.cfg.critic_lr * out["lr"] / self.cfg.lr
        schedules.set_lr(self.value_optimizer, value_lr)
        return out | {"value_lr": value_lr}

    def loss_groups(self) -> list[LossGroup]:
        """``[policy, value]`` over the policy's loss; ``value`` has 0 epochs when the critic
        trains in a phase of its own (:meth:`value_phase`)."""
        if not hasattr(self, "_groups"):
            cfg = self.cfg
            self._groups = [
                LossGroup(
                    "policy",
                    self.loss,
                    self.optimizer,
                    cfg.epochs,
                    cfg.max_grad_norm,
                    target_kl=cfg.target_kl,
                ),
                LossGroup(
                    "value",
                    self.loss,
                    self.value_optimizer,
                    0 if self.own_minibatches else cfg.critic_epochs,
                    cfg.critic_max_grad_norm,
                    terms=(LOSS_VALUE,),
                    grad_name="value_grad_norm",
                ),
            ]
        return self._groups

    def value_phase(self) -> list[LossGroup]:
        """The critic's own phase (with ``--value-minibatch-size``): ``value_loss`` alone."""
        if not hasattr(self, "_value_phase"):
            cfg = self.cfg
            self._value_phase = [
                LossGroup(
                    "value",
                    self.value_loss,
                    self.value_optimizer,
                    cfg.critic_epochs,
                    cfg.critic_max_grad_norm,
                    grad_name="value_grad_norm",
                )
            ]
        return self._value_phase

    def phases(self) -> list[list[LossGroup]]:
        """The policy's phase (the critic in lockstep), or the policy's phase, then the
        critic's on its own minibatches."""
        first = self.first_phase()
        return [first, self.value_phase()] if self.own_minibatches else [first]

    def phase_minibatches(
        self, groups: list[LossGroup]
    ) -> Callable[[TensorDictBase, torch.Generator], Iterable[TensorDictBase]]:
        if self.own_minibatches and groups == self.value_phase():
            return partial(self._minibatches, size=self.cfg.critic_minibatch)
        return super().phase_minibatches(groups)


def policy_gradient_learner(
    cfg: Any, *, value_clip: float | None = None, **kwargs: Any
) -> PolicyGradientLearner:
    """The learner of a PPO / A2C config: :class:`PolicyGradientLearner` (the critic in the
    policy's loss), or :class:`CriticGroupLearner` when a ``--value-*`` flag is set.
    ``kwargs`` are :class:`PolicyGradientLearner`'s; ``value_clip`` is the critic's clip
    range in its own phase (PPO's ``--value-clip``). A config without the
    :class:`~rlkit.configs.critic.CriticConfig` flags gets the shared learner."""
    if not getattr(cfg, "critic_group", False):
        return PolicyGradientLearner(cfg=cfg, **kwargs)
    value_loss = DAACValueLoss(
        kwargs["critic"], value_coef=cfg.value_coef, value_clip_epsilon=value_clip
    )
    return CriticGroupLearner(cfg=cfg, value_loss=value_loss, **kwargs)
