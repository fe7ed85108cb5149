"""The paper's RND-PPO critic (Burda et al. 2018): one value network with an extrinsic and an
intrinsic head, for :class:`rlkit.objectives.RNDPPOLoss` and :class:`rlkit.value.TwinGAE` in
research code. ``recipes/rnd.py`` builds PPO's networks and the
:class:`rlkit.objectives.intrinsic.RNDReward` part instead (:mod:`rlkit.algorithms.rnd`)."""

from __future__ import annotations

import torch
from tensordict.nn import TensorDictModule
from torch import nn

from rlkit import keys
from rlkit.modules.networks import mlp

__all__ = ["TwinValueHead", "twin_value_critic"]


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
