"""Network builders that take plain arguments (sizes, activation, flags), never a config."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from rlkit import keys
from rlkit.modules.actors import make_actor
from rlkit.modules.critics import make_value
from rlkit.modules.normalization import Normalize, RunningMeanStd

__all__ = ["actor_critic_networks"]


def actor_critic_networks(
    env,
    *,
    hidden: Sequence[int] = (64, 64),
    activation: str = "tanh",
    normalize_obs: bool = False,
) -> tuple[nn.Module, nn.Module, RunningMeanStd | None]:
    """Separate actor and V critic sized from ``env``'s specs: ``(actor, critic, obs_norm)``.

    With ``normalize_obs`` both networks start with the same :class:`Normalize` over one
    :class:`RunningMeanStd` (returned third, for the learner to update); else it is ``None``.
    """
    obs_spec, act_spec = env.observation_spec, env.action_spec
    obs_norm = backbone = in_features = None
    if normalize_obs:
        shape = obs_spec[keys.OBSERVATION].shape[len(env.batch_size) :]
        obs_norm = RunningMeanStd(shape)
        backbone, in_features = Normalize(obs_norm), int(torch.Size(shape).numel())
    net = dict(hidden=tuple(hidden), activation=activation)
    actor = make_actor(obs_spec, act_spec, backbone=backbone, in_features=in_features, **net)
    critic = make_value(obs_spec, backbone=backbone, in_features=in_features, **net)
    return actor, critic, obs_norm
