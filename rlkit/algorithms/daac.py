"""DAAC: Decoupled Advantage Actor-Critic (Raileanu & Fergus 2021).

    python recipes/daac.py                                 # CartPole-v1, built-in defaults
    python recipes/daac.py --env Pendulum-v1               # continuous actions (preset)
    python recipes/daac.py --adv-coef 0.05 --value-epochs 4 --value-freq 2
    python recipes/daac.py --accelerator cpu --devices 2 --strategy ddp
    python recipes/daac.py --help                          # every flag

Algorithm box:
    1. config      DAACConfig (defaults, per-env preset, --config YAML, flags)
    2. networks    policy net (trunk -> pi head, trunk -> advantage head A(s, a)) and a
                   separate value net V(s)
    3. estimator   GAE(gamma, lambda) with V writes advantage and value_target; the
                   advantage is standardised once per batch (--advantage-norm)
    4. losses      policy: clipped surrogate - entropy + adv_coef (A(s, a) - A_GAE)^2;
                   value: 1/2 (V(s) - V_target)^2 (optionally clipped)
    5. learner     --epochs of the policy loss, then every --value-freq batches
                   --value-epochs of the value loss; one optimiser per network
    6. fit         the engine: collect, update, evaluate, checkpoint
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict import TensorDictBase
from torch import nn

from rlkit.algorithms.onpolicy import ClipConfig, PolicyGradientLearner, make_optimizer
from rlkit.modules.daac_networks import DAACNetworks, daac_networks
from rlkit.objectives.daac import ADVANTAGE_NORMS, ADVANTAGE_TARGETS, DAACLoss, DAACValueLoss
from rlkit.training import parse_config, run, schedules
from rlkit.training.config import non_negative, positive
from rlkit.training.engine import Context
from rlkit.training.update import LossGroup, update_loop
from rlkit.value import GAE


def _help(text: str, **kw: Any) -> dict[str, Any]:
    return {"help": text, **kw}


# 1. config ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class DAACConfig(ClipConfig):
    """Train DAAC. Defaults solve CartPole-v1; flags override (see --help).

    Flags of DAAC (on top of the on-policy ones; ``--epochs`` is the policy epochs)."""

    total_frames: int = field(default=200_000, metadata={"help": "frames to train for"})
    rollout_steps: int = 32
    epochs: int = field(default=10, metadata={"help": "policy epochs per batch"})
    minibatch_size: int = 128
    lr: float = field(default=1e-3, metadata={"help": "initial learning rate"})
    lr_schedule: str = "linear"
    gamma: float = 0.98
    gae_lambda: float = 0.8
    clip_epsilon_final: float | None = 0.0

    value_epochs: int = field(
        default=20, metadata=_help("value-network epochs per value update (the paper: 9)")
    )
    value_freq: int = field(
        default=1, metadata=_help("update the value network every k batches (the paper: 1)")
    )
    adv_coef: float = field(
        default=0.25, metadata=_help("weight alpha_a of the advantage-head loss (paper: 0.25)")
    )
    advantage_target: str = field(
        default="normalized",
        metadata=_help(
            "advantage head target: normalized (the advantage the surrogate uses, as the "
            "authors' code) or raw (the GAE advantage, as the paper's text)",
            choices=ADVANTAGE_TARGETS,
        ),
    )
    normalize_advantage: bool = field(
        default=True, metadata=_help("standardise advantages (over what: --advantage-norm)")
    )
    advantage_norm: str = field(
        default="batch",
        metadata=_help(
            "standardise the advantage (the surrogate's and the advantage head's normalized "
            "target) once per batch, as the authors' code does, or per minibatch",
            choices=ADVANTAGE_NORMS,
        ),
    )
    adv_hidden: tuple[int, ...] | None = field(
        default=None,
        metadata=_help(
            "hidden layers of the advantage head; none: linear for discrete actions, one "
            "layer of the last --hidden width for continuous ones"
        ),
    )
    value_coef: float = field(
        default=1.0,
        metadata=_help("value loss weight (own optimiser: scales its gradient before clipping)"),
    )
    value_lr: float | None = field(
        default=None, metadata=_help("value-network learning rate (none: --lr; scheduled alike)")
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        positive(self, "value_epochs", "value_freq", "value_lr")
        non_negative(self, "adv_coef")
        if self.adv_hidden is not None and any(h <= 0 for h in self.adv_hidden):
            raise ValueError(f"--adv-hidden needs positive layer sizes, got {self.adv_hidden}")


#: Settings that override the defaults for an environment (flags and --config still win).
PRESETS: dict[str, dict] = {
    "Pendulum-v1": dict(
        total_frames=300_000,
        num_envs=4,
        rollout_steps=1024,
        epochs=10,
        value_epochs=10,
        minibatch_size=64,
        # 0.25 held seed 0 near -570 for 100k frames; 0.05 reached -180 at 61k (0: -264)
        adv_coef=0.05,
        lr=1e-3,
        lr_schedule="constant",
        gamma=0.9,
        gae_lambda=0.95,
        clip_epsilon_final=None,
        normalize_obs=True,
        target_return=None,
    ),
}


def _unique_parameters(*modules: nn.Module) -> list[nn.Parameter]:
    return list({id(p): p for m in modules for p in m.parameters()}.values())


def build_daac_networks(cfg: DAACConfig, env) -> DAACNetworks:
    """:func:`rlkit.modules.daac_networks.daac_networks` with a config's network flags."""
    return daac_networks(
        env,
        hidden=cfg.hidden,
        activation=cfg.activation,
        adv_hidden=cfg.adv_hidden,
        normalize_obs=cfg.normalize_obs,
        init_log_std=cfg.init_log_std,
        actor_hidden=cfg.actor_layers,
        critic_hidden=cfg.critic_layers,
    )


# the learner ---------------------------------------------------------------------------------
# DAAC's networks and learner: decoupled policy and value networks, two optimisers.
#
# Decoupled Advantage Actor-Critic (Raileanu & Fergus 2021, Algorithm 1)::
#
#     for each batch
#         collect with pi_theta; GAE with the value network V_phi -> advantage, value target
#         standardise the advantage over the batch (--advantage-norm batch, the authors' code)
#         policy_epochs x minibatches:  theta <- theta - lr grad [ L_clip - alpha_s H
#                                                                  + alpha_a (A_theta(s,a) - A)^2 ]
#         every value_freq batches:
#             value_epochs x minibatches: phi <- phi - lr grad 1/2 (V_phi(s) - V_target)^2
#
# The policy network is a trunk with two heads: the policy and the advantage head
# :math:`A_\theta(s, a)`, conditioned on the action (one output per action gathered at the
# action for discrete spaces; an MLP on ``concat(features, action)`` for continuous ones). The
# value network shares nothing with it and has its own optimiser, so the policy's features are
# shaped by the policy and advantage losses only. The losses live in
# :mod:`rlkit.objectives.daac`; this file builds the networks and orders the steps.


class DAACLearner(PolicyGradientLearner):
    """DAAC on top of :class:`PolicyGradientLearner` (schedules, minibatching, obs norm).

    Args:
        nets: the networks (:func:`build_daac_networks`).
        estimator: writes ``advantage`` and ``value_target`` with the value network
            (``rlkit.value.GAE(..., value_network=nets.critic)``).
        loss: :class:`~rlkit.objectives.daac.DAACLoss` over the policy network.
        value_loss: :class:`~rlkit.objectives.daac.DAACValueLoss` over the value network.
        cfg: a :class:`DAACConfig`.
        loss_schedules: loss attributes annealed linearly, e.g. ``{"clip_epsilon": (0.2, 0)}``.

    Optimisers: ``optimizer`` over the policy network (trunk, policy head, advantage head),
    ``value_optimizer`` over the value network, at ``--value-lr`` times the policy learning
    rate's schedule ratio. Per batch: the advantage standardised over the batch
    (``--advantage-norm batch``), ``--epochs`` passes of the policy loss, then (every
    ``--value-freq`` batches, counting from the first) ``--value-epochs`` passes of the value
    loss, each over the same GAE targets, in minibatches of ``--minibatch-size``: two
    :func:`~rlkit.training.update.update_loop` calls, one :class:`LossGroup` each
    (:meth:`loss_groups`).
    """

    def __init__(
        self,
        *,
        nets: DAACNetworks,
        estimator: nn.Module,
        loss: nn.Module,
        value_loss: nn.Module,
        cfg: DAACConfig,
        loss_schedules: Mapping[str, tuple[float, float]] | None = None,
    ) -> None:
        super().__init__(
            algo="daac",
            actor=nets.actor,
            critic=nets.critic,
            estimator=estimator,
            loss=loss,
            cfg=cfg,
            obs_norm=nets.obs_norm,
            loss_schedules=loss_schedules,
        )
        self.advantage_head, self.value_loss = nets.advantage_head, value_loss
        self.nets["advantage_head"] = nets.advantage_head
        policy = _unique_parameters(nets.actor, nets.advantage_head)
        shared = {id(p) for p in policy} & {id(p) for p in nets.critic.parameters()}
        if shared:
            raise ValueError(
                "DAAC's value network must not share parameters with the policy network "
                f"({len(shared)} shared tensors): build them separately (build_daac_networks)"
            )
        self.optimizer = make_optimizer(cfg, policy)
        self.value_optimizer = make_optimizer(cfg, nets.critic.parameters())
        self.batches_seen = 0

    # ---------------------------------------------------------------- Learner interface
    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"optimizer": self.optimizer, "value_optimizer": self.value_optimizer}

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"batches_seen": self.batches_seen}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.batches_seen = int(state.get("batches_seen", 0))

    # ---------------------------------------------------------------- the update
    def apply_schedules(self, progress: float) -> dict[str, float]:
        out = super().apply_schedules(progress)
        cfg = self.cfg
        value_lr = (cfg.value_lr if cfg.value_lr is not None else cfg.lr) * (out["lr"] / cfg.lr)
        schedules.set_lr(self.value_optimizer, value_lr)
        return out | {"value_lr": value_lr}

    def loss_groups(self) -> list[LossGroup]:
        """``[policy, value]``: trained one after the other, not in lockstep."""
        if not hasattr(self, "_groups"):
            cfg = self.cfg
            self._groups = [
                LossGroup(
                    "policy",
                    self.loss,
                    self.optimizer,
                    epochs=cfg.epochs,
                    max_grad_norm=cfg.max_grad_norm,
                ),
                LossGroup(
                    "value",
                    self.value_loss,
                    self.value_optimizer,
                    epochs=cfg.value_epochs,
                    max_grad_norm=cfg.max_grad_norm,
                    grad_name="value_grad_norm",
                ),
            ]
        return self._groups

    def update(self, batch: TensorDictBase, ctx: Context) -> dict[str, float]:
        sched = self.apply_schedules(ctx.progress)
        with torch.no_grad():
            self.estimator(batch)  # GAE with the value network; writes state_value too
        flat = self.loss.standardize_batch(batch.reshape(-1))
        policy, value = self.loss_groups()
        result = update_loop([policy], flat, ctx, minibatches=self._minibatches)
        if self.batches_seen % self.cfg.value_freq == 0:
            result |= update_loop([value], flat, ctx, minibatches=self._minibatches)
        self.batches_seen += 1
        self.after_update(batch, result, ctx)
        return result | sched


# 2-5. networks, estimator, losses, learner --------------------------------------------------
def build(cfg: DAACConfig, env) -> DAACLearner:
    nets = build_daac_networks(cfg, env)
    estimator = GAE(gamma=cfg.gamma, lmbda=cfg.gae_lambda, value_network=nets.critic)
    loss = DAACLoss(
        nets.actor,
        nets.advantage_head,
        clip_epsilon=cfg.clip_epsilon,
        entropy_coef=cfg.entropy_coef,
        adv_coef=cfg.adv_coef,
        normalize_advantage=cfg.normalize_advantage,
        advantage_target=cfg.advantage_target,
        advantage_norm=cfg.advantage_norm,
    )
    value_loss = DAACValueLoss(
        nets.critic, value_coef=cfg.value_coef, value_clip_epsilon=cfg.value_clip
    )
    return DAACLearner(
        nets=nets,
        estimator=estimator,
        loss=loss,
        value_loss=value_loss,
        cfg=cfg,
        loss_schedules=cfg.loss_schedules,
    )


# 6. fit -------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> dict:
    cfg = parse_config(DAACConfig, argv, presets=PRESETS, description=__doc__)
    return run(cfg, build, algo="daac")
