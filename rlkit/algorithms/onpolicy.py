"""On-policy learners: a value estimator, then epochs x minibatches of a loss.

PPO, A2C and their relatives share this update; they differ in the loss module and in
defaults. The algorithm's maths lives in the loss and the estimator; this file only orders
the steps, applies schedules and averages diagnostics.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict import TensorDictBase
from torch import nn

from rlkit import keys
from rlkit.algorithms._checks import (
    LR_DECAY_FRAMES_HELP,
    check_lr_decay_frames,
    finite_floats,
)
from rlkit.data.minibatch import minibatch_indices
from rlkit.modules.builders import actor_critic_networks
from rlkit.training import schedules
from rlkit.training.config import TrainConfig, in_unit_interval, non_negative, positive
from rlkit.training.engine import Context, Learner
from rlkit.training.update import LossContractError, LossGroup, update_loop
from rlkit.value.standardizer import RunningStandardizer


def _help(text: str, **kw: Any) -> dict[str, Any]:
    return {"help": text, **kw}


#: ``--optimizer`` choices of the on-policy recipes
OPTIMIZERS = ("adam", "adamw", "rmsprop", "sgd")


@dataclass(frozen=True)
class PolicyGradientConfig(TrainConfig):
    """Flags shared by every on-policy recipe, whatever its advantage estimator: the
    V-trace recipes (IMPALA, APPO) extend it directly, the GAE ones through
    :class:`OnPolicyConfig` (which adds ``--gae-lambda``)."""

    rollout_steps: int = field(default=32, metadata=_help("steps per env per batch"))
    epochs: int = field(default=10, metadata=_help("passes over each batch"))
    # None (the whole batch) only where a recipe declares it (A2C)
    minibatch_size: int | None = field(default=256, metadata=_help("samples per gradient step"))
    lr: float = field(default=3e-4, metadata=_help("learning rate (initial, when scheduled)"))
    lr_schedule: str = field(
        default="constant",
        metadata=_help(
            "constant, linear (to --lr-final) or kl (adaptive from --kl-target)",
            choices=("constant", "linear", "kl"),
        ),
    )
    lr_final: float = field(
        default=0.0, metadata=_help("final learning rate of --lr-schedule linear")
    )
    lr_decay_frames: int | None = field(
        default=None,
        metadata=_help(LR_DECAY_FRAMES_HELP),
    )
    kl_target: float = field(default=0.01, metadata=_help("KL target of --lr-schedule kl"))
    kl_factor: float = field(
        default=2.0,
        metadata=_help(
            "KL band of --lr-schedule kl: the lr falls when the KL exceeds kl-factor x "
            "--kl-target and rises when it is below --kl-target / kl-factor (unilab's "
            "adaptive_kl_factor; >= 1)"
        ),
    )
    kl_lr_factor: float = field(
        default=1.5,
        metadata=_help(
            "--lr-schedule kl divides or multiplies the lr by this (unilab's "
            "adaptive_lr_factor; >= 1)"
        ),
    )
    kl_lr_min: float = field(
        default=1e-6, metadata=_help("lowest learning rate of --lr-schedule kl (<= --lr)")
    )
    kl_lr_max: float | None = field(
        default=None,
        metadata=_help(
            "highest learning rate of --lr-schedule kl (>= --lr); none: max(10 x --lr, 1e-2)"
        ),
    )
    optimizer: str = field(
        default="adam",
        metadata=_help(
            "adam, adamw (decoupled weight decay), rmsprop (alpha 0.99) or sgd (RLlib's "
            "optim, evorl's optimizer); --adam-eps is the epsilon of all but sgd",
            choices=OPTIMIZERS,
        ),
    )
    adam_eps: float = field(default=1e-5, metadata=_help("optimizer epsilon"))
    weight_decay: float | None = field(
        default=None,
        metadata=_help(
            "weight decay of --optimizer (none: the optimizer's own default, 0.01 for "
            "adamw and 0 for the others)"
        ),
    )
    gamma: float = field(default=0.99, metadata=_help("discount factor"))
    entropy_coef: float = field(default=0.0, metadata=_help("entropy bonus coefficient"))
    entropy_coef_final: float | None = field(
        default=None, metadata=_help("final entropy coefficient (linear schedule); none: constant")
    )
    value_coef: float = field(default=0.5, metadata=_help("value loss coefficient"))
    max_grad_norm: float = field(default=0.5, metadata=_help("gradient clipping norm (0: off)"))
    normalize_advantage: bool = field(
        default=True, metadata=_help("standardise advantages per minibatch")
    )
    running_advantage_norm: bool = field(
        default=False,
        metadata=_help(
            "standardise advantages once per batch with the mean and std of all advantages "
            "so far, carried across batches and checkpointed (pyrado's RunningStandardizer); "
            "replaces --normalize-advantage, which must then be false"
        ),
    )
    normalize_obs: bool = field(default=False, metadata=_help("running observation normalisation"))
    normalize_reward: bool = field(
        default=False,
        metadata=_help(
            "scale training rewards by the running std of the discounted return (SB3 "
            "VecNormalize's norm_reward); logged returns and evaluation stay in env units"
        ),
    )
    hidden: tuple[int, ...] = field(
        default=(64, 64), metadata=_help("hidden layer sizes, e.g. '64 64'")
    )
    actor_hidden: tuple[int, ...] | None = field(
        default=None,
        metadata=_help("the policy network's hidden sizes (evorl's actor sizes); none: --hidden"),
    )
    critic_hidden: tuple[int, ...] | None = field(
        default=None,
        metadata=_help("the value network's hidden sizes (evorl's critic sizes); none: --hidden"),
    )
    std_init: float | None = field(
        default=None,
        metadata=_help(
            "initial standard deviation of a Gaussian policy's actions (pyrado's std_init; "
            "the learned log-std starts at its log); none: 1 (log-std 0, CleanRL's). "
            "Continuous actions only"
        ),
    )
    activation: str = field(
        default="tanh", metadata=_help("tanh or relu", choices=("tanh", "relu"))
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        finite_floats(self)
        positive(self, "rollout_steps", "epochs", "minibatch_size", "lr", "adam_eps")
        non_negative(self, "lr_final", "entropy_coef", "entropy_coef_final", "value_coef")
        non_negative(self, "max_grad_norm")
        in_unit_interval(self, "gamma")
        if self.minibatch_size is not None and self.minibatch_size > self.batch_size:
            raise ValueError(
                f"--minibatch-size {self.minibatch_size} is larger than the batch "
                f"(--num-envs {self.num_envs} x --rollout-steps {self.rollout_steps} = "
                f"{self.batch_size}): lower it or collect more per batch"
            )
        if self.running_advantage_norm and self.normalize_advantage:
            raise ValueError(
                "--running-advantage-norm replaces the per-minibatch standardisation, which "
                "would undo it: add --normalize-advantage false"
            )
        if self.lr_schedule == "kl" and self.kl_target <= 0:
            raise ValueError(f"--kl-target must be > 0, got {self.kl_target}")
        positive(self, "kl_lr_min", "kl_lr_max", "std_init")
        non_negative(self, "weight_decay")
        check_lr_decay_frames(self)
        for name in ("kl_factor", "kl_lr_factor"):
            if getattr(self, name) < 1:
                flag = "--" + name.replace("_", "-")
                raise ValueError(
                    f"{flag} must be >= 1 (the KL band and the lr step are target x factor "
                    f"and lr x factor; below 1 they invert), got {getattr(self, name)}"
                )
        if self.lr_schedule == "kl" and self.kl_lr_min > self.lr:
            raise ValueError(
                f"--kl-lr-min {self.kl_lr_min} is above --lr {self.lr}: the adaptive learning "
                "rate starts at --lr inside [--kl-lr-min, --kl-lr-max]; lower --kl-lr-min"
            )
        if self.lr_schedule == "kl" and self.kl_lr_ceiling < self.lr:
            raise ValueError(
                f"--kl-lr-max {self.kl_lr_max} is below --lr {self.lr}: the adaptive learning "
                "rate starts at --lr inside [--kl-lr-min, --kl-lr-max]; raise --kl-lr-max"
            )
        if not self.hidden or any(h <= 0 for h in self.hidden):
            raise ValueError(f"--hidden needs positive layer sizes, got {self.hidden}")
        for name in ("actor_hidden", "critic_hidden"):
            sizes = getattr(self, name)
            if sizes is not None and (not sizes or any(h <= 0 for h in sizes)):
                flag = "--" + name.replace("_", "-")
                raise ValueError(
                    f"{flag} needs positive layer sizes, got {sizes}: e.g. {flag} 64 64, or "
                    "none for --hidden"
                )

    def env_options(self) -> dict[str, Any]:
        if not self.normalize_reward:
            return {}
        return {"normalize_reward": True, "gamma": self.gamma}

    @property
    def actor_layers(self) -> tuple[int, ...]:
        """The policy network's hidden sizes: ``--actor-hidden``, else ``--hidden``."""
        return self.hidden if self.actor_hidden is None else self.actor_hidden

    @property
    def critic_layers(self) -> tuple[int, ...]:
        """The value network's hidden sizes: ``--critic-hidden``, else ``--hidden``."""
        return self.hidden if self.critic_hidden is None else self.critic_hidden

    @property
    def init_log_std(self) -> float | None:
        """``log(--std-init)``, or None for the builders' default (log-std 0)."""
        return None if self.std_init is None else math.log(self.std_init)

    @property
    def kl_lr_ceiling(self) -> float:
        """Highest learning rate of ``--lr-schedule kl``: ``--kl-lr-max``, or
        ``max(10 lr, 1e-2)`` when none."""
        return max(self.lr * 10, 1e-2) if self.kl_lr_max is None else self.kl_lr_max

    @property
    def batch_size(self) -> int:
        """Samples per collected batch on one rank."""
        return self.num_envs * self.rollout_steps

    @property
    def minibatch(self) -> int:
        """Samples per gradient step: ``minibatch_size``, or the whole batch when none."""
        return self.batch_size if self.minibatch_size is None else self.minibatch_size


@dataclass(frozen=True)
class OnPolicyConfig(PolicyGradientConfig):
    """Flags shared by the GAE on-policy recipes (PPO, A2C and relatives): those of
    :class:`PolicyGradientConfig` and the GAE lambda."""

    gae_lambda: float = field(default=0.95, metadata=_help("GAE lambda"))

    def __post_init__(self) -> None:
        super().__post_init__()
        in_unit_interval(self, "gae_lambda")


@dataclass(frozen=True)
class ClipConfig(OnPolicyConfig):
    """Flags of the clipped-surrogate family (PPO, PPG): ratio and value clip ranges."""

    clip_epsilon: float = field(default=0.2, metadata=_help("policy ratio clip range"))
    clip_epsilon_final: float | None = field(
        default=None, metadata=_help("clip range at the end (linear); none: constant")
    )
    value_clip: float | None = field(
        default=None, metadata=_help("PPO2 value clipping range; none: unclipped value loss")
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        positive(self, "clip_epsilon", "value_clip")
        non_negative(self, "clip_epsilon_final")

    @property
    def loss_schedules(self) -> dict[str, tuple[float, float]]:
        """``loss_schedules`` for :class:`PolicyGradientLearner` (the annealed clip range)."""
        if self.clip_epsilon_final is None:
            return {}
        return {"clip_epsilon": (self.clip_epsilon, self.clip_epsilon_final)}


def make_optimizer(cfg: PolicyGradientConfig, params) -> torch.optim.Optimizer:
    """``--optimizer`` over ``params`` at ``--lr``: Adam / AdamW / RMSprop (alpha 0.99) with
    ``--adam-eps``, or plain SGD; ``--weight-decay`` when set."""
    params = list(params)
    kw: dict[str, Any] = {}
    decay = getattr(cfg, "weight_decay", None)
    if decay is not None:
        kw["weight_decay"] = decay
    # Adam: fused (one kernel for every parameter, CPU and CUDA), measured 140 us per step
    # here against 374 us for foreach and 491 us for torch's CPU default (a Python loop over
    # parameters); RMSprop has no fused kernel, so foreach.
    if cfg.optimizer == "rmsprop":
        return torch.optim.RMSprop(
            params, lr=cfg.lr, eps=cfg.adam_eps, alpha=0.99, foreach=True, **kw
        )
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, foreach=True, **kw)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, eps=cfg.adam_eps, fused=True, **kw)
    if cfg.optimizer != "adam":
        raise ValueError(f"--optimizer must be one of {OPTIMIZERS}, got {cfg.optimizer!r}")
    return torch.optim.Adam(params, lr=cfg.lr, eps=cfg.adam_eps, fused=True, **kw)


class PolicyGradientLearner(Learner):
    """Estimator, then ``epochs`` x minibatches of ``loss``; schedules applied per batch.

    Args:
        algo: the algorithm's name (written in checkpoints and summaries).
        actor: the policy (a TorchRL ``ProbabilisticActor`` writing ``action_log_prob``).
        critic: the V network writing ``state_value``.
        estimator: writes ``advantage`` and ``value_target`` (e.g. ``rlkit.value.GAE``).
        loss: returns ``loss_*`` terms.
        cfg: a :class:`PolicyGradientConfig` (or a subclass).
        loss_schedules: loss attributes annealed linearly over the frame budget,
            ``{"clip_epsilon": (0.2, 0.0)}``; ``entropy_coef`` is added from the config when
            ``--entropy-coef-final`` is set.
        obs_norm: running observation statistics inside the networks, updated after each
            batch's gradient steps (so a batch is scored with the statistics it was
            collected with), merged across ranks.
    """

    def __init__(
        self,
        *,
        algo: str,
        actor: nn.Module,
        critic: nn.Module,
        estimator: nn.Module,
        loss: nn.Module,
        cfg: PolicyGradientConfig,
        obs_norm: nn.Module | None = None,
        loss_schedules: Mapping[str, tuple[float, float]] | None = None,
    ) -> None:
        self.algo = algo
        self.loss_schedules = dict(loss_schedules or {})
        if cfg.entropy_coef_final is not None:
            self.loss_schedules["entropy_coef"] = (cfg.entropy_coef, cfg.entropy_coef_final)
        check_schedules(loss, self.loss_schedules)
        self.actor, self.critic, self.estimator, self.loss = actor, critic, estimator, loss
        self.cfg, self.obs_norm = cfg, obs_norm
        self.nets = nn.ModuleDict({"actor": actor, "critic": critic})
        if obs_norm is not None:
            self.nets["obs_norm"] = obs_norm
        self.adv_norm = self._running_advantage_norm(cfg)
        params = {id(p): p for p in self.nets.parameters()}.values()  # shared trunks once
        self.optimizer = make_optimizer(cfg, params)
        self.kl_lr = (
            schedules.KLAdaptiveLR(
                lr=cfg.lr,
                target=cfg.kl_target,
                lr_min=cfg.kl_lr_min,
                lr_max=cfg.kl_lr_ceiling,
                factor_kl=cfg.kl_factor,
                factor_lr=cfg.kl_lr_factor,
            )
            if cfg.lr_schedule == "kl"
            else None
        )

    #: whether :meth:`update` standardises with ``--running-advantage-norm``; ``None``: when
    #: the learner keeps the shared :meth:`update` (a subclass whose update calls it sets True)
    supports_running_advantage_norm: bool | None = None

    def _running_advantage_norm(self, cfg) -> RunningStandardizer | None:
        """The running advantage standardiser of ``--running-advantage-norm`` (a module, so
        checkpoints keep its statistics), or None."""
        if not getattr(cfg, "running_advantage_norm", False):
            return None
        supported = self.supports_running_advantage_norm
        if supported is None:
            supported = type(self).update is PolicyGradientLearner.update
        if not supported:
            raise ValueError(
                f"--running-advantage-norm is not supported by {self.algo}, whose update "
                "standardises its advantages its own way: drop the flag (ppo, a2c and appo "
                "support it)"
            )
        norm = RunningStandardizer()
        self.nets["adv_norm"] = norm
        return norm

    # ---------------------------------------------------------------- Learner interface
    def modules(self) -> dict[str, nn.Module]:
        return dict(self.nets.items())

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"optimizer": self.optimizer}

    @property
    def frames_per_batch(self) -> int:
        return self.cfg.batch_size

    def collect_policy(self) -> nn.Module:
        return self.actor

    def state_dict(self) -> dict[str, Any]:
        return {"kl_lr": self.kl_lr.state_dict()} if self.kl_lr else {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if self.kl_lr and "kl_lr" in state:
            self.kl_lr.load_state_dict(state["kl_lr"])

    # ---------------------------------------------------------------- the update
    def apply_schedules(self, progress: float) -> dict[str, float]:
        cfg = self.cfg
        if cfg.lr_schedule == "linear":
            lr = schedules.linear(cfg.lr, cfg.lr_final, lr_progress(cfg, progress))
        elif self.kl_lr is not None:
            lr = self.kl_lr.lr
        else:
            lr = cfg.lr
        schedules.set_lr(self.optimizer, lr)
        out = {"lr": lr}
        for name, (start, end) in self.loss_schedules.items():
            # a coefficient annealed to 0 stays just above it so validation holds
            value = schedules.linear(start, end, progress)
            setattr(self.loss, name, max(value, 1e-8) if start > 0 else value)
            out[name] = value
        return out

    def _minibatches(
        self, flat: TensorDictBase, generator: torch.Generator
    ) -> Iterable[TensorDictBase]:
        size = self.cfg.minibatch
        n = flat.shape[0]
        if size >= n:
            # one minibatch per epoch: the mean loss over the whole batch does not depend on
            # the order of its samples, so skip the shuffle and the copy
            return (flat,)
        order = minibatch_indices(n, size, generator=generator)
        return (flat[idx] for idx in order)

    def loss_groups(self) -> list[LossGroup]:
        """The groups :meth:`update` trains: one, the loss over actor and critic."""
        if not hasattr(self, "_groups"):
            self._groups = [
                LossGroup(
                    "policy",
                    self.loss,
                    self.optimizer,
                    epochs=self.cfg.epochs,
                    max_grad_norm=self.cfg.max_grad_norm,
                )
            ]
        return self._groups

    def update(self, batch: TensorDictBase, ctx: Context) -> dict[str, float]:
        sched = self.apply_schedules(ctx.progress)
        with torch.no_grad():
            self.estimator(batch)
            if self.adv_norm is not None:  # every rank's advantages: the same statistics
                self.adv_norm(batch, samples=ctx.all_gather(batch.get(keys.ADVANTAGE)))
        flat = batch.reshape(-1)
        result = update_loop(self.loss_groups(), flat, ctx, minibatches=self._minibatches)
        self.after_update(batch, result, ctx)
        return result | sched

    def after_update(self, batch: TensorDictBase, result: Mapping[str, float], ctx) -> None:
        """KL-adaptive learning rate from the batch's ``approx_kl``, then the observation
        statistics (after the gradient steps, so a batch is scored with the statistics it was
        collected with; every rank merges all ranks' observations)."""
        if self.kl_lr is not None:
            if "approx_kl" not in result:
                raise LossContractError(
                    f"--lr-schedule kl adapts the learning rate to the loss's approx_kl, but "
                    f"{type(self.loss).__name__} reports none: use --lr-schedule constant or "
                    "linear, or a loss that reports approx_kl"
                )
            kl = ctx.all_reduce_mean(torch.tensor(result["approx_kl"]))
            self.kl_lr.update(float(kl))
        if self.obs_norm is not None:
            self.obs_norm.update(ctx.all_gather(batch.get(keys.OBSERVATION)))


def lr_progress(cfg, progress: float) -> float:
    """Progress of ``--lr-schedule linear``: ``progress`` (frames / ``--total-frames``), or
    frames / ``--lr-decay-frames`` when set (then past 1: the final rate is held)."""
    return schedules.span_progress(progress, cfg.total_frames, cfg.lr_decay_frames)


def check_schedules(loss: nn.Module, schedules_: Mapping[str, tuple[float, float]]) -> None:
    """Every scheduled name must be a numeric attribute of ``loss`` (else nothing reads it)."""
    for name in schedules_:
        value = getattr(loss, name, None)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(
                f"loss_schedules names {name!r}, which {type(loss).__name__} does not have as a "
                "hyperparameter, so the schedule would change nothing: schedule one of its "
                "hyperparameters (e.g. clip_epsilon on PPOLoss, entropy_coef on any "
                "actor-critic loss)"
            )


def build_actor_critic(
    cfg: PolicyGradientConfig, env
) -> tuple[nn.Module, nn.Module, nn.Module | None]:
    """:func:`rlkit.modules.actor_critic_networks` with a config's network flags."""
    return actor_critic_networks(
        env,
        hidden=cfg.hidden,
        activation=cfg.activation,
        normalize_obs=cfg.normalize_obs,
        init_log_std=cfg.init_log_std,
        actor_hidden=cfg.actor_layers,
        critic_hidden=cfg.critic_layers,
    )
