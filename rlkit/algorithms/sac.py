"""SAC: soft actor-critic (Haarnoja et al. 2018), continuous or discrete actions.

    python recipes/sac.py                                  # Pendulum-v1, SB3's defaults
    python recipes/sac.py --target-return -200 --seed 3    # stop once solved
    python recipes/sac.py --env CartPole-v1                # discrete SAC (Christodoulou 2019)
    python recipes/sac.py --policy-delay 2 --prioritized
    python recipes/sac.py --help                           # every flag

Algorithm box:
    1. config      SACConfig (defaults, per-env preset, --config YAML, flags)
    2. networks    tanh-Gaussian actor pi(a|s) (categorical for discrete actions),
                   twin critics Q1, Q2 and their Polyak-averaged targets
    3. loss        soft TD regression of both Qs on min(Q1', Q2') - alpha log pi,
                   actor on alpha log pi - min(Q1, Q2), temperature towards a target entropy
    4. learner     replay buffer, uniform random fill, utd_ratio gradient steps per frame,
                   critic step then (every policy_delay steps) actor and alpha step
    5. fit         the engine: collect, update, evaluate (deterministic), checkpoint
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

from tensordict import TensorDictBase
from torch import nn

from rlkit.algorithms.offpolicy import (
    OffPolicyConfig,
    OffPolicyLearner,
    _adam,
    _check_priority_weights,
    _LastOutput,
)
from rlkit.algorithms.offpolicy import offpolicy_collector as make_collector
from rlkit.modules import make_actor, q_critic_continuous, q_critic_discrete
from rlkit.modules.critics import action_kind, observation_features
from rlkit.modules.policies import TanhActorPolicy
from rlkit.objectives import DiscreteSACLoss, SACLoss
from rlkit.objectives.dqn import TD_ERROR
from rlkit.training import parse_config, run
from rlkit.training.config import positive
from rlkit.training.engine import Context
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

    Two Adam optimisers: ``"critic"`` (both Q networks) and ``"actor"`` (actor, and
    :math:`\\log\\alpha` as a second parameter group with ``alpha_lr``). Checkpointed module:
    ``"sac"`` (the loss: actor, critics, targets, :math:`\\log\\alpha`). The evaluation policy
    is the actor's deterministic action (``tanh`` of the mean for a TanhNormal, the most
    likely action for a categorical actor).
    """

    def __init__(
        self,
        *,
        cfg: OffPolicyConfig,
        loss: nn.Module,
        action_spec,
        policy_delay: int = 1,
        actor_lr: float | None = None,
        alpha_lr: float | None = None,
    ) -> None:
        if isinstance(policy_delay, bool) or not isinstance(policy_delay, int) or policy_delay < 1:
            raise ValueError(f"--policy-delay must be an int >= 1, got {policy_delay!r}")
        check_sac_n_steps(max(cfg.n_steps, getattr(loss, "n_steps", 1)))
        _check_sac_forward(loss)
        _check_priority_weights(cfg, loss)
        self.loss, self.policy_delay = loss, policy_delay
        self.critic_optimizer = _adam(loss.critic_parameters(), cfg)
        groups = [{"params": list(loss.actor.parameters()), "lr": actor_lr or cfg.lr}]
        if loss.learn_alpha:
            groups.append({"params": [loss.log_alpha], "lr": alpha_lr or cfg.lr})
        self.actor_optimizer = _adam(groups, cfg)
        clip = cfg.max_grad_norm or None
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
            cfg=cfg,
            nets={"sac": loss},
            optimizers={"critic": self.critic_optimizer, "actor": self.actor_optimizer},
            policy=policy,
            eval_policy=policy,
            action_spec=action_spec,
        )

    def train_step(self, sample: TensorDictBase, ctx: Context) -> dict[str, Any]:
        info: dict[str, Any] = update_loop([self.critic_group], sample, ctx)
        td_error = self._critic_output.td_error()
        self.loss.update_target()
        if self.gradient_steps % self.policy_delay == 0:
            info |= update_loop([self.actor_group], sample, ctx)
            info["alpha"] = self.loss.alpha  # after the temperature's step
        return info | {TD_ERROR: td_error}


def check_sac_n_steps(n_steps: int) -> None:
    """SAC trains on one-step soft targets only (refuses ``--n-steps > 1``)."""
    if n_steps > 1:
        raise ValueError(
            f"--n-steps {n_steps}: SAC trains on one-step soft targets only (an n-step soft "
            "target needs the entropy terms of the intermediate steps, which the replay does "
            "not hold); use --n-steps 1"
        )


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


# 1. config ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class SACConfig(OffPolicyConfig):
    """Train SAC. Defaults are SB3's SAC with rl-zoo3's Pendulum-v1 learning rate."""

    env: str = "Pendulum-v1"
    total_frames: int = field(default=20_000, metadata={"help": "frames to train for"})
    eval_every: int = field(default=1000, metadata={"help": "evaluate every this many frames"})
    batch_size: int = field(
        default=128, metadata={"help": "transitions per gradient step (SB3's default: 256)"}
    )
    lr: float = field(default=1e-3, metadata={"help": "critic learning rate"})
    actor_lr: float | None = field(default=None, metadata={"help": "actor lr (none: --lr)"})
    alpha_lr: float | None = field(default=None, metadata={"help": "temperature lr (none: --lr)"})
    tau: float = field(default=0.005, metadata={"help": "Polyak weight of the target update"})
    target_update_period: int = field(
        default=1, metadata={"help": "gradient steps between target updates"}
    )
    alpha_init: float = field(default=1.0, metadata={"help": "initial temperature alpha"})
    learn_alpha: bool = field(default=True, metadata={"help": "learn the temperature"})
    target_entropy: float | None = field(
        default=None,
        metadata={"help": "target entropy (none: -action_dim, or 0.98 log n when discrete)"},
    )
    policy_delay: int = field(
        default=1, metadata={"help": "gradient steps per actor/temperature step"}
    )
    log_every: int = field(default=500, metadata={"help": "write metrics every this many batches"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.tau <= 1:
            raise ValueError(f"--tau must be in (0, 1], got {self.tau}")
        if self.target_update_period < 1:
            raise ValueError(
                f"--target-update-period must be >= 1, got {self.target_update_period}"
            )
        if self.policy_delay < 1:
            raise ValueError(f"--policy-delay must be >= 1, got {self.policy_delay}")
        if self.alpha_init <= 0:
            raise ValueError(f"--alpha-init must be > 0, got {self.alpha_init}")
        positive(self, "actor_lr", "alpha_lr")  # 0 would silently mean --lr
        check_sac_n_steps(self.n_steps)


#: Settings that override the defaults for an environment (flags and --config still win).
PRESETS: dict[str, dict] = {
    "CartPole-v1": dict(total_frames=100_000, eval_every=5000, learning_starts=1000),
}


# 2-4. networks, loss, learner ---------------------------------------------------------------
def build(cfg: SACConfig, env) -> SACLearner:
    info = action_kind(env.action_spec, batch_shape=tuple(env.batch_size))
    width = observation_features(env.observation_spec)
    net = dict(hidden=cfg.hidden, activation=cfg.activation)
    if info.kind == "continuous":
        actor = make_actor(env.observation_spec, env.action_spec, tanh=True, **net)
        q1, q2 = (q_critic_continuous(width, info.size, **net) for _ in range(2))
        loss_class = SACLoss
    else:
        actor = make_actor(env.observation_spec, env.action_spec, **net)
        q1, q2 = (q_critic_discrete(width, info.size, **net) for _ in range(2))
        loss_class = DiscreteSACLoss
    loss = loss_class(
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
        priority_weights=cfg.priority_weight_norm if cfg.prioritized else None,
    )
    return SACLearner(
        cfg=cfg,
        loss=loss,
        action_spec=env.action_spec_unbatched,
        policy_delay=cfg.policy_delay,
        actor_lr=cfg.actor_lr,
        alpha_lr=cfg.alpha_lr,
    )


# 5. fit -------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> dict:
    cfg = parse_config(SACConfig, argv, presets=PRESETS, description=__doc__)
    return run(cfg, build, algo="sac", make_collector=make_collector)
