r"""RND-PPO's learner: intrinsic rewards, two-stream GAE, PPO epochs with the predictor.

Per collected batch ``[N, T]`` (Burda et al. 2018, Algorithm 1)::

    merge the batch's next observations into the RND observation statistics (all ranks)
    r_int = ||f_hat(s') - f(s')||^2 / std(discounted intrinsic return)    # RND
    [--normalize-reward: the training env already scaled r_ext by the std of its
     discounted episodic return (rlkit.modules.RewardNorm)]
    TwinGAE: A_ext, V_ext target (episodic, gamma_ext); A_int, V_int target
             (non-episodic, gamma_int)
    for epoch in 1..epochs, for each minibatch (update_loop, two loss groups in lockstep):
        "policy":    PPO clipped surrogate on ext_coef * A_ext + int_coef * A_int
                     + value_coef * (ext head + int head regressions) + entropy -> optimizer
        "predictor": predictor MSE on s' of a random update_proportion of the
                     minibatch (RNDPredictorLoss)                             -> predictor opt.

The twin critic is **one value network with two heads** (a shared MLP trunk, a linear
layer with two outputs: extrinsic and intrinsic), as in the paper's policy (whose trunk
is also shared with the policy head; here the actor stays separate, as in rlkit's PPO).

Multi-device: gradients of both optimisers are all-reduced by ``Context.step_optimizer``; the
observation and return statistics are merged from ``Context.all_gather``-ed data, so every
rank holds the same statistics and the same parameters.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule
from torch import nn

from rlkit import keys
from rlkit.objectives.rnd import RND, RNDPredictorLoss
from rlkit.training.config import in_unit_interval, non_negative, positive
from rlkit.training.engine import Context
from rlkit.training.onpolicy import ClipConfig, Normalize, PolicyGradientLearner, make_optimizer
from rlkit.training.update import LossGroup

__all__ = ["RNDConfig", "RNDLearner", "TwinValueHead", "build_rnd_networks", "twin_value_critic"]


def _help(text: str, **kw: Any) -> dict[str, Any]:
    return {"help": text, **kw}


@dataclass(frozen=True)
class RNDConfig(ClipConfig):
    """Flags of RND-PPO on top of PPO's (``--gamma`` is the extrinsic discount)."""

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


# --------------------------------------------------------------------------- networks
class TwinValueHead(nn.Module):
    """``body(x) -> Linear(width, 2)`` split into ``(V_ext [*, 1], V_int [*, 1])``."""

    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.body(x)
        return out[..., :1], out[..., 1:]


def twin_value_critic(
    in_features: int,
    *,
    hidden: tuple[int, ...] = (64, 64),
    activation: str = "tanh",
    backbone: nn.Module | None = None,
) -> TensorDictModule:
    """One value network with two heads: reads ``keys.OBSERVATION``, writes
    ``keys.STATE_VALUE`` (extrinsic) and ``keys.INTRINSIC_STATE_VALUE`` ``[*, 1]`` each."""
    from rlkit.modules.networks import mlp

    net: nn.Module = mlp(in_features, 2, hidden=hidden, activation=activation)
    if backbone is not None:
        net = nn.Sequential(backbone, net)
    return TensorDictModule(
        TwinValueHead(net),
        in_keys=[keys.OBSERVATION],
        out_keys=[keys.STATE_VALUE, keys.INTRINSIC_STATE_VALUE],
    )


def build_rnd_networks(cfg: RNDConfig, env) -> tuple[nn.Module, nn.Module, RND, nn.Module | None]:
    """Actor, twin critic, :class:`RND` module and the policy's optional observation
    normaliser (``--normalize-obs``), sized from ``env``'s specs."""
    from rlkit.modules import make_actor
    from rlkit.modules.normalization import RunningMeanStd

    obs_spec, act_spec = env.observation_spec, env.action_spec
    shape = obs_spec[keys.OBSERVATION].shape[len(env.batch_size) :]
    if len(shape) != 1:
        raise ValueError(
            f"the RND recipe's MLP networks need flat vector observations, got shape {list(shape)}"
        )
    width = int(shape[0])
    obs_norm = backbone = None
    if cfg.normalize_obs:
        obs_norm = RunningMeanStd(shape)
        backbone = Normalize(obs_norm)
    net = dict(hidden=cfg.hidden, activation=cfg.activation)
    actor = make_actor(obs_spec, act_spec, backbone=backbone, in_features=width, **net)
    critic = twin_value_critic(width, backbone=backbone, **net)
    rnd = RND(
        shape,
        num_envs=cfg.num_envs,
        feature_dim=cfg.rnd_features,
        target_hidden=cfg.rnd_hidden,
        predictor_hidden=cfg.rnd_hidden,
        activation=cfg.rnd_activation,
        obs_clip=cfg.rnd_obs_clip,
        gamma_int=cfg.gamma_int,
        update_proportion=cfg.update_proportion,
    )
    return actor, critic, rnd, obs_norm


# --------------------------------------------------------------------------- learner
class RNDLearner(PolicyGradientLearner):
    """PPO with a twin critic and an RND bonus (see the module docstring for the update).

    Args:
        actor: the policy.
        critic: the twin critic (:func:`twin_value_critic`).
        rnd: the :class:`~rlkit.objectives.rnd.RND` module.
        estimator: :class:`~rlkit.objectives.rnd.TwinGAE` over the twin critic.
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
