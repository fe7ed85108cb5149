"""SAC: soft actor-critic (Haarnoja et al. 2018), continuous or discrete actions.

    python recipes/sac.py                                  # Pendulum-v1, SB3's defaults
    python recipes/sac.py --target-return -200 --seed 3    # stop once solved
    python recipes/sac.py --env CartPole-v1                # discrete SAC (Christodoulou 2019)
    python recipes/sac.py --env MinAtar/Breakout-v1        # discrete SAC on pixels (preset)
    python recipes/sac.py --policy-delay 2 --prioritized
    python recipes/sac.py --help                           # every flag

Algorithm box:
    1. config      SACConfig (defaults, per-env preset, --config YAML, flags)
    2. networks    tanh-Gaussian actor pi(a|s) (categorical for discrete actions),
                   twin critics Q1, Q2 and their Polyak-averaged targets; each network its
                   own --encoder (an image one for discrete actions only) -> --hidden
    3. loss        soft TD regression of both Qs on min(Q1', Q2') - alpha log pi,
                   actor on alpha log pi - min(Q1, Q2), temperature towards a target entropy
    4. learner     replay buffer, uniform random fill, utd_ratio gradient steps per frame,
                   critic step then (every policy_delay steps) actor and alpha step
    5. fit         the engine: collect, update, evaluate (deterministic), checkpoint
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlkit.configs.base import positive
from rlkit.configs.encoders import OffPolicyEncoderConfig
from rlkit.configs.offpolicy import OffPolicyConfig


def check_sac_n_steps(n_steps: int) -> None:
    """SAC trains on one-step soft targets only (refuses ``--n-steps > 1``)."""
    if n_steps > 1:
        raise ValueError(
            f"--n-steps {n_steps}: SAC trains on one-step soft targets only (an n-step soft "
            "target needs the entropy terms of the intermediate steps, which the replay does "
            "not hold); use --n-steps 1"
        )


@dataclass(frozen=True)
class SACConfig(OffPolicyEncoderConfig, OffPolicyConfig):
    """Train SAC. Defaults are SB3's SAC with rl-zoo3's Pendulum-v1 learning rate."""

    env: str = "Pendulum-v1"
    total_frames: int = field(default=20_000, metadata={"help": "frames to train for"})
    eval_every: int = field(default=1000, metadata={"help": "evaluate every this many frames"})
    batch_size: int = field(
        default=128, metadata={"help": "transitions per gradient step (SB3's default: 256)"}
    )
    lr: float = field(default=1e-3, metadata={"help": "critic learning rate"})
    actor_lr: float | None = field(default=None, metadata={"help": "actor lr (none: --lr)"})
    alpha_lr: float | None = field(default=None, metadata={"help": "temperature lr (none: --lr)"})
    tau: float = field(default=0.005, metadata={"help": "Polyak weight of the target update"})
    target_update_period: int = field(
        default=1, metadata={"help": "gradient steps between target updates"}
    )
    alpha_init: float = field(default=1.0, metadata={"help": "initial temperature alpha"})
    learn_alpha: bool = field(default=True, metadata={"help": "learn the temperature"})
    target_entropy: float | None = field(
        default=None,
        metadata={"help": "target entropy (none: -action_dim, or 0.98 log n when discrete)"},
    )
    policy_delay: int = field(
        default=1, metadata={"help": "gradient steps per actor/temperature step"}
    )
    log_every: int = field(default=500, metadata={"help": "write metrics every this many batches"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.tau <= 1:
            raise ValueError(f"--tau must be in (0, 1], got {self.tau}")
        if self.target_update_period < 1:
            raise ValueError(
                f"--target-update-period must be >= 1, got {self.target_update_period}"
            )
        if self.policy_delay < 1:
            raise ValueError(f"--policy-delay must be >= 1, got {self.policy_delay}")
        if self.alpha_init <= 0:
            raise ValueError(f"--alpha-init must be > 0, got {self.alpha_init}")
        positive(self, "actor_lr", "alpha_lr")  # 0 would silently mean --lr
        check_sac_n_steps(self.n_steps)


#: Settings that override the defaults for an environment (flags and --config still win).
PRESETS: dict[str, dict] = {
    "CartPole-v1": dict(total_frames=100_000, eval_every=5000, learning_starts=1000),
}
# MuJoCo (pip install -e ".[mujoco]"): rl-zoo3's SAC mujoco-defaults (hyperparams/sac.yml:
# Hopper, HalfCheetah, Walker2d share them): SB3's SAC defaults (lr 3e-4 for critic, actor and
# temperature, batch 256, buffer 1M, tau 0.005, gamma 0.99, one gradient step per frame,
# 256x256 ReLU networks, learned temperature from 1.0 towards -action_dim) with 10,000 random
# frames before learning, 1M frames
_MUJOCO = dict(
    total_frames=1_000_000,
    learning_starts=10_000,
    batch_size=256,
    lr=3e-4,
    buffer_size=1_000_000,
    gamma=0.99,
    tau=0.005,
    eval_every=20_000,
    target_return=None,
)
# every MuJoCo task and any continuous-control task with no preset of its own
# (rlkit.configs.suites); Pendulum keeps the defaults, which are tuned and measured there
PRESETS["MuJoCo/*"] = dict(_MUJOCO)
PRESETS["*:continuous"] = dict(_MUJOCO)
PRESETS["Pendulum-v1"] = {}


# Discrete SAC on pixels: CleanRL's sac_atari.py (Christodoulou 2019's settings: Adam at 3e-4
# for actor, critics and temperature with eps 1e-4, batch 64, a gradient step every 4 frames,
# 20k random frames, target copy every 8000 frames = 2000 gradient steps, learned temperature
# from 1, gamma 0.99, 5M frames, replay 1M) on the suite's network (the Nature CNN for ALE,
# MinAtar's for MinAtar, whose replay is its DQN's 100k); target entropy 0.98 log n (the
# paper's; CleanRL's 0.89 log n)
_PIXEL_SAC = dict(
    hidden=(),
    total_frames=5_000_000,
    num_envs=1,
    steps_per_batch=4,
    utd_ratio=0.25,
    batch_size=64,
    learning_starts=20_000,
    lr=3e-4,
    adam_eps=1e-4,
    tau=1.0,
    target_update_period=2000,
    alpha_init=1.0,
    gamma=0.99,
    log_every=1000,
    target_return=None,
)
PRESETS["MinAtar/*"] = dict(_PIXEL_SAC, encoder="minatar", buffer_size=100_000, eval_every=250_000)
PRESETS["ALE/*"] = dict(_PIXEL_SAC, encoder="nature", buffer_size=1_000_000, eval_every=500_000)


#: the config ``recipes/sac.py`` parses (:func:`rlkit.algorithms.recipe`)
CONFIG = SACConfig
