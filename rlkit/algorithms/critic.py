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
from typing import Any

import torch
from tensordict import TensorDictBase
from torch import nn

from rlkit.algorithms._settings import config_optimizer
from rlkit.algorithms.onpolicy import (
    PolicyGradientLearner,
    policy_gradient_settings,
    policy_optimizer,
)
from rlkit.objectives.common import LOSS_VALUE
from rlkit.objectives.daac import DAACValueLoss
from rlkit.training import schedules
from rlkit.training.optim import unique_parameters
from rlkit.training.update import LossGroup

__all__ = ["CriticGroupLearner", "critic_group_parameters", "policy_gradient_learner"]


def critic_group_parameters(
    actor: nn.Module, critic: nn.Module, *others: nn.Module | None
) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """``(policy, value)``: the critic's own parameters (none of the actor's) and every other
    one of ``actor``, ``critic`` and ``others`` (each once), what ``optimizer`` and
    ``value_optimizer`` of a :class:`CriticGroupLearner` step.

    Raises:
        ValueError: the critic shares every parameter with the actor.
    """
    shared = {id(p) for p in actor.parameters()}
    value = [p for p in unique_parameters(critic) if id(p) not in shared]
    if not value:
        raise ValueError(
            "the critic shares every parameter with the actor, so it cannot train as a "
            "loss group of its own: drop the --value-* flags or build separate networks"
        )
    modules = [m for m in (actor, critic, *others) if m is not None]
    return unique_parameters(*modules, but=value), value


class CriticGroupLearner(PolicyGradientLearner):
    """:class:`PolicyGradientLearner` whose critic is a loss group of its own.

    Args:
        value_loss: the critic's regression over ``critic`` alone (``loss_value``), trained
            in the second phase when the critic has minibatches of its own
            (:class:`~rlkit.objectives.DAACValueLoss`).
        value_optimizer: over the critic's own parameters; ``optimizer`` then holds every
            other one (:func:`critic_group_parameters`).
        value_lr: the critic's initial rate (it follows the policy's schedule in proportion);
            None: the policy's.
        value_epochs: the critic's passes per batch; None: ``epochs``.
        value_minibatch_size: samples per critic step; None: the policy's minibatches
            (in lockstep); another size: a phase of its own.
        value_max_grad_norm: the critic's clip norm; None: ``max_grad_norm``.
        everything else: as for :class:`PolicyGradientLearner`.

    Loss groups: ``policy`` (every term of ``loss`` but ``loss_value``; ``optimizer``;
    ``--epochs``; ``--max-grad-norm``) and ``value`` (``value_optimizer``; the critic's
    epochs, clip and minibatches); see the module docstring for how they are scheduled.
    """

    def __init__(
        self,
        *,
        value_loss: nn.Module,
        value_optimizer: torch.optim.Optimizer,
        value_lr: float | None = None,
        value_epochs: int | None = None,
        value_minibatch_size: int | None = None,
        value_max_grad_norm: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.value_optimizer, self.value_loss = value_optimizer, value_loss
        self.value_lr = self.lr_schedule.lr if value_lr is None else value_lr
        self.value_epochs = self.epochs if value_epochs is None else value_epochs
        self.value_minibatch_size = value_minibatch_size
        self.value_max_grad_norm = (
            self.max_grad_norm if value_max_grad_norm is None else value_max_grad_norm
        )

    @property
    def own_minibatches(self) -> bool:
        """Whether the critic trains on minibatches of another size (a phase of its own)."""
        size = self.value_minibatch_size
        return size is not None and size != self._policy_minibatch()

    def _policy_minibatch(self) -> int:
        """The policy's samples per step (the whole batch when ``minibatch_size`` is None)."""
        return self.frames_per_batch if self.minibatch_size is None else self.minibatch_size

    # ---------------------------------------------------------------- Learner interface
    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        out = {"optimizer": self.optimizer, "value_optimizer": self.value_optimizer}
        return out | self._intrinsic_optimizers()

    # ---------------------------------------------------------------- the update
    def apply_schedules(self, progress: float) -> dict[str, float]:
        """The policy's schedules, and the critic's rate on the same schedule: ``--value-lr``
        times the policy's current rate over ``--lr``."""
        out = super().apply_schedules(progress)
        value_lr = self.value_lr * out["lr"] / self.lr_schedule.lr
        schedules.set_lr(self.value_optimizer, value_lr)
        return out | {"value_lr": value_lr}

    def loss_groups(self) -> list[LossGroup]:
        """``[policy, value]`` over the policy's loss; ``value`` has 0 epochs when the critic
        trains in a phase of its own (:meth:`value_phase`)."""
        if not hasattr(self, "_groups"):
            self._groups = [
                LossGroup(
                    "policy",
                    self.loss,
                    self.optimizer,
                    self.epochs,
                    self.max_grad_norm,
                    target_kl=self.target_kl,
                ),
                LossGroup(
                    "value",
                    self.loss,
                    self.value_optimizer,
                    0 if self.own_minibatches else self.value_epochs,
                    self.value_max_grad_norm,
                    terms=(LOSS_VALUE,),
                    grad_name="value_grad_norm",
                ),
            ]
        return self._groups

    def value_phase(self) -> list[LossGroup]:
        """The critic's own phase (with ``--value-minibatch-size``): ``value_loss`` alone."""
        if not hasattr(self, "_value_phase"):
            self._value_phase = [
                LossGroup(
                    "value",
                    self.value_loss,
                    self.value_optimizer,
                    self.value_epochs,
                    self.value_max_grad_norm,
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
            return partial(self._minibatches, size=self.value_minibatch_size)
        return super().phase_minibatches(groups)


def policy_gradient_learner(
    cfg: Any, *, value_clip: float | None = None, **kwargs: Any
) -> PolicyGradientLearner:
    """The learner of a PPO / A2C config: :class:`PolicyGradientLearner` (the critic in the
    policy's loss, one optimiser), or :class:`CriticGroupLearner` when a ``--value-*`` flag
    is set (:class:`~rlkit.configs.critic.CriticConfig`). ``kwargs`` are
    :class:`PolicyGradientLearner`'s but the optimiser and the config's settings
    (:func:`~rlkit.algorithms.onpolicy.policy_gradient_settings`); ``value_clip`` is the
    critic's clip range in its own phase (PPO's ``--value-clip``)."""
    actor, critic, obs_norm = kwargs["actor"], kwargs["critic"], kwargs.get("obs_norm")
    kwargs |= policy_gradient_settings(cfg, kwargs.pop("loss_schedules", None))
    if not cfg.critic_group:
        optimizer = policy_optimizer(cfg, actor, critic, obs_norm)
        return PolicyGradientLearner(optimizer=optimizer, **kwargs)
    value_loss = DAACValueLoss(critic, value_coef=cfg.value_coef, value_clip_epsilon=value_clip)
    policy, value = critic_group_parameters(actor, critic, obs_norm)
    return CriticGroupLearner(
        optimizer=config_optimizer(cfg, policy),
        value_optimizer=config_optimizer(cfg, value, lr=cfg.critic_lr),
        value_loss=value_loss,
        value_lr=cfg.critic_lr,
        value_epochs=cfg.critic_epochs,
        value_minibatch_size=cfg.critic_minibatch,
        value_max_grad_norm=cfg.critic_max_grad_norm,
        **kwargs,
    )
