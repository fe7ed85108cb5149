"""RND-PPO: Exploration by Random Network Distillation (Burda et al. 2018), twin critic.

    python recipes/rnd.py                                  # MountainCar, sparse reward
    python recipes/rnd.py --env MountainCar-v0             # MountainCar-v0's -1 per step
    python recipes/rnd.py --int-coef 0                     # the same agent without the bonus
    python recipes/rnd.py --target-return -160 --seed 3    # stop once solved
    python recipes/rnd.py --accelerator cpu --devices 2 --strategy ddp
    python recipes/rnd.py --help                           # every flag

Algorithm box:
    1. config      RNDConfig (defaults, per-env preset, --config YAML, flags)
    2. networks    actor pi(a|s); twin critic V_ext(s), V_int(s) (one trunk, two heads);
                   RND: frozen random target f, trained predictor f_hat
    3. bonus       r_int = ||f_hat(s') - f(s')||^2 / std(discounted intrinsic return)
    4. estimator   TwinGAE: extrinsic GAE (episodic, gamma), intrinsic GAE (non-episodic,
                   gamma_int)
    5. losses      PPO clipped surrogate on ext_coef * A_ext + int_coef * A_int, both value
                   heads' regressions, entropy bonus; predictor MSE on s' of a random
                   update_proportion of each minibatch
    6. learner     epochs x minibatches, the two losses in lockstep (policy/critic
                   optimizer and predictor optimizer)
    7. fit         the engine: collect, update, evaluate, checkpoint
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict import TensorDictBase
from torch import nn

from rlkit import keys
from rlkit.algorithms.onpolicy import ClipConfig, PolicyGradientLearner, make_optimizer
from rlkit.modules.rnd_networks import rnd_networks
from rlkit.objectives.rnd import RND, RNDPPOLoss, RNDPredictorLoss
from rlkit.training import parse_config, run
from rlkit.training.config import in_unit_interval, non_negative, positive
from rlkit.training.engine import Context
from rlkit.training.update import LossGroup
from rlkit.value import TwinGAE


def _help(text: str, **kw: Any) -> dict[str, Any]:
    return {"help": text, **kw}


# 1. config ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class RNDConfig(ClipConfig):
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
        default=None, metadata=_help("predictor learning rate (none: --lr, same schedule)")
    )

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
def main(argv: list[str] | None = None) -> dict:
    cfg = parse_config(RNDConfig, argv, presets=PRESETS, description=__doc__)
    return run(cfg, build, algo="rnd")
