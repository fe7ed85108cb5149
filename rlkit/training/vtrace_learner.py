r"""Learners for V-trace algorithms: IMPALA and APPO (IMPACT).

Both consume batches from :class:`rlkit.training.async_collect.WorkerCollector` (or any
collector writing ``keys.ACTION_LOG_PROB``) and log the batch's mean policy lag
(``policy_lag``) when the batch carries it.

* :class:`IMPALALearner`: ``epochs`` x minibatches of *whole trajectories* (env rows of the
  ``[N, T]`` batch) through :class:`~rlkit.objectives.IMPALALoss`, which recomputes
  V-trace with the current policy at every step.
* :class:`APPOLearner`: ``rlkit.value.VTrace`` with the loss's target network as
  :math:`\pi` in :math:`\rho` writes advantages and targets once per batch; then PPO's
  epochs x shuffled minibatches of :class:`~rlkit.objectives.APPOLoss`; then the
  KL-adaptive learning rate, the observation normaliser (central, merged across ranks) and
  the target network's Polyak step (every ``target_update_freq`` batches), after which the
  collector publishes the new weights and normaliser statistics to the workers together.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from tensordict import TensorDictBase
from torch import nn

from rlkit.training.async_collect import POLICY_LAG
from rlkit.training.engine import Context
from rlkit.training.onpolicy import OnPolicyConfig, PolicyGradientLearner
from rlkit.training.update import update_loop

__all__ = ["APPOLearner", "IMPALALearner", "VTraceConfig"]

IMPALA_NO_KL = (
    "--lr-schedule kl adapts the learning rate to the policy's KL between updates, which "
    "IMPALA's loss does not measure: use --lr-schedule constant or linear (APPO, which tracks "
    "the KL to its target network, supports kl)"
)


@dataclass(frozen=True)
class VTraceConfig(OnPolicyConfig):
    """Flags shared by the V-trace recipes (IMPALA, APPO): V-trace and collection."""

    vtrace_lambda: float = field(default=1.0, metadata={"help": "V-trace lambda in [0, 1]"})
    rho_clip: float = field(default=1.0, metadata={"help": "V-trace rho-bar (> 0)"})
    c_clip: float = field(default=1.0, metadata={"help": "V-trace c-bar (> 0)"})
    pg_rho_clip: float = field(
        default=1.0, metadata={"help": "V-trace rho-bar of the policy-gradient advantage (> 0)"}
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


def _lag_metrics(batch: TensorDictBase) -> dict[str, float]:
    lag = batch.get(POLICY_LAG, None)
    if lag is None:
        return {}
    return {"policy_lag": float(lag.float().mean()), "policy_lag_max": float(lag.max())}


class IMPALALearner(PolicyGradientLearner):
    """IMPALA's update: the V-trace loss on env-row minibatches of the ``[N, T]`` batch.

    ``cfg.minibatch_size`` counts frames; a minibatch holds
    ``max(1, minibatch_size // T)`` whole trajectories. Arguments as
    :class:`~rlkit.training.onpolicy.PolicyGradientLearner` (no estimator: the loss
    computes V-trace itself).
    """

    def __init__(self, *, algo: str = "impala", actor, critic, loss, cfg, obs_norm=None):
        if cfg.lr_schedule == "kl":
            raise ValueError(IMPALA_NO_KL)
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
        return result | sched | _lag_metrics(batch)


class APPOLearner(PolicyGradientLearner):
    """APPO's update (see the module docstring). ``loss`` is an
    :class:`~rlkit.objectives.APPOLoss`; ``estimator`` a ``rlkit.value.VTrace`` whose
    ``target_actor`` is ``loss.target_actor.module``. ``modules()`` adds the target network
    (parameters and step count) so checkpoints and resumes keep it."""

    def __init__(
        self,
        *,
        algo: str = "appo",
        actor: nn.Module,
        critic: nn.Module,
        estimator: nn.Module,
        loss: nn.Module,
        cfg: OnPolicyConfig,
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
        return metrics | _lag_metrics(batch)
