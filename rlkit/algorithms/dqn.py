"""DQN (Mnih et al. 2015): networks, learner and :func:`train`, what ``recipes/dqn.py`` runs.

The config (:class:`DQNConfig`), its presets and the algorithm box that ``--help`` shows live
in the torch-free :mod:`rlkit.configs.dqn`; the exploration schedule is
:class:`rlkit.training.schedules.EpsilonSchedule`.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from tensordict import TensorDictBase
from torch import nn

from rlkit import keys
from rlkit.algorithms._parts import make_part
from rlkit.algorithms.offpolicy import (
    OffPolicyConfig,
    OffPolicyLearner,
    _adam,
    _check_priority_weights,
    _LastOutput,
)
from rlkit.algorithms.offpolicy import offpolicy_collector as make_collector
from rlkit.configs import dqn as _config
from rlkit.configs.dqn import PRESETS, DQNConfig
from rlkit.modules import q_critic_discrete
from rlkit.modules.builders import check_mlp_observation
from rlkit.modules.critics import action_kind, observation_features
from rlkit.modules.networks import make_encoder, reinit_
from rlkit.modules.policies import GreedyQPolicy
from rlkit.objectives import DQNLoss
from rlkit.objectives.dqn import TD_ERROR
from rlkit.training import parse_config, run, schedules
from rlkit.training.engine import Context
from rlkit.training.update import LossGroup, update_loop


# 0. the learner -----------------------------------------------------------------------------
class DQNLearner(OffPolicyLearner):
    """DQN: epsilon-greedy collection, one Adam step of :class:`~rlkit.objectives.DQNLoss`
    per gradient step, then the target network's step (hard copy every k steps, or Polyak).

    Checkpointed modules: ``"dqn"`` (the loss: Q network and target network with its step
    counter). The evaluation policy is greedy in Q.
    """

    def __init__(self, *, cfg: OffPolicyConfig, loss: nn.Module, action_spec, epsilon) -> None:
        from torchrl.data import OneHot

        _check_priority_weights(cfg, loss)
        self.loss, self.epsilon = loss, epsilon
        one_hot = isinstance(action_spec, OneHot)
        greedy = GreedyQPolicy(loss.q_network, one_hot=one_hot, dtype=action_spec.dtype)
        self.optimizer = _optimizer(loss.q_network.parameters(), cfg)
        #: one group: the Q network's Adam on every ``loss_*`` term of the loss
        self.groups = [
            LossGroup("q", loss, self.optimizer, max_grad_norm=cfg.max_grad_norm or None)
        ]
        self._output = _LastOutput(loss)
        super().__init__(
            algo="dqn",
            cfg=cfg,
            nets={"dqn": loss},
            optimizers={"optimizer": self.optimizer},
            policy=greedy,
            eval_policy=greedy,
            action_spec=action_spec,
        )

    def exploration_epsilon(self, frames: int, batches: int) -> float:
        """1 during the warm-up (with ``--warmup-with-policy``: the epsilon schedule from
        the start, as after it), then the epsilon schedule."""
        if frames < self.cfg.learning_starts and not self.cfg.warmup_with_policy:
            return 1.0
        return self.epsilon.value(progress=frames / self.cfg.total_frames, batches=batches)

    def train_step(self, sample: TensorDictBase, ctx: Context) -> dict[str, Any]:
        info = update_loop(self.groups, sample, ctx)
        self.loss.update_target()
        return info | {TD_ERROR: self._output.td_error()}


def _optimizer(params, cfg: OffPolicyConfig) -> torch.optim.Optimizer:
    """``--optimizer``: Adam (``--adam-eps``), or the centered RMSprop of Mnih et al. (2015)
    and MinAtar's dqn.py (squared-gradient momentum 0.95, gradient momentum 0.95, minimum
    squared gradient 0.01, as torch's ``alpha``, ``momentum`` and ``eps``)."""
    if getattr(cfg, "optimizer", "adam") == "rmsprop":
        return torch.optim.RMSprop(
            params, lr=cfg.lr, alpha=0.95, eps=0.01, momentum=0.95, centered=True
        )
    return _adam(params, cfg)


def q_network(
    env,
    *,
    hidden: tuple[int, ...],
    activation: str,
    encoder: str = "mlp",
    feature_dim: int | None = None,
    init: str = "orthogonal",
) -> nn.Module:
    """``Q(s, .)``: ``encoder`` (:func:`~rlkit.modules.networks.make_encoder`; ``mlp``: none)
    -> ``hidden`` layers -> one output per action, reading ``keys.OBSERVATION`` and writing
    ``keys.ACTION_VALUE``. ``init="torch"``: PyTorch's default initialisation of every linear
    and conv layer (SB3's, CleanRL's and MinAtar's DQN) instead of the orthogonal one."""
    info = action_kind(env.action_spec, batch_shape=tuple(env.batch_size))
    if encoder == "mlp":
        check_mlp_observation(env, feature_dim)  # images or --feature-dim: the error naming the fix
        width, backbone = observation_features(env.observation_spec), None
    else:
        shape = tuple(env.observation_spec[keys.OBSERVATION].shape[len(env.batch_size) :])
        backbone, width = make_encoder(encoder, shape, feature_dim=feature_dim)
    q = q_critic_discrete(width, info.size, hidden=hidden, activation=activation, backbone=backbone)
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
        priority_weights=cfg.priority_weight_norm if cfg.prioritized else None,
        where="dqn.build",
    )
    return DQNLearner(
        cfg=cfg,
        loss=loss,
        action_spec=env.action_spec_unbatched,
        epsilon=epsilon_schedule(cfg),
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
