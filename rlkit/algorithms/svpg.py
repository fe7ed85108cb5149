"""SVPG (Liu et al. 2017): networks, learner and :func:`train`, what ``recipes/svpg.py`` runs.

The config (:class:`SVPGConfig`), its presets and the algorithm box that ``--help`` shows live
in the torch-free :mod:`rlkit.configs.svpg`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDictBase
from torch import Tensor, nn

from rlkit import keys
from rlkit.algorithms._parts import gae_part, make_part
from rlkit.configs import svpg as _config
from rlkit.configs.svpg import PRESETS, SVPGConfig
from rlkit.modules.composite import refuse_structured
from rlkit.modules.dictobs import resolve_obs_keys
from rlkit.modules.masks import mask_key_of, refuse_mask
from rlkit.modules.particles import (
    ParticlePolicy,
    build_particles,
    particle_index,
    particle_member,
    stacked_networks,
)
from rlkit.objectives.a2c import A2CLoss
from rlkit.objectives.functional import standardize
from rlkit.objectives.ppo import PPOLoss
from rlkit.objectives.svpg import median_bandwidth, rbf_kernel, stein_update
from rlkit.training import parse_config, run, schedules
from rlkit.training.engine import Context, Learner
from rlkit.training.optim import make_optimizer
from rlkit.training.schedules import LRSchedule
from rlkit.training.update import LossGroup, MeanMetrics, update_loop
from rlkit.value import GAE


# the learner -------------------------------------------------------------------------------
class SVPGLearner(Learner):
    r"""Stein variational policy gradient over ``P`` actor-critic particles.

    The particles' own algorithm is the loss: ``A2CLoss`` (A2C particles) or ``PPOLoss``
    (PPO particles, with ``epochs`` and ``minibatch_size``); any loss that averages per-sample
    terms over its batch fits. Per batch ``[N, T]`` (``N`` envs of this rank, env ``e``
    acting with particle ``e // (N / P)``):

    1. the estimator (e.g. GAE) writes ``advantage`` / ``value_target`` with each env's own
       particle's critic; with ``normalize_advantage`` they are standardised per particle
       (over the batch, or over each minibatch when ``minibatch_size`` is set);
    2. ``epochs`` passes over the batch: the whole batch per step, or, with
       ``minibatch_size``, :meth:`particle_minibatches` (each step takes ``minibatch_size``
       samples of every particle, each particle's drawn from its own shuffle); the loss
       averages over the step's samples, equal counts per particle, i.e.
       :math:`\frac1P\sum_p L_p`; it is multiplied by ``P`` so particle ``p``'s parameters
       receive exactly :math:`\nabla L_p`, the gradient its own learner (A2C, or PPO on the
       same minibatch) computes;
    3. at every optimiser step, ``Context.optimize`` back-propagates and all-reduces across
       ranks, then the
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
        epochs: passes over each batch (A2C: 1 full-batch step).
        minibatch_size: each particle's samples per gradient step (PPO particles); ``None``
            (default): the whole batch per step.
        normalize_advantage: standardise the advantage within each particle's samples (of
            the batch, or of each minibatch).
        lr_schedule: the learning rate (:class:`~rlkit.training.schedules.LRSchedule`, e.g.
            ``LRSchedule("linear", 7e-4, final=0.0)`` over the frame budget); ``None``:
            constant at the optimiser's rate.
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
        minibatch_size: int | None = None,
        normalize_advantage: bool = False,
        lr_schedule: LRSchedule | None = None,
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
        if minibatch_size is not None and not minibatch_size > 0:
            raise ValueError(
                f"minibatch_size must be > 0 or None (whole batch), got {minibatch_size}"
            )
        if lr_schedule is not None and not isinstance(lr_schedule, LRSchedule):
            raise TypeError(
                f"lr_schedule takes an LRSchedule (rlkit.training.schedules), got "
                f"{lr_schedule!r}: e.g. LRSchedule('linear', start, final=end)"
            )
        if lr_schedule is None:
            lr_schedule = LRSchedule("constant", float(optimizer.param_groups[0]["lr"]))
        self.actor, self.critic, self.estimator, self.loss = actor, critic, estimator, loss
        self.optimizer, self._frames_per_batch = optimizer, frames_per_batch
        self.temperature, self.bandwidth = float(temperature), bandwidth
        self.max_grad_norm, self.epochs = max_grad_norm, epochs
        self.minibatch_size = minibatch_size
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

    def evaluation_details(self, returns: Tensor) -> dict[str, float]:
        """Each particle's mean evaluation return, ``return_particle<p>``: episode ``e`` of
        ``E`` ran particle ``e // (E / P)`` (pyrado reports per-particle returns)."""
        owner = particle_index(returns.numel(), self.num_particles)
        return {
            f"return_particle{p}": float(returns[owner == p].mean())
            for p in range(self.num_particles)
            if bool((owner == p).any())
        }

    def particle_actor(self, index: int) -> nn.Module:
        """Particle ``index``'s actor as a stand-alone ``ProbabilisticActor`` (a copy)."""
        return particle_member(self.actor, index)

    def snapshot_files(self, checkpoint: str, run: Mapping[str, Any]) -> dict[str, Any]:
        """One stand-alone file per particle with each checkpoint (pyrado saves each
        particle's policy): :func:`particle_file` names it, :func:`load_particle` reads it
        back as the particle's actor. Each holds the particle's actor ``state_dict`` and the
        run's settings, tensors and plain containers only (``weights_only`` loading)."""
        files = {}
        for index in range(self.num_particles):
            files[particle_file(checkpoint, index)] = {
                "format": PARTICLE_FORMAT,
                "algo": self.algo,
                "env": run["env"],
                "frames": int(run["frames"]),
                "checkpoint": checkpoint,
                "index": index,
                "num_particles": self.num_particles,
                "config": dict(run["config"]),
                "actor": self.particle_actor(index).state_dict(),
            }
        return files

    # ---------------------------------------------------------------- the Stein transform
    def clip_per_particle(self) -> Tensor:
        """Scale each particle's gradient (actor and critic together) to norm at most
        ``max_grad_norm``; returns the norms before clipping, ``[P]``."""
        params = [*self.actor_nets.stacked, *self.critic_nets.stacked]
        grads = [t.grad for t in params if t.grad is not None]
        p = self.num_particles
        sq = sum(g.reshape(p, -1).square().sum(dim=1) for g in grads)
        norms = sq.sqrt() if grads else torch.zeros(p, device=params[0].device)
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
            "kernel_bandwidth": torch.as_tensor(h, dtype=torch.float32, device=theta.device),
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

    def particle_minibatches(
        self, data: TensorDictBase, generator: torch.Generator
    ) -> Iterator[TensorDictBase]:
        """One epoch of minibatches of ``data`` ``[N, T]``, ``minibatch_size`` samples of every
        particle each: particle ``p``'s samples (its envs' rows) are shuffled on their own and
        cut into chunks; minibatch ``k`` is the ``k``-th chunk of every particle, in particle
        order, so its rows are ``P`` equal contiguous blocks that the ensemble routes to their
        own particle (:func:`particle_index`). With ``normalize_advantage`` each block's
        advantage is standardised on its own (a PPO learner's per-minibatch standardisation)."""
        p = self.num_particles
        flat = data.reshape(-1)  # env-major: particle p's samples are rows [p M, (p + 1) M)
        per_particle = flat.shape[0] // p
        order = torch.stack([torch.randperm(per_particle, generator=generator) for _ in range(p)])
        order += torch.arange(p).unsqueeze(1) * per_particle
        for chunk in order.split(self.minibatch_size, dim=1):
            minibatch = flat[chunk.reshape(-1)]
            if self.normalize_advantage:
                self._standardize_per_particle(minibatch)
            yield minibatch

    def update(self, batch: TensorDictBase, ctx: Context) -> dict[str, float]:
        lr = self.lr_schedule.lr_at(ctx.progress)
        schedules.set_lr(self.optimizer, lr)
        self._check_layout(batch)
        with torch.no_grad():
            self.estimator(batch)
        self._pending: list[dict[str, Tensor]] = []
        if self.minibatch_size is None:
            if self.normalize_advantage:
                self._standardize_per_particle(batch)
            result = update_loop(self.loss_groups(), batch, ctx)
        else:
            minibatches = self.particle_minibatches
            result = update_loop(self.loss_groups(), batch, ctx, minibatches=minibatches)
        transform = MeanMetrics()
        for values in self._pending:
            transform.add(values)
        return result | transform.result() | {"lr": lr}

    def loss_groups(self) -> list[LossGroup]:
        """One group: every term of the loss over all particles, scaled by ``P`` so each
        particle gets its own algorithm's gradient, then the Stein transform (no global clipping:
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
        return self.lr_schedule.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.lr_schedule.load_state_dict(state)


# 2-5. networks, estimator, loss, learner ----------------------------------------------------
def particle_loss(
    cfg: SVPGConfig, actor: nn.Module, critic: nn.Module, *, loss_cls=None
) -> nn.Module:
    """The particles' own loss (``--particle``): ``A2CLoss``, or ``PPOLoss`` with the clip
    range ``cfg.clip_range``. Advantages are standardised per particle by the learner
    (``--normalize-advantage``), never by the loss, whose batch mixes the particles.
    ``loss_cls``: a subclass of that class (or ``functools.partial`` of one) built in its
    place with the same arguments (:func:`build`)."""
    terms = dict(entropy_coef=cfg.entropy_coef, value_coef=cfg.value_coef)
    if cfg.particle == "ppo":
        return make_part(
            loss_cls,
            PPOLoss,
            actor,
            critic,
            clip_epsilon=cfg.clip_range,
            normalize_advantage=False,
            **terms,
            where="svpg.build (--particle ppo)",
        )
    return make_part(loss_cls, A2CLoss, actor, critic, **terms, where="svpg.build")


def build(cfg: SVPGConfig, env, *, loss_cls=None, estimator_cls=None) -> SVPGLearner:
    """SVPG's learner for ``cfg`` on ``env``: the particles' stacked networks, GAE, the
    particles' loss, one optimiser and the Stein step.

    ``loss_cls`` (default :class:`~rlkit.objectives.A2CLoss`, with ``--particle ppo``
    :class:`~rlkit.objectives.PPOLoss`) and ``estimator_cls`` (default
    :class:`~rlkit.value.GAE`): a subclass (or ``functools.partial`` of one) built in their
    place with exactly the recipe's arguments, ``loss_cls(actor, critic, entropy_coef=,
    value_coef=)`` (with ``--particle ppo`` also ``clip_epsilon=``,
    ``normalize_advantage=False``) and ``estimator_cls(gamma=, lmbda=, value_network=critic)``;
    everything else is built as the recipe builds it. An env with an action mask is
    refused (the particles' stacked networks read the observation alone)."""
    refuse_structured(env, "svpg (its networks take Discrete or Box actions)")
    if mask_key_of(env.observation_spec) is not None:
        raise refuse_mask("svpg (its particles' stacked policies)")
    actor, critic = build_particles(
        env,
        num_particles=cfg.particles,
        hidden=cfg.hidden,
        activation=cfg.activation,
        obs_keys=resolve_obs_keys(env, cfg.obs_keys),
    )
    estimator = gae_part(estimator_cls, GAE, cfg, critic, where="svpg.build")
    loss = particle_loss(cfg, actor, critic, loss_cls=loss_cls)
    params = [*actor.parameters(), *critic.parameters()]
    optimizer = make_optimizer(cfg.optimizer, params, lr=cfg.lr, eps=cfg.adam_eps)
    return SVPGLearner(
        actor=actor,
        critic=critic,
        estimator=estimator,
        loss=loss,
        optimizer=optimizer,
        frames_per_batch=cfg.batch_size,
        temperature=cfg.temperature,
        bandwidth=cfg.bandwidth,
        max_grad_norm=cfg.max_grad_norm,
        epochs=cfg.epochs,
        minibatch_size=cfg.minibatch_size,
        normalize_advantage=cfg.normalize_advantage,
        lr_schedule=(
            LRSchedule("linear", cfg.lr, final=cfg.lr_final)
            if cfg.lr_schedule == "linear"
            else LRSchedule("constant", cfg.lr)
        ),
    )


# 6. fit -------------------------------------------------------------------------------------
def train(cfg: SVPGConfig, *, env=None, loss_cls=None, estimator_cls=None) -> dict:
    """Train SVPG under a parsed ``cfg`` (what ``recipes/svpg.py`` runs after its
    flags); returns the run summary. ``loss_cls``, ``estimator_cls``: as for :func:`build`."""
    build_parts = partial(build, loss_cls=loss_cls, estimator_cls=estimator_cls)
    return run(cfg, build_parts, algo="svpg", env=env)


#: the ``format`` entry of a per-particle file (:meth:`SVPGLearner.snapshot_files`)
PARTICLE_FORMAT = "rlkit-svpg-particle/1"


def particle_file(checkpoint: str, index: int) -> str:
    """Particle ``index``'s file written with checkpoint ``checkpoint`` (its name without
    ``.pt``), relative to the run directory: ``particles/particle_<index>.pt`` with
    ``last.pt`` (rewritten at every checkpoint and at the end of the run),
    ``particles/<checkpoint>/particle_<index>.pt`` with the others (``best``,
    ``frames_<frames>``)."""
    folder = Path("particles") if checkpoint == "last" else Path("particles", checkpoint)
    return str(folder / f"particle_{index}.pt")


def load_particle(checkpoint: str | Path, index: int | None = None) -> nn.Module:
    """Particle ``index`` of an SVPG run as a stand-alone actor (pyrado's
    ``SVPG.load_particle``). ``checkpoint`` is either

    * a run checkpoint (``<run-dir>/checkpoints/last.pt``, ``index`` required): the run's
      networks are rebuilt from the settings stored in it, loaded, and the particle's actor
      copied out; or
    * a per-particle file (``<run-dir>/particles/particle_<i>.pt``, :func:`particle_file`):
      one actor of the run's architecture is built and given the file's weights; ``index``
      may be left out (given, it must be the file's).

    Both load with ``weights_only=True`` (no code from the file runs); a missing, corrupt or
    foreign file raises :class:`~rlkit.training.errors.CheckpointError`. Evaluate the actor
    with :class:`rlkit.training.evaluation.Evaluator` or collect with it like any actor."""
    from rlkit.training import checkpoint as ckpt

    path = Path(checkpoint)
    payload = ckpt.safe_load(
        path,
        what="SVPG file",
        example="<run-dir>/particles/particle_0.pt or <run-dir>/checkpoints/last.pt",
        remedy="use the run's checkpoint, load_particle('<run-dir>/checkpoints/last.pt', "
        "index), or write the files again with a run",
    )
    if isinstance(payload, Mapping) and payload.get("format") == PARTICLE_FORMAT:
        return _actor_from_particle_file(payload, path, index)
    if not isinstance(payload, Mapping) or payload.get("format") != ckpt.FORMAT:
        raise ckpt.CheckpointError(
            f"{str(path)!r} is neither an SVPG particle file nor an rlkit checkpoint: pass "
            "<run-dir>/particles/particle_<i>.pt or <run-dir>/checkpoints/last.pt"
        )
    if index is None:
        raise TypeError(
            f"{str(path)!r} is a checkpoint of all particles: name the particle, "
            "load_particle(path, index)"
        )
    return _actor_from_checkpoint(payload, path, index)


def _actor_from_particle_file(
    payload: Mapping[str, Any], path: Path, index: int | None
) -> nn.Module:
    from rlkit.configs.base import stored_fields
    from rlkit.envs import make_env
    from rlkit.training import checkpoint as ckpt

    stored, state, own = payload.get("config"), payload.get("actor"), payload.get("index")
    if not (isinstance(stored, Mapping) and isinstance(state, Mapping) and isinstance(own, int)):
        raise ckpt.CheckpointError(
            f"SVPG particle file {str(path)!r} is incomplete (it needs config, actor and "
            "index): use the run's checkpoint, load_particle('<run-dir>/checkpoints/last.pt', "
            "index)"
        )
    ckpt.check_compatible(payload, algo="svpg", path=path)
    if index is not None and index != own:
        raise ValueError(
            f"{str(path)!r} holds particle {own}, not {index}: pass index={own} or leave it out"
        )
    cfg = SVPGConfig(**stored_fields(stored, SVPGConfig))
    env = make_env(cfg.env, num_envs=1, **cfg.gym_options())
    try:
        actor, _ = build_particles(
            env, num_particles=1, hidden=cfg.hidden, activation=cfg.activation
        )
    finally:
        env.close()
    member = particle_member(actor, 0)
    ckpt.load_module_state(member, state, name=f"particle {own}", path=path)
    return member


def _actor_from_checkpoint(payload: Mapping[str, Any], path: Path, index: int) -> nn.Module:
    from rlkit.configs.base import stored_fields
    from rlkit.envs import make_env
    from rlkit.training import checkpoint as ckpt

    ckpt.check_compatible(payload, algo="svpg", path=path)
    cfg = SVPGConfig(**stored_fields(payload.get("config") or {}, SVPGConfig))
    env = make_env(cfg.env, num_envs=cfg.num_envs, **cfg.gym_options())
    try:
        learner = build(cfg, env)
    finally:
        env.close()
    for name, module in learner.modules().items():
        ckpt.load_module_state(module, payload["modules"][name], name=name, path=path)
    return learner.particle_actor(index)


def main(argv: list[str] | None = None) -> dict:
    """``recipes/svpg.py`` from Python: parse ``argv`` (default: the command line), then
    :func:`train`."""
    cfg = parse_config(SVPGConfig, argv, presets=PRESETS, description=_config.__doc__)
    return train(cfg)
