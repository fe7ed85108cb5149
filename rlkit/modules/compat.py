"""Does an actor fit an environment? :func:`check_env_compat` says so before any step is taken.

TorchRL sends whatever the policy writes to ``env.step``: an index action ``[*]`` given to an
env whose action spec is ``OneHot(n)`` (a default ``GymEnv("CartPole-v1")``) is read as a
one-hot vector, every action becomes 0 and training runs without learning. rlkit's collectors
(:func:`rlkit.data.collector.make_collector`, :class:`~rlkit.data.collector.VectorEnvCollector`)
call :func:`check_env_compat` at construction; a TorchRL user calls it once before building
TorchRL's ``Collector``.

What is compared, the actor's side from its attached spec (``ProbabilisticActor(spec=...)``,
set by every rlkit builder), its distribution and one probe call on a zero observation (made
without grad and without touching the global random state):

* the **encoding** of discrete actions: index (``Categorical``, int64 ``[*]``) or one-hot
  (``OneHot``, ``[*, n]``);
* the **shape**: the number of discrete actions, or the action dimension;
* the **bounds** of continuous actions, when both sides declare them (a TanhNormal actor
  squashing into ``[-1, 1]`` on an env whose spec is ``[-2, 2]`` never reaches half the
  range). An unbounded (Normal) actor on a bounded env is accepted: the env clips.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import NestedKey, TensorDictBase
from tensordict.nn import TensorDictModuleBase
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

from rlkit import keys

__all__ = [
    "ActionSpecMismatchError",
    "attach_collector_check",
    "check_actor_spec",
    "check_env_compat",
]

_FIX_DISCRETE = (
    "build the actor from the env's specs, rlkit.modules.make_actor(env.observation_spec, "
    "env.action_spec)"
)


class ActionSpecMismatchError(ValueError):
    """The actions an actor writes do not fit the env's action spec (encoding, shape, bounds)."""


@dataclass
class _Side:
    """What one side (actor or env) says about the action."""

    kind: str  # "index", "one-hot", "continuous" or "other"
    n: int | None = None  # discrete: number of actions; continuous: action dim
    low: torch.Tensor | None = None
    high: torch.Tensor | None = None
    text: str = ""  # the actions, e.g. "one-hot actions, shape [*, 2]"
    spec: str = ""  # the spec they come from, e.g. "OneHot(n=2)"
    layout: str | None = None  # a structured action's parts, e.g. "MultiDiscrete([3, 3])"

    def env_text(self) -> str:
        return f"{self.spec} ({self.text})" if self.spec else self.text


def _leaf(spec: TensorSpec, action_key: NestedKey) -> TensorSpec | None:
    """The action's spec: a leaf, or a Dict action's Composite of parts."""
    if isinstance(spec, Composite):
        return spec.get(action_key, None) if action_key in spec.keys(True) else None
    return spec


def _describe_spec(spec: TensorSpec, batch: tuple[int, ...]) -> _Side:
    shape = tuple(spec.shape)[len(batch) :]
    name = type(spec).__name__
    if isinstance(spec, Composite | MultiCategorical | Binary):
        from rlkit.modules.composite import action_layout

        try:
            layout = action_layout(spec, batch)
        except ValueError:
            layout = None
        if layout is not None:
            what = layout.describe()
            return _Side("structured", text=f"{what} actions", spec=what, layout=what)
    if isinstance(spec, OneHot) and len(shape) == 1:
        n = int(spec.space.n)
        return _Side("one-hot", n, text=f"one-hot actions, shape [*, {n}]", spec=f"OneHot(n={n})")
    if type(spec) is Categorical and shape == ():
        n = int(spec.space.n)
        text = f"index actions (int64, shape [*]) among {n}"
        return _Side("index", n, text=text, spec=f"Categorical(n={n})")
    continuous = isinstance(spec, Bounded | Unbounded) and spec.domain == "continuous"
    if continuous and len(shape) == 1:
        d = shape[0]
        if isinstance(spec, Bounded):
            low = spec.space.low.reshape(-1, d)[0].detach().float()
            high = spec.space.high.reshape(-1, d)[0].detach().float()
            text = f"{d}-dim actions in [{_fmt(low)}, {_fmt(high)}]"
            return _Side("continuous", d, low, high, text, spec=f"{name}(shape=[{d}])")
        return _Side(
            "continuous", d, text=f"unbounded {d}-dim actions", spec=f"{name}(shape=[{d}])"
        )
    dtype = getattr(spec, "dtype", None)
    return _Side("other", text=f"shape {list(shape)}, dtype {dtype}", spec=name)


def _fmt(t: torch.Tensor) -> str:
    values = t.flatten().tolist()
    if all(v == values[0] for v in values):
        return f"{values[0]:g}"
    return "[" + ", ".join(f"{v:g}" for v in values) + "]"


def _actor_spec(actor: nn.Module, action_key: NestedKey) -> TensorSpec | None:
    """The action spec attached to the actor (or to its probabilistic sub-module)."""
    for module in actor.modules() if isinstance(actor, nn.Module) else ():
        spec = getattr(module, "spec", None)
        if isinstance(spec, TensorSpec):
            leaf = _leaf(spec, action_key)
            if leaf is not None:
                return leaf
    return None


def _distribution(actor: nn.Module) -> tuple[Any, dict] | None:
    """``(distribution_class, distribution_kwargs)`` of the actor's probabilistic module."""
    for module in actor.modules() if isinstance(actor, nn.Module) else ():
        dist = getattr(module, "distribution_class", None)
        if dist is not None:
            return dist, dict(getattr(module, "distribution_kwargs", {}) or {})
    return None


#: Distribution classes by the encoding of the discrete actions they sample.
_INDEX_DISTS = ("Categorical", "MaskedCategorical")
_ONE_HOT_DISTS = ("OneHotCategorical", "MaskedOneHotCategorical")


def _looks_one_hot(action: torch.Tensor) -> bool:
    values = action.detach()
    binary = ((values == 0) | (values == 1)).all()
    return bool(binary and (values.sum(-1) == 1).all())


def _probe_side(action: torch.Tensor, out: TensorDictBase, batch: tuple[int, ...]) -> _Side:
    """Classify the action the actor wrote for a batch of shape ``batch``."""
    shape = tuple(action.shape)[len(batch) :]
    if tuple(action.shape[: len(batch)]) != batch:
        return _Side("other", text=f"actions of shape {list(action.shape)}")
    if not action.is_floating_point() and shape == ():
        logits = out.get(keys.LOGITS, None)
        n = int(logits.shape[-1]) if isinstance(logits, torch.Tensor) else None
        return _Side("index", n, text=f"index actions ({action.dtype}, shape [*])")
    if len(shape) == 1 and (not action.is_floating_point() or _looks_one_hot(action)):
        n = shape[0]
        return _Side("one-hot", n, text=f"one-hot actions (shape [*, {n}])")
    if action.is_floating_point() and len(shape) == 1:
        return _Side("continuous", shape[0], text=f"{shape[0]}-dim continuous actions")
    return _Side("other", text=f"actions of shape [*, {', '.join(map(str, shape))}]")


def _encoding_error(who: str, actor: _Side, env: _Side) -> ActionSpecMismatchError:
    if env.kind == "one-hot":
        fix = (
            f"{_FIX_DISCRETE} (or categorical_actor(..., one_hot=True)), or create the env "
            "with index actions: GymEnv(..., categorical_action_encoding=True)"
        )
    elif env.kind == "index":
        fix = f"{_FIX_DISCRETE} (or categorical_actor(..., one_hot=False))"
    else:
        fix = "build the actor from the env's specs: rlkit.modules.make_actor(...)"
    return ActionSpecMismatchError(
        f"{who} writes {actor.text} but the env's action spec is {env.env_text()}: the env "
        f"would misread every action. Fix: {fix}."
    )


def _compare(who: str, actor: _Side, env: _Side) -> None:
    if "other" in (actor.kind, env.kind):
        if actor.kind != env.kind and env.kind != "other":
            raise _encoding_error(who, actor, env)
        return
    if actor.kind != env.kind:
        raise _encoding_error(who, actor, env)
    if actor.kind == "structured" and actor.layout != env.layout:
        raise ActionSpecMismatchError(
            f"{who} writes {actor.text} but the env's action spec is {env.text}: the env would "
            "misread every action. Fix: build the actor from the env's specs, "
            "rlkit.modules.make_actor(env)."
        )
    if actor.n is not None and env.n is not None and actor.n != env.n:
        what = "actions to choose from" if actor.kind != "continuous" else "action dimensions"
        raise ActionSpecMismatchError(
            f"{who} has {actor.n} {what} but the env's action spec is {env.env_text()}: build the "
            "actor with the env's action count / dimension (rlkit.modules.make_actor("
            "env.observation_spec, env.action_spec) reads it from the spec)."
        )
    if actor.kind == "continuous" and actor.low is not None and env.low is not None:
        low, high = actor.low.to(env.low.device), actor.high.to(env.high.device)  # GPU actor
        same = torch.allclose(low.expand_as(env.low), env.low, atol=1e-5) and (
            torch.allclose(high.expand_as(env.high), env.high, atol=1e-5)
        )
        if not same:
            raise ActionSpecMismatchError(
                f"{who} writes actions in [{_fmt(actor.low)}, {_fmt(actor.high)}] but the env's "
                f"action spec is {env.env_text()}: build the actor with the env's bounds "
                "(gaussian_actor(..., tanh=True, low=spec.low, high=spec.high), or "
                "make_actor(env.observation_spec, env.action_spec, tanh=True))."
            )


def _describe_actor_spec(spec: TensorSpec, batch: tuple[int, ...]) -> _Side:
    """An actor's attached spec may carry the env's batch dims (``make_actor(env.obs_spec,
    env.action_spec)`` attaches the env's leaf), another env's batch dims (built on the
    learner's env, acting in a worker's) or none (``categorical_actor(4, 2)``)."""
    if batch and tuple(spec.shape[: len(batch)]) == batch:
        side = _describe_spec(spec, batch)
        if side.kind != "other":
            return side
    side = _describe_spec(spec, ())
    lead = spec.ndim - (0 if type(spec) is Categorical else 1)
    if side.kind == "other" and lead > 0:
        # batched for another number of envs: worker processes split the learner's envs,
        # so an actor built on the learner's env ([8, 1]) acts in a worker's ([4, 1])
        other = _describe_spec(spec, tuple(spec.shape[:lead]))
        if other.kind != "other":
            return other
    return side


def _static_side(
    actor: nn.Module, action_key: NestedKey, batch: tuple[int, ...] = ()
) -> _Side | None:
    """The actor's side from its attached spec and its distribution class."""
    spec = _actor_spec(actor, action_key)
    side = _describe_actor_spec(spec, batch) if spec is not None else None
    found = _distribution(actor)
    if found is None:
        return side
    dist, kw = found
    name = getattr(dist, "__name__", "")
    n = side.n if side is not None else None
    if name == "TanhNormal":
        low = torch.as_tensor(kw.get("low", -1.0)).float()
        high = torch.as_tensor(kw.get("high", 1.0)).float()
        text = f"TanhNormal actions in [{_fmt(low)}, {_fmt(high)}]"
        return _Side("continuous", n, low, high, text=text)
    if name in _INDEX_DISTS and (side is None or side.kind != "index"):
        count = f" among {n}" if n is not None else ""
        return _Side("index", n, text=f"index actions (a {name} distribution){count}")
    if name in _ONE_HOT_DISTS and (side is None or side.kind != "one-hot"):
        return _Side("one-hot", n, text=f"one-hot actions (a {name} distribution)")
    return side


def check_actor_spec(
    actor: nn.Module,
    action_spec: TensorSpec,
    *,
    batch_shape: tuple[int, ...] = (),
    action_key: NestedKey = keys.ACTION,
) -> None:
    """Compare the action spec attached to ``actor`` with ``action_spec`` (an unbatched
    leaf spec or a Composite holding ``action_key``), without calling the actor.

    Raises :class:`ActionSpecMismatchError` on a different encoding, action count,
    dimension or bounds. An actor without an attached spec passes (see
    :func:`check_env_compat`, which also probes the actor). ``batch_shape``: the env batch
    shape a leaf ``action_spec`` carries (a Composite supplies its own).
    """
    env_leaf = _leaf(action_spec, action_key)
    batch = tuple(action_spec.shape) if isinstance(action_spec, Composite) else tuple(batch_shape)
    actor_side = _static_side(actor, action_key, batch)
    if env_leaf is None or actor_side is None:
        return
    _compare(_who(actor), actor_side, _describe_spec(env_leaf, batch))


def _who(actor: Any) -> str:
    return f"the actor ({type(actor).__name__})"


def _probe(
    actor: nn.Module, env: Any, action_key: NestedKey, device: torch.device | str | None = None
) -> tuple[Any, TensorDictBase] | None:
    """Call the actor once on a zero observation of the env's batch shape; ``None`` when the
    actor needs keys the observation spec does not hold (recurrent state, ...)."""
    in_keys = getattr(actor, "in_keys", None)
    if in_keys is None or not isinstance(actor, TensorDictModuleBase | nn.Module):
        return None
    td = env.observation_spec.zero()
    with contextlib.suppress(AttributeError, RuntimeError, KeyError):
        td.update(env.full_done_spec.zero())
    present = td.keys(True, True)
    if any(k not in present for k in in_keys):
        return None
    # the env steps on the CPU; the collector moves observations to the actor's device
    device = _device_of(actor) if device is None else torch.device(device)
    if device is not None and device.type != "cpu":
        td = td.to(device)
    # a policy with random streams of its own (a population's) keeps them too
    streams = getattr(actor, "fork_streams", contextlib.nullcontext)
    cuda = [device] if device is not None and device.type == "cuda" else []
    with streams(), torch.random.fork_rng(devices=cuda), torch.no_grad():
        out = actor(td.select(*in_keys))
    if not isinstance(out, TensorDictBase) or out.get(action_key, None) is None:
        return None
    if device is not None and device.type != "cpu":
        out = out.to("cpu")  # compared with the env's (CPU) spec
    return out.get(action_key), out


def _device_of(module: Any) -> torch.device | None:
    """The device of ``module``'s first parameter or buffer, ``None`` when it has none."""
    if not isinstance(module, nn.Module):
        return None
    for tensor in itertools.chain(module.parameters(), module.buffers()):
        return tensor.device
    return None


def _check_structured(who: str, action: Any, spec: TensorSpec, env: _Side) -> None:
    """A structured action as written: the env's parts, each of the spec's shape."""
    if isinstance(spec, Composite):
        names = sorted(spec.keys())
        got = sorted(action.keys()) if isinstance(action, TensorDictBase) else None
        fits = got == names and all(
            tuple(action.get(k).shape) == tuple(spec[k].shape) for k in names
        )
        wrote = f"a TensorDict of {got}" if got is not None else f"a tensor {list(action.shape)}"
    else:
        fits = isinstance(action, torch.Tensor) and tuple(action.shape) == tuple(spec.shape)
        wrote = (
            f"actions of shape {list(action.shape)}"
            if isinstance(action, torch.Tensor)
            else "a TensorDict"
        )
    if not fits:
        raise ActionSpecMismatchError(
            f"{who} writes {wrote} but the env's action spec is {env.text} (shape "
            f"{list(spec.shape)}): the env would misread every action. Fix: build the actor "
            "from the env's specs, rlkit.modules.make_actor(env)."
        )


def attach_collector_check(actor: nn.Module) -> nn.Module:
    """Give ``actor`` the ``register_collector`` hook TorchRL's ``Collector`` calls with
    itself at construction (``policy.register_collector(collector)``, torchrl 0.14.1): the
    actor is then checked against the collector's env (:func:`check_env_compat`), so an
    index-action actor under TorchRL's own ``Collector`` on a one-hot env raises
    :class:`ActionSpecMismatchError` naming both encodings instead of running with every
    action read as 0 (issue 47). rlkit's builders attach it to every actor they return."""
    actor.register_collector = functools.partial(_check_registered, actor)
    return actor


def _check_registered(actor: nn.Module, collector: Any) -> None:
    env = getattr(collector, "env", None)
    if env is not None:
        check_env_compat(actor, env)


def check_env_compat(
    actor: nn.Module,
    env: Any,
    *,
    action_key: NestedKey = keys.ACTION,
    device: torch.device | str | None = None,
) -> None:
    """Raise :class:`ActionSpecMismatchError` if ``actor``'s actions do not fit ``env``.

    Compares the actor's attached spec and distribution with ``env.action_spec``, then calls
    the actor once on a zero observation (no grad; the global random state is restored) and
    checks what it wrote. The error names both sides and the fix.

    Args:
        actor: a TensorDict module writing ``action_key`` (a TorchRL ``ProbabilisticActor``,
            an rlkit actor, an exploration wrapper around one).
        env: a TorchRL env (``GymEnv``, ``make_env``'s, a ``TransformedEnv``, ...).
        action_key: the action's key (default ``keys.ACTION``).
        device: where the actor runs (a collector's ``device``); ``None``: the device of its
            first parameter (the CPU when it has none). The zero observation goes there.

    Example:
        >>> from torchrl.envs import GymEnv
        >>> from rlkit.modules import categorical_actor, make_actor
        >>> env = GymEnv("CartPole-v1")          # one-hot actions by default
        >>> check_env_compat(make_actor(env.observation_spec, env.action_spec), env)
        >>> try:
        ...     check_env_compat(categorical_actor(4, 2), env)
        ... except ActionSpecMismatchError as err:
        ...     print(str(err)[:76])
        the actor (ProbabilisticActor) writes index actions (int64, shape [*]) among
    """
    env_leaf = _leaf(env.full_action_spec, action_key)
    if env_leaf is None:
        names = list(env.full_action_spec.keys(True, True))
        raise ActionSpecMismatchError(
            f"the env has no action {keys.describe(action_key)} (its actions: {names}): pass "
            "check_env_compat(..., action_key=...)"
        )
    batch = tuple(env.batch_size)
    env_side = _describe_spec(env_leaf, batch)
    who = _who(actor)
    static = _static_side(actor, action_key, batch)
    if static is not None:
        _compare(who, static, env_side)
    probed = _probe(actor, env, action_key, device)
    if probed is not None and env_side.kind == "structured":
        _check_structured(who, probed[0], env_leaf, env_side)
    elif probed is not None:
        action, out = probed
        side = _probe_side(action, out, batch)
        if static is not None and static.kind == side.kind:
            side.low, side.high = static.low, static.high
        _compare(who, side, env_side)
