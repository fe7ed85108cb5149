r"""Pure loss maths for policy-gradient objectives: tensors in, tensors out.

No TensorDict, no modules, keyword-only hyperparameters. The loss modules in
:mod:`rlkit.objectives` read keys, call these functions and write ``loss_*`` terms; a
researcher composing a new loss calls them directly. Every function that combines two
per-sample tensors requires equal shapes (a ``[B]`` advantage against a ``[B, 1]`` ratio
would otherwise broadcast to ``[B, B]`` and silently give a wrong loss).

Notation: :math:`r = \pi_\theta(a|s) / \mu(a|s) = \exp(\text{log\_ratio})`, :math:`A` the
advantage, :math:`V` the current value prediction, :math:`\hat V` the value target,
:math:`V_{old}` the value recorded at collection time, :math:`\epsilon` a clip range.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor
from torch.nn import functional as F

ValueLossType = Literal["mse", "huber"]
VALUE_LOSS_TYPES: tuple[str, ...] = ("mse", "huber")

__all__ = [
    "VALUE_LOSS_TYPES",
    "approx_kl",
    "clipped_surrogate",
    "clipped_value_loss",
    "explained_variance",
    "policy_gradient_loss",
    "standardize",
    "value_loss",
]


def _check_same_shape(**tensors: Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) > 1:
        listed = ", ".join(f"{name} {list(shape)}" for name, shape in shapes.items())
        raise ValueError(
            f"shape mismatch: {listed}. These per-sample tensors must have the same shape "
            "(broadcasting [B] against [B, 1] gives a wrong [B, B] loss); squeeze or "
            "unsqueeze the trailing dimension so they agree."
        )


def standardize(x: Tensor, *, eps: float = 1e-8) -> Tensor:
    r"""Standardise over all elements: :math:`(x - \bar x) / (\mathrm{std}(x) + \varepsilon)`.

    ``std`` is the unbiased sample standard deviation, as in SB3 and CleanRL. A tensor with
    fewer than two elements has no spread to divide by and is returned unchanged (SB3 skips
    normalisation for a single-sample minibatch for the same reason).

    Use it for per-batch advantage standardisation before minibatching
    (``td[keys.ADVANTAGE] = standardize(td[keys.ADVANTAGE])``); the losses' own
    ``normalize_advantage=True`` applies it per minibatch.

    Example:
        >>> standardize(torch.tensor([1.0, 2.0, 3.0]))
        tensor([-1.,  0.,  1.])
    """
    if x.numel() < 2:
        return x
    return (x - x.mean()) / (x.std() + eps)


def clamp(x: Tensor, low: float | Tensor, high: float | Tensor) -> Tensor:
    """``x.clamp(low, high)`` with float bounds' gradient also for tensor bounds.

    A scheduled hyperparameter of a compiled loss is a 0-dim float64 tensor (see
    :class:`rlkit.objectives.common.Hyperparameter`). ``clamp`` with tensor bounds passes
    half the gradient to an element exactly at a bound, with float bounds none; and float
    bounds are rounded to ``x``'s dtype before comparing. Both are kept here.
    """
    if not isinstance(low, Tensor) and not isinstance(high, Tensor):
        return x.clamp(low, high)
    low = torch.as_tensor(low, dtype=x.dtype, device=x.device)
    high = torch.as_tensor(high, dtype=x.dtype, device=x.device)
    inside = (x > low) & (x < high)
    return torch.where(inside, x, x.detach().clamp(low, high))


def clipped_surrogate(
    log_ratio: Tensor, advantage: Tensor, *, clip_epsilon: float
) -> tuple[Tensor, Tensor]:
    r"""PPO's clipped surrogate loss and the fraction of clipped samples.

    .. math::
        L = -\frac{1}{N}\sum_i \min\big(r_i A_i,\
            \mathrm{clip}(r_i, 1-\epsilon, 1+\epsilon) A_i\big), \qquad
        \text{clip\_fraction} = \frac{1}{N}\sum_i [\,|r_i - 1| > \epsilon\,]

    At :math:`r = 1` the gradient equals the vanilla policy gradient
    :math:`-\frac1N\sum_i A_i \nabla \log\pi(a_i|s_i)`.

    Args:
        log_ratio: :math:`\log\pi_\theta(a|s) - \log\mu(a|s)`, any shape ``[*]``.
        advantage: same shape as ``log_ratio``; treated as a constant.
        clip_epsilon: clip range :math:`\epsilon > 0`, typically 0.1 to 0.3.

    Returns:
        ``(loss, clip_fraction)``: scalars; ``clip_fraction`` is detached.

    Reference: Schulman et al. 2017, "Proximal Policy Optimization Algorithms", eq. (7);
    ``baselines/ppo2/model.py``.
    """
    _check_same_shape(log_ratio=log_ratio, advantage=advantage)
    ratio = log_ratio.exp()
    advantage = advantage.detach()
    clipped_ratio = clamp(ratio, 1.0 - clip_epsilon, 1.0 + clip_epsilon)
    loss = -torch.minimum(ratio * advantage, clipped_ratio * advantage).mean()
    clip_fraction = ((ratio.detach() - 1.0).abs() > clip_epsilon).float().mean()
    return loss, clip_fraction


def policy_gradient_loss(log_prob: Tensor, advantage: Tensor) -> Tensor:
    r"""REINFORCE with a baseline: :math:`L = -\frac1N\sum_i A_i \log\pi_\theta(a_i|s_i)`.

    ``advantage`` (same shape as ``log_prob``) is treated as a constant.

    Reference: Williams 1992; Mnih et al. 2016 (A3C), the policy term.
    """
    _check_same_shape(log_prob=log_prob, advantage=advantage)
    return -(log_prob * advantage.detach()).mean()


def _pointwise_value_loss(error: Tensor, loss_type: str) -> Tensor:
    if loss_type == "mse":
        return 0.5 * error.square()
    if loss_type == "huber":
        return F.huber_loss(error, torch.zeros_like(error), reduction="none", delta=1.0)
    raise ValueError(f"loss_type must be one of {VALUE_LOSS_TYPES}, got {loss_type!r}.")


def value_loss(value: Tensor, target: Tensor, *, loss_type: ValueLossType = "mse") -> Tensor:
    r"""Regression loss of a value prediction on its target, averaged over samples.

    ``"mse"``: :math:`\frac1N\sum_i \tfrac12 (V_i - \hat V_i)^2`. ``"huber"``: the Huber loss
    with :math:`\delta = 1` (:math:`\tfrac12 e^2` for :math:`|e| < 1`, else
    :math:`|e| - \tfrac12`), which equals the ``"mse"`` loss for small errors.
    ``target`` (same shape as ``value``) is treated as a constant.
    """
    _check_same_shape(value=value, target=target)
    return _pointwise_value_loss(value - target.detach(), loss_type).mean()


def clipped_value_loss(
    value: Tensor,
    old_value: Tensor,
    target: Tensor,
    *,
    clip_epsilon: float,
    loss_type: ValueLossType = "mse",
) -> Tensor:
    r"""PPO2's clipped value loss.

    .. math::
        V^{clip} = V_{old} + \mathrm{clip}(V - V_{old}, -\epsilon, \epsilon), \qquad
        L = \frac1N\sum_i \max\big(\ell(V_i - \hat V_i),\ \ell(V^{clip}_i - \hat V_i)\big)

    with :math:`\ell(e) = \tfrac12 e^2` (``"mse"``) or the Huber loss (``"huber"``).
    ``old_value`` must be the value recorded when the data was collected, not a value
    recomputed since; ``old_value`` and ``target`` are treated as constants.

    Reference: ``baselines/ppo2/model.py`` (``vpredclipped``); CleanRL ``ppo.py``
    (``clip_vloss``).
    """
    _check_same_shape(value=value, old_value=old_value, target=target)
    old_value, target = old_value.detach(), target.detach()
    clipped = old_value + clamp(value - old_value, -clip_epsilon, clip_epsilon)
    unclipped_loss = _pointwise_value_loss(value - target, loss_type)
    clipped_loss = _pointwise_value_loss(clipped - target, loss_type)
    return torch.maximum(unclipped_loss, clipped_loss).mean()


def approx_kl(log_ratio: Tensor) -> Tensor:
    r"""Low-variance estimate of :math:`\mathrm{KL}(\mu \,\|\, \pi_\theta)` from samples of μ.

    .. math:: \widehat{\mathrm{KL}} = \frac1N\sum_i \big((r_i - 1) - \log r_i\big)

    Unbiased and non-negative per sample; zero exactly when the policies agree on the
    batch. Differentiable (detach it for logging).

    Reference: J. Schulman, "Approximating KL Divergence" (2020), estimator k3.
    """
    return (log_ratio.exp() - 1.0 - log_ratio).mean()


def explained_variance(value: Tensor, target: Tensor) -> Tensor:
    r""":math:`1 - \mathrm{Var}[\hat V - V] / \mathrm{Var}[\hat V]`, over all elements.

    1 is a perfect fit, 0 no better than predicting the mean, negative worse. NaN when the
    target is constant (``Var = 0``), as in SB3. Population variances; detached.
    """
    _check_same_shape(value=value, target=target)
    value, target = value.detach(), target.detach()
    target_var = target.var(correction=0)
    ratio = (target - value).var(correction=0) / target_var
    return torch.where(target_var > 0, 1.0 - ratio, torch.full_like(ratio, float("nan")))
