"""SAC (Haarnoja et al. 2018): networks, learner and :func:`train`, what ``recipes/sac.py`` runs.

The config (:class:`SACConfig`), its presets and the algorithm box that ``--help`` shows live
in the torch-free :mod:`rlkit.configs.sac`.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from functools import partial
from typing import Any

import torch
from tensordict import TensorDictBase
from torch import nn

from rlkit.algorithms._parts import make_part
from rlkit.algorithms.offpolicy import (
    OffPolicyLearner,
    _check_priority_weights,
    _LastOutput,
    offpolicy_settings,
    priority_weights,
)
from rlkit.algorithms.offpolicy import offpolicy_collector as make_collector
from rlkit.configs import sac as _config
from rlkit.configs.sac import PRESETS, SACConfig, check_sac_n_steps
from rlkit.modules import make_actor, q_critic_continuous, q_critic_discrete
from rlkit.modules.builders import check_mlp_observation, image_obs_shape
from rlkit.modules.composite import refuse_structured
from rlkit.modules.critics import action_kind, make_q, observation_features
from rlkit.modules.dictobs import dict_obs_encoder, resolve_obs_keys
from rlkit.modules.networks import make_encoder
from rlkit.modules.policies import TanhActorPolicy
from rlkit.objectives import DiscreteSACLoss, SACLoss
from rlkit.objectives.dqn import TD_ERROR
from rlkit.training import parse_config, run
from rlkit.training.engine import Context
from rlkit.training.optim import make_optimizer
from rlkit.training.update import LossGroup, update_loop


# 0. the learner -----------------------------------------------------------------------------
class SACLearner(OffPolicyLearner):
    """SAC: critic step on :math:`L_Q`, target Polyak step, then (every ``policy_delay``
    gradient steps) one step of actor and temperature on :math:`L_\\pi + L_\\alpha` against
    the updated critics (SB3's order).

    Two loss groups, each a call of :func:`~rlkit.training.update.update_loop` on the sampled
    minibatch: ``"critic"`` sums every ``loss_*`` term of the loss's
    :meth:`~rlkit.objectives.SACLoss.critic_terms`, ``"actor"`` every one of its
    :meth:`~rlkit.objectives.SACLoss.actor_terms` (so a term a subclass adds to either is
    optimised). A loss that overrides ``forward`` is refused: the learner never calls it.
    ``n_steps > 1`` is refused: the soft n-step target needs the intermediate entropy terms.

    Two Adam optimisers (:func:`sac_optimizers`): ``"critic"`` (both Q networks) and
    ``"actor"`` (actor, and :math:`\\log\\alpha` as a second parameter group with its own
    rate). Checkpointed module: ``"sac"`` (the loss: actor, critics, targets,
    :math:`\\log\\alpha`). The evaluation policy is the actor's deterministic action (``tanh``
    of the mean for a TanhNormal, the most likely action for a categorical actor).

    Args:
        loss: a :class:`~rlkit.objectives.SACLoss` (or :class:`~rlkit.objectives.DiscreteSACLoss`).
        critic_optimizer, actor_optimizer: :func:`sac_optimizers` over ``loss``.
        action_spec: the env's unbatched action spec.
        policy_delay: gradient steps per actor and temperature step.
        max_grad_norm: gradient clipping norm of both groups (0 or None: off).
        priority_weights: the importance weights of prioritized replay the loss must be
            built with (``"max"`` or ``"sum"``; None: uniform replay).
        everything else: :class:`~rlkit.algorithms.offpolicy.OffPolicyLearner`'s.
    """

    def __init__(
        self,
        *,
        loss: nn.Module,
        critic_optimizer: torch.optim.Optimizer,
        actor_optimizer: torch.optim.Optimizer,
        action_spec,
        policy_delay: int = 1,
        max_grad_norm: float | None = None,
        priority_weights: str | None = None,
        **kwargs: Any,
    ) -> None:
        if isinstance(policy_delay, bool) or not isinstance(policy_delay, int) or policy_delay < 1:
            raise ValueError(f"--policy-delay must be an int >= 1, got {policy_delay!r}")
        check_sac_n_steps(max(kwargs.get("n_steps", 1), getattr(loss, "n_steps", 1)))
        _check_sac_forward(loss)
        _check_priority_weights(priority_weights, loss)
        self.loss, self.policy_delay = loss, policy_delay
        self.critic_optimizer, self.actor_optimizer = critic_optimizer, actor_optimizer
        clip = max_grad_norm or None
        self.critic_group = LossGroup(
            "critic",
            loss.critic_view(),
            self.critic_optimizer,
            max_grad_norm=clip,
            grad_name="grad_norm_critic",
        )
        self.actor_group = LossGroup(
            "actor",
            loss.actor_view(),
            self.actor_optimizer,
            max_grad_norm=clip,
            grad_name="grad_norm_actor",
        )
        self._critic_output = _LastOutput(self.critic_group.loss)
        try:
            policy = TanhActorPolicy(loss.actor)
        except TypeError:  # categorical or custom actors run as they are
            policy = loss.actor
        super().__init__(
            algo="sac",
            nets={"sac": loss},
            optimizers={"critic": self.critic_optimizer, "actor": self.actor_optimizer},
            policy=policy,
            eval_policy=policy,
            action_spec=action_spec,
            **kwargs,
        )

    def train_step(self, sample: TensorDictBase, ctx: Context) -> dict[str, Any]:
        info: dict[str, Any] = update_loop([self.critic_group], sample, ctx)
        td_error = self._critic_output.td_error()
        self.loss.update_target()
        if self.gradient_steps % self.policy_delay == 0:
            info |= update_loop([self.actor_group], sample, ctx)
            info["alpha"] = self.loss.alpha  # after the temperature's step
        return info | {TD_ERROR: td_error}


def sac_optimizers(
    loss: nn.Module,
    *,
    lr: float,
    eps: float,
    actor_lr: float | None = None,
    alpha_lr: float | None = None,
) -> tuple[torch.optim.Optimizer, torch.optim.Optimizer]:
    """``(critic, actor)``: Adam at ``lr`` over ``loss.critic_parameters()``, and Adam over
    the actor at ``actor_lr`` (else ``lr``) with :math:`\\log\\alpha` (when learned) as a second
    parameter group at ``alpha_lr`` (else ``lr``)."""
    critic = make_optimizer("adam", loss.critic_parameters(), lr=lr, eps=eps)
    groups = [{"params": list(loss.actor.parameters()), "lr": actor_lr or lr}]
    if loss.learn_alpha:
        groups.append({"params": [loss.log_alpha], "lr": alpha_lr or lr})
    return critic, make_optimizer("adam", groups, lr=lr, eps=eps)


def _check_sac_forward(loss: nn.Module) -> None:
    from rlkit.objectives.sac import _SACBase

    overridden = inspect.unwrap(type(loss).forward) is not inspect.unwrap(_SACBase.forward)
    if isinstance(loss, _SACBase) and overridden:
        raise TypeError(
            f"{type(loss).__name__} overrides forward, which SACLearner never calls: it steps "
            "the critics on loss.critic_terms(td), then actor and temperature on "
            "loss.actor_terms(td) against the updated critics. Add a loss_* term by "
            "overriding critic_terms or actor_terms instead"
        )


# 2-4. networks, loss, learner ---------------------------------------------------------------
def sac_networks(
    env,
    *,
    hidden: tuple[int, ...],
    activation: str,
    encoder: str = "mlp",
    feature_dim: int | None = None,
    obs_keys: Sequence[str] | None = None,
) -> tuple[nn.Module, nn.Module, nn.Module]:
    """``(actor, q1, q2)``: a tanh-Gaussian actor and twin ``Q(s, a)`` critics for continuous
    actions, a categorical actor and twin ``Q(s, .)`` critics for discrete ones. ``encoder``
    (:func:`~rlkit.modules.networks.make_encoder`): ``mlp``, or for discrete actions an image
    encoder that each of the three networks gets its own of, before its ``hidden`` layers.
    ``obs_keys``: a Dict observation's entries (None: all but the mask), each network through
    its own :class:`~rlkit.modules.dictobs.DictObsEncoder`."""
    info = action_kind(env.action_spec, batch_shape=tuple(env.batch_size))
    net = dict(hidden=hidden, activation=activation)
    entries = resolve_obs_keys(env, obs_keys)
    if entries is not None:

        def entry_features() -> dict:
            enc = dict_obs_encoder(env, entries, encoder=encoder, feature_dim=feature_dim)
            return dict(backbone=enc, in_features=enc.out_features, obs_key=list(entries))

        tanh = info.kind == "continuous"
        actor = make_actor(
            env.observation_spec, env.action_spec, tanh=tanh, **entry_features(), **net
        )
        q1, q2 = (
            make_q(env.observation_spec, env.action_spec, **entry_features(), **net)
            for _ in range(2)
        )
        return actor, q1, q2
    if encoder != "mlp":
        if info.kind == "continuous":
            raise ValueError(
                f"--encoder {encoder}: SAC takes an image encoder for discrete actions only, "
                f"and this env's actions are continuous (dimension {info.size}): use "
                "--encoder mlp on vector observations, or recipes/ppo.py (or another "
                "on-policy recipe) for pixels with continuous actions"
            )
        shape = image_obs_shape(env, encoder)

        def features() -> dict:
            enc, width = make_encoder(encoder, shape, feature_dim=feature_dim)
            return dict(backbone=enc, in_features=width)

        actor = make_actor(env.observation_spec, env.action_spec, **features(), **net)
        q1, q2 = (
            make_q(env.observation_spec, env.action_spec, **features(), **net) for _ in range(2)
        )
        return actor, q1, q2
    check_mlp_observation(env, feature_dim)
    width = observation_features(env.observation_spec)
    if info.kind == "continuous":
        actor = make_actor(env.observation_spec, env.action_spec, tanh=True, **net)
        q1, q2 = (q_critic_continuous(width, info.size, **net) for _ in range(2))
    else:
        actor = make_actor(env.observation_spec, env.action_spec, **net)
        q1, q2 = (q_critic_discrete(width, info.size, **net) for _ in range(2))
    return actor, q1, q2


def build(cfg: SACConfig, env, *, loss_cls=None) -> SACLearner:
    """SAC's learner for ``cfg`` on ``env``: actor and twin critics, the loss (with its
    targets and temperature), the learner.

    ``loss_cls`` (default :class:`~rlkit.objectives.SACLoss` for continuous actions,
    :class:`~rlkit.objectives.DiscreteSACLoss` for discrete ones): a subclass of that class
    (or ``functools.partial`` of one) built in its place with exactly the recipe's
    arguments, ``loss_cls(actor, q1, q2, gamma=, tau=, target_period=, alpha_init=,
    learn_alpha=, target_entropy=, n_steps=, priority_weights=)``; add a term by overriding
    ``critic_terms`` or ``actor_terms`` (:class:`SACLearner`). There is no
    ``estimator_cls``: SAC's soft target is part of its loss."""
    refuse_structured(env, "sac (its networks take Discrete or Box actions)")
    info = action_kind(env.action_spec, batch_shape=tuple(env.batch_size))
    actor, q1, q2 = sac_networks(
        env,
        hidden=cfg.hidden,
        activation=cfg.activation,
        encoder=cfg.encoder,
        feature_dim=cfg.feature_dim,
        obs_keys=cfg.obs_keys,
    )
    loss_class = SACLoss if info.kind == "continuous" else DiscreteSACLoss
    loss = make_part(
        loss_cls,
        loss_class,
        actor,
        q1,
        q2,
        gamma=cfg.gamma,
        tau=cfg.tau,
        target_period=cfg.target_update_period,
        alpha_init=cfg.alpha_init,
        learn_alpha=cfg.learn_alpha,
        target_entropy=cfg.target_entropy,
        n_steps=cfg.n_steps,
        priority_weights=priority_weights(cfg),
        where=f"sac.build ({info.kind} actions)",
    )
    critic_optimizer, actor_optimizer = sac_optimizers(
        loss, lr=cfg.lr, eps=cfg.adam_eps, actor_lr=cfg.actor_lr, alpha_lr=cfg.alpha_lr
    )
    return SACLearner(
        loss=loss,
        critic_optimizer=critic_optimizer,
        actor_optimizer=actor_optimizer,
        action_spec=env.action_spec_unbatched,
        policy_delay=cfg.policy_delay,
        max_grad_norm=cfg.max_grad_norm,
        priority_weights=priority_weights(cfg),
        **offpolicy_settings(cfg, env),
    )


# 5. fit -------------------------------------------------------------------------------------
def train(cfg: SACConfig, *, env=None, loss_cls=None) -> dict:
    """Train SAC under a parsed ``cfg`` (what ``recipes/sac.py`` runs after its
    flags); returns the run summary. ``loss_cls``: as for :func:`build`."""
    build_parts = partial(build, loss_cls=loss_cls)
    return run(cfg, build_parts, algo="sac", env=env, make_collector=make_collector)


def main(argv: list[str] | None = None) -> dict:
    """``recipes/sac.py`` from Python: parse ``argv`` (default: the command line), then
    :func:`train`."""
    cfg = parse_config(SACConfig, argv, presets=PRESETS, description=_config.__doc__)
    return train(cfg)
