"""APPO: asynchronous PPO with V-trace and a clipped target network (IMPACT, Luo et al. 2020).

    python recipes/appo.py                                 # CartPole-v1, built-in defaults
    python recipes/appo.py --env Pendulum-v1               # continuous actions (preset)
    python recipes/appo.py --sync-collect true             # synchronous collection
    python recipes/appo.py --accelerator cpu --devices 2 --strategy ddp
    python recipes/appo.py --help                          # every flag

Algorithm box:
    1. config      APPOConfig (defaults, per-env preset, --config YAML, flags)
    2. networks    actor pi, critic V (+ observation normalisation, updated by the learner)
                   and the target network pi_bar, a Polyak average of pi
    3. estimator   V-trace with rho = pi_bar(a|s) / mu(a|s) at the stored actions writes
                   advantage and v_s; truncated episodes bootstrap from V(final obs)
    4. loss        PPO clip of pi / pi_bar times the V-trace advantage, clipped value loss
    5. learner     epochs x minibatches, KL-adaptive (or linear) learning rate, then
                   pi_bar <- (1 - tau) pi_bar + tau pi every --target-update-freq batches
    6. collector   worker processes act with the newest weights and normaliser statistics
    7. fit         the engine: collect, update, publish weights, evaluate, checkpoint
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlkit.configs import ppo
from rlkit.configs.encoders import EncoderConfig
from rlkit.configs.impala import VTraceConfig
from rlkit.configs.onpolicy import InitConfig


@dataclass(frozen=True)
class APPOConfig(EncoderConfig, InitConfig, VTraceConfig):
    """Train APPO. Defaults solve CartPole-v1; flags override."""

    total_frames: int = field(default=500_000, metadata={"help": "frames to train for"})
    rollout_steps: int = 32
    epochs: int = 10
    minibatch_size: int = 128
    lr: float = field(default=1e-3, metadata={"help": "initial learning rate"})
    lr_schedule: str = "linear"
    gamma: float = 0.98
    vtrace_lambda: float = 0.8
    clip_epsilon: float = field(default=0.2, metadata={"help": "clip range of pi / pi_bar"})
    value_clip: float | None = field(
        default=None, metadata={"help": "value clipping range; none: unclipped value loss"}
    )
    tau: float = field(default=1.0, metadata={"help": "Polyak weight of the target update"})
    target_update_freq: int = field(
        default=1, metadata={"help": "learner steps (batches) between target updates"}
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.clip_epsilon <= 0:
            raise ValueError(f"--clip-epsilon must be > 0, got {self.clip_epsilon}")
        if not 0 < self.tau <= 1:
            raise ValueError(f"--tau must be in (0, 1] (1: copy the policy), got {self.tau}")
        if self.target_update_freq < 1:
            raise ValueError(f"--target-update-freq must be >= 1, got {self.target_update_freq}")


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
        vtrace_lambda=0.95,
        # synchronous, no observation normalisation (docs/recipes/appo.md, "Results"): with
        # normalisation the asynchronous run (lag 2) shrank its policy's std until the update
        # diverged (seed 0, 200k frames); without it, asynchronous runs reach -250 at 57k
        # frames but do not hold it (final -637, -141, -614 at 300k); synchronous runs hold it
        normalize_obs=False,
        target_return=None,
        workers=2,
        sync_collect=True,
    ),
}
# MuJoCo (pip install -e ".[mujoco]"): PPO's CleanRL settings (rlkit.configs.ppo: 1 env x 2048
# steps, 10 epochs of 64-frame minibatches, lr 3e-4 annealed to 0, gamma 0.99, clip 0.2 with
# clipped value loss, no entropy bonus, gradient norm 0.5, observation and reward
# normalisation) with V-trace lambda 0.95 in place of GAE's; synchronous collection, and the
# target pi_bar copied from pi after every batch (tau 1), so rho = pi_bar / mu is 1 at the
# first epoch, as in the Pendulum preset
_PPO_ONLY = ("gae_lambda", "clip_epsilon_final")  # GAE's lambda, the annealed clip range
_MUJOCO = {k: v for k, v in ppo._MUJOCO.items() if k not in _PPO_ONLY} | dict(
    vtrace_lambda=0.95, tau=1.0, workers=1, sync_collect=True
)
# every MuJoCo task and any continuous-control task with no preset of its own
# (rlkit.configs.suites)
PRESETS["MuJoCo/*"] = dict(_MUJOCO)
PRESETS["*:continuous"] = dict(_MUJOCO)


#: the config ``recipes/appo.py`` parses (:func:`rlkit.algorithms.recipe`)
CONFIG = APPOConfig
# every popgym-* id: PPO's POPGym preset (memory on: a GRU of 64) with V-trace lambda 0.95,
# in-process collection (no worker processes) and the target copied after every batch
PRESETS["POPGym/*"] = {k: v for k, v in ppo.PRESETS["POPGym/*"].items() if k not in _PPO_ONLY} | (
    dict(vtrace_lambda=0.95, tau=1.0, workers=1, sync_collect=True)
)
