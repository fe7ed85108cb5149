"""PPG (Cobbe et al. 2020): networks, learner and :func:`train`, what ``recipes/ppg.py`` runs.

The config (:class:`PPGConfig`), its presets and the algorithm box that ``--help`` shows live
in the torch-free :mod:`rlkit.configs.ppg`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import partial
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

from rlkit import keys
from rlkit.algorithms._parts import gae_part, make_part
from rlkit.algorithms._settings import config_optimizer
from rlkit.algorithms.onpolicy import (
    PolicyGradientLearner,
    attach_intrinsic_from_config,
    policy_gradient_settings,
    refuse_memory,
)
from rlkit.configs import ppg as _config
from rlkit.configs.ppg import PRESETS, PPGConfig
from rlkit.modules.composite import refuse_structured
from rlkit.modules.ppg_networks import PPGNetworks, ppg_networks
from rlkit.objectives import PPGAuxLoss, PPOLoss
from rlkit.objectives.common import LOSS_VALUE
from rlkit.objectives.functional import standardize
from rlkit.objectives.ppg import PRE_AUX, policy_kl
from rlkit.training import parse_config, run, schedules
from rlkit.training.engine import Context
from rlkit.training.optim import unique_parameters
from rlkit.training.update import LossGroup, update_loop
from rlkit.value import GAE

# the learner (the policy phase, the auxiliary phase) -----------------------------------------
# PPG's learner: a policy phase of PPO batches, then an auxiliary phase over all of them.
#
# Phasic Policy Gradient (Cobbe et al. 2020, Algorithm 1)::
#
#     for phase = 1, 2, ...
#         for iteration = 1 .. n_pi                        # policy phase: one batch each
#             collect a batch, GAE -> advantage, value target
#             policy epochs of the clipped surrogate, value epochs of the value loss
#                 (each network its own optimiser and epoch count)
#             store (observation, value target) of the batch in the buffer B
#         record pi_old(.|s) (and V(s)) for every s in B   # before any aux update
#         for epoch = 1 .. aux_epochs                      # auxiliary phase
#             for each minibatch of whole rollouts of B
#                 L_aux = L_aux_value + beta_clone * KL(pi_old || pi) + L_value
#
# Both phases run on :func:`~rlkit.training.update.update_loop` (every ``loss_*`` term
# optimised by exactly one loss group); the learner reuses
# :class:`~rlkit.algorithms.onpolicy.PolicyGradientLearner` (schedules, minibatching,
# observation normalisation) and adds its own loss groups (policy and value, each with its
# optimiser and epoch count; the auxiliary phase), full-batch advantage normalisation, the
# buffer, and checkpoints of the buffer and the position in the phase cycle so a resume
# continues the cycle exactly.


@torch.no_grad()
def record_pre_aux(
    actor: nn.Module, critic: nn.Module, td: TensorDictBase, *, chunk: int = 4096
) -> TensorDictBase:
    """Write the current policy's distribution parameters and V(s) under ``PRE_AUX``.

    Run once over the whole buffer before the auxiliary phase's first update (the
    reference's ``compute_presleep_outputs``), in chunks of ``chunk`` rollouts' rows.
    Returns ``td`` (written in place).
    """
    dist_keys = list(actor[-1].in_keys)
    flat = td.reshape(-1) if td.batch_dims > 1 else td
    outs = []
    for start in range(0, flat.shape[0], chunk):
        part = flat[start : start + chunk]
        params = actor.get_dist_params(part.select(*actor.in_keys))
        value = critic(part.select(*critic.in_keys)).get(keys.STATE_VALUE)
        sub = params.select(*dist_keys)
        sub.set(keys.STATE_VALUE, value)
        outs.append(sub)
    pre = torch.cat(outs, 0).reshape(td.batch_size)
    td.set(PRE_AUX, TensorDict(dict(pre.items()), batch_size=td.batch_size))
    return td


class PPGLearner(PolicyGradientLearner):
    """Phasic Policy Gradient on top of :class:`PolicyGradientLearner`.

    Args:
        nets: the networks (:func:`build_ppg_networks`).
        estimator: writes ``advantage`` and ``value_target`` (``rlkit.value.GAE``).
        loss: the policy-phase loss (``PPOLoss(actor, critic, ...)`` or a subclass; every
            ``loss_*`` term but ``loss_value`` trains the actor).
        aux_loss: :class:`~rlkit.objectives.PPGAuxLoss` over the same networks.
        optimizer, value_optimizer, aux_optimizer: the three optimisers below
            (:func:`ppg_parameters` says which parameters each holds); ``aux_optimizer``
            None: ``--aux-optimizer shared``.
        n_pi: policy-phase batches per auxiliary phase (``--n-pi``).
        value_epochs: the value group's passes in the policy phase (None: ``epochs``).
        aux_epochs: passes of the auxiliary phase (0: none, no buffer kept).
        aux_lr: the auxiliary phase's initial rate (it follows the schedule in
            proportion); None: the policy's.
        aux_minibatches: minibatches of whole rollouts per auxiliary epoch.
        aux_grad_accum: chunks each auxiliary step accumulates its gradient over.
        full_batch_advantage_norm: standardise the advantage over the whole batch.
        rollout_steps: the steps of one rollout (a longer ``--min-episodes`` batch is stored
            as rollouts of this length).
        everything else: as for :class:`PolicyGradientLearner`.

    Loss groups (:func:`~rlkit.training.update.update_loop`). Policy phase, over the same
    minibatches: ``policy`` (every term of ``loss`` but ``loss_value``; the actor: trunk and
    policy head; ``--epochs``) and ``value`` (``loss_value``; the critic's own parameters,
    in the shared layout only its value head; ``--value-epochs``). A network past its epoch
    count is idle, its parameters bit-identical. Auxiliary phase: ``aux`` (every
    :class:`PPGAuxLoss` term; ``--aux-epochs``).

    Optimisers (checkpointed by name): ``optimizer`` over the actor, ``value_optimizer`` over
    the critic's own parameters, and with ``--aux-optimizer separate`` (the reference)
    ``aux_optimizer`` over every parameter. With ``shared`` there is no third optimiser:
    the auxiliary phase steps the policy phase's two at the auxiliary learning rate, as
    groups ``aux`` (``optimizer``, which then also holds the aux head: ``loss_aux_value``
    and ``loss_distill``) and ``aux_value`` (``value_optimizer``: ``loss_value``), so each
    network keeps one Adam state across both phases.
    """

    #: a population (``--population``) runs each member's own :meth:`update` in turn (its
    #: policy phase trains two loss groups in lockstep and its auxiliary phase its own buffer)
    population_sequential = True

    def __init__(
        self,
        *,
        nets: PPGNetworks,
        estimator: nn.Module,
        loss: nn.Module,
        aux_loss: nn.Module,
        optimizer: torch.optim.Optimizer,
        value_optimizer: torch.optim.Optimizer,
        aux_optimizer: torch.optim.Optimizer | None,
        n_pi: int,
        aux_epochs: int,
        value_epochs: int | None = None,
        aux_lr: float | None = None,
        aux_minibatches: int = 1,
        aux_grad_accum: int = 1,
        full_batch_advantage_norm: bool = False,
        rollout_steps: int,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            algo="ppg",
            actor=nets.actor,
            critic=nets.critic,
            estimator=estimator,
            loss=loss,
            optimizer=optimizer,
            obs_norm=nets.obs_norm,
            **kwargs,
        )
        self.aux_critic, self.aux_loss = nets.aux_critic, aux_loss
        self.nets["aux_critic"] = nets.aux_critic
        self.value_optimizer, self.aux_optimizer = value_optimizer, aux_optimizer
        self.n_pi, self.aux_epochs = n_pi, aux_epochs
        self.value_epochs = value_epochs or self.epochs
        self.aux_lr, self.aux_minibatches, self.aux_grad_accum = (
            aux_lr,
            aux_minibatches,
            aux_grad_accum,
        )
        self.full_batch_advantage_norm = full_batch_advantage_norm
        self.rollout_steps = rollout_steps
        self._build_groups()
        self.phase_iteration = 0
        self.buffer: list[TensorDict] = []

    # ---------------------------------------------------------------- Learner interface
    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        out = {"optimizer": self.optimizer, "value_optimizer": self.value_optimizer}
        if self.aux_optimizer is not None:
            out["aux_optimizer"] = self.aux_optimizer
        return out | self._intrinsic_optimizers()

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["phase_iteration"] = self.phase_iteration
        if self.buffer:
            rows = [b.shape[0] for b in self.buffer]
            if len(set(rows)) == 1:
                stacked = torch.stack(self.buffer, 0)
            else:  # --min-episodes: stored batches of different row counts, concatenated
                stacked = torch.cat(self.buffer, 0)
                state["buffer_rows"] = rows
            state["buffer"] = {k: v for k, v in stacked.items()}
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.phase_iteration = int(state.get("phase_iteration", 0))
        self.buffer = []
        if "buffer_rows" in state:
            data = dict(state["buffer"])
            steps = next(iter(data.values())).shape[1]
            cat = TensorDict(data, batch_size=[sum(state["buffer_rows"]), steps])
            self.buffer = [part.clone() for part in cat.split(list(state["buffer_rows"]), 0)]
        elif "buffer" in state:
            data = dict(state["buffer"])
            n = next(iter(data.values())).shape[0]
            batch = next(iter(data.values())).shape[1:3]
            stacked = TensorDict(data, batch_size=[n, *batch])
            self.buffer = [stacked[i].clone() for i in range(n)]
        if len(self.buffer) != self.phase_iteration:
            raise ValueError(
                f"PPG checkpoint holds {len(self.buffer)} buffered batches at policy-phase "
                f"iteration {self.phase_iteration}: the checkpoint is inconsistent"
            )

    # ---------------------------------------------------------------- loss groups
    def _build_groups(self) -> None:
        clip = self.max_grad_norm

        def value(name: str, loss: nn.Module, epochs: int) -> LossGroup:
            terms, grad_name = (LOSS_VALUE,), "value_grad_norm"
            return LossGroup(
                name, loss, self.value_optimizer, epochs, clip, terms, grad_name=grad_name
            )

        self._groups = [  # policy phase, in lockstep over the same minibatches
            LossGroup(
                "policy", self.loss, self.optimizer, self.epochs, clip, target_kl=self.target_kl
            ),
            value("value", self.loss, self.value_epochs),
        ]
        if self.aux_optimizer is not None:
            aux = LossGroup("aux", self.aux_loss, self.aux_optimizer, self.aux_epochs, clip)
            self.aux_groups = [aux]
        else:
            aux = LossGroup("aux", self.aux_loss, self.optimizer, self.aux_epochs, clip)
            self.aux_groups = [aux, value("aux_value", self.aux_loss, self.aux_epochs)]

    def loss_groups(self) -> list[LossGroup]:
        """The policy phase's groups (:attr:`aux_groups`: the auxiliary phase's)."""
        return self._groups

    # ---------------------------------------------------------------- the update
    def apply_schedules(self, progress: float) -> dict[str, float]:
        """As the base class; the value optimiser follows the policy's learning rate."""
        out = super().apply_schedules(progress)
        schedules.set_lr(self.value_optimizer, out["lr"])
        return out

    def _aux_lr(self, lr: float) -> float:
        """The auxiliary learning rate follows the policy-phase schedule's ratio."""
        base = self.lr_schedule.lr
        return (self.aux_lr if self.aux_lr is not None else base) * (lr / base)

    def update(self, batch: TensorDictBase, ctx: Context) -> dict[str, float]:
        sched = self.apply_schedules(ctx.progress)
        with torch.no_grad():
            self.estimator(batch)
            sched |= self.intrinsic_advantage(batch, ctx)
        flat = batch.reshape(-1)  # a new TensorDict: setting a key leaves ``batch`` alone
        if self.full_batch_advantage_norm:
            flat.set(keys.ADVANTAGE, standardize(flat.get(keys.ADVANTAGE)))
        result = update_loop(self.first_phase(), flat, ctx, minibatches=self._minibatches)
        if self.aux_epochs > 0:
            self.buffer.append(self._store(batch))
        self.phase_iteration += 1
        if self.phase_iteration == self.n_pi:
            if self.aux_epochs > 0:
                result |= self.aux_phase(ctx, lr=self._aux_lr(sched["lr"]))
                for opt in (self.optimizer, self.value_optimizer):  # shared: back from aux_lr
                    schedules.set_lr(opt, sched["lr"])
            self.phase_iteration, self.buffer = 0, []
        self.after_update(batch, result, ctx)
        return result | sched | {"phase_iteration": float(self.phase_iteration)}

    def _store(self, batch: TensorDictBase) -> TensorDict:
        """Observation and value target of a batch, ``[N, T]``: N whole rollouts (and the
        action mask, when the env has one: the auxiliary phase's KL runs over the valid
        actions). A longer batch of ``--min-episodes`` (``[N, k T]``) is stored as ``k N``
        rollouts of ``T = --rollout-steps`` steps, so that every stored batch has rollouts of
        one length."""
        # what the networks read: "observation", or a Dict observation's chosen entries
        nets = (self.actor, self.critic, self.aux_critic)
        read = dict.fromkeys(k for net in nets for k in net.in_keys if k != keys.ACTION_MASK)
        stored = TensorDict(
            {
                **{k: batch.get(k).clone() for k in read},
                keys.VALUE_TARGET: batch.get(keys.VALUE_TARGET).clone(),
            },
            batch_size=batch.batch_size[:2],
        )
        mask = batch.get(keys.ACTION_MASK, None)
        if mask is not None:
            stored.set(keys.ACTION_MASK, mask.clone())
        steps = self.rollout_steps
        if stored.shape[1] == steps:
            return stored
        return torch.cat(stored.split(steps, dim=1), 0)

    def aux_phase(self, ctx: Context, *, lr: float) -> dict[str, float]:
        """Record pi_old over the buffer, then ``aux_epochs`` passes of the auxiliary loss
        over minibatches of whole rollouts, each step's gradient accumulated over
        ``--aux-grad-accum`` chunks of them."""
        # a resumed buffer comes from the checkpoint on the CPU; new batches on ctx.device
        data = torch.cat([b.to(ctx.device) for b in self.buffer], 0)  # [rollouts, T]
        record_pre_aux(self.actor, self.critic, data)
        groups = self.aux_groups
        for group in groups:
            schedules.set_lr(group.optimizer, lr)
        size = math.ceil(data.shape[0] / self.aux_minibatches)

        def rollouts(td: TensorDictBase, generator: torch.Generator):
            order = torch.randperm(td.shape[0], generator=generator)
            return (td[idx] for idx in order.split(size))

        stats = update_loop(groups, data, ctx, minibatches=rollouts, grad_accum=self.aux_grad_accum)
        result = stats | {"lr": lr, "policy_kl_after": self._kl_after(data)}
        return {f"aux/{k}": v for k, v in result.items()}

    @torch.no_grad()
    def _kl_after(self, data: TensorDictBase) -> float:
        """Mean KL(pi_old || pi) over the whole buffer once the auxiliary phase is done."""
        flat = data.reshape(-1)
        new = self.actor.get_dist(flat.select(*self.actor.in_keys))
        kl = policy_kl(self.aux_loss.old_distribution(flat), new).mean()
        return float(kl)


def ppg_parameters(nets: PPGNetworks) -> dict[str, list[torch.Tensor]]:
    """The parameters of PPG's optimisers, each once: ``actor`` (trunk and policy head),
    ``critic`` (the critic's own; in the shared layout the value head only), ``aux_head``
    (the auxiliary value head's own) and ``every`` one of the networks."""
    actor = unique_parameters(nets.actor)
    return {
        "actor": actor,
        "critic": unique_parameters(nets.critic, but=actor),
        "aux_head": unique_parameters(nets.aux_critic, but=actor),
        "every": unique_parameters(
            *(m for m in (nets.actor, nets.critic, nets.obs_norm, nets.aux_critic) if m is not None)
        ),
    }


def build_ppg_networks(cfg: PPGConfig, env) -> PPGNetworks:
    """:func:`rlkit.modules.ppg_networks.ppg_networks` with a config's network flags."""
    return ppg_networks(
        env,
        arch=cfg.arch,
        encoder=cfg.encoder,
        feature_dim=cfg.feature_dim,
        hidden=cfg.hidden,
        activation=cfg.activation,
        init_fn=cfg.init_fn,
        normalize_obs=cfg.normalize_obs,
        init_log_std=cfg.init_log_std,
        bounded_mean=cfg.bounded_mean,
        actor_hidden=cfg.actor_layers,
        critic_hidden=cfg.critic_hidden,
        obs_keys=cfg.obs_keys,
    )


# 2-5. networks, estimator, losses, learner --------------------------------------------------
def build(cfg: PPGConfig, env, *, loss_cls=None, estimator_cls=None) -> PPGLearner:
    """PPG's learner for ``cfg`` on ``env``: networks, GAE, the policy phase's clipped loss,
    the auxiliary loss, the learner and ``--intrinsic``'s bonus.

    ``loss_cls`` (the policy phase's loss; default :class:`~rlkit.objectives.PPOLoss`) and
    ``estimator_cls`` (default :class:`~rlkit.value.GAE`): a subclass (or
    ``functools.partial`` of one) built in their place with exactly the recipe's arguments,
    ``loss_cls(actor, critic, clip_epsilon=, entropy_coef=, value_coef=, value_clip_epsilon=,
    normalize_advantage=)`` and ``estimator_cls(gamma=, lmbda=, value_network=critic)``; the
    auxiliary phase's :class:`~rlkit.objectives.PPGAuxLoss` and everything else are built as
    the recipe builds them."""
    refuse_memory(cfg, "ppg")
    refuse_structured(env, "ppg (its networks take Discrete or Box actions)")
    nets = build_ppg_networks(cfg, env)
    estimator = gae_part(estimator_cls, GAE, cfg, nets.critic, where="ppg.build")
    loss = make_part(
        loss_cls,
        PPOLoss,
        nets.actor,
        nets.critic,
        clip_epsilon=cfg.clip_epsilon,
        entropy_coef=cfg.entropy_coef,
        value_coef=cfg.value_coef,
        value_clip_epsilon=cfg.value_clip,
        normalize_advantage=cfg.normalize_advantage and not cfg.full_batch_advantage_norm,
        where="ppg.build",
    )
    aux_loss = PPGAuxLoss(
        nets.actor,
        nets.critic,
        nets.aux_critic,
        beta_clone=cfg.beta_clone,
        aux_value_coef=cfg.aux_value_coef,
        value_coef=cfg.aux_true_value_coef,
        value_clip_epsilon=cfg.value_clip,
    )
    params = ppg_parameters(nets)
    shared = cfg.aux_optimizer == "shared"
    aux = cfg.aux_epochs > 0  # the auxiliary phase's settings apply only with one
    learner = PPGLearner(
        nets=nets,
        estimator=estimator,
        loss=loss,
        aux_loss=aux_loss,
        optimizer=config_optimizer(
            cfg, params["actor"] + params["aux_head"] if shared else params["actor"]
        ),
        value_optimizer=config_optimizer(cfg, params["critic"]),
        aux_optimizer=None if shared else config_optimizer(cfg, params["every"]),
        n_pi=cfg.n_pi,
        aux_epochs=cfg.aux_epochs,
        value_epochs=cfg.value_epochs,
        aux_lr=cfg.aux_lr if aux else None,
        aux_minibatches=cfg.aux_minibatches if aux else 1,
        aux_grad_accum=cfg.aux_grad_accum if aux else 1,
        full_batch_advantage_norm=cfg.full_batch_advantage_norm,
        rollout_steps=cfg.rollout_steps,
        **policy_gradient_settings(cfg, cfg.loss_schedules),
    )
    attach_intrinsic_from_config(learner, cfg, env)
    return learner


# 6. fit -------------------------------------------------------------------------------------
def train(cfg: PPGConfig, *, env=None, loss_cls=None, estimator_cls=None) -> dict:
    """Train PPG under a parsed ``cfg`` (what ``recipes/ppg.py`` runs after its
    flags); returns the run summary. ``loss_cls``, ``estimator_cls``: as for :func:`build`."""
    build_parts = partial(build, loss_cls=loss_cls, estimator_cls=estimator_cls)
    return run(cfg, build_parts, algo="ppg", env=env)


def main(argv: list[str] | None = None) -> dict:
    """``recipes/ppg.py`` from Python: parse ``argv`` (default: the command line), then
    :func:`train`."""
    cfg = parse_config(PPGConfig, argv, presets=PRESETS, description=_config.__doc__)
    return train(cfg)
