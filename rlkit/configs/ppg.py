"""PPG: Phasic Policy Gradient (Cobbe et al. 2020).

    python recipes/ppg.py                                  # CartPole-v1, built-in defaults
    python recipes/ppg.py --env LunarLander-v3             # preset
    python recipes/ppg.py --env CarRacing-v3 --encoder impala   # pixels: IMPALA-CNN preset
    python recipes/ppg.py --arch shared --aux-optimizer shared  # single-network variant
    python recipes/ppg.py --accelerator cpu --devices 2 --strategy ddp
    python recipes/ppg.py --help                           # every flag

Algorithm box:
    1. config      PPGConfig (defaults, per-env preset, --config YAML, flags)
    2. networks    policy net (trunk -> pi head, trunk -> aux value head) and value net
                   (dual), or one trunk with a detached value head (shared)
    3. estimator   GAE(gamma, lambda) writes advantage and value_target
    4. losses      policy phase: PPO clipped surrogate + value regression + entropy;
                   aux phase: aux value + beta_clone * KL(pi_old || pi) + true value
    5. learner     n_pi policy-phase batches (the actor --epochs, the critic --value-epochs,
                   each with its own Adam), then aux_epochs over the stored rollouts
    6. fit         the engine: collect, update, evaluate, checkpoint
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlkit.configs import ppo
from rlkit.configs.base import non_negative, positive
from rlkit.configs.encoders import EncoderConfig
from rlkit.configs.onpolicy import ClipConfig, IntrinsicConfig
from rlkit.configs.suites import MINATAR_PPO, MUJOCO_PPO, only_fields

#: ``--arch`` choices: separate policy and value networks, or one trunk
ARCHS = ("dual", "shared")
#: ``--init-fn`` choices (rllte's init_fn)
INIT_FNS = ("orthogonal", "xavier_uniform", "xavier_normal", "default")


def _help(text: str, **kw: Any) -> dict[str, Any]:
    return {"help": text, **kw}


@dataclass(frozen=True)
class PPGConfig(EncoderConfig, IntrinsicConfig, ClipConfig):
    """Train PPG. Defaults solve CartPole-v1; flags override (see --help).

    On top of the on-policy flags (``--epochs`` is the policy epochs)."""

    total_frames: int = field(default=200_000, metadata={"help": "frames to train for"})
    rollout_steps: int = 32
    epochs: int = field(default=10, metadata={"help": "policy epochs per batch"})
    minibatch_size: int = 128
    lr: float = field(default=1e-3, metadata={"help": "initial learning rate"})
    lr_schedule: str = "linear"
    gamma: float = 0.98
    gae_lambda: float = 0.8
    clip_epsilon_final: float | None = 0.0

    n_pi: int = field(default=8, metadata={"help": "policy-phase iterations per phase"})
    value_epochs: int | None = field(
        default=None, metadata=_help("value epochs per policy-phase batch (none: --epochs)")
    )
    aux_epochs: int = field(default=6, metadata=_help("auxiliary-phase epochs over the buffer"))
    aux_minibatches: int = field(
        default=4, metadata=_help("auxiliary minibatches (of whole rollouts) per epoch")
    )
    aux_grad_accum: int = field(
        default=1, metadata=_help("chunks each aux minibatch's gradient is accumulated over")
    )
    beta_clone: float = field(default=1.0, metadata=_help("weight of KL(pi_old || pi)"))
    aux_value_coef: float = field(default=1.0, metadata=_help("weight of the aux value loss"))
    aux_true_value_coef: float = field(
        default=1.0, metadata=_help("weight of the true value loss in the aux phase")
    )
    aux_lr: float | None = field(
        default=None, metadata=_help("auxiliary learning rate (none: --lr; scheduled alike)")
    )
    aux_optimizer: str = field(
        default="separate",
        metadata=_help(
            "separate: its own Adam (reference); shared: the policy phase's optimizers",
            choices=("separate", "shared"),
        ),
    )
    arch: str = field(
        default="dual",
        metadata=_help(
            "dual: separate policy and value networks; shared: one trunk, detached value head",
            choices=ARCHS,
        ),
    )
    init_fn: str = field(
        default="orthogonal",
        metadata=_help(
            "weight initialisation (rllte's init_fn): orthogonal (rlkit's builders: gain "
            "sqrt 2 hidden, 0.01 policy head, 1 value head), xavier_uniform / xavier_normal "
            "(Xavier convolutions, orthogonal gain-1 Linear layers, policy head x0.01) or "
            "default (PyTorch's own initialisation of every layer)",
            choices=INIT_FNS,
        ),
    )
    full_batch_advantage_norm: bool = field(
        default=False,
        metadata=_help("standardise advantages over the whole batch (not per minibatch)"),
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        positive(self, "n_pi", "aux_minibatches", "aux_grad_accum")
        positive(self, "value_epochs", "aux_lr")
        if self.arch == "shared" and self.critic_hidden is not None:
            raise ValueError(
                "--critic-hidden sizes a separate value network, but --arch shared puts the "
                "value head on the policy trunk: use --arch dual, or drop --critic-hidden"
            )
        non_negative(self, "aux_epochs", "beta_clone", "aux_value_coef", "aux_true_value_coef")
        rollouts = self.n_pi * self.num_envs
        if self.aux_epochs and self.aux_minibatches > rollouts:
            raise ValueError(
                f"--aux-minibatches {self.aux_minibatches} exceeds the rollouts in the buffer "
                f"(--n-pi {self.n_pi} x --num-envs {self.num_envs} = {rollouts}): lower it"
            )
        per_minibatch = rollouts // self.aux_minibatches
        if self.aux_epochs and self.aux_grad_accum > per_minibatch:
            raise ValueError(
                f"--aux-grad-accum {self.aux_grad_accum} exceeds the rollouts per aux "
                f"minibatch ({per_minibatch}): lower it or --aux-minibatches"
            )


#: Settings that override the defaults for an environment (flags and --config still win).
PRESETS: dict[str, dict] = {
    # PPO's LunarLander preset (the same settings) plus the phase length
    "LunarLander-v3": dict(ppo.PRESETS["LunarLander-v3"], n_pi=8),
    # sparse MountainCar (reward 1 at the goal), scored on MountainCar-v0 with sampled
    # actions: PPO's preset (recipes/rnd.py's settings) plus the phase length; what
    # --intrinsic rnd --pretraining is measured on (docs/intrinsic.md)
    "rlkit/MountainCarSparse-v0": dict(ppo.PRESETS["rlkit/MountainCarSparse-v0"], n_pi=8),
    # pixel observations: the paper's Procgen settings, scaled to a CPU-sized batch
    "CarRacing-v3": dict(
        encoder="impala",
        num_envs=8,
        rollout_steps=64,
        epochs=1,
        minibatch_size=256,
        lr=5e-4,
        gamma=0.99,
        gae_lambda=0.95,
        entropy_coef=0.01,
        n_pi=32,
        clip_epsilon_final=None,
        hidden=(256,),
        activation="relu",
    ),
}


# every MinAtar/* id: PPO's MinAtar preset (gymnax-blines' config and MLP network,
# rlkit.configs.suites.MINATAR_PPO) with the PPG paper's phase settings (Cobbe et al. 2021,
# Table 1: E_pi = 1, E_V = 1, N_pi = 32, E_aux = 6, beta_clone = 1; its auxiliary minibatches
# hold 1,024 frames, so here 256 minibatches of 8 rollouts of 128 steps), so that PPG differs
# from PPO's preset only where the paper's PPG differs from PPO
PRESETS["MinAtar/*"] = dict(
    MINATAR_PPO,
    epochs=1,
    value_epochs=1,
    n_pi=32,
    aux_epochs=6,
    aux_minibatches=256,
    beta_clone=1.0,
)


# every MuJoCo task and any continuous-control task with no preset of its own
# (rlkit.configs.suites): PPO's (CleanRL's ppo_continuous_action.py, suites.MUJOCO_PPO) with
# PPG's phases at their defaults; not yet measured on MuJoCo
PRESETS["MuJoCo/*"] = only_fields(MUJOCO_PPO, PPGConfig)
PRESETS["*:continuous"] = dict(PRESETS["MuJoCo/*"])
PRESETS["Pendulum-v1"] = {}  # the defaults, as the docs and tests run it there


#: the config ``recipes/ppg.py`` parses (:func:`rlkit.algorithms.recipe`)
CONFIG = PPGConfig
