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

from rlkit.objectives import IMPALALoss
from rlkit.training import parse_config, run
from rlkit.training.async_collect import worker_collector_factory
from rlkit.training.onpolicy import build_actor_critic
from rlkit.training.vtrace_learner import IMPALA_NO_KL, IMPALALearner, VTraceConfig


# 1. config ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class IMPALAConfig(VTraceConfig):
    """Train IMPALA. Defaults solve CartPole-v1; flags override."""

    total_frames: int = field(default=500_000, metadata={"help": "frames to train for"})
    rollout_steps: int = 32
    epochs: int = 4
    minibatch_size: int = field(
        default=256, metadata={"help": "frames per gradient step (whole trajectories)"}
    )
    lr: float = field(default=1e-3, metadata={"help": "learning rate"})
    gamma: float = 0.99
    entropy_coef: float = 0.0
    reduction: str = field(
        default="mean", metadata={"help": "mean or sum over the batch", "choices": ("mean", "sum")}
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.lr_schedule == "kl":
            raise ValueError(IMPALA_NO_KL)


PRESETS: dict[str, dict] = {
    "Pendulum-v1": dict(
        total_frames=300_000,
        num_envs=8,
        rollout_steps=128,
        epochs=4,
        minibatch_size=256,
        lr=3e-4,
        gamma=0.9,
        normalize_obs=True,
        target_return=None,
    ),
}


# 2-4. networks, loss, learner ---------------------------------------------------------------
def build(cfg: IMPALAConfig, env) -> IMPALALearner:
    actor, critic, obs_norm = build_actor_critic(cfg, env)
    loss = IMPALALoss(
        actor,
        critic,
        gamma=cfg.gamma,
        vtrace_lambda=cfg.vtrace_lambda,
        rho_clip=cfg.rho_clip,
        c_clip=cfg.c_clip,
        pg_rho_clip=cfg.pg_rho_clip,
        entropy_coef=cfg.entropy_coef,
        value_coef=cfg.value_coef,
        reduction=cfg.reduction,
    )
    return IMPALALearner(actor=actor, critic=critic, loss=loss, cfg=cfg, obs_norm=obs_norm)


# 5-6. collector, fit ------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> dict:
    cfg = parse_config(IMPALAConfig, argv, presets=PRESETS, description=__doc__)
    collector = worker_collector_factory(num_workers=cfg.workers, sync=cfg.sync_collect)
    return run(cfg, build, algo="impala", make_collector=collector)
