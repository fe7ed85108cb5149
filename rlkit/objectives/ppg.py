r"""PPG's auxiliary-phase loss (Cobbe et al. 2020) as a TorchRL ``LossModule``.

The policy phase of PPG is plain PPO (:class:`rlkit.objectives.PPOLoss`); this module is the
auxiliary phase: distil value knowledge into the policy network through an auxiliary value
head while a behavioural-cloning KL keeps the policy where it was, and keep fitting the
true value function.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import NestedKey, TensorDict, TensorDictBase
from torch import Tensor, nn
from torch.distributions import Distribution, kl_divergence

from rlkit import keys
from rlkit.modules.direct import actor_dist, module_output
from rlkit.objectives.common import (
    EXPLAINED_VARIANCE,
    LOSS_VALUE,
    READ_BY_NETWORK,
    WRITTEN_BY_ESTIMATOR,
    Hyperparameter,
    LossBase,
    _check_networks,
    read_column,
    require_keys,
)
from rlkit.objectives.functional import (
    VALUE_LOSS_TYPES,
    clipped_value_loss,
    explained_variance,
    value_loss,
)

__all__ = [
    "AUX_STATE_VALUE",
    "LOSS_AUX_VALUE",
    "LOSS_DISTILL",
    "PRE_AUX",
    "PPGAuxLoss",
    "policy_kl",
]

#: Keys the auxiliary phase reads and writes (documented in :mod:`rlkit.keys`).
AUX_STATE_VALUE = keys.AUX_STATE_VALUE
PRE_AUX = keys.PRE_AUX

LOSS_AUX_VALUE = "loss_aux_value"
LOSS_DISTILL = "loss_distill"
UNSCALED = "unscaled_"
AUX_EXPLAINED_VARIANCE = "aux_explained_variance"
KL_MAX = "kl_max"

WRITTEN_BY_RECORDING = (
    "the auxiliary phase records the policy's distribution (and V(s)) over its whole buffer "
    "before its first update: call rlkit.algorithms.ppg.record_pre_aux(actor, critic, td) first"
)


def policy_kl(old: Distribution, new: Distribution, *, num_samples: int = 1) -> Tensor:
    r"""Per-sample :math:`\mathrm{KL}(\pi_{old}(\cdot|s) \,\|\, \pi_\theta(\cdot|s))`.

    Closed form where torch registers one (Categorical, Normal, torchrl's IndependentNormal);
    otherwise (TanhNormal) the Monte-Carlo estimate
    :math:`\frac1K\sum_k \log\pi_{old}(x_k) - \log\pi_\theta(x_k)`, :math:`x_k\sim\pi_{old}`,
    whose gradient in :math:`\theta` is unbiased. Shape: the distributions' batch shape.
    """
    try:
        return kl_divergence(old, new)
    except NotImplementedError:
        with torch.no_grad():
            x = old.sample(torch.Size([num_samples]))
            old_log_prob = old.log_prob(x)
        return (old_log_prob - new.log_prob(x)).mean(0)


class PPGAuxLoss(LossBase):
    r"""Phasic Policy Gradient, auxiliary phase.

    .. math::
        \text{loss\_aux\_value} &= c_{aux}\,\frac1N\sum_i \tfrac12
            \big(V^{aux}_\theta(s_i) - \hat V_i\big)^2 \\
        \text{loss\_distill} &= \beta_{clone}\,\frac1N\sum_i
            \mathrm{KL}\big(\pi_{old}(\cdot|s_i)\,\|\,\pi_\theta(\cdot|s_i)\big) \\
        \text{loss\_value} &= c_v\,\frac1N\sum_i \tfrac12 \big(V_\phi(s_i) - \hat V_i\big)^2
            \quad\text{(or PPO2-clipped around } V^{old}_i\text{)}

    :math:`L^{joint} = \text{loss\_aux\_value} + \text{loss\_distill}` is the paper's joint
    loss (eq. 2); ``loss_value`` is its value-function distillation step, taken on the
    same minibatch (one backward of the sum, as in the reference's ``aux_train``).
    :math:`\pi_{old}` is the policy recorded before the phase's first update and
    :math:`\hat V` the value targets computed in the policy phase.

    Keys read: the networks' ``in_keys`` (``observation``); ``value_target`` ``[*, 1]``;
    ``(PRE_AUX, <param>)`` for each distribution parameter of the actor (``logits``, or
    ``loc`` and ``scale``); ``(PRE_AUX, "state_value")`` ``[*, 1]`` only with
    ``value_clip_epsilon``. The aux critic writes ``AUX_STATE_VALUE`` ``[*, 1]``, the
    critic ``state_value`` ``[*, 1]``.

    Writes: ``loss_aux_value``, ``loss_distill``, ``loss_value`` (scaled: sum them) and,
    detached, the unscaled terms ``unscaled_loss_aux_value``, ``unscaled_loss_distill``,
    ``unscaled_loss_value`` (as the reference logs ``scaled/`` and ``unscaled/``),
    ``kl_max`` (largest per-sample KL), ``explained_variance``, ``aux_explained_variance``.

    Args:
        actor: ``ProbabilisticActor`` (``get_dist``, ``build_dist_from_params``).
        critic: the true value network, writing ``state_value``.
        aux_critic: the auxiliary value head on the policy network, writing
            ``AUX_STATE_VALUE``.
        beta_clone: :math:`\beta_{clone} \ge 0` (paper: 1).
        aux_value_coef: :math:`c_{aux} \ge 0` (paper: 1).
        value_coef: :math:`c_v \ge 0` (reference: 1).
        value_clip_epsilon: clip the true value's move around ``(PRE_AUX, state_value)``;
            ``None`` (default, as the paper) for the plain regression.
        value_loss: ``"mse"`` or ``"huber"``.
        kl_samples: samples of the Monte-Carlo KL when there is no closed form.

    Gradient routing: ``loss_aux_value`` reaches the aux head and the policy network's
    trunk, ``loss_distill`` the policy head and trunk, ``loss_value`` only the critic (in the
    shared layout: only the value head, which reads detached trunk features).

    Reference: Cobbe, Hilton, Klimov, Schulman 2020, "Phasic Policy Gradient", Algorithm 1;
    ``openai/phasic-policy-gradient`` ``ppg.py`` (``aux_train``, ``compute_aux_loss``).

    Example:
        >>> from rlkit.modules import categorical_actor, value_critic
        >>> from torchrl.modules import ValueOperator
        >>> actor, critic = categorical_actor(3, 2), value_critic(3)
        >>> aux = ValueOperator(torch.nn.Linear(3, 1), in_keys=["observation"],
        ...                     out_keys=[AUX_STATE_VALUE])
        >>> td = TensorDict({"observation": torch.randn(6, 3),
        ...                  "value_target": torch.randn(6, 1)}, [6])
        >>> from rlkit.algorithms.ppg import record_pre_aux
        >>> td = record_pre_aux(actor, critic, td)
        >>> out = PPGAuxLoss(actor, critic, aux)(td)
        >>> float(out["unscaled_loss_distill"])  # the recorded policy is the current one
        0.0
    """

    beta_clone = Hyperparameter(positive=False, hint="paper: 1")
    aux_value_coef = Hyperparameter(positive=False, hint="paper: 1")
    value_coef = Hyperparameter(positive=False, hint="reference: 1")
    value_clip_epsilon = Hyperparameter(positive=True, optional=True, hint="or None: no clip")

    @dataclass
    class _AcceptedKeys:
        value_target: NestedKey = keys.VALUE_TARGET
        state_value: NestedKey = keys.STATE_VALUE
        aux_state_value: NestedKey = AUX_STATE_VALUE

    def __init__(
        self,
        actor: nn.Module,
        critic: nn.Module,
        aux_critic: nn.Module,
        *,
        beta_clone: float = 1.0,
        aux_value_coef: float = 1.0,
        value_coef: float = 1.0,
        value_clip_epsilon: float | None = None,
        value_loss: str = "mse",
        kl_samples: int = 1,
    ) -> None:
        super().__init__()
        _check_networks("PPGAuxLoss", actor, critic)
        _check_networks("PPGAuxLoss", actor, aux_critic)
        if self.tensor_keys.aux_state_value not in list(aux_critic.out_keys):
            raise TypeError(
                f"PPGAuxLoss: the aux critic writes {list(aux_critic.out_keys)}; build it with "
                f"out_keys=[{AUX_STATE_VALUE!r}] (rlkit.objectives.ppg.AUX_STATE_VALUE)."
            )
        if value_loss not in VALUE_LOSS_TYPES:
            raise ValueError(
                f"PPGAuxLoss: value_loss must be one of {VALUE_LOSS_TYPES}, got {value_loss!r}."
            )
        if isinstance(kl_samples, bool) or not isinstance(kl_samples, int) or kl_samples < 1:
            raise ValueError(f"PPGAuxLoss: kl_samples must be an int >= 1, got {kl_samples!r}.")
        self.actor, self.critic, self.aux_critic = actor, critic, aux_critic
        self.beta_clone = beta_clone
        self.aux_value_coef = aux_value_coef
        self.value_coef = value_coef
        self.value_clip_epsilon = value_clip_epsilon
        self.value_loss, self.kl_samples = value_loss, kl_samples

    @classmethod
    def default_keys(cls) -> _AcceptedKeys:
        return cls._AcceptedKeys()

    @property
    def dist_keys(self) -> list[NestedKey]:
        """The actor's distribution parameters (``logits``, or ``loc`` and ``scale``)."""
        return list(self.actor[-1].in_keys)

    @property
    def network_keys(self) -> list[NestedKey]:
        found: list[NestedKey] = []
        for key in [*self.actor.in_keys, *self.critic.in_keys, *self.aux_critic.in_keys]:
            if key not in found:
                found.append(key)
        return found

    @property
    def in_keys(self) -> list[NestedKey]:
        return [
            *self.network_keys,
            *[k for k in self._required_keys() if k not in self.network_keys],
        ]

    @property
    def out_keys(self) -> list[str]:
        terms = [LOSS_AUX_VALUE, LOSS_DISTILL, LOSS_VALUE]
        return [*terms, *(UNSCALED + t for t in terms), KL_MAX, EXPLAINED_VARIANCE]

    def _required_keys(self) -> dict[NestedKey, str]:
        needs = dict.fromkeys(self.network_keys, READ_BY_NETWORK)
        needs[self.tensor_keys.value_target] = WRITTEN_BY_ESTIMATOR
        for key in self.dist_keys:
            needs[(PRE_AUX, key)] = WRITTEN_BY_RECORDING
        if self.value_clip_epsilon is not None:
            needs[(PRE_AUX, keys.STATE_VALUE)] = WRITTEN_BY_RECORDING
        return needs

    def _value(self, net: nn.Module, key: NestedKey, td: TensorDictBase) -> Tensor:
        value = module_output(net, td, key)
        if value.shape != (*td.batch_size, 1):
            raise ValueError(
                f"PPGAuxLoss: {keys.describe(key)} has shape {list(value.shape)}, expected "
                f"{[*td.batch_size, 1]}: end the value head with a Linear(..., 1)."
            )
        return value.squeeze(-1)

    def old_distribution(self, td: TensorDictBase) -> Distribution:
        """The policy recorded before the auxiliary phase, rebuilt from ``PRE_AUX``."""
        params = {k: td.get((PRE_AUX, k)).detach() for k in self.dist_keys}
        return self.actor.build_dist_from_params(TensorDict(params, batch_size=td.batch_size))

    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        require_keys(tensordict, self._required_keys(), owner="PPGAuxLoss")
        target = read_column(tensordict, self.tensor_keys.value_target, owner="PPGAuxLoss")
        target = target.detach()
        new_dist = actor_dist(self.actor, tensordict)
        kl = policy_kl(self.old_distribution(tensordict), new_dist, num_samples=self.kl_samples)
        aux = self._value(self.aux_critic, self.tensor_keys.aux_state_value, tensordict)
        value = self._value(self.critic, self.tensor_keys.state_value, tensordict)
        if self.value_clip_epsilon is None:
            true_value_loss = value_loss(value, target, loss_type=self.value_loss)
        else:
            old = read_column(tensordict, (PRE_AUX, keys.STATE_VALUE), owner="PPGAuxLoss")
            true_value_loss = clipped_value_loss(
                value,
                old,
                target,
                clip_epsilon=self.value_clip_epsilon,
                loss_type=self.value_loss,
            )
        unscaled = {
            LOSS_AUX_VALUE: value_loss(aux, target, loss_type=self.value_loss),
            LOSS_DISTILL: kl.mean(),
            LOSS_VALUE: true_value_loss,
        }
        coefs = {
            LOSS_AUX_VALUE: self.aux_value_coef,
            LOSS_DISTILL: self.beta_clone,
            LOSS_VALUE: self.value_coef,
        }
        out: dict[str, Tensor] = {k: coefs[k] * v for k, v in unscaled.items()}
        # the unscaled terms as views of one new tensor, not detached aliases of the terms:
        # under torch.compile (inductor folds ``1.0 * v`` to ``v``) an output that is a
        # detached alias of another took that output's gradient away (torch 2.14)
        detached = torch.stack(list(unscaled.values())).detach()
        out |= {UNSCALED + k: detached[i] for i, k in enumerate(unscaled)}
        out[KL_MAX] = kl.detach().max()
        out[EXPLAINED_VARIANCE] = explained_variance(value, target)
        out[AUX_EXPLAINED_VARIANCE] = explained_variance(aux, target)
        return TensorDict(out, batch_size=[])
