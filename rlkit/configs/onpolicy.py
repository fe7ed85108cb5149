"""Configs shared by the on-policy recipes, torch-free: the policy-gradient flags, the GAE
lambda and the clipped-surrogate ranges (the learners in :mod:`rlkit.algorithms.onpolicy`
take none of them: the recipes' builds read them)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from rlkit.configs.base import TrainConfig, in_unit_interval, non_negative, positive
from rlkit.configs.checks import (
    LR_DECAY_FRAMES_HELP,
    check_batch_floor,
    check_lr_decay_frames,
    check_lr_gamma,
    finite_floats,
)


def _help(text: str, **kw: Any) -> dict[str, Any]:
    return {"help": text, **kw}


#: ``--lr-schedule`` choices of the on-policy recipes
LR_SCHEDULES = ("constant", "linear", "cosine", "exponential", "kl")

#: ``--optimizer`` choices of the on-policy recipes
OPTIMIZERS = ("adam", "adamw", "rmsprop", "sgd")

#: ``--recurrent`` choices; the recipes that take memory
RECURRENT = ("none", "lstm", "gru")
MEMORY_RECIPES = "ppo, a2c, rnd, impala and appo"


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
            "constant, linear or cosine (to --lr-final), exponential (x --lr-gamma per "
            "update) or kl (adaptive from --kl-target)",
            choices=LR_SCHEDULES,
        ),
    )
    lr_final: float = field(
        default=0.0, metadata=_help("final learning rate of --lr-schedule linear or cosine")
    )
    lr_gamma: float | None = field(
        default=None,
        metadata=_help(
            "--lr-schedule exponential: the rate is --lr x lr-gamma^n after n updates "
            "(torch's ExponentialLR stepped per batch); in (0, 1]"
        ),
    )
    lr_decay_frames: int | None = field(
        default=None,
        metadata=_help(LR_DECAY_FRAMES_HELP),
    )
    kl_target: float = field(default=0.01, metadata=_help("KL target of --lr-schedule kl"))
    target_kl: float | None = field(
        default=None,
        metadata=_help(
            "stop a batch's epochs at the first minibatch whose approx_kl exceeds 1.5 x "
            "this, without stepping on it (Stable-Baselines3's target_kl; a critic with its "
            "own optimiser trains on). The loss's KL: PPO's from the policy that collected "
            "the batch; APPO's from its target network; IMPALA's from the acting policy, "
            "policy lag included. none: every epoch runs"
        ),
    )
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
    bounded_mean: bool = field(
        default=False,
        metadata=_help(
            "squash a Gaussian policy's mean into the action bounds, mid + half-range x "
            "tanh(output) (Tianshou's ActorProb default); actions are still sampled around it "
            "and clipped by the env. Past a bound, clipped actions carry no gradient and an "
            "unbounded mean can drift far out (IMPALA on Pendulum-v1: means of +-20 for "
            "actions in [-2, 2]). Continuous actions with finite bounds only"
        ),
    )
    activation: str = field(
        default="tanh", metadata=_help("tanh or relu", choices=("tanh", "relu"))
    )
    recurrent: str = field(
        default="none",
        metadata=_help(
            "memory: an lstm or gru core before each network's head (actor and critic each "
            f"their own, as SB3-contrib's RecurrentPPO), trained on sequences; {MEMORY_RECIPES} "
            "(docs/memory.md). none: no memory",
            choices=RECURRENT,
        ),
    )
    recurrent_size: int = field(
        default=128,
        metadata=_help("units of the --recurrent core (SB3-contrib's lstm_hidden_size)"),
    )
    recurrent_layers: int = field(default=1, metadata=_help("layers of the --recurrent core"))
    sequence_length: int | None = field(
        default=None,
        metadata=_help(
            "--recurrent: train on sequences of this many steps cut from each env's row "
            "(a divisor of --rollout-steps; --minibatch-size a multiple of it); none: whole "
            "rows. A new episode inside a sequence starts from a zero state either way"
        ),
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        finite_floats(self)
        positive(self, "recurrent_size", "recurrent_layers", "sequence_length")
        self._check_memory()
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
        positive(self, "kl_lr_min", "kl_lr_max", "std_init", "target_kl")
        non_negative(self, "weight_decay")
        check_lr_decay_frames(self)
        check_lr_gamma(self)
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
        # with an image encoder the heads may read its features directly (hidden=(), as the
        # MinAtar and Nature networks; rlkit.configs.suites)
        image = getattr(self, "encoder", "mlp") != "mlp"
        if (not self.hidden and not image) or any(h <= 0 for h in self.hidden):
            raise ValueError(f"--hidden needs positive layer sizes, got {self.hidden}")
        for name in ("actor_hidden", "critic_hidden"):
            sizes = getattr(self, name)
            if sizes is not None and (not sizes or any(h <= 0 for h in sizes)):
                flag = "--" + name.replace("_", "-")
                raise ValueError(
                    f"{flag} needs positive layer sizes, got {sizes}: e.g. {flag} 64 64, or "
                    "none for --hidden"
                )

    def _check_memory(self) -> None:
        if self.recurrent == "none":
            return
        if self.compile:  # measured: tests/test_compile.py, the xfail recurrent case
            raise ValueError(
                f"--compile with --recurrent {self.recurrent}: the compiled recurrent loss does "
                "not reproduce the eager one yet (parameters 4e-3 apart after one update); "
                "drop --compile (docs/memory.md)"
            )
        length = self.sequence_length or self.rollout_steps
        if self.rollout_steps % length:
            raise ValueError(
                f"--sequence-length {length} does not divide --rollout-steps "
                f"{self.rollout_steps}: each env's row is cut into whole sequences; use a "
                "divisor such as "
                f"{max(d for d in range(1, length + 1) if self.rollout_steps % d == 0)}"
            )
        if self.minibatch_size is not None and self.minibatch_size % length:
            raise ValueError(
                f"--minibatch-size {self.minibatch_size} is not a multiple of the sequence "
                f"length {length} (--sequence-length, else --rollout-steps): a recurrent "
                "policy trains on whole sequences; use "
                f"{max(1, self.minibatch_size // length) * length}"
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
    min_episodes: int | None = field(
        default=None,
        metadata=_help(
            "collect --rollout-steps chunks, continuing the same envs, until the batch holds "
            "at least this many complete episodes (pyrado's min_rollouts): a batch is "
            "[num-envs, k x rollout-steps] with k >= 1 varying per batch; none: one chunk"
        ),
    )
    min_steps: int | None = field(
        default=None,
        metadata=_help(
            "at least this many frames per batch on each rank (pyrado's min_steps): "
            "k = ceil(min-steps / (num-envs x rollout-steps)) chunks; none: one chunk"
        ),
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        in_unit_interval(self, "gae_lambda")
        check_batch_floor(self)


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


#: ``--init`` choices (rlkit.modules.networks.INITS)
NETWORK_INITS = ("orthogonal", "torch", "gymnax")


@dataclass(frozen=True)
class InitConfig:
    """``--init``: how the actor and critic built by
    :func:`rlkit.modules.actor_critic_networks` are initialised (PPO, A2C, IMPALA, APPO,
    RND). Mixed in before the recipe's config class, so its ``__post_init__`` runs the rest
    of the chain first."""

    init: str = field(
        default="orthogonal",
        metadata=_help(
            "weight initialisation of the actor and critic (not the intrinsic-reward "
            "networks of RND or --intrinsic, which keep their own): orthogonal (CleanRL's and "
            "SB3's: gain sqrt 2 on hidden layers, 0.01 on the policy head, 1 on the value "
            "head, zero biases), torch (PyTorch's default, SB3's ortho_init=False) or gymnax "
            "(gymnax-blines': flax's LeCun-normal weights on every layer, biases uniform in "
            "[0, 0.05))",
            choices=NETWORK_INITS,
        ),
    )

    def __post_init__(self) -> None:
        super().__post_init__()  # type: ignore[misc]
        if self.init not in NETWORK_INITS:
            raise ValueError(
                f"--init {self.init!r} is not a scheme: use one of {', '.join(NETWORK_INITS)}"
            )


#: ``--intrinsic`` choices (rlkit.objectives.intrinsic.INTRINSIC_REWARDS, and none)
INTRINSIC_CHOICES = ("none", "rnd", "icm")


@dataclass(frozen=True)
class IntrinsicConfig:
    """Flags of an intrinsic reward attached to a policy-gradient recipe (PPO, A2C, PPG,
    DAAC): ``--intrinsic NAME``, the reward's mix and ``--pretraining``.

    Mixed in before the recipe's config class (``class PPOConfig(IntrinsicConfig,
    ClipConfig)``), so its ``__post_init__`` runs the rest of the chain first."""

    intrinsic: str = field(
        default="none",
        metadata=_help(
            "an intrinsic reward learned alongside the policy: rnd (novelty, Random Network "
            "Distillation) or icm (curiosity, Intrinsic Curiosity Module); none: off",
            choices=INTRINSIC_CHOICES,
        ),
    )
    int_coef: float = field(
        default=0.5,
        metadata=_help(
            "weight of the intrinsic reward in the reward learned from, "
            "ext_coef x extrinsic + int_coef x intrinsic (with --intrinsic)"
        ),
    )
    ext_coef: float = field(
        default=1.0, metadata=_help("weight of the extrinsic reward (with --intrinsic)")
    )
    pretraining: bool = field(
        default=False,
        metadata=_help(
            "learn from the intrinsic reward only (the extrinsic return is still logged and "
            "evaluated); fine-tune afterwards with --init-from this run's checkpoint"
        ),
    )
    intrinsic_lr: float | None = field(
        default=None,
        metadata=_help(
            "learning rate of the intrinsic reward's networks (none: --lr, same schedule)"
        ),
    )
    gamma_int: float = field(
        default=0.99,
        metadata=_help("discount of the intrinsic return whose spread scales the bonus"),
    )

    def __post_init__(self) -> None:
        super().__post_init__()  # type: ignore[misc]
        non_negative(self, "int_coef", "ext_coef")
        positive(self, "intrinsic_lr")
        in_unit_interval(self, "gamma_int")
        if self.intrinsic == "none":
            if self.pretraining:
                raise ValueError(
                    "--pretraining learns from an intrinsic reward only, and there is none: "
                    "add --intrinsic rnd or --intrinsic icm"
                )
            return
        if self.int_coef == 0:
            raise ValueError(
                f"--intrinsic {self.intrinsic} with --int-coef 0 would learn nothing from it: "
                "set --int-coef > 0 or drop --intrinsic"
            )
        if self.ext_coef == 0 and not self.pretraining:
            raise ValueError(
                "--ext-coef 0 learns from the intrinsic reward only: say so with --pretraining"
            )
