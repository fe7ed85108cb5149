r"""Advantage actor-critic (A2C) loss as a TorchRL ``LossModule``."""

from __future__ import annotations

from tensordict import TensorDictBase
from torch import Tensor, nn

from rlkit.objectives.common import LOSS_POLICY, ActorCriticLoss
from rlkit.objectives.functional import policy_gradient_loss

__all__ = ["A2CLoss"]


class A2CLoss(ActorCriticLoss):
    r"""Synchronous advantage actor-critic: REINFORCE with a learned baseline.

    .. math::
        \text{loss\_policy} &= -\frac1N\sum_i A_i \log\pi_\theta(a_i|s_i) \\
        \text{loss\_value} &= c_v \frac1N\sum_i \tfrac12 (V_\phi(s_i) - \hat V_i)^2 \\
        \text{loss\_entropy} &= -c_H \frac1N\sum_i H[\pi_\theta(\cdot|s_i)]

    The advantage and target are constants (a value estimator wrote them); the data must
    be on-policy, so no importance ratio is applied (use :class:`~rlkit.objectives.PPOLoss`
    or a V-trace estimator for stale data).

    Keys read (defaults from :mod:`rlkit.keys`, renamable with ``set_keys``): the actor's
    and critic's ``in_keys`` (``keys.OBSERVATION``); ``keys.ACTION`` ``[*, *A]``;
    ``keys.ADVANTAGE`` ``[*, 1]`` and ``keys.VALUE_TARGET`` ``[*, 1]`` from a value
    estimator (``rlkit.value``). ``keys.ACTION_LOG_PROB`` is not needed: log π is
    recomputed with gradients. Nothing is written into the batch.

    Writes: ``loss_policy``, ``loss_value``, ``loss_entropy`` (weighted; sum them) and the
    detached diagnostics ``entropy``, ``explained_variance``, ``value_mean``,
    ``advantage_mean``, ``advantage_std``.

    Args:
        actor: a ``ProbabilisticActor`` (anything with ``get_dist(td)`` and ``in_keys``)
            whose ``log_prob`` has one value per sample.
        critic: a TensorDict module writing ``keys.STATE_VALUE`` ``[*, 1]``.
        entropy_coef: :math:`c_H \ge 0`, typically 0 to 0.01 (SB3's A2C uses 0).
        value_coef: :math:`c_v \ge 0`, default 0.5, applied to the 1/2-squared error.
        normalize_advantage: standardise the advantage within each batch passed to the
            loss (default ``False``, as in SB3's A2C).
        value_loss: ``"mse"`` (default) or ``"huber"`` (δ = 1).
        entropy_samples: Monte-Carlo samples for distributions without a closed-form
            entropy (TanhNormal); default 1.

    Gradient routing: ``loss_policy`` and ``loss_entropy`` reach only the actor's
    parameters, ``loss_value`` only the critic's (when the networks share nothing).

    References: Mnih et al. 2016, "Asynchronous Methods for Deep Reinforcement Learning";
    ``openai/baselines`` ``a2c/a2c.py``; SB3 ``a2c/a2c.py``. Deviation: SB3 uses the squared
    error without the 1/2 (its ``vf_coef=0.5`` equals ``value_coef=1.0`` here).

    Example:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> from torchrl.modules import ProbabilisticActor
        >>> from rlkit import keys
        >>> from rlkit.objectives import A2CLoss, total_loss
        >>> actor = ProbabilisticActor(
        ...     TensorDictModule(torch.nn.Linear(3, 2), [keys.OBSERVATION], [keys.LOGITS]),
        ...     in_keys=[keys.LOGITS], distribution_class=torch.distributions.Categorical)
        >>> critic = TensorDictModule(torch.nn.Linear(3, 1), [keys.OBSERVATION],
        ...                           [keys.STATE_VALUE])
        >>> td = actor(TensorDict({keys.OBSERVATION: torch.randn(5, 3)}, batch_size=[5]))
        >>> td[keys.ADVANTAGE] = torch.randn(5, 1)    # normally written by rlkit.value.GAE
        >>> td[keys.VALUE_TARGET] = torch.randn(5, 1)
        >>> out = A2CLoss(actor, critic)(td)
        >>> sorted(k for k in out.keys() if k.startswith("loss_"))
        ['loss_entropy', 'loss_policy', 'loss_value']
        >>> total_loss(out).backward()
    """

    def __init__(
        self,
        actor: nn.Module,
        critic: nn.Module,
        *,
        entropy_coef: float = 0.0,
        value_coef: float = 0.5,
        normalize_advantage: bool = False,
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

    def _policy_terms(
        self, log_prob: Tensor, advantage: Tensor, tensordict: TensorDictBase
    ) -> dict[str, Tensor]:
        return {LOSS_POLICY: policy_gradient_loss(log_prob, advantage)}
