"""DQN: deep Q-learning from a replay buffer (Mnih et al. 2015), double-DQN and n-step options.

    python recipes/dqn.py                                  # CartPole-v1, rl-zoo3's settings
    python recipes/dqn.py --target-return 475 --seed 3     # stop once solved
    python recipes/dqn.py --double-dqn --n-steps 3 --prioritized
    python recipes/dqn.py --env MinAtar/Breakout-v1          # MinAtar network and settings
    python recipes/dqn.py --accelerator cpu --devices 2 --strategy ddp
    python recipes/dqn.py --help                           # every flag

Algorithm box:
    1. config      DQNConfig (defaults, --config YAML, flags)
    2. network     Q(s, .): --encoder (mlp, or a CNN for pixels) -> --hidden -> one output
                   per action, and its target copy (hard update every k gradient steps)
    3. loss        TD regression, Huber or MSE, optionally double-DQN and n-step
    4. learner     replay buffer (uniform / prioritized), random fill, epsilon schedule,
                   utd_ratio gradient steps per collected frame
    5. fit         the engine: collect, update, evaluate (greedy), checkpoint
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlkit.configs.encoders import OffPolicyEncoderConfig
from rlkit.configs.offpolicy import OffPolicyConfig

#: ``--optimizer`` choices of DQN
DQN_OPTIMIZERS = ("adam", "rmsprop")


@dataclass(frozen=True)
class DQNConfig(OffPolicyEncoderConfig, OffPolicyConfig):
    """Train DQN. Defaults are rl-zoo3's tuned CartPole-v1 settings; flags override."""

    total_frames: int = field(default=100_000, metadata={"help": "frames to train for"})
    steps_per_batch: int = field(
        default=256, metadata={"help": "env steps per env between update phases (train_freq)"}
    )
    utd_ratio: float = field(
        default=0.5, metadata={"help": "gradient steps per collected frame (128 per 256)"}
    )
    batch_size: int = 64
    buffer_size: int = field(default=100_000, metadata={"help": "replay buffer capacity"})
    learning_starts: int = field(
        default=1000, metadata={"help": "frames of uniform random actions before learning"}
    )
    lr: float = field(default=2.3e-3, metadata={"help": "learning rate"})
    optimizer: str = field(
        default="adam",
        metadata={
            "help": "adam, or rmsprop: the DQN papers' centered RMSprop (Mnih et al. 2015, "
            "MinAtar's dqn.py: squared-gradient momentum 0.95, gradient momentum 0.95, "
            "minimum squared gradient 0.01)",
            "choices": DQN_OPTIMIZERS,
        },
    )
    max_grad_norm: float = field(default=10.0, metadata={"help": "gradient clipping (0: off)"})
    loss: str = field(
        default="huber", metadata={"help": "TD loss: huber or mse", "choices": ("huber", "mse")}
    )
    double_dqn: bool = field(default=False, metadata={"help": "double DQN bootstrap action"})
    target_update: str = field(
        default="hard",
        metadata={"help": "hard (copy) or soft (Polyak)", "choices": ("hard", "soft")},
    )
    target_update_period: int = field(
        default=128,
        metadata={
            "help": "gradient steps between target updates (SB3's 10 env steps with "
            "train_freq 256 syncs once per update phase: 128 steps)"
        },
    )
    tau: float = field(default=1.0, metadata={"help": "Polyak weight of --target-update soft"})
    epsilon_schedule: str = field(
        default="linear",
        metadata={"help": "linear or exponential", "choices": ("linear", "exponential")},
    )
    epsilon_start: float = field(default=1.0, metadata={"help": "initial exploration epsilon"})
    epsilon_end: float = field(default=0.04, metadata={"help": "final exploration epsilon"})
    exploration_fraction: float = field(
        default=0.16, metadata={"help": "share of the budget of the linear epsilon decay"}
    )
    epsilon_decay: float = field(
        default=0.99, metadata={"help": "per-batch factor of the exponential epsilon decay"}
    )
    log_every: int = field(default=1, metadata={"help": "write metrics every this many batches"})
    init: str = field(
        default="torch",
        metadata={
            "help": "Q network initialisation: orthogonal (rlkit) or torch (PyTorch's default, "
            "as SB3's DQN)",
            "choices": ("orthogonal", "torch"),
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        # the exploration flags (rlkit.training.schedules.EpsilonSchedule runs them)
        if self.epsilon_schedule not in ("linear", "exponential"):
            raise ValueError(
                "--epsilon-schedule must be 'linear' or 'exponential', got "
                f"{self.epsilon_schedule!r}"
            )
        for name in ("epsilon_start", "epsilon_end", "exploration_fraction", "epsilon_decay"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"--{name.replace('_', '-')} must be in [0, 1], got {value}")
        if self.target_update_period < 1:
            raise ValueError(
                f"--target-update-period must be >= 1, got {self.target_update_period}"
            )
        if not 0 < self.tau <= 1:
            raise ValueError(f"--tau must be in (0, 1], got {self.tau}")


#: Settings that override the defaults for an environment (flags and --config still win).
PRESETS: dict[str, dict] = {}

#: MinAtar: the reference DQN of Young & Tian (2019), MinAtar's examples/dqn.py: its network
#: (one 16-filter 3x3 conv, 128 units, one output per action; PyTorch's default init), replay
#: 100k, batch 32, one gradient step per frame, Huber loss, centered RMSprop at 2.5e-4, target
#: copy every 1000 gradient steps, 5000 random frames, epsilon 1 -> 0.1 by frame 105k (the
#: paper anneals over the 100k frames after the random ones; here from frame 0, so epsilon is
#: 0.96 rather than 1 when learning starts), gamma 0.99, 5M frames
PRESETS["MinAtar/*"] = dict(
    encoder="minatar",
    hidden=(),
    init="torch",
    total_frames=5_000_000,
    num_envs=1,
    steps_per_batch=1,
    utd_ratio=1.0,
    batch_size=32,
    buffer_size=100_000,
    learning_starts=5000,
    optimizer="rmsprop",
    lr=2.5e-4,
    loss="huber",
    max_grad_norm=0.0,
    double_dqn=False,
    target_update="hard",
    target_update_period=1000,
    epsilon_schedule="linear",
    epsilon_start=1.0,
    epsilon_end=0.1,
    exploration_fraction=0.021,
    gamma=0.99,
    log_every=1000,
    eval_every=250_000,
    target_return=None,
)
#: ALE: CleanRL's dqn_atari.py (Nature CNN, 512 units, PyTorch's default init): replay 1M,
#: batch 32, a gradient step every 4 frames, MSE loss, Adam at 1e-4, no gradient clipping,
#: target copy every 1000 frames (250 gradient steps), 80k random frames, epsilon 1 -> 0.01
#: over the first 10% of 10M frames, gamma 0.99. A 1M replay of 84x84x4 frames is large
#: in memory; lower --buffer-size on a small machine
PRESETS["ALE/*"] = dict(
    encoder="nature",
    hidden=(),
    init="torch",
    total_frames=10_000_000,
    num_envs=1,
    steps_per_batch=4,
    utd_ratio=0.25,
    batch_size=32,
    buffer_size=1_000_000,
    learning_starts=80_000,
    optimizer="adam",
    lr=1e-4,
    loss="mse",
    max_grad_norm=0.0,
    double_dqn=False,
    target_update="hard",
    target_update_period=250,
    epsilon_schedule="linear",
    epsilon_start=1.0,
    epsilon_end=0.01,
    exploration_fraction=0.1,
    gamma=0.99,
    log_every=1000,
    eval_every=500_000,
    target_return=None,
)


#: the config ``recipes/dqn.py`` parses (:func:`rlkit.algorithms.recipe`)
CONFIG = DQNConfig
