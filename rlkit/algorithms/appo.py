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

from collections.abc import Mapping
from dataclasses import dataclass, field

from tensordict import TensorDictBase
from torch import nn

from rlkit.algorithms.impala import VTraceConfig, lag_metrics
from rlkit.algorithms.onpolicy import (
    PolicyGradientConfig,
    PolicyGradientLearner,
    build_actor_critic,
)
from rlkit.data.async_collect import worker_collector_factory
from rlkit.objectives import APPOLoss
from rlkit.training import parse_config, run
from rlkit.training.engine import Context
from rlkit.value import VTrace


# 0. the learner -----------------------------------------------------------------------------
class APPOLearner(PolicyGradientLearner):
    """APPO's update (see the module docstring). ``loss`` is an
    :class:`~rlkit.objectives.APPOLoss`; ``estimator`` a ``rlkit.value.VTrace`` whose
    ``target_actor`` is ``loss.target_actor.module``. ``modules()`` adds the target network
    (parameters and step count) so checkpoints and resumes keep it."""

    supports_running_advantage_norm = True  # its update runs the shared one

    def __init__(
        self,
        *,
        algo: str = "appo",
        actor: nn.Module,
        critic: nn.Module,
        estimator: nn.Module,
        loss: nn.Module,
        cfg: PolicyGradientConfig,
        obs_norm: nn.Module | None = None,
        loss_schedules: Mapping[str, tuple[float, float]] | None = None,
    ) -> None:
        if getattr(estimator, "target_actor", None) is not loss.target_actor.module:
            raise ValueError(
                "APPOLearner: the V-trace estimator must score rho with the loss's target "
                "network: build it with VTrace(..., target_actor=loss.target_actor.module)"
            )
        super().__init__(
            algo=algo,
            actor=actor,
            critic=critic,
            estimator=estimator,
            loss=loss,
            cfg=cfg,
            obs_norm=obs_norm,
            loss_schedules=loss_schedules,
        )

    def modules(self) -> dict[str, nn.Module]:
        return super().modules() | {"target_actor": self.loss.target_actor}

    def update(self, batch: TensorDictBase, ctx: Context) -> dict[str, float]:
        self.loss.record_target_log_prob(batch)
        metrics = super().update(batch, ctx)  # V-trace, epochs x minibatches, KL lr, obs norm
        self.loss.step_target()
        if self.obs_norm is not None:
            self.loss.sync_target_buffers()
        return metrics | lag_metrics(batch)


# 1. config ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class APPOConfig(VTraceConfig):
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
        normalize_obs=True,
        target_return=None,
        workers=2,
    ),
}


# 2-5. networks, estimator, loss, learner ----------------------------------------------------
def build(cfg: APPOConfig, env) -> APPOLearner:
    actor, critic, obs_norm = build_actor_critic(cfg, env)
    loss = APPOLoss(
        actor,
        critic,
        tau=cfg.tau,
        target_update_freq=cfg.target_update_freq,
        clip_epsilon=cfg.clip_epsilon,
        entropy_coef=cfg.entropy_coef,
        value_coef=cfg.value_coef,
        value_clip_epsilon=cfg.value_clip,
        normalize_advantage=cfg.normalize_advantage,
    )
    estimator = VTrace(
        gamma=cfg.gamma,
        actor=actor,
        target_actor=loss.target_actor.module,
        lmbda=cfg.vtrace_lambda,
        rho_clip=cfg.rho_clip,
        c_clip=cfg.c_clip,
        pg_rho_clip=cfg.pg_rho_clip,
        adv_mode=cfg.adv_mode,
        value_network=critic,
    )
    return APPOLearner(
        actor=actor, critic=critic, estimator=estimator, loss=loss, cfg=cfg, obs_norm=obs_norm
    )


# 6-7. collector, fit ------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> dict:
    cfg = parse_config(APPOConfig, argv, presets=PRESETS, description=__doc__)
    collector = worker_collector_factory(num_workers=cfg.workers, sync=cfg.sync_collect)
    return run(cfg, build, algo="appo", make_collector=collector)
