r"""PPO's clipped-surrogate loss (PPO2 / CleanRL semantics) as a TorchRL ``LossModule``."""

from __future__ import annotations

from tensordict import NestedKey, TensorDictBase
from torch import Tensor, nn

from rlkit.objectives.common import (
    APPROX_KL,
    CLIP_FRACTION,
    LOSS_POLICY,
    RATIO_MEAN,
    WRITTEN_BY_BEHAVIOUR_ACTOR,
    WRITTEN_BY_COLLECTION_CRITIC,
    ActorCriticLoss,
    Hyperparameter,
    read_column,
    read_per_sample,
)
from rlkit.objectives.functional import approx_kl, clipped_surrogate, clipped_value_loss

__all__ = ["PPOLoss"]


class PPOLoss(ActorCriticLoss):
    r"""Proximal Policy Optimization, clipped objective.

    With :math:`r_i = \pi_\theta(a_i|s_i) / \mu(a_i|s_i)` (μ: the policy that collected the
    data, whose log-prob is stored in the batch) and advantages :math:`A_i` written by a
    value estimator:

    .. math::
        \text{loss\_policy} &= -\frac1N\sum_i \min\big(r_i A_i,\
            \mathrm{clip}(r_i, 1-\epsilon, 1+\epsilon) A_i\big) \\
        \text{loss\_value} &= c_v \frac1N\sum_i \tfrac12 (V_\phi(s_i) - \hat V_i)^2
            \quad\text{or, with value clipping,}\quad
            c_v \frac1N\sum_i \tfrac12\max\big((V_\phi - \hat V_i)^2,
            (V^{clip}_i - \hat V_i)^2\big) \\
        V^{clip}_i &= V^{old}_i + \mathrm{clip}(V_\phi(s_i) - V^{old}_i, -\epsilon_v, \epsilon_v) \\
        \text{loss\_entropy} &= -c_H \frac1N\sum_i H[\pi_\theta(\cdot|s_i)]

    Keys read (defaults from :mod:`rlkit.keys`, renamable with ``set_keys``):

    * the actor's and critic's ``in_keys`` (``keys.OBSERVATION``);
    * ``keys.ACTION`` ``[*, *A]`` (int64 ``[*]`` for discrete actions);
    * ``keys.ACTION_LOG_PROB`` ``[*]`` or ``[*, 1]``: log μ(a|s), stored at collection;
    * ``keys.ADVANTAGE`` ``[*, 1]`` and ``keys.VALUE_TARGET`` ``[*, 1]``, written by a
      value estimator (``rlkit.value``); a missing one raises ``MissingKeyError``;
    * ``keys.STATE_VALUE`` ``[*, 1]``, only with ``value_clip_epsilon``: :math:`V^{old}`,
      the collection-time value. The loss computes :math:`V_\phi` into a local tensor and
      never writes into the batch, so this stays the collection-time value across epochs.

    Writes (a TensorDict with no batch dimensions): ``loss_policy``, ``loss_value``,
    ``loss_entropy`` (weighted; sum them, see :func:`rlkit.objectives.total_loss`) and the
    detached diagnostics ``approx_kl`` (k3 estimator of KL(μ‖π)), ``clip_fraction``
    (share of samples with :math:`|r - 1| > \epsilon`), ``ratio_mean``, ``entropy``,
    ``explained_variance``, ``value_mean``, ``advantage_mean``, ``advantage_std``.

    Args:
        actor: a ``ProbabilisticActor`` (anything with ``get_dist(td)`` and ``in_keys``)
            whose ``log_prob`` has one value per sample (Categorical, IndependentNormal,
            TanhNormal).
        critic: a TensorDict module writing ``keys.STATE_VALUE`` ``[*, 1]``.
        clip_epsilon: :math:`\epsilon > 0`, typically 0.1 to 0.3. Assignable
            (``loss.clip_epsilon = 0.1``) for schedules; validated on assignment.
        entropy_coef: :math:`c_H \ge 0`, typically 0 to 0.01.
        value_coef: :math:`c_v \ge 0`, typically 0.5 (with the 1/2 above, as PPO2/CleanRL).
        value_clip_epsilon: :math:`\epsilon_v > 0` to clip the value update (PPO2 uses the
            policy's clip range), or ``None`` (default) for the plain regression loss.
        normalize_advantage: standardise the advantage within each minibatch,
            :math:`(A - \bar A)/(\mathrm{std}(A) + 10^{-8})`, as SB3 and CleanRL do
            (default ``True``). For per-batch standardisation apply
            :func:`rlkit.objectives.standardize` to the batch before minibatching and pass
            ``False``.
        value_loss: ``"mse"`` (default) or ``"huber"`` (δ = 1, equal to the 1/2-squared
            error for errors below 1).
        entropy_samples: Monte-Carlo samples for distributions without a closed-form
            entropy (TanhNormal); default 1.

    Gradient routing: ``loss_policy`` and ``loss_entropy`` reach only the actor's
    parameters, ``loss_value`` only the critic's (when the networks share nothing).

    References: Schulman et al. 2017, "Proximal Policy Optimization Algorithms";
    ``openai/baselines`` ``ppo2/model.py``; CleanRL ``ppo.py``.

    Deviations from TorchRL's ``ClipPPOLoss``: PPO2 defaults (squared error with the 1/2,
    ``value_coef=0.5``); value clipping uses the stored collection-time value, never a
    value the loss wrote itself; no implicit advantage computation.

    Example:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> from torchrl.modules import ProbabilisticActor
        >>> from rlkit import keys
        >>> from rlkit.objectives import PPOLoss, total_loss
        >>> actor = ProbabilisticActor(
        ...     TensorDictModule(torch.nn.Linear(3, 2), [keys.OBSERVATION], [keys.LOGITS]),
        ...     in_keys=[keys.LOGITS], distribution_class=torch.distributions.Categorical,
        ...     return_log_prob=True, log_prob_key=keys.ACTION_LOG_PROB)
        >>> critic = TensorDictModule(torch.nn.Linear(3, 1), [keys.OBSERVATION],
        ...                           [keys.STATE_VALUE])
        >>> td = actor(TensorDict({keys.OBSERVATION: torch.randn(5, 3)}, batch_size=[5]))
        >>> td[keys.ADVANTAGE] = torch.randn(5, 1)    # normally written by rlkit.value.GAE
        >>> td[keys.VALUE_TARGET] = torch.randn(5, 1)
        >>> out = PPOLoss(actor, critic, entropy_coef=0.01)(td)
        >>> sorted(k for k in out.keys() if k.startswith("loss_"))
        ['loss_entropy', 'loss_policy', 'loss_value']
        >>> float(out["approx_kl"])  # on-policy: the policies agree
        0.0
        >>> total_loss(out).backward()
    """

    clip_epsilon = Hyperparameter(positive=True, hint="typical 0.1 to 0.3")
    value_clip_epsilon = Hyperparameter(positive=True, optional=True, hint="or None: no clip")

    _diagnostics = (APPROX_KL, CLIP_FRACTION, RATIO_MEAN, *ActorCriticLoss._diagnostics)

    def __init__(
        self,
        actor: nn.Module,
        critic: nn.Module,
        *,
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
            entropy_coef=entropy_coef,
            value_coef=value_coef,
            normalize_advantage=normalize_advantage,
            value_loss=value_loss,
            entropy_samples=entropy_samples,
        )
        self.clip_epsilon = clip_epsilon
        self.value_clip_epsilon = value_clip_epsilon

    def extra_repr(self) -> str:
        clips = (
            f"clip_epsilon={self.clip_epsilon!r}, value_clip_epsilon={self.value_clip_epsilon!r}"
        )
        return f"{clips}, {super().extra_repr()}"

    def _required_keys(self) -> dict[NestedKey, str]:
        needs = super()._required_keys()
        needs[self.tensor_keys.action_log_prob] = WRITTEN_BY_BEHAVIOUR_ACTOR
        if self.value_clip_epsilon is not None:
            needs[self.tensor_keys.state_value] = WRITTEN_BY_COLLECTION_CRITIC
        return needs

    def _policy_terms(
        self, log_prob: Tensor, advantage: Tensor, tensordict: TensorDictBase
    ) -> dict[str, Tensor]:
        key = self.tensor_keys.action_log_prob
        behaviour_log_prob = read_per_sample(tensordict, key, owner="PPOLoss").detach()
        log_ratio = log_prob - behaviour_log_prob
        loss, clip_fraction = clipped_surrogate(
            log_ratio, advantage, clip_epsilon=self.clip_epsilon
        )
        log_ratio = log_ratio.detach()
        return {
            LOSS_POLICY: loss,
            APPROX_KL: approx_kl(log_ratio),
            CLIP_FRACTION: clip_fraction,
            RATIO_MEAN: log_ratio.exp().mean(),
        }

    def _value_loss(self, value: Tensor, target: Tensor, tensordict: TensorDictBase) -> Tensor:
        if self.value_clip_epsilon is None:
            return super()._value_loss(value, target, tensordict)
        old_value = read_column(tensordict, self.tensor_keys.state_value, owner="PPOLoss")
        return clipped_value_loss(
            value,
            old_value,
            target,
            clip_epsilon=self.value_clip_epsilon,
            loss_type=self.value_loss,
        )
