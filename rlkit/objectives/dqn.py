r"""DQN: the temporal-difference loss of deep Q-learning, with double-DQN and n-step options.

.. math::
    y_i = R_i + \gamma_i \, (1 - d_i) \, \bar Q(s'_i, a^*_i), \qquad
    L(\theta) = \frac1B \sum_i w_i \, \ell\big(Q_\theta(s_i, a_i) - y_i\big)

with :math:`a^*_i = \arg\max_a \bar Q(s'_i, a)` (DQN, Mnih et al. 2015) or
:math:`a^*_i = \arg\max_a Q_\theta(s'_i, a)` (double DQN, van Hasselt et al. 2016: the online
network picks, the target network scores), :math:`\bar Q` the target network, :math:`d_i`
the ``terminated`` flag (a time limit is not a terminal: it bootstraps from the true final
observation), :math:`\ell` the Huber loss (:math:`\delta = 1`, as SB3 and the Nature DQN) or
:math:`\tfrac12 e^2`, and :math:`w_i` prioritized-replay importance weights (1 for uniform
replay). With ``priority_weights="max"`` (Schaul et al. 2016) the weights are
:math:`w_i = (N P(i))^{-\beta} / \max_j w_j`, the maximum over the buffer, as TorchRL's
``PrioritizedSampler`` writes them, so they only scale the update down; with ``"sum"`` the
loss is :math:`\sum_i w_i \ell_i / \sum_i w_i` instead.

For one-step transitions :math:`R_i = r_i` and :math:`\gamma_i = \gamma`. For n-step
transitions (:func:`nstep_transitions`, Sutton & Barto ch. 7; Hessel et al. 2018)
:math:`R_i = \sum_{k<m_i} \gamma^k r_{t+k}` and :math:`\gamma_i = \gamma^{m_i}`, where
:math:`m_i \le n` stops at the first done step and at the end of the collected batch; the
per-sample :math:`\gamma_i` is read from :data:`BOOTSTRAP_DISCOUNT`. (The off-policy learner
carries the last :math:`n - 1` steps of each env into the next batch, so its windows are cut
only by episode ends.)

Reference implementations: SB3 ``dqn/dqn.py`` (``train``), TorchRL ``objectives/dqn.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import NestedKey, TensorDict, TensorDictBase
from torch import Tensor, nn

from rlkit import keys
from rlkit.modules.target import TargetNetwork, call_network
from rlkit.objectives.common import (
    LOSS_VALUE,
    READ_BY_NETWORK,
    VALUE_MEAN,
    LossBase,
    _check_choice,
    check_float,
    require_keys,
)
from rlkit.objectives.functional import VALUE_LOSS_TYPES, _pointwise_value_loss

__all__ = [
    "BOOTSTRAP_DISCOUNT",
    "PRIORITY_WEIGHT",
    "PRIORITY_WEIGHT_NORMS",
    "TD_ERROR",
    "DQNLoss",
    "dqn_td_target",
    "nstep_transitions",
]

#: ``priority_weights`` choices: importance weights normalised by their maximum (the PER
#: paper's) or by their sum (the config layer lists the same names, torch-free;
#: tests/test_layout.py checks that the lists agree)
PRIORITY_WEIGHT_NORMS = ("max", "sum")

#: Batch keys documented in :mod:`rlkit.keys`: the m-step bootstrap discount ``[*, 1]``
#: (written by :func:`nstep_transitions`) and the prioritized-replay weight ``[*]``.
BOOTSTRAP_DISCOUNT = keys.BOOTSTRAP_DISCOUNT
PRIORITY_WEIGHT = keys.PRIORITY_WEIGHT
#: ``[B]`` detached absolute TD error per sample in a loss's output (new replay priorities).
TD_ERROR = "td_error"
TARGET_MEAN = "target_mean"

WRITTEN_BY_NSTEP = (
    "n_steps > 1 reads the per-sample bootstrap discount gamma^m written by "
    "rlkit.objectives.dqn.nstep_transitions; build the replay data with it, or pass n_steps=1"
)
WRITTEN_BY_ENV = "the environment writes it (collect transitions with make_env's env)"
WRITTEN_BY_SAMPLER = (
    "prioritized replay's sampler writes it (TorchRL's PrioritizedSampler); for uniform "
    "replay build the loss with priority_weights=None"
)


# ---------------------------------------------------------------------------------------
# Pure functions
# ---------------------------------------------------------------------------------------
def dqn_td_target(
    reward: Tensor,
    next_q_target: Tensor,
    terminated: Tensor,
    *,
    discount: float | Tensor,
    next_q_online: Tensor | None = None,
) -> Tensor:
    r"""TD target :math:`y = R + \gamma (1 - d) \bar Q(s', a^*)`, shape ``[B]``.

    Args:
        reward: ``[B]`` (n-step) reward :math:`R`.
        next_q_target: ``[B, n]`` target-network values :math:`\bar Q(s', \cdot)`.
        terminated: ``[B]`` bool, true terminal states (no bootstrap).
        discount: :math:`\gamma` (float) or per-sample :math:`\gamma^m` ``[B]``.
        next_q_online: ``[B, n]`` online values :math:`Q_\theta(s', \cdot)`; when given,
            double DQN: :math:`a^* = \arg\max Q_\theta(s', \cdot)` scored by :math:`\bar Q`.
            Otherwise :math:`a^* = \arg\max \bar Q(s', \cdot)`.
    """
    if next_q_online is None:
        next_value = next_q_target.max(dim=-1).values
    else:
        best = next_q_online.argmax(dim=-1, keepdim=True)
        next_value = next_q_target.gather(-1, best).squeeze(-1)
    return reward + discount * (~terminated).to(reward.dtype) * next_value


def nstep_transitions(batch: TensorDictBase, *, n: int, gamma: float) -> TensorDict:
    r"""Turn a collector batch ``[N, T]`` into n-step transitions ``[N * T]``.

    For step :math:`t` of env :math:`i`, with :math:`m \le n` the number of steps until (and
    including) the first done step, or until the batch ends:

    - ``("next", "reward")`` :math:`= \sum_{k<m} \gamma^k r_{t+k}`;
    - ``("next", "observation")`` / ``("next", "terminated")`` / ``("next", "done")``: those
      of step :math:`t + m - 1` (a truncated window bootstraps from the true final state);
    - :data:`BOOTSTRAP_DISCOUNT` :math:`= \gamma^m` ``[N * T, 1]``.

    ``observation`` and ``action`` are those of step :math:`t` (and ``action_mask``, when the
    batch holds one; ``("next", "action_mask")`` is then step :math:`t + m - 1`'s, the mask
    of the state the target bootstraps from). Windows are cut at the end
    of the batch rather than carried into the next one, so the last :math:`n - 1` steps of
    each env hold shorter (still exact) returns.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1 (steps per transition), got {n!r}")
    if batch.batch_dims != 2:
        raise ValueError(
            f"nstep_transitions needs a collector batch [N envs, T steps], got batch_size "
            f"{list(batch.batch_size)}"
        )
    num, steps = batch.batch_size
    reward = batch.get(keys.REWARD).reshape(num, steps)
    done = batch.get(keys.DONE).reshape(num, steps)
    device = reward.device
    t = torch.arange(steps, device=device).expand(num, steps)
    total = torch.zeros_like(reward)
    end = t.clone()
    alive = torch.ones(num, steps, dtype=torch.bool, device=device)
    for k in range(n):
        index = t + k
        valid = alive & (index < steps)
        clamped = index.clamp(max=steps - 1)
        total = total + torch.where(valid, gamma**k * reward.gather(1, clamped), 0.0)
        end = torch.where(valid, index, end)
        alive = valid & ~done.gather(1, clamped)
    length = (end - t + 1).to(reward.dtype)
    rows = torch.arange(num, device=device)[:, None].expand(num, steps)
    masked = batch.get(keys.ACTION_MASK, None) is not None
    now = (
        (keys.OBSERVATION, keys.ACTION, keys.ACTION_MASK)
        if masked
        else (keys.OBSERVATION, keys.ACTION)
    )
    out = batch.select(*now).clone()
    nxt = batch.get(keys.NEXT)
    later = (keys.OBSERVATION, keys.TERMINATED[-1], keys.DONE[-1])
    for key in (*later, keys.ACTION_MASK) if masked else later:
        out.set((keys.NEXT, key), nxt.get(key)[rows, end])
    out.set(keys.REWARD, total.unsqueeze(-1))
    out.set(BOOTSTRAP_DISCOUNT, torch.pow(gamma, length).unsqueeze(-1))
    return out.reshape(-1)


# ---------------------------------------------------------------------------------------
# Shared readers (DQN and SAC)
# ---------------------------------------------------------------------------------------
def read_discrete_action(action: Tensor, batch: torch.Size, n_actions: int, *, owner: str):
    """Action indices ``[B]`` from int64 indices ``[B]`` or one-hot vectors ``[B, n]``."""
    if action.is_floating_point():
        raise TypeError(
            f"{owner} needs discrete actions (int64 indices or one-hot vectors), got "
            f"{action.dtype} actions of shape {list(action.shape)}: a continuous action "
            "space has no Q(s, .) vector to index; use SACLoss (recipes/sac.py) for "
            "continuous actions"
        )
    if action.shape == batch:
        return action.long()
    if action.shape == (*batch, n_actions):
        return action.long().argmax(-1)
    raise ValueError(
        f"{owner}: action has shape {list(action.shape)}; expected indices {list(batch)} or "
        f"one-hot {[*batch, n_actions]}"
    )


def weighted_mean(values: Tensor, weight: Tensor | None, norm: str = "max") -> Tensor:
    """Importance-weighted mean of ``values`` ``[B]`` (plain mean without weights).

    ``norm="max"``: :math:`\\frac1B \\sum_i w_i v_i`, for weights already divided by their
    maximum (Schaul et al.; TorchRL's ``PrioritizedSampler``); ``"sum"``:
    :math:`\\sum_i w_i v_i / \\sum_i w_i`.
    """
    if weight is None:
        return values.mean()
    if norm == "sum":
        return (weight * values).sum() / weight.sum()
    return (weight * values).mean()


def check_priority_weights(owner: str, priority_weights: str | None) -> str | None:
    if priority_weights is not None and priority_weights not in PRIORITY_WEIGHT_NORMS:
        raise ValueError(
            f"{owner}: priority_weights must be None (uniform replay) or one of "
            f"{PRIORITY_WEIGHT_NORMS}, got {priority_weights!r}."
        )
    return priority_weights


def read_weight(tensordict: TensorDictBase, key: NestedKey) -> Tensor | None:
    weight = tensordict.get(key, None)
    if weight is None:
        return None
    return weight.reshape(tensordict.batch_size).detach().to(torch.float32)


def importance_weight(
    tensordict: TensorDictBase, key: NestedKey, priority_weights: str | None, *, owner: str
) -> Tensor | None:
    """The batch's importance weights ``[B]`` for a loss built with ``priority_weights``
    ``"max"``/``"sum"`` (required), ``None`` for uniform replay. A batch that carries weights
    a loss was built to ignore is an error, not a silently unweighted loss."""
    if priority_weights is not None:
        return read_weight(tensordict, key)
    if tensordict.get(key, None) is not None:
        raise ValueError(
            f"{owner}: the batch carries {keys.describe(key)} (prioritized replay's importance "
            "weights) but the loss was built with priority_weights=None and would ignore "
            "them: pass priority_weights='max' (Schaul et al.) or 'sum'"
        )
    return None


def read_transition(tensordict: TensorDictBase, discount_key: NestedKey | None, gamma: float):
    """``(reward [B], terminated [B] bool, discount)`` of a batch of transitions."""
    batch = tensordict.batch_size
    reward = tensordict.get(keys.REWARD).reshape(batch)
    terminated = tensordict.get(keys.TERMINATED).reshape(batch)
    if discount_key is None:
        return reward, terminated, gamma
    return reward, terminated, tensordict.get(discount_key).reshape(batch)


def check_q_network(owner: str, q_network: nn.Module, out_key: NestedKey, what: str) -> None:
    if not (isinstance(q_network, nn.Module) and hasattr(q_network, "out_keys")):
        raise TypeError(
            f"{owner}: the Q network must be a TensorDict module with in_keys/out_keys "
            f"(e.g. rlkit.modules.{what}); got {type(q_network).__name__}"
        )
    if out_key not in list(q_network.out_keys):
        raise TypeError(
            f"{owner}: the Q network writes {list(q_network.out_keys)} but the loss reads "
            f"{keys.describe(out_key)}: build it with rlkit.modules.{what}"
        )


# ---------------------------------------------------------------------------------------
# The loss module
# ---------------------------------------------------------------------------------------
class DQNLoss(LossBase):
    r"""DQN temporal-difference loss with a target network (see the module docstring).

    Keys read: the Q network's ``in_keys`` (``observation``) and the same under ``"next"``;
    ``action`` (int64 ``[B]`` or one-hot ``[B, n]``); ``("next", "reward")`` ``[B, 1]``;
    ``("next", "terminated")`` ``[B, 1]``; :data:`BOOTSTRAP_DISCOUNT` ``[B, 1]`` when
    ``n_steps > 1``; :data:`PRIORITY_WEIGHT` ``[B]`` when built with ``priority_weights``.
    The Q network writes ``action_value`` ``[B, n]``.

    Returns ``loss_value`` (the TD loss) and detached diagnostics ``value_mean`` (mean
    :math:`Q(s, a)`), ``target_mean`` and ``td_error`` ``[B]`` (:math:`|Q(s,a) - y|`, the
    new priorities for prioritized replay).

    Args:
        q_network: :math:`Q_\theta(s, \cdot)`, e.g. :func:`rlkit.modules.q_critic_discrete`.
        gamma: discount :math:`\gamma` of one step (0.99).
        loss_type: ``"huber"`` (default; :math:`\delta = 1`) or ``"mse"``
            (:math:`\tfrac12 e^2`).
        double_dqn: the online network picks the bootstrap action (van Hasselt et al.).
        n_steps: transitions are n-step (read :data:`BOOTSTRAP_DISCOUNT`).
        target_update: ``"hard"`` (copy every ``target_period`` gradient steps) or
            ``"soft"`` (Polyak with ``tau`` every ``target_period`` steps); see
            :class:`rlkit.modules.TargetNetwork`. Call :meth:`update_target` after each
            optimiser step.
        priority_weights: ``None`` (uniform replay: no importance weights; a batch carrying
            them is an error), ``"max"`` (prioritized replay, Schaul et al.: the mean of
            :math:`w_i \ell_i` with the sampler's max-normalised weights) or ``"sum"``
            (:math:`\sum_i w_i \ell_i / \sum_i w_i`). With either, the weights are a
            declared input (``in_keys``).

    Example:
        >>> from rlkit.modules import q_critic_discrete
        >>> loss = DQNLoss(q_critic_discrete(4, 2), gamma=0.99)
        >>> td = TensorDict({"observation": torch.zeros(3, 4), "action": torch.zeros(3).long(),
        ...     "next": {"observation": torch.zeros(3, 4), "reward": torch.ones(3, 1),
        ...              "terminated": torch.ones(3, 1, dtype=torch.bool)}}, [3])
        >>> out = loss(td)
        >>> sorted(out.keys()), out["target_mean"].item()
        (['loss_value', 'target_mean', 'td_error', 'value_mean'], 1.0)
    """

    @dataclass
    class _AcceptedKeys:
        action: NestedKey = keys.ACTION
        action_value: NestedKey = keys.ACTION_VALUE
        bootstrap_discount: NestedKey = BOOTSTRAP_DISCOUNT
        priority_weight: NestedKey = PRIORITY_WEIGHT

    def __init__(
        self,
        q_network: nn.Module,
        *,
        gamma: float = 0.99,
        loss_type: str = "huber",
        double_dqn: bool = False,
        n_steps: int = 1,
        target_update: str = "hard",
        target_period: int = 1,
        tau: float = 1.0,
        priority_weights: str | None = None,
    ) -> None:
        super().__init__()
        owner = type(self).__name__
        check_q_network(owner, q_network, keys.ACTION_VALUE, "q_critic_discrete")
        self.priority_weights = check_priority_weights(owner, priority_weights)
        self.q_network = q_network
        self.gamma = check_float(owner, "gamma", gamma, positive=False)
        if self.gamma > 1:
            raise ValueError(f"{owner}: gamma must be in [0, 1], got {gamma!r}.")
        self.loss_type = _check_choice(owner, "loss_type", loss_type, VALUE_LOSS_TYPES)
        if not isinstance(double_dqn, bool):
            raise TypeError(f"{owner}: double_dqn must be True or False, got {double_dqn!r}.")
        self.double_dqn = double_dqn
        if isinstance(n_steps, bool) or not isinstance(n_steps, int) or n_steps < 1:
            raise ValueError(f"{owner}: n_steps must be an int >= 1, got {n_steps!r}.")
        self.n_steps = n_steps
        self.target_network = TargetNetwork(
            q_network, mode=target_update, period=target_period, tau=tau
        )

    @classmethod
    def default_keys(cls) -> _AcceptedKeys:
        return cls._AcceptedKeys()

    @property
    def in_keys(self) -> list[NestedKey]:
        found = list(self.q_network.in_keys)
        found += [(keys.NEXT, *((k,) if isinstance(k, str) else k)) for k in found]
        found += [self.tensor_keys.action, keys.REWARD, keys.TERMINATED]
        if self.n_steps > 1:
            found.append(self.tensor_keys.bootstrap_discount)
        if self.priority_weights is not None:
            found.append(self.tensor_keys.priority_weight)
        return found

    def update_target(self) -> bool:
        """Count one gradient step; update the target when due. Returns whether it did."""
        return self.target_network.step()

    def _needs(self) -> dict[NestedKey, str]:
        needs = dict.fromkeys(self.q_network.in_keys, READ_BY_NETWORK)
        for key in self.q_network.in_keys:
            needs[(keys.NEXT, *((key,) if isinstance(key, str) else key))] = WRITTEN_BY_ENV
        needs[self.tensor_keys.action] = "the collecting policy writes it"
        needs[keys.REWARD] = WRITTEN_BY_ENV
        needs[keys.TERMINATED] = WRITTEN_BY_ENV
        if self.n_steps > 1:
            needs[self.tensor_keys.bootstrap_discount] = WRITTEN_BY_NSTEP
        if self.priority_weights is not None:
            needs[self.tensor_keys.priority_weight] = WRITTEN_BY_SAMPLER
        return needs

    def _q_values(self, network: nn.Module, tensordict: TensorDictBase) -> Tensor:
        q = call_network(network, tensordict, self.tensor_keys.action_value)
        if q.dim() != tensordict.batch_dims + 1:
            raise ValueError(
                f"{type(self).__name__}: the Q network wrote action_value of shape "
                f"{list(q.shape)}; expected [*batch, n_actions]"
            )
        return q

    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        owner = type(self).__name__
        require_keys(tensordict, self._needs(), owner=owner)
        q_all = self._q_values(self.q_network, tensordict)
        action = read_discrete_action(
            tensordict.get(self.tensor_keys.action),
            tensordict.batch_size,
            q_all.shape[-1],
            owner=owner,
        )
        q = q_all.gather(-1, action.unsqueeze(-1)).squeeze(-1)
        discount_key = self.tensor_keys.bootstrap_discount if self.n_steps > 1 else None
        reward, terminated, discount = read_transition(tensordict, discount_key, self.gamma)
        with torch.no_grad():
            next_td = tensordict.get(keys.NEXT)
            next_target = self._q_values(self.target_network, next_td)
            next_online = self._q_values(self.q_network, next_td) if self.double_dqn else None
            target = dqn_td_target(
                reward, next_target, terminated, discount=discount, next_q_online=next_online
            )
        weight = importance_weight(
            tensordict, self.tensor_keys.priority_weight, self.priority_weights, owner=owner
        )
        error = q - target
        pointwise = _pointwise_value_loss(error, self.loss_type)
        loss = weighted_mean(pointwise, weight, self.priority_weights or "max")
        out = {
            LOSS_VALUE: loss,
            VALUE_MEAN: q.detach().mean(),
            TARGET_MEAN: target.mean(),
            TD_ERROR: error.detach().abs(),
        }
        return TensorDict(out, batch_size=[])

    def extra_repr(self) -> str:
        return (
            f"gamma={self.gamma}, loss_type={self.loss_type!r}, double_dqn={self.double_dqn}, "
            f"n_steps={self.n_steps}, priority_weights={self.priority_weights!r}"
        )
