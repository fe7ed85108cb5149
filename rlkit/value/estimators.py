r"""TensorDict value estimators: :class:`GAE`, :class:`VTrace`, :class:`TDLambda`.

Thin shells around :mod:`rlkit.value.functional`: they read keys from :mod:`rlkit.keys`,
call the critic when values are absent, run the pure function and write the results back
into the batch (in place; the batch is also returned).

Keys (batch ``[..., T]``, one trailing feature dim on scalars):

=========================  ==============  ==================================================
key                        shape           role
=========================  ==============  ==================================================
``keys.REWARD``            ``[..., T, 1]``  read
``keys.DONE``              ``[..., T, 1]``  read, bool: terminated or truncated
``keys.TERMINATED``        ``[..., T, 1]``  read, bool: no bootstrap
``keys.STATE_VALUE``       ``[..., T, 1]``  read, or written by ``value_network`` if absent
``keys.NEXT_STATE_VALUE``  ``[..., T, 1]``  read, or written by ``value_network`` if absent
``keys.ACTION``            ``[..., T, *A]`` read by :class:`VTrace` (the stored action)
``keys.ACTION_LOG_PROB``   ``[..., T]``     read by :class:`VTrace`: log mu(a|x) at collection
``keys.ADVANTAGE``         ``[..., T, 1]``  written (not by :class:`TDLambda`)
``keys.VALUE_TARGET``      ``[..., T, 1]``  written
``VTRACE_RHO``             ``[..., T, 1]``  written by :class:`VTrace`: pi(a|x) / mu(a|x)
=========================  ==============  ==================================================

The keys are the defaults; each estimator reads and writes the keys in its ``tensor_keys``,
renamed with ``estimator.set_keys(...)``, which accepts TorchRL's names too (``value`` for
``state_value``, ``sample_log_prob`` for ``action_log_prob``); ``reward`` / ``done`` /
``terminated`` name keys under ``"next"``, as in TorchRL. A missing input raises
:class:`~rlkit.keys.MissingKeyError` naming the estimator, the key and its writer.

The time dimension
------------------
Time is the batch dim named ``keys.TIME_DIM_NAME`` (``"time"``, the name TorchRL collectors
give it) when the TensorDict has names; otherwise ``time_dim`` (a forward keyword, else the
constructor's); otherwise the last batch dim. An unnamed ``[T, N]`` TensorDict is therefore
read with ``N`` as time (TorchRL's estimators silently do the same): name the dims
(``td.refine_names("time", None)``) or pass ``time_dim=0``.

Everything here runs without grad: advantages, targets and the values they are computed
from are constants for the losses.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace

import torch
from tensordict import NestedKey, TensorDictBase
from torch import nn

from rlkit import keys
from rlkit.keys import MissingKeyError
from rlkit.value import functional as F

__all__ = ["GAE", "TDLambda", "VTrace", "VTRACE_RHO"]

#: Key :class:`VTrace` writes: the raw (unclipped) importance ratio
#: :math:`\rho_t = \pi(a_t|x_t) / \mu(a_t|x_t)` at the stored action, shape ``[..., T, 1]``.
#: On on-policy data it is 1. (To be moved to :mod:`rlkit.keys`.)
VTRACE_RHO = keys.VTRACE_RHO

_FROM_ENV = "the environment/collector writes it"
_WRITERS: dict[str, str] = {
    "reward": _FROM_ENV,
    "done": _FROM_ENV,
    "terminated": _FROM_ENV,
    "action": "the collector writes it (the collecting actor's output)",
    "action_log_prob": (
        "the collecting actor writes it: build it with return_log_prob=True, "
        "log_prob_key=keys.ACTION_LOG_PROB (or rename the key with "
        "estimator.set_keys(sample_log_prob=...))"
    ),
}
#: Names whose keys are read under ``"next"`` (TorchRL's convention for env outputs).
_NEXT_NAMES = ("reward", "done", "terminated")


def _next_of(key: NestedKey) -> tuple[str, ...]:
    """The same key one level down, in ``"next"``: ``"v"`` -> ``("next", "v")``."""
    return (keys.NEXT, *((key,) if isinstance(key, str) else tuple(key)))


class _ValueEstimator(nn.Module):
    """Shared plumbing: renamable keys, time-dim resolution, key/shape checks, critic calls."""

    _needs_state_value = True

    @dataclass
    class _AcceptedKeys:
        """Keys read and written, renamable with ``estimator.set_keys(name=key)``.

        ``reward`` / ``done`` / ``terminated`` are read under ``"next"`` (``"r"`` reads
        ``("next", "r")``, as TorchRL's estimators do); ``state_value`` is read at the root
        and, for the bootstrap, at ``("next", state_value)``.
        """

        reward: NestedKey = keys.REWARD
        done: NestedKey = keys.DONE
        terminated: NestedKey = keys.TERMINATED
        state_value: NestedKey = keys.STATE_VALUE
        advantage: NestedKey = keys.ADVANTAGE
        value_target: NestedKey = keys.VALUE_TARGET

    def __init__(
        self,
        *,
        gamma: float,
        lmbda: float,
        value_network: Callable[[TensorDictBase], TensorDictBase] | None = None,
        time_dim: int | None = None,
        recompute_values: bool = False,
    ) -> None:
        super().__init__()
        self.gamma = F._check_unit_interval("gamma", gamma)
        self.lmbda = F._check_unit_interval("lmbda", lmbda)
        if value_network is not None and not callable(value_network):
            raise TypeError(
                "value_network must be a TensorDictModule writing keys.STATE_VALUE, "
                f"got {type(value_network).__name__}"
            )
        if recompute_values and value_network is None:
            raise ValueError("recompute_values=True needs a value_network=... to recompute with")
        self.value_network = value_network
        self.time_dim = time_dim
        self.recompute_values = recompute_values
        self._tensor_keys = self._AcceptedKeys()

    # ----------------------------------------------------------------- keys

    @property
    def tensor_keys(self) -> _AcceptedKeys:
        """The keys in use (rename them with :meth:`set_keys`)."""
        return self._tensor_keys

    @classmethod
    def default_keys(cls) -> _AcceptedKeys:
        return cls._AcceptedKeys()

    @classmethod
    def accepted_key_names(cls) -> list[str]:
        """The names :meth:`set_keys` accepts (besides their TorchRL aliases)."""
        return [f.name for f in fields(cls._AcceptedKeys)]

    def set_keys(self, **kwargs: NestedKey | None) -> _ValueEstimator:
        """Rename the keys read and written; TorchRL's names are accepted as aliases.

        ``set_keys(value="v", sample_log_prob="lp", advantage="adv")`` is
        ``set_keys(state_value="v", action_log_prob="lp", advantage="adv")``; ``None``
        restores a default. An unknown name raises a one-line ``ValueError`` listing the
        accepted ones. Returns the estimator, so it chains after the constructor.
        """
        owner = type(self).__name__
        names = keys.resolve_key_names(owner, self.accepted_key_names(), kwargs)
        defaults = self.default_keys()
        for name, key in names.items():
            if key is None:
                key = getattr(defaults, name)
            elif name in _NEXT_NAMES:
                key = keys.under_next(key)
            elif not isinstance(key, str | tuple):
                raise TypeError(f"{owner}.set_keys: {name} must be a str or tuple key, got {key!r}")
            names[name] = key
        self._tensor_keys = replace(self._tensor_keys, **names)
        return self

    def _key(self, name: str) -> NestedKey:
        return getattr(self._tensor_keys, name)

    @property
    def _value_keys(self) -> list[NestedKey]:
        """The value keys read: ``[state_value,] ("next", state_value)``."""
        value = self._key("state_value")
        return [value, _next_of(value)] if self._needs_state_value else [_next_of(value)]

    @property
    def in_keys(self) -> list:
        """Keys read (values may instead be written by ``value_network``)."""
        return [self._key("reward"), self._key("done"), self._key("terminated"), *self._value_keys]

    @property
    def out_keys(self) -> list:
        return [self._key("advantage"), self._key("value_target")]

    def _missing(self, key: NestedKey, what: str) -> MissingKeyError:
        return MissingKeyError(f"{type(self).__name__}: {keys.describe(key)} is missing: {what}")

    def _resolve_time_dim(self, td: TensorDictBase, time_dim: int | None) -> int:
        """Time dim as a non-negative batch-dim index (see the module docstring)."""
        batch_dims = td.batch_dims
        if batch_dims == 0:
            raise ValueError(
                "the TensorDict has no batch dims: value estimators need a [..., T] batch"
            )
        explicit = self.time_dim if time_dim is None else time_dim
        if explicit is not None:
            if isinstance(explicit, bool) or not isinstance(explicit, int):
                raise TypeError(f"time_dim must be an int, got {type(explicit).__name__}")
            if not -batch_dims <= explicit < batch_dims:
                raise ValueError(
                    f"time_dim={explicit} is out of range for a TensorDict with batch size "
                    f"{tuple(td.batch_size)}"
                )
            explicit %= batch_dims
        names = td.names
        if keys.TIME_DIM_NAME in names:
            named = names.index(keys.TIME_DIM_NAME)
            if explicit is not None and explicit != named:
                raise ValueError(
                    f"time_dim={explicit} contradicts the TensorDict's names {names}, where "
                    f"{keys.TIME_DIM_NAME!r} is dim {named}: drop time_dim or rename the dims"
                )
            return named
        return batch_dims - 1 if explicit is None else explicit

    def _require(self, td: TensorDictBase, *names: str) -> None:
        present = td.keys(include_nested=True)
        for name in names:
            key = self._key(name)
            if key not in present:
                raise self._missing(key, _WRITERS[name])

    def _get_scalar(self, td: TensorDictBase, key) -> torch.Tensor:
        """``td[key]``, checked to be ``batch_size + (1,)``."""
        tensor = td.get(key)
        expected = (*td.batch_size, 1)
        if tensor.shape != expected:
            raise ValueError(
                f"{type(self).__name__}: {keys.describe(key)} has shape "
                f"{tuple(tensor.shape)}; expected {expected} (the batch size plus a trailing 1)"
            )
        return tensor

    # ----------------------------------------------------------------- values

    def _ensure_values(self, td: TensorDictBase) -> None:
        """Write the critic's values where absent (or always, with recompute_values)."""
        value = self._key("state_value")
        wanted = [(td, value, value)] if self._needs_state_value else []
        wanted.append((td.get(keys.NEXT), value, _next_of(value)))
        present = td.keys(include_nested=True)
        for sub, key, full_key in wanted:
            if full_key in present and not self.recompute_values:
                continue
            if self.value_network is None:
                name = keys.describe(full_key)
                raise MissingKeyError(
                    f"{type(self).__name__}: {name} missing and no value_network given: pass "
                    f"value_network=... or write {name} first"
                )
            self._check_value_inputs(td, sub is not td)
            self.value_network(sub)
            if sub.get(key, None) is None:
                written = list(getattr(self.value_network, "out_keys", ()))
                raise self._missing(
                    full_key,
                    f"value_network wrote {written}, not {keys.describe(key)}: rename the "
                    f"estimator's key with set_keys(value={written[0] if written else '...'!r}) "
                    "or build the critic with that out_key",
                )

    def _check_value_inputs(self, td: TensorDictBase, nested: bool) -> None:
        present = td.keys(include_nested=True)
        for key in getattr(self.value_network, "in_keys", ()):
            full = _next_of(key) if nested else key
            if full not in present:
                raise self._missing(
                    full, f"{_FROM_ENV} (value_network reads it to compute the values)"
                )

    def _common(self, td: TensorDictBase, time_dim: int | None) -> tuple[dict, int]:
        """Check and read the shared inputs; return them and the functional's time_dim."""
        t = self._resolve_time_dim(td, time_dim)
        self._require(td, "reward", "done", "terminated")
        self._ensure_values(td)
        value = self._key("state_value")
        inputs = {
            "reward": self._get_scalar(td, self._key("reward")),
            "done": self._get_scalar(td, self._key("done")),
            "terminated": self._get_scalar(td, self._key("terminated")),
            "next_value": self._get_scalar(td, _next_of(value)),
        }
        if self._needs_state_value:
            inputs["value"] = self._get_scalar(td, value)
        # the scalars are [*batch, 1]: the time dim counted from the end skips the 1
        return inputs, t - td.batch_dims - 1

    def extra_repr(self) -> str:
        out = f"gamma={self.gamma}, lmbda={self.lmbda}, time_dim={self.time_dim}"
        return out + (
            ", empirical_returns=True" if getattr(self, "empirical_returns", False) else ""
        )


class GAE(_ValueEstimator):
    r"""Generalised advantage estimation as a TensorDict module.

    Writes :math:`A_t = \sum_l (\gamma\lambda)^l \delta_{t+l}` (up to each episode's end) to
    ``keys.ADVANTAGE`` and :math:`A_t + V_t` to ``keys.VALUE_TARGET``; see
    :func:`rlkit.value.functional.gae` for the maths and the episode-boundary rule.

    Args:
        gamma: discount in [0, 1], typically 0.99.
        lmbda: :math:`\lambda` in [0, 1], typically 0.95.
        value_network: optional TensorDictModule writing ``keys.STATE_VALUE`` from the
            observation; called (without grad) on the batch and on ``batch["next"]`` when
            ``keys.STATE_VALUE`` / ``keys.NEXT_STATE_VALUE`` are absent.
        time_dim: batch dim of time for unnamed TensorDicts (default: the last one).
        recompute_values: call ``value_network`` even when values are present (e.g. values
            written at collection by an older critic).
        empirical_returns: write the rollout's discounted return
            (:func:`rlkit.value.functional.discounted_return`: reward-to-go, bootstrapped
            only at truncations and at the batch's end) to ``keys.VALUE_TARGET`` instead of
            :math:`A_t + V_t`; the advantage is GAE's either way (pyrado's
            ``use_empirical_returns``).

    Example:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> td = TensorDict(
        ...     {"state_value": torch.zeros(2, 3, 1),
        ...      "next": {"reward": torch.ones(2, 3, 1), "state_value": torch.zeros(2, 3, 1),
        ...               "done": torch.zeros(2, 3, 1, dtype=torch.bool),
        ...               "terminated": torch.zeros(2, 3, 1, dtype=torch.bool)}},
        ...     batch_size=[2, 3])
        >>> GAE(gamma=0.5, lmbda=1.0)(td)["advantage"][0].flatten().tolist()
        [1.75, 1.5, 1.0]
    """

    def __init__(
        self,
        *,
        gamma: float,
        lmbda: float,
        value_network: Callable[[TensorDictBase], TensorDictBase] | None = None,
        time_dim: int | None = None,
        recompute_values: bool = False,
        empirical_returns: bool = False,
    ) -> None:
        super().__init__(
            gamma=gamma,
            lmbda=lmbda,
            value_network=value_network,
            time_dim=time_dim,
            recompute_values=recompute_values,
        )
        if not isinstance(empirical_returns, bool):
            raise TypeError(f"empirical_returns must be a bool, got {empirical_returns!r}")
        self.empirical_returns = empirical_returns

    @torch.no_grad()
    def forward(self, td: TensorDictBase, *, time_dim: int | None = None) -> TensorDictBase:
        inputs, fdim = self._common(td, time_dim)
        advantage, target = F.gae(**inputs, gamma=self.gamma, lmbda=self.lmbda, time_dim=fdim)
        if self.empirical_returns:
            del inputs["value"]
            target = F.discounted_return(**inputs, gamma=self.gamma, time_dim=fdim)
        td.set(self._key("advantage"), advantage)
        td.set(self._key("value_target"), target)
        return td


class TDLambda(_ValueEstimator):
    r"""TD(:math:`\lambda`) return as a TensorDict module; writes only ``keys.VALUE_TARGET``.

    :math:`G_t = r_t + \gamma(1-\mathrm{term}_t)[(1-\lambda)V'_t + \lambda G_{t+1}]`,
    bootstrapping from :math:`V'_t` at done steps and at the batch's last step; see
    :func:`rlkit.value.functional.td_lambda`. Reads ``keys.NEXT_STATE_VALUE`` only (no
    ``keys.STATE_VALUE``). Arguments as for :class:`GAE`.
    """

    _needs_state_value = False

    @dataclass
    class _AcceptedKeys:
        """Keys read and written, renamable with ``estimator.set_keys(name=key)``; as for
        :class:`GAE` (``state_value`` is read at ``("next", state_value)`` only)."""

        reward: NestedKey = keys.REWARD
        done: NestedKey = keys.DONE
        terminated: NestedKey = keys.TERMINATED
        state_value: NestedKey = keys.STATE_VALUE
        value_target: NestedKey = keys.VALUE_TARGET

    @property
    def out_keys(self) -> list:
        return [self._key("value_target")]

    @torch.no_grad()
    def forward(self, td: TensorDictBase, *, time_dim: int | None = None) -> TensorDictBase:
        inputs, fdim = self._common(td, time_dim)
        target = F.td_lambda(**inputs, gamma=self.gamma, lmbda=self.lmbda, time_dim=fdim)
        td.set(self._key("value_target"), target)
        return td


class VTrace(_ValueEstimator):
    r"""V-trace (Espeholt et al. 2018) as a TensorDict module, scoring the *stored* action.

    :math:`\rho_t = \pi(a_t|x_t)/\mu(a_t|x_t)` with
    :math:`\log\pi(a_t|x_t)` = ``policy.get_dist(td).log_prob(td[keys.ACTION])``, the target
    policy evaluated at the action the behaviour policy took (never a fresh sample or the
    mode: TorchRL's ``VTrace`` module does that, which biases :math:`\rho`), and
    :math:`\log\mu(a_t|x_t)` = ``td[keys.ACTION_LOG_PROB]``, stored at collection.
    Per-dimension log-probs (e.g. a factorised ``Normal``'s ``[..., T, A]``) are summed over
    the dims after the batch dims, for both. Writes :math:`v_s` to ``keys.VALUE_TARGET``,
    :math:`\min(\bar\rho_{pg}, \rho_s)(r_s + \gamma\hat v_{s+1} - V_s)` to
    ``keys.ADVANTAGE`` and the raw :math:`\rho` to :data:`VTRACE_RHO`; maths in
    :func:`rlkit.value.functional.vtrace`.

    Args:
        gamma: discount in [0, 1].
        actor: a TorchRL ``ProbabilisticActor``-like module with ``.get_dist(td)``: the
            learner's policy :math:`\pi`.
        target_actor: optional separate policy used as :math:`\pi` in :math:`\rho` (APPO
            uses a target network here); default ``actor``.
        lmbda: :math:`\lambda` folded into the traces :math:`c_t`; default 1.
        rho_clip, c_clip, pg_rho_clip: :math:`\bar\rho > 0`, :math:`\bar c \ge 0`,
            :math:`\bar\rho_{pg} > 0`; default 1 (the paper's choice).
        adv_mode: the advantage's bootstrap: ``"official"`` (default, :math:`v_{s+1}`) or
            ``"acme"`` (:math:`\lambda v_{s+1} + (1-\lambda)V(x_{s+1})`, Acme's and evorl's);
            see :func:`rlkit.value.functional.vtrace`.
        value_network, time_dim, recompute_values: as for :class:`GAE`.

    The actor runs on a selection of its ``in_keys``, so writing its distribution
    parameters does not overwrite the behaviour policy's stored ones.

    TanhNormal caveat: TorchRL's ``ProbabilisticActor`` (random mode) stores the log-prob
    of the exact pre-tanh sample, which re-scoring the rounded stored action reproduces to
    ~1e-5 away from the bounds but not for saturated actions (pre-tanh beyond ~7, clamped
    to 1 - 1e-6): there :math:`\rho` is wrong unless the collector stored
    ``dist.log_prob(action)``. See ``docs/value.md``.
    """

    def __init__(
        self,
        *,
        gamma: float,
        actor: nn.Module,
        target_actor: nn.Module | None = None,
        lmbda: float = 1.0,
        rho_clip: float = 1.0,
        c_clip: float = 1.0,
        pg_rho_clip: float = 1.0,
        adv_mode: str = "official",
        value_network: Callable[[TensorDictBase], TensorDictBase] | None = None,
        time_dim: int | None = None,
        recompute_values: bool = False,
    ) -> None:
        super().__init__(
            gamma=gamma,
            lmbda=lmbda,
            value_network=value_network,
            time_dim=time_dim,
            recompute_values=recompute_values,
        )
        self.adv_mode = F.check_adv_mode("VTrace", adv_mode)
        if actor is None:
            raise TypeError("actor is required: the policy pi whose V-trace targets these are")
        for name, policy in (("actor", actor), ("target_actor", target_actor)):
            if policy is not None and not callable(getattr(policy, "get_dist", None)):
                raise TypeError(
                    f"{name} must have a .get_dist(td) method (a TorchRL ProbabilisticActor), "
                    f"got {type(policy).__name__}"
                )
        self.rho_clip = F._check_clip("rho_clip", rho_clip)
        self.c_clip = F._check_clip("c_clip", c_clip, allow_zero=True)
        self.pg_rho_clip = F._check_clip("pg_rho_clip", pg_rho_clip)
        self.actor = actor
        self.target_actor = target_actor

    @dataclass
    class _AcceptedKeys(_ValueEstimator._AcceptedKeys):
        """:class:`GAE`'s keys, the stored action and its log mu(a|x) (TorchRL's name:
        ``sample_log_prob``), and the ratio written."""

        action: NestedKey = keys.ACTION
        action_log_prob: NestedKey = keys.ACTION_LOG_PROB
        vtrace_rho: NestedKey = keys.VTRACE_RHO

    @property
    def in_keys(self) -> list:
        return [*super().in_keys, self._key("action"), self._key("action_log_prob")]

    @property
    def out_keys(self) -> list:
        return [*super().out_keys, self._key("vtrace_rho")]

    @torch.no_grad()
    def forward(self, td: TensorDictBase, *, time_dim: int | None = None) -> TensorDictBase:
        self._require(td, "action", "action_log_prob")
        inputs, fdim = self._common(td, time_dim)
        log_prob_key = self._key("action_log_prob")
        behavior = _joint_log_prob(td.get(log_prob_key), td, keys.describe(log_prob_key))
        target = _joint_log_prob(self._target_log_prob(td), td, "the actor's log_prob")
        advantage, value_target = F.vtrace(
            behavior,
            target,
            **inputs,
            gamma=self.gamma,
            lmbda=self.lmbda,
            rho_clip=self.rho_clip,
            c_clip=self.c_clip,
            pg_rho_clip=self.pg_rho_clip,
            time_dim=fdim,
            adv_mode=self.adv_mode,
        )
        td.set(self._key("advantage"), advantage)
        td.set(self._key("value_target"), value_target)
        td.set(self._key("vtrace_rho"), torch.sub(target, behavior).exp_())
        return td

    def _target_log_prob(self, td: TensorDictBase) -> torch.Tensor:
        """log pi(a|x) at the stored action, pi = target_actor or actor."""
        policy = self.actor if self.target_actor is None else self.target_actor
        in_keys: Sequence = getattr(policy, "in_keys", ())
        present = td.keys(include_nested=True)
        for key in in_keys:
            if key not in present:
                raise self._missing(key, f"{_FROM_ENV} (the actor reads it)")
        # a selection: the actor's writes (logits, loc, scale) stay out of the batch
        inputs = td.select(*in_keys) if in_keys else td.copy()
        return policy.get_dist(inputs).log_prob(td.get(self._key("action")))


def _joint_log_prob(log_prob: torch.Tensor, td: TensorDictBase, name: str) -> torch.Tensor:
    """Sum a log-prob over the dims after the batch dims; return ``[*batch, 1]``."""
    batch = td.batch_size
    if log_prob.shape[: td.batch_dims] != batch:
        raise ValueError(
            f"{name} has shape {tuple(log_prob.shape)}, which does not start with the batch "
            f"size {tuple(batch)}"
        )
    if log_prob.ndim > td.batch_dims:
        log_prob = log_prob.sum(dim=tuple(range(td.batch_dims, log_prob.ndim)))
    return log_prob.unsqueeze(-1)
