"""IMPALA (Espeholt et al. 2018): networks, learner and :func:`train` (``recipes/impala.py``).

The configs (``VTraceConfig``, :class:`IMPALAConfig`), the presets and the algorithm box
that ``--help`` shows live in the torch-free :mod:`rlkit.configs.impala`.
"""

from __future__ import annotations

from functools import partial

import torch
from tensordict import TensorDictBase

from rlkit import keys
from rlkit.algorithms._parts import make_part
from rlkit.algorithms.onpolicy import (
    PolicyGradientLearner,
    build_actor_critic,
    policy_gradient_settings,
    policy_optimizer,
)
from rlkit.configs import impala as _config
from rlkit.configs.impala import (
    PRESETS,
    IMPALAConfig,
)
from rlkit.data.async_collect import POLICY_LAG, WorkerEnvs, worker_collector_factory
from rlkit.modules import BatchRewardNorm
from rlkit.objectives import IMPALALoss
from rlkit.training import parse_config, run
from rlkit.training.engine import Context
from rlkit.training.update import update_loop


# 0. the learner (lag_metrics, batch reward normalisation: shared with APPO) -------------------
def attach_reward_norm(
    learner: PolicyGradientLearner, norm: BatchRewardNorm | None
) -> BatchRewardNorm | None:
    """``--normalize-reward`` for the worker recipes: the learner scales each batch's rewards
    with ``norm`` (:class:`~rlkit.modules.BatchRewardNorm`, one set of statistics for all
    workers, in the checkpoint as ``reward_norm``), since the envs live in the worker
    processes; None: rewards as collected."""
    if norm is not None:
        learner.nets["reward_norm"] = norm
    return norm


def worker_settings(cfg) -> dict:
    """IMPALA's and APPO's learner arguments for worker collection from a config:
    ``reward_norm`` (``--normalize-reward``: a :class:`~rlkit.modules.BatchRewardNorm` over
    ``--num-envs`` at ``--gamma``, else None) and ``worker_envs`` (the env the workers
    build, ``--env-kwargs`` and ``--max-episode-steps`` with it)."""
    norm = BatchRewardNorm(cfg.num_envs, gamma=cfg.gamma) if cfg.normalize_reward else None
    envs = WorkerEnvs(
        env_id=cfg.env, num_envs=cfg.num_envs, seed=cfg.seed, env_kwargs=cfg.gym_options()
    )
    return {"reward_norm": norm, "worker_envs": envs}


def normalize_rewards(norm: BatchRewardNorm | None, batch: TensorDictBase) -> None:
    """Scale ``batch``'s rewards in place with ``norm`` (rows matched to envs by
    ``keys.ENV_ID``, else row ``i`` is env ``i``); nothing when ``norm`` is None."""
    if norm is not None:
        env_ids = batch.get(keys.ENV_ID, None)
        norm(batch, None if env_ids is None else env_ids[:, 0])


def lag_metrics(batch: TensorDictBase) -> dict[str, float]:
    lag = batch.get(POLICY_LAG, None)
    if lag is None:
        return {}
    return {"policy_lag": float(lag.float().mean()), "policy_lag_max": float(lag.max())}


class IMPALALearner(PolicyGradientLearner):
    """IMPALA's update: the V-trace loss on env-row minibatches of the ``[N, T]`` batch.

    ``minibatch_size`` counts frames; a minibatch holds ``max(1, minibatch_size // T)``
    whole trajectories (None: the whole batch). Arguments as
    :class:`~rlkit.algorithms.onpolicy.PolicyGradientLearner` (no estimator: the loss
    computes V-trace itself), and ``reward_norm`` (:func:`attach_reward_norm`) and
    ``worker_envs`` (the envs of :func:`~rlkit.data.async_collect.worker_collector_factory`).
    """

    #: a population (``--population`` with ``--sync-collect true``) runs each member's own
    #: update in turn (rlkit.training.population): the V-trace loss scans whole trajectories
    population_sequential = True

    def __init__(
        self,
        *,
        algo: str = "impala",
        actor,
        critic,
        loss,
        reward_norm: BatchRewardNorm | None = None,
        worker_envs: WorkerEnvs | None = None,
        **kwargs,
    ):
        # --lr-schedule kl reads the loss's approx_kl: KL(behaviour || learner) at the stored
        # actions, the update's drift plus the policy lag of asynchronous collection
        super().__init__(algo=algo, actor=actor, critic=critic, estimator=None, loss=loss, **kwargs)
        self.reward_norm = attach_reward_norm(self, reward_norm)
        self.worker_envs = worker_envs

    def _minibatches(self, data: TensorDictBase, generator: torch.Generator):
        """Minibatches of whole env rows of the ``[N, T]`` batch (V-trace runs along T)."""
        n, steps = data.batch_size
        size = self.frames_per_batch if self.minibatch_size is None else self.minibatch_size
        rows = max(1, min(n, size // steps))
        if rows >= n:
            return (data,)
        order = torch.randperm(n, generator=generator)
        return (data[order[start : start + rows]] for start in range(0, n, rows))

    def update(self, batch: TensorDictBase, ctx: Context) -> dict[str, float]:
        normalize_rewards(self.reward_norm, batch)
        sched = self.apply_schedules(ctx.progress)
        result = update_loop(self.loss_groups(), batch, ctx, minibatches=self._minibatches)
        self.after_update(batch, result, ctx)
        return result | sched | lag_metrics(batch)


# 2-4. networks, loss, learner ---------------------------------------------------------------
def build(cfg: IMPALAConfig, env, *, loss_cls=None) -> IMPALALearner:
    """IMPALA's learner for ``cfg`` on ``env``: networks, the V-trace loss, the learner.

    ``loss_cls`` (default :class:`~rlkit.objectives.IMPALALoss`): a subclass (or
    ``functools.partial`` of one) built in its place with exactly the recipe's arguments,
    ``loss_cls(actor, critic, gamma=, vtrace_lambda=, rho_clip=, c_clip=, pg_rho_clip=,
    adv_mode=, entropy_coef=, value_coef=, reduction=, normalize_advantage=)``. There is no
    ``estimator_cls``: IMPALA has no separate estimator, its loss computes V-trace itself."""
    if cfg.recurrent != "none" and cfg.sequence_length is not None:
        raise ValueError(
            f"--sequence-length {cfg.sequence_length}: IMPALA trains on whole env rows "
            "(V-trace runs along each row); drop it (APPO cuts rows into sequences)"
        )
    actor, critic, obs_norm = build_actor_critic(cfg, env)
    loss = make_part(
        loss_cls,
        IMPALALoss,
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
        normalize_advantage=cfg.normalize_advantage,
        where="impala.build",
    )
    return IMPALALearner(
        actor=actor,
        critic=critic,
        loss=loss,
        optimizer=policy_optimizer(cfg, actor, critic, obs_norm),
        obs_norm=obs_norm,
        **policy_gradient_settings(cfg),
        **worker_settings(cfg),
    )


# 5-6. collector, fit ------------------------------------------------------------------------
def train(cfg: IMPALAConfig, *, env=None, loss_cls=None) -> dict:
    """Train IMPALA under a parsed ``cfg`` (what ``recipes/impala.py`` runs after its
    flags); returns the run summary. ``loss_cls``: as for :func:`build`."""
    collector = worker_collector_factory(
        num_workers=cfg.workers,
        sync=cfg.sync_collect,
        actor_timeout=cfg.actor_timeout,
        max_restarts=cfg.max_actor_restarts,
    )
    build_parts = partial(build, loss_cls=loss_cls)
    return run(cfg, build_parts, algo="impala", env=env, make_collector=collector)


def main(argv: list[str] | None = None) -> dict:
    """``recipes/impala.py`` from Python: parse ``argv`` (default: the command line), then
    :func:`train`."""
    cfg = parse_config(IMPALAConfig, argv, presets=PRESETS, description=_config.__doc__)
    return train(cfg)
