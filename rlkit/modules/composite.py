r"""Multi-part actions: MultiDiscrete, MultiBinary and Dict / Tuple (parameterised) actions.

A factorised policy: one distribution per part of the action, each from its own slice of one
network output ``keys.ACTION_PARAMS`` ``[*, P]``, independent given the state:

.. math::
    \pi(a|s) = \prod_j \pi_j(a_j|s), \qquad
    \log\pi(a|s) = \sum_j \log\pi_j(a_j|s), \qquad
    H[\pi(\cdot|s)] = \sum_j H[\pi_j(\cdot|s)]

(the entropy of independent parts is the sum of theirs). The parts:

=================  ===========================  ==============================================
part               action                       distribution, parameters
=================  ===========================  ==============================================
``Discrete(n)``    int64 ``[*]``                categorical, ``n`` logits
``MultiDiscrete``  int64 ``[*, k]``             one categorical per entry, ``sum(nvec)``
                                                logits (a mask of ``sum(nvec)`` flags masks
                                                each entry's own choices)
``MultiBinary(k)`` int8 ``[*, k]``              one Bernoulli per bit, ``k`` logits
``Box(d)``         float32 ``[*, d]``           Normal, ``d`` means and a learned
                                                state-independent log-std (the env clips)
=================  ===========================  ==============================================

A MultiDiscrete / MultiBinary action is one tensor under ``keys.ACTION``; a Dict (or Tuple,
whose entries ``make_env`` names ``"0"``, ``"1"``, ...) action is a TensorDict under
``keys.ACTION`` with one entry per part, e.g. ``("action", "kind")`` and ``("action",
"params")`` for ``Dict(kind=Discrete(3), params=Box(-1, 1, (2,)))``.

Why rlkit's own distribution and not TorchRL's ``CompositeDistribution``: one parameter
tensor for all parts (one network output, one stored key, the direct sampling path of
:mod:`rlkit.modules.direct` unchanged), the joint log-probability and entropy as plain
``[*]`` tensors (what every loss reads, ``dist.log_prob(td["action"])``, issue 47's
``AttributeError`` with ``CompositeDistribution``), the per-part figures on demand
(:meth:`MultiPartDistribution.log_prob_parts`, :meth:`~MultiPartDistribution.entropy_parts`,
logged by the losses as ``log_prob_<part>`` / ``entropy_<part>``), and masks applied to the
logits with the rest of rlkit's (:mod:`rlkit.modules.masks`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tensordict import NestedKey, TensorDict, TensorDictBase
from tensordict.nn import InteractionType, TensorDictModule
from tensordict.nn.probabilistic import interaction_type
from torch import Tensor, nn
from torchrl.data import (
    Binary,
    Bounded,
    Categorical,
    Composite,
    MultiCategorical,
    TensorSpec,
    Unbounded,
)
from torchrl.modules import ProbabilisticActor, SafeProbabilisticModule

from rlkit import keys
from rlkit.modules.compat import attach_collector_check
from rlkit.modules.masks import masked_fill_lowest

__all__ = [
    "PART_RECIPES",
    "ActionLayout",
    "ActionPart",
    "MultiPartDistribution",
    "action_layout",
    "multi_part_actor",
    "refuse_layout",
    "refuse_structured",
]

#: The recipes that take MultiDiscrete, MultiBinary and Dict / Tuple actions.
PART_RECIPES = "ppo, a2c, impala, appo and rnd"

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


@dataclass(frozen=True)
class ActionPart:
    """One part of an action: ``kind`` is ``"discrete"`` (``sizes=(n,)``, int64 ``[*]``),
    ``"multi_discrete"`` (``sizes=nvec``, int64 ``[*, k]``), ``"binary"`` (``sizes=(k,)``,
    int8 ``[*, k]``) or ``"normal"`` (``sizes=(d,)``, float ``[*, d]``); ``name`` its entry in
    a Dict action (``""`` for a flat one)."""

    name: str
    kind: str
    sizes: tuple[int, ...]

    @property
    def width(self) -> int:
        """Its columns of ``keys.ACTION_PARAMS``: logits, or a Normal's means and log-stds."""
        if self.kind == "normal":
            return 2 * self.sizes[0]
        if self.kind == "binary":
            return self.sizes[0]
        return sum(self.sizes)

    @property
    def net_width(self) -> int:
        """The network outputs it needs (a Normal's log-std is a parameter of the head)."""
        return self.sizes[0] if self.kind == "normal" else self.width

    def describe(self) -> str:
        sizes = list(self.sizes)
        return {
            "discrete": f"Discrete({sizes[0]})",
            "multi_discrete": f"MultiDiscrete({sizes})",
            "binary": f"MultiBinary({sizes[0]})",
            "normal": f"Box({sizes[0]})",
        }[self.kind]


@dataclass(frozen=True)
class ActionLayout:
    """The parts of a structured action. ``named``: a Dict action (a TensorDict of parts);
    else one MultiDiscrete or MultiBinary part, a plain tensor."""

    parts: tuple[ActionPart, ...]
    named: bool

    @property
    def width(self) -> int:
        return sum(p.width for p in self.parts)

    def describe(self) -> str:
        if not self.named:
            return self.parts[0].describe()
        return "Dict(" + ", ".join(f"{p.name}={p.describe()}" for p in self.parts) + ")"


def _event_shape(spec: TensorSpec, batch: tuple[int, ...]) -> tuple[int, ...]:
    shape = tuple(spec.shape)
    return shape[len(batch) :] if shape[: len(batch)] == batch else shape


def _leaf_part(name: str, spec: TensorSpec, batch: tuple[int, ...]) -> ActionPart | None:
    shape = _event_shape(spec, batch)
    if type(spec) is Categorical and shape == ():
        return ActionPart(name, "discrete", (int(spec.space.n),))
    if isinstance(spec, MultiCategorical) and len(shape) == 1:
        nvec = spec.nvec.reshape(-1, shape[0])[0]
        return ActionPart(name, "multi_discrete", tuple(int(n) for n in nvec))
    if isinstance(spec, Binary) and len(shape) == 1:
        return ActionPart(name, "binary", (shape[0],))
    continuous = isinstance(spec, Bounded | Unbounded) and spec.domain == "continuous"
    if continuous and len(shape) == 1:
        return ActionPart(name, "normal", (shape[0],))
    return None


def action_layout(action_spec: TensorSpec, batch: Sequence[int] = ()) -> ActionLayout | None:
    """The :class:`ActionLayout` of a MultiDiscrete (``MultiCategorical``), MultiBinary
    (``Binary``) or Dict (``Composite``) action spec; None for a plain one (``Categorical``,
    ``OneHot``, ``Bounded`` / ``Unbounded``), which the other builders take.

    ``action_spec``: a leaf spec, ``env.full_action_spec`` / ``env.action_spec`` (a Composite
    holding ``keys.ACTION``, or the env's action Composite itself). ``batch``: the env batch
    shape a leaf carries (a Composite supplies its own). Raises ``ValueError`` for a Dict
    whose entries are not Discrete, MultiDiscrete, MultiBinary or Box(d)."""
    batch = tuple(batch)
    if isinstance(action_spec, Composite):
        batch = tuple(action_spec.shape) or batch
        if keys.ACTION in action_spec:
            action_spec = action_spec[keys.ACTION]
        elif not set(action_spec.keys()) - {keys.ACTION}:
            return None
    if isinstance(action_spec, Composite):
        parts = []
        for name, sub in action_spec.items():
            part = None if isinstance(sub, Composite) else _leaf_part(name, sub, batch)
            if part is None or part.kind == "multi_discrete" and len(action_spec.keys()) > 1:
                raise ValueError(
                    f"a Dict action's entry {name!r} is {type(sub).__name__}("
                    f"shape={list(_event_shape(sub, batch))}); rlkit's actors take Dict actions of "
                    "Discrete, MultiBinary and Box(d) entries (flatten nested ones with a "
                    "gymnasium ActionWrapper)"
                )
            parts.append(part)
        return ActionLayout(tuple(parts), named=True)
    part = _leaf_part("", action_spec, batch)
    if part is None or part.kind not in ("multi_discrete", "binary"):
        return None
    return ActionLayout((part,), named=False)


def refuse_layout(layout: ActionLayout, who: str) -> ValueError:
    """The one line that refuses a structured action a recipe cannot take."""
    return ValueError(
        f"this env's actions are {layout.describe()}, which {who} cannot take: the recipes "
        f"that take MultiDiscrete, MultiBinary and Dict / Tuple actions are {PART_RECIPES} "
        "(docs/actions.md)"
    )


def refuse_structured(env, who: str) -> None:
    """Raise :func:`refuse_layout`'s one line when ``env``'s actions are MultiDiscrete,
    MultiBinary or Dict / Tuple (a recipe that cannot take them calls this first)."""
    try:
        layout = action_layout(env.full_action_spec, tuple(env.batch_size))
    except ValueError:
        layout = None
    if layout is not None:
        raise refuse_layout(layout, who)


class MultiPartDistribution(torch.distributions.Distribution):
    """Independent parts from one parameter tensor ``params`` ``[*, P]`` (the module
    docstring): samples a tensor (one part) or a TensorDict (a Dict action); ``log_prob``
    and ``entropy`` are ``[*]``, the sums of the parts'."""

    arg_constraints: dict = {}
    has_rsample = False

    def __init__(self, params: Tensor, layout: ActionLayout) -> None:
        self.params, self.layout = params, layout
        super().__init__(batch_shape=params.shape[:-1], validate_args=False)
        self._chunks = params.split([p.width for p in layout.parts], dim=-1)

    # ---------------------------------------------------------------- per part
    def _groups(self, part: ActionPart, chunk: Tensor) -> list[Tensor]:
        """A categorical part's logits, one ``[*, n]`` tensor per entry."""
        return list(chunk.split(list(part.sizes), dim=-1))

    def _part_sample(self, part: ActionPart, chunk: Tensor, shape: torch.Size) -> Tensor:
        if part.kind == "normal":
            loc, log_std = chunk.chunk(2, dim=-1)
            noise = torch.randn(shape + loc.shape, dtype=loc.dtype, device=loc.device)
            return loc + log_std.exp() * noise
        if part.kind == "binary":
            probs = torch.sigmoid(chunk).expand(shape + chunk.shape)
            return torch.bernoulli(probs).to(torch.int8)
        draws = [
            torch.distributions.Categorical(logits=z).sample(shape)
            for z in self._groups(part, chunk)
        ]
        return draws[0] if part.kind == "discrete" else torch.stack(draws, dim=-1)

    def _part_mode(self, part: ActionPart, chunk: Tensor) -> Tensor:
        if part.kind == "normal":
            return chunk.chunk(2, dim=-1)[0]
        if part.kind == "binary":
            return (chunk > 0).to(torch.int8)
        modes = [z.argmax(-1) for z in self._groups(part, chunk)]
        return modes[0] if part.kind == "discrete" else torch.stack(modes, dim=-1)

    def _part_log_prob(self, part: ActionPart, chunk: Tensor, action: Tensor) -> Tensor:
        if part.kind == "normal":
            loc, log_std = chunk.chunk(2, dim=-1)
            z = (action - loc) / log_std.exp()
            return (-0.5 * z.square() - log_std - _LOG_SQRT_2PI).sum(-1)
        if part.kind == "binary":
            bits = action.to(chunk.dtype)
            return -nn.functional.binary_cross_entropy_with_logits(
                chunk.expand_as(bits), bits, reduction="none"
            ).sum(-1)
        index = action.long()
        if part.kind == "discrete":
            index = index.unsqueeze(-1)
        total = 0
        for i, z in enumerate(self._groups(part, chunk)):
            logp = z.log_softmax(-1).expand(*index.shape[:-1], z.shape[-1])
            total = total + logp.gather(-1, index[..., i : i + 1]).squeeze(-1)
        return total

    def _part_entropy(self, part: ActionPart, chunk: Tensor) -> Tensor:
        if part.kind == "normal":
            log_std = chunk.chunk(2, dim=-1)[1]
            return (0.5 + _LOG_SQRT_2PI + log_std).sum(-1)
        if part.kind == "binary":
            p = torch.sigmoid(chunk)
            # H = softplus(z) - z sigmoid(z) (the Bernoulli entropy in its logit)
            return (nn.functional.softplus(chunk) - chunk * p).sum(-1)
        total = 0
        for z in self._groups(part, chunk):
            logp = z.log_softmax(-1)
            total = total - (logp.exp() * logp).sum(-1)  # masked: 0 * (finite) = 0
        return total

    def _action_of(self, action, part: ActionPart) -> Tensor:
        return action.get(part.name) if self.layout.named else action

    def _pack(self, values: list[Tensor], batch: torch.Size):
        if not self.layout.named:
            return values[0]
        return TensorDict(
            {p.name: v for p, v in zip(self.layout.parts, values)},
            batch_size=batch,
            device=self.params.device,
        )

    # ---------------------------------------------------------------- the distribution
    def sample(self, sample_shape: torch.Size | Sequence[int] = torch.Size()):
        shape = torch.Size(sample_shape)
        with torch.no_grad():
            values = [
                self._part_sample(p, c, shape) for p, c in zip(self.layout.parts, self._chunks)
            ]
        return self._pack(values, shape + self.batch_shape)

    @property
    def deterministic_sample(self):
        """The mode of every part: argmax, bit set when its probability exceeds 1/2, the mean."""
        values = [self._part_mode(p, c) for p, c in zip(self.layout.parts, self._chunks)]
        return self._pack(values, self.batch_shape)

    @property
    def mode(self):
        return self.deterministic_sample

    def log_prob_parts(self, action) -> dict[str, Tensor]:
        """``{part name: log pi_j(a_j|s) [*]}`` (``"0"``, ``"1"``, ... for the entries of a
        MultiDiscrete / MultiBinary action)."""
        out = {}
        for part, chunk in zip(self.layout.parts, self._chunks):
            a = self._action_of(action, part)
            if self.layout.named:
                out[part.name] = self._part_log_prob(part, chunk, a)
            else:
                out.update(self._entry_log_probs(part, chunk, a))
        return out

    def _entry_log_probs(self, part: ActionPart, chunk: Tensor, action: Tensor) -> dict:
        if part.kind == "binary":
            bits = action.to(chunk.dtype)
            lp = -nn.functional.binary_cross_entropy_with_logits(
                chunk.expand_as(bits), bits, reduction="none"
            )
            return {str(i): lp[..., i] for i in range(part.sizes[0])}
        index = action.long()
        return {
            str(i): z.log_softmax(-1)
            .expand(*index.shape[:-1], z.shape[-1])
            .gather(-1, index[..., i : i + 1])
            .squeeze(-1)
            for i, z in enumerate(self._groups(part, chunk))
        }

    def log_prob(self, action) -> Tensor:
        total = 0
        for part, chunk in zip(self.layout.parts, self._chunks):
            total = total + self._part_log_prob(part, chunk, self._action_of(action, part))
        return total

    def entropy_parts(self) -> dict[str, Tensor]:
        """``{part name: H[pi_j(.|s)] [*]}`` (per entry for a MultiDiscrete / MultiBinary)."""
        out = {}
        for part, chunk in zip(self.layout.parts, self._chunks):
            if self.layout.named:
                out[part.name] = self._part_entropy(part, chunk)
            elif part.kind == "binary":
                h = nn.functional.softplus(chunk) - chunk * torch.sigmoid(chunk)
                out.update({str(i): h[..., i] for i in range(part.sizes[0])})
            else:
                for i, z in enumerate(self._groups(part, chunk)):
                    logp = z.log_softmax(-1)
                    out[str(i)] = -(logp.exp() * logp).sum(-1)
        return out

    def entropy(self) -> Tensor:
        total = 0
        for part, chunk in zip(self.layout.parts, self._chunks):
            total = total + self._part_entropy(part, chunk)
        return total


class MultiPartHead(nn.Module):
    """``(x[, mask]) -> params [*, P]``: the network's outputs in the layout's order, with each
    Normal part's learned log-std (state-independent, CleanRL's PPO) after its means; with a
    mask (a flat MultiDiscrete's ``sum(nvec)`` flags) the masked logits get the dtype's lowest
    value (:func:`~rlkit.modules.masks.masked_fill_lowest`)."""

    def __init__(self, net: nn.Module, layout: ActionLayout, init_log_std: float = 0.0) -> None:
        super().__init__()
        self.net, self.layout = net, layout
        self.log_std = nn.ParameterDict(
            {
                f"p{i}": nn.Parameter(torch.full((p.sizes[0],), float(init_log_std)))
                for i, p in enumerate(layout.parts)
                if p.kind == "normal"
            }
        )

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        out = self.net(x)
        if not self.log_std:
            return out if mask is None else masked_fill_lowest(out, mask)
        pieces = out.split([p.net_width for p in self.layout.parts], dim=-1)
        params = []
        for i, (part, piece) in enumerate(zip(self.layout.parts, pieces)):
            params.append(piece)
            if part.kind == "normal":
                params.append(self.log_std[f"p{i}"].expand_as(piece))
        return torch.cat(params, dim=-1)


class _DictActionModule(SafeProbabilisticModule):
    """The probabilistic module of a Dict-action actor: writes the sampled TensorDict under
    ``keys.ACTION`` and its joint log-probability (TensorDict's own path for a TensorDict
    sample writes the parts at the root and expects a TensorDict of log-probabilities, the
    ``CompositeDistribution`` protocol)."""

    def forward(
        self,
        tensordict: TensorDictBase,
        tensordict_out: TensorDictBase | None = None,
        _requires_sample: bool = True,
    ) -> TensorDictBase:
        out = tensordict if tensordict_out is None else tensordict_out
        dist = self.get_dist(tensordict)
        if _requires_sample:
            action = self._dist_sample(dist, interaction_type=interaction_type())
            out.set(keys.ACTION, action)
        else:
            action = tensordict.get(keys.ACTION)
        if self.return_log_prob:
            out.set(self.log_prob_key, dist.log_prob(action))
        return out


def multi_part_actor(
    in_features: int,
    layout: ActionLayout,
    *,
    hidden: Sequence[int] = (64, 64),
    activation: str | type[nn.Module] = "tanh",
    layer_norm: bool = False,
    backbone: nn.Module | None = None,
    spec: TensorSpec | None = None,
    obs_key: NestedKey = keys.OBSERVATION,
    mask_key: NestedKey | None = None,
    init_log_std: float = 0.0,
) -> ProbabilisticActor:
    """A factorised policy over ``layout``'s parts (module docstring).

    Reads ``obs_key`` (and ``mask_key``, a flat MultiDiscrete's ``[*, sum(nvec)]`` mask);
    writes ``keys.ACTION_PARAMS`` ``[*, P]``, ``keys.ACTION`` (a tensor, or a TensorDict of
    parts for a Dict action) and ``keys.ACTION_LOG_PROB`` ``[*]`` (the sum of the parts').
    The output layer is orthogonal with gain 0.01: a near-uniform initial policy.

    Example:
        >>> from tensordict import TensorDict
        >>> layout = ActionLayout((ActionPart("", "multi_discrete", (3, 2)),), named=False)
        >>> actor = multi_part_actor(4, layout)
        >>> td = actor(TensorDict({"observation": torch.zeros(5, 4)}, [5]))
        >>> td["action"].shape, td["action_log_prob"].shape
        (torch.Size([5, 2]), torch.Size([5]))
    """
    from rlkit.modules.actors import POLICY_OUT_GAIN, _head
    from rlkit.modules.networks import mlp

    if mask_key is not None and (layout.named or layout.parts[0].kind != "multi_discrete"):
        raise ValueError(
            f"an action mask applies to Discrete and MultiDiscrete actions, not {layout.describe()}"
        )
    width = sum(p.net_width for p in layout.parts)
    net = mlp(
        in_features,
        width,
        hidden=hidden,
        activation=activation,
        layer_norm=layer_norm,
        out_gain=POLICY_OUT_GAIN,
    )
    head = MultiPartHead(_head(backbone, net), layout, init_log_std)
    in_keys = [obs_key] if mask_key is None else [obs_key, mask_key]
    module = TensorDictModule(head, in_keys=in_keys, out_keys=[keys.ACTION_PARAMS])
    actor = ProbabilisticActor(
        module,
        in_keys={"params": keys.ACTION_PARAMS},
        out_keys=[keys.ACTION],
        spec=None if layout.named else spec,
        distribution_class=MultiPartDistribution,
        distribution_kwargs={"layout": layout},
        return_log_prob=True,
        log_prob_key=keys.ACTION_LOG_PROB,
        default_interaction_type=InteractionType.RANDOM,
    )
    if layout.named:  # a TensorDict action: written whole under keys.ACTION
        prob = actor.module[1]
        prob.__class__ = _DictActionModule
        if spec is not None:  # TorchRL checks a spec's leaves against out_keys: set it after
            prob._spec = Composite({keys.ACTION: spec}, shape=spec.shape)
    return attach_collector_check(actor)
