"""PPO: Proximal Policy Optimization (Schulman et al. 2017), PPO2-style options.

    python recipes/ppo.py                                  # CartPole-v1, built-in defaults
    python recipes/ppo.py --env Pendulum-v1                # continuous actions (preset)
    python recipes/ppo.py --target-return 475 --seed 3     # stop once solved
    python recipes/ppo.py --accelerator cpu --devices 2 --strategy ddp
    python recipes/ppo.py --help                           # every flag

Algorithm box:
    1. config      PPOConfig (defaults, per-env preset, --config YAML, flags)
    2. networks    actor pi(a|s), critic V(s) (+ running observation normalisation)
    3. estimator   GAE(gamma, lambda) writes advantage and value_target
    4. loss        clipped surrogate + value regression (optionally clipped) + entropy bonus
    5. learner     epochs x minibatches, linear / KL-adaptive learning rate
    6. fit         the engine: collect, update, evaluate, checkpoint
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlkit.configs.critic import CriticConfig
from rlkit.configs.encoders import EncoderConfig
from rlkit.configs.onpolicy import ClipConfig, InitConfig, IntrinsicConfig
from rlkit.configs.rnd import RNDConfig
from rlkit.configs.suites import ATARI_PPO, MINATAR_PPO, MUJOCO_PPO


@dataclass(frozen=True)
class PPOConfig(CriticConfig, EncoderConfig, InitConfig, IntrinsicConfig, ClipConfig):
    """Train PPO. Defaults solve CartPole-v1 (rl-zoo3's tuned settings); flags override."""

    total_frames: int = field(default=100_000, metadata={"help": "frames to train for"})
    rollout_steps: int = 32
    epochs: int = 20
    minibatch_size: int = 256
    lr: float = field(default=1e-3, metadata={"help": "initial learning rate"})
    lr_schedule: str = "linear"
    gamma: float = 0.98
    gae_lambda: float = 0.8
    clip_epsilon_final: float | None = 0.0


#: Settings that override the defaults for an environment (flags and --config still win).
PRESETS: dict[str, dict] = {
    "Pendulum-v1": dict(
        total_frames=300_000,
        num_envs=4,
        rollout_steps=1024,
        epochs=10,
        minibatch_size=64,
        lr=1e-3,
        lr_schedule="constant",
        gamma=0.9,
        gae_lambda=0.95,
        clip_epsilon_final=None,
        normalize_obs=True,
        target_return=None,
    ),
    # also PPG's LunarLander preset (rlkit.configs.ppg adds its phases)
    "LunarLander-v3": dict(
        total_frames=1_000_000,
        num_envs=16,
        rollout_steps=128,
        epochs=4,
        minibatch_size=128,
        lr=5e-4,
        gamma=0.999,
        gae_lambda=0.98,
        entropy_coef=0.01,
        clip_epsilon_final=None,
        target_return=None,
    ),
}
_MUJOCO = dict(MUJOCO_PPO)
# every MuJoCo task (rlkit.configs.suites), and any continuous-control task with no preset of
# its own (Box2D's BipedalWalker and LunarLanderContinuous, MountainCarContinuous, an id rlkit
# does not know with Box actions): CleanRL's continuous-control settings, not CartPole's
PRESETS["MuJoCo/*"] = dict(_MUJOCO)
PRESETS["*:continuous"] = dict(_MUJOCO)
# RND-PPO's defaults without the bonus: RND's baseline (written once, in rlkit.configs.rnd)
PRESETS["MountainCar-v0"] = {
    name: getattr(RNDConfig(), name)
    for name in (
        "total_frames",
        "num_envs",
        "rollout_steps",
        "epochs",
        "minibatch_size",
        "lr",
        "lr_schedule",
        "gamma",
        "gae_lambda",
        "entropy_coef",
        "clip_epsilon_final",
        "normalize_obs",
        "normalize_reward",
        "eval_every",
        "target_return",
    )
}
# MountainCar with reward 1 at the goal and 0 otherwise (rlkit.envs.sparse): the same settings,
# scored on MountainCar-v0's return (-steps to the goal) with sampled actions (the argmax of a
# near-uniform policy often swings to the goal by chance); recipes/rnd.py's PPO baseline
PRESETS["rlkit/MountainCarSparse-v0"] = dict(
    PRESETS["MountainCar-v0"], eval_env="MountainCar-v0", eval_deterministic=False
)
# every MinAtar/* and ALE/* id (rlkit.configs.suites: gymnax-blines' MinAtar settings, CleanRL's
# ppo_atari.py)
PRESETS["MinAtar/*"] = dict(MINATAR_PPO)
# every popgym-* id (POPGym, Morad et al. 2023): partially observable by construction, so
# memory is on (a GRU of 64, docs/memory.md; --recurrent none for the MLP control). Sizes
# measured here: PositionOnlyCartPoleEasy reaches 0.99 at 102k frames (seed 0)
PRESETS["POPGym/*"] = dict(
    num_envs=32,
    rollout_steps=64,
    epochs=4,
    minibatch_size=512,
    lr=3e-4,
    lr_schedule="constant",
    gamma=0.99,
    gae_lambda=0.95,
    clip_epsilon_final=None,
    hidden=(64,),
    recurrent="gru",
    recurrent_size=64,
    target_return=None,
)
PRESETS["ALE/*"] = dict(ATARI_PPO)


#: the config ``recipes/ppo.py`` parses (:func:`rlkit.algorithms.recipe`)
CONFIG = PPOConfig
