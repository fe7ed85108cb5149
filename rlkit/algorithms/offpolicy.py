r"""Off-policy learners: a replay buffer between the collector and the loss.

The loop the engine runs, per collected batch of ``num_envs x steps_per_batch`` frames::

    batch -> transitions (flattened; n-step returns when n_steps > 1) -> replay buffer
    if the buffer holds >= learning_starts transitions (this rank's share):
        repeat utd_ratio x frames-of-this-batch times (fractions carried to the next batch):
            sample a minibatch (uniform, or prioritized with importance weights)
            [standardise / scale its rewards] -> update_loop over the loss groups
            (every loss_* term optimised) -> target update
            [new priorities |TD error| for prioritized replay]
    exploration: uniform random actions until learning_starts frames (the policy's own
                 exploration with --warmup-with-policy), then epsilon (linear or
                 exponential decay) for DQN, the stochastic policy for SAC

Buffers are TorchRL ``TensorDictReplayBuffer`` s (``LazyTensorStorage`` with
``RandomSampler`` or ``PrioritizedSampler``), or, for ``uint8`` image observations
(``--frame-replay auto|true``), a :class:`~rlkit.data.frames.FrameReplay` that stores
each frame once and builds the (n-step) transitions when sampling; one per rank, each filled
by its own rank's collector; gradients are all-reduced by the engine, so every rank makes the
same number of gradient steps and parameters stay identical. With ``--save-buffer`` (default
on) the checkpoint holds the buffer's filled rows, write cursor and raw priorities (a frame
replay: its rings and cursors), so a resumed run samples from the same data instead of
refilling it.

Uniform sampling draws all of a batch's minibatches at once: uniform indices with
replacement, as TorchRL's ``RandomSampler``, read from the storage in one call (the buffer does
not change between the minibatches, so this is the same distribution as one call per step, at
a fraction of the per-call cost); prioritized sampling draws one minibatch per step through
the ``PrioritizedSampler``, as priorities change after each.

n-step transitions (``n_steps > 1``, DQN) are built over the stream of batches: the last
``n - 1`` steps of each env wait for the next batch, so a window is cut only by its episode's
end, never by a batch boundary (each transition is stored ``n - 1`` steps later).

Gradient steps go through :func:`rlkit.training.update.update_loop`: DQN is one loss group (the
Q network's Adam on every ``loss_*`` term of the loss), SAC two, called one after the other on
the same minibatch: the critics on :meth:`~rlkit.objectives.SACLoss.critic_terms`, then (every
``policy_delay`` steps, against the updated critics) actor and temperature on
:meth:`~rlkit.objectives.SACLoss.actor_terms`. A term a subclass adds is optimised, never
dropped. No algorithm maths lives here: :class:`~rlkit.objectives.DQNLoss` and
:class:`~rlkit.objectives.SACLoss` hold it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

from rlkit import keys
from rlkit.algorithms._settings import config_lr_schedule
from rlkit.configs.offpolicy import OffPolicyConfig
from rlkit.data.frames import FORMAT as FRAME_REPLAY_FORMAT
from rlkit.data.frames import FrameReplay
from rlkit.data.replay import MASK_KEYS, NSTEP_READ, STORED, Replay
from rlkit.modules.dictobs import observation_entries, resolve_obs_keys
from rlkit.modules.policies import EpsilonExploration
from rlkit.objectives.dqn import TD_ERROR, nstep_transitions
from rlkit.training import schedules
from rlkit.training.engine import Context, Learner
from rlkit.training.schedules import LRSchedule
from rlkit.training.update import LossContractError, MeanMetrics

_log = logging.getLogger(__name__)


class OffPolicyLearner(Learner):
    """Replay, warm-up, update-to-data ratio, exploration and priorities (module docstring).

    Subclasses provide :meth:`train_step` (one gradient step on a minibatch, returning
    detached diagnostics and, for prioritized replay, ``td_error`` ``[B]``) and
    :meth:`exploration_epsilon`.

    Args:
        algo: algorithm name (checkpoints, summaries).
        nets: modules to checkpoint (online and target networks).
        optimizers: optimisers to checkpoint.
        policy: the collection policy (epsilon-greedy / stochastic actor) before exploration.
        eval_policy: the deterministic policy evaluated by the engine.
        action_spec: the env's unbatched action spec (``env.action_spec_unbatched``), for
            uniform random actions.
        num_envs, steps_per_batch: the rank's envs and the steps of each per batch.
        batch_size: transitions per gradient step.
        buffer_size: the replay buffer's capacity on this rank.
        learning_starts: frames (all ranks') of the warm-up before the first update.
        warmup_with_policy: the warm-up acts with the policy's own exploration, not uniformly.
        utd_ratio: gradient steps per collected frame.
        gamma: the discount of stored n-step transitions.
        n_steps: n of the stored n-step transitions (1: one-step).
        prioritized: prioritized replay, with ``priority_alpha``, ``priority_beta`` (annealed
            to 1 over the budget) and ``priority_eps``.
        frame_replay: ``auto``, ``true`` or ``false``: store each frame once
            (:class:`~rlkit.data.frames.FrameReplay`) for ``uint8`` images, always, never.
        suite: the env's suite (:func:`rlkit.envs.suites.suite_of`): the ALE stacks 4 frames.
        standardize_reward, reward_scale: the sampled rewards' transform (:meth:`prepare`).
        save_buffer: checkpoints hold the buffer.
        lr_schedule: the learning rate (:class:`~rlkit.training.schedules.LRSchedule`, a
            function of the frame counter): every parameter group follows it in proportion
            to its initial rate; None: constant.
    """

    def __init__(
        self,
        *,
        algo: str,
        nets: Mapping[str, nn.Module],
        optimizers: Mapping[str, torch.optim.Optimizer],
        policy: nn.Module,
        eval_policy: nn.Module,
        action_spec,
        num_envs: int,
        steps_per_batch: int,
        batch_size: int,
        buffer_size: int,
        learning_starts: int,
        utd_ratio: float,
        gamma: float,
        priority_alpha: float,
        priority_beta: float,
        priority_eps: float,
        warmup_with_policy: bool = False,
        n_steps: int = 1,
        prioritized: bool = False,
        frame_replay: str = "auto",
        suite: str | None = None,
        standardize_reward: bool = False,
        reward_scale: float = 1.0,
        save_buffer: bool = True,
        lr_schedule: LRSchedule | None = None,
        obs_entries: Sequence[str] | None = None,
    ) -> None:
        self.algo = algo
        #: a Dict observation's entries, each stored in the replay with its next entry (None:
        #: the single "observation")
        self.obs_entries = None if obs_entries is None else list(obs_entries)
        self.num_envs, self.steps_per_batch = num_envs, steps_per_batch
        self.batch_size, self.buffer_size = batch_size, buffer_size
        self.learning_starts, self.warmup_with_policy = learning_starts, warmup_with_policy
        self.utd_ratio, self.gamma, self.n_steps = utd_ratio, gamma, n_steps
        self.prioritized = prioritized
        self.priority_alpha, self.priority_beta = priority_alpha, priority_beta
        self.priority_eps = priority_eps
        self.frame_replay, self.suite = frame_replay, suite
        self.standardize_reward, self.reward_scale = standardize_reward, reward_scale
        self.save_buffer = save_buffer
        self.nets = nn.ModuleDict(dict(nets))
        self._optimizers = dict(optimizers)
        # each parameter group's rate at --lr (SAC: actor and temperature groups have their
        # own); --lr-schedule linear scales all of them by lr(t) / lr
        self._base_lrs = {
            name: [group["lr"] for group in opt.param_groups] for name, opt in optimizers.items()
        }
        if lr_schedule is None:
            first = next(iter(self._optimizers.values()))
            lr_schedule = LRSchedule("constant", float(first.param_groups[0]["lr"]))
        self.lr_schedule = lr_schedule
        self.explore = EpsilonExploration(
            policy, action_spec, epsilon=self.exploration_epsilon(0, 0)
        )
        self._eval_policy = eval_policy
        self.replay: Replay | FrameReplay | None = None
        self._pending_buffer: Mapping[str, Any] | None = None
        self.frames = 0  # all ranks' frames collected so far (the engine's count)
        self.batches = 0
        self.credit = 0.0  # fractional gradient steps carried to the next batch
        self.gradient_steps = 0
        self.nstep_tail: TensorDictBase | None = None  # [N, < n] steps awaiting their window
        self._check_frame_replay()
        if self.obs_entries is not None and frame_replay == "true":
            raise ValueError(
                "--frame-replay true stores one image observation's frames once; this env's "
                f"observation is a Dict ({', '.join(self.obs_entries)}): drop --frame-replay"
            )

    # ---------------------------------------------------------------- Learner interface
    def modules(self) -> dict[str, nn.Module]:
        return dict(self.nets.items())

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return dict(self._optimizers)

    @property
    def frames_per_batch(self) -> int:
        return self.num_envs * self.steps_per_batch

    def collect_policy(self) -> nn.Module:
        return self.explore

    def eval_policy(self) -> nn.Module:
        return self._eval_policy

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "frames": self.frames,
            "batches": self.batches,
            "credit": self.credit,
            "gradient_steps": self.gradient_steps,
        }
        if self.save_buffer and self.replay is not None:
            state["buffer"] = self.replay.state_dict()
        elif self.save_buffer and self._pending_buffer is not None:
            # resumed and saved again before the first update built the buffer: keep it
            state["buffer"] = self._pending_buffer
        if self.save_buffer and self.nstep_tail is not None:
            tail = self.nstep_tail
            state["nstep_tail"] = {"shape": list(tail.shape), "rows": tail.to_dict()}
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.frames = int(state.get("frames", 0))
        self.batches = int(state.get("batches", 0))
        self.credit = float(state.get("credit", 0.0))
        self.gradient_steps = int(state.get("gradient_steps", 0))
        self._pending_buffer = state.get("buffer")
        tail = state.get("nstep_tail")
        self.nstep_tail = None if tail is None else TensorDict(tail["rows"], tail["shape"])
        self.explore.epsilon = self.exploration_epsilon(self.frames, self.batches)

    # ---------------------------------------------------------------- to override
    def exploration_epsilon(self, frames: int, batches: int) -> float:
        """Probability of a uniform random action after ``frames`` frames / ``batches``:
        1 during the warm-up (0, the policy's own exploration, with ``--warmup-with-policy``),
        then 0."""
        warmup = frames < self.learning_starts and not self.warmup_with_policy
        return 1.0 if warmup else 0.0

    def train_step(self, sample: TensorDictBase, ctx: Context) -> dict[str, Any]:
        raise NotImplementedError

    # ---------------------------------------------------------------- the update
    def _replay(self, ctx: Context, batch: TensorDictBase | None = None) -> Replay | FrameReplay:
        """The rank's buffer, built on first use: a :class:`FrameReplay` with
        ``--frame-replay true``, or ``auto`` when ``batch`` holds ``uint8`` images and replay
        is uniform; else a :class:`Replay`. A pending checkpoint's buffer is loaded into it."""
        if self.replay is None:
            if self._use_frame_replay(batch):
                if batch is not None and batch.get(keys.ACTION_MASK, None) is not None:
                    raise ValueError(
                        "the frame replay (--frame-replay true, uint8 images) stores no action "
                        "masks: pass --frame-replay auto or false to store them with the "
                        "transitions"
                    )
                self.replay = FrameReplay(
                    self.buffer_size,
                    frame_stack=self._frame_stack(),
                    n_steps=self.n_steps,
                    gamma=self.gamma,
                    device=ctx.device,
                )
            else:
                self.replay = Replay(
                    self.buffer_size,
                    prioritized=self.prioritized,
                    alpha=self.priority_alpha,
                    beta=self.priority_beta,
                    eps=self.priority_eps,
                    device=ctx.device,
                )
            if self._pending_buffer is not None:
                self.replay.load_state_dict(self._pending_buffer)
                self._pending_buffer = None
        return self.replay

    def _frame_stack(self) -> int:
        """Frames stacked along dim 0 of an observation: the ALE suite's 4, else 1 (a whole
        observation is one frame: exact for any env)."""
        from rlkit.envs.suites import ATARI_FRAME_STACK

        return ATARI_FRAME_STACK if self.suite == "ALE" else 1

    def _check_frame_replay(self) -> None:
        """Refuse, before the run starts, a --buffer-size too small for a frame replay that
        --frame-replay true (or auto on a pixel suite) will build."""
        pixels = self.suite is not None and not self.prioritized
        if self.frame_replay == "false" or (self.frame_replay == "auto" and not pixels):
            return
        least = FrameReplay.least_capacity(
            self.num_envs,
            self.steps_per_batch,
            frame_stack=self._frame_stack(),
            n_steps=self.n_steps,
        )
        if self.buffer_size < least:
            raise ValueError(
                f"--buffer-size {self.buffer_size} is too small for the frame replay's batches "
                f"of {self.num_envs} envs x {self.steps_per_batch} steps: raise it to at least "
                f"{least}, or pass --frame-replay false"
            )

    def _use_frame_replay(self, batch: TensorDictBase | None) -> bool:
        mode = self.frame_replay
        pending = self._pending_buffer
        if pending is not None and mode == "auto":  # resume into the checkpoint's kind
            return pending.get("format") == FRAME_REPLAY_FORMAT
        if mode != "auto" or batch is None:
            return mode == "true"
        if getattr(self, "obs_entries", None) is not None:  # a Dict observation: stored as is
            return False
        obs = batch.get(keys.OBSERVATION)
        image = obs.dtype == torch.uint8 and obs.dim() - batch.batch_dims >= 2
        if image and not self.prioritized and batch.get(keys.ACTION_MASK, None) is not None:
            # the frame replay keeps frames once and no masks: a masked image env is stored
            # as transitions (more memory per frame), and says so
            _log.warning(
                "warning: --frame-replay auto: the env writes action masks, which the frame "
                "replay does not store, so transitions are stored whole (about "
                f"{2 * self._frame_stack()}x the memory per step for stacked frames)"
            )
            return False
        return image and not self.prioritized

    def transitions(self, batch: TensorDictBase) -> TensorDictBase:
        """``[N, T]`` collector batch -> stored transitions: ``[N * T]`` one-step ones, or,
        with ``n_steps > 1``, the n-step transitions whose window the stream now holds.

        n-step: the previous batch's last ``n - 1`` steps of each env (:attr:`nstep_tail`)
        go first, so a window spans batch boundaries and stops only at a done step; a step's
        transition is emitted once its ``n`` steps are collected (``N * T`` per batch in the
        steady state, ``N * (T - n + 1)`` in the first).
        """
        n = self.n_steps
        masks = [k for k in MASK_KEYS if batch.get(k, None) is not None]
        stored, read, entries = STORED, NSTEP_READ, getattr(self, "obs_entries", None)
        if entries is not None:  # a Dict observation: every entry and its next entry
            both = [*entries, *((keys.NEXT, k) for k in entries)]
            stored = (*(k for k in STORED if k not in _OBS_PAIR), *both)
            read = (*(k for k in NSTEP_READ if k not in _OBS_PAIR), *both)
        if n == 1:
            return batch.select(*stored, *masks).reshape(-1)
        steps = batch.select(*read, *masks)
        tail = self.nstep_tail
        if tail is not None and tail.shape[0] == steps.shape[0]:
            tail = _cut_broken_streams(tail.to(steps.device), steps, entries)
            steps = torch.cat([tail, steps], dim=1)
        ready = max(0, steps.shape[1] - n + 1)
        self.nstep_tail = steps[:, ready:].clone()
        if entries is None:
            out = nstep_transitions(steps, n=n, gamma=self.gamma)
        else:
            out = _nstep_entries(steps, entries, n=n, gamma=self.gamma)
        return out.reshape(steps.shape)[:, :ready].reshape(steps.shape[0] * ready)

    def prepare(self, sample: TensorDictBase) -> TensorDictBase:
        """Reward standardisation, then scaling, of a sampled minibatch (the buffer is
        untouched): ``r <- reward_scale * (r - mean) / (std + 1e-8)`` with
        ``--standardize-reward`` (pyrado's SAC order: the scale survives the
        standardisation), ``r <- reward_scale * r`` without."""
        if not self.standardize_reward and self.reward_scale == 1.0:
            return sample
        reward = sample.get(keys.REWARD)
        if self.standardize_reward:
            reward = (reward - reward.mean()) / (reward.std() + 1e-8)
        if self.reward_scale != 1.0:
            reward = reward * self.reward_scale
        sample.set(keys.REWARD, reward)
        return sample

    def apply_lr_schedule(self, progress: float) -> float:
        """Set every optimiser's rates for ``progress``: each parameter group at its own
        rate times ``lr(t) / lr`` (:attr:`lr_schedule`). A pure function of the frame
        counter, so a resumed run continues the schedule exactly."""
        lr = self.lr_schedule.lr_at(progress)
        ratio = lr / self.lr_schedule.lr
        for name, opt in self._optimizers.items():
            for group, base in zip(opt.param_groups, self._base_lrs[name], strict=True):
                group["lr"] = base * ratio
        return lr

    def update(self, batch: TensorDictBase, ctx: Context) -> dict[str, float]:
        replay = self._replay(ctx, batch)
        if isinstance(replay, FrameReplay):  # raw steps: it builds n-step windows itself
            replay.extend(batch)
        else:
            transitions = self.transitions(batch)
            if transitions.shape[0]:  # (TensorDict.numel() is 1 for an empty batch)
                replay.extend(transitions)
        self.frames += batch.numel() * ctx.world_size
        self.batches += 1
        stats = MeanMetrics()
        start = math.ceil(self.learning_starts / ctx.world_size)
        if isinstance(replay, FrameReplay) and replay.full:  # final slots take room too
            start = 0
        if len(replay) >= max(start, self.batch_size):
            self.credit += self.utd_ratio * batch.numel()
            steps = int(self.credit)
            self.credit -= steps
            if self.prioritized:
                replay.sampler.beta = schedules.linear(self.priority_beta, 1.0, ctx.progress)
            if self.lr_schedule.kind != "constant" and steps:
                # the frame counter, and so the rate, is the same for every step of a batch
                stats.add({"lr": self.apply_lr_schedule(ctx.progress)})
            for sample in replay.minibatches(steps, self.batch_size):
                info = self.train_step(self.prepare(sample), ctx)
                td_error = info.pop(TD_ERROR, None)
                if self.prioritized:
                    if td_error is None:
                        raise LossContractError(
                            f"--prioritized sets new priorities from the loss's {TD_ERROR!r} "
                            f"[batch], which {type(getattr(self, 'loss', self)).__name__} does "
                            "not return"
                        )
                    replay.update_priority(sample.get("index"), td_error + self.priority_eps)
                stats.add(info)
                self.gradient_steps += 1
        self.explore.epsilon = self.exploration_epsilon(self.frames, self.batches)
        result = stats.result()
        result |= {"epsilon": self.explore.epsilon, "buffer_size": float(len(replay))}
        result["gradient_steps"] = float(self.gradient_steps)
        return result


def offpolicy_collector(env, learner: Learner, device, *, seed: int | None = None):
    """The engine's ``make_collector`` hook for off-policy recipes: rlkit's fast
    :class:`~rlkit.data.collector.VectorEnvCollector` (TorchRL's ``Collector`` as fallback)
    over the env, which the engine has seeded (``seed`` is for collectors with envs of their
    own)."""
    from rlkit.data.collector import make_collector

    device = None if torch.device(device).type == "cpu" else device
    return make_collector(
        env, learner.collect_policy(), frames_per_batch=learner.frames_per_batch, device=device
    )


def offpolicy_settings(cfg: OffPolicyConfig, env=None) -> dict[str, Any]:
    """:class:`OffPolicyLearner`'s keyword arguments from a config, but the networks,
    optimisers and policies: the replay, warm-up, update-to-data ratio, reward transform,
    ``--save-buffer`` and the ``--lr-schedule``; with ``env``, a Dict observation's entries
    (``obs_entries``: all of them are stored in the replay)."""
    from rlkit.envs.suites import suite_of

    entries = None
    if env is not None and resolve_obs_keys(env, None) is not None:
        entries = observation_entries(env)
    return dict(
        obs_entries=entries,
        num_envs=cfg.num_envs,
        steps_per_batch=cfg.steps_per_batch,
        batch_size=cfg.batch_size,
        buffer_size=cfg.buffer_size,
        learning_starts=cfg.learning_starts,
        warmup_with_policy=cfg.warmup_with_policy,
        utd_ratio=cfg.utd_ratio,
        gamma=cfg.gamma,
        n_steps=cfg.n_steps,
        prioritized=cfg.prioritized,
        priority_alpha=cfg.priority_alpha,
        priority_beta=cfg.priority_beta,
        priority_eps=cfg.priority_eps,
        frame_replay=cfg.frame_replay,
        suite=suite_of(cfg.env),
        standardize_reward=cfg.standardize_reward,
        reward_scale=cfg.reward_scale,
        save_buffer=cfg.save_buffer,
        lr_schedule=config_lr_schedule(cfg),
    )


def priority_weights(cfg: OffPolicyConfig) -> str | None:
    """How the loss weights by prioritized replay's importance weights: ``--priority-weight-norm``
    with ``--prioritized true``, else None (uniform replay, no weights)."""
    return cfg.priority_weight_norm if cfg.prioritized else None


class _LastOutput:
    """Keeps the last output of a loss module (a forward hook): the ``td_error`` ``[B]`` of
    the step just taken, for prioritized replay (the update loop returns scalars only)."""

    def __init__(self, module: nn.Module) -> None:
        self.value: TensorDictBase | None = None
        module.register_forward_hook(self._keep)

    def _keep(self, module: nn.Module, args: Any, output: TensorDictBase) -> None:
        self.value = output

    def td_error(self) -> torch.Tensor | None:
        return None if self.value is None else self.value.get(TD_ERROR, None)


def _check_priority_weights(wanted: str | None, loss: nn.Module) -> None:
    """The loss weights by prioritized replay's importance weights as the learner's replay
    needs: ``wanted`` (``"max"`` or ``"sum"``; None: uniform replay, no weights)."""
    built = getattr(loss, "priority_weights", None)
    if built != wanted:
        replay = "uniform replay" if wanted is None else f"prioritized replay ({wanted!r})"
        raise ValueError(
            f"{replay} needs a loss built with priority_weights={wanted!r}, but "
            f"{type(loss).__name__} has priority_weights={built!r}: build the loss with "
            f"priority_weights={wanted!r}"
        )


_OBS_PAIR = (keys.OBSERVATION, keys.NEXT_OBSERVATION)


def _nstep_entries(
    steps: TensorDictBase, entries: Sequence[str], *, n: int, gamma: float
) -> TensorDictBase:
    """:func:`~rlkit.objectives.dqn.nstep_transitions` of a Dict observation's steps
    ``[N, T]``: the windows are built on each step's flat index standing in for the
    observation, then every entry is read at the window's first step and every next entry at
    the step it bootstraps from."""
    both = [*entries, *((keys.NEXT, k) for k in entries)]
    index = torch.arange(steps.numel(), device=steps.device).reshape(steps.shape)
    proxy = steps.exclude(*both)
    proxy.set(keys.OBSERVATION, index)
    proxy.set(keys.NEXT_OBSERVATION, index)
    out = nstep_transitions(proxy, n=n, gamma=gamma)
    first, last = out.get(keys.OBSERVATION), out.get(keys.NEXT_OBSERVATION)
    flat = steps.reshape(-1)
    out = out.exclude(*_OBS_PAIR)
    for k in entries:
        out.set(k, flat.get(k)[first])
        out.set((keys.NEXT, k), flat.get((keys.NEXT, k))[last])
    return out


def _cut_broken_streams(
    tail: TensorDictBase, steps: TensorDictBase, entries: Sequence[str] | None = None
) -> TensorDictBase:
    """``tail`` with its last step marked done (a truncation: terminated stays as it was)
    in every env whose stream ``steps`` does not continue, i.e. whose first observation is not
    the tail's last next observation. A resumed run's envs start from a reset, so without
    this the saved tail's n-step windows would run on into another episode's rewards; cut,
    they end at the tail and bootstrap from its true next observation. A continuing stream
    (every batch of one run) is returned as it is."""
    broken = torch.zeros(steps.shape[0], dtype=torch.bool, device=steps.device)
    for key in entries or [keys.OBSERVATION]:  # a Dict observation: any entry differs
        last_next = tail.get((keys.NEXT, key))[:, -1]
        first = steps.get(key)[:, 0]
        broken |= (last_next != first).reshape(first.shape[0], -1).any(-1)
    if not broken.any():
        return tail
    tail = tail.clone()
    done = tail.get(keys.DONE)
    done[:, -1] |= broken.reshape(-1, *([1] * (done.dim() - 2)))
    tail.set(keys.DONE, done)
    return tail
