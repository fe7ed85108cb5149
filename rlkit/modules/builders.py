"""Network builders that take plain arguments (sizes, activation, flags), never a config."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from rlkit import keys
from rlkit.modules.actors import make_actor
from rlkit.modules.critics import make_value
from rlkit.modules.dictobs import dict_obs_encoder, entry_norms, resolve_obs_keys
from rlkit.modules.networks import make_encoder, reinit_
from rlkit.modules.normalization import Normalize, RunningMeanStd

__all__ = ["actor_critic_networks", "check_mlp_observation", "gaussian_kwargs", "obs_shape"]


def gaussian_kwargs(
    env, init_log_std: float | None, bounded_mean: bool = False
) -> dict[str, float | bool]:
    """``make_actor`` keywords for a Gaussian policy's initial log-std and bounded mean:
    ``{}`` when ``init_log_std`` is None (the builders' default, log-std 0) and
    ``bounded_mean`` is off; a ValueError naming the flag when either is set for an env whose
    actions are discrete (no Gaussian)."""
    kw: dict[str, float | bool] = {}
    if init_log_std is not None:
        kw["init_log_std"] = float(init_log_std)
    if bounded_mean:
        kw["bounded_loc"] = True
    if not kw:
        return kw
    from rlkit.modules.composite import action_layout
    from rlkit.modules.critics import action_kind

    layout = action_layout(env.full_action_spec, tuple(env.batch_size))
    if layout is not None and (bounded_mean or all(p.kind != "normal" for p in layout.parts)):
        what = "--bounded-mean" if bounded_mean else "--std-init (init_log_std)"
        raise ValueError(
            f"{what} applies to a Gaussian policy, but this env's actions are "
            f"{layout.describe()} (no bounded Gaussian part): drop it"
        )
    if layout is not None:
        return kw

    info = action_kind(env.action_spec, batch_shape=tuple(env.batch_size))
    if info.kind != "continuous":
        what = (
            "--std-init (init_log_std) sets a Gaussian policy's initial standard deviation"
            if init_log_std is not None
            else "--bounded-mean squashes a Gaussian policy's mean into the action bounds"
        )
        raise ValueError(
            f"{what}, but this env's actions are discrete (a categorical policy has none): drop it"
        )
    return kw


def actor_critic_networks(
    env,
    *,
    hidden: Sequence[int] = (64, 64),
    activation: str = "tanh",
    normalize_obs: bool = False,
    init_log_std: float | None = None,
    actor_hidden: Sequence[int] | None = None,
    critic_hidden: Sequence[int] | None = None,
    encoder: str = "mlp",
    feature_dim: int | None = None,
    bounded_mean: bool = False,
    init: str = "orthogonal",
    obs_keys: Sequence[str] | None = None,
) -> tuple[nn.Module, nn.Module, RunningMeanStd | None]:
    """Separate actor and V critic sized from ``env``'s specs: ``(actor, critic, obs_norm)``.

    With ``normalize_obs`` both networks start with the same :class:`Normalize` over one
    :class:`RunningMeanStd` (returned third, for the learner to update); else it is ``None``.
    ``init_log_std``: a Gaussian policy's initial log-std (None: 0; continuous actions only).
    ``bounded_mean``: squash a Gaussian policy's mean into the action bounds
    (:func:`~rlkit.modules.actors.gaussian_actor` ``bounded_loc``).
    ``actor_hidden`` / ``critic_hidden``: each network's hidden sizes (None: ``hidden``).
    ``encoder``: ``"mlp"`` (flat observations), or an image encoder of
    :func:`~rlkit.modules.networks.make_encoder` (``"nature"``, ``"impala"``, ``"minatar"``,
    ``feature_dim`` its output width) that each network gets its own of, before its hidden
    layers.
    ``init``: ``"orthogonal"`` (the builders' own), ``"torch"`` or ``"gymnax"``, applied to
    every layer of both networks afterwards (:func:`~rlkit.modules.networks.reinit_`).
    ``obs_keys``: the entries of a Dict observation the networks read (None: every entry but
    the action mask; :func:`~rlkit.modules.dictobs.resolve_obs_keys`), each network through
    its own :class:`~rlkit.modules.dictobs.DictObsEncoder` (image entries through
    ``encoder``); ``obs_norm`` is then an :class:`~rlkit.modules.dictobs.EntryNorms` (one
    set of statistics per float vector entry). A single ``"observation"`` builds exactly the
    networks it always did.
    """
    actor, critic, obs_norm = _actor_critic(
        env,
        hidden=hidden,
        activation=activation,
        normalize_obs=normalize_obs,
        init_log_std=init_log_std,
        actor_hidden=actor_hidden,
        critic_hidden=critic_hidden,
        encoder=encoder,
        feature_dim=feature_dim,
        bounded_mean=bounded_mean,
        obs_keys=obs_keys,
    )
    return reinit_(actor, init), reinit_(critic, init), obs_norm


def _actor_critic(
    env,
    *,
    hidden,
    activation,
    normalize_obs,
    init_log_std,
    actor_hidden,
    critic_hidden,
    encoder,
    feature_dim,
    bounded_mean,
    obs_keys=None,
) -> tuple[nn.Module, nn.Module, RunningMeanStd | None]:
    obs_spec, act_spec = env.observation_spec, env.action_spec
    actor_net = dict(hidden=tuple(actor_hidden or hidden), activation=activation)
    critic_net = dict(hidden=tuple(critic_hidden or hidden), activation=activation)
    entries = resolve_obs_keys(env, obs_keys)
    if entries is not None:
        std = gaussian_kwargs(env, init_log_std, bounded_mean)
        norms = entry_norms(env, entries) if normalize_obs else None

        def features() -> dict:
            enc = dict_obs_encoder(
                env, entries, encoder=encoder, feature_dim=feature_dim, norms=norms
            )
            return dict(backbone=enc, in_features=enc.out_features, obs_key=list(entries))

        actor = make_actor(obs_spec, act_spec, **features(), **actor_net, **std)
        critic = make_value(obs_spec, **features(), **critic_net)
        return actor, critic, norms
    if encoder != "mlp":
        std = gaussian_kwargs(env, init_log_std, bounded_mean)
        image = dict(encoder=encoder, feature_dim=feature_dim, normalize_obs=normalize_obs)
        return _image_actor_critic(env, actor_net=actor_net | std, critic_net=critic_net, **image)
    check_mlp_observation(env, feature_dim)
    obs_norm = backbone = in_features = None
    if normalize_obs:
        shape = obs_spec[keys.OBSERVATION].shape[len(env.batch_size) :]
        obs_norm = RunningMeanStd(shape)
        backbone, in_features = Normalize(obs_norm), int(torch.Size(shape).numel())
    std = gaussian_kwargs(env, init_log_std, bounded_mean)
    actor = make_actor(
        obs_spec, act_spec, backbone=backbone, in_features=in_features, **actor_net, **std
    )
    critic = make_value(obs_spec, backbone=backbone, in_features=in_features, **critic_net)
    return actor, critic, obs_norm


def obs_shape(env) -> tuple[int, ...] | None:
    """One observation's shape (env batch dims stripped), or None without an ``observation``
    entry (a Dict observation space)."""
    spec = env.observation_spec
    if keys.OBSERVATION not in spec.keys(True):
        return None
    return tuple(spec[keys.OBSERVATION].shape[len(env.batch_size) :])


def check_mlp_observation(env, feature_dim: int | None) -> None:
    """``--encoder mlp`` on images, or with ``--feature-dim``: an error naming the fix (other
    observations are the actor builders' to check, as before)."""
    shape = obs_shape(env)
    if feature_dim is not None or (shape is not None and len(shape) == 3):
        make_encoder("mlp", shape or (1,), feature_dim=feature_dim)


def image_obs_shape(env, encoder: str, *, normalize_obs: bool = False) -> tuple[int, ...]:
    """The image shape an ``encoder`` (not mlp) reads from ``env``'s observations; refuses
    ``--normalize-obs`` (the encoder scales uint8 pixels itself) and observations with no
    image under ``keys.OBSERVATION``, each naming the fix."""
    if normalize_obs:
        raise ValueError(
            f"--normalize-obs applies to vector observations; the {encoder} encoder scales uint8 "
            "pixels to [0, 1] itself: drop --normalize-obs or use --encoder mlp"
        )
    shape = obs_shape(env)
    if shape is None:
        raise ValueError(
            f"--encoder {encoder} reads an image under {keys.OBSERVATION!r}, and this env's "
            "observations have no such entry (a Dict observation space): use --encoder mlp"
        )
    return shape


def _image_actor_critic(
    env,
    *,
    encoder: str,
    feature_dim: int | None,
    normalize_obs: bool,
    actor_net: dict,
    critic_net: dict,
) -> tuple[nn.Module, nn.Module, None]:
    """:func:`actor_critic_networks` with an image encoder: each network its own encoder (as
    the MLP path keeps actor and critic apart), then its hidden layers and head."""
    shape = image_obs_shape(env, encoder, normalize_obs=normalize_obs)

    def features() -> dict:
        enc, width = make_encoder(encoder, shape, feature_dim=feature_dim)
        return dict(backbone=enc, in_features=width)

    actor = make_actor(env.observation_spec, env.action_spec, **features(), **actor_net)
    critic = make_value(env.observation_spec, **features(), **critic_net)
    return actor, critic, None
