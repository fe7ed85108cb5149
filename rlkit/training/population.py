r"""Populations: P independent members of one recipe trained as one vectorised run.

A member is an ordinary learner built by the recipe's ``build`` from its own config (its
seed, its hyperparameters); :class:`PopulationLearner` holds P of them and presents them to
the engine as one learner:

* **collection**: one vector env of ``P x num_envs`` sub-envs, member ``i`` acting in rows
  ``[i N, (i + 1) N)`` seeded as its standalone run's env (``seed_i + k``);
  :class:`PopulationPolicy` runs each member's actor on its rows and samples with the
  member's own random stream (the global stream of its standalone run, swapped in and out),
  so a member draws the actions its standalone run draws;
* **update**: each member's estimator on its own rows, then the epochs and minibatches of the
  shared update loop with the loss of all members computed in one ``torch.vmap`` (members
  whose losses hold the same hyperparameters are vmapped together: a sweep over
  ``clip_epsilon`` runs one vmapped call per value), one backward, and per member the
  engine's optimiser step (gradient clipping, the NaN check, its own optimiser and learning
  rate). Minibatch orders come from per-member generators seeded as a standalone run's;
* **divergence**: a member whose gradient turns non-finite is stopped (it keeps its last
  good parameters and is reported); the others go on.

Member ``i`` of a population and a standalone run with the same seed and settings end at the
same parameters (``tests/test_population.py``: within 1e-5 after several updates, four
members with four different settings).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

from rlkit import keys
from rlkit.modules import direct
from rlkit.training.engine import Context, Learner, NonFiniteError
from rlkit.training.update import MeanMetrics, _group_terms, _merge_scalars, _validate

__all__ = ["PopulationLearner", "PopulationPolicy", "member_key"]


def member_key(index: int, name: str) -> str:
    """The name under which member ``index``'s module or optimiser ``name`` is checkpointed."""
    return f"member{index}.{name}"


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


class PopulationPolicy(nn.Module):
    """The collection policy of a population: member ``i``'s actor on rows ``[i N, (i+1) N)``,
    sampling from the member's own random stream."""

    def __init__(self, actors: Sequence[nn.Module], rngs: Sequence[_MemberRNG], rows: int):
        super().__init__()
        self.actors = nn.ModuleList(actors)
        self.rngs = list(rngs)
        self.rows = rows
        self.active = [True] * len(actors)
        self.in_keys = list(actors[0].in_keys)
        self.out_keys = list(actors[0].out_keys)

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
        n = self.rows
        parts: list[dict[str, torch.Tensor]] = []
        for i, (actor, rng) in enumerate(zip(self.actors, self.rngs)):
            rows = td[i * n : (i + 1) * n]
            with rng:
                out = direct.actor_sample(actor, rows)
                if out is None:
                    out = actor(rows.select(*self.in_keys)).select(*self.out_keys).to_dict()
            parts.append(out)
        merged = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
        td.update(merged)
        return td


class _VmapGroup:
    """Members whose losses hold the same hyperparameters: one vmapped loss call."""

    def __init__(self, loss: nn.Module) -> None:
        self.template = copy.deepcopy(loss)
        self.holder = nn.ModuleDict({"actor": self.template.actor, "critic": self.template.critic})

    def sync(self, loss: nn.Module) -> None:
        """Copy the member loss's plain attributes (schedules change them every update)."""
        for name, value in _plain_attributes(loss).items():
            self.template.__dict__[name] = value

    def __call__(self, params: TensorDictBase, minibatch: TensorDictBase) -> dict[str, Any]:
        def one(p: TensorDictBase, mb: TensorDictBase) -> dict[str, torch.Tensor]:
            with p.to_module(self.holder):
                out = self.template(mb)
            return dict(out.items())

        return torch.vmap(one, randomness="different")(params, minibatch)


def _plain_attributes(loss: nn.Module) -> dict[str, Any]:
    """The loss's hyperparameters: public plain attributes and rlkit's validated ones
    (``Hyperparameter`` descriptors keep theirs in ``_hyperparameter_<name>``)."""
    return {
        k: v
        for k, v in loss.__dict__.items()
        if isinstance(v, (bool, int, float, str, type(None)))
        and (not k.startswith("_") or k.startswith("_hyperparameter_"))
    }


def _member_params(learner) -> TensorDictBase:
    return TensorDict.from_module(
        nn.ModuleDict({"actor": learner.loss.actor, "critic": learner.loss.critic})
    )


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
    """

    def __init__(
        self,
        members: Sequence[Learner],
        rng_states: Sequence[torch.Tensor],
        *,
        num_envs: int,
        seeds: Sequence[int],
        settings: Sequence[Mapping[str, Any]],
    ) -> None:
        if not members:
            raise ValueError("a population needs at least one member")
        for m in members:
            groups = m.loss_groups() if hasattr(m, "loss_groups") else None
            if groups is None or len(groups) != 1 or type(m).update is not type(members[0]).update:
                raise ValueError(
                    f"--population trains learners with one loss group and the shared update "
                    f"(ppo, a2c); {m.algo} updates its own way: drop --population"
                )
        self.members = list(members)
        self.algo = members[0].algo
        self.num_envs = num_envs
        self.seeds = list(seeds)
        self.settings = [dict(s) for s in settings]
        self.rngs = [_MemberRNG(s.clone()) for s in rng_states]
        self.generators = [torch.Generator().manual_seed(int(s)) for s in seeds]
        self.stopped: dict[int, str] = {}
        self._policy = PopulationPolicy([m.collect_policy() for m in members], self.rngs, num_envs)
        self._groups: dict[tuple, _VmapGroup] = {}

    # ---------------------------------------------------------------- Learner interface
    @property
    def size(self) -> int:
        return len(self.members)

    def modules(self) -> dict[str, nn.Module]:
        return {
            member_key(i, k): v for i, m in enumerate(self.members) for k, v in m.modules().items()
        }

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {
            member_key(i, k): v
            for i, m in enumerate(self.members)
            for k, v in m.optimizers().items()
        }

    @property
    def frames_per_batch(self) -> int:
        return sum(m.frames_per_batch for m in self.members)

    def collect_policy(self) -> nn.Module:
        return self._policy

    def eval_policy(self) -> nn.Module:
        return self.members[0].eval_policy()

    def member_eval_policies(self) -> list[nn.Module]:
        return [m.eval_policy() for m in self.members]

    def state_dict(self) -> dict[str, Any]:
        return {
            "members": [m.state_dict() for m in self.members],
            "rng": [r.state for r in self.rngs],
            "generators": [g.get_state() for g in self.generators],
            "stopped": {str(i): why for i, why in self.stopped.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for m, s in zip(self.members, state.get("members", ())):
            m.load_state_dict(s)
        for r, s in zip(self.rngs, state.get("rng", ())):
            r.state = s.clone()
        for g, s in zip(self.generators, state.get("generators", ())):
            g.set_state(s)
        self.stopped = {int(i): why for i, why in state.get("stopped", {}).items()}

    # ---------------------------------------------------------------- the update
    def _split(self, batch: TensorDictBase) -> list[TensorDictBase]:
        n = self.num_envs
        return [batch[i * n : (i + 1) * n] for i in range(self.size)]

    def update(self, batch: TensorDictBase, ctx: Context) -> dict[str, float]:
        parts = self._split(batch)
        active = [i for i in range(self.size) if i not in self.stopped]
        scheds: dict[int, dict[str, float]] = {}
        flats: dict[int, TensorDictBase] = {}
        for i in active:
            m = self.members[i]
            scheds[i] = m.apply_schedules(ctx.progress)
            with torch.no_grad():
                m.estimator(parts[i])
                if m.adv_norm is not None:
                    m.adv_norm(parts[i], samples=parts[i].get(keys.ADVANTAGE))
            flats[i] = parts[i].reshape(-1)
        results = self._train(active, flats, ctx)
        out: dict[str, float] = {}
        for i in active:
            if i in self.stopped:
                continue
            self.members[i].after_update(parts[i], results[i], ctx)
            for k, v in (results[i] | scheds[i]).items():
                out[f"{k}/member{i}"] = v
        for k in {k.split("/member")[0] for k in out}:
            values = [v for name, v in out.items() if name.split("/member")[0] == k]
            out[k] = sum(values) / len(values)
        out["members_active"] = float(self.size - len(self.stopped))
        return out

    def _train(
        self, active: list[int], flats: Mapping[int, TensorDictBase], ctx: Context
    ) -> dict[int, dict[str, float]]:
        groups = {i: self.members[i].loss_groups()[0] for i in active}
        for i in active:
            _validate([groups[i]])
        stats = {i: MeanMetrics() for i in active}
        epochs = groups[active[0]].epochs
        for epoch in range(epochs):
            batches = {
                i: list(self.members[i]._minibatches(flats[i], self.generators[i]))
                for i in active
                if i not in self.stopped
            }
            for i in batches:
                self.members[i].loss.diagnostics = epoch == epochs - 1
            steps = min(len(b) for b in batches.values())
            for step in range(steps):
                live = [i for i in batches if i not in self.stopped]
                self._step(live, {i: batches[i][step] for i in live}, groups, ctx, stats)
        return {i: stats[i].result() for i in active}

    def _vmap_groups(self, live: Sequence[int]) -> dict[tuple, list[int]]:
        by_key: dict[tuple, list[int]] = {}
        for i in live:
            attrs = _plain_attributes(self.members[i].loss)
            by_key.setdefault(tuple(sorted(attrs.items())), []).append(i)
        return by_key

    def _step(self, live, minibatches, groups, ctx, stats) -> None:
        for i in live:
            groups[i].optimizer.zero_grad(set_to_none=True)
        totals: dict[int, torch.Tensor] = {}
        outs: dict[int, dict] = {}
        backward: list[torch.Tensor] = []
        for key, idx in self._vmap_groups(live).items():
            group = self._groups.get(key)
            if group is None:
                group = self._groups[key] = _VmapGroup(self.members[idx[0]].loss)
            group.sync(self.members[idx[0]].loss)
            params = torch.stack([_member_params(self.members[i]) for i in idx])
            mbs = torch.stack([minibatches[i] for i in idx])
            out = group(params, mbs)
            for j, i in enumerate(idx):
                outs[i] = {k: v[j] for k, v in out.items()}
                names = _group_terms(groups[i], outs[i], [groups[i]])
                totals[i] = sum(outs[i][t] for t in names)
                backward.append(totals[i])
        torch.stack(backward).sum().backward()
        for i in live:
            g = groups[i]
            merged: dict[str, torch.Tensor] = {}
            _merge_scalars(merged, outs[i], 1.0)
            try:
                merged[g.grad_name] = ctx.step_optimizer(
                    g.optimizer, max_grad_norm=g.max_grad_norm, loss=totals[i].detach()
                )
            except NonFiniteError as err:
                self.stopped[i] = str(err)
                self._policy.active[i] = False
                g.optimizer.zero_grad(set_to_none=True)
                continue
            stats[i].add(merged)


# --------------------------------------------------------------------------- aggregates
def iqm(values: Sequence[float]) -> float:
    """Interquartile mean: the mean of the middle 50% of ``values`` (Agarwal et al. 2021),
    with the quartile boundaries splitting a value by weight when ``n`` is not a multiple
    of 4 (as ``scipy.stats.trim_mean`` does not; rliable uses this fractional form)."""
    x = sorted(float(v) for v in values)
    n = len(x)
    if n == 0:
        raise ValueError("iqm of no values")
    lo, hi = n / 4, 3 * n / 4
    total = 0.0
    for i, v in enumerate(x):  # the weight of sample i inside [lo, hi]
        w = max(0.0, min(i + 1, hi) - max(i, lo))
        total += w * v
    return total / (hi - lo)


def bootstrap_ci(
    values: Sequence[float], *, reps: int = 2000, level: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of the IQM over runs (the rliable protocol's
    stratified bootstrap, with one task: runs are resampled with replacement)."""
    import numpy as np

    x = np.asarray(values, dtype=np.float64)
    rng = np.random.default_rng(seed)
    stats = [iqm(x[rng.integers(0, len(x), len(x))]) for _ in range(reps)]
    low, high = np.quantile(stats, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)
