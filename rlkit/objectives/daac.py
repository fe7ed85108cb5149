r"""DAAC's losses (Raileanu & Fergus 2021) as TorchRL ``LossModule`` s.

Decoupled Advantage Actor-Critic trains two networks with two losses: the policy network
(a trunk, a policy head and an advantage head conditioned on the action) with
:class:`DAACLoss`, and a separate value network with :class:`DAACValueLoss`. The value
network only serves the advantage estimator (GAE); the policy network never sees a value
gradient, only the advantage regression, which carries less instance-specific information
than the value and so overfits less (the paper's argument).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import NestedKey, TensorDict, TensorDictBase
from torch import Tensor, nn

from rlkit import keys
from rlkit.modules.direct import actor_dist, module_output
from rlkit.objectives.common import (
    ADVANTAGE_MEAN,
    ADVANTAGE_STD,
    APPROX_KL,
    CLIP_FRACTION,
    ENTROPY,
    EXPLAINED_VARIANCE,
    LOSS_ENTROPY,
    LOSS_POLICY,
    LOSS_VALUE,
    RATIO_MEAN,
    READ_BY_NETWORK,
    VALUE_MEAN,
    WRITTEN_BY_ACTOR,
    WRITTEN_BY_BEHAVIOUR_ACTOR,
    WRITTEN_BY_COLLECTION_CRITIC,
    WRITTEN_BY_ESTIMATOR,
    Hyperparameter,
    LossBase,
    _check_choice,
    distribution_entropy,
    per_sample_log_prob,
    positive,
    read_column,
    read_per_sample,
    require_keys,
    weighted,
)
from rlkit.objectives.functional import (
    VALUE_LOSS_TYPES,
    approx_kl,
    clipped_surrogate,
    clipped_value_loss,
    explained_variance,
    standardize,
    value_loss,
)

__all__ = [
    "ADVANTAGE_NORMS",
    "ADVANTAGE_TARGETS",
    "LOSS_ADVANTAGE",
    "NORMALIZED_ADVANTAGE",
    "DAACLoss",
    "DAACValueLoss",
]

#: ``advantage_target`` choices: the advantage head regresses the normalised advantage (the
#: authors' code) or the raw one (the config layer lists the same names, torch-free;
#: tests/test_layout.py checks that the lists agree)
ADVANTAGE_TARGETS = ("normalized", "raw")
#: ``advantage_norm`` choices, over what the advantage is standardised: the whole batch (the
#: authors' code) or each minibatch
ADVANTAGE_NORMS = ("batch", "minibatch")

LOSS_ADVANTAGE = "loss_advantage"
#: Diagnostic: how much of the advantage target's variance the advantage head explains.
ADVANTAGE_EXPLAINED_VARIANCE = "advantage_explained_variance"
#: The batch-standardised advantage ``[*, 1]``, written by :meth:`DAACLoss.standardize_batch`.
NORMALIZED_ADVANTAGE = keys.NORMALIZED_ADVANTAGE


def _check_policy_networks(actor: object, advantage_head: object) -> None:
    if not (isinstance(actor, nn.Module) and callable(getattr(actor, "get_dist", None))):
        raise TypeError(
            "DAACLoss: actor must be an nn.Module with get_dist(td) and in_keys, such as "
            f"torchrl.modules.ProbabilisticActor; got {type(actor).__name__}."
        )
    out_keys = list(getattr(advantage_head, "out_keys", []) or [])
    if not isinstance(advantage_head, nn.Module) or keys.ADVANTAGE_PRED not in out_keys:
        raise TypeError(
            "DAACLoss: advantage_head must be a TensorDict module reading the observation and "
            f"the action and writing keys.ADVANTAGE_PRED ({keys.ADVANTAGE_PRED!r}) [*, 1] "
            "(see rlkit.modules.daac_networks.advantage_head); got "
            f"{type(advantage_head).__name__} with out_keys {out_keys}."
        )


class DAACLoss(LossBase):
    r"""DAAC's policy-network loss: clipped surrogate, entropy bonus, advantage regression.

    With :math:`r_i = \pi_\theta(a_i|s_i) / \mu(a_i|s_i)` (μ: the collecting policy),
    GAE advantages :math:`\hat A_i` written by a value estimator that uses the *separate*
    value network, :math:`\tilde A_i` the advantage the surrogate uses (with
    ``normalize_advantage``, :math:`\hat A` standardised once over the whole batch, or per
    minibatch with ``advantage_norm="minibatch"``; else :math:`\hat A_i`) and the advantage head
    :math:`A_\theta(s_i, a_i)` on the policy network:

    .. math::
        \text{loss\_policy} &= -\frac1N\sum_i \min\big(r_i \tilde A_i,\
            \mathrm{clip}(r_i, 1-\epsilon, 1+\epsilon)\tilde A_i\big) \\
        \text{loss\_advantage} &= \alpha_a \frac1N\sum_i \big(A_\theta(s_i, a_i) - y_i\big)^2,
            \qquad y_i = \tilde A_i \ (\texttt{"normalized"})\ \text{or}\ \hat A_i\
            (\texttt{"raw"}) \\
        \text{loss\_entropy} &= -\alpha_s \frac1N\sum_i H[\pi_\theta(\cdot|s_i)]

    so the policy network maximises :math:`J_\pi + \alpha_s S_\pi - \alpha_a L_A` (paper,
    eq. 3). The squared error has no 1/2, as in the paper and the reference code.

    Advantage target: the paper's text writes :math:`L_A = \hat{\mathbb E}[(A_\theta(s,a) -
    \hat A)^2]` with :math:`\hat A` "the generalised advantage estimate"; the authors' code
    (``rraileanu/idaac``, ``ppo_daac_idaac/algo/daac.py``) regresses on ``adv_targ``, the
    advantage *after* its per-batch standardisation, the same tensor the surrogate uses.
    ``advantage_target="normalized"`` (default) follows the code, ``"raw"`` the text.

    Standardisation: the authors' code standardises :math:`\hat A` once per batch (unbiased
    std), before minibatching; ``advantage_norm="batch"`` (default) does the same. The loss
    sees one minibatch at a time, so the learner first calls :meth:`standardize_batch` on the
    whole batch, which writes the standardised advantage to ``"normalized_advantage"``; the
    loss then declares that key in ``in_keys`` and reads it (called directly on a tensordict
    without it, the loss takes that tensordict as the batch and standardises over it).
    ``advantage_norm="minibatch"`` standardises within each minibatch instead (PPO's habit).

    Keys read (defaults from :mod:`rlkit.keys`, renamable with ``set_keys``):

    * the actor's and the advantage head's ``in_keys`` (``keys.OBSERVATION``, and
      ``keys.ACTION`` for the head);
    * ``keys.ACTION`` ``[*]`` int64 (discrete) or ``[*, A]``;
    * ``keys.ACTION_LOG_PROB`` ``[*]`` or ``[*, 1]``: log μ(a|s), stored at collection;
    * ``keys.ADVANTAGE`` ``[*, 1]``: written by a value estimator (``rlkit.value.GAE``);
    * ``"normalized_advantage"`` ``[*, 1]`` (with ``normalize_advantage`` and
      ``advantage_norm="batch"``): written by :meth:`standardize_batch`.

    The advantage head must write ``keys.ADVANTAGE_PRED`` ``[*, 1]``, the prediction at the
    stored action; it runs on a shallow selection of the batch, so the input is never
    written to.

    Writes (no batch dimensions): ``loss_policy``, ``loss_advantage``, ``loss_entropy``
    (weighted; sum them) and detached diagnostics ``approx_kl`` (k3 estimator),
    ``clip_fraction``, ``ratio_mean``, ``entropy``, ``advantage_mean``, ``advantage_std``
    (of :math:`\hat A` as read) and ``advantage_explained_variance`` (of the head's fit).

    Args:
        actor: a ``ProbabilisticActor`` (``get_dist(td)``, ``in_keys``).
        advantage_head: a TensorDict module writing ``keys.ADVANTAGE_PRED`` ``[*, 1]``;
            normally it shares the actor's trunk (``rlkit.modules.daac_networks.daac_networks``).
        clip_epsilon: :math:`\epsilon > 0`, typically 0.1 to 0.3; assignable (schedules).
        entropy_coef: :math:`\alpha_s \ge 0`; the paper uses 0.01 on Procgen.
        adv_coef: :math:`\alpha_a \ge 0`; the paper uses 0.25 (0.05 to 0.25 searched).
            0 turns DAAC into PPO with a separate value network.
        normalize_advantage: standardise :math:`\hat A` for the surrogate (default ``True``).
        advantage_norm: ``"batch"`` (default, the authors' code: once over the whole batch,
            see :meth:`standardize_batch`) or ``"minibatch"``.
        advantage_target: ``"normalized"`` or ``"raw"``, see above.
        entropy_samples: Monte-Carlo samples for entropies without a closed form.

    Gradient routing: every term reaches only the actor's and the advantage head's
    parameters (the policy network); the value network gets its gradient from
    :class:`DAACValueLoss` only.

    Reference: Raileanu & Fergus 2021, "Decoupling Value and Policy for Generalization in
    Reinforcement Learning", ICML, Section 4 and Algorithm 1; ``rraileanu/idaac``.

    Example:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> from torchrl.modules import ProbabilisticActor
        >>> from rlkit import keys
        >>> from rlkit.objectives import total_loss
        >>> actor = ProbabilisticActor(
        ...     TensorDictModule(torch.nn.Linear(3, 2), [keys.OBSERVATION], [keys.LOGITS]),
        ...     in_keys=[keys.LOGITS], distribution_class=torch.distributions.Categorical,
        ...     return_log_prob=True, log_prob_key=keys.ACTION_LOG_PROB)
        >>> class Head(torch.nn.Module):  # one output per action, gathered at the action
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.net = torch.nn.Linear(3, 2)
        ...     def forward(self, obs, action):
        ...         return self.net(obs).gather(-1, action.unsqueeze(-1))
        >>> head = TensorDictModule(Head(), [keys.OBSERVATION, keys.ACTION],
        ...                         [keys.ADVANTAGE_PRED])
        >>> td = actor(TensorDict({keys.OBSERVATION: torch.randn(5, 3)}, batch_size=[5]))
        >>> td[keys.ADVANTAGE] = torch.randn(5, 1)    # normally written by rlkit.value.GAE
        >>> out = DAACLoss(actor, head, adv_coef=0.25)(td)
        >>> sorted(k for k in out.keys() if k.startswith("loss_"))
        ['loss_advantage', 'loss_entropy', 'loss_policy']
        >>> total_loss(out).backward()
    """

    clip_epsilon = Hyperparameter(positive=True, hint="typical 0.1 to 0.3")
    entropy_coef = Hyperparameter(positive=False, hint="typical 0 to 0.01")
    adv_coef = Hyperparameter(positive=False, hint="the paper uses 0.25; 0 disables the head")

    @dataclass
    class _AcceptedKeys:
        """Input keys, renamable with ``loss.set_keys(name=key)``."""

        action: NestedKey = keys.ACTION
        action_log_prob: NestedKey = keys.ACTION_LOG_PROB
        advantage: NestedKey = keys.ADVANTAGE
        advantage_pred: NestedKey = keys.ADVANTAGE_PRED
        normalized_advantage: NestedKey = NORMALIZED_ADVANTAGE

    _diagnostics = (
        APPROX_KL,
        CLIP_FRACTION,
        RATIO_MEAN,
        ENTROPY,
        ADVANTAGE_MEAN,
        ADVANTAGE_STD,
        ADVANTAGE_EXPLAINED_VARIANCE,
    )

    def __init__(
        self,
        actor: nn.Module,
        advantage_head: nn.Module,
        *,
        clip_epsilon: float = 0.2,
        entropy_coef: float = 0.0,
        adv_coef: float = 0.25,
        normalize_advantage: bool = True,
        advantage_target: str = "normalized",
        advantage_norm: str = "batch",
        entropy_samples: int = 1,
    ) -> None:
        super().__init__()
        _check_policy_networks(actor, advantage_head)
        self.actor, self.advantage_head = actor, advantage_head
        self.clip_epsilon = clip_epsilon
        self.entropy_coef = entropy_coef
        self.adv_coef = adv_coef
        if not isinstance(normalize_advantage, bool):
            raise ValueError(
                f"DAACLoss: normalize_advantage must be True or False, got {normalize_advantage!r}."
            )
        self.normalize_advantage = normalize_advantage
        self.advantage_target = _check_choice(
            "DAACLoss", "advantage_target", advantage_target, ADVANTAGE_TARGETS
        )
        self.advantage_norm = _check_choice(
            "DAACLoss", "advantage_norm", advantage_norm, ADVANTAGE_NORMS
        )
        if isinstance(entropy_samples, bool) or not isinstance(entropy_samples, int):
            raise TypeError(f"DAACLoss: entropy_samples must be an int, got {entropy_samples!r}.")
        if entropy_samples < 1:
            raise ValueError(f"DAACLoss: entropy_samples must be >= 1, got {entropy_samples}.")
        self.entropy_samples = entropy_samples
        #: when False, ``forward`` returns only the ``loss_*`` terms (cheaper inner epochs)
        self.diagnostics = True

    # -- TorchRL LossModule plumbing -------------------------------------------------
    @classmethod
    def default_keys(cls) -> _AcceptedKeys:
        return cls._AcceptedKeys()

    @property
    def in_keys(self) -> list[NestedKey]:
        found: list[NestedKey] = []
        for key in [*self.actor.in_keys, *self.advantage_head.in_keys, *self._required_keys()]:
            if key not in found:
                found.append(key)
        if self._batch_standardized:
            found.append(self.tensor_keys.normalized_advantage)
        return found

    @property
    def _batch_standardized(self) -> bool:
        return self.normalize_advantage and self.advantage_norm == "batch"

    def standardize_batch(self, tensordict: TensorDictBase) -> TensorDictBase:
        r"""Write the advantage standardised over the whole ``tensordict`` (the batch, before
        minibatching) to ``"normalized_advantage"`` ``[*, 1]``, as the authors' code does
        once per batch. A no-op unless ``normalize_advantage`` and ``advantage_norm="batch"``.
        """
        if self._batch_standardized:
            owner = "DAACLoss"
            require_keys(
                tensordict, {self.tensor_keys.advantage: WRITTEN_BY_ESTIMATOR}, owner=owner
            )
            advantage = read_column(tensordict, self.tensor_keys.advantage, owner=owner)
            tensordict.set(
                self.tensor_keys.normalized_advantage,
                standardize(advantage.detach()).unsqueeze(-1),
            )
        return tensordict

    @property
    def out_keys(self) -> list[str]:
        return [LOSS_POLICY, LOSS_ADVANTAGE, LOSS_ENTROPY, *self._diagnostics]

    def make_value_estimator(self, value_type: object = None, **hyperparams: object) -> None:
        raise NotImplementedError(
            "DAACLoss does not estimate advantages: run rlkit.value.GAE with the value "
            "network on the batch before calling the loss."
        )

    def extra_repr(self) -> str:
        names = (
            "clip_epsilon",
            "entropy_coef",
            "adv_coef",
            "normalize_advantage",
            "advantage_target",
            "advantage_norm",
        )
        return ", ".join(f"{name}={getattr(self, name)!r}" for name in names)

    # -- forward -------------------------------------------------------------------------
    def _required_keys(self) -> dict[NestedKey, str]:
        needs = dict.fromkeys([*self.actor.in_keys, *self.advantage_head.in_keys], READ_BY_NETWORK)
        needs[self.tensor_keys.action] = WRITTEN_BY_ACTOR
        needs[self.tensor_keys.action_log_prob] = WRITTEN_BY_BEHAVIOUR_ACTOR
        needs[self.tensor_keys.advantage] = WRITTEN_BY_ESTIMATOR
        return needs

    def advantage_prediction(self, tensordict: TensorDictBase) -> Tensor:
        r""":math:`A_\theta(s, a)` at the stored action, ``[*batch]`` (computed on a copy)."""
        key = self.tensor_keys.advantage_pred
        pred = module_output(self.advantage_head, tensordict, key)
        batch = tensordict.batch_size
        if pred.shape != (*batch, 1):
            raise ValueError(
                f"DAACLoss: the advantage head wrote {keys.describe(key)} of shape "
                f"{list(pred.shape)}, expected {[*batch, 1]}: one prediction per sample, at "
                "the stored action (gather a per-action head at the action index)."
            )
        return pred.squeeze(-1)

    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        owner = "DAACLoss"
        require_keys(tensordict, self._required_keys(), owner=owner)
        advantage = read_column(tensordict, self.tensor_keys.advantage, owner=owner).detach()
        behaviour = read_per_sample(tensordict, self.tensor_keys.action_log_prob, owner=owner)
        dist = actor_dist(self.actor, tensordict)
        action = tensordict.get(self.tensor_keys.action)
        log_prob = per_sample_log_prob(dist, action, tensordict.batch_size, owner=owner)
        pred = self.advantage_prediction(tensordict)

        used = self._surrogate_advantage(tensordict, advantage)
        target = used if self.advantage_target == "normalized" else advantage
        log_ratio = log_prob - behaviour.detach()
        loss_policy, clip_fraction = clipped_surrogate(
            log_ratio, used, clip_epsilon=self.clip_epsilon
        )
        out = {
            LOSS_POLICY: loss_policy,
            LOSS_ADVANTAGE: self.adv_coef * (pred - target).pow(2).mean(),
        }
        out.update(self._entropy_terms(dist))
        if not self.diagnostics:
            return TensorDict({k: v for k, v in out.items() if k != ENTROPY}, batch_size=[])
        log_ratio = log_ratio.detach()
        out[APPROX_KL] = approx_kl(log_ratio)
        out[CLIP_FRACTION] = clip_fraction
        out[RATIO_MEAN] = log_ratio.exp().mean()
        out[ADVANTAGE_MEAN] = advantage.mean()
        out[ADVANTAGE_STD] = advantage.std(correction=0)
        out[ADVANTAGE_EXPLAINED_VARIANCE] = explained_variance(pred.detach(), target)
        return TensorDict(out, batch_size=[])

    def _surrogate_advantage(self, tensordict: TensorDictBase, advantage: Tensor) -> Tensor:
        if not self.normalize_advantage:
            return advantage
        key = self.tensor_keys.normalized_advantage
        if self.advantage_norm == "batch" and key in tensordict.keys(include_nested=True):
            return read_column(tensordict, key, owner="DAACLoss").detach()
        return standardize(advantage)  # per minibatch, or the tensordict given is the batch

    def _entropy_terms(self, dist) -> dict[str, Tensor]:
        if positive(self, "entropy_coef"):
            entropy = distribution_entropy(dist, num_samples=self.entropy_samples).mean()
            loss = -weighted(self.entropy_coef, entropy)
            return {LOSS_ENTROPY: loss, ENTROPY: entropy.detach()}
        with torch.no_grad():
            entropy = distribution_entropy(dist, num_samples=self.entropy_samples).mean()
        return {LOSS_ENTROPY: torch.zeros_like(entropy), ENTROPY: entropy}


class DAACValueLoss(LossBase):
    r"""DAAC's value-network loss: regression of :math:`V_\phi(s)` on the GAE value target.

    .. math::
        \text{loss\_value} = c_v \frac1N\sum_i \tfrac12 (V_\phi(s_i) - \hat V_i)^2
        \quad\text{or, clipped,}\quad
        c_v \frac1N\sum_i \tfrac12 \max\big((V_\phi - \hat V_i)^2,
        (V^{old}_i + \mathrm{clip}(V_\phi - V^{old}_i, -\epsilon_v, \epsilon_v) - \hat V_i)^2\big)

    with :math:`\hat V_i = \hat A_i + V^{old}_i` (GAE's ``value_target``) and
    :math:`V^{old}` the value at collection. With ``value_coef=1`` (default) this is the
    reference's ``0.5 * max(...)``. The value network has its own optimiser, so
    ``value_coef`` only rescales its gradient (before clipping).

    Keys read: the critic's ``in_keys``; ``keys.VALUE_TARGET`` ``[*, 1]``;
    ``keys.STATE_VALUE`` ``[*, 1]`` (collection-time, only with ``value_clip_epsilon``;
    the loss computes :math:`V_\phi` into a local tensor and never overwrites it).
    Writes: ``loss_value`` and detached ``explained_variance``, ``value_mean``.

    Args:
        critic: a TensorDict module writing ``keys.STATE_VALUE`` ``[*, 1]``.
        value_coef: :math:`c_v \ge 0`.
        value_clip_epsilon: :math:`\epsilon_v > 0` (the reference clips with the policy's
            clip range, 0.2) or ``None`` for the plain regression.
        value_loss: ``"mse"`` or ``"huber"``.

    Gradient routing: reaches only the critic's parameters.

    Example:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> critic = TensorDictModule(torch.nn.Linear(3, 1), [keys.OBSERVATION],
        ...                           [keys.STATE_VALUE])
        >>> td = TensorDict({keys.OBSERVATION: torch.randn(5, 3),
        ...                  keys.VALUE_TARGET: torch.randn(5, 1)}, batch_size=[5])
        >>> out = DAACValueLoss(critic)(td)
        >>> out["loss_value"].backward()
    """

    value_coef = Hyperparameter(positive=False, hint="typical 0.5 to 1")
    value_clip_epsilon = Hyperparameter(positive=True, optional=True, hint="or None: no clip")

    @dataclass
    class _AcceptedKeys:
        """Input keys, renamable with ``loss.set_keys(name=key)``."""

        value_target: NestedKey = keys.VALUE_TARGET
        state_value: NestedKey = keys.STATE_VALUE

    def __init__(
        self,
        critic: nn.Module,
        *,
        value_coef: float = 1.0,
        value_clip_epsilon: float | None = None,
        value_loss: str = "mse",
    ) -> None:
        super().__init__()
        if not (isinstance(critic, nn.Module) and keys.STATE_VALUE in list(critic.out_keys)):
            raise TypeError(
                "DAACValueLoss: critic must be a TensorDict module writing keys.STATE_VALUE "
                f"[*, 1] (e.g. rlkit.modules.make_value); got {type(critic).__name__}."
            )
        self.critic = critic
        self.value_coef = value_coef
        self.value_clip_epsilon = value_clip_epsilon
        self.value_loss = _check_choice("DAACValueLoss", "value_loss", value_loss, VALUE_LOSS_TYPES)
        self.diagnostics = True

    @classmethod
    def default_keys(cls) -> _AcceptedKeys:
        return cls._AcceptedKeys()

    def _required_keys(self) -> dict[NestedKey, str]:
        needs = dict.fromkeys(self.critic.in_keys, READ_BY_NETWORK)
        needs[self.tensor_keys.value_target] = WRITTEN_BY_ESTIMATOR
        if self.value_clip_epsilon is not None:
            needs[self.tensor_keys.state_value] = WRITTEN_BY_COLLECTION_CRITIC
        return needs

    @property
    def in_keys(self) -> list[NestedKey]:
        return list(self._required_keys())

    @property
    def out_keys(self) -> list[str]:
        return [LOSS_VALUE, EXPLAINED_VARIANCE, VALUE_MEAN]

    def make_value_estimator(self, value_type: object = None, **hyperparams: object) -> None:
        raise NotImplementedError(
            "DAACValueLoss does not estimate value targets: run rlkit.value.GAE first."
        )

    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        owner = "DAACValueLoss"
        require_keys(tensordict, self._required_keys(), owner=owner)
        target = read_column(tensordict, self.tensor_keys.value_target, owner=owner).detach()
        value = module_output(self.critic, tensordict, keys.STATE_VALUE)
        if value.shape != (*tensordict.batch_size, 1):
            raise ValueError(
                f"DAACValueLoss: the critic wrote 'state_value' of shape {list(value.shape)}, "
                f"expected {[*tensordict.batch_size, 1]}: end it with a Linear(..., 1)."
            )
        value = value.squeeze(-1)
        if self.value_clip_epsilon is None:
            loss = value_loss(value, target, loss_type=self.value_loss)
        else:
            old = read_column(tensordict, self.tensor_keys.state_value, owner=owner)
            loss = clipped_value_loss(
                value,
                old,
                target,
                clip_epsilon=self.value_clip_epsilon,
                loss_type=self.value_loss,
            )
        out = {LOSS_VALUE: self.value_coef * loss}
        if self.diagnostics:
            out[EXPLAINED_VARIANCE] = explained_variance(value, target)
            out[VALUE_MEAN] = value.detach().mean()
        return TensorDict(out, batch_size=[])
