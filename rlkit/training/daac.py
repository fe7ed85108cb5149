r"""DAAC's networks and learner: decoupled policy and value networks, two optimisers.

Decoupled Advantage Actor-Critic (Raileanu & Fergus 2021, Algorithm 1)::

    for each batch
        collect with pi_theta; GAE with the value network V_phi -> advantage, value target
        standardise the advantage over the batch (--advantage-norm batch, the authors' code)
        policy_epochs x minibatches:  theta <- theta - lr grad [ L_clip - alpha_s H
                                                                 + alpha_a (A_theta(s,a) - A)^2 ]
        every value_freq batches:
            value_epochs x minibatches: phi <- phi - lr grad 1/2 (V_phi(s) - V_target)^2

The policy network is a trunk with two heads: the policy and the advantage head
:math:`A_\theta(s, a)`, conditioned on the action (one output per action gathered at the
action for discrete spaces; an MLP on ``concat(features, action)`` for continuous ones). The
value network shares nothing with it and has its own optimiser, so the policy's features are
shaped by the policy and advantage losses only. The losses live in
:mod:`rlkit.objectives.daac`; this file builds the networks and orders the steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule
from torch import nn

from rlkit import keys
from rlkit.objectives.daac import ADVANTAGE_NORMS, ADVANTAGE_TARGETS
from rlkit.training import schedules
from rlkit.training.config import non_negative, positive
from rlkit.training.engine import Context
from rlkit.training.onpolicy import ClipConfig, Normalize, PolicyGradientLearner, make_optimizer
from rlkit.training.update import LossGroup, update_loop

__all__ = [
    "ActionAdvantage",
    "DAACConfig",
    "DAACLearner",
    "DAACNetworks",
    "advantage_head",
    "build_daac_networks",
]


def _help(text: str, **kw: Any) -> dict[str, Any]:
    return {"help": text, **kw}


@dataclass(frozen=True)
class DAACConfig(ClipConfig):
    """Flags of DAAC (on top of the on-policy ones; ``--epochs`` is the policy epochs)."""

    value_epochs: int = field(
        default=9, metadata=_help("value-network epochs per value update (the paper: 9)")
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


# --------------------------------------------------------------------------- networks
class ActionAdvantage(nn.Module):
    r""":math:`A_\theta(s, a)` from the policy trunk's features, at the given action.

    ``kind="categorical"``: ``head(features)`` has one output per action, gathered at the
    int64 action index (the paper); ``"one_hot"``: the same, selected by a one-hot action;
    ``"continuous"``: ``head(concat(features, action))``. Returns ``[*, 1]``.
    """

    KINDS = ("categorical", "one_hot", "continuous")

    def __init__(self, trunk: nn.Module, head: nn.Module, *, kind: str) -> None:
        super().__init__()
        if kind not in self.KINDS:
            raise ValueError(f"ActionAdvantage: kind must be one of {self.KINDS}, got {kind!r}")
        self.trunk, self.head, self.kind = trunk, head, kind

    def forward(self, observation: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        features = self.trunk(observation)
        if self.kind == "categorical":
            return self.head(features).gather(-1, action.long().unsqueeze(-1))
        if self.kind == "one_hot":
            return (self.head(features) * action.to(features.dtype)).sum(-1, keepdim=True)
        return self.head(torch.cat([features, action.to(features.dtype)], dim=-1))


def advantage_head(
    trunk: nn.Module,
    width: int,
    *,
    kind: str,
    size: int,
    hidden: tuple[int, ...] = (),
    activation: str = "tanh",
) -> TensorDictModule:
    """The advantage head as a TensorDict module: reads ``keys.OBSERVATION`` and
    ``keys.ACTION``, writes ``keys.ADVANTAGE_PRED`` ``[*, 1]``.

    Args:
        trunk: the policy network's feature extractor (shared with the actor).
        width: the trunk's output width.
        kind: ``"categorical"``, ``"one_hot"`` or ``"continuous"`` (see
            :class:`ActionAdvantage`).
        size: number of actions (discrete) or the action dimension (continuous).
        hidden: hidden widths of the head's MLP; output layer orthogonal with gain 1.
    """
    from rlkit.modules.networks import mlp

    if kind == "continuous":
        head = mlp(width + size, 1, hidden=hidden, activation=activation)
    else:
        head = mlp(width, size, hidden=hidden, activation=activation)
    return TensorDictModule(
        ActionAdvantage(trunk, head, kind=kind),
        in_keys=[keys.OBSERVATION, keys.ACTION],
        out_keys=[keys.ADVANTAGE_PRED],
    )


@dataclass
class DAACNetworks:
    """The policy network (``trunk`` -> ``actor`` and ``advantage_head``) and the value
    network (``critic``); ``obs_norm`` holds running observation statistics used by both."""

    actor: nn.Module
    advantage_head: nn.Module
    critic: nn.Module
    trunk: nn.Module
    obs_norm: nn.Module | None = None


def build_daac_networks(cfg: DAACConfig, env) -> DAACNetworks:
    """Policy network and value network sized from ``env``'s specs (flat observations).

    Policy network: ``[Normalize] -> mlp_body(--hidden)`` trunk, a linear policy head (gain
    0.01) and the advantage head. Value network: ``[Normalize] -> mlp(--hidden) -> 1``,
    no parameter shared with the policy network.
    """
    from rlkit.modules import make_actor, make_value
    from rlkit.modules.critics import action_kind
    from rlkit.modules.networks import mlp_body

    obs_spec, act_spec = env.observation_spec, env.action_spec
    obs_shape = obs_spec[keys.OBSERVATION].shape[len(env.batch_size) :]
    if len(obs_shape) != 1:
        raise ValueError(
            f"DAAC's MLP networks need flat vector observations, got shape {list(obs_shape)}: "
            "flatten them with a gymnasium wrapper or build the networks by hand"
        )
    obs_dim = int(obs_shape[0])
    obs_norm = norm = None
    if cfg.normalize_obs:
        from rlkit.modules.normalization import RunningMeanStd

        obs_norm = RunningMeanStd(obs_shape)
        norm = Normalize(obs_norm)
    body = mlp_body(obs_dim, hidden=cfg.hidden, activation=cfg.activation)
    trunk = body if norm is None else nn.Sequential(norm, body)
    width = cfg.hidden[-1]
    actor = make_actor(
        obs_spec, act_spec, backbone=trunk, in_features=width, hidden=(), activation=cfg.activation
    )
    info = action_kind(act_spec, batch_shape=tuple(env.batch_size))
    hidden = cfg.adv_hidden
    if hidden is None:
        hidden = (width,) if info.kind == "continuous" else ()
    head = advantage_head(
        trunk, width, kind=info.kind, size=info.size, hidden=hidden, activation=cfg.activation
    )
    critic = make_value(
        obs_spec,
        backbone=norm,
        in_features=obs_dim if norm is not None else None,
        hidden=cfg.hidden,
        activation=cfg.activation,
    )
    return DAACNetworks(actor, head, critic, trunk, obs_norm)


def _unique_parameters(*modules: nn.Module) -> list[nn.Parameter]:
    return list({id(p): p for m in modules for p in m.parameters()}.values())


# --------------------------------------------------------------------------- learner
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
