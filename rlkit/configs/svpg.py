"""SVPG: Stein Variational Policy Gradient (Liu, Ramachandran, Liu & Peng 2017), A2C or PPO
particles.

    python recipes/svpg.py                                  # CartPole-v1, 4 A2C particles
    python recipes/svpg.py --particle ppo --epochs 4 --minibatch-size 64  # PPO particles
    python recipes/svpg.py --particles 8 --num-envs 64      # 8 particles x 8 envs
    python recipes/svpg.py --temperature 10                 # more repulsion between particles
    python recipes/svpg.py --accelerator cpu --devices 2 --strategy ddp
    python recipes/svpg.py --help                           # every flag

Algorithm box:
    1. config      SVPGConfig (defaults, per-env preset, --config YAML, flags)
    2. networks    P actors pi_p(a|s) and P critics V_p(s), parameters stacked [P, ...] and run
                   as one vmapped batch; env e of N acts with particle e // (N / P)
    3. estimator   GAE(gamma, lambda) per env, with that env's particle's critic
    4. loss        the particle algorithm's loss per particle, summed over P: A2C
                   (-log pi A + value regression + entropy) or PPO (clipped surrogate + value
                   regression + entropy, --epochs x minibatches of every particle's samples)
    5. learner     at every optimiser step: per-particle gradient clipping, then the Stein
                   update of the actors' gradients: phi_i = 1/P sum_j [k(th_j, th_i) grad J_j
                   / alpha + grad_th_j k(th_j, th_i)], RBF kernel, median-heuristic bandwidth
    6. fit         the engine: collect, update, evaluate (all particles), checkpoint
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlkit.configs.base import TrainConfig, in_unit_interval, non_negative, positive
from rlkit.configs.checks import finite_floats

#: the algorithms a particle can run (``--particle``)
PARTICLE_ALGORITHMS = ("a2c", "ppo")
#: PPO particles' clip range when ``--clip-epsilon`` is not given (PPO's, SB3's default)
DEFAULT_CLIP_EPSILON = 0.2


@dataclass(frozen=True)
class SVPGConfig(TrainConfig):
    """Train SVPG. Each particle is by default SB3's A2C (8 envs x 5 steps, RMSprop)."""

    total_frames: int = field(
        default=800_000, metadata={"help": "frames to train for, all particles together"}
    )
    particles: int = field(default=4, metadata={"help": "number of policy particles P"})
    particle: str = field(
        default="a2c",
        metadata={
            "help": "each particle's own algorithm: a2c, or ppo (clipped surrogate, "
            "--epochs x --minibatch-size)",
            "choices": PARTICLE_ALGORITHMS,
        },
    )
    temperature: float = field(
        default=1.0, metadata={"help": "SVPG temperature alpha: larger weights the repulsion"}
    )
    bandwidth: float | None = field(
        default=None,
        metadata={"help": "fixed RBF kernel width h in exp(-d^2/h); none: median heuristic"},
    )
    num_envs: int = field(
        default=32,
        metadata={"help": "parallel envs per rank, all particles together (a multiple of P)"},
    )
    rollout_steps: int = field(default=5, metadata={"help": "steps per env per batch"})
    epochs: int = field(
        default=1,
        metadata={"help": "passes over each batch (a2c: full-batch gradient steps per batch)"},
    )
    minibatch_size: int | None = field(
        default=None,
        metadata={
            "help": "ppo particles: each particle's samples per gradient step (none: its "
            "whole batch)"
        },
    )
    clip_epsilon: float | None = field(
        default=None,
        metadata={"help": "ppo particles: policy ratio clip range (none: 0.2)"},
    )
    lr: float = field(default=7e-4, metadata={"help": "learning rate (initial, when linear)"})
    lr_schedule: str = field(
        default="constant",
        metadata={"help": "constant or linear (to --lr-final)", "choices": ("constant", "linear")},
    )
    lr_final: float = field(default=0.0, metadata={"help": "final learning rate when linear"})
    optimizer: str = field(
        default="rmsprop", metadata={"help": "adam or rmsprop", "choices": ("adam", "rmsprop")}
    )
    adam_eps: float = field(default=1e-5, metadata={"help": "optimizer epsilon"})
    gamma: float = field(default=0.99, metadata={"help": "discount factor"})
    gae_lambda: float = field(default=1.0, metadata={"help": "GAE lambda (1: n-step return)"})
    entropy_coef: float = field(default=0.0, metadata={"help": "entropy bonus coefficient"})
    value_coef: float = field(default=0.5, metadata={"help": "value loss coefficient"})
    max_grad_norm: float = field(
        default=0.5, metadata={"help": "per-particle gradient clipping norm (0: off)"}
    )
    normalize_advantage: bool = field(
        default=False,
        metadata={
            "help": "standardise advantages within each particle (ppo: per minibatch, a2c: "
            "per batch)"
        },
    )
    hidden: tuple[int, ...] = field(
        default=(64, 64), metadata={"help": "hidden layer sizes, e.g. '64 64'"}
    )
    activation: str = field(
        default="tanh", metadata={"help": "tanh or relu", "choices": ("tanh", "relu")}
    )
    eval_episodes: int = field(
        default=20,
        metadata={
            "help": "evaluation episodes, a multiple of P (episode e runs particle e//(E/P))"
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        finite_floats(self)
        positive(self, "particles", "temperature", "bandwidth", "rollout_steps", "epochs")
        positive(self, "minibatch_size", "clip_epsilon")
        positive(self, "lr", "adam_eps")
        non_negative(self, "lr_final", "entropy_coef", "value_coef", "max_grad_norm")
        in_unit_interval(self, "gamma", "gae_lambda")
        for name in ("num_envs", "eval_episodes"):
            value = getattr(self, name)
            if value % self.particles:
                fix = max(self.particles, value // self.particles * self.particles)
                raise ValueError(
                    f"--{name.replace('_', '-')} {value} is not a multiple of --particles "
                    f"{self.particles}: each particle gets an equal share; use {fix}"
                )
        if not self.hidden or any(h <= 0 for h in self.hidden):
            raise ValueError(f"--hidden needs positive layer sizes, got {self.hidden}")
        self._check_particle_flags()

    def _check_particle_flags(self) -> None:
        if self.particle not in PARTICLE_ALGORITHMS:
            raise ValueError(
                f"--particle {self.particle!r} is not a particle algorithm: use one of "
                f"{', '.join(PARTICLE_ALGORITHMS)}"
            )
        if self.particle != "ppo":
            for name in ("minibatch_size", "clip_epsilon"):
                if getattr(self, name) is not None:
                    flag = "--" + name.replace("_", "-")
                    raise ValueError(
                        f"{flag} belongs to PPO particles, which --particle {self.particle} "
                        f"does not use: add --particle ppo or drop {flag}"
                    )
            return
        per_particle = self.batch_size // self.particles
        if self.minibatch_size is not None and self.minibatch_size > per_particle:
            raise ValueError(
                f"--minibatch-size {self.minibatch_size} is larger than a particle's batch "
                f"(--num-envs {self.num_envs} / --particles {self.particles} x --rollout-steps "
                f"{self.rollout_steps} = {per_particle}): lower it or collect more per batch"
            )

    @property
    def batch_size(self) -> int:
        """Samples per collected batch on one rank (all particles)."""
        return self.num_envs * self.rollout_steps

    @property
    def clip_range(self) -> float:
        """PPO particles' ratio clip range: ``clip_epsilon``, 0.2 when none is given."""
        return DEFAULT_CLIP_EPSILON if self.clip_epsilon is None else self.clip_epsilon


PRESETS: dict[str, dict] = {}


#: the config ``recipes/svpg.py`` parses (:func:`rlkit.algorithms.recipe`)
CONFIG = SVPGConfig
