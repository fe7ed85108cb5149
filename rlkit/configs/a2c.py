"""A2C: synchronous advantage actor-critic (Mnih et al. 2016), as in Stable-Baselines3.

    python recipes/a2c.py                            # CartPole-v1, built-in defaults
    python recipes/a2c.py --env Pendulum-v1          # continuous actions
    python recipes/a2c.py --help                     # every flag

Algorithm box:
    1. config      A2CConfig (defaults, per-env preset, --config YAML, flags)
    2. networks    actor pi(a|s), critic V(s) (+ running observation normalisation)
    3. estimator   GAE(gamma, lambda); lambda = 1 gives the n-step return of the paper
    4. loss        -log pi(a|s) A + value regression + entropy bonus
    5. learner     one gradient step per batch (RMSprop, as the paper and SB3)
    6. fit         the engine: collect, update, evaluate, checkpoint
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlkit.configs.critic import CriticConfig
from rlkit.configs.encoders import EncoderConfig
from rlkit.configs.onpolicy import InitConfig, IntrinsicConfig, OnPolicyConfig


@dataclass(frozen=True)
class A2CConfig(CriticConfig, EncoderConfig, InitConfig, IntrinsicConfig, OnPolicyConfig):
    """Train A2C. Defaults follow Stable-Baselines3's A2C (8 envs x 5 steps, RMSprop)."""

    total_frames: int = field(default=500_000, metadata={"help": "frames to train for"})
    rollout_steps: int = 5
    epochs: int = 1
    minibatch_size: int | None = field(
        default=None,
        metadata={
            "help": "samples per gradient step (none: the whole batch, A2C's one step per "
            "batch at any --num-envs)"
        },
    )
    lr: float = field(default=7e-4, metadata={"help": "learning rate"})
    optimizer: str = "rmsprop"
    gamma: float = 0.99
    gae_lambda: float = field(default=1.0, metadata={"help": "GAE lambda (1: n-step return)"})
    normalize_advantage: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.lr_schedule == "kl":
            raise ValueError(
                "--lr-schedule kl adapts the learning rate to the policy's KL between "
                "updates, which A2C's loss does not measure: use --lr-schedule constant or "
                "linear"
            )
        if self.target_kl is not None:
            raise ValueError(
                "--target-kl stops the epochs on the policy's KL from the acting policy, which "
                "A2C's loss does not measure (and A2C takes one step per batch): drop it"
            )


PRESETS: dict[str, dict] = {}
# every MuJoCo task and any continuous-control task with no preset of its own
# (rlkit.configs.suites): rl-zoo3's A2C MuJoCo entries (hyperparams/a2c.yml, e.g.
# HalfCheetah-v3, 3096.6 +- 82.5 on its model card): SB3's A2C defaults (RMSprop lr 7e-4,
# 5 steps, gamma 0.99, no GAE, no entropy bonus) on one env, observations normalised (rewards
# not), 1M frames
_CONTINUOUS = dict(
    total_frames=1_000_000, num_envs=1, normalize_obs=True, normalize_reward=False,
    target_return=None, eval_every=50_000,
)  # fmt: skip
PRESETS["MuJoCo/*"] = dict(_CONTINUOUS)
PRESETS["*:continuous"] = dict(_CONTINUOUS)
PRESETS["Pendulum-v1"] = {}  # the defaults, as the docs and tests run it there


#: the config ``recipes/a2c.py`` parses (:func:`rlkit.algorithms.recipe`)
CONFIG = A2CConfig
