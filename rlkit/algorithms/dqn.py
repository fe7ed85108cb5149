"""DQN (Mnih et al. 2015): networks, learner and :func:`train`, what ``recipes/dqn.py`` runs.

The config (:class:`DQNConfig`), its presets and the algorithm box that ``--help`` shows live
in the torch-free :mod:`rlkit.configs.dqn`; the exploration schedule is
:class:`rlkit.training.schedules.EpsilonSchedule`.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import torch
from tensordict import TensorDictBase
from torch import nn

from rlkit import keys
from rlkit.algorithms._parts import make_part
from rlkit.algorithms.offpolicy import (
    OffPolicyLearner,
    _check_priority_weights,
    _LastOutput,
    offpolicy_settings,
    priority_weights,
)
from rlkit.algorithms.offpolicy import offpolicy_collector as make_collector
from rlkit.configs import dqn as _config
from rlkit.configs.dqn import PRESETS, DQNConfig
from rlkit.modules import q_critic_discrete
from rlkit.modules.builders import check_mlp_observation
from rlkit.modules.composite import refuse_structured
from rlkit.modules.critics import action_kind, observation_features
from rlkit.modules.dictobs import dict_obs_encoder, resolve_obs_keys
from rlkit.modules.masks import check_mask_spec, mask_key_of
from rlkit.modules.networks import make_encoder, reinit_
from rlkit.modules.policies import GreedyQPolicy
from rlkit.objectives import DQNLoss
from rlkit.objectives.dqn import TD_ERROR
from rlkit.training import parse_config, run, schedules
from rlkit.training.engine import Context
from rlkit.training.optim import make_optimizer
from rlkit.training.update import LossGroup, update_loop


# 0. the learner -----------------------------------------------------------------------------
class DQNLearner(OffPolicyLearner):
    """DQN: epsilon-greedy collection, one Adam step of :class:`~rlkit.objectives.DQNLoss`
    per gradient step, then the target network's step (hard copy every k steps, or Polyak).

    Checkpointed modules: ``"dqn"`` (the loss: Q network and target network with its step
    counter). The evaluation policy is greedy in Q.

    Args:
        loss: a :class:`~rlkit.objectives.DQNLoss` (or subclass) over the Q network.
        optimizer: over the Q network's parameters (:func:`dqn_optimizer`).
        action_spec: the env's unbatched action spec.
        epsilon: the exploration schedule after the warm-up
            (:class:`~rlkit.training.schedules.EpsilonSchedule`: ``value(progress=, batches=)``).
        total_frames: the frame budget (the epsilon schedule's progress).
        max_grad_norm: gradient clipping norm (0 or None: off).
        priority_weights: the importance weights of prioritized replay the loss must be
            built with (``"max"`` or ``"sum"``; None: uniform replay).
        everything else: :class:`~rlkit.algorithms.offpolicy.OffPolicyLearner`'s.
    """

    def __init__(
        self,
        *,
        loss: nn.Module,
        optimizer: torch.optim.Optimizer,
        action_spec,
        epsilon,
        total_frames: int,
        max_grad_norm: float | None = None,
        priority_weights: str | None = None,
        **kwargs: Any,
    ) -> None:
        from torchrl.data import OneHot

        _check_priority_weights(priority_weights, loss)
        self.loss, self.epsilon, self.total_frames = loss, epsilon, total_frames
        one_hot = isinstance(action_spec, OneHot)
        greedy = GreedyQPolicy(loss.q_network, one_hot=one_hot, dtype=action_spec.dtype)
        self.optimizer = optimizer
        #: one group: the Q network's Adam on every ``loss_*`` term of the loss
        self.groups = [LossGroup("q", loss, self.optimizer, max_grad_norm=max_grad_norm or None)]
        self._output = _LastOutput(loss)
        super().__init__(
            algo="dqn",
            nets={"dqn": loss},
            optimizers={"optimizer": self.optimizer},
            policy=greedy,
            eval_policy=greedy,
            action_spec=action_spec,
            **kwargs,
        )

    def exploration_epsilon(self, frames: int, batches: int) -> float:
        """1 during the warm-up (with ``--warmup-with-policy``: the epsilon schedule from
        the start, as after it), then the epsilon schedule."""
        if frames < self.learning_starts and not self.warmup_with_policy:
            return 1.0
        return self.epsilon.value(progress=frames / self.total_frames, batches=batches)

    def train_step(self, sample: TensorDictBase, ctx: Context) -> dict[str, Any]:
        info = update_loop(self.groups, sample, ctx)
        self.loss.update_target()
        return info | {TD_ERROR: self._output.td_error()}


def dqn_optimizer(cfg: DQNConfig, params) -> torch.optim.Optimizer:
    """``--optimizer`` at ``--lr``: Adam (``--adam-eps``), or the centered RMSprop of Mnih
    et al. (2015) and MinAtar's dqn.py (squared-gradient momentum 0.95, gradient momentum
    0.95, minimum squared gradient 0.01, as torch's ``alpha``, ``momentum`` and ``eps``)."""
    if cfg.optimizer == "rmsprop":
        return make_optimizer(
            "rmsprop", params, lr=cfg.lr, eps=0.01, alpha=0.95, momentum=0.95, centered=True
        )
    return make_optimizer("adam", params, lr=cfg.lr, eps=cfg.adam_eps)


def q_network(
    env,
    *,
    hidden: tuple[int, ...],
    activation: str,
    encoder: str = "mlp",
    feature_dim: int | None = None,
    init: str = "orthogonal",
    obs_keys: Sequence[str] | None = None,
) -> nn.Module:
    """``Q(s, .)``: ``encoder`` (:func:`~rlkit.modules.networks.make_encoder`; ``mlp``: none)
    -> ``hidden`` layers -> one output per action, reading ``keys.OBSERVATION`` and writing
    ``keys.ACTION_VALUE``. ``init="torch"``: PyTorch's default initialisation of every linear
    and conv layer (SB3's, CleanRL's and MinAtar's DQN) instead of the orthogonal one.
    An env with an action mask (:data:`rlkit.keys.ACTION_MASK`) gives a masked Q network:
    masked actions get the lowest value, so neither the greedy action nor the target's max
    is ever a masked one (``docs/actions.md``). ``obs_keys``: the entries of a Dict
    observation it reads (:func:`~rlkit.modules.dictobs.resolve_obs_keys`; None: all but the
    mask), through a :class:`~rlkit.modules.dictobs.DictObsEncoder`."""
    info = action_kind(env.action_spec, batch_shape=tuple(env.batch_size))
    mask_key = mask_key_of(env.observation_spec)
    if mask_key is not None:
        check_mask_spec(env.observation_spec, info.size, len(env.batch_size))
    entries = resolve_obs_keys(env, obs_keys)
    obs_key: Any = keys.OBSERVATION
    if entries is not None:
        backbone = dict_obs_encoder(env, entries, encoder=encoder, feature_dim=feature_dim)
        width, obs_key = backbone.out_features, list(entries)
    elif encoder == "mlp":
        check_mlp_observation(env, feature_dim)  # images or --feature-dim: the error naming the fix
        width, backbone = observation_features(env.observation_spec), None
    else:
        shape = tuple(env.observation_spec[keys.OBSERVATION].shape[len(env.batch_size) :])
        backbone, width = make_encoder(encoder, shape, feature_dim=feature_dim)
    q = q_critic_discrete(
        width,
        info.size,
        hidden=hidden,
        activation=activation,
        backbone=backbone,
        mask_key=mask_key,
        obs_key=obs_key,
    )
    return reinit_(q, init)


# 2-4. network, loss, learner ----------------------------------------------------------------
def build(cfg: DQNConfig, env, *, loss_cls=None) -> DQNLearner:
    """DQN's learner for ``cfg`` on ``env``: the Q network, the loss (with its target
    network), the learner.

    ``loss_cls`` (default :class:`~rlkit.objectives.DQNLoss`): a subclass (or
    ``functools.partial`` of one) built in its place with exactly the recipe's arguments,
    ``loss_cls(q_network, gamma=, loss_type=, double_dqn=, n_steps=, target_update=,
    target_period=, tau=, priority_weights=)``. There is no ``estimator_cls``: DQN's target
    (the n-step bootstrap from the target network) is part of its loss."""
    refuse_structured(env, "dqn (its networks take Discrete or Box actions)")
    info = action_kind(env.action_spec, batch_shape=tuple(env.batch_size))
    if info.kind == "continuous":
        raise ValueError(
            f"DQN needs a discrete action space, but {cfg.env} has continuous actions "
            f"(dimension {info.size}): Q(s, .) has one output per action. Use recipes/sac.py "
            "for continuous actions"
        )
    q = q_network(
        env,
        hidden=cfg.hidden,
        activation=cfg.activation,
        encoder=cfg.encoder,
        feature_dim=cfg.feature_dim,
        init=cfg.init,
        obs_keys=cfg.obs_keys,
    )
    loss = make_part(
        loss_cls,
        DQNLoss,
        q,
        gamma=cfg.gamma,
        loss_type=cfg.loss,
        double_dqn=cfg.double_dqn,
        n_steps=cfg.n_steps,
        target_update=cfg.target_update,
        target_period=cfg.target_update_period,
        tau=cfg.tau,
        priority_weights=priority_weights(cfg),
        where="dqn.build",
    )
    return DQNLearner(
        loss=loss,
        optimizer=dqn_optimizer(cfg, loss.q_network.parameters()),
        action_spec=env.action_spec_unbatched,
        epsilon=epsilon_schedule(cfg),
        total_frames=cfg.total_frames,
        max_grad_norm=cfg.max_grad_norm,
        priority_weights=priority_weights(cfg),
        **offpolicy_settings(cfg, env),
    )


def epsilon_schedule(cfg: DQNConfig) -> schedules.EpsilonSchedule:
    """The exploration schedule of ``--epsilon-schedule`` and its flags."""
    return schedules.EpsilonSchedule(
        kind=cfg.epsilon_schedule,
        start=cfg.epsilon_start,
        end=cfg.epsilon_end,
        fraction=cfg.exploration_fraction,
        decay=cfg.epsilon_decay,
    )


# 5. fit -------------------------------------------------------------------------------------
def train(cfg: DQNConfig, *, env=None, loss_cls=None) -> dict:
    """Train DQN under a parsed ``cfg`` (what ``recipes/dqn.py`` runs after its
    flags); returns the run summary. ``loss_cls``: as for :func:`build`."""
    build_parts = partial(build, loss_cls=loss_cls)
    return run(cfg, build_parts, algo="dqn", env=env, make_collector=make_collector)


def main(argv: list[str] | None = None) -> dict:
    """``recipes/dqn.py`` from Python: parse ``argv`` (default: the command line), then
    :func:`train`."""
    cfg = parse_config(DQNConfig, argv, presets=PRESETS, description=_config.__doc__)
    return train(cfg)
