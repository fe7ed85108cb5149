r"""SAC: soft actor-critic with twin Q networks, target Qs and a learned temperature.

Continuous actions (:class:`SACLoss`; Haarnoja et al. 2018, "SAC: Algorithms and
Applications"), with :math:`\tilde a \sim \pi_\phi(\cdot|s)` reparameterised (tanh-squashed
Gaussian) and :math:`\alpha = e^{\log\alpha}`:

.. math::
    y &= R + \gamma' (1 - d) \big[\min_{j=1,2} \bar Q_j(s', a') - \alpha \log\pi(a'|s')\big],
        \quad a' \sim \pi(\cdot|s') \\
    L_Q &= \tfrac12 \sum_{j=1,2} \frac1B \sum_i w_i (Q_j(s_i, a_i) - y_i)^2 \\
    L_\pi &= \frac1B \sum_i \alpha \log\pi(\tilde a_i|s_i) - \min_j Q_j(s_i, \tilde a_i) \\
    L_\alpha &= -\frac1B \sum_i \log\alpha \, \big(\log\pi(\tilde a_i|s_i) + \bar H\big)

with prioritized replay's importance weights :math:`w_i` (1 for uniform replay; see
:class:`~rlkit.objectives.DQNLoss` for their ``"max"``/``"sum"`` normalisation) and target
entropy :math:`\bar H = -\dim(A)` by default. :math:`L_\alpha` lowers
:math:`\alpha` when the policy's entropy is above :math:`\bar H` and raises it below.

Discrete actions (:class:`DiscreteSACLoss`; Christodoulou 2019) take the expectations over
the :math:`n` actions exactly instead of sampling:

.. math::
    y &= R + \gamma' (1 - d) \sum_a \pi(a|s') [\min_j \bar Q_j(s', a) - \alpha\log\pi(a|s')] \\
    L_\pi &= \frac1B\sum_i \sum_a \pi(a|s_i) \big[\alpha \log\pi(a|s_i) - \min_j Q_j(s_i, a)\big] \\
    L_\alpha &= \frac1B\sum_i \log\alpha \, \big(H[\pi(\cdot|s_i)] - \bar H\big)

with :math:`\bar H = 0.98 \log n` by default (98% of the uniform policy's entropy).

Gradient routing: :math:`L_Q` reaches only the Q networks (the target is computed without
gradient), :math:`L_\pi` only the actor (the Q networks are frozen while it is computed, so
their parameters get no gradient, while the gradient still flows through the action; under
``--compile`` they are not frozen, and the gradient they get is never stepped), and
:math:`L_\alpha` only :math:`\log\alpha`. Each can therefore be stepped by its own optimiser,
or their sum by one.

Target networks are :class:`rlkit.modules.TargetNetwork` (Polyak averaging with ``tau``
every ``target_period`` gradient steps); call :meth:`SACLoss.update_target` after each
critic step. :math:`\gamma'` is :math:`\gamma`, or the per-sample :math:`\gamma^m` of n-step
data (:func:`rlkit.objectives.dqn.nstep_transitions`, with ``n_steps > 1``); such a target
bootstraps after :math:`m` steps but holds no entropy terms of the intermediate steps, so it is
not the n-step soft target, and :class:`~rlkit.algorithms.sac.SACLearner` refuses it.

Learners train the two parts separately: :meth:`SACLoss.critic_terms` (``loss_qvalue``) steps
the critics, then :meth:`SACLoss.actor_terms` (``loss_actor``, ``loss_alpha``) the actor and
temperature against the updated critics; :meth:`SACLoss.critic_view` and
:meth:`SACLoss.actor_view` present each part as a loss module of its own (``in_keys``,
``forward`` returning its ``loss_*`` terms) for :func:`rlkit.training.update.update_loop`. A
subclass adds a term to a part (a CQL-style critic regulariser, say) by overriding
``critic_terms`` or ``actor_terms`` and returning one more ``loss_*`` entry.

Reference implementations: SB3 ``sac/sac.py`` (``train``), CleanRL ``sac_continuous_action.py``
and ``sac_atari.py`` (discrete), TorchRL ``objectives/sac.py``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from tensordict import NestedKey, TensorDict, TensorDictBase
from torch import Tensor, nn
from torchrl.data import Categorical, Composite, OneHot, TensorSpec

from rlkit import keys
from rlkit.modules.direct import actor_dist
from rlkit.modules.distributions import tanh_normal_parts, tanh_normal_rsample
from rlkit.modules.target import TargetNetwork, call_network
from rlkit.objectives.common import READ_BY_NETWORK, VALUE_MEAN, LossBase, check_float, require_keys
from rlkit.objectives.dqn import (
    BOOTSTRAP_DISCOUNT,
    PRIORITY_WEIGHT,
    TD_ERROR,
    WRITTEN_BY_ENV,
    WRITTEN_BY_NSTEP,
    WRITTEN_BY_SAMPLER,
    check_priority_weights,
    check_q_network,
    importance_weight,
    read_discrete_action,
    read_transition,
    weighted_mean,
)

__all__ = [
    "DiscreteSACLoss",
    "SACActorTerms",
    "SACCriticTerms",
    "SACLoss",
    "sac_critic_target",
]

LOSS_QVALUE = "loss_qvalue"
LOSS_ACTOR = "loss_actor"
LOSS_ALPHA = "loss_alpha"
ALPHA = "alpha"
ENTROPY = "entropy"


def sac_critic_target(
    reward: Tensor,
    next_q_min: Tensor,
    next_log_prob: Tensor,
    terminated: Tensor,
    *,
    alpha: float | Tensor,
    discount: float | Tensor,
) -> Tensor:
    r""":math:`y = R + \gamma (1 - d)(\min_j \bar Q_j(s', a') - \alpha \log\pi(a'|s'))`, ``[B]``.

    All inputs ``[B]`` (``terminated`` bool); ``discount`` a float or ``[B]``.
    """
    soft_value = next_q_min - alpha * next_log_prob
    return reward + discount * (~terminated).to(reward.dtype) * soft_value


@contextlib.contextmanager
def frozen(*modules: nn.Module) -> Iterator[None]:
    """Parameters of ``modules`` get no gradient inside the block (inputs still do).

    Under ``torch.compile`` (``--compile``) the block does nothing: toggling
    ``requires_grad`` breaks the graph into pieces (SAC ran 0.81x eager speed that way,
    benchmarks/results/compile.md). The compiled backward then also computes the frozen
    parameters' gradients, which no optimiser of this step reads: each loss group zeroes
    its gradients before its own backward.
    """
    if torch.compiler.is_compiling():
        yield
        return
    params = [p for m in modules for p in m.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in params:
            p.requires_grad_(True)


def _action_leaf(actor: nn.Module) -> TensorSpec | None:
    spec = getattr(actor, "spec", None)
    if isinstance(spec, Composite):
        return spec.get(keys.ACTION, None)
    return spec


def _is_discrete(spec: TensorSpec | None) -> bool | None:
    if spec is None:
        return None
    return isinstance(spec, Categorical | OneHot)


class _SACBase(LossBase):
    """Shared shell: checks, temperature, target networks, key reading."""

    q_out_key: NestedKey = keys.STATE_ACTION_VALUE
    q_builder = "q_critic_continuous"

    @dataclass
    class _AcceptedKeys:
        action: NestedKey = keys.ACTION
        bootstrap_discount: NestedKey = BOOTSTRAP_DISCOUNT
        priority_weight: NestedKey = PRIORITY_WEIGHT

    def __init__(
        self,
        actor: nn.Module,
        q1: nn.Module,
        q2: nn.Module,
        *,
        gamma: float = 0.99,
        tau: float = 0.005,
        target_period: int = 1,
        alpha_init: float = 1.0,
        learn_alpha: bool = True,
        target_entropy: float | None = None,
        n_steps: int = 1,
        priority_weights: str | None = None,
    ) -> None:
        super().__init__()
        owner = type(self).__name__
        self.priority_weights = check_priority_weights(owner, priority_weights)
        if not (isinstance(actor, nn.Module) and callable(getattr(actor, "get_dist", None))):
            raise TypeError(
                f"{owner}: actor must be a TorchRL ProbabilisticActor (get_dist, in_keys), "
                f"e.g. rlkit.modules.make_actor(...); got {type(actor).__name__}"
            )
        self._check_action_space(actor)
        if q1 is q2:
            raise ValueError(f"{owner}: q1 and q2 must be two separate networks (twin Q)")
        for q in (q1, q2):
            check_q_network(owner, q, self.q_out_key, self.q_builder)
        self.actor, self.q1, self.q2 = actor, q1, q2
        self.gamma = check_float(owner, "gamma", gamma, positive=False)
        if self.gamma > 1:
            raise ValueError(f"{owner}: gamma must be in [0, 1], got {gamma!r}.")
        check_float(owner, "alpha_init", alpha_init, positive=True, hint="1.0 in SB3")
        log_alpha = torch.tensor(math.log(alpha_init), dtype=torch.float32)
        if learn_alpha:
            self.log_alpha = nn.Parameter(log_alpha)
        else:
            self.register_buffer("log_alpha", log_alpha)
        self.learn_alpha = bool(learn_alpha)
        if target_entropy is None:
            self.target_entropy = self.default_target_entropy(actor)
        elif isinstance(target_entropy, bool) or not isinstance(target_entropy, int | float):
            raise TypeError(f"{owner}: target_entropy must be a number, got {target_entropy!r}.")
        else:
            self.target_entropy = float(target_entropy)
        if isinstance(n_steps, bool) or not isinstance(n_steps, int) or n_steps < 1:
            raise ValueError(f"{owner}: n_steps must be an int >= 1, got {n_steps!r}.")
        self.n_steps = n_steps
        self.q1_target = TargetNetwork(q1, mode="soft", period=target_period, tau=tau)
        self.q2_target = TargetNetwork(q2, mode="soft", period=target_period, tau=tau)

    # -- to be provided by the variants ---------------------------------------------------
    def _check_action_space(self, actor: nn.Module) -> None:
        raise NotImplementedError

    def default_target_entropy(self, actor: nn.Module) -> float:
        raise NotImplementedError

    def qvalue_loss(self, tensordict: TensorDictBase) -> tuple[Tensor, dict[str, Tensor]]:
        raise NotImplementedError

    def actor_loss(self, tensordict: TensorDictBase) -> tuple[Tensor, Tensor, dict]:
        raise NotImplementedError

    # -- shared -----------------------------------------------------------------------------
    @classmethod
    def default_keys(cls) -> _AcceptedKeys:
        return cls._AcceptedKeys()

    @property
    def alpha(self) -> Tensor:
        """The temperature :math:`\\alpha = e^{\\log\\alpha}` (detached)."""
        return self.log_alpha.detach().exp()

    def critic_parameters(self) -> list[nn.Parameter]:
        return [*self.q1.parameters(), *self.q2.parameters()]

    # -- the two parts, as learners train them -------------------------------------------------
    def _q_inputs(self) -> list[NestedKey]:
        """What the Q networks read besides the action they are given."""
        action = self.tensor_keys.action
        return [k for q in (self.q1, self.q2) for k in q.in_keys if k != action]

    @property
    def critic_in_keys(self) -> list[NestedKey]:
        """Keys :meth:`critic_terms` reads."""
        now = [*self.actor.in_keys, *self._q_inputs()]
        found = [*now, *((keys.NEXT, *((k,) if isinstance(k, str) else k)) for k in now)]
        found += [self.tensor_keys.action, keys.REWARD, keys.TERMINATED]
        if self.n_steps > 1:
            found.append(self.tensor_keys.bootstrap_discount)
        if self.priority_weights is not None:
            found.append(self.tensor_keys.priority_weight)
        return list(dict.fromkeys(found))

    @property
    def actor_in_keys(self) -> list[NestedKey]:
        """Keys :meth:`actor_terms` reads."""
        return list(dict.fromkeys([*self.actor.in_keys, *self._q_inputs()]))

    @property
    def in_keys(self) -> list[NestedKey]:
        return list(dict.fromkeys([*self.critic_in_keys, *self.actor_in_keys]))

    def critic_terms(self, tensordict: TensorDictBase) -> TensorDict:
        """The critics' part: ``loss_qvalue`` and detached ``value_mean``, ``td_error`` ``[B]``.

        A learner steps the critics on every ``loss_*`` term returned here; a subclass adds a
        critic term by overriding this and setting one more ``loss_*`` entry."""
        loss_q, info = self.qvalue_loss(tensordict)
        return TensorDict({LOSS_QVALUE: loss_q, **info}, batch_size=[])

    def actor_terms(self, tensordict: TensorDictBase) -> TensorDict:
        """The actor's and temperature's part: ``loss_actor``, ``loss_alpha`` and detached
        ``entropy``, ``alpha``. A learner steps actor and :math:`\\log\\alpha` on every
        ``loss_*`` term returned here."""
        loss_pi, gap, info = self.actor_loss(tensordict)
        out = {LOSS_ACTOR: loss_pi, LOSS_ALPHA: self.alpha_loss(gap), **info, ALPHA: self.alpha}
        return TensorDict(out, batch_size=[])

    def critic_view(self) -> SACCriticTerms:
        """:meth:`critic_terms` as a loss module of its own (for a loss group)."""
        return SACCriticTerms(self)

    def actor_view(self) -> SACActorTerms:
        """:meth:`actor_terms` as a loss module of its own (for a loss group)."""
        return SACActorTerms(self)

    def update_target(self) -> None:
        """Count one critic step on both target networks; Polyak-update them when due."""
        self.q1_target.step()
        self.q2_target.step()

    def _needs(self, *, critic: bool) -> dict[NestedKey, str]:
        needs = dict.fromkeys(self.actor.in_keys, READ_BY_NETWORK)
        if critic:
            for key in self.actor.in_keys:
                needs[(keys.NEXT, *((key,) if isinstance(key, str) else key))] = WRITTEN_BY_ENV
            needs[self.tensor_keys.action] = "the collecting policy writes it"
            needs[keys.REWARD] = WRITTEN_BY_ENV
            needs[keys.TERMINATED] = WRITTEN_BY_ENV
            if self.n_steps > 1:
                needs[self.tensor_keys.bootstrap_discount] = WRITTEN_BY_NSTEP
            if self.priority_weights is not None:
                needs[self.tensor_keys.priority_weight] = WRITTEN_BY_SAMPLER
        return needs

    def _transition(self, tensordict: TensorDictBase):
        key = self.tensor_keys.bootstrap_discount if self.n_steps > 1 else None
        return read_transition(tensordict, key, self.gamma)

    def alpha_loss(self, entropy_gap: Tensor) -> Tensor:
        """:math:`L_\\alpha = \\log\\alpha \\cdot \\mathrm{mean}(H - \\bar H)`, the gap detached
        (``entropy_gap = -(log pi + target_entropy)`` per sample, or ``H - target``)."""
        if not self.learn_alpha:
            return torch.zeros((), device=entropy_gap.device)
        return self.log_alpha * entropy_gap.detach().mean()

    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        """Both parts on one batch (the actor's terms see the critics before their step)."""
        out = self.critic_terms(tensordict)
        out.update(self.actor_terms(tensordict))
        return out

    def _read_weight(self, tensordict: TensorDictBase) -> Tensor | None:
        return importance_weight(
            tensordict,
            self.tensor_keys.priority_weight,
            self.priority_weights,
            owner=type(self).__name__,
        )

    def _twin_regression(self, q1: Tensor, q2: Tensor, target: Tensor, weight):
        norm = self.priority_weights or "max"
        loss = 0.5 * (
            weighted_mean((q1 - target).square(), weight, norm)
            + weighted_mean((q2 - target).square(), weight, norm)
        )
        info = {
            VALUE_MEAN: (0.5 * (q1 + q2)).detach().mean(),
            TD_ERROR: (0.5 * ((q1 - target).abs() + (q2 - target).abs())).detach(),
        }
        return loss, info

    def extra_repr(self) -> str:
        return (
            f"gamma={self.gamma}, target_entropy={self.target_entropy:.4g}, "
            f"learn_alpha={self.learn_alpha}, n_steps={self.n_steps}, "
            f"priority_weights={self.priority_weights!r}"
        )


class _SACPart(nn.Module):
    """A view of one part of a SAC loss as a loss module: ``in_keys`` and a ``forward`` that
    returns the part's ``loss_*`` terms. It owns nothing: the SAC loss holds the networks."""

    def __init__(self, sac: _SACBase) -> None:
        super().__init__()
        self.__dict__["sac"] = sac  # not a submodule: the loss stays the one owner

    def extra_repr(self) -> str:
        return f"of {type(self.sac).__name__}"


class SACCriticTerms(_SACPart):
    """The critics' part of a SAC loss (:meth:`SACLoss.critic_terms`)."""

    @property
    def in_keys(self) -> list[NestedKey]:
        return self.sac.critic_in_keys

    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        return self.sac.critic_terms(tensordict)


class SACActorTerms(_SACPart):
    """The actor's and temperature's part of a SAC loss (:meth:`SACLoss.actor_terms`)."""

    @property
    def in_keys(self) -> list[NestedKey]:
        return self.sac.actor_in_keys

    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        return self.sac.actor_terms(tensordict)


class SACLoss(_SACBase):
    r"""SAC for continuous actions (see the module docstring for the maths).

    Keys read: the actor's ``in_keys`` (``observation``) and the same under ``"next"``;
    ``action`` ``[B, d]``; ``("next", "reward")`` / ``("next", "terminated")`` ``[B, 1]``;
    :data:`~rlkit.objectives.dqn.BOOTSTRAP_DISCOUNT` when ``n_steps > 1``;
    :data:`~rlkit.objectives.dqn.PRIORITY_WEIGHT` ``[B]`` when built with ``priority_weights``
    (weights :math:`L_Q`, as :class:`~rlkit.objectives.DQNLoss`). The Q networks read
    ``observation`` and ``action`` and write ``state_action_value`` ``[B, 1]``.

    Returns ``loss_qvalue``, ``loss_actor``, ``loss_alpha`` and detached diagnostics
    ``alpha``, ``entropy`` (:math:`-\mathrm{mean}\log\pi`), ``value_mean``, ``td_error``
    ``[B]``. :meth:`critic_terms` and :meth:`actor_terms` compute the parts separately (the
    learner steps the critics first, then the actor against the updated critics, as SB3).

    Args:
        actor: a tanh-squashed Gaussian ``ProbabilisticActor``
            (``rlkit.modules.make_actor(..., tanh=True)``).
        q1, q2: twin critics (``rlkit.modules.q_critic_continuous``).
        gamma: discount (0.99). tau: Polyak weight of the target update (0.005).
        target_period: gradient steps between target updates (1).
        alpha_init: initial temperature (1.0, SB3's ``ent_coef="auto"``).
        learn_alpha: learn :math:`\log\alpha` (else a fixed temperature).
        target_entropy: :math:`\bar H`; default :math:`-\dim(A)`.
        n_steps: read per-sample n-step discounts (no intermediate entropy terms).
        priority_weights: ``None``, ``"max"`` or ``"sum"``: prioritized replay's importance
            weights on :math:`L_Q`, as :class:`~rlkit.objectives.DQNLoss`.
    """

    def _check_action_space(self, actor: nn.Module) -> None:
        if _is_discrete(_action_leaf(actor)):
            raise ValueError(
                f"SACLoss is for continuous actions, but the actor's action spec is "
                f"{type(_action_leaf(actor)).__name__} (discrete): use DiscreteSACLoss with "
                "Q networks from rlkit.modules.q_critic_discrete (recipes/sac.py picks it for "
                "discrete action spaces)"
            )

    @property
    def _tanh_parts(self):
        if not hasattr(self, "_tanh_parts_cache"):
            self._tanh_parts_cache = tanh_normal_parts(self.actor)
        return self._tanh_parts_cache

    def default_target_entropy(self, actor: nn.Module) -> float:
        spec = _action_leaf(actor)
        if spec is None or not spec.shape:
            raise ValueError(
                "SACLoss: cannot read the action dimension from the actor's spec; pass "
                "target_entropy= (usually -action_dim)"
            )
        return -float(spec.shape[-1])

    def _sample(self, tensordict: TensorDictBase) -> tuple[Tensor, Tensor]:
        """Reparameterised action and its log-probability ``([B, d], [B])``."""
        if self._tanh_parts is not None:  # rlkit's tanh actor: no distribution object
            params, low, high = self._tanh_parts
            inputs = (tensordict.get(k) for k in params.in_keys)
            loc, scale = params.module(*inputs)
            return tanh_normal_rsample(loc, scale, low=low.to(loc), high=high.to(loc))
        dist = actor_dist(self.actor, tensordict)
        if hasattr(dist, "rsample_and_log_prob"):  # TanhNormal: scores the exact pre-tanh draw
            action, log_prob = dist.rsample_and_log_prob()
        else:
            action = dist.rsample()
            log_prob = dist.log_prob(action)
        if log_prob.shape != tensordict.batch_size:
            raise ValueError(
                f"SACLoss: the actor's log_prob has shape {list(log_prob.shape)}, expected "
                f"{list(tensordict.batch_size)} (one per sample; use TanhNormal or an "
                "Independent distribution)"
            )
        return action, log_prob

    def _q(self, network: nn.Module, tensordict: TensorDictBase, action: Tensor) -> Tensor:
        value = call_network(network, tensordict, self.q_out_key, {keys.ACTION: action})
        return value.reshape(tensordict.batch_size)

    def qvalue_loss(self, tensordict: TensorDictBase) -> tuple[Tensor, dict[str, Tensor]]:
        """:math:`L_Q` and its diagnostics (``value_mean``, ``td_error``)."""
        require_keys(tensordict, self._needs(critic=True), owner=type(self).__name__)
        action = tensordict.get(self.tensor_keys.action)
        if not action.is_floating_point():
            raise TypeError(
                f"SACLoss needs continuous (floating point) actions, got {action.dtype} "
                f"actions of shape {list(action.shape)}: for a discrete action space use "
                "DiscreteSACLoss"
            )
        reward, terminated, discount = self._transition(tensordict)
        with torch.no_grad():
            next_td = tensordict.get(keys.NEXT)
            next_action, next_log_prob = self._sample(next_td)
            next_q = torch.minimum(
                self._q(self.q1_target, next_td, next_action),
                self._q(self.q2_target, next_td, next_action),
            )
            target = sac_critic_target(
                reward, next_q, next_log_prob, terminated, alpha=self.alpha, discount=discount
            )
        q1 = self._q(self.q1, tensordict, action)
        q2 = self._q(self.q2, tensordict, action)
        return self._twin_regression(q1, q2, target, self._read_weight(tensordict))

    def actor_loss(self, tensordict: TensorDictBase) -> tuple[Tensor, Tensor, dict]:
        """:math:`L_\\pi`, the per-sample entropy gap :math:`-(\\log\\pi + \\bar H)` for
        :math:`L_\\alpha`, and ``{"entropy": -mean log pi}``."""
        require_keys(tensordict, self._needs(critic=False), owner=type(self).__name__)
        action, log_prob = self._sample(tensordict)
        with frozen(self.q1, self.q2):
            q = torch.minimum(
                self._q(self.q1, tensordict, action), self._q(self.q2, tensordict, action)
            )
        loss = (self.alpha * log_prob - q).mean()
        gap = -(log_prob.detach() + self.target_entropy)
        return loss, gap, {ENTROPY: -log_prob.detach().mean()}


class DiscreteSACLoss(_SACBase):
    r"""SAC for discrete actions (Christodoulou 2019); see the module docstring.

    The actor is a categorical ``ProbabilisticActor`` (``rlkit.modules.make_actor`` on a
    ``Categorical``/``OneHot`` action spec); ``q1``/``q2`` write ``action_value`` ``[B, n]``
    (``rlkit.modules.q_critic_discrete``). Keys read and outputs as :class:`SACLoss`, with
    ``action`` int64 ``[B]`` or one-hot ``[B, n]``. ``target_entropy`` defaults to
    :math:`0.98 \log n`.

    A masked actor (one reading :data:`rlkit.keys.ACTION_MASK`, built by ``make_actor`` for an
    env with a mask) puts probability 0 on masked actions, so the expectations above run over
    the valid actions only: the target's over the next state's (``("next", "action_mask")``
    is read), with the masked log-probabilities taken as 0 there (they hold the dtype's lowest
    value, and :math:`\alpha` times it can overflow to ``-inf``, whose product with a 0
    probability is NaN). The default target entropy is then per state,
    :math:`0.98 \log n_{valid}(s)`: the uniform policy's entropy over the valid actions (a
    state with one valid action targets 0).
    """

    q_out_key = keys.ACTION_VALUE
    q_builder = "q_critic_discrete"

    def __init__(
        self,
        actor: nn.Module,
        q1: nn.Module,
        q2: nn.Module,
        *,
        gamma: float = 0.99,
        tau: float = 0.005,
        target_period: int = 1,
        alpha_init: float = 1.0,
        learn_alpha: bool = True,
        target_entropy: float | None = None,
        n_steps: int = 1,
        priority_weights: str | None = None,
    ) -> None:
        super().__init__(
            actor,
            q1,
            q2,
            gamma=gamma,
            tau=tau,
            target_period=target_period,
            alpha_init=alpha_init,
            learn_alpha=learn_alpha,
            target_entropy=target_entropy,
            n_steps=n_steps,
            priority_weights=priority_weights,
        )
        self.masked = keys.ACTION_MASK in list(actor.in_keys)
        #: the default target entropy of a masked actor: this fraction of log n_valid(s)
        self._entropy_fraction = 0.98 if target_entropy is None and self.masked else None

    def _check_action_space(self, actor: nn.Module) -> None:
        if _is_discrete(_action_leaf(actor)) is False:
            raise ValueError(
                f"DiscreteSACLoss is for discrete actions, but the actor's action spec is "
                f"{type(_action_leaf(actor)).__name__} (continuous): use SACLoss with a "
                "tanh actor (make_actor(..., tanh=True)) and q_critic_continuous"
            )

    def default_target_entropy(self, actor: nn.Module) -> float:
        spec = _action_leaf(actor)
        n = getattr(getattr(spec, "space", None), "n", None)
        if n is None:
            raise ValueError(
                "DiscreteSACLoss: cannot read the number of actions from the actor's spec; "
                "pass target_entropy= (e.g. 0.98 * log(n_actions))"
            )
        return 0.98 * math.log(n)

    def _policy(self, tensordict: TensorDictBase) -> tuple[Tensor, Tensor]:
        """``(probs, log_probs)`` ``[B, n]`` of the categorical policy."""
        dist = actor_dist(self.actor, tensordict)
        logits = dist.logits
        if self.masked:  # 0, not the lowest float, where masked: alpha * it may be -inf
            mask = tensordict.get(keys.ACTION_MASK) != 0
            return logits.softmax(-1), logits.log_softmax(-1).masked_fill(~mask, 0.0)
        return logits.softmax(-1), logits.log_softmax(-1)

    def _target_entropy(self, tensordict: TensorDictBase) -> Tensor | float:
        """:attr:`target_entropy`, or per state ``0.98 log n_valid(s)`` for a masked actor."""
        if self._entropy_fraction is None:
            return self.target_entropy
        valid = (tensordict.get(keys.ACTION_MASK) != 0).sum(-1).clamp(min=1)
        return self._entropy_fraction * valid.to(torch.float32).log()

    def _q(self, network: nn.Module, tensordict: TensorDictBase) -> Tensor:
        return call_network(network, tensordict, self.q_out_key)

    def qvalue_loss(self, tensordict: TensorDictBase) -> tuple[Tensor, dict[str, Tensor]]:
        require_keys(tensordict, self._needs(critic=True), owner=type(self).__name__)
        reward, terminated, discount = self._transition(tensordict)
        with torch.no_grad():
            next_td = tensordict.get(keys.NEXT)
            probs, log_probs = self._policy(next_td)
            next_q = torch.minimum(
                self._q(self.q1_target, next_td), self._q(self.q2_target, next_td)
            )
            soft_value = (probs * (next_q - self.alpha * log_probs)).sum(-1)
            target = reward + discount * (~terminated).to(reward.dtype) * soft_value
        q1_all, q2_all = self._q(self.q1, tensordict), self._q(self.q2, tensordict)
        action = read_discrete_action(
            tensordict.get(self.tensor_keys.action),
            tensordict.batch_size,
            q1_all.shape[-1],
            owner=type(self).__name__,
        ).unsqueeze(-1)
        q1 = q1_all.gather(-1, action).squeeze(-1)
        q2 = q2_all.gather(-1, action).squeeze(-1)
        return self._twin_regression(q1, q2, target, self._read_weight(tensordict))

    def actor_loss(self, tensordict: TensorDictBase) -> tuple[Tensor, Tensor, dict]:
        require_keys(tensordict, self._needs(critic=False), owner=type(self).__name__)
        probs, log_probs = self._policy(tensordict)
        with torch.no_grad():
            q = torch.minimum(self._q(self.q1, tensordict), self._q(self.q2, tensordict))
        loss = (probs * (self.alpha * log_probs - q)).sum(-1).mean()
        entropy = -(probs * log_probs).sum(-1).detach()
        gap = entropy - self._target_entropy(tensordict)
        return loss, gap, {ENTROPY: entropy.mean()}
