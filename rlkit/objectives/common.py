r"""Shared pieces of rlkit's loss modules: output names, key and shape checks, entropy
estimation, hyperparameter validation, and :class:`ActorCriticLoss`, the TensorDict shell
that A2C and PPO (and losses composed by users) build on.

The maths lives in :mod:`rlkit.objectives.functional`; this module reads and checks keys
and hands tensors to it.

Conventions every rlkit loss follows (TorchRL's ``LossModule`` contract):

* ``forward(td)`` returns a TensorDict with no batch dimensions. Entries named ``loss_*``
  are scalars already multiplied by their coefficients; the caller sums them
  (:func:`total_loss`). Every other entry is a detached diagnostic for logging.
* A loss reads its inputs from the keys in :mod:`rlkit.keys` (renamable with
  ``loss.set_keys(...)``), raises :class:`MissingKeyError` naming a missing key and the
  component that writes it, and never writes into the input TensorDict.
* A loss never computes advantages or value targets: a value estimator
  (``rlkit.value``) writes them first.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import NestedKey, TensorDict, TensorDictBase
from torch import Tensor, nn
from torch.distributions import Distribution
from torchrl.objectives import LossModule

from rlkit import keys
from rlkit.keys import MissingKeyError
from rlkit.modules.direct import actor_dist, module_output
from rlkit.objectives.functional import (
    VALUE_LOSS_TYPES,
    explained_variance,
    standardize,
    value_loss,
)

__all__ = [
    "ADVANTAGE_MEAN",
    "ADVANTAGE_STD",
    "APPROX_KL",
    "CLIP_FRACTION",
    "ENTROPY",
    "EXPLAINED_VARIANCE",
    "LOSS_ENTROPY",
    "LOSS_POLICY",
    "LOSS_VALUE",
    "RATIO_MEAN",
    "VALUE_MEAN",
    "ActorCriticLoss",
    "Hyperparameter",
    "LossBase",
    "MissingKeyError",
    "distribution_entropy",
    "part_metrics",
    "per_sample_log_prob",
    "read_column",
    "read_per_sample",
    "require_keys",
    "total_loss",
]

# ---------------------------------------------------------------------------------------
# Output names: ``loss_*`` terms are summed by the caller, the rest are diagnostics.
# ---------------------------------------------------------------------------------------
LOSS_POLICY = "loss_policy"
LOSS_VALUE = "loss_value"
LOSS_ENTROPY = "loss_entropy"
APPROX_KL = "approx_kl"
CLIP_FRACTION = "clip_fraction"
ENTROPY = "entropy"
EXPLAINED_VARIANCE = "explained_variance"
RATIO_MEAN = "ratio_mean"
VALUE_MEAN = "value_mean"
ADVANTAGE_MEAN = "advantage_mean"
ADVANTAGE_STD = "advantage_std"

#: Who writes each input a loss may need; quoted in :class:`MissingKeyError` messages.
WRITTEN_BY_ESTIMATOR = (
    "a value estimator (e.g. rlkit.value.GAE) must write it into the batch before the "
    "loss runs: a loss never computes advantages or value targets implicitly"
)
WRITTEN_BY_ACTOR = "the collecting actor writes it (collect the batch with the actor)"
WRITTEN_BY_BEHAVIOUR_ACTOR = (
    "the collecting actor writes log mu(a|s) when built with "
    "ProbabilisticActor(..., return_log_prob=True, log_prob_key=keys.ACTION_LOG_PROB)"
)
WRITTEN_BY_COLLECTION_CRITIC = (
    "value clipping needs the collection-time V(s): run the critic on the batch before "
    "the update (value estimators such as rlkit.value.GAE write it), or pass "
    "value_clip_epsilon=None"
)
READ_BY_NETWORK = "the actor or critic reads it; the environment writes it"


def total_loss(losses: TensorDictBase | Mapping[str, Tensor]) -> Tensor:
    """Sum of the ``loss_*`` entries of a loss module's output: the scalar to backpropagate.

    Example:
        >>> total_loss({"loss_policy": torch.tensor(1.0), "loss_value": torch.tensor(2.0),
        ...             "entropy": torch.tensor(5.0)})
        tensor(3.)
    """
    terms = [value for key, value in losses.items() if str(key).startswith("loss_")]
    if not terms:
        raise ValueError("no 'loss_*' entries to sum: pass the output of a loss module.")
    return torch.stack(list(terms)).sum()


# ---------------------------------------------------------------------------------------
# Key and shape checks
# ---------------------------------------------------------------------------------------
def require_keys(tensordict: TensorDictBase, needs: Mapping[NestedKey, str], *, owner: str):
    """Raise :class:`MissingKeyError` listing every key of ``needs`` absent from the batch.

    Args:
        tensordict: the input batch.
        needs: key -> who writes it (quoted in the message).
        owner: the component asking, e.g. ``"PPOLoss"``.

    The message starts with a short list of the keys present and ends with one line per
    missing key naming it and its writer, so the line that matters is the last one printed.
    """
    missing = [key for key in needs if tensordict.get(key, None) is None]
    if missing:
        present = keys.describe_present(tensordict.keys(True, True))
        lines = [f"  {keys.describe(key)}: {needs[key]}" for key in missing]
        raise MissingKeyError(
            f"{owner} is missing required key(s) in its input TensorDict (keys present: "
            f"{present}):\n" + "\n".join(lines)
        )


def _shape_error(owner: str, key: NestedKey, got: torch.Size, expected: str, batch) -> ValueError:
    return ValueError(
        f"{owner}: {keys.describe(key)} has shape {list(got)}, expected {expected} for a "
        f"TensorDict with batch_size {list(batch)}. Value estimators write [*batch, 1] "
        "columns; if the batch_size itself is wrong, set it to the collector's [N, T] (or "
        "the minibatch size) when building the TensorDict."
    )


def read_column(tensordict: TensorDictBase, key: NestedKey, *, owner: str) -> Tensor:
    """Read a ``[*batch, 1]`` column (advantage, value target, state value) as ``[*batch]``."""
    value = tensordict.get(key)
    batch = tensordict.batch_size
    if value.shape != (*batch, 1):
        raise _shape_error(owner, key, value.shape, str([*batch, 1]), batch)
    return value.squeeze(-1)


def read_per_sample(tensordict: TensorDictBase, key: NestedKey, *, owner: str) -> Tensor:
    """Read a per-sample quantity stored as ``[*batch]`` or ``[*batch, 1]``, as ``[*batch]``."""
    value = tensordict.get(key)
    batch = tensordict.batch_size
    if value.shape == batch:
        return value
    if value.shape == (*batch, 1):
        return value.squeeze(-1)
    raise _shape_error(owner, key, value.shape, f"{list(batch)} or {[*batch, 1]}", batch)


def per_sample_log_prob(
    dist: Distribution, action: Tensor, batch_shape: torch.Size, *, owner: str
) -> Tensor:
    """``dist.log_prob(action)``, checked to hold one log-probability per sample."""
    log_prob = dist.log_prob(action)
    if log_prob.shape != batch_shape:
        raise ValueError(
            f"{owner}: the actor's {type(dist).__name__}.log_prob(action) has shape "
            f"{list(log_prob.shape)} for an action of shape {list(action.shape)}; expected "
            f"one log-probability per sample, shape {list(batch_shape)}. Use a distribution "
            "whose log_prob sums over the action dimensions (torchrl IndependentNormal, "
            "TanhNormal, or torch.distributions.Independent(Normal(...), 1))."
        )
    return log_prob


# ---------------------------------------------------------------------------------------
# Entropy
# ---------------------------------------------------------------------------------------
def part_metrics(dist: Distribution, action: Any) -> dict[str, Tensor]:
    """Per-part diagnostics of a multi-part policy
    (:class:`~rlkit.modules.composite.MultiPartDistribution`: MultiDiscrete, MultiBinary, Dict
    actions): ``entropy_<part>`` and ``log_prob_<part>`` (at the stored action), batch means,
    detached; ``{}`` for any other distribution."""
    if not hasattr(dist, "entropy_parts"):
        return {}
    with torch.no_grad():
        out = {f"entropy_{k}": v.mean() for k, v in dist.entropy_parts().items()}
        out.update({f"log_prob_{k}": v.mean() for k, v in dist.log_prob_parts(action).items()})
    return out


def distribution_entropy(dist: Distribution, *, num_samples: int = 1) -> Tensor:
    r"""Per-sample entropy :math:`H[\pi(\cdot|s)]`, shape ``dist.batch_shape``.

    Uses the closed form ``dist.entropy()`` when the distribution has one (Categorical,
    Normal, IndependentNormal). Otherwise (TanhNormal and other transformed distributions)
    a Monte-Carlo estimate :math:`-\frac1K\sum_k \log\pi(x_k|s)` from ``num_samples``
    draws:

    * reparameterised draws (``rsample_and_log_prob`` when the distribution offers it, as
      TorchRL's TanhNormal does, so the log-prob scores the exact pre-tanh draw; else
      ``rsample``) give a pathwise gradient;
    * without ``rsample`` the estimate is built so its gradient is the score-function
      estimator :math:`-\mathbb{E}[(\log\pi + 1)\nabla\log\pi]` (unbiased; a plain
      :math:`-\log\pi(x)` of non-reparameterised draws would have zero expected gradient).
    """
    try:
        return dist.entropy()
    except NotImplementedError:
        return _monte_carlo_entropy(dist, num_samples=num_samples)


def _monte_carlo_entropy(dist: Distribution, *, num_samples: int) -> Tensor:
    shape = torch.Size([num_samples])
    if hasattr(dist, "rsample_and_log_prob"):
        _, log_prob = dist.rsample_and_log_prob(shape)
        return -log_prob.mean(0)
    if dist.has_rsample:
        return -dist.log_prob(dist.rsample(shape)).mean(0)
    log_prob = dist.log_prob(dist.sample(shape))
    fixed = log_prob.detach()
    # value: -log p;  gradient: -(1 + log p) grad log p
    return (-log_prob - fixed * (log_prob - fixed)).mean(0)


# ---------------------------------------------------------------------------------------
# Hyperparameter validation
# ---------------------------------------------------------------------------------------
def check_float(
    owner: str, name: str, value: Any, *, positive: bool, optional: bool = False, hint: str = ""
) -> float | None:
    """Validate a float hyperparameter: a finite real number, ``> 0`` or ``>= 0``."""
    if value is None and optional:
        return None
    if isinstance(value, Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        allowed = "a number or None" if optional else "a number"
        raise TypeError(f"{owner}: {name} must be {allowed}, got {value!r}.")
    value = float(value)
    bound_ok = value > 0 if positive else value >= 0
    if not (math.isfinite(value) and bound_ok):
        bound = "> 0" if positive else ">= 0"
        extra = f" ({hint})" if hint else ""
        raise ValueError(f"{owner}: {name} must be finite and {bound}, got {value!r}{extra}.")
    return value


class Hyperparameter:
    """A float attribute validated at construction and at every later assignment.

    Schedules assign new values during training (``loss.clip_epsilon = 0.1``); a bad value
    raises then instead of silently corrupting the update.

    On a loss compiled by :func:`rlkit.training.update.compile_loss` a value that changes is
    kept in a 0-dim tensor, updated in place: the compiled graph reads it as an input instead
    of specialising on the float (which recompiled at every step of an annealed clip range).
    """

    def __init__(self, *, positive: bool, optional: bool = False, hint: str = ""):
        self.positive, self.optional, self.hint = positive, optional, hint

    def __set_name__(self, owner: type, name: str) -> None:
        self.name, self.slot = name, f"_hyperparameter_{name}"

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        return self if obj is None else obj.__dict__[self.slot]

    def __set__(self, obj: Any, value: Any) -> None:
        value = check_float(
            type(obj).__name__,
            self.name,
            value,
            positive=self.positive,
            optional=self.optional,
            hint=self.hint,
        )
        # branches read the sign, which changes far less often than the value
        obj.__dict__[f"_positive_{self.name}"] = value is not None and value > 0
        held = obj.__dict__.get(self.slot)
        if value is not None and isinstance(held, Tensor):
            with torch.no_grad():
                held.fill_(value)
            return
        if value is not None and held is not None and value != held and is_compiled(obj):
            # float64, so that arithmetic with float32 tensors rounds as with a Python float
            device = next((p.device for p in obj.parameters()), None)
            value = torch.tensor(value, dtype=torch.float64, device=device)
        obj.__dict__[self.slot] = value


def is_compiled(module: Any) -> bool:
    """Whether ``module`` runs compiled: ``nn.Module.compile`` was called on it (see
    :func:`rlkit.training.update.compile_loss`) and it has not gone back to eager."""
    return module.__dict__.get("_compiled_call_impl") is not None


def weighted(coef: float | Tensor, x: Tensor) -> Tensor:
    """``coef * x`` for a hyperparameter ``coef``, rounded as with a Python float.

    A scheduled hyperparameter of a compiled loss is a float64 0-dim tensor; times a 0-dim
    float32 tensor it would promote the product to float64. Cast to ``x``'s dtype it gives
    the bits the Python float gives.
    """
    if isinstance(coef, Tensor):
        coef = coef.to(x.dtype)
    return coef * x


def positive(loss: Any, name: str) -> bool:
    """Whether hyperparameter ``name`` of ``loss`` is set and > 0, as a Python bool.

    Branch on this rather than on ``loss.<name> > 0``: on a compiled loss a scheduled value is
    a tensor, and a comparison with it would split the graph at every update.
    """
    known = loss.__dict__.get(f"_positive_{name}")
    if known is None:
        value = getattr(loss, name)
        return value is not None and float(value) > 0
    return known


def _check_choice(owner: str, name: str, value: Any, choices: Iterable[str]) -> str:
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{owner}: {name} must be one of {choices}, got {value!r}.")
    return value


def _check_networks(owner: str, actor: Any, critic: Any) -> None:
    if not (isinstance(actor, nn.Module) and callable(getattr(actor, "get_dist", None))):
        raise TypeError(
            f"{owner}: actor must be an nn.Module with get_dist(td) and in_keys, such as "
            f"torchrl.modules.ProbabilisticActor; got {type(actor).__name__}."
        )
    if not (isinstance(critic, nn.Module) and hasattr(critic, "out_keys")):
        raise TypeError(
            f"{owner}: critic must be a TensorDict module with in_keys and out_keys "
            "(tensordict.nn.TensorDictModule or torchrl.modules.ValueOperator) writing "
            f"keys.STATE_VALUE; got {type(critic).__name__}."
        )


# ---------------------------------------------------------------------------------------
# The base of every rlkit loss: set_keys in rlkit's and TorchRL's names
# ---------------------------------------------------------------------------------------
class LossBase(LossModule):
    """TorchRL's ``LossModule`` with ``set_keys`` that speaks TorchRL's key names too.

    Every rlkit loss derives from it. ``set_keys`` takes the names of the loss's
    ``_AcceptedKeys`` (``action_log_prob``, ``state_value``, ...) and TorchRL's names for the
    same keys (``sample_log_prob``, ``log_prob``, ``value``; the table is
    :data:`rlkit.keys.TORCHRL_KEY_ALIASES`). An unknown name raises a one-line
    ``ValueError`` listing the accepted names. ``set_keys(name=None)`` restores a default.
    ``in_keys`` follow the renamed keys (they are computed from ``tensor_keys``).
    """

    @classmethod
    def default_keys(cls) -> Any:
        return cls._AcceptedKeys()

    @classmethod
    def accepted_key_names(cls) -> list[str]:
        """The names ``set_keys`` accepts (besides their TorchRL aliases)."""
        return list(cls._AcceptedKeys.__dataclass_fields__)

    def set_keys(self, **kwargs: NestedKey | None) -> None:
        reads = any(k[0] == keys.NEXT for k in self.in_keys if isinstance(k, tuple))
        names = keys.resolve_key_names(
            type(self).__name__, self.accepted_key_names(), kwargs, reads_env_keys=reads
        )
        super().set_keys(**names)


# ---------------------------------------------------------------------------------------
# The actor-critic shell
# ---------------------------------------------------------------------------------------
class ActorCriticLoss(LossBase):
    r"""Shell shared by actor-critic policy-gradient losses: reads, checks, scores, logs.

    .. math::
        L = L_{policy} + c_v \, L_{value} - c_H \, \frac1N\sum_i H[\pi(\cdot|s_i)]

    A subclass supplies the policy term (:meth:`_policy_terms`) and may replace the
    unweighted value term (:meth:`_value_loss`) and the required keys
    (:meth:`_required_keys`). The shell:

    * checks the keys (:class:`MissingKeyError`) and shapes (``ValueError``) it reads;
    * scores the stored action under the current actor,
      ``actor.get_dist(td).log_prob(td[action])``, and runs the critic, both on a shallow
      selection of the batch, so the input TensorDict is never written to (in particular
      its collection-time ``state_value`` survives the update);
    * standardises the advantage per minibatch when ``normalize_advantage`` is set;
    * writes ``loss_value = value_coef * value_loss``,
      ``loss_entropy = -entropy_coef * mean entropy`` (always present, so every step logs
      the same keys; a constant 0 without a graph when ``entropy_coef == 0``), and the
      diagnostics ``entropy``, ``explained_variance``, ``value_mean``, ``advantage_mean``,
      ``advantage_std`` (population statistics of the advantage as read, before
      standardisation).

    Keys read (defaults from :mod:`rlkit.keys`, renamable with ``set_keys``): the actor's
    and critic's ``in_keys``; ``action`` ``[*, *A]``; ``advantage`` ``[*, 1]``;
    ``value_target`` ``[*, 1]``. The critic must write ``state_value`` ``[*, 1]``.

    Masks for padded batches are not read: rlkit's on-policy batches have no padding.

    Extension points (``docs/objectives.md``, "Extending a loss"):

    * :meth:`_policy_terms` ``(log_prob, advantage, tensordict) -> dict``: the policy term.
      A subclass may return more ``loss_*`` terms here (weighted, with gradient), e.g. a
      KL penalty; declare them in ``extra_loss_terms`` so ``out_keys`` lists them before
      the first call (an undeclared one is listed once a call has returned it).
    * :meth:`_required_keys` ``() -> {key: who writes it}``: the keys the loss reads
      besides the networks' ``in_keys``; ``in_keys`` is built from it, so the update loop
      hands the loss exactly these keys, and a missing one raises :class:`MissingKeyError`
      quoting the writer. Read renamable keys through ``self.tensor_keys``.
    * :meth:`_value_loss` ``(value, target, tensordict) -> Tensor``: the unweighted value
      term; ``_diagnostics``: names of the detached diagnostics listed in ``out_keys``.
    * ``_AcceptedKeys``: a dataclass of renamable keys; a subclass extends it (decorated
      with ``@dataclass``) to make a new key renamable with ``set_keys``.
    """

    entropy_coef = Hyperparameter(positive=False, hint="typical 0 to 0.01")
    value_coef = Hyperparameter(positive=False, hint="typical 0.25 to 1")

    @dataclass
    class _AcceptedKeys:
        """Input keys, renamable with ``loss.set_keys(name=key)``."""

        action: NestedKey = keys.ACTION
        action_log_prob: NestedKey = keys.ACTION_LOG_PROB
        advantage: NestedKey = keys.ADVANTAGE
        value_target: NestedKey = keys.VALUE_TARGET
        state_value: NestedKey = keys.STATE_VALUE

    _diagnostics: tuple[str, ...] = (
        ENTROPY,
        EXPLAINED_VARIANCE,
        VALUE_MEAN,
        ADVANTAGE_MEAN,
        ADVANTAGE_STD,
    )
    #: ``loss_*`` terms a subclass adds (in :meth:`_policy_terms` or ``forward``), listed in
    #: ``out_keys`` after the three base terms. An undeclared ``loss_*`` term the loss
    #: returns is added to ``out_keys`` on the first call that returns it.
    extra_loss_terms: tuple[str, ...] = ()

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
        super().__init__()
        owner = type(self).__name__
        _check_networks(owner, actor, critic)
        self.actor = actor
        self.critic = critic
        self.entropy_coef = entropy_coef
        self.value_coef = value_coef
        if not isinstance(normalize_advantage, bool):
            raise ValueError(
                f"{owner}: normalize_advantage must be True (standardise each minibatch) or "
                f"False, got {normalize_advantage!r}. To standardise over the whole batch, "
                "apply rlkit.objectives.standardize to the advantage before minibatching "
                "and pass False."
            )
        self.normalize_advantage = normalize_advantage
        self.value_loss = _check_choice(owner, "value_loss", value_loss, VALUE_LOSS_TYPES)
        if isinstance(entropy_samples, bool) or not isinstance(entropy_samples, int):
            raise TypeError(f"{owner}: entropy_samples must be an int, got {entropy_samples!r}.")
        if entropy_samples < 1:
            raise ValueError(f"{owner}: entropy_samples must be >= 1, got {entropy_samples}.")
        self.entropy_samples = entropy_samples
        #: when False, ``forward`` returns only the ``loss_*`` terms and skips the detached
        #: diagnostics (the on-policy learner computes them in the last epoch only)
        self.diagnostics = True
        self._set_in_keys()

    # -- TorchRL LossModule plumbing -------------------------------------------------
    @classmethod
    def default_keys(cls) -> _AcceptedKeys:
        return cls._AcceptedKeys()

    def _set_in_keys(self) -> None:
        """Called at construction and by ``set_keys``: the critic's out_keys are checked
        against the value key on the next call (:meth:`_check_critic`), so a TorchRL user
        can build the loss, then ``set_keys(value=...)`` as TorchRL's losses allow."""
        self.__dict__["_critic_checked"] = False

    def _check_critic(self) -> None:
        """Raise ``TypeError`` unless the critic writes the value key the loss reads."""
        value_key = self.tensor_keys.state_value
        written = list(self.critic.out_keys)
        if value_key not in written:
            raise TypeError(
                f"{type(self).__name__}: the critic writes {written} but the loss reads the "
                f"value from {keys.describe(value_key)}: build the critic with "
                f"out_keys=[keys.STATE_VALUE] or call loss.set_keys(value={written[0]!r})."
            )

    def _critic_ready(self) -> None:
        if not self.__dict__.get("_critic_checked", False):
            self._check_critic()
            self.__dict__["_critic_checked"] = True

    @property
    def in_keys(self) -> list[NestedKey]:
        found: list[NestedKey] = []
        for key in [*self.actor.in_keys, *self.critic.in_keys, *self._required_keys()]:
            if key not in found:
                found.append(key)
        return found

    @property
    def out_keys(self) -> list[str]:
        return [*self._loss_terms(), *self._diagnostics]

    def _loss_terms(self) -> list[str]:
        """The ``loss_*`` names this loss returns: the base three, the declared extras and
        any other ``loss_*`` term a call has returned."""
        found = [LOSS_POLICY, LOSS_VALUE, LOSS_ENTROPY]
        for name in (*self.extra_loss_terms, *self.__dict__.get("_returned_terms", ())):
            if name not in found:
                found.append(name)
        return found

    def _note_terms(self, out: Mapping[str, Any]) -> None:
        """Remember ``loss_*`` terms a subclass returned without declaring them."""
        known = self.__dict__.setdefault("_returned_terms", [])
        for name in out:
            if name.startswith("loss_") and name not in known:
                known.append(name)

    def make_value_estimator(self, value_type: Any = None, **hyperparams: Any) -> None:
        raise NotImplementedError(
            f"{type(self).__name__} does not estimate advantages: run a value estimator "
            "from rlkit.value (e.g. GAE) on the batch before calling the loss."
        )

    def extra_repr(self) -> str:
        names = ("entropy_coef", "value_coef", "normalize_advantage", "value_loss")
        return ", ".join(f"{name}={getattr(self, name)!r}" for name in names)

    # -- forward -------------------------------------------------------------------------
    def _required_keys(self) -> dict[NestedKey, str]:
        needs = dict.fromkeys([*self.actor.in_keys, *self.critic.in_keys], READ_BY_NETWORK)
        needs[self.tensor_keys.action] = WRITTEN_BY_ACTOR
        needs[self.tensor_keys.advantage] = WRITTEN_BY_ESTIMATOR
        needs[self.tensor_keys.value_target] = WRITTEN_BY_ESTIMATOR
        return needs

    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        owner = type(self).__name__
        self._critic_ready()
        require_keys(tensordict, self._required_keys(), owner=owner)
        advantage = read_column(tensordict, self.tensor_keys.advantage, owner=owner).detach()
        target = read_column(tensordict, self.tensor_keys.value_target, owner=owner).detach()
        dist = actor_dist(self.actor, tensordict)
        action = tensordict.get(self.tensor_keys.action)
        log_prob = per_sample_log_prob(dist, action, tensordict.batch_size, owner=owner)
        value = self._critic_value(tensordict)

        used_advantage = standardize(advantage) if self.normalize_advantage else advantage
        out = self._policy_terms(log_prob, used_advantage, tensordict)
        out[LOSS_VALUE] = self.value_coef * self._value_loss(value, target, tensordict)
        if not self.diagnostics:
            losses = {k: v for k, v in out.items() if k.startswith("loss_")}
            if positive(self, "entropy_coef"):
                losses.update(self._entropy_terms(dist))
                del losses[ENTROPY]
            else:
                losses[LOSS_ENTROPY] = torch.zeros((), device=value.device)
            self._note_terms(losses)
            return TensorDict(losses, batch_size=[])
        out[EXPLAINED_VARIANCE] = explained_variance(value, target)
        out[VALUE_MEAN] = value.detach().mean()
        out.update(self._entropy_terms(dist))
        out.update(part_metrics(dist, action))
        out[ADVANTAGE_MEAN] = advantage.mean()
        out[ADVANTAGE_STD] = advantage.std(correction=0)
        self._note_terms(out)
        return TensorDict(out, batch_size=[])

    def _critic_value(self, tensordict: TensorDictBase) -> Tensor:
        """V(s) from the critic as ``[*batch]``, computed on a copy (the input keeps its own)."""
        key = self.tensor_keys.state_value
        value = module_output(self.critic, tensordict, key)
        batch = tensordict.batch_size
        if value.shape != (*batch, 1):
            raise ValueError(
                f"{type(self).__name__}: the critic wrote {keys.describe(key)} of shape "
                f"{list(value.shape)}, expected {[*batch, 1]} (one value per sample with a "
                "trailing 1): end the critic's network with a Linear(..., 1)."
            )
        return value.squeeze(-1)

    def _entropy_terms(self, dist: Distribution) -> dict[str, Tensor]:
        if positive(self, "entropy_coef"):
            entropy = distribution_entropy(dist, num_samples=self.entropy_samples).mean()
            loss = -weighted(self.entropy_coef, entropy)
        else:
            with torch.no_grad():
                entropy = distribution_entropy(dist, num_samples=self.entropy_samples).mean()
            loss = torch.zeros_like(entropy)
        return {LOSS_ENTROPY: loss, ENTROPY: entropy.detach()}

    def _policy_terms(
        self, log_prob: Tensor, advantage: Tensor, tensordict: TensorDictBase
    ) -> dict[str, Tensor]:
        """Return ``{"loss_policy": ..., <detached diagnostics>}``; ``[*batch]`` inputs."""
        raise NotImplementedError

    def _value_loss(self, value: Tensor, target: Tensor, tensordict: TensorDictBase) -> Tensor:
        """Unweighted value loss (``value_coef`` is applied by the caller)."""
        return value_loss(value, target, loss_type=self.value_loss)
