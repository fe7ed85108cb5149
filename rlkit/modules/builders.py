"""Network builders that take plain arguments (sizes, activation, flags), never a config."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from rlkit import keys
from rlkit.modules.actors import make_actor
from rlkit.modules.critics import make_value
from rlkit.modules.normalization import Normalize, RunningMeanStd

__all__ = ["actor_critic_networks", "gaussian_kwargs"]


def gaussian_kwargs(env, init_log_std: float | None) -> dict[str, float]:
    """``make_actor`` keywords for a Gaussian policy's initial log-std: ``{}`` when
    ``init_log_std`` is None (the builders' default, log-std 0); a ValueError naming the
    flag when it is set for an env whose actions are discrete (no standard deviation)."""
    if init_log_std is None:
        return {}
    from rlkit.modules.critics import action_kind

    info = action_kind(env.action_spec, batch_shape=tuple(env.batch_size))
    if info.kind != "continuous":
        raise ValueError(
            "--std-init (init_log_std) sets a Gaussian policy's initial standard deviation, "
            "but this env's actions are discrete (a categorical policy has none): drop it"
        )
    return {"init_log_std": float(init_log_std)}


def actor_critic_networks(
    env,
    *,
    hidden: Sequence[int] = (64, 64),
    activation: str = "tanh",
    normalize_obs: bool = False,
    init_log_std: float | None = None,
    actor_hidden: Sequence[int] | None = None,
    critic_hidden: Sequence[int] | None = None,
) -> tuple[nn.Module, nn.Module, RunningMeanStd | None]:
    """Separate actor and V critic sized from ``env``'s specs: ``(actor, critic, obs_norm)``.

    With ``normalize_obs`` both networks start with the same :class:`Normalize` over one
    :class:`RunningMeanStd` (returned third, for the learner to update); else it is ``None``.
    ``init_log_std``: a Gaussian policy's initial log-std (None: 0; continuous actions only).
    ``actor_hidden`` / ``critic_hidden``: each network's hidden sizes (None: ``hidden``).
    """
    obs_spec, act_spec = env.observation_spec, env.action_spec
    obs_norm = backbone = in_features = None
    if normalize_obs:
        shape = obs_spec[keys.OBSERVATION].shape[len(env.batch_size) :]
        obs_norm = RunningMeanStd(shape)
        backbone, in_features = Normalize(obs_norm), int(torch.Size(shape).numel())
    actor_net = dict(hidden=tuple(actor_hidden or hidden), activation=activation)
    critic_net = dict(hidden=tuple(critic_hidden or hidden), activation=activation)
    std = gaussian_kwargs(env, init_log_std)
    actor = make_actor(
        obs_spec, act_spec, backbone=backbone, in_features=in_features, **actor_net, **std
    )
    critic = make_value(obs_spec, backbone=backbone, in_features=in_features, **critic_net)
    return actor, critic, obs_norm
