"""Critics: state values V(s), discrete action values Q(s, .) and continuous Q(s, a).

Each builder returns a TorchRL :class:`~torchrl.modules.ValueOperator` (a
``TensorDictModule``), so a critic is called on a TensorDict and writes its key in place:

=========================  ===========================  =================================
builder                    reads                        writes
=========================  ===========================  =================================
:func:`value_critic`       ``observation [*, F]``       ``state_value [*, 1]``
:func:`q_critic_discrete`  ``observation [*, F]``       ``action_value [*, n]``
:func:`q_critic_continuous` ``observation``, ``action``  ``state_action_value [*, 1]``
=========================  ===========================  =================================

Output layers are orthogonally initialised with gain 1.0 (CleanRL / SB3); hidden layers
with :math:`\\sqrt{2}`. A ``backbone`` (e.g. :class:`~rlkit.modules.networks.NatureCNN`)
maps the observation to ``in_features`` features before the MLP head.

The spec helpers at the bottom (:func:`observation_features`, :func:`action_kind`) are
shared with :mod:`rlkit.modules.actors`: they turn TorchRL specs into widths and raise a
``ValueError`` naming the spec when it is not supported.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, NamedTuple

import torch
from tensordict import NestedKey
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.data import (
    Binary,
    Bounded,
    Categorical,
    Composite,
    MultiCategorical,
    OneHot,
    TensorSpec,
    Unbounded,
)
from torchrl.modules import ValueOperator

from rlkit import keys
from rlkit.modules.dictobs import chain, obs_in_keys
from rlkit.modules.networks import mlp

__all__ = [
    "ActionInfo",
    "action_kind",
    "make_q",
    "make_value",
    "observation_features",
    "q_critic_continuous",
    "q_critic_discrete",
    "value_critic",
]

Hidden = Sequence[int]
Activation = str | type[nn.Module]


def _with_backbone(backbone: nn.Module | None, head: nn.Module) -> nn.Module:
    if backbone is None:
        return head
    if not isinstance(backbone, nn.Module):
        raise TypeError(f"backbone must be an nn.Module, got {type(backbone).__name__}")
    return chain(backbone, head)


def value_critic(
    in_features: int,
    *,
    hidden: Hidden = (64, 64),
    activation: Activation = "tanh",
    layer_norm: bool = False,
    backbone: nn.Module | None = None,
    obs_key: NestedKey = keys.OBSERVATION,
) -> ValueOperator:
    """State-value critic :math:`V_\\phi(s)`.

    Reads ``obs_key`` ``[*, F]`` (or whatever ``backbone`` accepts), writes
    ``keys.STATE_VALUE`` ``[*, 1]``.

    Args:
        in_features: width the MLP head sees: the observation width ``F``, or the
            backbone's output width when a ``backbone`` is given.
        hidden, activation, layer_norm: MLP head, see :func:`~rlkit.modules.networks.mlp`.
        backbone: optional feature extractor applied to the observation first.
        obs_key: key of the observation.

    Example:
        >>> from tensordict import TensorDict
        >>> critic = value_critic(4)
        >>> critic(TensorDict({"observation": torch.zeros(3, 4)}, [3]))["state_value"].shape
        torch.Size([3, 1])
    """
    net = _with_backbone(
        backbone,
        mlp(in_features, 1, hidden=hidden, activation=activation, layer_norm=layer_norm),
    )
    return ValueOperator(net, in_keys=obs_in_keys(obs_key), out_keys=[keys.STATE_VALUE])


def q_critic_discrete(
    in_features: int,
    n_actions: int,
    *,
    hidden: Hidden = (64, 64),
    activation: Activation = "relu",
    layer_norm: bool = False,
    backbone: nn.Module | None = None,
    obs_key: NestedKey = keys.OBSERVATION,
    mask_key: NestedKey | None = None,
) -> ValueOperator:
    """Discrete action-value critic :math:`Q_\\phi(s, \\cdot) \\in \\mathbb{R}^n` (DQN).

    Reads ``obs_key`` ``[*, F]``, writes ``keys.ACTION_VALUE`` ``[*, n_actions]``. Greedy
    action selection (e.g. TorchRL's ``QValueModule``) is left to the algorithm.

    ``mask_key`` (e.g. ``keys.ACTION_MASK``): also read an action mask ``[*, n]`` and write the
    dtype's lowest value for the masked actions (:class:`~rlkit.modules.masks.MaskedHead`), so
    a greedy choice and a target's max run over the valid actions only.

    Example:
        >>> from tensordict import TensorDict
        >>> q = q_critic_discrete(4, 2)
        >>> q(TensorDict({"observation": torch.zeros(3, 4)}, [3]))["action_value"].shape
        torch.Size([3, 2])
    """
    net = _with_backbone(
        backbone,
        mlp(in_features, n_actions, hidden=hidden, activation=activation, layer_norm=layer_norm),
    )
    if mask_key is not None:
        from rlkit.modules.masks import MaskedHead

        return ValueOperator(
            MaskedHead(net), in_keys=[*obs_in_keys(obs_key), mask_key], out_keys=[keys.ACTION_VALUE]
        )
    return ValueOperator(net, in_keys=obs_in_keys(obs_key), out_keys=[keys.ACTION_VALUE])


class _ConcatQ(nn.Module):
    """``Q(s, a) = head(concat(backbone(s), a))``."""

    def __init__(self, head: nn.Module, backbone: nn.Module | None) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        *observation, action = inputs  # several entries of a Dict observation, then the action
        if self.backbone is None:
            (features,) = observation
        else:
            features = self.backbone(*observation)
        return self.head(torch.cat([features, action.to(features.dtype)], dim=-1))


def q_critic_continuous(
    obs_features: int,
    action_dim: int,
    *,
    hidden: Hidden = (256, 256),
    activation: Activation = "relu",
    layer_norm: bool = False,
    backbone: nn.Module | None = None,
    obs_key: NestedKey = keys.OBSERVATION,
    action_key: NestedKey = keys.ACTION,
) -> ValueOperator:
    """Continuous action-value critic :math:`Q_\\phi(s, a)` (SAC, TD3, DDPG).

    Reads ``obs_key`` ``[*, F]`` and ``action_key`` ``[*, action_dim]``, concatenates
    ``[features, action]`` and writes ``keys.STATE_ACTION_VALUE`` ``[*, 1]``.

    Args:
        obs_features: observation width (the backbone's output width with a backbone).
        action_dim: action width.
        hidden: MLP widths; (256, 256) follows SAC (Haarnoja et al., 2018).

    Example:
        >>> from tensordict import TensorDict
        >>> q = q_critic_continuous(3, 1)
        >>> td = TensorDict({"observation": torch.zeros(5, 3), "action": torch.zeros(5, 1)}, [5])
        >>> q(td)["state_action_value"].shape
        torch.Size([5, 1])
    """
    if not isinstance(action_dim, int) or action_dim < 1:
        raise ValueError(f"action_dim must be a positive int, got {action_dim!r}")
    head = mlp(
        obs_features + action_dim,
        1,
        hidden=hidden,
        activation=activation,
        layer_norm=layer_norm,
    )
    return ValueOperator(
        _ConcatQ(head, backbone),
        in_keys=[*obs_in_keys(obs_key), action_key],
        out_keys=[keys.STATE_ACTION_VALUE],
    )


# ---------------------------------------------------------------------------------------
# Spec helpers (shared with rlkit.modules.actors)
# ---------------------------------------------------------------------------------------


class ActionInfo(NamedTuple):
    """What an action spec means for network construction.

    ``kind`` is ``"categorical"`` (int64 index, ``size`` = number of actions),
    ``"one_hot"`` (one-hot vector, ``size`` = number of actions) or ``"continuous"``
    (``size`` = action dimension; ``low`` / ``high`` are ``[size]`` bounds or ``None``
    when the spec is unbounded).
    """

    kind: Literal["categorical", "one_hot", "continuous"]
    size: int
    low: torch.Tensor | None = None
    high: torch.Tensor | None = None


_SUPPORTED_ACTIONS = (
    "Categorical(n) with shape [] (int64 index), OneHot(n), or a continuous "
    "Bounded/Unbounded spec of shape [action_dim]"
)


def _leaf(
    spec: TensorSpec, key: NestedKey, what: str, kwarg: str
) -> tuple[TensorSpec, tuple[int, ...]]:
    """Return ``(leaf spec, batch shape)`` for a leaf spec or a Composite holding ``key``."""
    if isinstance(spec, Composite):
        if key not in spec.keys(True):
            raise KeyError(
                f"{what} spec has no entry {keys.describe(key)}; it holds "
                f"{sorted(map(str, spec.keys(True, True)))}. Name the entry with "
                f"{kwarg}=... or pass the leaf spec itself"
            )
        return spec[key], tuple(spec.shape)
    if isinstance(spec, TensorSpec):
        return spec, ()
    raise TypeError(f"{what} spec must be a torchrl TensorSpec, got {type(spec).__name__}")


def _event_shape(leaf: TensorSpec, batch: tuple[int, ...]) -> tuple[int, ...]:
    shape = tuple(leaf.shape)
    if batch and shape[: len(batch)] == batch:
        return shape[len(batch) :]
    return shape


def observation_features(
    observation_spec: TensorSpec,
    *,
    obs_key: NestedKey = keys.OBSERVATION,
    backbone: nn.Module | None = None,
    in_features: int | None = None,
) -> int:
    """Width the MLP head sees for ``observation_spec``.

    Without a backbone the observation must be a flat floating vector ``[F]`` (after the
    environment batch dims, taken from the Composite's shape); the width is ``F``. With a
    backbone the width is ``in_features`` if given, else ``backbone.out_features``
    (:class:`~rlkit.modules.networks.NatureCNN` and ``ImpalaCNN`` define it).

    Args:
        observation_spec: ``env.observation_spec`` (a Composite; batch dims are stripped) or
            an unbatched leaf spec.
    """
    if isinstance(obs_key, list):  # a Dict observation's entries, read by the backbone
        for key in obs_key:
            _leaf(observation_spec, key, "observation", "obs_key")
        if backbone is None:
            raise ValueError(
                f"observation entries {obs_key} need a backbone that reads them all "
                "(rlkit.modules.dictobs.dict_obs_encoder)"
            )
        leaf, batch = None, ()
    else:
        leaf, batch = _leaf(observation_spec, obs_key, "observation", "obs_key")
    if backbone is not None:
        width = in_features if in_features is not None else getattr(backbone, "out_features", None)
        if not isinstance(width, int):
            raise ValueError(
                f"cannot tell the output width of backbone {type(backbone).__name__}: pass "
                "in_features=<its output width> or give the backbone an `out_features` attribute"
            )
        return width
    if isinstance(leaf, Composite):
        raise ValueError(
            f"observation {keys.describe(obs_key)} is a nested Composite spec; pass a "
            "backbone that reads it, or select a flat entry with obs_key=..."
        )
    shape = _event_shape(leaf, batch)
    if len(shape) != 1 or not leaf.dtype.is_floating_point:
        raise ValueError(
            f"observation spec {type(leaf).__name__}(shape={list(shape)}, dtype={leaf.dtype}) "
            "is not a flat float vector [F]; MLP networks support only those. Pass "
            "backbone=... (e.g. NatureCNN/ImpalaCNN for images, nn.Embedding for discrete "
            "observations) with in_features=<backbone output width>"
        )
    return shape[0]


def action_kind(
    action_spec: TensorSpec,
    *,
    batch_shape: Sequence[int] = (),
    action_key: NestedKey = keys.ACTION,
) -> ActionInfo:
    """Classify ``action_spec`` into an :class:`ActionInfo`, or raise ``ValueError``.

    Supported: ``Categorical(n)`` with event shape ``[]``, ``OneHot(n)`` with event shape
    ``[n]``, and continuous ``Bounded`` / ``Unbounded`` specs with event shape
    ``[action_dim]``. ``batch_shape`` (the env batch shape) is stripped from leaf specs;
    a Composite (``env.full_action_spec``) supplies its own.
    """
    leaf, batch = _leaf(action_spec, action_key, "action", "action_key")
    batch = batch or tuple(batch_shape)
    shape = _event_shape(leaf, batch)
    name = type(leaf).__name__
    if type(leaf) is Categorical and shape == ():
        return ActionInfo("categorical", int(leaf.space.n))
    if type(leaf) is OneHot and len(shape) == 1:
        return ActionInfo("one_hot", int(leaf.space.n))
    continuous = isinstance(leaf, Bounded | Unbounded) and leaf.domain == "continuous"
    if continuous and len(shape) == 1:
        if isinstance(leaf, Bounded):
            low = leaf.space.low.reshape(-1, shape[0])[0].detach().clone()
            high = leaf.space.high.reshape(-1, shape[0])[0].detach().clone()
            return ActionInfo("continuous", shape[0], low, high)
        return ActionInfo("continuous", shape[0])
    from rlkit.modules.composite import PART_RECIPES

    if isinstance(leaf, Composite | MultiCategorical | Binary):
        raise ValueError(
            f"this env's actions are {name}(shape={list(shape)}) (MultiDiscrete, MultiBinary or "
            f"Dict / Tuple), which this part cannot take: the recipes that take them are "
            f"{PART_RECIPES} (docs/actions.md)"
        )
    raise ValueError(
        f"unsupported action spec {name}(shape={list(shape)}, dtype={leaf.dtype}); rlkit's "
        f"actor and critic builders support {_SUPPORTED_ACTIONS}. Create discrete envs with "
        "categorical_action_encoding=True, or build the network by hand for this space"
    )


def make_value(
    observation_spec: TensorSpec,
    *,
    hidden: Hidden = (64, 64),
    activation: Activation = "tanh",
    layer_norm: bool = False,
    backbone: nn.Module | None = None,
    in_features: int | None = None,
    obs_key: NestedKey = keys.OBSERVATION,
) -> ValueOperator:
    """:func:`value_critic` sized from ``observation_spec`` (see :func:`observation_features`)."""
    width = observation_features(
        observation_spec, obs_key=obs_key, backbone=backbone, in_features=in_features
    )
    return value_critic(
        width,
        hidden=hidden,
        activation=activation,
        layer_norm=layer_norm,
        backbone=backbone,
        obs_key=obs_key,
    )


def make_q(
    observation_spec: TensorSpec,
    action_spec: TensorSpec,
    *,
    hidden: Hidden | None = None,
    activation: Activation = "relu",
    layer_norm: bool = False,
    backbone: nn.Module | None = None,
    in_features: int | None = None,
    obs_key: NestedKey = keys.OBSERVATION,
) -> TensorDictModule:
    """Q critic for the action space: :func:`q_critic_discrete` for Categorical/OneHot
    actions (default hidden (64, 64)), :func:`q_critic_continuous` for continuous ones
    (default hidden (256, 256)). Raises ``ValueError`` for other action specs."""
    width = observation_features(
        observation_spec, obs_key=obs_key, backbone=backbone, in_features=in_features
    )
    batch = tuple(observation_spec.shape) if isinstance(observation_spec, Composite) else ()
    info = action_kind(action_spec, batch_shape=batch)
    common = dict(activation=activation, layer_norm=layer_norm, backbone=backbone, obs_key=obs_key)
    if info.kind == "continuous":
        return q_critic_continuous(
            width, info.size, hidden=(256, 256) if hidden is None else hidden, **common
        )
    return q_critic_discrete(
        width, info.size, hidden=(64, 64) if hidden is None else hidden, **common
    )
