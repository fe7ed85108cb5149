"""RND-PPO's networks (Burda et al. 2018): the actor, one value network with an extrinsic and
an intrinsic head, and the RND target/predictor pair. Built from plain arguments;
:mod:`rlkit.algorithms.rnd` wires them to flags."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict.nn import TensorDictModule
from torch import nn

from rlkit import keys
from rlkit.modules.actors import make_actor
from rlkit.modules.builders import gaussian_kwargs
from rlkit.modules.networks import mlp
from rlkit.modules.normalization import Normalize, RunningMeanStd
from rlkit.objectives.rnd import RND

__all__ = ["TwinValueHead", "rnd_networks", "twin_value_critic"]


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
    net: nn.Module = mlp(in_features, 2, hidden=hidden, activation=activation)
    if backbone is not None:
        net = nn.Sequential(backbone, net)
    return TensorDictModule(
        TwinValueHead(net),
        in_keys=[keys.OBSERVATION],
        out_keys=[keys.STATE_VALUE, keys.INTRINSIC_STATE_VALUE],
    )


def rnd_networks(
    env,
    *,
    hidden: Sequence[int] = (64, 64),
    activation: str = "tanh",
    normalize_obs: bool = False,
    rnd_features: int = 64,
    rnd_hidden: Sequence[int] = (64, 64),
    rnd_activation: str = "relu",
    rnd_obs_clip: float = 5.0,
    gamma_int: float = 0.99,
    update_proportion: float = 1.0,
    init_log_std: float | None = None,
    actor_hidden: Sequence[int] | None = None,
    critic_hidden: Sequence[int] | None = None,
) -> tuple[nn.Module, nn.Module, RND, RunningMeanStd | None]:
    """Actor, twin critic, :class:`~rlkit.objectives.rnd.RND` module (one intrinsic return
    per env of ``env``) and the policy's optional observation normaliser, sized from
    ``env``'s specs."""
    obs_spec, act_spec = env.observation_spec, env.action_spec
    shape = obs_spec[keys.OBSERVATION].shape[len(env.batch_size) :]
    if len(shape) != 1:
        raise ValueError(
            f"the RND recipe's MLP networks need flat vector observations, got shape {list(shape)}"
        )
    width = int(shape[0])
    obs_norm = backbone = None
    if normalize_obs:
        obs_norm = RunningMeanStd(shape)
        backbone = Normalize(obs_norm)
    actor_net = dict(hidden=tuple(actor_hidden or hidden), activation=activation)
    critic_net = dict(hidden=tuple(critic_hidden or hidden), activation=activation)
    std = gaussian_kwargs(env, init_log_std)
    actor = make_actor(obs_spec, act_spec, backbone=backbone, in_features=width, **actor_net, **std)
    critic = twin_value_critic(width, backbone=backbone, **critic_net)
    rnd = RND(
        shape,
        num_envs=int(env.batch_size.numel()),
        feature_dim=rnd_features,
        target_hidden=tuple(rnd_hidden),
        predictor_hidden=tuple(rnd_hidden),
        activation=rnd_activation,
        obs_clip=rnd_obs_clip,
        gamma_int=gamma_int,
        update_proportion=update_proportion,
    )
    return actor, critic, rnd, obs_norm
