"""Decoupled Advantage Actor-Critic's networks (Raileanu & Fergus 2021): a policy network
(a trunk with a policy head and an action-conditioned advantage head) and a value network that
shares nothing with it. Built from plain arguments; :mod:`rlkit.algorithms.daac` wires them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tensordict.nn import TensorDictModule
from torch import nn

from rlkit import keys
from rlkit.modules.actors import make_actor
from rlkit.modules.builders import check_mlp_observation, gaussian_kwargs, image_obs_shape
from rlkit.modules.critics import action_kind, make_value
from rlkit.modules.dictobs import (
    chain,
    dict_obs_encoder,
    entry_norms,
    obs_in_keys,
    resolve_obs_keys,
)
from rlkit.modules.networks import make_encoder, mlp, mlp_body
from rlkit.modules.normalization import Normalize, RunningMeanStd

__all__ = ["ActionAdvantage", "DAACNetworks", "advantage_head", "daac_networks"]


class ActionAdvantage(nn.Module):
    r""":math:`A_\theta(s, a)` from the policy trunk's features, at the given action.

    ``kind="categorical"``: ``head(features)`` has one output per action, gathered at the
    int64 action index (the paper); ``"one_hot"``: the same, selected by a one-hot action;
    ``"continuous"``: ``head(concat(features, action))``. Returns ``[*, 1]``.
    """

    KINDS = ("categorical", "one_hot", "continuous")

    def __init__(self, trunk: nn.Module, head: nn.Module, *, kind: str) -> None:
        super().__init__()
        if kind not in self.KINDS:
            raise ValueError(f"ActionAdvantage: kind must be one of {self.KINDS}, got {kind!r}")
        self.trunk, self.head, self.kind = trunk, head, kind

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        *observation, action = inputs  # a Dict observation's entries, then the action
        features = self.trunk(*observation)
        if self.kind == "categorical":
            return self.head(features).gather(-1, action.long().unsqueeze(-1))
        if self.kind == "one_hot":
            return (self.head(features) * action.to(features.dtype)).sum(-1, keepdim=True)
        return self.head(torch.cat([features, action.to(features.dtype)], dim=-1))


def advantage_head(
    trunk: nn.Module,
    width: int,
    *,
    kind: str,
    size: int,
    hidden: tuple[int, ...] = (),
    activation: str = "tanh",
    obs_key=keys.OBSERVATION,
) -> TensorDictModule:
    """The advantage head as a TensorDict module: reads ``keys.OBSERVATION`` and
    ``keys.ACTION``, writes ``keys.ADVANTAGE_PRED`` ``[*, 1]``.

    Args:
        trunk: the policy network's feature extractor (shared with the actor).
        width: the trunk's output width.
        kind: ``"categorical"``, ``"one_hot"`` or ``"continuous"`` (see
            :class:`ActionAdvantage`).
        size: number of actions (discrete) or the action dimension (continuous).
        hidden: hidden widths of the head's MLP; output layer orthogonal with gain 1.
        obs_key: the observation key, or a Dict observation's entries (a list).
    """
    if kind == "continuous":
        head = mlp(width + size, 1, hidden=hidden, activation=activation)
    else:
        head = mlp(width, size, hidden=hidden, activation=activation)
    return TensorDictModule(
        ActionAdvantage(trunk, head, kind=kind),
        in_keys=[*obs_in_keys(obs_key), keys.ACTION],
        out_keys=[keys.ADVANTAGE_PRED],
    )


@dataclass
class DAACNetworks:
    """The policy network (``trunk`` -> ``actor`` and ``advantage_head``) and the value
    network (``critic``); ``obs_norm`` holds running observation statistics used by both."""

    actor: nn.Module
    advantage_head: nn.Module
    critic: nn.Module
    trunk: nn.Module
    obs_norm: nn.Module | None = None


def daac_networks(
    env,
    *,
    hidden: Sequence[int] = (64, 64),
    activation: str = "tanh",
    adv_hidden: Sequence[int] | None = None,
    normalize_obs: bool = False,
    init_log_std: float | None = None,
    actor_hidden: Sequence[int] | None = None,
    critic_hidden: Sequence[int] | None = None,
    encoder: str = "mlp",
    feature_dim: int | None = None,
    bounded_mean: bool = False,
    obs_keys: Sequence[str] | None = None,
) -> DAACNetworks:
    """Policy network and value network sized from ``env``'s specs.

    Policy network: ``[Normalize] -> mlp_body(hidden)`` trunk, a linear policy head (gain
    0.01) and the advantage head (``adv_hidden`` hidden widths; ``None``: none for discrete
    actions, one layer of the trunk's width for continuous ones). Value network:
    ``[Normalize] -> mlp(hidden) -> 1``, no parameter shared with the policy network.
    ``encoder``: ``"mlp"`` (flat observations), or an image encoder of
    :func:`~rlkit.modules.networks.make_encoder` (``feature_dim`` its width) in place of
    ``Normalize``: the trunk and the value network each get their own. ``init_log_std`` and
    ``bounded_mean``: a Gaussian policy's (:func:`~rlkit.modules.builders.gaussian_kwargs`).
    ``obs_keys``: a Dict observation's entries (None: all but the mask): the trunk and the
    value network each start with their own :class:`~rlkit.modules.dictobs.DictObsEncoder`.
    """
    hidden = tuple(hidden)
    gaussian = gaussian_kwargs(env, init_log_std, bounded_mean)
    entries = resolve_obs_keys(env, obs_keys)
    if entries is not None:
        norms = entry_norms(env, entries) if normalize_obs else None

        def encoder_() -> nn.Module:
            return dict_obs_encoder(
                env, entries, encoder=encoder, feature_dim=feature_dim, norms=norms
            )

        policy_hidden = tuple(hidden if actor_hidden is None else actor_hidden)
        enc = encoder_()
        trunk = chain(enc, mlp_body(enc.out_features, hidden=policy_hidden, activation=activation))
        width = policy_hidden[-1] if policy_hidden else enc.out_features
        critic_enc = encoder_()
        critic = dict(
            backbone=critic_enc,
            in_features=critic_enc.out_features,
            hidden=tuple(hidden if critic_hidden is None else critic_hidden),
            obs_key=list(entries),
        )
        return _daac_heads(
            env, trunk, width, critic, activation, adv_hidden, gaussian, norms, list(entries)
        )
    if encoder != "mlp":
        return _image_daac_networks(
            env,
            hidden=hidden,
            activation=activation,
            adv_hidden=adv_hidden,
            normalize_obs=normalize_obs,
            gaussian=gaussian,
            actor_hidden=actor_hidden,
            critic_hidden=critic_hidden,
            encoder=encoder,
            feature_dim=feature_dim,
        )
    check_mlp_observation(env, feature_dim)

    shape = env.observation_spec[keys.OBSERVATION].shape[len(env.batch_size) :]
    if len(shape) != 1:
        raise ValueError(
            f"DAAC's MLP networks need flat vector observations, got shape {list(shape)}: "
            "flatten them with a gymnasium wrapper or build the networks by hand"
        )
    obs_dim = int(shape[0])
    obs_norm = norm = None
    if normalize_obs:
        obs_norm = RunningMeanStd(shape)
        norm = Normalize(obs_norm)
    policy_hidden = tuple(actor_hidden or hidden)
    body = mlp_body(obs_dim, hidden=policy_hidden, activation=activation)
    trunk = body if norm is None else nn.Sequential(norm, body)
    width = policy_hidden[-1]
    critic = dict(
        backbone=norm,
        in_features=obs_dim if norm is not None else None,
        hidden=tuple(critic_hidden or hidden),
    )
    return _daac_heads(env, trunk, width, critic, activation, adv_hidden, gaussian, obs_norm)


def _image_daac_networks(
    env,
    *,
    hidden: tuple[int, ...],
    activation: str,
    adv_hidden: Sequence[int] | None,
    normalize_obs: bool,
    gaussian: dict,
    actor_hidden: Sequence[int] | None,
    critic_hidden: Sequence[int] | None,
    encoder: str,
    feature_dim: int | None,
) -> DAACNetworks:
    """:func:`daac_networks` with an image encoder: the trunk is ``encoder ->
    mlp_body(actor_hidden or hidden)``, the value network ``its own encoder ->
    mlp(critic_hidden or hidden) -> 1``."""
    shape = image_obs_shape(env, encoder, normalize_obs=normalize_obs)
    policy_hidden = tuple(hidden if actor_hidden is None else actor_hidden)
    enc, width = make_encoder(encoder, shape, feature_dim=feature_dim)
    trunk = nn.Sequential(enc, mlp_body(width, hidden=policy_hidden, activation=activation))
    width = policy_hidden[-1] if policy_hidden else width
    critic_enc, critic_width = make_encoder(encoder, shape, feature_dim=feature_dim)
    critic = dict(
        backbone=critic_enc,
        in_features=critic_width,
        hidden=tuple(hidden if critic_hidden is None else critic_hidden),
    )
    return _daac_heads(env, trunk, width, critic, activation, adv_hidden, gaussian, None)


def _daac_heads(
    env,
    trunk: nn.Module,
    width: int,
    critic: dict,
    activation: str,
    adv_hidden: Sequence[int] | None,
    gaussian: dict,
    obs_norm: nn.Module | None,
    obs_key=keys.OBSERVATION,
) -> DAACNetworks:
    """The policy head and the advantage head on ``trunk`` (``width`` features), and the
    value network (``make_value`` with the ``critic`` keywords)."""
    obs_spec, act_spec = env.observation_spec, env.action_spec
    actor = make_actor(
        obs_spec,
        act_spec,
        backbone=trunk,
        in_features=width,
        hidden=(),
        activation=activation,
        obs_key=obs_key,
        **gaussian,
    )
    info = action_kind(act_spec, batch_shape=tuple(env.batch_size))
    if adv_hidden is None:
        adv_hidden = (width,) if info.kind == "continuous" else ()
    head = advantage_head(
        trunk,
        width,
        kind=info.kind,
        size=info.size,
        hidden=tuple(adv_hidden),
        activation=activation,
        obs_key=obs_key,
    )
    value = make_value(obs_spec, activation=activation, **critic)
    return DAACNetworks(actor, head, value, trunk, obs_norm)
