"""On-policy learners: a value estimator, then epochs x minibatches of a loss.

PPO, A2C and their relatives share this update; they differ in the loss module and in
defaults. The algorithm's maths lives in the loss and the estimator; this file only orders
the steps, applies schedules and averages diagnostics.

The learner takes explicit arguments (the optimiser, the
:class:`~rlkit.training.schedules.LRSchedule`, epochs, minibatch size, ...), never a config:
the recipes' ``build`` functions read the config, through the helpers at the end of this file
(:func:`policy_gradient_settings`, :func:`policy_optimizer`,
:func:`attach_intrinsic_from_config`).

The configs (:class:`PolicyGradientConfig`, :class:`OnPolicyConfig`, :class:`ClipConfig`)
and :data:`OPTIMIZERS` live in the torch-free :mod:`rlkit.configs.onpolicy`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from tensordict import TensorDictBase
from torch import nn

from rlkit import keys
from rlkit.algorithms._settings import config_lr_schedule, config_optimizer
from rlkit.algorithms.memory import Memory
from rlkit.configs.onpolicy import MEMORY_RECIPES, OnPolicyConfig, PolicyGradientConfig
from rlkit.data.minibatch import minibatch_indices
from rlkit.modules.builders import actor_critic_networks, gaussian_kwargs
from rlkit.modules.dictobs import PackedObsView, obs_entries, pack_entries, resolve_obs_keys
from rlkit.modules.recurrent import recurrent_actor_critic
from rlkit.objectives.functional import explained_variance
from rlkit.objectives.intrinsic import IntrinsicReward, make_intrinsic
from rlkit.training import schedules
from rlkit.training.engine import Context, Learner
from rlkit.training.optim import make_like, unique_parameters
from rlkit.training.schedules import LRSchedule
from rlkit.training.update import LossContractError, LossGroup, update_loop
from rlkit.value.functional import continuing_next_value, non_episodic_gae
from rlkit.value.standardizer import RunningStandardizer


class PolicyGradientLearner(Learner):
    """Estimator, then ``epochs`` x minibatches of ``loss``; schedules applied per batch.

    Args:
        algo: the algorithm's name (written in checkpoints and summaries).
        actor: the policy (a TorchRL ``ProbabilisticActor`` writing ``action_log_prob``).
        critic: the V network writing ``state_value``.
        estimator: writes ``advantage`` and ``value_target`` (e.g. ``rlkit.value.GAE``).
        loss: returns ``loss_*`` terms.
        optimizer: over the parameters of actor and critic (each once), e.g.
            :func:`rlkit.training.optim.make_optimizer`.
        frames_per_batch: frames of one collected batch on this rank (``N T``).
        epochs: passes over each batch.
        minibatch_size: samples per gradient step; None: the whole batch.
        max_grad_norm: gradient clipping norm (0 or None: off).
        target_kl: stop a batch's epochs at the first minibatch whose ``approx_kl`` exceeds
            1.5 x this (:class:`~rlkit.training.update.LossGroup`); None: every epoch runs.
        lr_schedule: the learning rate (:class:`~rlkit.training.schedules.LRSchedule`);
            None: constant at the optimiser's rate.
        obs_norm: running observation statistics inside the networks, updated after each
            batch's gradient steps (so a batch is scored with the statistics it was
            collected with), merged across ranks.
        loss_schedules: loss attributes annealed linearly over the frame budget,
            ``{"clip_epsilon": (0.2, 0.0), "entropy_coef": (0.01, 0.0)}``.
        running_advantage_norm: standardise each batch's advantages with running
            statistics (:class:`~rlkit.value.standardizer.RunningStandardizer`, checkpointed).
        min_episodes, min_steps: a batch holds at least this many finished episodes and
            frames per rank (more chunks collected until it does; :class:`Learner`).
        sequence_length: with a recurrent actor or critic (:mod:`rlkit.modules.recurrent`),
            train on sequences of this many steps (cut from each env's row of the batch;
            None: whole rows); ``minibatch_size`` counts frames and must be a multiple of
            it. Ignored without memory.
    """

    def __init__(
        self,
        *,
        algo: str,
        actor: nn.Module,
        critic: nn.Module,
        estimator: nn.Module | None,
        loss: nn.Module,
        optimizer: torch.optim.Optimizer,
        frames_per_batch: int,
        epochs: int,
        minibatch_size: int | None = None,
        max_grad_norm: float | None = None,
        target_kl: float | None = None,
        lr_schedule: LRSchedule | None = None,
        obs_norm: nn.Module | None = None,
        loss_schedules: Mapping[str, tuple[float, float]] | None = None,
        running_advantage_norm: bool = False,
        min_episodes: int | None = None,
        min_steps: int | None = None,
        sequence_length: int | None = None,
    ) -> None:
        self.algo = algo
        self.memory = Memory(actor, critic, sequence_length, minibatch_size)
        self.min_episodes, self.min_steps = min_episodes, min_steps
        self.loss_schedules = dict(loss_schedules or {})
        check_schedules(loss, self.loss_schedules)
        self.actor, self.critic, self.estimator, self.loss = actor, critic, estimator, loss
        self.obs_norm = obs_norm
        self.nets = nn.ModuleDict({"actor": actor, "critic": critic})
        if obs_norm is not None:
            self.nets["obs_norm"] = obs_norm
        self.adv_norm = self._running_advantage_norm(running_advantage_norm)
        self.optimizer = optimizer
        if lr_schedule is None:
            lr_schedule = LRSchedule("constant", float(optimizer.param_groups[0]["lr"]))
        self.lr_schedule = lr_schedule
        self._frames_per_batch = frames_per_batch
        self.epochs, self.minibatch_size = epochs, minibatch_size
        self.max_grad_norm, self.target_kl = max_grad_norm, target_kl

    #: whether :meth:`update` standardises with ``--running-advantage-norm``; ``None``: when
    #: the learner keeps the shared :meth:`update` (a subclass whose update calls it sets True)
    supports_running_advantage_norm: bool | None = None

    def _running_advantage_norm(self, wanted: bool) -> RunningStandardizer | None:
        """The running advantage standardiser of ``--running-advantage-norm`` (a module, so
        checkpoints keep its statistics), or None."""
        if not wanted:
            return None
        supported = self.supports_running_advantage_norm
        if supported is None:
            supported = type(self).update is PolicyGradientLearner.update
        if not supported:
            raise ValueError(
                f"--running-advantage-norm is not supported by {self.algo}, whose update "
                "standardises its advantages its own way: drop the flag (ppo, a2c, appo and "
                "rnd support it)"
            )
        norm = RunningStandardizer()
        self.nets["adv_norm"] = norm
        return norm

    # ---------------------------------------------------------------- intrinsic reward
    #: the attached intrinsic reward (:meth:`attach_intrinsic`), or None
    intrinsic: IntrinsicReward | None = None
    #: a Dict observation's entries the intrinsic reward reads, packed into one vector under
    #: ``keys.OBSERVATION`` / ``keys.NEXT_OBSERVATION`` (``rlkit.modules.dictobs.pack_entries``)
    intrinsic_entries: list | None = None

    def attach_intrinsic(
        self,
        bonus: IntrinsicReward,
        *,
        int_coef: float,
        ext_coef: float = 1.0,
        lr: float | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        lmbda: float | None = None,
    ) -> None:
        """Learn from the advantage ``ext_coef * A_ext + int_coef * A_int``, as RND-PPO's
        two streams: the learner's estimator and critic see the extrinsic reward only;
        ``bonus`` (:class:`~rlkit.objectives.intrinsic.IntrinsicReward`) writes the
        intrinsic reward, and its own critic's non-episodic GAE gives ``A_int``
        (:meth:`intrinsic_advantage`). The bonus's loss (its own terms and its critic's
        regression) trains its parameters with an optimiser of its own
        (``intrinsic_optimizer``: ``optimizer``, or one like the policy's at ``lr``, else at
        the policy's rate; on the same schedule, in proportion to its initial rate), as a
        group in lockstep with the policy's first phase. ``ext_coef=0`` is pretraining: the
        policy learns from the intrinsic stream alone (the extrinsic critic still trains).
        ``lmbda``: the intrinsic GAE's lambda; None: the estimator's (``estimator.lmbda``)."""
        if int_coef < 0 or ext_coef < 0 or int_coef == ext_coef == 0:
            raise ValueError(
                f"attach_intrinsic: int_coef and ext_coef must be >= 0, not both 0, got "
                f"{int_coef} and {ext_coef}"
            )
        if lmbda is None:
            lmbda = getattr(self.estimator, "lmbda", None)
            if lmbda is None:
                raise ValueError(
                    f"attach_intrinsic: the estimator {type(self.estimator).__name__} has no "
                    "lmbda for the intrinsic stream's GAE: pass lmbda="
                )
        if optimizer is None:
            params = [p for p in bonus.parameters() if p.requires_grad]
            optimizer = make_like(self.optimizer, params, lr=lr or self.lr_schedule.lr)
        self.intrinsic = bonus
        self.int_coef, self.ext_coef = float(int_coef), float(ext_coef)
        self.intrinsic_lmbda = float(lmbda)
        self.intrinsic_optimizer = optimizer
        #: the intrinsic optimiser's rate at the schedule's start (it follows in proportion)
        self.intrinsic_lr = float(optimizer.param_groups[0]["lr"])

    def intrinsic_groups(self) -> list[LossGroup]:
        """The intrinsic reward's loss group (none without :meth:`attach_intrinsic`)."""
        if self.intrinsic is None:
            return []
        if not hasattr(self, "_intrinsic_groups"):
            self._intrinsic_groups = [
                LossGroup(
                    "intrinsic",
                    self.intrinsic.loss,
                    self.intrinsic_optimizer,
                    epochs=self.epochs,
                    max_grad_norm=self.max_grad_norm,
                    grad_name="intrinsic_grad_norm",
                )
            ]
        return self._intrinsic_groups

    @torch.no_grad()
    def intrinsic_advantage(self, batch: TensorDictBase, ctx: Context) -> dict[str, float]:
        """After the estimator: the intrinsic stream of ``batch`` (nothing without an
        intrinsic reward). Writes ``keys.INTRINSIC_REWARD`` (the bonus's, its statistics
        updated first), the non-episodic GAE of the bonus's critic (``gamma_int``, the
        estimator's lambda) as ``keys.INTRINSIC_ADVANTAGE`` and
        ``keys.INTRINSIC_VALUE_TARGET``, and replaces ``keys.ADVANTAGE`` with
        ``ext_coef * A_ext + int_coef * A_int``; returns the stream's metrics."""
        bonus = self.intrinsic
        if bonus is None:
            return {}
        bonus.loss.generator = ctx.generator  # RND's predictor mask, from the run's stream
        time_first = (
            keys.TIME_DIM_NAME in batch.names and batch.names.index(keys.TIME_DIM_NAME) == 0
        )

        def env_major(x: torch.Tensor) -> torch.Tensor:  # [N, T, ...] (and back)
            return x.transpose(0, 1) if time_first else x

        if self.intrinsic_entries is not None:  # the bonus's networks read one flat vector
            batch.set(keys.OBSERVATION, pack_entries(batch, self.intrinsic_entries))
            nxt = pack_entries(batch, self.intrinsic_entries, next_=True)
            batch.set(keys.NEXT_OBSERVATION, nxt)
        obs = env_major(batch.get(keys.OBSERVATION))
        next_obs = env_major(batch.get(keys.NEXT_OBSERVATION))
        reward = bonus.intrinsic_reward(
            obs, env_major(batch.get(keys.ACTION)), next_obs, all_gather=ctx.all_gather
        )  # [N, T, 1]
        value = bonus.value(obs)
        next_value = continuing_next_value(value, bonus.value(next_obs[:, -1:]))
        advantage, target = non_episodic_gae(
            reward,
            value,
            next_value,
            gamma=bonus.return_scaler.gamma,
            lmbda=self.intrinsic_lmbda,
        )
        extrinsic = batch.get(keys.ADVANTAGE)
        intrinsic = env_major(advantage).reshape(extrinsic.shape).to(extrinsic)
        batch.set(keys.INTRINSIC_REWARD, env_major(reward).reshape(batch.get(keys.REWARD).shape))
        batch.set(keys.INTRINSIC_ADVANTAGE, intrinsic)
        batch.set(keys.INTRINSIC_VALUE_TARGET, env_major(target).reshape(extrinsic.shape))
        batch.set(keys.ADVANTAGE, self.ext_coef * extrinsic + self.int_coef * intrinsic)
        return {
            "intrinsic_reward_mean": float(reward.mean()),
            "intrinsic_reward_max": float(reward.max()),
            "intrinsic_return_std": float(bonus.return_scaler.stats.std),
            "intrinsic_advantage_std": float(advantage.std()),
            "intrinsic_explained_variance": float(explained_variance(value, target)),
        }

    # ---------------------------------------------------------------- Learner interface
    def modules(self) -> dict[str, nn.Module]:
        out = dict(self.nets.items())
        if self.intrinsic is not None:
            out["intrinsic"] = self.intrinsic
        return out

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"optimizer": self.optimizer} | self._intrinsic_optimizers()

    def use_rows(self, num_envs: int) -> None:
        """A population member's own rows: the intrinsic reward's per-env returns."""
        if self.intrinsic is not None:
            self.intrinsic.resize(num_envs)

    def _intrinsic_optimizers(self) -> dict[str, torch.optim.Optimizer]:
        if self.intrinsic is None:
            return {}
        return {"intrinsic_optimizer": self.intrinsic_optimizer}

    @property
    def frames_per_batch(self) -> int:
        return self._frames_per_batch

    def collect_policy(self) -> nn.Module:
        return self.memory.collect_policy if self.memory.on else self.actor

    def eval_policy(self) -> nn.Module:
        return self.actor

    def state_dict(self) -> dict[str, Any]:
        """The schedule's history (``kl_lr``, ``exp_lr``, ``lr_scheduler``:
        :meth:`LRSchedule.state_dict <rlkit.training.schedules.LRSchedule.state_dict>`)."""
        return self.lr_schedule.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.lr_schedule.load_state_dict(state)

    @property
    def lr_scheduler(self) -> Any:
        """The ``torch.optim.lr_scheduler`` over :attr:`optimizer` attached with
        :meth:`attach_lr_scheduler`, or None."""
        return self.lr_schedule.lr_scheduler

    def attach_lr_scheduler(self, scheduler: Any) -> None:
        """Drive the learning rate with any ``torch.optim.lr_scheduler`` built on
        :attr:`optimizer` (research code; the recipes' ``--lr-schedule`` covers the common
        ones). It is stepped once after every update (pyrado steps per update too), its rate
        is read back before the next one, other optimisers (PPG's and DAAC's value
        optimisers, an intrinsic reward's) follow in proportion, and its ``state_dict`` is
        checkpointed with the learner. Needs ``--lr-schedule constant`` (the built-in
        schedule would overwrite the rate)."""
        if getattr(scheduler, "optimizer", None) is not self.optimizer:
            raise ValueError(
                "attach_lr_scheduler: the scheduler must be built on learner.optimizer, e.g. "
                "torch.optim.lr_scheduler.StepLR(learner.optimizer, step_size=10)"
            )
        self.lr_schedule.attach(scheduler)

    # ---------------------------------------------------------------- the update
    def apply_schedules(self, progress: float) -> dict[str, float]:
        """The batch's learning rate (:attr:`lr_schedule` at ``progress``, frames done /
        budget) into the optimisers, and the loss schedules into the loss; returns them."""
        lr = self.lr_schedule.lr_at(progress)
        schedules.set_lr(self.optimizer, lr)
        out = {"lr": lr}
        if self.intrinsic is not None:
            intrinsic_lr = self.intrinsic_lr * lr / self.lr_schedule.lr
            schedules.set_lr(self.intrinsic_optimizer, intrinsic_lr)
        for name, (start, end) in self.loss_schedules.items():
            # a coefficient annealed to 0 stays just above it so validation holds
            value = schedules.linear(start, end, progress)
            setattr(self.loss, name, max(value, 1e-8) if start > 0 else value)
            out[name] = value
        return out

    def _minibatches(
        self, flat: TensorDictBase, generator: torch.Generator, *, size: int | None = None
    ) -> Iterable[TensorDictBase]:
        n = flat.shape[0]
        if size is None:
            # none: the whole batch, whose length --min-episodes may vary
            size = n if self.minibatch_size is None else self.minibatch_size
            if self.memory.on and self.minibatch_size is not None:  # frames -> sequences
                size = max(1, size // flat.shape[-1])
        if size >= n:
            # one minibatch per epoch: the mean loss over the whole batch does not depend on
            # the order of its samples, so skip the shuffle and the copy
            return (flat,)
        order = minibatch_indices(n, size, generator=generator)
        return (flat[idx] for idx in order)

    def loss_groups(self) -> list[LossGroup]:
        """The groups :meth:`update` trains: one, the loss over actor and critic."""
        if not hasattr(self, "_groups"):
            self._groups = [
                LossGroup(
                    "policy",
                    self.loss,
                    self.optimizer,
                    epochs=self.epochs,
                    max_grad_norm=self.max_grad_norm,
                    target_kl=self.target_kl,
                )
            ]
        return self._groups

    def first_phase(self) -> list[LossGroup]:
        """The policy's groups and, in lockstep, the intrinsic reward's (if attached)."""
        return [*self.loss_groups(), *self.intrinsic_groups()]

    def update(self, batch: TensorDictBase, ctx: Context) -> dict[str, float]:
        flat, sched = self.prepare(batch, ctx)
        result: dict[str, float] = {}
        for groups in self.phases():
            minibatches = self.phase_minibatches(groups)
            result |= update_loop(groups, flat, ctx, minibatches=minibatches)
        return self.finish(batch, result, ctx) | sched

    def phase_minibatches(self, groups: list[LossGroup]):
        """How a phase of :meth:`phases` splits the batch: ``--minibatch-size`` here (a
        learner whose groups train on other minibatches overrides it)."""
        del groups
        return self._minibatches

    def shared_update(self) -> bool:
        """Whether this learner updates through :meth:`prepare`, :meth:`phases` and
        :meth:`finish` (a subclass that overrides :meth:`update` does not): what a population
        vectorises (:mod:`rlkit.training.population`)."""
        return type(self).update is PolicyGradientLearner.update

    def phases(self) -> list[list[LossGroup]]:
        """The loss groups of this batch's update, as phases run one after the other (the
        groups of a phase in lockstep): one phase of :meth:`loss_groups` here."""
        return [self.first_phase()]

    def finish(
        self, batch: TensorDictBase, result: Mapping[str, float], ctx: Context
    ) -> dict[str, float]:
        """After the gradient steps (:meth:`after_update`); returns the metrics."""
        self.after_update(batch, result, ctx)
        return dict(result)

    def prepare(
        self, batch: TensorDictBase, ctx: Context
    ) -> tuple[TensorDictBase, dict[str, float]]:
        """The update before its gradient steps: schedules, then the estimator's advantages
        and targets; returns the flat data the loop trains on and the schedules' values
        (a population runs each member's ``prepare``, then all members' steps at once)."""
        sched = self.apply_schedules(ctx.progress)
        with torch.no_grad():
            if self.memory.on:
                self.memory.bootstrap_values(batch)
            self.estimator(batch)
            sched |= self.intrinsic_advantage(batch, ctx)
            if self.adv_norm is not None:  # every rank's advantages: the same statistics
                self.adv_norm(batch, samples=ctx.all_gather(batch.get(keys.ADVANTAGE)))
        if self.memory.on:
            return self.memory.sequences(batch), sched
        return batch.reshape(-1), sched

    def after_update(self, batch: TensorDictBase, result: Mapping[str, float], ctx) -> None:
        """KL-adaptive learning rate from the batch's ``approx_kl`` (and the step of
        ``--lr-schedule exponential`` or an attached scheduler), then the observation
        statistics (after the gradient steps, so a batch is scored with the statistics it was
        collected with; every rank merges all ranks' observations)."""
        if self.lr_schedule.adapts_to_kl:
            if "approx_kl" not in result:
                raise LossContractError(
                    f"--lr-schedule kl adapts the learning rate to the loss's approx_kl, but "
                    f"{type(self.loss).__name__} reports none: use --lr-schedule constant or "
                    "linear, or a loss that reports approx_kl"
                )
            kl = ctx.all_reduce_mean(torch.tensor(result["approx_kl"]))
            self.lr_schedule.observe_kl(float(kl))
        self.lr_schedule.step()
        if self.obs_norm is not None:
            per_entry = getattr(self.obs_norm, "update_from", None)  # a Dict observation's
            if per_entry is not None:
                per_entry(batch, ctx.all_gather)
            else:
                self.obs_norm.update(ctx.all_gather(batch.get(keys.OBSERVATION)))


def check_schedules(loss: nn.Module, schedules_: Mapping[str, tuple[float, float]]) -> None:
    """Every scheduled name must be a numeric attribute of ``loss`` (else nothing reads it)."""
    for name in schedules_:
        value = getattr(loss, name, None)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(
                f"loss_schedules names {name!r}, which {type(loss).__name__} does not have as a "
                "hyperparameter, so the schedule would change nothing: schedule one of its "
                "hyperparameters (e.g. clip_epsilon on PPOLoss, entropy_coef on any "
                "actor-critic loss)"
            )


def build_actor_critic(
    cfg: PolicyGradientConfig, env
) -> tuple[nn.Module, nn.Module, nn.Module | None]:
    """:func:`rlkit.modules.actor_critic_networks` with a config's network flags
    (``--encoder`` and ``--feature-dim`` where the config has them, else the MLP); with
    ``--recurrent lstm|gru``, :func:`rlkit.modules.recurrent.recurrent_actor_critic`."""
    if cfg.recurrent != "none":
        return recurrent_actor_critic(
            env,
            kind=cfg.recurrent,
            size=cfg.recurrent_size,
            layers=cfg.recurrent_layers,
            actor_hidden=cfg.actor_layers,
            critic_hidden=cfg.critic_layers,
            activation=cfg.activation,
            normalize_obs=cfg.normalize_obs,
            encoder=getattr(cfg, "encoder", "mlp"),
            feature_dim=getattr(cfg, "feature_dim", None),
            actor_kw=gaussian_kwargs(env, cfg.init_log_std, cfg.bounded_mean),
        )
    return actor_critic_networks(
        env,
        encoder=getattr(cfg, "encoder", "mlp"),
        feature_dim=getattr(cfg, "feature_dim", None),
        hidden=cfg.hidden,
        activation=cfg.activation,
        normalize_obs=cfg.normalize_obs,
        init_log_std=cfg.init_log_std,
        bounded_mean=cfg.bounded_mean,
        actor_hidden=cfg.actor_layers,
        critic_hidden=cfg.critic_layers,
        init=getattr(cfg, "init", "orthogonal"),
        obs_keys=cfg.obs_keys,
    )


def attach_intrinsic_from_config(learner: PolicyGradientLearner, cfg, env) -> None:
    """``--intrinsic NAME`` (``--int-coef``, ``--ext-coef``, ``--pretraining``,
    ``--intrinsic-lr``, ``--gamma-int``): build the intrinsic reward for ``env`` and attach it
    to ``learner`` (nothing when ``--intrinsic none``)."""
    name = cfg.intrinsic
    if name == "none":
        return
    image = {}
    entries = resolve_obs_keys(env, cfg.obs_keys)
    if entries is not None:  # a Dict observation: the chosen entries as one flat vector
        learner.intrinsic_entries = obs_entries(env, entries)
        env = PackedObsView(env, learner.intrinsic_entries)
    elif cfg.encoder != "mlp":  # the bonus's networks take the recipe's encoder
        image = dict(encoder=cfg.encoder, encoder_dim=cfg.feature_dim)
    bonus = make_intrinsic(name, env, gamma_int=cfg.gamma_int, **image)
    learner.attach_intrinsic(
        bonus,
        int_coef=cfg.int_coef,
        ext_coef=0.0 if cfg.pretraining else cfg.ext_coef,
        optimizer=intrinsic_optimizer(cfg, bonus, lr=cfg.intrinsic_lr),
        lmbda=cfg.gae_lambda,
    )


def intrinsic_optimizer(cfg, bonus: IntrinsicReward, *, lr: float | None):
    """``--optimizer`` over the trainable parameters of ``bonus`` at ``lr``, else
    ``--lr``."""
    params = [p for p in bonus.parameters() if p.requires_grad]
    return config_optimizer(cfg, params, lr=lr or cfg.lr)


def policy_gradient_settings(
    cfg: PolicyGradientConfig, loss_schedules: Mapping[str, tuple[float, float]] | None = None
) -> dict[str, Any]:
    """:class:`PolicyGradientLearner`'s keyword arguments from a config, but the networks,
    estimator, loss and optimiser: ``frames_per_batch`` (``--num-envs`` x
    ``--rollout-steps``), ``--epochs``, ``--minibatch-size``, ``--max-grad-norm``,
    ``--target-kl``, the ``--lr-schedule``, ``--running-advantage-norm``, the batch floor
    (``--min-episodes``, ``--min-steps``, on the GAE recipes) and the loss
    schedules: ``loss_schedules`` (e.g. the clip range's) and the entropy coefficient's with
    ``--entropy-coef-final``."""
    schedules_ = dict(loss_schedules or {})
    if cfg.entropy_coef_final is not None:
        schedules_["entropy_coef"] = (cfg.entropy_coef, cfg.entropy_coef_final)
    settings: dict[str, Any] = dict(
        frames_per_batch=cfg.batch_size,
        epochs=cfg.epochs,
        minibatch_size=cfg.minibatch_size,
        max_grad_norm=cfg.max_grad_norm,
        target_kl=cfg.target_kl,
        lr_schedule=config_lr_schedule(cfg),
        loss_schedules=schedules_,
        running_advantage_norm=cfg.running_advantage_norm,
    )
    if isinstance(cfg, OnPolicyConfig):  # the GAE recipes' batch floor
        settings |= dict(min_episodes=cfg.min_episodes, min_steps=cfg.min_steps)
    if cfg.recurrent != "none":
        settings["sequence_length"] = cfg.sequence_length
    return settings


def refuse_memory(cfg, algo: str) -> None:
    """``--recurrent`` on a recipe whose networks have no place for it: one line naming the
    recipes that take it."""
    if getattr(cfg, "recurrent", "none") != "none":
        raise ValueError(
            f"--recurrent {cfg.recurrent}: {algo} has no recurrent networks; the recipes with "
            f"memory are {MEMORY_RECIPES} (docs/memory.md)"
        )


def policy_optimizer(cfg, *modules: nn.Module | None) -> torch.optim.Optimizer:
    """``--optimizer`` at ``--lr`` over the parameters of ``modules`` (None skipped), each
    once (a shared trunk)."""
    return config_optimizer(cfg, unique_parameters(*(m for m in modules if m is not None)))
