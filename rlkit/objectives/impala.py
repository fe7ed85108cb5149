r"""IMPALA's V-trace actor-critic loss (Espeholt et al. 2018) as a TorchRL ``LossModule``."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import NestedKey, TensorDict, TensorDictBase
from torch import Tensor, nn

from rlkit import keys
from rlkit.modules.direct import actor_dist
from rlkit.modules.recurrent import is_recurrent, next_state_values
from rlkit.objectives.common import (
    APPROX_KL,
    ENTROPY,
    EXPLAINED_VARIANCE,
    LOSS_ENTROPY,
    LOSS_POLICY,
    LOSS_VALUE,
    VALUE_MEAN,
    WRITTEN_BY_BEHAVIOUR_ACTOR,
    ActorCriticLoss,
    part_metrics,
    per_sample_log_prob,
    positive,
    require_keys,
    weighted,
)
from rlkit.objectives.functional import approx_kl, explained_variance, standardize
from rlkit.value import functional as VF

__all__ = ["IMPALALoss", "check_vtrace_args"]

RHO_MEAN = "rho_mean"
RHO_CLIPPED_FRACTION = "rho_clipped_fraction"
ADVANTAGE_MEAN = "advantage_mean"


def check_vtrace_args(
    owner: str, *, lmbda: float, rho_clip: float, c_clip: float, pg_rho_clip: float
) -> None:
    """Raise ``ValueError`` for a V-trace clip <= 0 or a lambda outside [0, 1]."""
    for name, value in (("rho_clip", rho_clip), ("c_clip", c_clip), ("pg_rho_clip", pg_rho_clip)):
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ValueError(
                f"{owner}: {name} must be a number > 0 (a V-trace truncation level; the "
                f"paper uses 1.0), got {value!r}"
            )
    if isinstance(lmbda, bool) or not isinstance(lmbda, int | float) or not 0 <= lmbda <= 1:
        raise ValueError(f"{owner}: vtrace lambda must be in [0, 1] (1: no decay), got {lmbda!r}")


class IMPALALoss(ActorCriticLoss):
    r"""V-trace actor-critic: policy gradient with V-trace advantages, value regression to
    :math:`v_s`, entropy bonus.

    For a batch of trajectories ``[N, T]`` collected by a behaviour policy :math:`\mu`
    (whose log-prob is stored), with :math:`\rho_t = \pi_\theta(a_t|x_t)/\mu(a_t|x_t)` at
    the *stored* action, V-trace (:func:`rlkit.value.functional.vtrace`) gives targets
    :math:`v_s` and advantages
    :math:`A_s = \min(\bar\rho_{pg}, \rho_s)(r_s + \gamma \hat v_{s+1} - V(x_s))`, with
    :math:`\hat v_{s+1} = v_{s+1}` (``adv_mode="official"``) or
    :math:`\lambda v_{s+1} + (1-\lambda) V(x_{s+1})` (``adv_mode="acme"``); then

    .. math::
        \text{loss\_policy} &= -\operatorname{red}_s\, A_s \log\pi_\theta(a_s|x_s) \\
        \text{loss\_value} &= c_v \operatorname{red}_s\, \tfrac12 (V_\phi(x_s) - v_s)^2 \\
        \text{loss\_entropy} &= -c_H \operatorname{red}_s\, H[\pi_\theta(\cdot|x_s)]

    with :math:`\operatorname{red}` the mean (default) or the sum over the batch (the
    paper's TF reference sums). :math:`A_s` and :math:`v_s` are constants (no gradient).

    Unlike the other rlkit losses, V-trace is computed *inside* this loss: its importance
    weights use the current :math:`\pi_\theta`, so they must come from the same forward as
    the gradient (they change after every optimiser step). This is the paper's definition
    of the loss, not a hidden estimator; :meth:`vtrace` exposes exactly what it uses.

    Keys read: the actor's and critic's ``in_keys`` (``keys.OBSERVATION``) and
    ``keys.NEXT_OBSERVATION`` (the critic bootstraps from the true next observation, also
    at truncations), ``keys.ACTION``, ``keys.ACTION_LOG_PROB`` (:math:`\log\mu`, ``[N, T]``
    or ``[N, T, 1]``), ``keys.REWARD``, ``keys.DONE``, ``keys.TERMINATED``
    (``[N, T, 1]``). The batch's last dim is time (``[N, T]``, as collectors write).
    Nothing is written into the batch.

    Writes: ``loss_policy``, ``loss_value``, ``loss_entropy`` and the detached
    diagnostics ``rho_mean``, ``rho_clipped_fraction`` (:math:`\rho > \bar\rho`),
    ``entropy``, ``explained_variance``, ``value_mean``, ``advantage_mean``.

    Args:
        actor: a ``ProbabilisticActor`` (``get_dist``), discrete or continuous.
        critic: a TensorDict module writing ``keys.STATE_VALUE`` ``[*, 1]``.
        gamma: discount in [0, 1].
        vtrace_lambda: :math:`\lambda \in [0, 1]` folded into the traces; default 1.
        rho_clip, c_clip, pg_rho_clip: :math:`\bar\rho, \bar c, \bar\rho_{pg} > 0`; 1.0.
        adv_mode: ``"official"`` (default: the paper's advantage, bootstrapped from
            :math:`v_{s+1}`) or ``"acme"`` (Acme's and evorl's, from
            :math:`\lambda v_{s+1} + (1-\lambda)V(x_{s+1})`); equal when ``vtrace_lambda=1``.
        entropy_coef: :math:`c_H \ge 0` (the paper: 0.0005 to 0.01).
        value_coef: :math:`c_v \ge 0`, applied to the 1/2-squared error; default 0.5.
        reduction: ``"mean"`` (default) or ``"sum"``.
        normalize_advantage: standardise :math:`A_s` over the minibatch before the policy
            term (default ``False``, the paper's loss; continuous control needs it: the
            advantages of an unnormalised return are tens of units and swamp the gradient).
            ``advantage_mean`` stays the raw V-trace advantage's mean.

    Reference: Espeholt et al. 2018, "IMPALA", eq. (1) and section 4.2;
    ``deepmind/scalable_agent`` ``vtrace.py`` and ``experiment.py``.
    """

    @dataclass
    class _AcceptedKeys:
        """Input keys, renamable with ``loss.set_keys(name=key)`` (TorchRL's names too:
        ``sample_log_prob``, ``value``). ``reward``, ``done`` and ``terminated`` are read
        under ``"next"``, as TorchRL reads them: ``set_keys(reward="r")`` reads
        ``("next", "r")``."""

        action: NestedKey = keys.ACTION
        action_log_prob: NestedKey = keys.ACTION_LOG_PROB
        state_value: NestedKey = keys.STATE_VALUE
        reward: NestedKey = keys.REWARD
        done: NestedKey = keys.DONE
        terminated: NestedKey = keys.TERMINATED

    _diagnostics = (RHO_MEAN, RHO_CLIPPED_FRACTION, ENTROPY, EXPLAINED_VARIANCE, VALUE_MEAN)

    def __init__(
        self,
        actor: nn.Module,
        critic: nn.Module,
        *,
        gamma: float = 0.99,
        vtrace_lambda: float = 1.0,
        rho_clip: float = 1.0,
        c_clip: float = 1.0,
        pg_rho_clip: float = 1.0,
        adv_mode: str = "official",
        entropy_coef: float = 0.0,
        value_coef: float = 0.5,
        reduction: str = "mean",
        entropy_samples: int = 1,
        normalize_advantage: bool = False,
    ) -> None:
        super().__init__(
            actor,
            critic,
            entropy_coef=entropy_coef,
            value_coef=value_coef,
            normalize_advantage=normalize_advantage,
            entropy_samples=entropy_samples,
        )
        check_vtrace_args(
            "IMPALALoss",
            lmbda=vtrace_lambda,
            rho_clip=rho_clip,
            c_clip=c_clip,
            pg_rho_clip=pg_rho_clip,
        )
        if not 0 <= gamma <= 1:
            raise ValueError(f"IMPALALoss: gamma must be in [0, 1], got {gamma!r}")
        if reduction not in ("mean", "sum"):
            raise ValueError(f"IMPALALoss: reduction must be 'mean' or 'sum', got {reduction!r}")
        self.gamma, self.vtrace_lambda = float(gamma), float(vtrace_lambda)
        self.rho_clip, self.c_clip, self.pg_rho_clip = rho_clip, c_clip, pg_rho_clip
        self.reduction = reduction
        self.adv_mode = VF.check_adv_mode("IMPALALoss", adv_mode)

    @property
    def out_keys(self) -> list[str]:
        return [*self._loss_terms(), APPROX_KL, *self._diagnostics, ADVANTAGE_MEAN]

    def _env_keys(self) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
        """``(reward, done, terminated)`` as full keys under ``"next"``."""
        k = self.tensor_keys
        return keys.under_next(k.reward), keys.under_next(k.done), keys.under_next(k.terminated)

    def _required_keys(self) -> dict[NestedKey, str]:
        needs = dict.fromkeys([*self.actor.in_keys, *self.critic.in_keys], "read by a network")
        needs[self.tensor_keys.action] = WRITTEN_BY_BEHAVIOUR_ACTOR
        needs[self.tensor_keys.action_log_prob] = WRITTEN_BY_BEHAVIOUR_ACTOR
        # a recurrent critic reads no is_init under "next": it never resets there
        next_inputs = [keys.under_next(k) for k in self.critic.in_keys if k != keys.IS_INIT]
        for key in (*self._env_keys(), *next_inputs):
            needs[key] = "the environment writes it (collect the batch with a collector)"
        return needs

    def _reduce(self, x: Tensor) -> Tensor:
        return x.sum() if self.reduction == "sum" else x.mean()

    def _scores(self, td: TensorDictBase) -> tuple[torch.distributions.Distribution, Tensor]:
        if td.batch_dims != 2:
            raise ValueError(
                f"IMPALALoss needs a [N, T] batch of trajectories (time last), got batch_size "
                f"{list(td.batch_size)}: do not flatten or shuffle the batch across time"
            )
        dist = actor_dist(self.actor, td)
        action = td.get(self.tensor_keys.action)
        log_prob = per_sample_log_prob(dist, action, td.batch_size, owner="IMPALALoss")
        return dist, log_prob

    def _values(self, td: TensorDictBase) -> tuple[Tensor, Tensor]:
        value = self._critic_value(td)  # [N, T], with grad
        return value, self._next_value(td)

    @torch.no_grad()
    def _next_value(self, td: TensorDictBase) -> Tensor:
        """V(("next", observation)); a recurrent critic scores it from its state after the
        step (:func:`rlkit.modules.recurrent.next_state_values`), never from a sequence
        run over the next observations (which would cross the resets)."""
        if is_recurrent(self.critic):
            return next_state_values(self.critic, td, self.tensor_keys.state_value)
        nxt = td.get(keys.NEXT).select(*self.critic.in_keys)
        return self.critic(nxt).get(self.tensor_keys.state_value)

    def vtrace(
        self, td: TensorDictBase, *, log_prob: Tensor | None = None, value: Tensor | None = None
    ) -> dict[str, Tensor]:
        r"""The V-trace quantities the loss uses, all ``[N, T]`` and detached: ``rho``
        (:math:`\pi_\theta/\mu` at the stored actions) and its log ``log_rho``,
        ``advantage`` and ``value_target``."""
        self._critic_ready()
        require_keys(td, self._required_keys(), owner="IMPALALoss")
        if log_prob is None:
            _, log_prob = self._scores(td)
        if value is None:
            value, next_value = self._values(td)
        else:
            next_value = self._next_value(td)
        behaviour = td.get(self.tensor_keys.action_log_prob)
        if behaviour.shape != td.batch_size:
            behaviour = behaviour.reshape(td.batch_size)
        reward, done, terminated = (td.get(k) for k in self._env_keys())
        advantage, target = VF.vtrace(
            behaviour.detach().unsqueeze(-1),
            log_prob.detach().unsqueeze(-1),
            reward,
            value.detach().unsqueeze(-1),
            next_value,
            done,
            terminated,
            gamma=self.gamma,
            lmbda=self.vtrace_lambda,
            rho_clip=self.rho_clip,
            c_clip=self.c_clip,
            pg_rho_clip=self.pg_rho_clip,
            time_dim=-2,
            adv_mode=self.adv_mode,
        )
        log_rho = log_prob.detach() - behaviour.detach()
        return {
            "rho": log_rho.exp(),
            "log_rho": log_rho,
            "advantage": advantage.squeeze(-1),
            "value_target": target.squeeze(-1),
        }

    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        self._critic_ready()
        require_keys(tensordict, self._required_keys(), owner="IMPALALoss")
        dist, log_prob = self._scores(tensordict)
        value, _ = self._values(tensordict)
        vt = self.vtrace(tensordict, log_prob=log_prob, value=value)
        advantage = vt["advantage"]
        if self.normalize_advantage:
            advantage = standardize(advantage)
        out = {
            LOSS_POLICY: -self._reduce(advantage * log_prob),
            LOSS_VALUE: self.value_coef * self._reduce(0.5 * (value - vt["value_target"]) ** 2),
        }
        entropy = self._entropy(dist)
        out[LOSS_ENTROPY] = -weighted(self.entropy_coef, self._reduce(entropy))
        # KL(mu || pi) at the stored actions: how far the learner has moved from the policy
        # that acted (the update so far plus, when collection is asynchronous, the policy
        # lag); --lr-schedule kl adapts the step size to it
        out[APPROX_KL] = approx_kl(vt["log_rho"])
        if self.diagnostics:
            rho = vt["rho"]
            out[RHO_MEAN] = rho.mean()
            out[RHO_CLIPPED_FRACTION] = (rho > self.rho_clip).float().mean()
            out[ENTROPY] = entropy.detach().mean()
            out.update(part_metrics(dist, tensordict.get(self.tensor_keys.action)))
            out[EXPLAINED_VARIANCE] = explained_variance(value, vt["value_target"])
            out[VALUE_MEAN] = value.detach().mean()
            out[ADVANTAGE_MEAN] = vt["advantage"].mean()
        self._note_terms(out)
        return TensorDict(out, batch_size=[])

    def _entropy(self, dist) -> Tensor:
        from rlkit.objectives.common import distribution_entropy

        if positive(self, "entropy_coef"):
            return distribution_entropy(dist, num_samples=self.entropy_samples)
        with torch.no_grad():
            return distribution_entropy(dist, num_samples=self.entropy_samples)
