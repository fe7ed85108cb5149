"""RND-PPO: Exploration by Random Network Distillation (Burda et al. 2018).

    python recipes/rnd.py                                  # MountainCar, sparse reward
    python recipes/rnd.py --env MountainCar-v0             # MountainCar-v0's -1 per step
    python recipes/rnd.py --int-coef 0                     # the same agent without the bonus
    python recipes/rnd.py --target-return -160 --seed 3    # stop once solved
    python recipes/rnd.py --accelerator cpu --devices 2 --strategy ddp
    python recipes/rnd.py --help                           # every flag

PPO with an intrinsic reward (recipes/ppo.py --intrinsic rnd, with the paper's 2:1 weights
and RND's own flags).

Algorithm box:
    1. config      RNDConfig (defaults, per-env preset, --config YAML, flags)
    2. networks    actor pi(a|s), critic V_ext(s); RND: frozen random target f, trained
                   predictor f_hat, intrinsic critic V_int(s)
    3. bonus       r_int = ||f_hat(s') - f(s')||^2 / std(discounted intrinsic return)
    4. estimator   GAE on the extrinsic reward (episodic, gamma); non-episodic GAE on r_int
                   with V_int (gamma_int)
    5. losses      PPO clipped surrogate on ext_coef * A_ext + int_coef * A_int, V_ext
                   regression, entropy bonus; predictor MSE on s' of a random
                   update_proportion of each minibatch, V_int regression
    6. learner     epochs x minibatches, the two losses in lockstep (policy/critic
                   optimizer and intrinsic optimizer)
    7. fit         the engine: collect, update, evaluate, checkpoint
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlkit.configs.base import in_unit_interval, non_negative, positive
from rlkit.configs.encoders import EncoderConfig
from rlkit.configs.onpolicy import ClipConfig, InitConfig
from rlkit.configs.suites import ATARI_PPO, MINATAR_PPO, MUJOCO_PPO, only_fields


def _help(text: str, **kw: Any) -> dict[str, Any]:
    return {"help": text, **kw}


@dataclass(frozen=True)
class RNDConfig(EncoderConfig, InitConfig, ClipConfig):
    """Train RND-PPO. Defaults explore MountainCar with a sparse reward (1 at the goal, 0
    otherwise), scored on MountainCar-v0's return; flags override.

    Flags of RND-PPO on top of PPO's (``--gamma`` is the extrinsic discount)."""

    env: str = "rlkit/MountainCarSparse-v0"
    total_frames: int = field(default=1_000_000, metadata={"help": "frames to train for"})
    num_envs: int = 32
    rollout_steps: int = 128
    epochs: int = 4
    minibatch_size: int = 1024
    lr: float = field(default=3e-4, metadata={"help": "learning rate"})
    gae_lambda: float = field(default=0.95, metadata={"help": "GAE lambda (both streams)"})
    entropy_coef: float = 0.001
    normalize_obs: bool = field(
        default=True, metadata={"help": "running observation normalisation (policy, critic)"}
    )
    normalize_reward: bool = field(
        default=True,
        metadata={"help": "scale extrinsic rewards by the std of their discounted return"},
    )
    eval_every: int = field(default=25_000, metadata={"help": "evaluate every this many frames"})

    gamma: float = field(default=0.999, metadata=_help("extrinsic discount (episodic)"))
    gamma_int: float = field(
        default=0.99, metadata=_help("intrinsic discount (non-episodic stream)")
    )
    ext_coef: float = field(default=2.0, metadata=_help("weight of the extrinsic advantage"))
    int_coef: float = field(default=1.0, metadata=_help("weight of the intrinsic advantage"))
    update_proportion: float = field(
        default=0.25, metadata=_help("fraction of each minibatch the predictor trains on")
    )
    rnd_features: int = field(default=64, metadata=_help("width of the random features"))
    rnd_hidden: tuple[int, ...] = field(
        default=(64, 64), metadata=_help("hidden sizes of the target and predictor networks")
    )
    rnd_activation: str = field(
        default="relu",
        metadata=_help("activation of the RND networks", choices=("relu", "leaky_relu", "tanh")),
    )
    rnd_obs_clip: float = field(
        default=5.0, metadata=_help("clip of the normalised observations fed to RND")
    )
    predictor_lr: float | None = field(
        default=None,
        metadata=_help(
            "learning rate of the predictor and the intrinsic critic (none: --lr, same schedule)"
        ),
    )

    @property
    def intrinsic(self) -> str:
        """The intrinsic reward this recipe attaches (what ``--intrinsic`` says elsewhere)."""
        return "rnd"

    def __post_init__(self) -> None:
        super().__post_init__()
        in_unit_interval(self, "gamma_int")
        in_unit_interval(self, "update_proportion", closed_low=False)
        non_negative(self, "ext_coef", "int_coef")
        positive(self, "rnd_features", "rnd_obs_clip", "predictor_lr")
        if self.ext_coef == 0 and self.int_coef == 0:
            raise ValueError("--ext-coef and --int-coef are both 0: set at least one > 0")
        if not self.rnd_hidden or any(h <= 0 for h in self.rnd_hidden):
            raise ValueError(f"--rnd-hidden needs positive layer sizes, got {self.rnd_hidden}")


#: Settings that override the defaults for an environment (flags and --config still win).
PRESETS: dict[str, dict] = {
    # trained on 0/1 rewards, scored on MountainCar-v0's return (-steps to the goal, -200 if
    # never), with sampled actions: the argmax of a near-uniform policy often swings the car
    # to the goal by chance, the policy that acts does not (docs/recipes/rnd.md)
    "rlkit/MountainCarSparse-v0": dict(eval_env="MountainCar-v0", eval_deterministic=False),
}

# Pixels: the suite's PPO settings (rlkit.configs.suites) with RND's own from Burda et al.
# (2018, Atari): extrinsic gamma 0.999 (episodic), intrinsic gamma 0.99, advantage weights 2
# (extrinsic) and 1 (intrinsic), entropy 0.001, a quarter of each minibatch for the
# predictor, observations clipped at 5 after standardisation, leaky ReLU, 512 random
# features and one 512 hidden layer after the encoder (the paper's predictor has two). The
# policy reads pixels scaled to [0, 1] (no --normalize-obs); RND standardises them itself
_RND_PIXELS = dict(
    normalize_obs=False,
    gamma=0.999,
    gamma_int=0.99,
    ext_coef=2.0,
    int_coef=1.0,
    entropy_coef=0.001,
    update_proportion=0.25,
    rnd_obs_clip=5.0,
    rnd_activation="leaky_relu",
)
PRESETS["MinAtar/*"] = dict(MINATAR_PPO, **_RND_PIXELS, rnd_features=128, rnd_hidden=(128,))
PRESETS["ALE/*"] = dict(ATARI_PPO, **_RND_PIXELS, rnd_features=512, rnd_hidden=(512,))


# every MuJoCo task and any continuous-control task with no preset of its own
# (rlkit.configs.suites): PPO's (CleanRL's ppo_continuous_action.py, suites.MUJOCO_PPO) with
# RND's bonus at its defaults; not yet measured on MuJoCo
PRESETS["MuJoCo/*"] = only_fields(MUJOCO_PPO, RNDConfig)
PRESETS["*:continuous"] = dict(PRESETS["MuJoCo/*"])
PRESETS["Pendulum-v1"] = {}  # the defaults, as the docs and tests run it there


#: the config ``recipes/rnd.py`` parses (:func:`rlkit.algorithms.recipe`)
CONFIG = RNDConfig
