r"""Populations: P independent members of one recipe trained as one vectorised run.

A member is an ordinary learner built by the recipe's ``build`` from its own config (its
seed, its hyperparameters); :class:`PopulationLearner` holds P of them and presents them to
the engine as one learner:

* **collection**: one vector env of ``P x num_envs`` sub-envs, member ``i`` acting in rows
  ``[i N, (i + 1) N)`` seeded as its standalone run's env (``seed_i + k``);
  :class:`PopulationPolicy` runs each member's actor on its rows and samples with the
  member's own random stream (the global stream of its standalone run, swapped in and out),
  so a member draws the actions its standalone run draws. A member whose standalone run
  collects in worker processes (synchronous IMPALA and APPO: ``cfg.worker_seeds``) has its
  rows split into one block per worker, each seeded and sampled as that worker's;
* **update**: each member's ``prepare`` (schedules, estimator), then each of its update's
  phases (one loss group each: PPO's and A2C's loss; DAAC's policy, then value) through the
  one update loop (:func:`rlkit.training.update.update_loop`, with its key, term and
  finiteness contracts) as one loss group: the members' minibatches stacked, their losses
  computed in one ``torch.vmap`` (members whose losses hold the same hyperparameters are
  vmapped together: a sweep over ``clip_epsilon`` runs one vmapped call per value), one
  backward, then in the loop's ``transform_grads`` hook each member's ``target_kl`` stop,
  gradient norm, finiteness check and clipping, and the loop's one optimiser step of the
  members' joint optimiser (:func:`joint_optimizer`: one torch optimiser over every member's
  parameters whose state is the members' own; one fused Adam call per learning rate).
  Minibatch orders come from per-member generators seeded as a standalone run's; then each
  member's ``finish`` (KL-adaptive learning rate, counters). A learner that sets
  ``population_sequential`` (PPG: a policy phase of two loss groups in lockstep, then an
  auxiliary phase over its own buffer; IMPALA and APPO), one with memory (``--recurrent``:
  ``torch.func.vmap`` has no rule for ``nn.LSTM`` / ``nn.GRU``) and one with an intrinsic
  reward (its bonus trains in lockstep with the policy; built on the shared env, it is
  sized to the member's rows, ``Learner.use_rows``) runs its own ``update`` instead,
  member after member, each in its own random stream and with its own minibatch generator
  (a recurrent member's actor runs on its rows with its rows' carried state);
* **ranks**: with ``W`` ranks, rank ``r`` holds members ``[r P/W, (r + 1) P/W)``
  (:func:`rank_members`) and nothing of a member crosses ranks (no gradient all-reduce, no
  shared statistics); :class:`PopulationReport` gathers their rows on rank 0;
* **divergence**: a member is stopped wherever its divergence shows, with one line (a
  warning on stderr) and a reason in ``population.json``, and the others go on unchanged:
  non-finite outputs of its policy while collecting (its rows then act with a placeholder,
  :class:`PopulationPolicy`; its evaluation return is NaN), a non-finite value, advantage or
  target from its estimator, a non-finite loss or gradient, or non-finite parameters after
  its update (it gets back the parameters it had before that update, so a checkpoint holds
  only finite ones). A stopped member keeps its last good parameters. When every member has
  stopped the run stops (:class:`~rlkit.training.errors.NonFiniteError`, exit status 3).

Member ``i`` of a population and a standalone run with the same seed and settings end at the
same parameters (``tests/test_population.py``: within 1e-5 after three batches, four members
with four different settings, for PPO, A2C, DAAC and PPG; ``tests/test_population_ddp.py``: a
population on two ranks as in one process). The vmapped backward differs from one
member's in the last bits, and training amplifies such differences over long runs
(docs/population.md gives the measured drift); a lone member runs its own loss, bit for bit.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase, is_tensor_collection
from torch import nn

from rlkit import keys
from rlkit.configs.base import population_env_options
from rlkit.modules import direct
from rlkit.training import checkpoint as ckpt
from rlkit.training.engine import (
    RunMode,
    RunReport,
    _apply,
    _on_every_rank,
    _warm_start,
    rank_checkpoint_path,
)
from rlkit.training.errors import NonFiniteError
from rlkit.training.learner import Context, Learner, episode_stats
from rlkit.training.runlog import MIN_RUNS_FOR_INTERVAL, plot_settings
from rlkit.training.stats import bootstrap_ci, iqm
from rlkit.training.update import (
    KLStops,
    LossGroup,
    _group_terms,
    approx_kl_of,
    over_target_kl,
    update_loop,
)

_log = logging.getLogger(__name__)

__all__ = ["PopulationLearner", "PopulationPolicy", "member_key"]


def member_key(index: int, name: str) -> str:
    """The name under which member ``index``'s module or optimiser ``name`` is checkpointed."""
    return f"member{index}.{name}"


def member_means(metrics: Mapping[str, float]) -> dict[str, float]:
    """``metrics``' per-member values (``name/member<i>``) and, for each name, their mean
    over the members that report it (under ``name``)."""
    out = {k: v for k, v in metrics.items() if "/member" in k}
    for k in {k.split("/member")[0] for k in out}:
        values = [v for name, v in out.items() if name.split("/member")[0] == k]
        out[k] = sum(values) / len(values)
    return out


class _SingleProcess:
    """What a member's update sees of the launcher: its own process only (no collectives)."""

    world_size = 1
    global_rank = 0

    def __init__(self, device: torch.device) -> None:
        self.device = device


def _local(ctx: Context) -> Context:
    if ctx.world_size == 1:
        return ctx
    return dataclasses.replace(ctx, fabric=_SingleProcess(ctx.device))


class _MemberRNG:
    """A member's global random stream, kept while other members (or the engine) draw."""

    def __init__(self, state: torch.Tensor) -> None:
        self.state = state

    def __enter__(self) -> None:
        self._outer = torch.get_rng_state()
        torch.set_rng_state(self.state)

    def __exit__(self, *exc: Any) -> None:
        self.state = torch.get_rng_state()
        torch.set_rng_state(self._outer)


def _leaves(part: dict) -> list[torch.Tensor]:
    """A member's outputs as tensors (a Dict action's TensorDict gives its parts)."""
    return [
        x
        for v in part.values()
        for x in (v.values(True, True) if is_tensor_collection(v) else (v,))
    ]


class PopulationPolicy(nn.Module):
    """The collection policy of a population: member ``i``'s actor on rows ``[i N, (i+1) N)``,
    sampling from the member's own random stream.

    A member whose actor gives non-finite outputs (logits, actions: its parameters diverged,
    or its observations did) is stopped there, in the step, and from then on its rows get a
    placeholder (another member's outputs for a general actor; uniform logits, sampled in the
    member's own stream, for a categorical one): the other members' rows, streams and actions
    are what they would be without it (:class:`PopulationLearner` shares its ``stopped`` and
    ``unplayable`` with this policy)."""

    def __init__(
        self,
        actors: Sequence[nn.Module],
        rngs: Sequence[_MemberRNG],
        owners: Sequence[int] | None = None,
    ):
        super().__init__()
        self.actors = nn.ModuleList(actors)
        self.rngs = list(rngs)
        self.in_keys = list(actors[0].in_keys)
        self.out_keys = list(actors[0].out_keys)
        #: the member each block of rows belongs to (a member collecting with W worker streams
        #: has W blocks)
        self.owners = list(range(len(actors))) if owners is None else list(owners)
        #: the population's stopped members and those whose policy gives non-finite outputs
        #: (:class:`PopulationLearner` replaces both with its own, shared)
        self.stopped: dict[int, str] = {}
        self.unplayable: set[int] = set()
        self.stop_member = lambda i, why: self.stopped.setdefault(i, why)

    @contextlib.contextmanager
    def fork_streams(self) -> Iterator[None]:
        """The members' random streams come back as they were after the block (a probe of
        the policy, e.g. ``check_env_compat``'s, draws nothing a member would have drawn)."""
        saved = [r.state.clone() for r in self.rngs]
        try:
            yield
        finally:
            for r, s in zip(self.rngs, saved):
                r.state = s

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        merged = self._categorical(td)
        if merged is None:
            n = td.shape[0] // len(self.actors)  # training rows or evaluation episodes
            parts: list[dict[str, torch.Tensor] | None] = []
            for i, (actor, rng) in enumerate(zip(self.actors, self.rngs)):
                if self.owners[i] in self.unplayable:
                    parts.append(None)
                    continue
                rows = td[i * n : (i + 1) * n]
                try:
                    with rng:
                        out = direct.actor_sample(actor, rows)
                        if out is None:
                            out = actor(rows.select(*self.in_keys))
                            out = dict(out.select(*self.out_keys).items())  # a Dict action: a TD
                except (ValueError, RuntimeError) as err:  # a distribution refusing NaN
                    self._diverged(i, f"its policy failed ({_first_line(err)})")
                    out = None
                parts.append(out)
            self._check_finite(parts)
            merged = self._fill(parts)
        td.update(merged)
        return td

    def _diverged(self, block: int, why: str) -> None:
        member = self.owners[block]
        self.unplayable.add(member)
        self.stop_member(member, why)

    def _check_finite(self, parts: list[dict[str, torch.Tensor] | None]) -> None:
        """Stop the members whose outputs hold a NaN or an infinity (one host transfer)."""
        blocks = [i for i, p in enumerate(parts) if p is not None]
        flags = []
        for i in blocks:
            floats = [v for v in _leaves(parts[i]) if v.is_floating_point()]
            if floats:
                flags.append(torch.stack([torch.isfinite(v).all() for v in floats]).all())
        if not flags or len(flags) != len(blocks):  # outputs without a float: nothing to check
            return
        for i, ok in zip(blocks, torch.stack(flags).tolist()):
            if not ok:
                part = parts[i]
                bad = next(
                    k
                    for k, v in part.items()
                    if any(
                        x.is_floating_point() and not x.isfinite().all() for x in _leaves({k: v})
                    )
                )
                self._diverged(i, f"non-finite {bad} of its policy")
                parts[i] = None

    def _fill(self, parts: list[dict[str, torch.Tensor] | None]) -> dict[str, torch.Tensor]:
        """The blocks' outputs as one, a stopped member's block filled with another's."""
        template = next((p for p in parts if p is not None), None)
        if template is None:
            self._all_diverged()
        filled = [
            p if p is not None else {k: v.clone() for k, v in template.items()} for p in parts
        ]
        return {k: torch.cat([p[k] for p in filled]) for k in filled[0]}

    def _all_diverged(self):
        raise NonFiniteError(
            "every member of the population diverged (non-finite policy outputs): "
            + "; ".join(f"member {i}: {why}" for i, why in sorted(self.stopped.items()))
        )

    def _categorical(self, td: TensorDictBase) -> dict[str, torch.Tensor] | None:
        """Categorical members in one distribution: each member's network on its rows, one
        ``Categorical`` over all rows (row-wise the same normalisation and probabilities as a
        member's own), then ``torch.multinomial`` on each member's rows in its random stream,
        exactly what ``Categorical.sample`` runs; ``None`` for any other kind of actor. A
        member whose logits are not finite is stopped and its rows get uniform logits."""
        plans = [direct.sampling_plan(a) for a in self.actors]
        if any(p is None or p.dist_class is not torch.distributions.Categorical for p in plans):
            return None
        if any(p.dist_kwargs or p.dist_keys != ("logits",) for p in plans):
            return None
        n, key = td.shape[0] // len(self.actors), plans[0].param_keys[0]
        try:
            outs = [p.params.outputs(td[i * n : (i + 1) * n]) for i, p in enumerate(plans)]
        except direct.PlanMismatch:
            return None
        finite = torch.stack([torch.isfinite(o[key]).all() for o in outs]).tolist()
        for i, ok in enumerate(finite):
            if not ok and self.owners[i] not in self.unplayable:
                self._diverged(i, f"non-finite {key} of its policy")
            if self.owners[i] in self.unplayable:
                outs[i] = {k: torch.zeros_like(v) for k, v in outs[i].items()}
        if len(self.unplayable) == len(set(self.owners)):
            self._all_diverged()
        dist = torch.distributions.Categorical(logits=torch.cat([o[key] for o in outs]))
        probs = dist.probs
        actions = []
        for i, rng in enumerate(self.rngs):
            with rng:
                actions.append(torch.multinomial(probs[i * n : (i + 1) * n], 1, True).T)
        action = torch.cat(actions, dim=1).reshape(dist.batch_shape)
        sample_key, log_prob_key = plans[0].sample_keys[-2:]
        merged = {k: torch.cat([o[k] for o in outs]) for k in outs[0]}
        merged[sample_key], merged[log_prob_key] = action, dist.log_prob(action)
        return merged


def _first_line(err: BaseException, limit: int = 120) -> str:
    text = (str(err).strip().splitlines() or [""])[0]
    text = f"{type(err).__name__}: {text}" if text else type(err).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Networks(nn.Module):
    """A loss's networks (its child modules) as one plain module (``torch.func.functional_call``
    needs the standard ``named_parameters``, which TorchRL's ``LossModule`` overrides);
    calling it runs the loss."""

    def __init__(self, loss: nn.Module) -> None:
        super().__init__()
        self.nets = nn.ModuleDict(dict(loss.named_children()))
        object.__setattr__(self, "_loss", loss)  # not a submodule: its parameters are above

    def forward(self, minibatch: TensorDictBase) -> dict[str, torch.Tensor]:
        return dict(self._loss(minibatch).items())

    def tensors(self) -> dict[str, torch.Tensor]:
        return {**dict(self.named_parameters()), **dict(self.named_buffers())}


class _VmapGroup:
    """Members whose losses hold the same hyperparameters: one vmapped loss call."""

    def __init__(self, loss: nn.Module) -> None:
        self.template = copy.deepcopy(loss)
        self.networks = _Networks(self.template)

    def sync(self, loss: nn.Module) -> None:
        """Copy the member loss's plain attributes (schedules change them every update)."""
        for name, value in _plain_attributes(loss).items():
            self.template.__dict__[name] = value

    def __call__(
        self, tensors: Sequence[Mapping[str, torch.Tensor]], minibatch: TensorDictBase
    ) -> dict[str, Any]:
        stacked = {k: torch.stack([t[k] for t in tensors]) for k in tensors[0]}

        def one(p: dict[str, torch.Tensor], mb: TensorDictBase) -> dict[str, torch.Tensor]:
            return torch.func.functional_call(self.networks, p, (mb,))

        return torch.vmap(one, randomness="different")(stacked, minibatch)


def _plain_attributes(loss: nn.Module) -> dict[str, Any]:
    """The loss's hyperparameters: public plain attributes and rlkit's validated ones
    (``Hyperparameter`` descriptors keep theirs in ``_hyperparameter_<name>``)."""
    return {
        k: v
        for k, v in loss.__dict__.items()
        if isinstance(v, (bool, int, float, str, type(None)))
        and (not k.startswith("_") or k.startswith("_hyperparameter_"))
    }


class _RoutedState(dict):
    """The state of the members' joint optimiser: every parameter's entry is its member
    optimiser's own, looked up on each access (a member's loaded ``state_dict`` is seen at
    once), so each member's moments and step counts live, and are checkpointed, where its
    standalone run keeps them."""

    def __init__(self, owners: Mapping[torch.Tensor, torch.optim.Optimizer]) -> None:
        super().__init__()
        self.owners = owners

    def __missing__(self, param: torch.Tensor) -> dict:
        return self.owners[param].state[param]


def joint_optimizer(optimizers: Sequence[torch.optim.Optimizer]) -> torch.optim.Optimizer:
    """One optimiser of the members' optimisers' kind over all their parameters, whose state
    is theirs (:class:`_RoutedState`), stepped through the update loop's one optimiser step.

    Adam, AdamW, RMSprop and SGD update each parameter tensor from its own gradient and state
    alone, so one step of this optimiser moves every member's parameters exactly as the
    member's own ``optimizer.step()`` would; a parameter without a gradient (a member that
    does not step: over its ``target_kl``, or stopped) is skipped and its state untouched, as
    under its own optimiser. Members' settings (a swept learning rate) become parameter
    groups (:func:`regroup`): one fused Adam call per distinct setting. Step hooks registered
    on a member's optimiser do not run (the joint optimiser steps, not the member's)."""
    kinds = {type(o) for o in optimizers}
    if len(kinds) != 1:
        names = sorted(k.__name__ for k in kinds)
        raise ValueError(
            f"--population steps its members' optimisers as one, but they are of different "
            f"kinds ({', '.join(names)}): give every member the same --optimizer"
        )
    # built from the members' own parameter groups, settings included (regroup merges them)
    joint = kinds.pop()(
        [dict(g, params=list(g["params"])) for o in optimizers for g in o.param_groups]
    )
    joint.state = _RoutedState(
        {p: o for o in optimizers for g in o.param_groups for p in g["params"]}
    )
    return joint


def regroup(joint: torch.optim.Optimizer, optimizers: Sequence[torch.optim.Optimizer]) -> None:
    """``joint``'s parameter groups from the members' current ones (their learning rates
    follow their schedules): groups with equal settings merged, one per distinct setting."""
    buckets: dict[tuple, dict[str, Any]] = {}
    for opt in optimizers:
        for group in opt.param_groups:
            options = {k: v for k, v in group.items() if k != "params"}
            key = tuple((k, _hashable(v)) for k, v in sorted(options.items()))
            bucket = buckets.setdefault(key, dict(options, params=[]))
            bucket["params"].extend(group["params"])
    joint.param_groups = list(buckets.values())


def _hashable(value: Any) -> Any:
    if isinstance(value, torch.Tensor):  # a tensor learning rate: its own group
        return ("tensor", id(value))
    try:
        hash(value)
    except TypeError:
        return ("object", id(value))
    return value


class _MemberStats:
    """Per-member means of the loss outputs' scalars over an update (``*_max``: maxima),
    accumulated for all members of a vmap group at once: a sum and a count per name, indexed
    by member, instead of one average per member per name per step."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.sums: dict[str, torch.Tensor] = {}
        self.counts: dict[str, torch.Tensor] = {}
        self.floats: dict[int, dict[str, list[float]]] = {}

    def add(self, members: list[int], out: Mapping[str, torch.Tensor], rows: list[int]) -> None:
        index = torch.tensor(members)
        take = torch.tensor(rows)
        for k, v in out.items():
            if not isinstance(k, str) or v.dim() != 1:
                continue
            v = v.detach()[take.to(v.device)].double().cpu()  # the sums live on the CPU
            if k not in self.sums:
                fill = -math.inf if k.endswith("_max") else 0.0
                self.sums[k] = torch.full((self.size,), fill, dtype=torch.float64)
                self.counts[k] = torch.zeros(self.size, dtype=torch.float64)
            if k.endswith("_max"):
                self.sums[k][index] = torch.maximum(self.sums[k][index], v)
            else:
                self.sums[k].index_add_(0, index, v)
            self.counts[k].index_add_(0, index, torch.ones(len(members), dtype=torch.float64))

    def discard(self, names: Sequence[str], members: Sequence[int]) -> None:
        """Forget ``members``' values under ``names`` (a new epoch's diagnostics replace
        them, as :meth:`rlkit.training.update.MeanMetrics.discard` does for a run)."""
        index = torch.tensor(list(members), dtype=torch.long)
        for k in names:
            if k in self.sums:
                self.sums[k][index] = -math.inf if k.endswith("_max") else 0.0
                self.counts[k][index] = 0.0

    def add_floats(self, values: Mapping[int, Mapping[str, float]]) -> None:
        for i, named in values.items():
            for k, v in named.items():
                self.floats.setdefault(i, {}).setdefault(k, []).append(v)

    def result(self, i: int) -> dict[str, float]:
        out: dict[str, float] = {}
        for k, total in self.sums.items():
            n = float(self.counts[k][i])
            if n:
                out[k] = float(total[i]) if k.endswith("_max") else float(total[i]) / n
        for k, vs in self.floats.get(i, {}).items():
            out[k] = max(vs) if k.endswith("_max") else sum(vs) / len(vs)
        return out


def _stack(tds: Sequence[TensorDictBase]) -> TensorDictBase:
    """``torch.stack(tds)`` for TensorDicts of one structure, leaf by leaf: the generic
    TensorDict stack checks keys and shapes on every call (5 ms per step for 16 members'
    parameters and minibatches here), which the population's fixed structures do not need."""
    first = tds[0]
    leaves = {
        k: torch.stack([td.get(k) for td in tds])
        for k in first.keys(include_nested=True, leaves_only=True)
    }
    out = TensorDict(batch_size=[len(tds), *first.batch_size])
    for k, v in leaves.items():
        out.set(k, v)
    return out


class _MembersLoss(nn.Module):
    """A phase's live members' losses as one loss of the update loop
    (:func:`rlkit.training.update.update_loop`): called on the members' minibatches stacked
    ``[L, B]`` (member ``j`` of :attr:`_Phase.live` in row ``j``), it returns each claimed
    ``loss_*`` term summed over the members. Members are independent, so each member's
    parameters get its own loss's gradient. The per-member outputs stay in the phase for its
    step hook (:meth:`_Phase.after_backward`)."""

    def __init__(self) -> None:
        super().__init__()
        self.phase: _Phase | None = None

    @property
    def in_keys(self) -> list:
        return self.phase.in_keys

    def forward(self, minibatch: TensorDictBase) -> dict[str, torch.Tensor]:
        return self.phase.losses(minibatch)


class _Phase:
    """One phase of a population's update as the update loop runs it: every live member's
    loss group of the phase (its epochs, its minibatches from its own generator, its
    ``target_kl``, clipping and finiteness check), the members' steps taken as one step of
    their joint optimiser (:func:`joint_optimizer`)."""

    def __init__(self, population, live, groups, phases, n: int, ctx: Context) -> None:
        self.population = population
        self.groups: dict[int, LossGroup] = groups  # member -> its loss group
        self.phases = phases  # member -> its phase (the list its phase_minibatches takes)
        self.ctx = ctx
        self.kl_stops = {i: KLStops([groups[i]]) for i in live}
        self.stats = _MemberStats(population.size)
        self.position = {i: j for j, i in enumerate(live)}  # member -> row of the stacked data
        self.params = {i: groups[i].parameters for i in live}
        self.in_keys = list(dict.fromkeys(k for i in live for k in groups[i].loss.in_keys))
        self.live: list[int] = []  # the members of the current minibatch, in its row order
        self.last: list[tuple[list[int], dict[str, torch.Tensor], list[str]]] = []
        self.totals = torch.zeros(0)
        self.rows = TensorDict({"row": torch.arange(n)}, batch_size=[n])
        self.epoch = 0
        self._whole: dict[tuple, TensorDictBase] = {}

    def running(self, i: int) -> bool:
        return i not in self.population.stopped and bool(self.kl_stops[i].running([self.groups[i]]))

    # ---------------------------------------------------------------- the loop's inputs
    def minibatches(self, data: TensorDictBase, generator: torch.Generator):
        """One epoch: each running member's minibatches, drawn from its own generator by its
        learner's ``phase_minibatches`` (on row numbers), stacked step by step over the
        members still running."""
        del generator  # each member draws from its own, as its standalone run does
        epoch, self.epoch = self.epoch, self.epoch + 1
        orders: dict[int, list[torch.Tensor | None]] = {}
        for i in self.position:
            group = self.groups[i]
            if epoch >= group.epochs or not self.running(i):
                continue
            if hasattr(group.loss, "diagnostics"):  # as update_loop sets a run's
                group.loss.diagnostics = epoch == group.epochs - 1 or self.kl_stops[i].watches(
                    group.loss
                )
            if epoch:  # the last epoch run's diagnostics, as a standalone run logs them
                self.stats.discard(self.kl_stops[i].diagnostics([group]), [i])
            split = self.population.members[i].phase_minibatches(self.phases[i])
            orders[i] = [
                None if part is self.rows else part.get("row")
                for part in split(self.rows, self.population.generators[i])
            ]
        for step in range(min((len(o) for o in orders.values()), default=0)):
            live = [i for i in orders if self.running(i)]
            if not live:
                return
            self.live = live
            yield self._gather(data, live, [orders[i][step] for i in live])

    def _gather(self, data: TensorDictBase, live: list[int], rows: list) -> TensorDictBase:
        """The live members' minibatches, ``[L, B]``: their whole batches (one minibatch per
        epoch; gathered once per phase) or their rows."""
        pos = [self.position[i] for i in live]
        if all(r is None for r in rows):
            key = tuple(pos)
            if key not in self._whole:
                whole = key == tuple(range(data.shape[0]))
                self._whole[key] = data if whole else data[torch.tensor(pos)]
            return self._whole[key]
        n = data.shape[1]
        index = torch.stack([torch.arange(n) if r is None else r for r in rows])
        return data[torch.tensor(pos).unsqueeze(1), index]

    def losses(self, minibatch: TensorDictBase) -> dict[str, torch.Tensor]:
        """The live members' outputs (one vmapped call per set of equal hyperparameters),
        kept in :attr:`last`; returns each claimed term summed over the members (times each
        member group's ``scale``)."""
        population, groups, live = self.population, self.groups, self.live
        row = {i: j for j, i in enumerate(live)}
        self.last, totals = [], []
        sums: dict[str, torch.Tensor] = {}
        for idx in population._vmap_groups(live, groups).values():
            out = population._losses(idx, minibatch, [row[i] for i in idx], groups)
            names = _group_terms(groups[idx[0]], out, [groups[idx[0]]])
            self.last.append((idx, out, names))
            scales = [groups[i].scale for i in idx]
            total = 0.0
            for t in names:
                term = out[t]
                if any(s != 1.0 for s in scales):
                    term = term * term.new_tensor(scales)
                total = total + term.detach()
                # a member's non-finite loss stops that member (after_backward), not the
                # run: the loop sees (and checks) the sum of the finite ones; the gradient
                # reaching each finite member's term is the same 1
                term = term.where(torch.isfinite(term.detach()), 0.0).sum()
                sums[t] = term if t not in sums else sums[t] + term
            totals.append(torch.as_tensor(total).reshape(-1).expand(len(idx)))
        #: each member's loss value (its terms' sum, times its group's scale), in step order
        self.totals = torch.cat(totals) if totals else torch.zeros(0)
        return sums

    # ---------------------------------------------------------------- the step hook
    def after_backward(self) -> None:
        """The loop's ``transform_grads`` of the joint step: per member, what the loop's step
        does for a run (the ``target_kl`` stop, the group's own ``transform_grads``, the
        gradient norm, its finiteness check and clipping); a member that does not step (over
        its ``target_kl``, or stopped by a non-finite gradient) has its gradients dropped, so
        the joint step leaves its parameters and optimiser state as they are."""
        population, groups = self.population, self.groups
        order = [i for idx, _, _ in self.last for i in idx]
        over = self._over_target_kl()
        for i in over:
            self._drop(i)
        norms = self._norms([i for i in order if i not in over])
        moving = [i for i in order if i not in population.stopped and i not in over]
        self.ctx.counters.updates += len(moving) - 1  # the loop counts the joint step once
        for idx, out, _ in self.last:
            kept = [j for j, i in enumerate(idx) if i not in population.stopped]
            if kept:
                self.stats.add([idx[j] for j in kept], out, kept)
        self.stats.add_floats({i: {groups[i].grad_name: v} for i, v in norms.items()})
        for i in order:
            self.kl_stops[i].record([groups[i]], [groups[i]] if i in moving else [])

    def _drop(self, i: int) -> None:
        for p in self.params[i]:
            p.grad = None

    def _over_target_kl(self) -> set[int]:
        """The members whose ``target_kl`` the minibatch's approx_kl exceeds 1.5 times (one
        host transfer for all)."""
        watched = [
            (i, self.groups[i], approx_kl_of(self.groups[i], out)[j])
            for idx, out, _ in self.last
            for j, i in enumerate(idx)
            if self.groups[i].target_kl is not None
        ]
        if not watched:
            return set()
        kls = torch.stack([kl.float() for _, _, kl in watched]).tolist()
        return {i for (i, group, _), kl in zip(watched, kls) if over_target_kl(kl, group)}

    def _norms(self, checked: list[int]) -> dict[int, float]:
        """Each member's ``clip_grad_norm_`` as its own step takes it (its gradient norm, one
        host transfer for all members, then its clipping); a member whose norm or loss value
        is not finite (the checks of a run's step) is stopped (its gradients dropped) and
        reported."""
        if not checked:
            return {}
        for i in checked:
            if self.groups[i].transform_grads is not None:
                self.groups[i].transform_grads()
        # what clip_grad_norm_ computes for each member (torch's per-tensor norms, then their
        # norm; the clip coefficient), for all members at once: one per-tensor norm call
        grads = {i: [p.grad for p in self.params[i] if p.grad is not None] for i in checked}
        per_tensor = torch._foreach_norm([g for i in checked for g in grads[i]], 2.0)
        norms, start = [], 0
        for i in checked:
            k = len(grads[i])
            norms.append(torch.linalg.vector_norm(torch.stack(per_tensor[start : start + k]), 2.0))
            start += k
        stacked = torch.stack(norms)
        limits = [self.groups[i].max_grad_norm or math.inf for i in checked]
        # max_norm / (norm + 1e-6) as torch computes it (a reciprocal, then a product)
        coefs = torch.clamp((stacked + 1e-6).reciprocal() * stacked.new_tensor(limits), max=1.0)
        out: dict[int, float] = {}
        # the norms and the members' loss values in one host transfer (as a run checks both)
        order = {i: j for j, i in enumerate(i for idx, _, _ in self.last for i in idx)}
        losses = self.totals[torch.tensor([order[i] for i in checked])]
        values = torch.cat([stacked, losses.to(stacked)]).tolist()
        for j, (i, value) in enumerate(zip(checked, values)):
            loss = values[len(checked) + j]
            if not (math.isfinite(value) and math.isfinite(loss)):
                self.population.stop(
                    i,
                    f"non-finite loss or gradient (loss {loss:.4g}, gradient norm "
                    f"{value}) at {self.ctx.counters.frames:,} frames",
                )
                self._drop(i)
                continue
            if self.groups[i].max_grad_norm:
                torch._foreach_mul_(grads[i], coefs[j])
            out[i] = value
        return out

    def _total(self, i: int) -> float:
        for idx, out, names in self.last:
            if i in idx:
                j = idx.index(i)
                return float(sum(out[t][j].detach() for t in names))
        return math.nan

    def result(self, i: int) -> dict[str, float]:
        return self.stats.result(i) | self.kl_stops[i].result()


class PopulationLearner(Learner):
    """P members (learners with one loss group over ``actor`` and ``critic``, e.g. PPO and
    A2C) trained as one run; see the module docstring.

    Args:
        members: the members' learners, each built by the recipe from its own config.
        rng_states: each member's global random state right after its build (what its
            standalone run samples from).
        num_envs: sub-envs per member (the env has ``P x num_envs``).
        seeds: each member's seed (its minibatch generator starts from it, as a standalone
            run's does).
        settings: each member's hyperparameters that differ from the recipe's (reported).
        first: the population-wide index of the first member (on several ranks each rank
            holds a contiguous block of members: :func:`rank_members`); checkpoint names and
            per-member metrics use population-wide indices.
        worker_seeds: per member, the seeds of the collector workers its standalone run
            would collect with (``cfg.worker_seeds(seed)``; IMPALA and APPO): its rows are
            then split into one block per worker, each sampled from
            ``torch.manual_seed(worker seed)``'s stream, as that worker would; ``None`` (or a
            member's ``None``): the member samples from its own stream (``rng_states``).
    """

    #: a population collects in this process (its env holds every member's workers' sub-envs
    #: and its policy samples each worker's block from that worker's stream)
    collects_in_process = True

    def __init__(
        self,
        members: Sequence[Learner],
        rng_states: Sequence[torch.Tensor],
        *,
        num_envs: int,
        seeds: Sequence[int],
        settings: Sequence[Mapping[str, Any]],
        first: int = 0,
        worker_seeds: Sequence[Sequence[int] | None] | None = None,
    ) -> None:
        if not members:
            raise ValueError("a population needs at least one member")
        #: members that update one after the other, each by its own ``update`` (PPG, IMPALA,
        #: APPO; and members with memory: ``torch.func.vmap`` has no rule for nn.LSTM / nn.GRU)
        self.sequential = all(_own_update(m) for m in members)
        if self.sequential and len(members) > 1:
            _warn_sequential(members)
        for m in members if not self.sequential else ():
            if not m.shared_update():
                raise ValueError(
                    f"--population trains learners whose update is a sequence of loss groups on "
                    f"one batch (ppo, a2c, daac) or update member by member (ppg, impala, appo); "
                    f"{m.algo} updates its own way: drop "
                    "--population"
                )
            if any(len(phase) != 1 for phase in m.phases()):
                raise ValueError(
                    f"--population cannot vectorise {m.algo}: its update trains several loss "
                    "groups in lockstep; drop --population"
                )
        self.members = list(members)
        self.algo = members[0].algo
        self.num_envs = num_envs
        self.first = int(first)
        self.seeds = list(seeds)
        self.settings = [dict(s) for s in settings]
        self.rngs = [_MemberRNG(s.clone()) for s in rng_states]
        self.generators = [torch.Generator().manual_seed(int(s)) for s in seeds]
        self.stopped: dict[int, str] = {}
        actors = [m.collect_policy() for m in members]
        #: the streams the members' actions are sampled from: the members' own, or one per
        #: collector worker of each member's standalone run (``worker_seeds``). Worker
        #: streams are not checkpointed: a resumed standalone run starts new workers, seeded
        #: afresh (plus the frames trained), as its envs restart their episodes; a resumed
        #: member does the same (restart_collection)
        self.collect_rngs: list[_MemberRNG] = []
        self._worker_seeds = worker_seeds
        block_actors = []
        for i, actor in enumerate(actors):
            seeds_i = None if worker_seeds is None else worker_seeds[i]
            if seeds_i is None:
                self.collect_rngs.append(self.rngs[i])
                block_actors.append(actor)
                continue
            if num_envs % len(seeds_i):
                raise ValueError(
                    f"{num_envs} envs per member do not split over {len(seeds_i)} workers"
                )
            for seed in seeds_i:
                state = torch.Generator().manual_seed(int(seed)).get_state()
                self.collect_rngs.append(_MemberRNG(state))
                block_actors.append(actor)
        blocks = {1 if w is None else len(w) for w in worker_seeds or [None]}
        if len(blocks) != 1:  # the policy splits the rows into equal blocks
            raise ValueError("every member must collect with the same number of workers")
        owners = [i for i, actor in enumerate(actors) for a in block_actors if a is actor]
        self._policy = PopulationPolicy(block_actors, self.collect_rngs, owners)
        #: one block per member (evaluation plays each member's episodes in one block)
        self._member_policy = (
            self._policy
            if len(block_actors) == len(actors)
            else PopulationPolicy(actors, self.rngs)
        )
        #: members whose policy gives non-finite outputs (stopped while collecting): their
        #: rows act with a placeholder and their evaluation return is NaN
        self.unplayable: set[int] = set()
        #: the frames of the last update (what a member stopped while collecting reports)
        self.frames = 0
        for policy in {id(p): p for p in (self._policy, self._member_policy)}.values():
            policy.stopped, policy.unplayable = self.stopped, self.unplayable
            policy.stop_member = self._stop_collecting
        self._groups: dict[tuple, _VmapGroup] = {}
        # each member loss's parameters and buffers by name, the live tensors (read once per
        # loss: optimisers and checkpoint loads update them in place)
        self._tensors: dict[int, dict[str, torch.Tensor]] = {}
        #: the update loop's group per set of members' optimisers (:meth:`_loop_group`)
        self._loop_groups: dict[tuple, LossGroup] = {}

    def restart_collection(self, offset: int) -> None:
        """The worker streams of a resumed run: seeded, as a resumed standalone run seeds
        its new workers, with the worker seeds plus ``offset`` (the frames trained)."""
        streams = iter(self.collect_rngs)
        for i in range(len(self.members)):
            seeds_i = None if self._worker_seeds is None else self._worker_seeds[i]
            if seeds_i is None:
                next(streams)  # the member's own stream, restored from the checkpoint
                continue
            for seed in seeds_i:
                next(streams).state = torch.Generator().manual_seed(int(seed) + offset).get_state()

    # ---------------------------------------------------------------- Learner interface
    @property
    def size(self) -> int:
        return len(self.members)

    def modules(self) -> dict[str, nn.Module]:
        return {
            member_key(self.first + i, k): v
            for i, m in enumerate(self.members)
            for k, v in m.modules().items()
        }

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {
            member_key(self.first + i, k): v
            for i, m in enumerate(self.members)
            for k, v in m.optimizers().items()
        }

    def stop(self, i: int, why: str) -> None:
        """Stop member ``i`` (local index): it steps no more, keeps its parameters and is
        reported; one line says so (once), and the other members go on."""
        if i in self.stopped:
            return
        self.stopped[i] = why
        setting = _label(self.settings[i]) if i < len(self.settings) else "default"
        _log.warning(
            f"warning: member {self.first + i} (seed {self.seeds[i]}, {setting}) stopped: "
            f"{why}; the other members go on"
        )

    def _stop_collecting(self, i: int, why: str) -> None:
        self.stop(i, f"{why} while collecting, after {self.frames:,} frames")

    def stopped_members(self) -> dict[int, str]:
        """The stopped members by population-wide index, with why."""
        return {self.first + i: why for i, why in self.stopped.items()}

    @property
    def frames_per_batch(self) -> int:
        return sum(m.frames_per_batch for m in self.members)

    @property
    def min_episodes(self) -> int | None:  # the shared batch's floor: the members' setting
        return self.members[0].min_episodes

    @property
    def min_steps(self) -> int | None:
        return self.members[0].min_steps

    def collect_policy(self) -> nn.Module:
        return self._policy

    def eval_policy(self) -> nn.Module:
        return self.members[0].eval_policy()

    def member_policy(self) -> PopulationPolicy:
        """Member ``i``'s actor on the ``i``-th of ``P`` equal blocks of rows (what evaluation
        plays; the collection policy may split a member's rows further, by worker)."""
        return self._member_policy

    def member_eval_policies(self) -> list[nn.Module]:
        return [m.eval_policy() for m in self.members]

    def state_dict(self) -> dict[str, Any]:
        return {
            "members": [m.state_dict() for m in self.members],
            "rng": [r.state for r in self.rngs],
            "generators": [g.get_state() for g in self.generators],
            "stopped": {str(i): why for i, why in self.stopped.items()},
            "unplayable": sorted(self.unplayable),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for m, s in zip(self.members, state.get("members", ())):
            m.load_state_dict(s)
        for r, s in zip(self.rngs, state.get("rng", ())):
            r.state = s.clone()
        for g, s in zip(self.generators, state.get("generators", ())):
            g.set_state(s)
        # in place: the collection policies share these
        self.stopped.clear()
        self.stopped.update({int(i): why for i, why in state.get("stopped", {}).items()})
        self.unplayable.clear()
        self.unplayable.update(int(i) for i in state.get("unplayable", ()))

    # ---------------------------------------------------------------- the update
    def _split(self, batch: TensorDictBase) -> list[TensorDictBase]:
        n = self.num_envs
        return [batch[i * n : (i + 1) * n] for i in range(self.size)]

    def update(self, batch: TensorDictBase, ctx: Context) -> dict[str, float]:
        # members are independent runs: on several ranks nothing a member computes (advantage
        # and observation statistics, KL-adaptive learning rates) is reduced over the ranks,
        # which hold other members; the member steps below all-reduce no gradients either
        ctx = _local(ctx)
        self.frames = ctx.counters.frames
        parts = self._split(batch)
        if self.sequential:
            return self._sequential_update(parts, ctx)
        active = self._active()
        scheds: dict[int, dict[str, float]] = {}
        flats: dict[int, TensorDictBase] = {}
        for i in active:
            try:
                flats[i], scheds[i] = self.members[i].prepare(parts[i], ctx)
            except NonFiniteError as err:
                self.stop(i, str(err))
        self._check_estimates(flats)
        active = self._active()
        saved = _snapshot(self.members, active)
        results: dict[int, dict[str, float]] = {i: {} for i in active}
        phases = {i: self.members[i].phases() for i in active}
        for k in range(len(phases[active[0]])):  # equal settings give equal phase plans
            live = [i for i in active if i not in self.stopped]
            if live:
                for i, r in self._train(live, flats, {i: phases[i][k] for i in live}, ctx):
                    results[i] |= r
        self._check_parameters(active, saved)
        out: dict[str, float] = {}
        for i in active:
            if i in self.stopped:
                continue
            result = self.members[i].finish(parts[i], results[i], ctx)
            for k, v in (result | scheds[i]).items():
                out[f"{k}/member{self.first + i}"] = v
        out = member_means(out)
        out["members_active"] = float(self.size - len(self.stopped))
        return out

    def _active(self) -> list[int]:
        """The members not stopped; when none is left, the run stops (exit status 3)."""
        active = [i for i in range(self.size) if i not in self.stopped]
        if not active:
            raise NonFiniteError(
                "every member of the population diverged: "
                + "; ".join(
                    f"member {self.first + i}: {why}" for i, why in sorted(self.stopped.items())
                )
            )
        return active

    def _check_estimates(self, flats: Mapping[int, TensorDictBase]) -> None:
        """Stop the members whose estimator gave a non-finite value, advantage or target
        (one host transfer for all)."""
        checked = [
            (i, key) for i in flats for key in _ESTIMATES if flats[i].get(key, None) is not None
        ]
        if not checked:
            return
        flags = torch.stack([torch.isfinite(flats[i].get(key)).all() for i, key in checked])
        for (i, key), ok in zip(checked, flags.tolist()):
            if not ok:
                name = key if isinstance(key, str) else "/".join(key)
                self.stop(i, f"non-finite {name} from its estimator at {self.frames:,} frames")

    def _check_parameters(self, active: list[int], saved) -> None:
        """A member whose update left non-finite parameters (a step that overflowed) is
        stopped with the parameters it had before the update (its last good ones)."""
        tensors = {i: _floating_tensors(self.members[i]) for i in active}
        flags = [
            torch.stack([torch.isfinite(t).all() for t in tensors[i]]).all()
            for i in active
            if tensors[i]
        ]
        if not flags:
            return
        for i, ok in zip([i for i in active if tensors[i]], torch.stack(flags).tolist()):
            if not ok:
                with torch.no_grad():
                    torch._foreach_copy_(tensors[i], saved[i])
                self.stop(
                    i,
                    f"non-finite parameters after its update at {self.frames:,} frames (its "
                    "parameters from before that update are kept)",
                )

    def _sequential_update(self, parts, ctx: Context) -> dict[str, float]:
        """Each member's own ``update`` on its rows, one after the other, with its own
        random stream and minibatch generator (as its standalone run's global stream and
        ``Context.generator``): exactly its standalone run's update. A member whose update
        raises :class:`NonFiniteError` is stopped (its optimisers step only after the check,
        so it keeps the parameters its last finite step left), as is one whose update leaves
        non-finite parameters (:meth:`_check_parameters`), and the others go on."""
        out: dict[str, float] = {}
        for i in self._active():
            member_ctx = dataclasses.replace(ctx, generator=self.generators[i])
            saved = _snapshot(self.members, [i])
            try:
                with self.rngs[i]:
                    result = self.members[i].update(parts[i], member_ctx)
            except NonFiniteError as err:
                self.stop(i, str(err))
            self._check_parameters([i], saved)
            if i in self.stopped:
                continue
            for k, v in result.items():
                out[f"{k}/member{self.first + i}"] = v
        out = member_means(out)
        out["members_active"] = float(self.size - len(self.stopped))
        return out

    def _train(self, active: list[int], flats, phases: Mapping[int, list], ctx: Context):
        """One phase through the update loop: every member's group trained for its epochs on
        its minibatches, the members' steps taken as one (:class:`_Phase`). Yields
        ``(member, metrics)``."""
        groups = {i: phases[i][0] for i in active}
        phase = _Phase(self, active, groups, phases, flats[active[0]].shape[0], ctx)
        group = self._loop_group(active, groups)
        group.loss.phase = phase
        group.transform_grads = phase.after_backward
        group.epochs = max(g.epochs for g in groups.values())
        regroup(group.optimizer, [groups[i].optimizer for i in active])
        data = _stack([flats[i] for i in active])
        try:
            update_loop([group], data, ctx, minibatches=phase.minibatches)
        finally:
            group.loss.phase = None
            group.transform_grads = None
        return [(i, phase.result(i)) for i in active]

    def _loop_group(self, active: list[int], groups: Mapping[int, LossGroup]) -> LossGroup:
        """The update loop's one group for these members' groups: their joint optimiser
        (:func:`joint_optimizer`) and :class:`_MembersLoss`, kept while the same optimisers
        train together (the loop checks a group's terms on its first step only)."""
        key = tuple(id(groups[i].optimizer) for i in active)
        group = self._loop_groups.get(key)
        if group is None:
            first = groups[active[0]]
            group = LossGroup(
                first.name,
                _MembersLoss(),
                joint_optimizer([groups[i].optimizer for i in active]),
                grad_name=first.grad_name,
            )
            self._loop_groups[key] = group
        return group

    def _vmap_groups(self, live: Sequence[int], groups) -> dict[tuple, list[int]]:
        by_key: dict[tuple, list[int]] = {}
        for i in live:
            key = (groups[i].name, *sorted(_plain_attributes(groups[i].loss).items()))
            by_key.setdefault(key, []).append(i)
        return by_key

    def _losses(self, idx: list[int], minibatch: TensorDictBase, rows: list[int], groups):
        """The loss outputs of members ``idx`` (equal hyperparameters; their minibatches in
        ``rows`` of ``minibatch``) as ``[len(idx)]`` tensors: one vmapped call, or the
        member's own loss when it is alone (exactly a standalone run's step)."""
        first = groups[idx[0]].loss
        if len(idx) == 1:
            return {k: v.unsqueeze(0) for k, v in first(minibatch[rows[0]]).items()}
        key = (groups[idx[0]].name, *sorted(_plain_attributes(first).items()))
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = _VmapGroup(first)
        group.sync(first)
        tensors = [self._tensors_of(groups[i].loss) for i in idx]
        if rows != list(range(minibatch.shape[0])):
            minibatch = minibatch[torch.tensor(rows)]
        return group(tensors, minibatch)

    def _tensors_of(self, loss: nn.Module) -> dict[str, torch.Tensor]:
        if id(loss) not in self._tensors:
            self._tensors[id(loss)] = _Networks(loss).tensors()
        return self._tensors[id(loss)]


#: what an estimator writes (``prepare``): a non-finite one stops its member
_ESTIMATES = (
    keys.STATE_VALUE,
    keys.NEXT_STATE_VALUE,
    keys.ADVANTAGE,
    keys.VALUE_TARGET,
    keys.INTRINSIC_ADVANTAGE,
    keys.INTRINSIC_VALUE_TARGET,
)


def _floating_tensors(member: Learner) -> list[torch.Tensor]:
    """A member's parameters and floating buffers (what a checkpoint requires finite)."""
    out = []
    for module in member.modules().values():
        out += [p.data for p in module.parameters()]
        out += [b for b in module.buffers() if b.is_floating_point()]
    return out


def _snapshot(members: Sequence[Learner], active: Sequence[int]) -> dict[int, list[torch.Tensor]]:
    """Copies of the active members' parameters and floating buffers (restored for one whose
    update leaves them non-finite: :meth:`PopulationLearner._check_parameters`)."""
    return {i: [t.detach().clone() for t in _floating_tensors(members[i])] for i in active}


# --------------------------------------------------------------------------- aggregates
# --------------------------------------------------------------------------- engine side
def rank_members(cfg, rank: int = 0, world_size: int = 1) -> tuple[int, list]:
    """``(first, members)``: the population-wide index of rank ``rank``'s first member and its
    contiguous block of ``cfg.population_members()`` (all of them on one rank). Raises
    ``ValueError`` naming the fix when the members do not split evenly over the ranks."""
    members = cfg.population_members()
    size = len(members)
    if size % world_size:
        fits = max(d for d in range(1, world_size + 1) if size % d == 0)
        if cfg.sweep:
            settings = size // cfg.population_seeds
            seeds = next(k for k in range(1, world_size + 1) if settings * k % world_size == 0)
            more = f"--population-seeds {seeds}"
        else:
            more = f"--population {world_size * math.ceil(size / world_size)}"
        raise ValueError(
            f"--population: {size} members do not split evenly over {world_size} processes "
            f"(each process trains the same number of members): train a multiple of "
            f"{world_size} members (e.g. {more}) or run on {fits} process(es) (--devices)"
        )
    per_rank = size // world_size
    first = rank * per_rank
    return first, members[first : first + per_rank]


def _has_memory(member: Learner) -> bool:
    """Whether a member carries a recurrent state (``--recurrent``): its update runs as its
    own, member after member (``torch.func.vmap`` has no rule for ``nn.LSTM`` / ``nn.GRU``)."""
    memory = getattr(member, "memory", None)
    return memory is not None and memory.on


def _warn_sequential(members: Sequence[Learner]) -> None:
    """One line: the members update one after another (a slower path is never silent; on
    stderr unless logging is set up)."""
    why = "its update has no vmapped form"
    if not members[0].population_sequential and _has_memory(members[0]):
        why = "torch.vmap has no rule for nn.LSTM / nn.GRU"
    elif not members[0].population_sequential:
        why = "its intrinsic reward trains in lockstep with the policy"
    _log.warning(
        f"warning: {members[0].algo} population: the {len(members)} members update one "
        f"after another ({why}), so an update costs about {len(members)}x one member's; "
        "collection and evaluation are still shared"
    )


def _own_update(member: Learner) -> bool:
    """Whether a member runs its own update, member after member: PPG, IMPALA, APPO
    (``population_sequential``), members with memory, and members with an intrinsic reward
    (two loss groups in lockstep)."""
    intrinsic = getattr(member, "intrinsic", None) is not None
    return member.population_sequential or _has_memory(member) or intrinsic


def build_population(build, cfg, env, *, rank: int = 0, world_size: int = 1) -> PopulationLearner:
    """``build(member_cfg, env)`` for every member of this rank's block of
    ``cfg.population_members()`` (:func:`rank_members`; all of them on one rank), each from
    the random state its standalone run would build from."""
    first, members = rank_members(cfg, rank, world_size)
    learners, states = [], []
    for seed, setting in members:
        member_cfg = dataclasses.replace(
            cfg, seed=seed, population=1, population_seeds=1, sweep=None, **setting
        )
        torch.manual_seed(seed)  # what the engine seeds a standalone run with
        learner = build(member_cfg, env)
        use_rows = getattr(learner, "use_rows", None)  # built on every member's rows
        if use_rows is not None:
            use_rows(cfg.num_envs)  # ... it trains on its own
        learners.append(learner)
        states.append(torch.get_rng_state())
    return PopulationLearner(
        learners,
        states,
        num_envs=cfg.num_envs,
        seeds=[seed for seed, _ in members],
        settings=[setting for _, setting in members],
        first=first,
        worker_seeds=[cfg.worker_seeds(seed) for seed, _ in members],
    )


def make_population_env(cfg, make_env, *, rank: int = 0, world_size: int = 1):
    """The training env of this rank's members (:func:`rank_members`), from
    ``make_env(num_envs=..., seed=..., **options)`` (the run's env source): ``P x num_envs``
    sub-envs, member ``i``'s seeded as its standalone run's; with ``--normalize-reward`` a
    :class:`~rlkit.modules.PopulationRewardNorm` gives each member its own reward statistics
    (and its own ``gamma``), where one :class:`~rlkit.modules.RewardNorm` would share them."""
    from rlkit.modules import PopulationRewardNorm

    _, members = rank_members(cfg, rank, world_size)
    options = population_env_options(cfg)  # what --sweep may not vary (rlkit/configs/base.py)
    normalize_reward = options.pop("normalize_reward", False)
    env = make_env(num_envs=cfg.num_envs * len(members), seed=env_seeds(cfg, members), **options)
    if normalize_reward:
        gammas = [s.get("gamma", cfg.gamma) for _, s in members]
        env.append_transform(PopulationRewardNorm(gammas, cfg.num_envs))
    return env


def env_seeds(cfg, members=None) -> list[int]:
    """Every sub-env's seed: member ``i``'s block is seeded as its standalone run's
    (``members``: a rank's block; default all of ``cfg.population_members()``)."""
    members = cfg.population_members() if members is None else members
    seeds = []
    for seed, _ in members:
        workers = cfg.worker_seeds(seed)
        if workers is None:  # the standalone run's own env
            seeds += [seed + k for k in range(cfg.num_envs)]
        else:  # its workers' envs, block by block
            per_worker = cfg.num_envs // len(workers)
            seeds += [w + k for w in workers for k in range(per_worker)]
    return seeds


def _label(setting: Mapping[str, Any]) -> str:
    return (
        ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in setting.items())
        or "default"
    )


class PopulationReport:
    """What a population run writes besides the usual files: per-member rows in
    ``metrics.csv`` / ``eval.csv`` (a ``member`` column), ``population.json`` (each member's
    settings and results, and per setting the IQM over seeds with its 95% bootstrap interval)
    and ``population.png`` (one curve per setting with its interval).

    On several ranks (``fabric.world_size > 1``) each rank's learner holds a block of the
    members; every rank calls :meth:`gather_batch` and :meth:`evaluate` (collectives), and
    rank 0 (the one whose log is enabled) writes the rows of all members.

    Args:
        learner: this process's :class:`PopulationLearner`.
        target: ``--target-return`` (or None).
        fabric: the launcher (its world size and rank); None for one process.
        members: ``(seed, settings)`` of every member of the population (default: the
            learner's).
    """

    def __init__(
        self,
        learner: PopulationLearner,
        target: float | None,
        *,
        fabric: Any = None,
        members: Sequence[tuple[int, Mapping[str, Any]]] | None = None,
    ) -> None:
        self.learner, self.target, self.fabric = learner, target, fabric
        if members is None:
            members = list(zip(learner.seeds, learner.settings))
        self.seeds = [int(seed) for seed, _ in members]
        self.settings = [dict(setting) for _, setting in members]
        self.size = len(members)
        self.solved: list[int | None] = [None] * self.size
        self.last: list[tuple[float, float]] = []
        #: every member that stopped (population-wide index: why), as of the last evaluation
        self.stopped: dict[int, str] = {}
        self._evaluator = None  # all members at once (deterministic evaluation)

    @property
    def world_size(self) -> int:
        return 1 if self.fabric is None else self.fabric.world_size

    def _gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (plain Python values), in rank order, on every rank."""
        if self.world_size == 1:
            return [obj]
        out: list[Any] = [None] * self.world_size
        torch.distributed.all_gather_object(out, obj)
        return out

    def _member_returns(self, batch: TensorDictBase) -> dict[int, list[float]]:
        n, first = self.learner.num_envs, self.learner.first
        return {
            first + i: episode_stats(batch[i * n : (i + 1) * n])[0]
            for i in range(self.learner.size)
        }

    # -- during the run
    def gather_batch(self, batch: TensorDictBase, metrics: Mapping[str, float]):
        """``(metrics, returns, lengths, member_returns)`` of this batch over all ranks: every
        member's metrics with their means, the episodes that ended (all members), and each
        member's ended episodes' returns (``None`` on one rank: read from the batch when a
        row is written). Every rank gets the same values, so every rank takes the same
        decisions (when to log, evaluate, stop)."""
        returns, lengths = episode_stats(batch)
        if self.world_size == 1:
            return dict(metrics), returns, lengths, None
        parts = self._gather((dict(metrics), returns, lengths, self._member_returns(batch)))
        merged: dict[str, float] = {}
        returns, lengths, member_returns = [], [], {}
        for m, r, lens, per_member in parts:
            merged |= {k: v for k, v in m.items() if "/member" in k}
            returns += r
            lengths += lens
            member_returns |= per_member
        out = member_means(merged)
        out["members_active"] = sum(float(m.get("members_active", 0.0)) for m, *_ in parts)
        return out, returns, lengths, member_returns

    def record(
        self,
        log,
        frames: int,
        batch: TensorDictBase,
        metrics: Mapping[str, float],
        member_returns: Mapping[int, list[float]] | None = None,
    ):
        """Write one ``metrics.csv`` row per member (``metrics`` and ``member_returns`` as
        :meth:`gather_batch` returns them)."""
        if not (log.enabled and log.scalars):
            return
        if member_returns is None:
            member_returns = self._member_returns(batch)
        rows: list[dict[str, Any]] = []
        for i in range(self.size):
            row: dict[str, Any] = {"frames": frames, "member": i}
            suffix = f"/member{i}"
            row |= {k[: -len(suffix)]: v for k, v in metrics.items() if k.endswith(suffix)}
            returns = member_returns.get(i)
            if returns:
                row["episode_return"] = sum(returns) / len(returns)
            rows.append(row)
        log.log_rows(frames, rows)  # metrics.csv, and the trackers as member<i>/<name>

    def _evaluate_members(self, evaluator) -> list[tuple[float, float]]:
        """Every member's mean and std evaluation return. Deterministic evaluation plays all
        members at once (one env of P blocks of the same episodes, each member's actor on its
        block); sampled evaluation plays them one after the other (each from the evaluation
        seed, as a standalone run does)."""
        learner = self.learner
        if not evaluator.deterministic or any(
            m.eval_policy() is not m.collect_policy() for m in learner.members
        ):
            return [self._evaluate_one(evaluator, i) for i in range(learner.size)]
        if self._evaluator is None:
            from rlkit.training.evaluation import Evaluator

            self._evaluator = Evaluator(
                evaluator.env_id,
                episodes=evaluator.episodes,
                device=evaluator.device,
                max_steps=evaluator.max_steps,
                deterministic=True,
                repeats=learner.size,
                **evaluator.make_kwargs,
            )
        returns = self._evaluator.returns(learner.member_policy()).reshape(learner.size, -1)
        return [
            (math.nan, math.nan)  # its policy gives no finite action: no return to report
            if i in learner.unplayable
            else (float(r.mean()), float(r.std(unbiased=False)) if r.numel() > 1 else 0.0)
            for i, r in enumerate(returns)
        ]

    def _evaluate_one(self, evaluator, i: int) -> tuple[float, float]:
        """Member ``i``'s own evaluation; NaN for a member whose policy gives non-finite
        outputs (it is stopped, if it was not yet)."""
        learner = self.learner
        if i not in learner.unplayable:
            try:
                return evaluator(learner.members[i].eval_policy())
            except (ValueError, RuntimeError) as err:  # a distribution refusing NaN
                learner.unplayable.add(i)
                learner.stop(i, f"its policy failed in evaluation ({_first_line(err)})")
        return math.nan, math.nan

    def evaluate(self, evaluator, counters, log) -> tuple[float, float]:
        """Evaluate every member (each rank its own members); returns the IQM of their means
        and the spread of the means (the same on every rank)."""
        parts = self._gather((self._evaluate_members(evaluator), self.learner.stopped_members()))
        self.last = [result for local, _ in parts for result in local]
        self.stopped = {i: why for _, stopped in parts for i, why in stopped.items()}
        means = [m for m, _ in self.last]
        if log.enabled:
            log.log_eval_rows(
                counters.frames,
                [
                    {
                        "frames": counters.frames,
                        "train_seconds": round(counters.train_seconds, 3),
                        "member": i,
                        "return_mean": mean,
                        "return_std": std,
                    }
                    for i, (mean, std) in enumerate(self.last)
                ],
            )
        for i, (mean, _) in enumerate(self.last):
            if self.target is not None and mean >= self.target and self.solved[i] is None:
                self.solved[i] = counters.frames
        import statistics

        means = [m for m in means if math.isfinite(m)]  # a member that diverged has none
        if not means:
            return math.nan, math.nan
        return iqm(means), statistics.pstdev(means) if len(means) > 1 else 0.0

    def setting_returns(self) -> list[tuple[str, list[float]]]:
        """The last evaluation's member means grouped by setting (labels in member order)."""
        groups: dict[str, list[float]] = {}
        for i, setting in enumerate(self.settings):
            mean = self.last[i][0] if i < len(self.last) else math.nan
            groups.setdefault(_label(setting), []).append(mean)
        return list(groups.items())

    def all_solved(self) -> bool:
        return all(s is not None for i, s in enumerate(self.solved) if i not in self.stopped)

    def state_dict(self) -> dict[str, Any]:
        return {"solved": list(self.solved)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.solved = list(state.get("solved", self.solved))

    # -- at the end
    def finish(self, run_dir, summary: dict[str, Any]) -> dict[str, Any]:
        """Write ``population.json`` and ``population.png`` (rank 0, after :meth:`evaluate`)."""
        members = []
        for i, (seed, setting) in enumerate(zip(self.seeds, self.settings)):
            mean, std = self.last[i] if i < len(self.last) else (math.nan, math.nan)
            members.append(
                {
                    "member": i,
                    "seed": seed,
                    "settings": setting,
                    "eval_return_mean": mean,
                    "eval_return_std": std,
                    "solved_frames": self.solved[i],
                    "stopped": self.stopped.get(i),
                }
            )
        by_setting: dict[str, list[dict]] = {}
        for m in members:
            by_setting.setdefault(_label(m["settings"]), []).append(m)
        aggregates = [setting_aggregate(label, group) for label, group in by_setting.items()]
        report = {
            "algo": summary.get("algo"),
            "env": summary.get("env"),
            "frames_per_member": summary.get("frames"),
            "members": members,
            "aggregates": aggregates,
            "target_return": self.target,
            "ci": (
                "95% percentile bootstrap of the IQM over seeds (2000 resamples), only for a "
                f"setting with at least {MIN_RUNS_FOR_INTERVAL} runs with a return; with "
                "fewer, final_return_ci95 is null: read final_returns"
            ),
        }
        self.aggregates = aggregates
        path = run_dir / "population.json"
        tmp = path.with_suffix(".json.tmp")
        import json

        tmp.write_text(json.dumps(report, indent=2, default=str) + "\n")
        tmp.replace(path)
        try:
            plot_population(run_dir, self.settings, title=f"{report['algo']} on {report['env']}")
        except Exception as err:  # a missing plot never fails a finished run
            print(f"warning: could not draw population.png: {err}".splitlines()[0])
        return report


def setting_aggregate(label: str, group: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One setting's members (``population.json``'s member entries) summarised: every
    member's final return (``final_returns``, seed order), their IQM over the members with a
    return (one whose policy diverged has none), and the IQM's 95% bootstrap interval only
    with :data:`MIN_RUNS_FOR_INTERVAL` such runs or more (else ``None``)."""
    finals = [m["eval_return_mean"] for m in group if math.isfinite(m["eval_return_mean"])]
    ci = None
    if len(finals) >= MIN_RUNS_FOR_INTERVAL:
        low, high = bootstrap_ci(finals)
        ci = [low, high]
    return {
        "settings": label,
        "members": [m["member"] for m in group],
        "seeds": [m["seed"] for m in group],
        "final_returns": [m["eval_return_mean"] for m in group],
        "runs": len(finals),
        "final_return_iqm": iqm(finals) if finals else math.nan,
        "final_return_ci95": ci,
        "solved": sum(m["solved_frames"] is not None for m in group),
    }


def aggregate_text(aggregate: Mapping[str, Any]) -> str:
    """A setting's result in words: ``lr=0.001: IQM 412.3, 95% CI [300.1, 500.0] over 3
    seeds``, or with fewer than :data:`MIN_RUNS_FOR_INTERVAL` runs the members' returns
    ``lr=0.001: 312.0, 500.0 (2 seeds, no interval)``."""
    label, runs = aggregate["settings"], len(aggregate["final_returns"])
    ci = aggregate["final_return_ci95"]
    if ci is not None:
        return (
            f"{label}: IQM {aggregate['final_return_iqm']:.1f}, 95% CI [{ci[0]:.1f}, "
            f"{ci[1]:.1f}] over {runs} seeds"
        )
    finals = ", ".join(f"{r:.1f}" for r in aggregate["final_returns"])
    seeds = f"{runs} seed" + ("s" if runs != 1 else "")
    return f"{label}: {finals} ({seeds}, no interval)"


def plot_population(run_dir, settings: Sequence[Mapping[str, Any]], *, title: str):
    """``population.png``: per setting, the IQM over its seeds of the evaluation return at each
    evaluation, with the 95% bootstrap interval as a band from
    :data:`~rlkit.training.runlog.MIN_RUNS_FOR_INTERVAL` seeds up, else each member's own
    curve (:func:`rlkit.training.runlog.plot_settings`)."""
    groups: dict[str, list[int]] = {}
    for i, setting in enumerate(settings):
        groups.setdefault(_label(setting), []).append(i)
    return plot_settings(Path(run_dir), groups, title=title, name="population.png")


# ------------------------------------------------------------------------------ the run mode
class PopulationRunReport(RunReport):
    """:class:`~rlkit.training.engine.RunReport` of a population: the episodes and
    evaluations of every member, on every rank (:class:`PopulationReport`), the per-member
    rows, ``population.json`` and ``population.png``."""

    replicated = False  # each rank holds its own block of members

    def __init__(self, learner: PopulationLearner, fabric, cfg) -> None:
        super().__init__(learner, fabric)
        self.population = PopulationReport(
            learner, cfg.target_return, fabric=fabric, members=cfg.population_members()
        )
        self._member_returns: Mapping[int, list[float]] | None = None

    def gather(self, batch, metrics):
        metrics, returns, lengths, self._member_returns = self.population.gather_batch(
            batch, metrics
        )
        return metrics, returns, lengths

    def write_rows(self, log, frames, batch, metrics) -> dict:
        self.population.record(log, frames, batch, metrics, self._member_returns)
        return {k: v for k, v in metrics.items() if "/member" not in k}

    def evaluate(self, evaluator, counters, log):
        mean, std = self.population.evaluate(evaluator, counters, log)
        return mean, std, {}

    def reached(self, mean: float, target: float) -> bool:
        return self.population.all_solved()

    def finish(self, run_dir, summary) -> dict[str, Any]:
        aggregates = self.population.finish(run_dir, dict(summary))["aggregates"]
        fps = round(summary["fps"] * self.population.size, 1)
        return {"population": aggregates, "population_fps": fps}

    def eval_text(self, mean: float, std: float) -> str:
        """A sweep's ``eval @`` progress line per setting (each setting's IQM over its
        members with a return, and how many), never one number across settings."""
        groups = self.population.setting_returns()
        if len(groups) < 2:
            return super().eval_text(mean, std)
        parts = []
        for label, means in groups:
            finite = [m for m in means if math.isfinite(m)]
            value = f"{iqm(finite):.1f}" if finite else "nan"
            parts.append(f"{label} {value} ({len(finite)}/{len(means)} seeds)")
        return "return per setting (IQM): " + "; ".join(parts)

    def result_text(self, mean: float, std: float) -> str:
        """The ``done:`` line's result per setting (rank 0, after :meth:`finish`)."""
        aggregates = getattr(self.population, "aggregates", None)
        if not aggregates:
            return super().result_text(mean, std)
        return "final eval return " + "; ".join(aggregate_text(a) for a in aggregates)

    def state_dict(self) -> dict[str, Any]:
        return self.population.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.population.load_state_dict(state)


class PopulationMode(RunMode):
    """A population (``--population N``, ``--sweep``) as a run mode of the engine: this
    rank's block of members (:func:`rank_members`) shares one env (:func:`make_population_env`)
    and one :class:`PopulationLearner` (:func:`build_population`), each member built by the
    recipe's own ``build`` with its own config; a batch counts one member's frames; a
    checkpoint holds each rank's members in its own file."""

    replicated = False  # each rank holds its own block of members

    def check(self, world_size: int) -> None:
        rank_members(self.cfg, 0, world_size)  # members that do not split evenly

    def make_env(self, make, *, rank: int, world_size: int):
        return make_population_env(self.cfg, make, rank=rank, world_size=world_size)

    def build(self, build, env, *, rank: int, world_size: int) -> PopulationLearner:
        learner = build_population(build, self.cfg, env, rank=rank, world_size=world_size)
        self.local_members = learner.size
        return learner

    def frames(self, batch: TensorDictBase, world_size: int) -> int:
        # a member's frames: the batch holds this rank's members' (each as many)
        return batch.numel() // self.local_members

    def reseed(self, env, learner, seed: int, frames: int, *, rank: int, world_size: int):
        """Each member's sub-envs from its standalone run's seeds (:func:`env_seeds`) plus
        ``frames``, and its worker streams as its standalone run's new workers."""
        from rlkit.envs import reseed

        _, members = rank_members(self.cfg, rank, world_size)
        reseed(env, [s + frames for s in env_seeds(self.cfg, members)])
        learner.restart_collection(frames)

    def resume(self, fabric, path, learner, counters, env_modules) -> dict:
        return _resume_rank_members(fabric, path, learner, counters, env_modules)

    def restore_streams(self, learner, payload) -> None:
        """The members' own streams again, as saved: building the collector called the
        policy once (its probe), which drew from them, where a standalone run's probe draws
        from the global stream before the engine restores it (measured: resumed PPO members
        were one draw ahead of their resumed standalone runs)."""
        for stream, state in zip(learner.rngs, payload["learner"].get("rng", ())):
            stream.state = state.clone()

    def warm_start(self, fabric, path, learner) -> None:
        # its ranks hold different members: nothing is broadcast; the ranks agree on a refusal
        _on_every_rank(fabric, lambda: _warm_start_members(path, learner))

    def report(self, learner, fabric) -> PopulationRunReport:
        return PopulationRunReport(learner, fabric, self.cfg)


def _resume_rank_members(fabric, path: Path, learner, counters, env_modules) -> dict:
    """Restore this rank's block of a population's members from its own file of the save
    ``path`` (rank 0's: ``path``; rank r's: :func:`rank_checkpoint_path`).

    Each rank's file holds only its own members, so a rank cannot fall back to another's
    copy, and the checkpoint must come from as many ranks as now (the members' split). The
    ranks agree on the outcome (:func:`~rlkit.training.engine._on_every_rank`)."""
    rank, world = fabric.global_rank, fabric.world_size

    def restore() -> dict:
        head = ckpt.load(path)
        saved = int(head.get("world_size", 1))
        if saved != world:
            raise ckpt.CheckpointError(
                f"checkpoint {str(path)!r} holds a population split over {saved} process(es), "
                f"each file its own block of members; resume it on {saved} (--devices "
                f"{saved}), or start a new run"
            )
        own = rank_checkpoint_path(path, rank)
        payload = head if rank == 0 else ckpt.load(own)
        if rank > 0 and (
            payload.get("save_id") is None or payload["save_id"] != head.get("save_id")
        ):
            raise ckpt.CheckpointError(
                f"{str(own)!r} was not written by the same save as {str(path)!r} (a run "
                "stopped between the ranks' writes): resume from an earlier checkpoint "
                f"(--resume {path.parent}/frames_<N>.pt) written by every rank"
            )
        _apply(payload, own, learner, counters, env_modules)
        return payload

    return _on_every_rank(fabric, restore)


def _warm_start_members(path: Path, learner) -> None:
    """``--init-from`` for a population: every member's modules (by population-wide name)
    must be in ``path``; a missing one is refused instead of training from scratch."""
    payload = ckpt.load(path)
    missing = [name for name in learner.modules() if name not in payload["modules"]]
    if missing:
        raise ckpt.CheckpointError(
            f"--init-from {str(path)!r} has no module {missing[0]!r} ({len(missing)} of this "
            "process's members' modules missing): warm start a population from a checkpoint "
            "of a population with as many members, written by one process (a checkpoint of "
            "several processes keeps each one's members in its own file)"
        )
    _warm_start(path, learner)
