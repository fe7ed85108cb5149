"""IMPALA: V-trace actor-critic with asynchronous collection (Espeholt et al. 2018).

    python recipes/impala.py                               # CartPole-v1, built-in defaults
    python recipes/impala.py --env Pendulum-v1             # continuous actions (preset)
    python recipes/impala.py --sync-collect true           # synchronous collection
    python recipes/impala.py --accelerator cpu --devices 2 --strategy ddp
    python recipes/impala.py --help                        # every flag

Algorithm box:
    1. config      IMPALAConfig (defaults, per-env preset, --config YAML, flags)
    2. networks    actor pi(a|s), critic V(s) (+ running observation normalisation)
    3. loss        V-trace with the current pi at the stored actions (rho = pi / mu),
                   policy gradient with the V-trace advantage, value regression to v_s,
                   entropy bonus
    4. learner     epochs x minibatches of whole trajectories
    5. collector   worker processes act with the newest published weights while the
                   learner updates; the policy lag of every batch is logged
    6. fit         the engine: collect, update, publish weights, evaluate, checkpoint
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlkit.configs import ppo
from rlkit.configs.encoders import EncoderConfig
from rlkit.configs.onpolicy import InitConfig, PolicyGradientConfig
from rlkit.configs.suites import MINATAR_PPO, MUJOCO_PPO, only_fields


def worker_seed(seed: int, worker: int) -> int:
    """The seed of collector worker ``worker`` of a run seeded ``seed``: its torch stream
    (``torch.manual_seed``) and its first env, as ``rlkit.data.async_collect.worker_seed``
    seeds a ``WorkerCollector``'s workers (the data layer takes no config; tests/test_startup.py
    checks that the two rules agree)."""
    return seed + 100 * worker


@dataclass(frozen=True)
class VTraceConfig(PolicyGradientConfig):
    """Flags shared by the V-trace recipes (IMPALA, APPO): V-trace and collection."""

    vtrace_lambda: float = field(default=1.0, metadata={"help": "V-trace lambda in [0, 1]"})
    rho_clip: float = field(default=1.0, metadata={"help": "V-trace rho-bar (> 0)"})
    c_clip: float = field(default=1.0, metadata={"help": "V-trace c-bar (> 0)"})
    pg_rho_clip: float = field(
        default=1.0, metadata={"help": "V-trace rho-bar of the policy-gradient advantage (> 0)"}
    )
    adv_mode: str = field(
        default="official",
        metadata={
            "help": "policy-gradient advantage's bootstrap: official (v_{s+1}, the paper) or "
            "acme (lambda v_{s+1} + (1 - lambda) V(x_{s+1}), Acme / evorl)",
            "choices": ("official", "acme"),
        },
    )
    workers: int = field(
        default=1, metadata={"help": "collector worker processes per rank (divide --num-envs)"}
    )
    sync_collect: bool = field(
        default=False,
        metadata={"help": "synchronous collection (no acting/learning overlap, zero lag)"},
    )
    actor_timeout: float = field(
        default=30.0,
        metadata={
            "help": "seconds without a batch after which a collector worker is hung and "
            "replaced (at least; 10x its slowest batch when longer, 60 s more for its first)"
        },
    )
    max_actor_restarts: int = field(
        default=3,
        metadata={
            "help": "dead or hung collector workers replaced per run; the next one lost "
            "stops the run (exit 3) after a checkpoint"
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        # the flags' own words; IMPALALoss checks its arguments the same way (a loss built
        # without a config), and this layer imports no loss
        for name in ("rho_clip", "c_clip", "pg_rho_clip"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(
                    f"--{name.replace('_', '-')} must be a number > 0 (a V-trace truncation "
                    f"level; the paper uses 1.0, inf for none), got {value!r}"
                )
        lmbda = self.vtrace_lambda
        if isinstance(lmbda, bool) or not isinstance(lmbda, int | float) or not 0 <= lmbda <= 1:
            raise ValueError(f"--vtrace-lambda must be in [0, 1] (1: no decay), got {lmbda!r}")
        if self.workers < 1 or self.num_envs % self.workers:
            raise ValueError(
                f"--workers must be >= 1 and divide --num-envs ({self.num_envs}), got "
                f"{self.workers}"
            )
        timeout = self.actor_timeout
        if not 0 < timeout < float("inf"):
            raise ValueError(f"--actor-timeout must be a number of seconds > 0, got {timeout!r}")
        if self.max_actor_restarts < 0:
            raise ValueError(
                f"--max-actor-restarts must be >= 0 (0: none), got {self.max_actor_restarts}"
            )
        if (self.population > 1 or self.sweep) and not self.sync_collect:
            raise ValueError(
                "--population / --sweep needs --sync-collect true here: asynchronous "
                "collection acts with whatever weights are newest, so no member could be an "
                "independent, repeatable run; add --sync-collect true (each member then "
                "collects as its synchronous standalone run does, in this process)"
            )

    def worker_seeds(self, seed: int) -> list[int]:
        """The workers' seeds (:func:`worker_seed`): a population member steps its envs in
        blocks seeded and sampled as its standalone run's workers."""
        return [worker_seed(seed, w) for w in range(self.workers)]

    def env_options(self) -> dict:
        """No env-side reward normaliser: the workers build the envs, so the learner scales
        the rewards of each batch (``rlkit.algorithms.impala.attach_reward_norm``)."""
        return {}


@dataclass(frozen=True)
class IMPALAConfig(EncoderConfig, InitConfig, VTraceConfig):
    """Train IMPALA. Defaults solve CartPole-v1; flags override."""

    total_frames: int = field(default=500_000, metadata={"help": "frames to train for"})
    rollout_steps: int = 32
    epochs: int = 4
    minibatch_size: int = field(
        default=256, metadata={"help": "frames per gradient step (whole trajectories)"}
    )
    lr: float = field(default=1e-3, metadata={"help": "learning rate"})
    gamma: float = 0.99
    entropy_coef: float = field(
        default=0.01,
        metadata={
            "help": "entropy bonus coefficient (the paper: 0.0005 to 0.01; at 0, Acrobot-v1 "
            "seed 1 collapsed to one action in its first batches and stayed at -500)"
        },
    )
    normalize_advantage: bool = field(
        default=False,
        metadata={
            "help": "standardise the V-trace advantage per minibatch in the policy term "
            "(the paper: false; continuous actions: true)"
        },
    )
    reduction: str = field(
        default="mean", metadata={"help": "mean or sum over the batch", "choices": ("mean", "sum")}
    )


PRESETS: dict[str, dict] = {
    # Pendulum (docs/recipes/impala.md, "Pendulum"): many short trajectories per minibatch
    # (64 envs x 16 steps, minibatches of 8 whole rows), the V-trace advantage standardised,
    # rewards scaled, no entropy bonus, synchronous collection, V-trace lambda 0.9, and the
    # step size adapted to the KL from the acting policy (--lr-schedule kl, target 0.03,
    # from 1e-3): without a trust region, a fixed rate either learns too slowly or runs
    # away over the batch's epochs
    "Pendulum-v1": dict(
        total_frames=500_000,
        num_envs=64,
        rollout_steps=16,
        epochs=4,
        minibatch_size=128,
        lr=1e-3,
        lr_schedule="kl",
        kl_target=0.03,
        kl_lr_max=1e-2,
        gamma=0.9,
        vtrace_lambda=0.9,
        entropy_coef=0.0,
        normalize_obs=True,
        normalize_reward=True,
        normalize_advantage=True,
        sync_collect=True,
        eval_every=20_000,
        target_return=None,
    ),
}
# MountainCar (docs/recipes/impala.md, "Results"): PPO's MountainCar-v0 preset, itself RND's
# baseline (rlkit.configs.ppo; benchmarks/results/learning_ppo_MountainCar-v0.md): 32 envs x
# 128 steps, 4 epochs of 1,024-frame minibatches at lr 3e-4, gamma 0.999, entropy 0.001,
# observation and reward normalisation; with GAE's lambda as V-trace's, the advantage
# standardised, synchronous collection and the 500k budget. Every seed 0-9 reaches the
# goal by 57k frames on both tasks; MountainCarContinuous-v0 passes its published solve (90),
# MountainCar-v0 settles near -140 (its solve is -110)
_PPO_MOUNTAIN_CAR = ppo.PRESETS["MountainCar-v0"]
_MOUNTAIN_CAR = {
    name: _PPO_MOUNTAIN_CAR[name]
    for name in (
        "num_envs",
        "rollout_steps",
        "epochs",
        "minibatch_size",
        "lr",
        "gamma",
        "entropy_coef",
        "normalize_obs",
        "normalize_reward",
        "target_return",
    )
} | dict(
    total_frames=500_000,
    vtrace_lambda=_PPO_MOUNTAIN_CAR["gae_lambda"],
    normalize_advantage=True,
    sync_collect=True,
)
for _task in ("MountainCar-v0", "MountainCarContinuous-v0"):
    PRESETS[_task] = dict(_MOUNTAIN_CAR)


# every MinAtar/* id: the network, envs, evaluation and budget of PPO's MinAtar preset
# (rlkit.configs.suites.MINATAR_PPO: the flattened frame into separate 2 x 256 ReLU actor and
# critic MLPs, sampled evaluation, 10M frames), with the IMPALA paper's Atari learner settings
# (Espeholt et al. 2018, Table G.1: unrolls of 20 steps, 32 unrolls per gradient step, each
# used once, RMSProp with epsilon 0.01 at lr 6e-4, entropy 0.01, baseline cost 0.5,
# gradient norm clipped at 40, gamma 0.99): 64 envs x 20 steps make two 640-frame
# minibatches per batch. The paper's losses are sums over the batch (as scalable_agent's and
# torchbeast's), and its RMSProp settings assume them: with --reduction mean the gradient is
# 640x smaller, RMSProp's epsilon 0.01 outweighs its running scale and the step shrinks to
# plain SGD's. Measured on Breakout-v1, seed 0: mean 0.7 at 396k frames (random play about
# 0.5), sum 4.3 (docs/pixels.md). The paper's RMSProp is TensorFlow's, whose epsilon sits
# inside the square root (g / sqrt(v + 0.01)); torch's adds it outside (g / (sqrt(v) +
# eps)), so the same damping of rarely-active weights needs eps = sqrt(0.01) = 0.1. With
# torch's eps 0.01, seed 0 climbed to 9.0 by 2.76M frames and then collapsed to one action
# (entropy 0.02, return 0) at 3.3M. With 0.1 it has not collapsed but stalled: 5.4 from 3.2M
# to 6.3M frames (PPO's preset: about 12 at 3M). Not yet tuned (docs/pixels.md).
PRESETS["MinAtar/*"] = dict(
    {k: MINATAR_PPO[k] for k in ("encoder", "hidden", "activation", "target_return")},
    total_frames=10_000_000,
    eval_every=250_000,
    eval_deterministic=False,
    num_envs=64,
    rollout_steps=20,
    epochs=1,
    minibatch_size=640,
    optimizer="rmsprop",
    adam_eps=0.1,
    lr=6e-4,
    entropy_coef=0.01,
    value_coef=0.5,
    max_grad_norm=40.0,
    gamma=0.99,
    reduction="sum",
)


# every MuJoCo task and any continuous-control task with no preset of its own
# (rlkit.configs.suites): APPO's MuJoCo settings (PPO's CleanRL settings with V-trace
# lambda 0.95 in place of GAE's, synchronous collection on one worker); not yet measured on
# MuJoCo
PRESETS["MuJoCo/*"] = only_fields(
    MUJOCO_PPO, IMPALAConfig, vtrace_lambda=0.95, workers=1, sync_collect=True
)
PRESETS["*:continuous"] = dict(PRESETS["MuJoCo/*"])


#: the config ``recipes/impala.py`` parses (:func:`rlkit.algorithms.recipe`)
CONFIG = IMPALAConfig
