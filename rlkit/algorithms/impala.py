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

import torch
from tensordict import TensorDictBase

from rlkit.algorithms.onpolicy import (
    PolicyGradientConfig,
    PolicyGradientLearner,
    build_actor_critic,
)
from rlkit.data.async_collect import POLICY_LAG, worker_collector_factory
from rlkit.objectives import IMPALALoss
from rlkit.training import parse_config, run
from rlkit.training.engine import Context
from rlkit.training.update import update_loop

# 0. shared by the V-trace recipes (IMPALA, APPO) and IMPALA's learner --------------------
IMPALA_NO_KL = (
    "--lr-schedule kl adapts the learning rate to the policy's KL between updates, which "
    "IMPALA's loss does not measure: use --lr-schedule constant or linear (APPO, which tracks "
    "the KL to its target network, supports kl)"
)


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

    def __post_init__(self) -> None:
        super().__post_init__()
        from rlkit.objectives.impala import check_vtrace_args

        if self.normalize_reward:
            raise ValueError(
                "--normalize-reward is not supported by the worker-collector recipes (IMPALA, "
                "APPO): each worker builds its own envs, so the reward statistics would not be "
                "shared or checkpointed; drop the flag (--normalize-obs is supported)"
            )

        check_vtrace_args(
            "config",
            lmbda=self.vtrace_lambda,
            rho_clip=self.rho_clip,
            c_clip=self.c_clip,
            pg_rho_clip=self.pg_rho_clip,
        )
        if self.workers < 1 or self.num_envs % self.workers:
            raise ValueError(
                f"--workers must be >= 1 and divide --num-envs ({self.num_envs}), got "
                f"{self.workers}"
            )


def lag_metrics(batch: TensorDictBase) -> dict[str, float]:
    lag = batch.get(POLICY_LAG, None)
    if lag is None:
        return {}
    return {"policy_lag": float(lag.float().mean()), "policy_lag_max": float(lag.max())}


class IMPALALearner(PolicyGradientLearner):
    """IMPALA's update: the V-trace loss on env-row minibatches of the ``[N, T]`` batch.

    ``cfg.minibatch_size`` counts frames; a minibatch holds
    ``max(1, minibatch_size // T)`` whole trajectories. Arguments as
    :class:`~rlkit.algorithms.onpolicy.PolicyGradientLearner` (no estimator: the loss
    computes V-trace itself).
    """

    def __init__(self, *, algo: str = "impala", actor, critic, loss, cfg, obs_norm=None):
        # --lr-schedule kl: refused by IMPALAConfig before the run starts, and by the shared
        # learner's check (no approx_kl) for a config built another way
        super().__init__(
            algo=algo,
            actor=actor,
            critic=critic,
            estimator=None,
            loss=loss,
            cfg=cfg,
            obs_norm=obs_norm,
        )

    def _minibatches(self, data: TensorDictBase, generator: torch.Generator):
        """Minibatches of whole env rows of the ``[N, T]`` batch (V-trace runs along T)."""
        n, steps = data.batch_size
        rows = max(1, min(n, self.cfg.minibatch // steps))
        if rows >= n:
            return (data,)
        order = torch.randperm(n, generator=generator)
        return (data[order[start : start + rows]] for start in range(0, n, rows))

    def update(self, batch: TensorDictBase, ctx: Context) -> dict[str, float]:
        sched = self.apply_schedules(ctx.progress)
        result = update_loop(self.loss_groups(), batch, ctx, minibatches=self._minibatches)
        self.after_update(batch, result, ctx)
        return result | sched | lag_metrics(batch)


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
        adv_mode=cfg.adv_mode,
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
