"""RND-PPO (Burda et al. 2018): networks, learner and :func:`train`, what ``recipes/rnd.py`` runs.

The config (:class:`RNDConfig`), its presets and the algorithm box that ``--help`` shows live
in the torch-free :mod:`rlkit.configs.rnd` and are imported here under their old names.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from tensordict import TensorDictBase
from torch import nn

from rlkit import keys
from rlkit.algorithms.onpolicy import PolicyGradientLearner, make_optimizer
from rlkit.configs import rnd as _config
from rlkit.configs.rnd import PRESETS, RNDConfig
from rlkit.modules.rnd_networks import rnd_networks
from rlkit.objectives.rnd import RND, RNDPPOLoss, RNDPredictorLoss
from rlkit.training import parse_config, run
from rlkit.training.engine import Context
from rlkit.training.update import LossGroup
from rlkit.value import TwinGAE


def build_rnd_networks(cfg: RNDConfig, env) -> tuple[nn.Module, nn.Module, RND, nn.Module | None]:
    """:func:`rlkit.modules.rnd_networks.rnd_networks` with a config's flags."""
    return rnd_networks(
        env,
        hidden=cfg.hidden,
        activation=cfg.activation,
        normalize_obs=cfg.normalize_obs,
        rnd_features=cfg.rnd_features,
        rnd_hidden=cfg.rnd_hidden,
        rnd_activation=cfg.rnd_activation,
        rnd_obs_clip=cfg.rnd_obs_clip,
        gamma_int=cfg.gamma_int,
        update_proportion=cfg.update_proportion,
        init_log_std=cfg.init_log_std,
        actor_hidden=cfg.actor_layers,
        critic_hidden=cfg.critic_layers,
    )


# the learner ---------------------------------------------------------------------------------
# RND-PPO's learner: intrinsic rewards, two-stream GAE, PPO epochs with the predictor.
#
# Per collected batch ``[N, T]`` (Burda et al. 2018, Algorithm 1)::
#
#     merge the batch's next observations into the RND observation statistics (all ranks)
#     r_int = ||f_hat(s') - f(s')||^2 / std(discounted intrinsic return)    # RND
#     [--normalize-reward: the training env already scaled r_ext by the std of its
#      discounted episodic return (rlkit.modules.RewardNorm)]
#     TwinGAE: A_ext, V_ext target (episodic, gamma_ext); A_int, V_int target
#              (non-episodic, gamma_int)
#     for epoch in 1..epochs, for each minibatch (update_loop, two loss groups in lockstep):
#         "policy":    PPO clipped surrogate on ext_coef * A_ext + int_coef * A_int
#                      + value_coef * (ext head + int head regressions) + entropy -> optimizer
#         "predictor": predictor MSE on s' of a random update_proportion of the
#                      minibatch (RNDPredictorLoss)                             -> predictor opt.
#
# The twin critic is **one value network with two heads** (a shared MLP trunk, a linear
# layer with two outputs: extrinsic and intrinsic), as in the paper's policy (whose trunk
# is also shared with the policy head; here the actor stays separate, as in rlkit's PPO).
#
# Multi-device: gradients of both optimisers are all-reduced by ``Context.step_optimizer``; the
# observation and return statistics are merged from ``Context.all_gather``-ed data, so every
# rank holds the same statistics and the same parameters.


class RNDLearner(PolicyGradientLearner):
    """PPO with a twin critic and an RND bonus (see the module docstring for the update).

    Args:
        actor: the policy.
        critic: the twin critic (:func:`twin_value_critic`).
        rnd: the :class:`~rlkit.objectives.rnd.RND` module.
        estimator: :class:`~rlkit.value.TwinGAE` over the twin critic.
        loss: :class:`~rlkit.objectives.rnd.RNDPPOLoss`.
        cfg: an :class:`RNDConfig`.
        obs_norm, loss_schedules: as for :class:`PolicyGradientLearner`.
        predictor_loss: the predictor's loss (default
            :class:`~rlkit.objectives.rnd.RNDPredictorLoss` over ``rnd``); its mask is drawn
            from the run's generator.

    Modules (checkpointed): ``actor``, ``critic``, ``obs_norm`` (when used) and ``rnd``
    (target, predictor, observation / return statistics and the per-env discounted
    intrinsic returns, all buffers). Optimisers: ``optimizer``
    (actor and critic) and ``predictor`` (the RND predictor, its own Adam so its gradient
    never enters the policy's clipping norm).
    """

    def __init__(
        self,
        *,
        actor: nn.Module,
        critic: nn.Module,
        rnd: RND,
        estimator: nn.Module,
        loss: nn.Module,
        cfg: RNDConfig,
        obs_norm: nn.Module | None = None,
        loss_schedules: Mapping[str, tuple[float, float]] | None = None,
        predictor_loss: nn.Module | None = None,
    ) -> None:
        super().__init__(
            algo="rnd",
            actor=actor,
            critic=critic,
            estimator=estimator,
            loss=loss,
            cfg=cfg,
            obs_norm=obs_norm,
            loss_schedules=loss_schedules,
        )
        self.rnd = rnd
        self.predictor_loss = RNDPredictorLoss(rnd) if predictor_loss is None else predictor_loss
        predictor_cfg = cfg if cfg.predictor_lr is None else _with_lr(cfg, cfg.predictor_lr)
        self.predictor_optimizer = make_optimizer(predictor_cfg, rnd.predictor.parameters())

    def modules(self) -> dict[str, nn.Module]:
        return super().modules() | {"rnd": self.rnd}

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return super().optimizers() | {"predictor": self.predictor_optimizer}

    def apply_schedules(self, progress: float) -> dict[str, float]:
        out = super().apply_schedules(progress)
        base = self.cfg.predictor_lr or self.cfg.lr
        lr = base * out["lr"] / self.cfg.lr
        for group in self.predictor_optimizer.param_groups:
            group["lr"] = lr
        return out | {"predictor_lr": lr}

    @torch.no_grad()
    def rewards(self, batch: TensorDictBase, ctx: Context) -> dict[str, float]:
        """Write ``keys.INTRINSIC_REWARD`` into ``batch`` (statistics merged over ranks)."""
        time_first = (
            keys.TIME_DIM_NAME in batch.names and batch.names.index(keys.TIME_DIM_NAME) == 0
        )

        def env_major(x: torch.Tensor) -> torch.Tensor:  # RND and the scalers want [N, T]
            return x.transpose(0, 1) if time_first else x

        next_obs = env_major(batch.get(keys.NEXT_OBSERVATION))
        reward = env_major(self.rnd.intrinsic_reward(next_obs, all_gather=ctx.all_gather))
        batch.set(keys.INTRINSIC_REWARD, reward)
        out = {
            "intrinsic_reward_mean": float(reward.mean()),
            "intrinsic_reward_max": float(reward.max()),
            "intrinsic_return_std": float(self.rnd.return_stats.std),
        }
        return out

    def loss_groups(self) -> list[LossGroup]:
        """``[policy, predictor]``, in lockstep over the same minibatches for ``--epochs``."""
        if not hasattr(self, "_groups"):
            cfg = self.cfg
            self._groups = [
                *super().loss_groups(),
                LossGroup(
                    "predictor",
                    self.predictor_loss,
                    self.predictor_optimizer,
                    epochs=cfg.epochs,
                    max_grad_norm=cfg.max_grad_norm,
                    grad_name="predictor_grad_norm",
                ),
            ]
        return self._groups

    def update(self, batch: TensorDictBase, ctx: Context) -> dict[str, float]:
        rnd_stats = self.rewards(batch, ctx)  # before the estimator, which reads them
        self.predictor_loss.generator = ctx.generator
        return super().update(batch, ctx) | rnd_stats


def _with_lr(cfg: RNDConfig, lr: float) -> RNDConfig:
    import dataclasses

    return dataclasses.replace(cfg, lr=lr)


# 2-6. networks, bonus, estimator, loss, learner ---------------------------------------------
def build(cfg: RNDConfig, env) -> RNDLearner:
    actor, critic, rnd, obs_norm = build_rnd_networks(cfg, env)
    estimator = TwinGAE(
        gamma=cfg.gamma, gamma_int=cfg.gamma_int, lmbda=cfg.gae_lambda, value_network=critic
    )
    loss = RNDPPOLoss(
        actor,
        critic,
        ext_coef=cfg.ext_coef,
        int_coef=cfg.int_coef,
        clip_epsilon=cfg.clip_epsilon,
        entropy_coef=cfg.entropy_coef,
        value_coef=cfg.value_coef,
        value_clip_epsilon=cfg.value_clip,
        normalize_advantage=cfg.normalize_advantage,
    )
    return RNDLearner(
        actor=actor,
        critic=critic,
        rnd=rnd,
        estimator=estimator,
        loss=loss,
        cfg=cfg,
        obs_norm=obs_norm,
        loss_schedules=cfg.loss_schedules,
        predictor_loss=RNDPredictorLoss(rnd),
    )


# 7. fit -------------------------------------------------------------------------------------
def train(cfg: RNDConfig) -> dict:
    """Train RND-PPO under a parsed ``cfg`` (what ``recipes/rnd.py`` runs after its
    flags); returns the run summary."""
    return run(cfg, build, algo="rnd")


def main(argv: list[str] | None = None) -> dict:
    """``recipes/rnd.py`` from Python: parse ``argv`` (default: the command line), then
    :func:`train`."""
    cfg = parse_config(RNDConfig, argv, presets=PRESETS, description=_config.__doc__)
    return train(cfg)
