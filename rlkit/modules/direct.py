"""Direct calls into the TensorDict modules rlkit builds: the same tensors, fewer dispatch layers.

A loss calls its actor and critic once per minibatch. Through TensorDict dispatch,
``ProbabilisticActor.get_dist`` on a 256-row CartPole minibatch costs 0.13 ms here, of which
the 64x64 network is 0.055 ms; the critic's ``ValueOperator`` call costs 0.071 ms around a
0.05 ms network (torch 2.14, tensordict 0.14.3, one thread). Most of the rest is generic
work the call repeats every time: key unravelling, interaction-type and skip-existing
context managers, ``Module.modules()`` walks to find the distribution module, and writing
outputs into a TensorDict the loss then reads back.

:func:`actor_dist` and :func:`module_output` recognise the plain structures (a
``ProbabilisticActor`` of one ``TensorDictModule`` and one probabilistic module; a
``TensorDictModule`` / ``ValueOperator`` around an ``nn.Module``), read their wiring once, and
then call the wrapped network on the input tensors and build the distribution from its
outputs: the same operations in the same order, so results are bit-identical to the
TensorDict path (``tests/test_direct.py`` checks this, values and gradients). Anything else
(subclasses, hooks on the wrappers, nested or renamed keys, ``skip_existing``) takes the
module's own path, unchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from tensordict import NestedKey, TensorDictBase
from tensordict.nn import (
    CompositeDistribution,
    InteractionType,
    ProbabilisticTensorDictModule,
    TensorDictModule,
    skip_existing,
)
from tensordict.nn.probabilistic import interaction_type
from torch import Tensor, nn
from torch.distributions import Distribution
from torch.nn.modules import module as _torch_module
from torchrl.modules import ProbabilisticActor, SafeProbabilisticModule, ValueOperator
from torchrl.modules.distributions.utils import sample_and_log_prob

__all__ = ["actor_dist", "actor_sample", "disabled", "module_output", "sampled_keys"]

_ENABLED = True


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Inside the block every call takes the module's own TensorDict path: the plain
    reference the direct path is tested against."""
    global _ENABLED
    previous, _ENABLED = _ENABLED, False
    try:
        yield
    finally:
        _ENABLED = previous


_WRAPPER_TYPES = (TensorDictModule, ValueOperator)
_PROB_TYPES = (ProbabilisticTensorDictModule, SafeProbabilisticModule)

#: the attributes a module keeps its plan under (None when it takes its own path). On the
#: module rather than in a global WeakKeyDictionary: torch.compile guards a global dict's
#: lookup by the key's position in it, and entries leaving the dict (collected modules)
#: shifted those positions, so a later call failed while building guards ("IndexError: list
#: index out of range" from torch/_guards.py, seen with --compile in a process that had built
#: and dropped other learners)
_ACTOR_PLAN = "_rlkit_actor_plan"
_MODULE_PLAN = "_rlkit_module_plan"
_UNSET = object()


def cached_plan(module: nn.Module, attr: str = _ACTOR_PLAN) -> Any:
    """The plan ``module`` keeps under ``attr`` (None: its own path), or ``_UNSET``."""
    return module.__dict__.get(attr, _UNSET)


def _no_hooks(*modules: nn.Module) -> bool:
    """True when neither the wrappers nor the global registry add forward hooks: calling the
    inner network directly then skips nothing the wrappers' ``__call__`` would run."""
    if (
        _torch_module._global_forward_hooks
        or _torch_module._global_forward_pre_hooks
        or _torch_module._global_backward_hooks
        or _torch_module._global_backward_pre_hooks
    ):
        return False
    return not any(
        m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks
        for m in modules
    )


def _plain_keys(keys: Any) -> bool:
    return all(isinstance(k, str) for k in keys)


class _ModulePlan:
    """A ``TensorDictModule`` whose network maps input tensors to output tensors."""

    __slots__ = ("net", "in_keys", "out_keys", "wrappers")

    def __init__(self, wrapper: TensorDictModule) -> None:
        self.net: nn.Module = wrapper.module
        self.in_keys: tuple[str, ...] = tuple(wrapper.in_keys)
        self.out_keys: tuple[str, ...] = tuple(wrapper.out_keys)
        self.wrappers: tuple[nn.Module, ...] = (wrapper,)

    def current(self) -> bool:
        """The wrapper still holds the network and keys the plan was read from."""
        w = self.wrappers[0]
        return (
            w.module is self.net
            and tuple(w.in_keys) == self.in_keys
            and tuple(w.out_keys) == self.out_keys
        )

    def outputs(
        self, td: TensorDictBase, overrides: Mapping[str, Tensor] | None = None
    ) -> dict[str, Tensor]:
        if overrides:
            inputs = [overrides[k] if k in overrides else td.get(k, None) for k in self.in_keys]
        else:
            inputs = [td.get(k, None) for k in self.in_keys]
        if any(x is None for x in inputs):  # the module's own path names the missing key
            raise PlanMismatch
        out = self.net(*inputs)
        if isinstance(out, Tensor):
            out = (out,)
        if not isinstance(out, tuple) or len(out) != len(self.out_keys):
            raise PlanMismatch  # dict outputs, wrong counts: the module's own path
        return dict(zip(self.out_keys, out))


class _ActorPlan:
    """A ``ProbabilisticActor`` = [``TensorDictModule`` (parameters), probabilistic module]."""

    __slots__ = (
        "params",
        "dist_class",
        "dist_kwargs",
        "dist_keys",
        "param_keys",
        "wrappers",
        "sample_keys",
    )

    def __init__(self, actor: ProbabilisticActor, params: _ModulePlan, prob) -> None:
        self.params = params
        self.dist_class = prob.distribution_class
        self.dist_kwargs = dict(prob.distribution_kwargs)
        self.dist_keys = tuple(k[-1] if isinstance(k, tuple) else k for k in prob.dist_keys)
        self.param_keys = tuple(prob.in_keys)
        self.wrappers = (actor, actor.module, params.wrappers[0], prob)
        #: the keys a RANDOM forward writes, in the actor's order, or None when the forward
        #: does more than sample and score once (no log-prob, several samples, a generator)
        self.sample_keys: tuple[str, ...] | None = None
        written = [*params.out_keys, *prob.dist_sample_keys, prob.log_prob_key]
        if (
            type(prob) is SafeProbabilisticModule
            and prob.return_log_prob
            and prob.num_samples is None
            and not getattr(prob, "cache_dist", False)
            and getattr(prob, "_generator", None) is None
            and getattr(prob, "_generator_key", None) is None
            and len(prob.dist_sample_keys) == 1
            and _plain_keys(written)
            and len(set(written)) == len(written)
        ):
            self.sample_keys = tuple(written)

    def current(self) -> bool:
        """The actor still holds the same two parts, with the wiring the plan read."""
        actor, _, wrapper, prob = self.wrappers
        parts = list(actor.module)
        return (
            len(parts) == 2
            and parts[0] is wrapper
            and parts[1] is prob
            and self.params.current()
            and tuple(prob.in_keys) == self.param_keys
        )

    def dist(self, td: TensorDictBase) -> Distribution:
        return self.dist_from(self.params.outputs(td))

    def dist_from(self, out: Mapping[str, Tensor]) -> Distribution:
        """The distribution of the network outputs ``out`` (by the wrapper's out_keys)."""
        kwargs = {d: out[k] for d, k in zip(self.dist_keys, self.param_keys)}
        return self.dist_class(**kwargs, **self.dist_kwargs)


class PlanMismatch(Exception):
    """An input is missing or the network's outputs do not map one-to-one onto the wrapper's
    out_keys: the module's own path handles (or reports) it."""


def _module_plan(module: nn.Module) -> _ModulePlan | None:
    if type(module) not in _WRAPPER_TYPES:
        return None
    if not (_plain_keys(module.in_keys) and _plain_keys(module.out_keys)):
        return None
    if (
        getattr(module, "_kwargs", None) is not None
        or getattr(module, "method", None) is not None
        or getattr(module, "method_kwargs", None)
        or getattr(module, "_get_kwargs", None)
    ):
        return None
    if not isinstance(module.module, nn.Module):
        return None
    return _ModulePlan(module)


def _actor_plan(actor: nn.Module) -> _ActorPlan | None:
    if type(actor) is not ProbabilisticActor:
        return None
    parts = list(actor.module)
    if len(parts) != 2:
        return None
    wrapper, prob = parts
    params = _module_plan(wrapper)
    if params is None or type(prob) not in _PROB_TYPES:
        return None
    if not _plain_keys(prob.in_keys) or not set(prob.in_keys) <= set(params.out_keys):
        return None
    return _ActorPlan(actor, params, prob)


def _direct_allowed() -> bool:
    return _ENABLED and not skip_existing()


def actor_dist(actor: nn.Module, td: TensorDictBase) -> Distribution:
    """``actor.get_dist(td.select(*actor.in_keys))``, bit for bit, without the TensorDict
    dispatch for a plain ``ProbabilisticActor`` (see the module docstring)."""
    plan = _plan_for(actor)
    if plan is not None and _no_hooks(*plan.wrappers) and _direct_allowed():
        try:
            return plan.dist(td)
        except PlanMismatch:
            pass
    return actor.get_dist(td.select(*actor.in_keys))


def _plan_for(actor: nn.Module) -> _ActorPlan | None:
    plan = getattr(actor, _ACTOR_PLAN, _UNSET)
    if plan is _UNSET or (plan is not None and not plan.current()):
        plan = _actor_plan(actor)
        actor.__dict__[_ACTOR_PLAN] = plan
    return plan


def sampled_keys(actor: nn.Module) -> tuple[str, ...] | None:
    """The keys :func:`actor_sample` returns for ``actor``, or None if it never takes it."""
    plan = _plan_for(actor)
    return None if plan is None else plan.sample_keys


def sampling_plan(actor: nn.Module) -> _ActorPlan | None:
    """The plan :func:`actor_sample` would follow for ``actor`` right now (RANDOM
    interaction, no hooks, direct calls allowed), or None when the actor must run itself."""
    plan = _plan_for(actor)
    if plan is None or plan.sample_keys is None:
        return None
    prob = plan.wrappers[3]
    mode = interaction_type() or prob.default_interaction_type
    if mode is not InteractionType.RANDOM or not (_no_hooks(*plan.wrappers) and _direct_allowed()):
        return None
    return plan


def actor_sample(actor: nn.Module, td: TensorDictBase) -> dict[str, Tensor] | None:
    """What ``actor(td)`` writes under RANDOM interaction (distribution parameters, action,
    log-probability), as a dict, for a plain ``ProbabilisticActor`` whose probabilistic module
    samples once and scores the draw: the same calls in the same order, so the same random
    numbers are drawn. ``None`` when the actor must run itself (any other case)."""
    plan = sampling_plan(actor)
    if plan is None:
        return None
    try:
        out = plan.params.outputs(td)
    except PlanMismatch:
        return None
    dist = plan.dist_from(out)
    if isinstance(dist, CompositeDistribution):
        return None
    sample, log_prob = sample_and_log_prob(dist, torch.Size(), reparameterize=dist.has_rsample)
    keys_ = plan.sample_keys
    out[keys_[-2]] = sample
    out[keys_[-1]] = log_prob
    return out


def module_output(
    module: nn.Module,
    td: TensorDictBase,
    key: NestedKey,
    overrides: Mapping[NestedKey, Tensor] | None = None,
    *,
    call: nn.Module | None = None,
) -> Tensor:
    """``module(td.select(*module.in_keys)).get(key)`` with ``overrides`` replacing some
    inputs, bit for bit, without writing into ``td``; a plain ``TensorDictModule`` /
    ``ValueOperator`` has its wrapped network called directly. ``call`` (default ``module``)
    is what runs on the other path (a wrapper around ``module``, e.g. a target network)."""
    plan = getattr(module, _MODULE_PLAN, _UNSET)
    if plan is _UNSET or (plan is not None and not plan.current()):
        plan = _module_plan(module)
        module.__dict__[_MODULE_PLAN] = plan
    if (
        plan is not None
        and key in plan.out_keys
        and _no_hooks(*plan.wrappers)
        and _direct_allowed()
    ):
        try:
            return plan.outputs(td, overrides)[key]
        except PlanMismatch:
            pass
    overrides = overrides or {}
    source = td.select(*(k for k in module.in_keys if k not in overrides))
    for name, value in overrides.items():
        source.set(name, value)
    return (call or module)(source).get(key)
