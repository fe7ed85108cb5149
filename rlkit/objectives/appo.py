r"""APPO / IMPACT's clipped-target surrogate (Luo et al. 2020) as a TorchRL ``LossModule``."""

from __future__ import annotations

import torch
from tensordict import NestedKey, TensorDictBase
from torch import Tensor, nn

from rlkit import keys
from rlkit.modules.direct import actor_dist
from rlkit.modules.target import TargetNetwork
from rlkit.objectives.common import (
    APPROX_KL,
    CLIP_FRACTION,
    LOSS_POLICY,
    RATIO_MEAN,
    WRITTEN_BY_BEHAVIOUR_ACTOR,
    read_per_sample,
)
from rlkit.objectives.functional import approx_kl, clipped_surrogate
from rlkit.objectives.ppo import PPOLoss

__all__ = ["APPOLoss"]

RHO_MEAN = "rho_mean"


class APPOLoss(PPOLoss):
    r"""IMPACT (Luo et al. 2020): PPO clipping over V-trace-corrected ratios with a target
    network :math:`\pi_{\bar\theta}`.

    Three policies appear: :math:`\mu`, the behaviour policy that acted (a worker's stale
    copy; its log-prob is stored in the batch), :math:`\pi_\theta`, the learner's current
    policy, and :math:`\pi_{\bar\theta}`, the **target network**, a Polyak average of
    :math:`\theta` (``target_actor``), updated by :meth:`step_target` with
    :math:`\bar\theta \leftarrow (1-\tau)\bar\theta + \tau\theta` every
    ``target_update_freq`` learner steps (one learner step = one batch's update). Then:

    * in :math:`\rho` (V-trace, computed before the loss by
      ``rlkit.value.VTrace(actor=..., target_actor=loss.target_actor.module)``), the target
      is the *target network*: :math:`\rho_t = \pi_{\bar\theta}(a_t|x_t)/\mu(a_t|x_t)`; the
      advantage :math:`A_t = \min(\bar\rho_{pg}, \rho_t)(r_t + \gamma v_{t+1} - V(x_t))`
      and the value target :math:`v_t` come from it;
    * in the clip, the ratio is current over *target network*:
      :math:`r_t(\theta) = \pi_\theta(a_t|x_t)/\pi_{\bar\theta}(a_t|x_t)`, and

    .. math::
        \text{loss\_policy} = -\frac1N\sum_t \min\big(r_t A_t,\
            \mathrm{clip}(r_t, 1-\epsilon, 1+\epsilon) A_t\big)

    This is IMPACT's eq. (3)-(4): the surrogate is clipped around the target network
    (not around :math:`\mu`, which can be many versions old, so PPO's trust region would
    be meaningless) and the off-policy gap :math:`\mu \to \pi_{\bar\theta}` is corrected by
    the truncated V-trace weight inside :math:`A_t`. The paper writes the unclipped term as
    :math:`\frac{\pi_\theta}{\mu}A` with an unclipped :math:`\pi_{\bar\theta}/\mu`;
    here (as in RLlib's APPO) both terms carry the truncated weight
    :math:`\min(\bar\rho_{pg},\rho)` through :math:`A`, which equals the paper's objective
    whenever :math:`\rho \le \bar\rho_{pg}` and bounds the variance otherwise.

    With ``tau=1`` and ``target_update_freq=1`` the target network is the policy at the
    start of the batch's update; on on-policy data (:math:`\mu` = that policy) the ratio is
    PPO's :math:`\pi_\theta/\mu` and :math:`\rho = 1` (tested).

    The value loss is PPO's (optionally clipped around the collection-time
    ``keys.STATE_VALUE`` with ``value_clip_epsilon``) towards :math:`v_t`; truncated
    episodes bootstrap from :math:`V` of the true final observation (V-trace's
    ``terminated`` / ``done`` semantics).

    Keys read: as :class:`PPOLoss` (``advantage`` and ``value_target`` written by
    ``rlkit.value.VTrace`` with ``target_actor=loss.target_actor.module``), plus
    ``keys.VTRACE_RHO`` for diagnostics and ``keys.TARGET_LOG_PROB`` (written by
    :meth:`record_target_log_prob`) when present.

    Writes: ``loss_policy``, ``loss_value``, ``loss_entropy`` and the diagnostics
    ``approx_kl`` (k3 estimate of KL(target network ‖ current), the KL that the adaptive
    learning rate controls), ``clip_fraction``, ``ratio_mean``, ``rho_mean`` (when the
    batch holds ``keys.VTRACE_RHO``) and those of :class:`PPOLoss`.

    Args:
        actor, critic: as :class:`PPOLoss`.
        tau: Polyak weight :math:`\tau \in (0, 1]` of the target update (1: copy).
        target_update_freq: update the target every this many learner steps (>= 1).
        clip_epsilon, value_clip_epsilon, entropy_coef, value_coef, normalize_advantage,
        value_loss, entropy_samples: as :class:`PPOLoss`.

    Attributes:
        target_actor: the :class:`~rlkit.modules.TargetNetwork` (its ``module`` is the
            frozen copy of ``actor``; its ``state_dict`` holds the copy and the step count).

    References: Luo et al. 2020, "IMPACT: Importance Weighted Asynchronous Architectures
    with Clipped Target Networks"; RLlib ``appo_torch_policy.py``; Espeholt et al. 2018.
    """

    _diagnostics = (*PPOLoss._diagnostics, RHO_MEAN)

    def __init__(
        self,
        actor: nn.Module,
        critic: nn.Module,
        *,
        tau: float = 1.0,
        target_update_freq: int = 1,
        clip_epsilon: float = 0.2,
        entropy_coef: float = 0.0,
        value_coef: float = 0.5,
        value_clip_epsilon: float | None = None,
        normalize_advantage: bool = True,
        value_loss: str = "mse",
        entropy_samples: int = 1,
    ) -> None:
        super().__init__(
            actor,
            critic,
            clip_epsilon=clip_epsilon,
            entropy_coef=entropy_coef,
            value_coef=value_coef,
            value_clip_epsilon=value_clip_epsilon,
            normalize_advantage=normalize_advantage,
            value_loss=value_loss,
            entropy_samples=entropy_samples,
        )
        if isinstance(tau, bool) or not isinstance(tau, int | float) or not 0 < tau <= 1:
            raise ValueError(
                f"APPOLoss: tau must be in (0, 1] (Polyak weight of the current policy in the "
                f"target network; 1 copies it), got {tau!r}"
            )
        if (
            isinstance(target_update_freq, bool)
            or not isinstance(target_update_freq, int)
            or target_update_freq < 1
        ):
            raise ValueError(
                f"APPOLoss: target_update_freq must be an int >= 1 (learner steps between "
                f"target updates), got {target_update_freq!r}"
            )
        # hidden from this module's parameters (a list), so optimisers built from the loss
        # never train the target; learners register it as a module for checkpoints
        self._target = [
            TargetNetwork(actor, mode="soft", tau=float(tau), period=target_update_freq)
        ]

    @property
    def target_actor(self) -> TargetNetwork:
        return self._target[0]

    def step_target(self) -> bool:
        """Count one learner step; Polyak-update the target when due. Returns whether it did."""
        return self.target_actor.step()

    def sync_target_buffers(self) -> None:
        """Copy the actor's buffers (observation-normaliser statistics) into the target."""
        target = self.target_actor
        with torch.no_grad():
            for t, s in zip(target.module.buffers(), target.source.buffers(), strict=True):
                t.copy_(s)

    @property
    def in_keys(self) -> list[NestedKey]:
        # optional: rho for the rho_mean diagnostic, the recorded target log-prob
        return [*super().in_keys, keys.VTRACE_RHO, keys.TARGET_LOG_PROB]

    def _required_keys(self) -> dict[NestedKey, str]:
        needs = super()._required_keys()
        needs[self.tensor_keys.action_log_prob] = WRITTEN_BY_BEHAVIOUR_ACTOR
        return needs

    def record_target_log_prob(self, tensordict: TensorDictBase) -> TensorDictBase:
        r"""Write :math:`\log\pi_{\bar\theta}(a|x)` to ``keys.TARGET_LOG_PROB`` for a whole
        batch, so its epochs x minibatches read it instead of re-running the target network
        in every minibatch (the target only moves in :meth:`step_target`, after the batch).
        Saves one target forward per minibatch (~12% of the APPO recipe's update time)."""
        tensordict.set(keys.TARGET_LOG_PROB, self._target_forward(tensordict))
        return tensordict

    def target_log_prob(self, tensordict: TensorDictBase) -> Tensor:
        r""":math:`\log\pi_{\bar\theta}(a|x)` at the stored action, ``[*batch]``, no grad:
        the recorded ``keys.TARGET_LOG_PROB`` when present, else the target network's."""
        recorded = tensordict.get(keys.TARGET_LOG_PROB, None)
        if recorded is not None:
            return recorded.reshape(tensordict.batch_size)
        return self._target_forward(tensordict)

    def _target_forward(self, tensordict: TensorDictBase) -> Tensor:
        module = self.target_actor.module
        with torch.no_grad():
            dist = actor_dist(module, tensordict)
            log_prob = dist.log_prob(tensordict.get(self.tensor_keys.action))
        return log_prob.reshape(tensordict.batch_size)

    def _policy_terms(
        self, log_prob: Tensor, advantage: Tensor, tensordict: TensorDictBase
    ) -> dict[str, Tensor]:
        log_ratio = log_prob - self.target_log_prob(tensordict)
        loss, clip_fraction = clipped_surrogate(
            log_ratio, advantage, clip_epsilon=self.clip_epsilon
        )
        log_ratio = log_ratio.detach()
        out = {
            LOSS_POLICY: loss,
            APPROX_KL: approx_kl(log_ratio),
            CLIP_FRACTION: clip_fraction,
            RATIO_MEAN: log_ratio.exp().mean(),
        }
        if self.diagnostics and tensordict.get(keys.VTRACE_RHO, None) is not None:
            out[RHO_MEAN] = read_per_sample(tensordict, keys.VTRACE_RHO, owner="APPOLoss").mean()
        return out
