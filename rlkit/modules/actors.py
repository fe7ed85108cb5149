"""Stochastic actors: categorical (discrete) and Gaussian / TanhNormal (continuous) policies.

Every builder returns a TorchRL :class:`~torchrl.modules.ProbabilisticActor`, so actors work
with TorchRL collectors and losses as well as rlkit's:

- ``actor(td)`` samples (default interaction ``RANDOM``) and writes ``keys.ACTION`` and
  ``keys.ACTION_LOG_PROB`` ``[*]`` (log mu(a|s) of the sampled action) plus the
  distribution parameters (``keys.LOGITS``, or ``keys.LOC`` / ``keys.SCALE``);
- under ``set_exploration_type(ExplorationType.DETERMINISTIC)`` the action is the mode
  (argmax of the logits), the mean ``loc`` (Normal) or :math:`\\tanh(loc)` rescaled to
  ``[low, high]`` (TanhNormal);
- ``actor.get_dist(td)`` returns the distribution, whose ``log_prob(action)`` has shape
  ``[*]`` (summed over the action dimension).

=====================  ===========================  =======================================
policy                 action                       log-density
=====================  ===========================  =======================================
categorical            int64 ``[*]``                :math:`\\log\\mathrm{softmax}(z)_a`
one-hot                one-hot ``[*, n]``           same, at the hot index
Normal (PPO)           ``[*, d]``                   :math:`\\sum_i \\log\\mathcal{N}(a_i;
                                                    \\mu_i, \\sigma_i)`, state-independent
                                                    :math:`\\log\\sigma` parameter
TanhNormal (SAC)       ``[*, d]`` in [low, high]    :math:`\\sum_i \\log\\mathcal{N}(u_i) -
                                                    \\log(1 - \\tanh^2 u_i) -
                                                    \\log\\frac{high_i - low_i}{2}`
=====================  ===========================  =======================================

with :math:`a = low + (high - low) (\\tanh(u) + 1) / 2` for the TanhNormal.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from tensordict import NestedKey
from tensordict.nn import InteractionType, TensorDictModule
from torch import nn
from torchrl.data import Bounded, Categorical, Composite, OneHot, TensorSpec, Unbounded
from torchrl.envs import EnvBase
from torchrl.modules import (
    IndependentNormal,
    OneHotCategorical,
    ProbabilisticActor,
    TanhNormal,
    ValueOperator,
)

from rlkit import keys
from rlkit.modules.compat import attach_collector_check, check_actor_spec
from rlkit.modules.composite import ActionLayout, action_layout, multi_part_actor
from rlkit.modules.critics import action_kind, observation_features, value_critic
from rlkit.modules.dictobs import chain, obs_in_keys
from rlkit.modules.masks import MaskedHead, check_mask_spec, mask_key_of, refuse_mask
from rlkit.modules.networks import mlp, mlp_body

__all__ = [
    "categorical_actor",
    "gaussian_actor",
    "make_actor",
    "shared_actor_critic",
]

Hidden = Sequence[int]
Activation = str | type[nn.Module]

#: Orthogonal gain of policy output layers (CleanRL / SB3): near-uniform initial policy.
POLICY_OUT_GAIN = 0.01
#: Bounds of the state-dependent log-std (CleanRL's SAC, Yarats & Kostrikov's pytorch_sac).
LOG_STD_BOUNDS = (-5.0, 2.0)


def _head(backbone: nn.Module | None, head: nn.Module) -> nn.Module:
    if backbone is None:
        return head
    if not isinstance(backbone, nn.Module):
        raise TypeError(f"backbone must be an nn.Module, got {type(backbone).__name__}")
    return chain(backbone, head)


def _positive_int(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def categorical_actor(
    in_features: int,
    n_actions: int,
    *,
    hidden: Hidden = (64, 64),
    activation: Activation = "tanh",
    layer_norm: bool = False,
    backbone: nn.Module | None = None,
    one_hot: bool = False,
    spec: TensorSpec | None = None,
    obs_key: NestedKey = keys.OBSERVATION,
    mask_key: NestedKey | None = None,
) -> ProbabilisticActor:
    """Categorical policy :math:`\\pi(a|s) = \\mathrm{softmax}(z_\\theta(s))_a`.

    Reads ``obs_key`` ``[*, F]``; writes ``keys.LOGITS`` ``[*, n]``, ``keys.ACTION``
    (int64 ``[*]``, or one-hot ``[*, n]`` with ``one_hot=True``) and
    ``keys.ACTION_LOG_PROB`` ``[*]``. The logits layer is orthogonal with gain 0.01 so the
    initial policy is near uniform.

    Args:
        in_features: width the MLP head sees (observation width, or the backbone's output).
        n_actions: number of discrete actions.
        hidden, activation, layer_norm: MLP head (see :func:`~rlkit.modules.networks.mlp`).
        backbone: optional feature extractor applied to the observation first.
        one_hot: emit one-hot actions (for ``OneHot`` action specs) instead of indices.
        spec: action spec to attach; defaults to ``Categorical(n_actions)`` /
            ``OneHot(n_actions)``.
        obs_key: key of the observation.
        mask_key: key of an action mask ``[*, n]`` (e.g. ``keys.ACTION_MASK``; bool or int8,
            nonzero where valid): the logits of masked actions become the dtype's lowest value
            (:class:`~rlkit.modules.masks.MaskedHead`), so the policy, its log-probabilities,
            entropy and mode run over the valid actions only. The network never reads it.

    Example:
        >>> from tensordict import TensorDict
        >>> actor = categorical_actor(4, 2)
        >>> td = actor(TensorDict({"observation": torch.zeros(3, 4)}, [3]))
        >>> td["action"].dtype, td["action"].shape, td["action_log_prob"].shape
        (torch.int64, torch.Size([3]), torch.Size([3]))
    """
    _positive_int("n_actions", n_actions)
    net = mlp(
        in_features,
        n_actions,
        hidden=hidden,
        activation=activation,
        layer_norm=layer_norm,
        out_gain=POLICY_OUT_GAIN,
    )
    if mask_key is None:
        module = TensorDictModule(
            _head(backbone, net), in_keys=obs_in_keys(obs_key), out_keys=[keys.LOGITS]
        )
    else:
        head = MaskedHead(_head(backbone, net))
        in_keys = [*obs_in_keys(obs_key), mask_key]
        module = TensorDictModule(head, in_keys=in_keys, out_keys=[keys.LOGITS])
    if spec is None:
        spec = OneHot(n_actions) if one_hot else Categorical(n_actions)
    actor = ProbabilisticActor(
        module,
        in_keys=[keys.LOGITS],
        out_keys=[keys.ACTION],
        spec=spec,
        distribution_class=OneHotCategorical if one_hot else torch.distributions.Categorical,
        return_log_prob=True,
        log_prob_key=keys.ACTION_LOG_PROB,
        default_interaction_type=InteractionType.RANDOM,
    )
    return attach_collector_check(actor)


class _StateIndependentStd(nn.Module):
    """``x -> (loc(x), exp(log_std))``: a learned log-std vector shared by all states."""

    def __init__(self, loc: nn.Module, action_dim: int, init_log_std: float) -> None:
        super().__init__()
        self.loc = loc
        self.log_std = nn.Parameter(torch.full((action_dim,), float(init_log_std)))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loc = self.loc(x)
        return loc, self.log_std.exp().expand_as(loc)


class _BoundedLoc(nn.Module):
    """``x -> (mid + half * tanh(loc), scale)`` around a ``(loc, scale)`` network: the mean of
    a Normal policy squashed into the action bounds ``[mid - half, mid + half]`` (Tianshou's
    ``ActorProb`` with ``unbounded=False``). The actions stay Normal samples that the
    environment clips; only the mean is bounded.

    Why: past a bound every sampled action is clipped to the same value, so the return does
    not depend on the mean there and the policy gradient is noise that can carry it further
    out without limit. Measured on IMPALA's Pendulum preset, seed 9: at 100k frames 99% of a
    grid of states had a mean beyond +-2 (up to +-20), and the deterministic policy stayed at
    about -990 for 300k frames (``docs/recipes/impala.md``, "Pendulum")."""

    def __init__(self, net: nn.Module, low: torch.Tensor, high: torch.Tensor) -> None:
        super().__init__()
        self.net = net
        # not persistent: the bounds come from the env's action spec at every build
        self.register_buffer("loc_mid", (high + low) / 2, persistent=False)
        self.register_buffer("loc_half", (high - low) / 2, persistent=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loc, scale = self.net(x)
        return self.loc_mid + self.loc_half * torch.tanh(loc), scale


class _StateDependentStd(nn.Module):
    """``x -> (loc, exp(log_std))`` from one network with ``2 * action_dim`` outputs.

    The raw std output is squashed smoothly into ``[log_std_min, log_std_max]``:
    :math:`\\log\\sigma = m + \\frac{M - m}{2}(\\tanh(r) + 1)`, which keeps gradients
    everywhere, unlike a hard clamp (CleanRL's ``sac_continuous_action``).
    """

    def __init__(self, net: nn.Module, log_std_bounds: tuple[float, float]) -> None:
        super().__init__()
        self.net = net
        self.log_std_min, self.log_std_max = (float(b) for b in log_std_bounds)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loc, raw = self.net(x).chunk(2, dim=-1)
        half_range = 0.5 * (self.log_std_max - self.log_std_min)
        log_std = self.log_std_min + half_range * (torch.tanh(raw) + 1.0)
        return loc, log_std.exp()


def _state_dependent_net(
    in_features: int,
    action_dim: int,
    *,
    init_log_std: float,
    log_std_bounds: tuple[float, float],
    **mlp_kw,
) -> _StateDependentStd:
    lo, hi = log_std_bounds
    if not lo < init_log_std < hi:
        raise ValueError(
            f"init_log_std={init_log_std} must lie strictly inside log_std_bounds={log_std_bounds}"
        )
    net = mlp(in_features, 2 * action_dim, out_gain=POLICY_OUT_GAIN, **mlp_kw)
    # Bias the raw std outputs so that log_std == init_log_std at initialisation.
    with torch.no_grad():
        net[-1].bias[action_dim:] = math.atanh(2.0 * (init_log_std - lo) / (hi - lo) - 1.0)
    return _StateDependentStd(net, log_std_bounds)


def _bounds(
    low: torch.Tensor | float | None,
    high: torch.Tensor | float | None,
    action_dim: int,
    what: str = "tanh=True",
) -> tuple[torch.Tensor, torch.Tensor]:
    low_t = torch.as_tensor(-1.0 if low is None else low, dtype=torch.float32)
    high_t = torch.as_tensor(1.0 if high is None else high, dtype=torch.float32)
    low_t, high_t = (t.expand(action_dim).clone() for t in (low_t, high_t))
    if not torch.isfinite(low_t).all() or not torch.isfinite(high_t).all():
        raise ValueError(
            f"{what} needs finite low/high action bounds, got low={low_t}, high={high_t}: "
            "use a plain Normal actor, whose actions the env clips"
        )
    if not (high_t > low_t).all():
        raise ValueError(f"need high > low elementwise, got low={low_t}, high={high_t}")
    return low_t, high_t


def gaussian_actor(
    in_features: int,
    action_dim: int,
    *,
    hidden: Hidden = (64, 64),
    activation: Activation = "tanh",
    layer_norm: bool = False,
    backbone: nn.Module | None = None,
    tanh: bool = False,
    low: torch.Tensor | float | None = None,
    high: torch.Tensor | float | None = None,
    state_dependent_std: bool | None = None,
    init_log_std: float = 0.0,
    log_std_bounds: tuple[float, float] = LOG_STD_BOUNDS,
    spec: TensorSpec | None = None,
    obs_key: NestedKey = keys.OBSERVATION,
    bounded_loc: bool = False,
) -> ProbabilisticActor:
    """Gaussian policy, PPO style (``tanh=False``) or SAC style (``tanh=True``).

    ``tanh=False``: :math:`a \\sim \\mathcal{N}(\\mu_\\theta(s), \\mathrm{diag}\\,\\sigma^2)`
    (TorchRL ``IndependentNormal``), actions unbounded (clip them in the environment).
    ``tanh=True``: :math:`u \\sim \\mathcal{N}(\\mu_\\theta(s), \\sigma_\\theta(s)^2)`,
    :math:`a = low + (high - low)(\\tanh u + 1)/2` (TorchRL ``TanhNormal``) with the
    change-of-variables log-density of the module docstring.

    Reads ``obs_key``; writes ``keys.LOC`` / ``keys.SCALE`` ``[*, d]``, ``keys.ACTION``
    ``[*, d]`` and ``keys.ACTION_LOG_PROB`` ``[*]``.

    Args:
        in_features: width the MLP head sees (observation width, or the backbone's output).
        action_dim: ``d``.
        tanh: squash with tanh into ``[low, high]`` (default bounds ``[-1, 1]``).
        low, high: bounds for ``tanh=True`` or ``bounded_loc=True`` (scalars or ``[d]``
            tensors).
        state_dependent_std: :math:`\\sigma_\\theta(s)` from the network (squashed into
            ``log_std_bounds``) instead of a learned state-independent log-std vector.
            Defaults to ``tanh`` (SAC: state-dependent; PPO: state-independent).
        init_log_std: initial :math:`\\log\\sigma` (0.0 as in CleanRL's PPO).
        log_std_bounds: range of the state-dependent log-std, default ``(-5, 2)``.
        spec: action spec to attach; defaults to ``Bounded(low, high)`` or ``Unbounded``.
        bounded_loc: with ``tanh=False``, the Normal's mean is
            :math:`(low + high)/2 + (high - low)/2 \\cdot \\tanh(\\mu_\\theta(s))`, inside the
            bounds (default ``[-1, 1]``); the sampled actions are not squashed (the env clips
            them). See :class:`_BoundedLoc`.

    Example:
        >>> from tensordict import TensorDict
        >>> actor = gaussian_actor(3, 1, tanh=True, low=-2.0, high=2.0)
        >>> td = actor(TensorDict({"observation": torch.zeros(5, 3)}, [5]))
        >>> td["action"].shape, td["action_log_prob"].shape, bool(td["action"].abs().max() <= 2)
        (torch.Size([5, 1]), torch.Size([5]), True)
    """
    _positive_int("action_dim", action_dim)
    if tanh and bounded_loc:
        raise ValueError(
            "bounded_loc squashes a Normal policy's mean; a tanh=True (TanhNormal) actor's "
            "actions are already inside the bounds: pass one of them"
        )
    if not (tanh or bounded_loc) and (low is not None or high is not None):
        raise ValueError(
            "low/high apply only with tanh=True or bounded_loc=True; a plain Normal actor is "
            "unbounded, clip its actions in the environment or pass tanh=True"
        )
    if state_dependent_std is None:
        state_dependent_std = tanh
    mlp_kw = dict(hidden=hidden, activation=activation, layer_norm=layer_norm)
    if state_dependent_std:
        net: nn.Module = _state_dependent_net(
            in_features,
            action_dim,
            init_log_std=init_log_std,
            log_std_bounds=log_std_bounds,
            **mlp_kw,
        )
    else:
        loc = mlp(in_features, action_dim, out_gain=POLICY_OUT_GAIN, **mlp_kw)
        net = _StateIndependentStd(loc, action_dim, init_log_std)
    if bounded_loc:
        net = _BoundedLoc(net, *_bounds(low, high, action_dim, "bounded_loc=True (--bounded-mean)"))
    module = TensorDictModule(
        _head(backbone, net), in_keys=obs_in_keys(obs_key), out_keys=[keys.LOC, keys.SCALE]
    )
    if tanh:
        low_t, high_t = _bounds(low, high, action_dim)
        dist_class, dist_kw = TanhNormal, {"low": low_t, "high": high_t}
        spec = Bounded(low=low_t, high=high_t, shape=(action_dim,)) if spec is None else spec
    else:
        dist_class, dist_kw = IndependentNormal, {}
        spec = Unbounded(shape=(action_dim,)) if spec is None else spec
    actor = ProbabilisticActor(
        module,
        in_keys=[keys.LOC, keys.SCALE],
        out_keys=[keys.ACTION],
        spec=spec,
        distribution_class=dist_class,
        distribution_kwargs=dist_kw,
        return_log_prob=True,
        log_prob_key=keys.ACTION_LOG_PROB,
        default_interaction_type=InteractionType.RANDOM,
    )
    return attach_collector_check(actor)


def make_actor(
    observation_spec: TensorSpec | EnvBase,
    action_spec: TensorSpec | None = None,
    *,
    backbone: nn.Module | None = None,
    in_features: int | None = None,
    obs_key: NestedKey = keys.OBSERVATION,
    tanh: bool = False,
    action_mask: bool | None = None,
    **kw,
) -> ProbabilisticActor:
    """Build the actor that fits the specs of an environment.

    ``Categorical(n)`` actions -> :func:`categorical_actor` (int64 actions);
    ``OneHot(n)`` -> :func:`categorical_actor` with ``one_hot=True``; continuous
    ``Bounded`` -> :func:`gaussian_actor` (``tanh=True`` squashes into the spec's bounds);
    continuous ``Unbounded`` -> :func:`gaussian_actor` with ``tanh=False``. Anything else
    (MultiCategorical, Binary, MultiOneHot, Composite actions, non-flat observations without
    a backbone) raises ``ValueError`` naming the spec.

    An observation spec holding :data:`rlkit.keys.ACTION_MASK` (a Dict observation's
    ``"action_mask"`` entry, or TorchRL's ``ActionMask`` key) gives a masked categorical actor
    (``mask_key=keys.ACTION_MASK``, see :func:`categorical_actor`); continuous actions with a
    mask are refused in one line naming the recipes that read masks. ``action_mask=False``
    ignores the entry.

    The actor is checked against the action spec before it is returned
    (:func:`rlkit.modules.compat.check_actor_spec`), so an override in ``**kw`` (``spec``,
    ``one_hot``) that would not fit raises :class:`~rlkit.modules.compat.ActionSpecMismatchError`.

    Args:
        observation_spec: ``env.observation_spec`` (Composite; its shape is the env batch
            shape, stripped from the leaves) or an unbatched leaf spec; or the env itself
            (``make_actor(env)``), whose observation and action specs are read.
        action_spec: ``env.action_spec`` or ``env.full_action_spec`` (omit with an env).
        backbone, in_features: feature extractor and its output width (see
            :func:`~rlkit.modules.critics.observation_features`).
        tanh: for continuous actions, TanhNormal (SAC) instead of Normal (PPO).
        action_mask: read the observation spec's action mask (None: when it has one; True:
            it must have one; False: ignore it).
        **kw: forwarded to the builder (``hidden``, ``activation``, ``init_log_std``, ...).

    Example:
        >>> from torchrl.envs import GymEnv
        >>> env = GymEnv("CartPole-v1")  # TorchRL's default: one-hot actions
        >>> actor = make_actor(env)
        >>> env.rollout(3, actor)["action"].shape
        torch.Size([3, 2])
    """
    if isinstance(observation_spec, EnvBase):
        if action_spec is not None:
            raise TypeError("make_actor(env) reads the env's action spec: pass no action_spec")
        env = observation_spec
        observation_spec, action_spec = env.observation_spec, env.full_action_spec
    elif action_spec is None:
        raise TypeError("make_actor needs an action_spec (or an env: make_actor(env))")
    width = observation_features(
        observation_spec, obs_key=obs_key, backbone=backbone, in_features=in_features
    )
    batch = tuple(observation_spec.shape) if isinstance(observation_spec, Composite) else ()
    layout = action_layout(action_spec, batch)
    if layout is not None:  # MultiDiscrete, MultiBinary, Dict / Tuple actions
        return _multi_part_actor(
            width,
            layout,
            observation_spec,
            action_spec,
            batch,
            action_mask,
            backbone=backbone,
            obs_key=obs_key,
            tanh=tanh,
            **kw,
        )
    info = action_kind(action_spec, batch_shape=batch)
    leaf = action_spec[keys.ACTION] if isinstance(action_spec, Composite) else action_spec
    common = dict(backbone=backbone, obs_key=obs_key, spec=leaf)
    common.update(kw)
    mask_key = _mask_key(observation_spec, action_mask, info, batch)
    if info.kind != "continuous":
        kw_one_hot = common.pop("one_hot", info.kind == "one_hot")
        common.setdefault("mask_key", mask_key)
        actor = categorical_actor(width, info.size, one_hot=kw_one_hot, **common)
    elif not tanh and common.get("bounded_loc"):
        if info.low is None:
            raise ValueError(
                f"--bounded-mean (bounded_loc=True) squashes the policy's mean into the action "
                f"bounds, but this env's action spec is {type(leaf).__name__}, with none: drop "
                "the flag"
            )
        actor = gaussian_actor(width, info.size, low=info.low, high=info.high, **common)
    elif not tanh:
        actor = gaussian_actor(width, info.size, **common)
    elif info.low is None:
        raise ValueError(
            f"tanh=True needs a Bounded action spec, got {type(leaf).__name__}; "
            "use tanh=False for unbounded actions"
        )
    else:
        actor = gaussian_actor(width, info.size, tanh=True, low=info.low, high=info.high, **common)
    check_actor_spec(actor, leaf, batch_shape=batch)
    return attach_collector_check(actor)


def _multi_part_actor(
    width: int,
    layout: ActionLayout,
    observation_spec: TensorSpec,
    action_spec: TensorSpec,
    batch: tuple,
    action_mask: bool | None,
    *,
    tanh: bool,
    **kw,
) -> ProbabilisticActor:
    """:func:`~rlkit.modules.composite.multi_part_actor` for ``make_actor``: a mask of
    ``sum(nvec)`` flags for a MultiDiscrete action, refused for the other layouts."""
    if tanh or kw.get("bounded_loc"):
        raise ValueError(
            f"this env's actions are {layout.describe()}: the multi-part policy's Normal parts "
            "are plain Gaussians (the env clips them); drop tanh / --bounded-mean"
        )
    kw.pop("bounded_loc", None)
    found = None if action_mask is False else mask_key_of(observation_spec)
    if action_mask and found is None:
        raise ValueError(
            f"action_mask=True, but the observation spec has no {keys.ACTION_MASK!r} entry"
        )
    if found is not None:
        if layout.named or layout.parts[0].kind != "multi_discrete":
            raise refuse_mask(f"a policy over {layout.describe()} actions")
        check_mask_spec(observation_spec, sum(layout.parts[0].sizes), len(batch))
    if isinstance(action_spec, Composite) and keys.ACTION in action_spec:
        leaf = action_spec[keys.ACTION]
    else:
        leaf = action_spec
    kw.setdefault("mask_key", found)
    actor = multi_part_actor(width, layout, spec=leaf, **kw)
    check_actor_spec(actor, leaf, batch_shape=batch)
    return attach_collector_check(actor)


def _mask_key(observation_spec, wanted: bool | None, info, batch: tuple) -> NestedKey | None:
    """The action mask key ``make_actor`` reads, or None (see its docstring)."""
    found = mask_key_of(observation_spec)
    if wanted is False:
        return None
    if found is None:
        if wanted:
            raise ValueError(
                f"action_mask=True, but the observation spec has no {keys.ACTION_MASK!r} entry"
            )
        return None
    if info.kind == "continuous":
        raise refuse_mask("a continuous-action (Gaussian) policy")
    check_mask_spec(observation_spec, info.size, len(batch))
    return found


def shared_actor_critic(
    in_features: int,
    *,
    n_actions: int | None = None,
    action_dim: int | None = None,
    hidden: Hidden = (64, 64),
    head_hidden: Hidden = (),
    activation: Activation = "tanh",
    layer_norm: bool = False,
    backbone: nn.Module | None = None,
    obs_key: NestedKey = keys.OBSERVATION,
    **actor_kw,
) -> tuple[ProbabilisticActor, ValueOperator]:
    """Actor and V critic sharing one trunk (Mnih et al. 2016; PPO on Atari).

    ``trunk = backbone -> mlp_body(hidden)``; the policy head and the value head (each an
    MLP with ``head_hidden``, linear by default) both read the trunk features. The two
    returned modules hold the *same* trunk ``nn.Module``, so the policy loss and the value
    loss both train it, while each head receives gradients only from its own loss.

    Give exactly one of ``n_actions`` (categorical policy) or ``action_dim`` (Gaussian
    policy; ``actor_kw`` goes to :func:`gaussian_actor`, e.g. ``tanh``, ``init_log_std``).

    Parameters are shared: build the optimiser from
    ``nn.ModuleList([actor, critic]).parameters()``, which lists the trunk once.

    Returns:
        ``(actor, critic)``: ``actor.get_dist(td)`` / ``actor(td)`` as for the other
        builders; ``critic(td)`` writes ``keys.STATE_VALUE`` ``[*, 1]``.
    """
    if (n_actions is None) == (action_dim is None):
        raise ValueError(
            "give exactly one of n_actions= (discrete policy) or action_dim= (Gaussian policy)"
        )
    body = mlp_body(in_features, hidden=hidden, activation=activation, layer_norm=layer_norm)
    trunk = body if backbone is None else chain(backbone, body)
    width = hidden[-1] if len(hidden) else in_features
    head_kw = dict(
        hidden=head_hidden,
        activation=activation,
        layer_norm=layer_norm,
        backbone=trunk,
        obs_key=obs_key,
    )
    if n_actions is not None:
        actor = categorical_actor(width, n_actions, **head_kw, **actor_kw)
    else:
        actor = gaussian_actor(width, action_dim, **head_kw, **actor_kw)
    critic = value_critic(width, **head_kw)
    return actor, critic
