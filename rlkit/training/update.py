r"""The one update loop: loss groups, epochs, minibatches, every ``loss_*`` term optimised.

Every learner in rlkit updates its networks through :func:`update_loop`. A learner describes
its update as :class:`LossGroup` s (an optimiser, the loss whose ``loss_*`` terms it sums, its
epoch count and gradient clipping); the loop does the rest::

    for epoch in range(max(group.epochs)):
        for minibatch in minibatches(data):
            out = loss(minibatch)                         # once per distinct loss module
            for group still within its epochs:
                sum(group's loss_* terms).backward(inputs=group's parameters)
                all-reduce, (transform), clip, finiteness check, step the group's optimiser

Groups in one call run in lockstep over the same minibatches; a group past its own epoch count
is idle (its optimiser does not step, so its parameters stay bit-identical). A group with a
``target_kl`` stops for the rest of the call at the first minibatch whose ``approx_kl``
exceeds ``1.5 * target_kl``, without stepping on it (Stable-Baselines3's ``target_kl``).
Groups that should run one after the other (DAAC: the policy's epochs, then the value's) are
two calls.

Contracts, each an error rather than a silent wrong answer:

* every ``loss_*`` term a loss returns is claimed by exactly one group (``terms=None`` claims
  every term no other group of the same loss names); a term nobody claims, or a claimed term
  the loss does not return, raises :class:`LossContractError`;
* on the first step of each group, a claimed term that requires a gradient must reach at least
  one of the group's parameters (a term that would train nothing raises);
* the minibatch holds exactly the keys a loss declares in ``in_keys``: a declared key missing
  from the batch raises :class:`~rlkit.objectives.common.MissingKeyError` naming it and the
  loss, and so does a key the loss reads without declaring it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import tensordict
import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

from rlkit import keys
from rlkit.objectives.common import APPROX_KL, MissingKeyError, is_compiled
from rlkit.training.errors import NonFiniteError

__all__ = [
    "LossContractError",
    "LossGroup",
    "MeanMetrics",
    "compile_loss",
    "select_inputs",
    "update_loop",
]


class LossContractError(ValueError):
    """A loss and the groups that optimise it disagree (a term dropped, unknown or inert)."""


@dataclass(eq=False)
class LossGroup:
    """One optimiser's share of an update.

    Args:
        name: the group's name (``"policy"``, ``"value"``, ``"aux"``, ``"predictor"``, ...),
            used in errors.
        loss: a module whose ``forward(td)`` returns ``loss_*`` terms (already weighted) and
            detached diagnostics.
        optimizer: steps this group's parameters (and only this group's gradients reach them).
        epochs: passes over the data this group trains for.
        max_grad_norm: clip this group's gradient to this norm (``None`` or 0: off).
        terms: the ``loss_*`` names this group sums; ``None``: every term of ``loss`` that no
            other group of the same loss names.
        scale: multiplies the summed terms (SVPG's particle count).
        transform_grads: called after the all-reduce and before clipping (SVPG's Stein step).
        grad_name: the metric under which the gradient norm before clipping is logged.
        target_kl: stop this group's epochs at the first minibatch whose ``approx_kl`` (the
            loss's, computed before the step) exceeds ``1.5 * target_kl``, and skip that
            minibatch's step (Stable-Baselines3's ``target_kl``); the gradient steps taken
            are logged as ``grad_name`` with ``grad_norm`` replaced by ``grad_steps``.
            ``None``: every epoch runs.
    """

    name: str
    loss: nn.Module
    optimizer: torch.optim.Optimizer
    epochs: int = 1
    max_grad_norm: float | None = None
    terms: tuple[str, ...] | None = None
    scale: float = 1.0
    transform_grads: Callable[[], None] | None = None
    grad_name: str = "grad_norm"
    target_kl: float | None = None
    _checked: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.epochs, bool) or not isinstance(self.epochs, int) or self.epochs < 0:
            raise ValueError(f"loss group {self.name!r}: epochs must be an int >= 0")
        if self.target_kl is not None and not self.target_kl > 0:
            raise ValueError(f"loss group {self.name!r}: target_kl must be > 0 or None")
        if self.terms is not None:
            self.terms = tuple(self.terms)
            bad = [t for t in self.terms if not t.startswith("loss_")]
            if bad:
                raise ValueError(f"loss group {self.name!r}: terms must be loss_* names, got {bad}")

    @property
    def parameters(self) -> list[torch.Tensor]:
        return [p for g in self.optimizer.param_groups for p in g["params"] if p.requires_grad]

    @property
    def _params(self) -> list[torch.Tensor]:
        """:attr:`parameters`, computed once per update loop (the hot path reads it)."""
        cached = self.__dict__.get("_param_cache")
        if cached is None:
            cached = self.__dict__["_param_cache"] = self.parameters
        return cached


class MeanMetrics:
    """Averages detached scalar diagnostics without a device sync per step; names ending in
    ``_max`` keep their maximum instead.

    Values are kept as they come (python floats and detached tensors) and reduced once in
    :meth:`result`: one stack per name per update instead of a tensor add per name per step.
    """

    def __init__(self) -> None:
        self.values: dict[str, list] = {}

    def add(self, values: Mapping[str, torch.Tensor | float]) -> None:
        for k, v in values.items():
            v = v.detach() if isinstance(v, torch.Tensor) else float(v)
            seen = self.values.get(k)
            if seen is None:
                self.values[k] = [v]
            else:
                seen.append(v)

    def discard(self, names: Iterable[str]) -> None:
        """Forget what was added under ``names`` (a new epoch's diagnostics replace them)."""
        for name in names:
            self.values.pop(name, None)

    def result(self) -> dict[str, float]:
        out: dict[str, float] = {}
        tensors: list[torch.Tensor] = []
        names: list[str] = []
        for k, vs in self.values.items():
            if all(isinstance(v, float) for v in vs):
                out[k] = max(vs) if k.endswith("_max") else sum(vs) / len(vs)
                continue
            values = [torch.as_tensor(v).float().reshape(()) for v in vs]
            if len(values) == 1:
                # the mean (and max) of one value is that value, bit for bit: an off-policy
                # learner's one gradient step per batch skips a stack and a reduction per name
                tensors.append(values[0])
            else:
                stacked = torch.stack(values)
                tensors.append(stacked.max() if k.endswith("_max") else stacked.mean())
            names.append(k)
        if tensors:  # one host transfer for every tensor-valued name
            out.update(zip(names, torch.stack(tensors).tolist()))
        return {k: out[k] for k in self.values}


# --------------------------------------------------------------------------- key contract
def select_inputs(data: TensorDictBase, losses: Iterable[nn.Module]) -> TensorDictBase:
    """``data`` restricted to the keys the ``losses`` declare in ``in_keys``.

    Raises :class:`MissingKeyError` naming the first declared key the batch lacks and the
    loss that declares it.
    """
    wanted: list = []
    for loss in losses:
        for key in loss.in_keys:
            if key not in wanted:
                wanted.append(key)
    try:
        return data.select(*wanted)  # strict: a missing key raises
    except KeyError:
        pass
    present = set(data.keys(include_nested=True))
    for loss in losses:
        for key in loss.in_keys:
            if key not in present:
                raise MissingKeyError(
                    f"the batch holds {keys.describe_present(present)}\n"
                    f"{type(loss).__name__} declares {keys.describe(key)} in its in_keys but "
                    "the batch has no such key: run the component that writes it first, or "
                    "rename it with loss.set_keys(...)"
                )
    return data.select(*wanted)


def _missing_leaf(err: KeyError) -> str:
    message = str(err.args[0]) if err.args else str(err)
    return message.split('"')[1] if message.count('"') >= 2 else message


def _undeclared_key_error(
    loss: nn.Module, err: KeyError, part: TensorDictBase, full: TensorDictBase
) -> Exception:
    """A loss read a key outside its ``in_keys``: find which one and name it.

    tensordict names only the missing level (``"next"`` for ``("next", "reward")``), so when
    that level is a prefix of keys the batch holds, the loss is re-run (without gradients) on
    the minibatch with an empty TensorDict there, which makes it fail one level deeper.
    """
    declared = list(loss.in_keys)
    held = [k for k in full.keys(include_nested=True, leaves_only=True) if k not in declared]
    probe, prefix, leaf = part.copy(), (), _missing_leaf(err)
    for _ in range(4):
        below = [
            k for k in held if isinstance(k, tuple) and k[: len(prefix) + 1] == (*prefix, leaf)
        ]
        if not below or any(k == (*prefix, leaf) for k in held):
            break
        prefix = (*prefix, leaf)
        probe.set(prefix, TensorDict({}, batch_size=probe.batch_size))
        try:
            with torch.no_grad():
                loss(probe)
            break
        except KeyError as deeper:
            leaf = _missing_leaf(deeper)
    if prefix:
        name = keys.describe((*prefix, leaf))
    else:
        same = [k for k in held if (k[-1] if isinstance(k, tuple) else k) == leaf]
        if len(same) == 1:
            name = keys.describe(same[0])
        elif same:
            name = f"{leaf!r} (one of {', '.join(keys.describe(k) for k in same)})"
        else:
            name = repr(leaf)
    return MissingKeyError(
        f"{type(loss).__name__} reads {name}, which is not among its in_keys "
        f"{declared}: the update loop passes a loss only the keys it declares. "
        "Add the key to the loss's in_keys (or its _required_keys)."
    )


def _call_loss(
    loss: nn.Module, minibatch: TensorDictBase, full: TensorDictBase | None, *, strict: bool
):
    """``loss(minibatch)``; with ``strict``, under strict ``TensorDict.get``, so that reading an
    undeclared key raises. Strict reads make the misses TorchRL modules expect internally raise
    and catch (about 1 ms of a 33 ms PPO update measured here), so the loop checks a loss on
    its first use (as it checks its terms) and runs it as it is afterwards."""
    if not strict:
        if loss.__dict__.get("_grad_terms") is not None:
            return _first_compiled_call(loss, minibatch)
        if is_compiled(loss):  # a recompile (the diagnostics switch) may fail as the first did
            try:
                return loss(minibatch)
            except Exception as err:  # noqa: BLE001 (see _first_compiled_call)
                return _back_to_eager(loss, minibatch, _compile_failure(err))
        return loss(minibatch)
    previous = tensordict.get_defaults_to_none()
    tensordict.set_get_defaults_to_none(False)
    try:
        if not is_compiled(loss):
            return loss(minibatch)
        # a compiled loss runs its checked first call eagerly: a graph traced under strict
        # reads would be used once and recompiled after
        with torch.compiler.set_stance("force_eager"):
            out = loss(minibatch)
        loss.__dict__["_grad_terms"] = _grad_terms(out)
        return out
    except KeyError as err:
        if isinstance(err, MissingKeyError) or full is None:
            raise
        raise _undeclared_key_error(loss, err, minibatch, full) from err
    finally:
        tensordict.set_get_defaults_to_none(previous)


def _grad_terms(out: Any) -> frozenset:
    return frozenset(
        k for k, v in _entries(out).items() if isinstance(k, str) and k.startswith("loss_")
        and isinstance(v, torch.Tensor) and v.requires_grad
    )  # fmt: skip


def _first_compiled_call(loss: nn.Module, minibatch: TensorDictBase):
    """The first compiled call of ``loss``: its ``loss_*`` terms must carry a gradient exactly
    where the eager (checked) call's did. One that lost it would silently train nothing (an
    output aliasing another, detached one did so under torch 2.14's inductor), so the loss
    goes back to eager with a warning instead."""
    eager_terms = loss.__dict__.pop("_grad_terms")
    try:
        out = loss(minibatch)
    except Exception as err:  # noqa: BLE001 (a failure inside torch.compile itself)
        # the same loss already ran eagerly on its checked first call, so this is the
        # compiler's: seen with torch 2.14, an IndexError while dynamo built the guards of
        # SVPG's loss after other losses had compiled in the same process; an error of the
        # loss itself raises again from the eager call below
        return _back_to_eager(loss, minibatch, _compile_failure(err))
    lost = sorted(eager_terms - _grad_terms(out))
    if not lost:
        return out
    return _back_to_eager(
        loss, minibatch, f"returned {lost} without a gradient, which its eager forward has"
    )


def _compile_failure(err: Exception) -> str:
    first = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return f"failed to compile ({type(err).__name__}: {first})"


def _back_to_eager(loss: nn.Module, minibatch: TensorDictBase, why: str):
    """Run ``loss`` eagerly from now on (``compile_loss`` leaves it so), with a warning."""
    loss._compiled_call_impl = None
    loss.__dict__["_compile_refused"] = True
    warnings.warn(
        f"--compile: compiled {type(loss).__name__} {why}; it runs eagerly from here on (the "
        "other losses stay compiled)",
        RuntimeWarning,
        stacklevel=3,
    )
    return loss(minibatch)


def compile_loss(loss: nn.Module) -> nn.Module:
    """Compile ``loss`` in place with ``torch.compile`` (``--compile``); returns it.

    The forward and, through AOTAutograd, its backward run as compiled graphs; the loss stays
    the same module (its keys, hyperparameters and ``diagnostics`` switch are read as before).
    A hyperparameter that a schedule changes becomes a 0-dim tensor on its first change (see
    :class:`rlkit.objectives.common.Hyperparameter`), so an annealed clip range or entropy
    coefficient does not recompile; the ``diagnostics`` switch gives a second graph.
    Compiling again is a no-op, and so is compiling a loss that went back to eager.

    Process-wide settings, made on the first call: dynamo's ``recompile_limit`` is raised to
    64 and inductor's ``fallback_random`` is set (random draws in every compiled function come
    from torch's generator).
    """
    if not is_compiled(loss) and not loss.__dict__.get("_compile_refused"):
        # every TorchRL loss's forward runs through one wrapper function, whose compiled
        # graphs dynamo caches together (8 by default): PPG's two losses, an intrinsic
        # bonus and the diagnostics switch need more before a graph would fall back to eager
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        # random draws inside a loss (SAC's reparameterised actions) from torch's generator,
        # as eagerly, instead of inductor's own: the same samples for the same seed
        import torch._inductor.config as inductor_config

        inductor_config.fallback_random = True
        loss.compile()
    return loss


# --------------------------------------------------------------------------- term contract
def _claims(groups: Sequence[LossGroup]) -> dict[int, tuple[LossGroup, frozenset[str] | None]]:
    """Per group: the explicit terms it claims, or None for 'the rest of its loss's terms'."""
    by_loss: dict[int, list[LossGroup]] = {}
    for g in groups:
        by_loss.setdefault(id(g.loss), []).append(g)
    for members in by_loss.values():
        rest = [g for g in members if g.terms is None]
        if len(rest) > 1:
            names = ", ".join(repr(g.name) for g in rest)
            raise LossContractError(
                f"loss groups {names} share {type(members[0].loss).__name__} and both claim "
                "its remaining loss_* terms: give all but one of them explicit terms=(...)"
            )
        seen: dict[str, str] = {}
        for g in members:
            for t in g.terms or ():
                if t in seen:
                    raise LossContractError(
                        f"loss term {t!r} is claimed by groups {seen[t]!r} and {g.name!r}: "
                        "each term is optimised by exactly one group"
                    )
                seen[t] = g.name
    return {id(g): (g, frozenset(g.terms) if g.terms is not None else None) for g in groups}


def _group_terms(group: LossGroup, out: dict, groups: Sequence[LossGroup]) -> list[str]:
    """The ``loss_*`` names of ``out`` this group optimises (checked against the claims, once
    per set of returned names within an update loop call)."""
    names = tuple(out)
    cache = group.__dict__.setdefault("_terms_cache", {})
    if names not in cache:
        cache[names] = _check_terms(group, names, groups)
    return cache[names]


def _check_terms(group: LossGroup, names: tuple, groups: Sequence[LossGroup]) -> list[str]:
    returned = [k for k in names if isinstance(k, str) and k.startswith("loss_")]
    siblings = [g for g in groups if g.loss is group.loss]
    explicit = {t for g in siblings if g.terms is not None for t in g.terms}
    missing = sorted(explicit - set(returned))
    if missing:
        raise LossContractError(
            f"loss groups optimise {missing}, which {type(group.loss).__name__} does not "
            f"return (it returns {returned}): fix the group's terms=(...)"
        )
    if not any(g.terms is None for g in siblings):
        unclaimed = sorted(set(returned) - explicit)
        if unclaimed:
            raise LossContractError(
                f"{type(group.loss).__name__} returns {unclaimed}, which no loss group "
                f"optimises (groups: {[g.name for g in siblings]}): a loss_* term is optimised "
                "or refused, never dropped; add it to a group's terms=(...) or rename it "
                "without the loss_ prefix if it is a diagnostic"
            )
    if group.terms is not None:
        return list(group.terms)
    return [t for t in returned if t not in explicit]


def _check_reaches(group: LossGroup, out: dict, names: Sequence[str]) -> None:
    """First step of a group: each claimed term reaches the group's parameters. A term
    without a graph (a constant, or one computed under ``no_grad`` or from detached tensors)
    reaches none of them by construction, so it is refused as well, unless it is exactly 0:
    the kit's losses return a term whose coefficient is 0 (``--entropy-coef 0``) as a constant
    0, so that its column is logged in every run."""
    params = group.parameters
    for name in names:
        term = out[name]
        if not (isinstance(term, torch.Tensor) and term.requires_grad):
            if isinstance(term, torch.Tensor) and not bool(torch.isfinite(term).all()):
                continue  # the finiteness check of the step stops the run (exit 3), naming it
            if isinstance(term, torch.Tensor) and not bool(term.detach().ne(0).any()):
                continue  # exactly 0: a term switched off by its coefficient, logged as such
            raise LossContractError(
                f"loss term {name!r} of {type(group.loss).__name__} has no gradient (a "
                "constant, or computed from detached tensors), so it reaches none of loss "
                f"group {group.name!r}'s parameters and optimising it would change nothing: "
                "compute it from the networks' outputs, or rename it without the loss_ prefix "
                "if it is a diagnostic"
            )
        grads = torch.autograd.grad(term, params, retain_graph=True, allow_unused=True)
        if all(g is None for g in grads):
            raise LossContractError(
                f"loss term {name!r} of {type(group.loss).__name__} reaches none of loss group "
                f"{group.name!r}'s parameters, so optimising it would change nothing: give it "
                "to the group whose networks it depends on (terms=(...))"
            )
    group._checked = True


# --------------------------------------------------------------------------- the loop
def _full_batch(data: TensorDictBase, generator: torch.Generator) -> Iterable[TensorDictBase]:
    del generator
    return (data,)


def update_loop(
    groups: Sequence[LossGroup],
    data: TensorDictBase,
    ctx: Any,
    *,
    minibatches: Callable[[TensorDictBase, torch.Generator], Iterable[TensorDictBase]]
    | None = None,
    grad_accum: int = 1,
    source: TensorDictBase | None = None,
) -> dict[str, float]:
    """Train ``groups`` on ``data`` (see the module docstring). Returns averaged metrics.

    Args:
        groups: the loss groups, run in lockstep.
        data: the batch, already holding what the losses read (advantages, targets).
        ctx: the engine's :class:`~rlkit.training.engine.Context` (ranks, RNG, optimiser step).
        minibatches: ``(data, generator) -> iterable of minibatches`` for one epoch; default:
            the whole of ``data`` once per epoch.
        grad_accum: split each minibatch into this many chunks, back-propagated one at a time
            (each weighted by its share of the rows) before one optimiser step.
        source: the batch ``data`` was selected from, to name a key a loss reads without
            declaring it (default: ``data``).
    """
    if not groups:
        raise ValueError("update_loop needs at least one loss group")
    _validate(groups)
    losses = list({id(g.loss): g.loss for g in groups}.values())
    if getattr(ctx, "compile", False):
        for loss in losses:
            compile_loss(loss)
    inputs = select_inputs(data, losses)
    source = data if source is None else source
    minibatches = minibatches or _full_batch
    n_epochs = max(g.epochs for g in groups)
    stats = MeanMetrics()
    kl_stops = KLStops(groups)
    for epoch in range(n_epochs):
        active = kl_stops.running([g for g in groups if epoch < g.epochs])
        if not active:
            break
        if epoch:  # a watched loss's diagnostics are those of the last epoch it runs in, as
            stats.discard(kl_stops.diagnostics(active))  # without a target (and as in SB3)
        for loss in losses:  # detached diagnostics in the last epoch a loss is used
            if hasattr(loss, "diagnostics"):
                last = max(g.epochs for g in groups if g.loss is loss) - 1
                loss.diagnostics = epoch == last or kl_stops.watches(loss)
        for minibatch in minibatches(inputs, ctx.generator):
            stepped = _step(active, groups, minibatch, ctx, stats, grad_accum, source)
            if kl_stops.groups:  # nothing to count without a target_kl
                active = kl_stops.record(active, stepped)
                if not active:
                    break
    return stats.result() | kl_stops.result()


class KLStops:
    """The ``target_kl`` stops of one :func:`update_loop` call: which groups are watched,
    how many steps each took and which have stopped (a population keeps one per member)."""

    def __init__(self, groups: Sequence[LossGroup]) -> None:
        self.groups = [g for g in groups if g.target_kl is not None]
        self.steps = {id(g): 0 for g in self.groups}
        self.halted: set[int] = set()

    def diagnostics(self, active: Sequence[LossGroup]) -> list[str]:
        """The diagnostic names (``out_keys`` but the ``loss_*`` terms) of the watched losses
        that ``active`` groups will call again (they report them in every epoch to give the
        stop its approx_kl)."""
        running = {id(g.loss) for g in active}
        watched = [g.loss for g in self.groups if id(g.loss) in running]
        names = {k for loss in watched for k in getattr(loss, "out_keys", ())}
        return [k for k in names if isinstance(k, str) and not k.startswith("loss_")]

    def watches(self, loss: nn.Module) -> bool:
        """Whether a group stops on ``loss``'s approx_kl (then it reports it every epoch)."""
        return any(g.loss is loss for g in self.groups)

    def running(self, groups: Sequence[LossGroup]) -> list[LossGroup]:
        return [g for g in groups if id(g) not in self.halted]

    def record(self, active: Sequence[LossGroup], stepped: Sequence[LossGroup]) -> list:
        """Count the watched groups' steps; a watched group that did not step has stopped.
        Returns the groups still running."""
        for g in active:
            if id(g) in self.steps:
                if any(h is g for h in stepped):
                    self.steps[id(g)] += 1
                else:
                    self.halted.add(id(g))
        return self.running(active)

    def result(self) -> dict[str, float]:
        """Each watched group's gradient steps in this call (``grad_steps``). A group that
        took none gets a warning, once per group name in a process (:func:`_warn_no_step`)."""
        for g in self.groups:
            if self.steps[id(g)] == 0:
                _warn_no_step(g)
        return {steps_name(g): float(self.steps[id(g)]) for g in self.groups}


#: the group names already warned of a batch without a step (one warning each per process)
_NO_STEP_WARNED: set[str] = set()


def _warn_no_step(group: LossGroup) -> None:
    """Say once that ``group`` took no gradient step on a batch: its first minibatch's KL
    was already over ``1.5 x target_kl``. Nothing else would show it but ``grad_steps`` 0,
    and a run whose every batch stops there trains nothing (the KL some losses report
    includes more than the update's drift: APPO's is from its target network, IMPALA's from
    the acting policy, lag included)."""
    if group.name in _NO_STEP_WARNED:
        return
    _NO_STEP_WARNED.add(group.name)
    warnings.warn(
        f"--target-kl: loss group {group.name!r} took no gradient step on a batch: the "
        f"approx_kl of its first minibatch was already over 1.5 x target_kl "
        f"({1.5 * group.target_kl:g}) before any step. Its grad_steps metric counts the steps "
        "per batch; if it stays at 0 the policy does not train: raise --target-kl, or drop "
        "what adds to the KL before the first step (APPO: --tau 1 --target-update-freq 1; "
        "asynchronous collection: --sync-collect true). (Shown once.)",
        RuntimeWarning,
        stacklevel=2,
    )


def steps_name(group: LossGroup) -> str:
    """The metric of a watched group's step count: its ``grad_name`` with ``grad_norm``
    replaced by ``grad_steps`` (``grad_steps``, ``value_grad_steps``), else
    ``<grad_name>_steps``."""
    name = group.grad_name
    return name.replace("grad_norm", "grad_steps") if "grad_norm" in name else f"{name}_steps"


def within_target_kl(
    active: Sequence[LossGroup], kls: Mapping[int, Any], ctx: Any = None
) -> list[LossGroup]:
    """The groups of ``active`` that may step: those without a ``target_kl`` and those whose
    loss's ``approx_kl`` (``kls`` by group id) is at most ``1.5 * target_kl`` (one host
    transfer for all). On several ranks the KL is the mean over the ranks' minibatches, so
    every rank stops at the same step (a rank that stopped alone would leave the others
    waiting in the gradient all-reduce)."""
    if not kls:
        return active
    values = torch.stack([torch.as_tensor(v, dtype=torch.float32) for v in kls.values()])
    if ctx is not None and getattr(ctx, "world_size", 1) > 1:
        values = ctx.all_reduce_mean(values)
    over = dict(zip(kls, values.tolist()))
    return [g for g in active if not (id(g) in over and over_target_kl(over[id(g)], g))]


def over_target_kl(kl: float, group: LossGroup) -> bool:
    """SB3's stop: ``kl > 1.5 * target_kl``. "Over" rather than "not within": a NaN KL steps,
    so the optimiser's finiteness check raises instead of the group stopping quietly (the
    rule a run and a population member share)."""
    return kl > 1.5 * group.target_kl


def _validate(groups: Sequence[LossGroup]) -> None:
    """The claims and parameter checks, once per combination of groups: learners call the loop
    with the same groups every update (off-policy ones every gradient step), so a repeat is
    recognised by the groups, their terms and their optimisers and skipped."""
    signature = tuple((id(g), g.terms, id(g.optimizer)) for g in groups)
    if groups[0].__dict__.get("_validated") == signature:
        return
    _claims(groups)
    _check_disjoint(groups)
    for g in groups:  # a new combination: parameters and term claims are read afresh
        g.__dict__.pop("_param_cache", None)
        g.__dict__.pop("_terms_cache", None)
    groups[0].__dict__["_validated"] = signature


def _check_disjoint(groups: Sequence[LossGroup]) -> None:
    owner: dict[int, str] = {}
    for g in groups:
        for p in {id(p) for p in g.parameters}:
            if p in owner and owner[p] != g.name:
                raise LossContractError(
                    f"loss groups {owner[p]!r} and {g.name!r} step the same parameter in one "
                    "update: each parameter belongs to one group's optimiser"
                )
            owner[p] = g.name


def _step(
    active: Sequence[LossGroup],
    groups: Sequence[LossGroup],
    minibatch: TensorDictBase,
    ctx: Any,
    stats: MeanMetrics,
    grad_accum: int,
    source: TensorDictBase,
) -> list[LossGroup]:
    """One optimiser step per active group on ``minibatch`` (chunked when ``grad_accum``),
    except a group whose ``target_kl`` the minibatch's ``approx_kl`` exceeds 1.5 times.
    Returns the groups that stepped."""
    if not active:
        return []
    n = minibatch.shape[0]
    chunks = (
        [slice(None)]
        if grad_accum <= 1
        else [idx for idx in torch.arange(n).tensor_split(grad_accum) if len(idx)]
    )
    for g in active:
        g.optimizer.zero_grad(set_to_none=True)
    totals = {id(g): 0.0 for g in active}
    kls: dict[int, Any] = {}  # the approx_kl of a watched group's loss, chunk-weighted
    merged: dict[str, torch.Tensor] = {}
    for chunk in chunks:
        part = minibatch if isinstance(chunk, slice) else minibatch[chunk]
        weight = 1.0 if isinstance(chunk, slice) else len(chunk) / n
        outs: dict[int, dict] = {}
        for g in active:
            if id(g.loss) not in outs:
                # key reads are checked on a loss's first use, with its groups' other checks
                strict = not all(h._checked for h in active if h.loss is g.loss)
                outs[id(g.loss)] = _entries(_call_loss(g.loss, part, source, strict=strict))
        _add_kls(kls, active, outs, weight)
        pending = [(g, outs[id(g.loss)]) for g in active]
        for i, (g, out) in enumerate(pending):
            names = _group_terms(g, out, groups)
            if not g._checked:
                _check_reaches(g, out, names)
            total = sum(out[t] for t in names)
            factor = g.scale * weight
            if factor != 1.0:  # skip a tensor op per step in the common case
                total = factor * total
            totals[id(g)] = total.detach() if len(chunks) == 1 else totals[id(g)] + total.detach()
            _backward(total, g, only=len(groups) == 1, retain=i < len(pending) - 1)
        for out in outs.values():
            _merge_scalars(merged, out, weight)
    active = within_target_kl(active, kls, ctx)
    for g in active:
        try:
            merged[g.grad_name] = ctx.step_optimizer(
                g.optimizer,
                max_grad_norm=g.max_grad_norm,
                transform_grads=g.transform_grads,
                loss=totals[id(g)],
            )
        except NonFiniteError as err:
            raise _name_terms(err, g, outs) from None
    stats.add(merged)
    return active


def _name_terms(err: Exception, group: LossGroup, outs: Mapping[int, dict]) -> Exception:
    """``err`` (a non-finite step of ``group``) with the non-finite ``loss_*`` terms of its
    loss named, when there are any (the failure path only: no cost per step)."""
    out = outs.get(id(group.loss), {})
    bad = {
        k: v.detach()
        for k, v in out.items()
        if isinstance(k, str)
        and k.startswith("loss_")
        and isinstance(v, torch.Tensor)
        and not bool(torch.isfinite(v.detach()).all())
    }
    if not bad:
        return err
    shown = ", ".join(f"{k}={float(v.float().sum()):g}" for k, v in bad.items())
    constant = [k for k in bad if not out[k].requires_grad]
    advice = (
        f"{', '.join(constant)} has no graph, so no gradient made it non-finite: fix how "
        f"{type(group.loss).__name__} computes it"
        if constant
        else None
    )
    return NonFiniteError(
        f"{err}; non-finite loss terms of {type(group.loss).__name__} (group {group.name!r}): "
        f"{shown}",
        advice=advice,
    )


def _add_kls(kls: dict[int, Any], active: Sequence[LossGroup], outs: Mapping, weight: float):
    """Add each watched group's ``approx_kl`` (its loss's output ``outs[id(loss)]``) to
    ``kls``, weighted by the chunk's share of the minibatch."""
    for g in active:
        if g.target_kl is not None:
            kls[id(g)] = kls.get(id(g), 0.0) + weight * approx_kl_of(g, outs[id(g.loss)])


def approx_kl_of(group: LossGroup, out: Mapping[str, Any]) -> torch.Tensor:
    """The ``approx_kl`` a group with a ``target_kl`` stops on, or a contract error."""
    kl = out.get(APPROX_KL)
    if kl is None:
        raise LossContractError(
            f"loss group {group.name!r} stops its epochs on the loss's approx_kl (--target-kl), "
            f"but {type(group.loss).__name__} reports none: drop --target-kl, or use a loss "
            "that reports approx_kl (PPO, APPO, IMPALA, DAAC)"
        )
    return kl.detach()


def _entries(out: Any) -> dict:
    """A loss output's top-level entries as a plain dict (a TensorDict's own mapping when it is
    one: reading it costs a fraction of ``TensorDict.get`` / ``keys`` per entry)."""
    if type(out) is TensorDict:
        return out._tensordict
    return dict(out.items())


def _backward(total: Any, group: LossGroup, *, only: bool, retain: bool) -> None:
    """Back-propagate a group's summed terms into its own parameters."""
    if not (isinstance(total, torch.Tensor) and total.requires_grad):
        return
    if only:
        # the only group of the call: a plain backward gives its parameters the same gradient
        # (another leaf it reaches is zeroed before that leaf's own optimiser steps), without
        # the per-call cost of routing to ``inputs``
        total.backward()
    else:
        total.backward(inputs=group._params, retain_graph=retain)


def _merge_scalars(merged: dict[str, torch.Tensor], out: dict, weight: float) -> None:
    """Add ``out``'s scalar entries to ``merged`` (chunk-weighted sums; ``*_max``: max)."""
    if weight == 1.0 and not merged:  # one chunk, one loss: the common case
        merged.update((k, v) for k, v in out.items() if isinstance(k, str) and v.numel() == 1)
        return
    for k, v in out.items():
        if not isinstance(k, str) or v.numel() != 1:
            continue
        if k.endswith("_max"):
            merged[k] = torch.maximum(merged[k], v) if k in merged else v
        else:
            v = v if weight == 1.0 else v * weight
            merged[k] = merged[k] + v if k in merged else v
