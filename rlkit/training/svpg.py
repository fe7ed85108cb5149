r"""SVPG's learner: P actor-critic particles evaluated as one batch, updated by the Stein
variational policy gradient.

Pieces, bottom up:

* :class:`StackedNetworks` holds ``P`` networks of one architecture with every parameter
  stacked along a leading particle dim ``[P, ...]`` (``torch.func.stack_module_state``); its
  forward runs all particles at once with ``torch.vmap`` over ``torch.func.functional_call``.
* :class:`ParticleRouter` routes the rows of an ``[N, ...]`` input to particles: row ``r``
  is scored by particle :func:`particle_index` ``= floor(r P / N)``, i.e. equal contiguous
  blocks of ``N / P`` rows when ``P`` divides ``N``. The training envs of a rank and the
  evaluation episodes are rows, so env ``e`` of ``num_envs`` acts with particle
  ``e // (num_envs / P)`` and evaluation episode ``e`` with ``e // (episodes / P)``.
* :func:`particle_ensemble` turns ``P`` TorchRL modules (``ProbabilisticActor``,
  ``ValueOperator``) into one module of the same kind whose network is a router over the
  stacked networks, so losses, estimators, collectors and the evaluator use it unchanged.
* :class:`ParticlePolicy` is the collection / evaluation policy: the ensemble actor plus
  ``keys.PARTICLE`` ``[N]`` (int64), the particle that acted in each row.
* :class:`SVPGLearner` runs each particle as an A2C learner on its own envs (its own actor
  and critic; the loss is the sum of the particles' losses, so each particle receives its
  own A2C gradient), then, between the cross-rank gradient all-reduce and the optimiser
  step (``Context.optimize(transform_grads=...)``), clips each particle's gradient and
  replaces the actors' gradients with the Stein update
  (:func:`rlkit.objectives.svpg.stein_update`): ``grad = -phi``. The critics are trained
  as plain A2C critics, not Stein-mixed (as in pyrado, where each particle's value function
  has its own optimiser): the kernel is a distance between policies.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictModuleBase, TensorDictSequential
from torch import Tensor, nn

from rlkit import keys
from rlkit.objectives.functional import standardize
from rlkit.objectives.svpg import median_bandwidth, rbf_kernel, stein_update
from rlkit.training import schedules
from rlkit.training.engine import Context, Learner
from rlkit.training.update import LossGroup, MeanMetrics, update_loop

__all__ = [
    "ParticlePolicy",
    "ParticleRouter",
    "StackedNetworks",
    "SVPGLearner",
    "build_particles",
    "particle_ensemble",
    "particle_index",
    "stacked_networks",
]

Output = Tensor | tuple[Tensor, ...]


def _check_num_particles(num_particles: Any) -> int:
    if isinstance(num_particles, bool) or not isinstance(num_particles, int):
        raise TypeError(f"the number of particles must be an int, got {num_particles!r}")
    if num_particles < 1:
        raise ValueError(
            f"SVPG needs at least 1 particle, got {num_particles} (--particles 4 is the default)"
        )
    return num_particles


def particle_index(rows: int, num_particles: int, *, device=None) -> Tensor:
    """The particle of each of ``rows`` rows, ``floor(r P / rows)``, int64 ``[rows]``.

    With ``P`` dividing ``rows`` these are equal contiguous blocks:
    ``particle_index(8, 4) = [0, 0, 1, 1, 2, 2, 3, 3]``.
    """
    _check_num_particles(num_particles)
    return torch.arange(rows, device=device) * num_particles // rows


def _map(fn: Callable[[Tensor], Tensor], out: Output) -> Output:
    return tuple(fn(o) for o in out) if isinstance(out, tuple) else fn(out)


class StackedNetworks(nn.Module):
    r"""``P`` networks of one architecture run as one: parameters stacked ``[P, ...]``.

    ``forward(x)`` takes ``x`` ``[P, *B, *F]`` (particle first) and returns
    ``[P, *B, *out]``: :math:`y_p = f(x_p; \theta_p)` for every ``p`` in one vmapped call.
    Parameters live in ``self.stacked`` (one ``nn.Parameter`` per parameter of the
    architecture, in ``self.names`` order), so a single optimiser, checkpoint and gradient
    all-reduce see all particles; ``flat_parameters()`` / ``flat_grads()`` give them as
    ``[P, D]`` rows.

    Args:
        members: the ``P >= 1`` networks (plain ``nn.Module`` tensor -> tensor(s));
            their current values are copied in. Buffers are not supported (running
            statistics would have to be shared or reduced; SVPG's recipe does not use them).
    """

    def __init__(self, members: Sequence[nn.Module]) -> None:
        super().__init__()
        members = list(members)
        _check_num_particles(len(members))
        shapes = [[(n, p.shape) for n, p in m.named_parameters()] for m in members]
        if any(s != shapes[0] for s in shapes):
            raise ValueError("the particle networks must share one architecture")
        if any(True for m in members for _ in m.buffers()):
            raise ValueError(
                "StackedNetworks does not stack buffers (running statistics): build the "
                "particle networks without observation normalisation"
            )
        params, _ = torch.func.stack_module_state(members)
        self.names = list(params)
        self.stacked = nn.ParameterList([nn.Parameter(params[n].detach()) for n in self.names])
        # the architecture only (no storage), outside the module tree so it is neither a
        # parameter nor moved by .to(); functional_call substitutes the stacked values
        self._base = (copy.deepcopy(members[0]).to("meta"),)

    @property
    def num_particles(self) -> int:
        return self.stacked[0].shape[0]

    def _call(self, params: dict[str, Tensor], x: Tensor) -> Output:
        return torch.func.functional_call(self._base[0], params, (x,))

    def forward(self, x: Tensor) -> Output:
        if x.shape[0] != self.num_particles:
            raise ValueError(
                f"StackedNetworks expects the particle dim first: input of shape "
                f"{list(x.shape)} for {self.num_particles} particles (use ParticleRouter "
                "for [rows, ...] inputs)"
            )
        params = dict(zip(self.names, self.stacked))
        return torch.vmap(self._call)(params, x)

    def flat_parameters(self) -> Tensor:
        """``[P, D]``: each particle's parameters flattened in ``self.names`` order."""
        p = self.num_particles
        return torch.cat([t.detach().reshape(p, -1) for t in self.stacked], dim=1)

    def flat_grads(self) -> Tensor:
        """``[P, D]``: each particle's ``.grad`` flattened like :meth:`flat_parameters`
        (zeros where a parameter has no gradient)."""
        p = self.num_particles
        return torch.cat(
            [
                (t.grad if t.grad is not None else torch.zeros_like(t)).reshape(p, -1)
                for t in self.stacked
            ],
            dim=1,
        )

    def set_flat_grads(self, grads: Tensor) -> None:
        """Write ``[P, D]`` rows back into the parameters' ``.grad``."""
        offset = 0
        for t in self.stacked:
            n = t[0].numel()
            value = grads[:, offset : offset + n].reshape(t.shape)
            if t.grad is None:
                t.grad = value.clone()
            else:
                t.grad.copy_(value)
            offset += n


class ParticleRouter(nn.Module):
    """Scores row ``r`` of an ``[N, ...]`` input with particle :func:`particle_index`.

    When ``P`` divides ``N`` the input is viewed as ``[P, N/P, ...]`` (no copy, one
    vmapped forward). Otherwise (e.g. a 1-row video episode) every particle scores every
    row and row ``r`` keeps its own particle's output.
    """

    def __init__(self, networks: StackedNetworks) -> None:
        super().__init__()
        self.networks = networks

    def forward(self, x: Tensor) -> Output:
        n, p = x.shape[0], self.networks.num_particles
        if n % p == 0:
            out = self.networks(x.reshape(p, n // p, *x.shape[1:]))
            return _map(lambda o: o.reshape(n, *o.shape[2:]), out)
        out = self.networks(x.unsqueeze(0).expand(p, *x.shape))
        rows = torch.arange(n, device=x.device)
        owner = particle_index(n, p, device=x.device)
        return _map(lambda o: o[owner, rows], out)


def _network_slot(module: nn.Module) -> TensorDictModule:
    """The one ``TensorDictModule`` inside ``module`` that wraps a plain network."""
    slots = [
        m
        for m in module.modules()
        if isinstance(m, TensorDictModule)
        and not isinstance(m, TensorDictSequential)
        and not isinstance(m.module, TensorDictModuleBase)
    ]
    if len(slots) != 1:
        raise TypeError(
            f"{type(module).__name__} must hold exactly one TensorDictModule around a plain "
            f"network (as make_actor / make_value build), found {len(slots)}"
        )
    return slots[0]


def particle_ensemble(members: Sequence[nn.Module]) -> nn.Module:
    """``P`` TensorDict modules of one kind -> one module scoring rows by particle.

    The result is a copy of ``members[0]`` (same keys, distribution, spec) whose network
    is a :class:`ParticleRouter` over the members' networks stacked; the members keep
    their own parameters (the stack holds copies).
    """
    members = list(members)
    _check_num_particles(len(members))
    nets = [_network_slot(m).module for m in members]
    ensemble = copy.deepcopy(members[0])
    _network_slot(ensemble).module = ParticleRouter(StackedNetworks(nets))
    return ensemble


def stacked_networks(module: nn.Module) -> StackedNetworks:
    """The :class:`StackedNetworks` inside an ensemble built by :func:`particle_ensemble`."""
    found = [m for m in module.modules() if isinstance(m, StackedNetworks)]
    if len(found) != 1:
        raise TypeError(
            f"expected one StackedNetworks inside {type(module).__name__} (build it with "
            f"particle_ensemble), found {len(found)}"
        )
    return found[0]


class ParticlePolicy(TensorDictModuleBase):
    """The ensemble actor, also writing ``keys.PARTICLE`` ``[N]`` int64 (who acted)."""

    def __init__(self, actor: nn.Module) -> None:
        super().__init__()
        self.actor = actor
        self.num_particles = stacked_networks(actor).num_particles
        self.in_keys = list(actor.in_keys)
        self.out_keys = [*actor.out_keys, keys.PARTICLE]

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        tensordict = self.actor(tensordict)
        rows = tensordict.batch_size[0]
        index = particle_index(rows, self.num_particles, device=tensordict.device)
        tensordict.set(keys.PARTICLE, index)
        return tensordict


def build_particles(
    env, *, num_particles: int, hidden: Sequence[int] = (64, 64), activation: str = "tanh"
) -> tuple[nn.Module, nn.Module]:
    """``num_particles`` independently initialised actors and V critics sized from ``env``,
    as two ensembles (:func:`particle_ensemble`): ``(actor, critic)``."""
    from rlkit.modules import make_actor, make_value

    _check_num_particles(num_particles)
    net = dict(hidden=tuple(hidden), activation=activation)
    obs_spec, act_spec = env.observation_spec, env.action_spec
    actors = [make_actor(obs_spec, act_spec, **net) for _ in range(num_particles)]
    critics = [make_value(obs_spec, **net) for _ in range(num_particles)]
    return particle_ensemble(actors), particle_ensemble(critics)


class SVPGLearner(Learner):
    r"""Stein variational policy gradient over ``P`` actor-critic particles.

    Per batch ``[N, T]`` (``N`` envs of this rank, env ``e`` acting with particle
    ``e // (N / P)``):

    1. the estimator (e.g. GAE) writes ``advantage`` / ``value_target`` with each env's own
       particle's critic; with ``normalize_advantage`` they are standardised per particle;
    2. the loss (e.g. ``A2CLoss``) averages over all ``N T`` samples, i.e.
       :math:`\frac1P\sum_p L_p`; it is multiplied by ``P`` so particle ``p``'s parameters
       receive exactly :math:`\nabla L_p`, the gradient an A2C learner on its envs computes;
    3. ``Context.optimize`` back-propagates and all-reduces across ranks, then the
       transform: each particle's gradient (actor and critic together) is clipped to
       ``max_grad_norm``, and the actors' gradients :math:`g_p = -\nabla J(\theta_p)` are
       replaced by :math:`-\phi_p`, :math:`\phi = ` :func:`~rlkit.objectives.svpg.stein_update`
       (``theta`` the actors' flattened parameters, ``grads = -g``); the critics keep their
       clipped A2C gradients;
    4. the optimiser steps (elementwise optimisers such as RMSprop or Adam on stacked
       parameters are exactly ``P`` independent optimisers).

    Args:
        actor: actor ensemble from :func:`particle_ensemble` (or :func:`build_particles`).
        critic: critic ensemble with the same number of particles.
        estimator: writes ``keys.ADVANTAGE`` and ``keys.VALUE_TARGET`` (``rlkit.value.GAE``
            built with ``value_network=critic``).
        loss: returns ``loss_*`` terms, built on ``actor`` and ``critic`` with
            ``normalize_advantage=False`` (use this learner's flag, which is per particle).
        optimizer: over ``actor`` and ``critic`` parameters.
        frames_per_batch: ``N T`` per rank.
        temperature: SVPG's :math:`\alpha > 0`.
        bandwidth: fixed kernel width ``h``; ``None`` (default): the median heuristic.
        max_grad_norm: per-particle gradient clipping before the Stein mixing (0 or None:
            off).
        epochs: full-batch gradient steps per batch (A2C: 1).
        normalize_advantage: standardise the advantage within each particle's samples.
        lr_schedule: ``(start, end)`` learning rate annealed linearly over the frame budget;
            ``None``: constant.
    """

    algo = "svpg"

    def __init__(
        self,
        *,
        actor: nn.Module,
        critic: nn.Module,
        estimator: nn.Module,
        loss: nn.Module,
        optimizer: torch.optim.Optimizer,
        frames_per_batch: int,
        temperature: float,
        bandwidth: float | None = None,
        max_grad_norm: float | None = 0.5,
        epochs: int = 1,
        normalize_advantage: bool = False,
        lr_schedule: tuple[float, float] | None = None,
    ) -> None:
        self.actor_nets, self.critic_nets = stacked_networks(actor), stacked_networks(critic)
        self.num_particles = self.actor_nets.num_particles
        if self.critic_nets.num_particles != self.num_particles:
            raise ValueError(
                f"the actor has {self.num_particles} particles but the critic has "
                f"{self.critic_nets.num_particles}: build both with the same count"
            )
        if not (isinstance(temperature, int | float) and temperature > 0):
            raise ValueError(
                f"temperature must be > 0, got {temperature!r} (--temperature; the SVPG "
                "paper searches 0.001 to 10)"
            )
        if bandwidth is not None and not bandwidth > 0:
            raise ValueError(f"bandwidth must be > 0 or None (median heuristic), got {bandwidth}")
        if epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {epochs}")
        self.actor, self.critic, self.estimator, self.loss = actor, critic, estimator, loss
        self.optimizer, self._frames_per_batch = optimizer, frames_per_batch
        self.temperature, self.bandwidth = float(temperature), bandwidth
        self.max_grad_norm, self.epochs = max_grad_norm, epochs
        self.normalize_advantage, self.lr_schedule = normalize_advantage, lr_schedule
        self.policy = ParticlePolicy(actor)
        self.nets = nn.ModuleDict({"actor": actor, "critic": critic})
        self.last_transform: dict[str, Tensor] = {}
        self._pending: list[dict[str, Tensor]] = []

    # ---------------------------------------------------------------- Learner interface
    def modules(self) -> dict[str, nn.Module]:
        return dict(self.nets.items())

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"optimizer": self.optimizer}

    @property
    def frames_per_batch(self) -> int:
        return self._frames_per_batch

    def collect_policy(self) -> nn.Module:
        return self.policy

    def eval_policy(self) -> nn.Module:
        """All particles: evaluation episode ``e`` of ``E`` runs particle ``e // (E / P)``,
        so with ``P`` dividing ``E`` the mean return is the mean over particles."""
        return self.policy

    # ---------------------------------------------------------------- the Stein transform
    def clip_per_particle(self) -> Tensor:
        """Scale each particle's gradient (actor and critic together) to norm at most
        ``max_grad_norm``; returns the norms before clipping, ``[P]``."""
        params = [*self.actor_nets.stacked, *self.critic_nets.stacked]
        grads = [t.grad for t in params if t.grad is not None]
        p = self.num_particles
        sq = sum(g.reshape(p, -1).square().sum(dim=1) for g in grads)
        norms = sq.sqrt() if grads else torch.zeros(p)
        if self.max_grad_norm:
            scale = (self.max_grad_norm / (norms + 1e-6)).clamp(max=1.0)
            for g in grads:
                g.mul_(scale.view(p, *([1] * (g.dim() - 1))))
        return norms

    def transform_grads(self) -> None:
        """Per-particle clipping, then the actors' ``.grad = -phi`` (see the class doc)."""
        norms = self.clip_per_particle()
        theta = self.actor_nets.flat_parameters()
        policy_grads = -self.actor_nets.flat_grads()  # ascent direction
        h = median_bandwidth(theta) if self.bandwidth is None else self.bandwidth
        phi = stein_update(theta, policy_grads, temperature=self.temperature, bandwidth=h)
        self.actor_nets.set_flat_grads(-phi)
        kernel, repulsion = rbf_kernel(theta, bandwidth=h)
        p = self.num_particles
        off = (kernel.sum() - p) / max(p * (p - 1), 1)
        self.last_transform = {
            "grad_norm": norms.mean(),
            "kernel_bandwidth": torch.as_tensor(h, dtype=torch.float32),
            "kernel_offdiag_mean": off,
            "drive_norm": (kernel @ policy_grads / self.temperature / p).norm(dim=1).mean(),
            "repulsion_norm": (repulsion / p).norm(dim=1).mean(),
        }

    # ---------------------------------------------------------------- the update
    def _check_layout(self, batch: TensorDictBase) -> None:
        acted = batch.get(keys.PARTICLE, None)
        if acted is None:
            raise KeyError(
                f"the batch has no {keys.describe(keys.PARTICLE)}: collect it with "
                "learner.collect_policy() (ParticlePolicy writes which particle acted)"
            )
        expected = particle_index(batch.shape[0], self.num_particles, device=acted.device)
        if not torch.equal(acted[:, 0], expected):
            raise ValueError(
                f"{keys.describe(keys.PARTICLE)} does not match the routing env e -> "
                f"particle e // (N / P) for N = {batch.shape[0]}, P = {self.num_particles}"
            )

    def _standardize_per_particle(self, batch: TensorDictBase) -> None:
        adv = batch.get(keys.ADVANTAGE)
        blocks = adv.reshape(self.num_particles, -1)
        out = torch.stack([standardize(b) for b in blocks]).reshape(adv.shape)
        batch.set(keys.ADVANTAGE, out)

    def update(self, batch: TensorDictBase, ctx: Context) -> dict[str, float]:
        lr = self.optimizer.param_groups[0]["lr"]
        if self.lr_schedule is not None:
            lr = schedules.linear(*self.lr_schedule, ctx.progress)
            schedules.set_lr(self.optimizer, lr)
        self._check_layout(batch)
        with torch.no_grad():
            self.estimator(batch)
        if self.normalize_advantage:
            self._standardize_per_particle(batch)
        self._pending: list[dict[str, Tensor]] = []
        result = update_loop(self.loss_groups(), batch, ctx)
        transform = MeanMetrics()
        for values in self._pending:
            transform.add(values)
        return result | transform.result() | {"lr": lr}

    def loss_groups(self) -> list[LossGroup]:
        """One group: every term of the loss over all particles, scaled by ``P`` so each
        particle gets its own A2C gradient, then the Stein transform (no global clipping:
        :meth:`clip_per_particle` clips each particle inside the transform)."""
        if not hasattr(self, "_groups"):
            self._groups = [
                LossGroup(
                    "particles",
                    self.loss,
                    self.optimizer,
                    epochs=self.epochs,
                    scale=float(self.num_particles),
                    transform_grads=self._transform_and_log,
                    grad_name="step_norm",
                )
            ]
        return self._groups

    def _transform_and_log(self) -> None:
        self.transform_grads()
        self._pending.append(dict(self.last_transform))

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        del state
