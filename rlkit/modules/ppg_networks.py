"""Phasic Policy Gradient's networks (Cobbe et al. 2020): a policy network with an auxiliary
value head, and a value network (``dual``) or a detached value head on the same trunk
(``shared``). Built from plain arguments; :mod:`rlkit.algorithms.ppg` wires them to flags."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torchrl.modules import ValueOperator

from rlkit import keys
from rlkit.modules.actors import make_actor
from rlkit.modules.builders import gaussian_kwargs
from rlkit.modules.dictobs import (
    chain,
    dict_obs_encoder,
    entry_norms,
    obs_in_keys,
    resolve_obs_keys,
)
from rlkit.modules.networks import ENCODERS, make_encoder, mlp, mlp_body
from rlkit.modules.normalization import Normalize, RunningMeanStd

__all__ = ["ARCHS", "ENCODERS", "INIT_FNS", "PPGNetworks", "init_weights_", "ppg_networks"]

#: the network layouts :func:`ppg_networks` builds (``--arch``; the config layer lists the same
#: names, torch-free, and tests/test_layout.py checks that the two lists agree)
ARCHS = ("dual", "shared")
#: the initialisations :func:`init_weights_` applies (``--init-fn``; rllte's init_fn)
INIT_FNS = ("orthogonal", "xavier_uniform", "xavier_normal", "default")


@dataclass
class PPGNetworks:
    """The three heads PPG trains; ``trunk`` is the policy network's shared body."""

    actor: nn.Module
    critic: nn.Module
    aux_critic: nn.Module
    trunk: nn.Module
    obs_norm: nn.Module | None = None


class _Detach(nn.Module):
    """Stop gradients: the shared layout's value head must not train the trunk."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.detach()


def _encoder(
    encoder: str, obs_shape: Sequence[int], obs_norm: nn.Module | None, feature_dim: int | None
) -> tuple[nn.Module | None, int]:
    """(module, output width) of the feature extractor before the MLP layers
    (:func:`rlkit.modules.networks.make_encoder`, with the observation normaliser for mlp)."""
    if encoder != "mlp" and obs_norm is not None:
        raise ValueError(
            f"--normalize-obs applies to vector observations; the {encoder} encoder scales uint8 "
            "pixels to [0, 1] itself: drop --normalize-obs or use --encoder mlp"
        )
    enc, width = make_encoder(encoder, obs_shape, feature_dim=feature_dim)
    if obs_norm is not None:
        enc = Normalize(obs_norm)
    return enc, width


def init_weights_(module: nn.Module, init_fn: str) -> None:
    """Re-initialise ``module``'s layers as the seed implementation's (rllte's) ``init_fn``.

    ``"orthogonal"`` keeps the builders' orthogonal initialisation (gain sqrt 2 hidden,
    0.01 policy head, 1 value head). ``"xavier_uniform"`` / ``"xavier_normal"``: Xavier
    weights on the convolutions only, orthogonal weights of gain 1 on the Linear layers, zero
    biases (rllte's ``_xavier_*``); :func:`ppg_networks` then scales the policy head by 0.01 so
    the initial policy stays near uniform. ``"default"``: PyTorch's own initialisation of
    every Linear and Conv layer (``reset_parameters``; rllte's identity ``init_fn``).
    """
    if init_fn not in INIT_FNS:
        raise ValueError(f"init_fn must be one of {INIT_FNS}, got {init_fn!r}")
    if init_fn == "orthogonal":
        return
    conv = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose2d)
    if init_fn == "default":
        for m in module.modules():
            if isinstance(m, (nn.Linear, *conv)):
                m.reset_parameters()
        return
    fn = nn.init.xavier_uniform_ if init_fn == "xavier_uniform" else nn.init.xavier_normal_
    for m in module.modules():
        if isinstance(m, conv):
            fn(m.weight)
        elif isinstance(m, nn.Linear):
            nn.init.orthogonal_(m.weight)
        else:
            continue
        if m.bias is not None:
            nn.init.zeros_(m.bias)


def ppg_networks(
    env,
    *,
    arch: str = "dual",
    encoder: str = "mlp",
    feature_dim: int | None = None,
    hidden: Sequence[int] = (64, 64),
    activation: str = "tanh",
    init_fn: str = "orthogonal",
    normalize_obs: bool = False,
    init_log_std: float | None = None,
    actor_hidden: Sequence[int] | None = None,
    critic_hidden: Sequence[int] | None = None,
    bounded_mean: bool = False,
    obs_keys: Sequence[str] | None = None,
) -> PPGNetworks:
    """Actor, critic and auxiliary value head of Phasic Policy Gradient in the ``arch`` layout.

    ``dual`` (paper default): policy network = trunk -> policy head and trunk -> aux value
    head; a separate value network of the same shape. ``shared`` (the paper's single-network
    "detach" variant): one trunk; policy head, aux head, and a value head that reads the
    trunk's features detached, so value training never moves the trunk.

    ``encoder`` (:func:`rlkit.modules.networks.make_encoder`: ``mlp``, ``nature``, ``impala``
    or ``minatar``) starts each body, ``feature_dim`` its output width (None: the paper's);
    the ``hidden`` layers follow it. ``dual`` gives the value network an encoder of its own.
    ``obs_keys``: the entries of a Dict observation (None: all but the mask), each body then
    starting with a :class:`~rlkit.modules.dictobs.DictObsEncoder` (``obs_norm`` an
    :class:`~rlkit.modules.dictobs.EntryNorms`).
    """
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")
    obs_spec, act_spec = env.observation_spec, env.action_spec
    entries = resolve_obs_keys(env, obs_keys)
    obs_key: Any = keys.OBSERVATION if entries is None else list(entries)
    obs_norm: Any = None
    if entries is not None:
        obs_norm = entry_norms(env, entries) if normalize_obs else None
    else:
        obs_shape = obs_spec[keys.OBSERVATION].shape[len(env.batch_size) :]
        if normalize_obs:
            obs_norm = RunningMeanStd(obs_shape)

    if arch == "shared" and critic_hidden is not None:
        raise ValueError(
            "--critic-hidden sizes a separate value network, but --arch shared puts the value "
            "head on the policy trunk: use --arch dual, or drop --critic-hidden"
        )

    def body(sizes: Sequence[int]) -> tuple[nn.Module, int]:
        if entries is not None:
            enc = dict_obs_encoder(
                env, entries, encoder=encoder, feature_dim=feature_dim, norms=obs_norm
            )
            width = enc.out_features
        else:
            enc, width = _encoder(encoder, obs_shape, obs_norm, feature_dim)
        layers = mlp_body(width, hidden=tuple(sizes), activation=activation)
        return (layers if enc is None else chain(enc, layers)), (sizes[-1] if sizes else width)

    trunk, width = body(actor_hidden or hidden)
    net = dict(hidden=(), activation=activation, backbone=trunk, in_features=width, obs_key=obs_key)
    actor = make_actor(
        obs_spec, act_spec, **net, **gaussian_kwargs(env, init_log_std, bounded_mean)
    )

    def value_head(features: nn.Module, out_key: str, width: int = width) -> ValueOperator:
        return ValueOperator(
            chain(features, mlp(width, 1, hidden=())),
            in_keys=obs_in_keys(obs_key),
            out_keys=[out_key],
        )

    aux_critic = value_head(trunk, keys.AUX_STATE_VALUE)
    if arch == "shared":
        critic = value_head(chain(trunk, _Detach()), keys.STATE_VALUE)
    else:
        critic_body, critic_width = body(critic_hidden or hidden)
        critic = value_head(critic_body, keys.STATE_VALUE, critic_width)
    for m in (actor, critic, aux_critic):
        init_weights_(m, init_fn)
    if init_fn.startswith("xavier"):
        with torch.no_grad():  # near-uniform initial policy, as the orthogonal 0.01 head
            for p in _policy_head(actor):
                p.mul_(0.01)
    return PPGNetworks(actor, critic, aux_critic, trunk, obs_norm)


def _policy_head(actor: nn.Module) -> list[nn.Parameter]:
    """Parameters of the actor's last Linear layer (its policy head)."""
    linears = [m for m in actor.modules() if isinstance(m, nn.Linear)]
    return list(linears[-1].parameters())
