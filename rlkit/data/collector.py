"""A synchronous collector that steps ``make_env``'s gymnasium vector env directly.

Why: TorchRL's ``Collector`` over ``make_env`` spends most of each step in TensorDict
plumbing (the env's ``step``, every transform's ``_step`` / ``_reset``, ``step_mdp``, the
carrier updates and one TensorDict per step), about 4x the cost of the policy forward and
the gymnasium step together (``benchmarks/bench_env.md``, ``benchmarks/bench_collect.md``).
:class:`VectorEnvCollector` keeps the same data and the same maths but does the per-step
work on plain tensors:

1. the policy is called on a small ``[N]`` TensorDict holding its ``in_keys``;
2. the action goes to the gymnasium ``SyncVectorEnv`` (auto-reset disabled) through the
   action spec's ``to_numpy``, observation and reward come back through the specs'
   ``encode`` (the calls TorchRL's ``GymWrapper`` makes);
3. the transforms of ``make_env`` are applied in TorchRL's order (the step's transforms,
   then the partial reset of the finished sub-envs): ``DoubleToFloat`` (a cast),
   :class:`~rlkit.modules.normalization.ObservationNorm` and
   :class:`~rlkit.modules.normalization.RewardNorm` through their own ``observe`` /
   ``reset_returns`` (the code their ``_step`` / ``_reset`` run, on the same statistics),
   ``RewardSum`` / ``StepCounter`` as :math:`R_{t+1} = R_t + r_t` (float32) and
   :math:`n_{t+1} = n_t + 1`, zeroed on reset, then ``SignTransform`` (ALE training
   envs) as ``sign(r_t)``;
4. the per-step tensors are kept in lists and stacked once per batch along the time dim.

Each batch equals, key for key and bit for bit, what
``Collector(env, policy, frames_per_batch=..., total_frames=-1,
auto_register_policy_transforms=False)`` yields for the same env, policy and seeds
(``tests/test_collector.py`` checks this over consecutive batches with truncations inside
and across batch boundaries, normalisers on, discrete and continuous actions).

A recurrent policy (its state in TensorDict keys, :mod:`rlkit.modules.recurrent`, or
TorchRL's ``LSTMModule`` / ``GRUModule``) is carried here too: the collector keeps
:data:`~rlkit.keys.IS_INIT` (True at each episode's first step) and the state each step
starts from, zero at an episode's first step, and carries the state the policy writes under
``("next", key)`` to the next step and the next batch. The batch stores both (root: the state
each step started from; ``"next"``: the state after it).

An env or policy outside what is supported here (other transforms, info-dict readers,
frame skip, a policy reading keys the collector does not carry) raises
:class:`UnsupportedEnvError` naming the part; :func:`make_collector` falls back to
TorchRL's ``Collector`` in that case.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import gymnasium
import numpy as np
import torch
from tensordict import NestedKey, TensorDict, TensorDictBase, is_tensor_collection
from tensordict.nn import InteractionType, TensorDictModuleBase, set_interaction_type
from torch import Tensor, nn
from torchrl.envs import (
    DoubleToFloat,
    EnvBase,
    GymWrapper,
    RewardSum,
    SignTransform,
    StepCounter,
    TransformedEnv,
)

from rlkit import keys
from rlkit.data.errors import EnvFault
from rlkit.modules.compat import check_env_compat
from rlkit.modules.direct import actor_sample, sampled_keys
from rlkit.modules.normalization import ObservationNorm, RewardNorm
from rlkit.modules.recurrent import carried_state, initial_state, reset_rows, scratch_keys

__all__ = [
    "EpisodeBatches",
    "UnsupportedEnvError",
    "VectorEnvCollector",
    "make_collector",
    "rollout_steps_for",
]

_log = logging.getLogger(__name__)

_REWARD = keys.REWARD[-1]
_DONE, _TERMINATED, _TRUNCATED = keys.DONE[-1], keys.TERMINATED[-1], keys.TRUNCATED[-1]
_DONE_NAMES = (_DONE, _TERMINATED, _TRUNCATED)
_TRAJ_IDS = ("collector", "traj_ids")
# The order in which make_env appends its transforms; each is optional, none may repeat.
_TRANSFORM_ORDER = (
    DoubleToFloat,
    ObservationNorm,
    RewardSum,
    StepCounter,
    SignTransform,  # the Atari reward clipping of ALE/* training envs (rlkit.envs.suites)
    RewardNorm,
)


class UnsupportedEnvError(ValueError):
    """The env or policy needs a TorchRL feature :class:`VectorEnvCollector` does not copy.
    ``what``: that feature, in a few words."""

    def __init__(self, message: str, what: str = "") -> None:
        super().__init__(message)
        self.what = what or message


@dataclass
class _EnvParts:
    """What the collector needs from a ``make_env`` env, read once at construction."""

    venv: gymnasium.vector.VectorEnv
    num_envs: int
    obs_spec: Any
    reward_spec: Any
    action_spec: Any
    #: the policy's action (a tensor, or a Dict action's TensorDict) as the vector env takes it
    to_env_action: Any
    obs_dtype: np.dtype  # what GymWrapper's spec.encode casts to (before DoubleToFloat)
    reward_dtype: np.dtype
    double_to_float: bool = False
    obs_norm: ObservationNorm | None = None
    track_return: bool = False
    track_steps: bool = False
    sign_reward: bool = False
    reward_norm: RewardNorm | None = None
    copy_obs: bool = False  # the vector env reuses its observation buffer
    #: a Dict observation {"observation", "action_mask"}: the mask's spec and numpy dtype
    mask_spec: Any = None
    mask_dtype: np.dtype | None = None
    #: a Dict observation of other entries (None: the single "observation"): their keys, in
    #: the spec's order, specs, numpy dtypes, and those DoubleToFloat casts
    entries: list[str] | None = None
    entry_specs: dict[str, Any] | None = None
    entry_dtypes: dict[str, np.dtype] | None = None
    double_entries: tuple[str, ...] = ()


@dataclass
class _State:
    """What carries over from one step (and one batch) to the next, per sub-env."""

    obs: Tensor | dict[str, Tensor]  # [N, *O] after the transforms (a Dict's: per entry)
    episode_return: np.ndarray | None  # [N] float32
    step_count: np.ndarray | None  # [N] int64
    traj_ids: np.ndarray  # [N] int64
    next_traj_id: int
    mask: Tensor | None = None  # [N, n] the action mask (keys.ACTION_MASK), when the env has one
    #: a recurrent policy's state ({key: [N, *S]}, zero at an episode's first step) and
    #: keys.IS_INIT [N, 1] (True at an episode's first step)
    memory: dict | None = None
    is_init: Tensor | None = None


# --------------------------------------------------------------------------- env checks


def _unsupported(what: str) -> UnsupportedEnvError:
    return UnsupportedEnvError(
        f"VectorEnvCollector cannot copy {what}; use rlkit.data.collector.make_collector "
        "(falls back to TorchRL's Collector) or torchrl.collectors.Collector",
        what,
    )


#: What the fallback costs, TorchRL's Collector against VectorEnvCollector on CartPole-v1:
#: 1.9-2.2x fewer frames/s over the same gymnasium vector env (8 or 32 envs, with and without
#: normalisation: benchmarks/results/bench_collect.md); a TorchRL env batched by SerialEnv,
#: 2.5-5.2x (paired median 3.6x, benchmarks/bench_own_env.py, docs/own_env.md)
FALLBACK_COST = (
    "expect about 2x fewer frames/s (CartPole: 1.9-2.2x; a TorchRL env batched by SerialEnv "
    "2.5-5x; docs/own_env.md)"
)


def fallback_message(what: str) -> str:
    """The one line :func:`make_collector` logs when it falls back to TorchRL's Collector."""
    return (
        f"warning: collecting with TorchRL's Collector, not rlkit's VectorEnvCollector, "
        f"for {what}: {FALLBACK_COST}"
    )


def _base_parts(env: EnvBase) -> _EnvParts:
    if not isinstance(env, TransformedEnv) or isinstance(env.base_env, TransformedEnv):
        raise _unsupported(f"an env of type {type(env).__name__} (expected make_env's env)")
    base = env.base_env
    venv = getattr(base, "_env", None)
    if not isinstance(base, GymWrapper) or not isinstance(venv, gymnasium.vector.VectorEnv):
        raise _unsupported(f"a base env {type(base).__name__} that is not a gymnasium vector env")
    mode = getattr(venv, "autoreset_mode", None) or venv.metadata.get("autoreset_mode")
    if mode != gymnasium.vector.AutoresetMode.DISABLED:
        raise _unsupported(f"a vector env with autoreset_mode={mode} (make_env uses DISABLED)")
    if base.wrapper_frame_skip != 1 or base.info_dict_reader:
        raise _unsupported("a GymWrapper with frame_skip or info-dict readers")
    if env.device is not None and env.device.type != "cpu":
        raise _unsupported(f"an env on {env.device} (the gymnasium env steps on the CPU)")
    if tuple(env.batch_size) != (venv.num_envs,):
        raise _unsupported(f"an env of batch size {tuple(env.batch_size)}")
    obs_keys = list(base.observation_spec.keys(True, True))
    masked = keys.ACTION_MASK in obs_keys
    entries = [k for k in obs_keys if k != keys.ACTION_MASK]
    # a Dict observation's entries, each a flat key (make_env writes them so)
    flat = bool(entries) and all(isinstance(k, str) for k in entries)
    # a Dict / Tuple action: one TensorDict of parts under "action" (make_env's wrapper)
    structured = getattr(base, "_structured", None) is not None
    action_keys = [keys.ACTION] if structured else base.action_keys
    if not flat or action_keys != [keys.ACTION]:
        raise _unsupported(f"observation keys {obs_keys} / action keys {base.action_keys}")
    if base.reward_keys != [_REWARD] or set(base.done_keys) != set(_DONE_NAMES):
        raise _unsupported(f"reward keys {base.reward_keys} / done keys {base.done_keys}")
    mask_spec = base.observation_spec[keys.ACTION_MASK] if masked else None
    to_env_action = (
        base.structured_to_numpy
        if structured
        else functools.partial(base.action_spec.to_numpy, safe=False)
    )
    if entries != [keys.OBSERVATION]:
        specs = {k: base.observation_spec[k] for k in entries}
        return _EnvParts(
            venv=venv,
            num_envs=venv.num_envs,
            obs_spec=None,
            reward_spec=base.reward_spec,
            action_spec=base.action_spec,
            to_env_action=to_env_action,
            obs_dtype=np.dtype(np.float32),  # unused: each entry has its own
            reward_dtype=_numpy_dtype(base.reward_spec.dtype),
            copy_obs=not getattr(venv, "copy", True),
            mask_spec=mask_spec,
            mask_dtype=None if mask_spec is None else _numpy_dtype(mask_spec.dtype),
            entries=entries,
            entry_specs=specs,
            entry_dtypes={k: _numpy_dtype(v.dtype) for k, v in specs.items()},
        )
    obs_spec = base.observation_spec[keys.OBSERVATION]
    return _EnvParts(
        venv=venv,
        num_envs=venv.num_envs,
        obs_spec=obs_spec,
        reward_spec=base.reward_spec,
        action_spec=base.action_spec,
        to_env_action=to_env_action,
        obs_dtype=_numpy_dtype(obs_spec.dtype),
        reward_dtype=_numpy_dtype(base.reward_spec.dtype),
        copy_obs=not getattr(venv, "copy", True),
        mask_spec=mask_spec,
        mask_dtype=None if mask_spec is None else _numpy_dtype(mask_spec.dtype),
    )


def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    return torch.empty(0, dtype=dtype).numpy().dtype


def _transform_list(env: TransformedEnv) -> list[nn.Module]:
    transform = env.transform
    children = getattr(transform, "transforms", None)
    return list(children) if children is not None else [transform]


def _check_transform(t: nn.Module, entries: list[str] | None = None) -> None:
    """Raise unless ``t`` is configured exactly as ``make_env`` configures it (``entries``:
    a Dict observation's, of which DoubleToFloat casts some)."""
    ok = True
    if isinstance(t, DoubleToFloat):
        cast = [keys.OBSERVATION] if entries is None else list(t.in_keys)
        ok = list(t.in_keys) == list(t.out_keys) == cast and not t.in_keys_inv
        ok = ok and all(k in (entries or [keys.OBSERVATION]) for k in cast)
    elif isinstance(t, ObservationNorm):
        ok = t.key == keys.OBSERVATION and entries is None
    elif isinstance(t, RewardSum):
        ok = list(t.in_keys) == [_REWARD] and list(t.out_keys) == [keys.EPISODE_RETURN_NAME]
    elif isinstance(t, StepCounter):
        ok = t.max_steps is None and t.step_count_key == keys.STEP_COUNT_NAME
    elif isinstance(t, SignTransform):
        ok = list(t.in_keys) == list(t.out_keys) == [_REWARD] and not t.in_keys_inv
    if not ok:
        raise _unsupported(f"a {type(t).__name__} configured differently from make_env's")


def _parse_env(env: EnvBase) -> _EnvParts:
    parts = _base_parts(env)
    position = 0
    for t in _transform_list(env):
        # the class itself or an rlkit subclass (a RewardNorm per block of sub-envs is one)
        kind = next((c for c in _TRANSFORM_ORDER if isinstance(t, c)), type(t))
        if kind not in _TRANSFORM_ORDER or _TRANSFORM_ORDER.index(kind) < position:
            raise _unsupported(
                f"the transform {type(t).__name__} in this place (supported, in this order: "
                f"{', '.join(c.__name__ for c in _TRANSFORM_ORDER)})"
            )
        position = _TRANSFORM_ORDER.index(kind) + 1
        _check_transform(t, parts.entries)
        if kind is DoubleToFloat:
            parts.double_to_float = True
            if parts.entries is not None:
                parts.double_entries = tuple(t.in_keys)
        elif kind is ObservationNorm:
            parts.obs_norm = t
        elif kind is RewardSum:
            parts.track_return = True
        elif kind is StepCounter:
            parts.track_steps = True
        elif kind is SignTransform:
            parts.sign_reward = True
        else:
            parts.reward_norm = t
    return parts


def _check_positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


def _env_name(venv: gymnasium.vector.VectorEnv) -> str:
    """``env 'CartPole-v1'`` (its gymnasium id), else its class name."""
    spec = getattr(venv, "spec", None)
    envs = getattr(venv, "envs", None) or []
    if spec is None and envs:
        spec = getattr(envs[0], "spec", None)
    if spec is not None and getattr(spec, "id", None):
        return f"env {spec.id!r}"
    inner = getattr(envs[0], "unwrapped", envs[0]) if envs else venv
    return f"env {type(inner).__name__}"


def _venv_fault(venv: Any, call: str, err: Exception, during: str = "") -> EnvFault:
    """One line for an exception raised by a gymnasium vector env's ``step()`` /
    ``reset()``; an observation of another shape than the space's (which gymnasium reports
    as a failed concatenation, naming nothing) is named with the shape that arrived."""
    if isinstance(err, EnvFault):
        return err
    space = getattr(venv, "single_observation_space", None)
    want = getattr(space, "shape", None)
    for i, obs in enumerate(getattr(venv, "_env_obs", None) or []):
        got = np.shape(obs)
        if want is not None and got != want:
            return EnvFault(
                f"{_env_name(venv)} (sub-env {i}) returned an observation of shape {got} "
                f"from {call}(){during}, but its observation spec is {space} (shape {want}): "
                "return observations of the spec's shape"
            )
    message = " ".join(str(err).split()) or "(no message)"
    name = _env_name(venv)
    return EnvFault(f"{name} raised in {call}(){during}: {type(err).__name__}: {message}")


def _gym_venv(env: EnvBase) -> gymnasium.vector.VectorEnv | None:
    """The gymnasium vector env under a ``make_env`` env (None for a TorchRL env)."""
    base = env.base_env if isinstance(env, TransformedEnv) else env
    venv = getattr(base, "_env", None)
    return venv if isinstance(venv, gymnasium.vector.VectorEnv) else None


def env_name(env: EnvBase) -> str:
    """``env 'CartPole-v1'`` (a gymnasium env's id), else ``env <class name>``."""
    venv = _gym_venv(env)
    if venv is not None:
        return _env_name(venv)
    base = env.base_env if isinstance(env, TransformedEnv) else env
    return f"env {type(base).__name__}"


def env_fault(env: EnvBase, call: str, err: Exception, *, during: str = "") -> EnvFault:
    """The collector's one line for an exception raised in ``step()`` / ``reset()`` of an env
    :func:`rlkit.envs.make_env` built, for code that steps it itself (the evaluator, TorchRL's
    ``Collector``); ``during`` follows the call (`` during evaluation``)."""
    if isinstance(err, EnvFault):
        return err
    venv = _gym_venv(env)
    if venv is not None:
        return _venv_fault(venv, call, err, during)
    message = " ".join(str(err).split()) or "(no message)"
    return EnvFault(f"{env_name(env)} raised in {call}(){during}: {type(err).__name__}: {message}")


def check_finite(env: EnvBase, td: TensorDictBase, call: str, *, during: str = "") -> None:
    """Raise the collector's :class:`EnvFault` line when ``td`` (a step's output, batch
    ``[N]``, or a batch ``[N, T]``) holds a non-finite reward or float observation under
    ``"next"`` (sub-env: the first dim), for code that steps the env itself."""
    nxt = td.get(keys.NEXT, None)
    if nxt is not None:
        _check_leaves(env, nxt, call, during)


def _check_leaves(env: EnvBase, td: TensorDictBase, call: str, during: str = "") -> None:
    """:func:`check_finite` on the float entries of ``td`` itself (the reward first)."""
    leaves = [k for k in td.keys(True, True) if k != _REWARD]
    for key in [_REWARD, *leaves]:
        x = td.get(key, None)
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.ndim == 0:
            continue
        bad = ~torch.isfinite(x.reshape(x.shape[0], -1)).all(dim=1)
        if bool(bad.any()):
            rows = ", ".join(str(i) for i in bad.nonzero().flatten()[:4].tolist())
            first = x[~torch.isfinite(x)].flatten()[0].item()
            name = key if isinstance(key, str) else key[-1]
            raise EnvFault(_non_finite_line(env_name(env), rows, name, first, call + "()" + during))


def _non_finite(parts: _EnvParts, call: str, key: str, value: np.ndarray) -> EnvFault:
    rows = ~np.isfinite(value.reshape(parts.num_envs, -1)).all(axis=1)
    where = ", ".join(str(i) for i in np.flatnonzero(rows)[:4])
    bad = value.reshape(parts.num_envs, -1)[rows][0]
    first = bad[~np.isfinite(bad)][0]
    return EnvFault(_non_finite_line(_env_name(parts.venv), where, key, first, call + "()"))


def _non_finite_line(name: str, rows: str, key: str, first: Any, where: str) -> str:
    """The one line for a non-finite ``key`` that sub-envs ``rows`` returned from ``where``
    (``step()``, ``reset() during evaluation``): the rlkit collector's and the checks of
    code that steps the env itself say it alike."""
    return (
        f"{name} (sub-env {rows}) returned a non-finite {key!r} ({first}) from {where}: the env "
        "produced it, not the learner; fix the env or wrap it to clip or replace such values"
    )


class _CheckedVenv:
    """The vector env as the collector steps it: an exception in ``step()`` / ``reset()``, a
    non-finite observation or reward and an observation of the wrong shape become one
    :class:`~rlkit.training.errors.EnvFault` line naming the env. The checks are
    vectorised on the whole step (one ``np.isfinite(x).all()`` per float array: 0.6% of a
    CartPole step with 8 envs); other attributes are the env's."""

    def __init__(self, parts: _EnvParts) -> None:
        self._parts, self._venv = parts, parts.venv

    def __getattr__(self, name: str) -> Any:
        return getattr(self._venv, name)

    def step(self, actions: Any) -> tuple:
        try:
            out = self._venv.step(actions)
        except Exception as err:
            raise _venv_fault(self._parts.venv, "step", err) from err
        obs, reward = out[0], out[1]
        self._check_obs("step", obs)
        if not np.isfinite(reward).all():
            raise _non_finite(self._parts, "step", _REWARD, np.asarray(reward))
        return out

    def reset(self, **kwargs: Any) -> tuple:
        try:
            out = self._venv.reset(**kwargs)
        except Exception as err:
            raise _venv_fault(self._parts.venv, "reset", err) from err
        self._check_obs("reset", out[0])
        return out

    def _check_obs(self, call: str, obs: Any) -> None:
        """A float observation (each float entry of a Dict observation) must be finite."""
        if isinstance(obs, dict):
            for key in self._parts.entries or [keys.OBSERVATION]:
                self._check_entry(call, key, obs.get(key))
        else:
            self._check_entry(call, keys.OBSERVATION, obs)

    def _check_entry(self, call: str, key: str, obs: Any) -> None:
        if isinstance(obs, np.ndarray) and obs.dtype.kind == "f" and not np.isfinite(obs).all():
            raise _non_finite(self._parts, call, key, obs)


# --------------------------------------------------------------------------- collector


class VectorEnvCollector:
    r"""Synchronous collector over an env built by :func:`rlkit.envs.make_env`.

    Drop-in for ``torchrl.collectors.Collector(env, policy, frames_per_batch=...,
    total_frames=..., device=..., auto_register_policy_transforms=False)`` as the training
    engine uses it (``iter``, ``update_policy_weights_()``, ``shutdown()``), with the same
    batches, about 2.2x faster on CartPole with 8 or 32 envs
    (``benchmarks/results/bench_collect.md``).

    Each batch is a TensorDict of batch size ``[N, T]`` (``N = num_envs``,
    ``T = frames_per_batch / N``), dims named ``[None, "time"]``, holding:

    - root: ``keys.OBSERVATION`` ``[N, T, *O]`` (after the env's transforms; the reset
      observation on the step after a done), ``episode_reward`` ``[N, T, 1]`` and
      ``step_count`` ``[N, T, 1]`` before the step, ``done`` / ``terminated`` /
      ``truncated`` ``[N, T, 1]`` (all ``False``: the state after step / reset), every
      policy output (``keys.ACTION``, ``keys.ACTION_LOG_PROB``, ``keys.LOGITS`` or
      ``keys.LOC`` / ``keys.SCALE``, ...) and ``("collector", "traj_ids")`` ``[N, T]``;
      with a Dict observation ``{"observation", "action_mask"}`` (a masked-action env,
      ``docs/actions.md``) also ``keys.ACTION_MASK`` ``[N, T, n]``, the mask the policy read;
      with a Dict observation of other entries (``make_env`` writes each under its own key)
      each entry ``[N, T, *E]`` in place of ``keys.OBSERVATION``, and under ``"next"`` too;
    - ``"next"``: ``keys.NEXT_OBSERVATION`` (the true observation reached, also at done
      steps), ``keys.REWARD`` (after ``RewardNorm`` if the env has one), ``keys.DONE`` /
      ``keys.TERMINATED`` / ``keys.TRUNCATED``, ``keys.EPISODE_RETURN`` (undiscounted, in
      the env's reward units) and ``keys.STEP_COUNT``; and ``keys.NEXT_ACTION_MASK``, the
      mask of the observation reached, when the env has one.

    The env's state carries over from batch to batch (no reset between batches); the env is
    reset once, through TorchRL, at construction (as ``Collector`` does). Sub-envs that finish
    are reset right after the step that finished them.

    Args:
        env: an env made by :func:`rlkit.envs.make_env` (CPU env; see the module docstring
            for what else is accepted). Anything else raises :class:`UnsupportedEnvError`.
            The policy's actions are checked against its action spec
            (:func:`rlkit.modules.check_env_compat`).
        policy: a TensorDict module (e.g. a TorchRL ``ProbabilisticActor``) whose
            ``in_keys`` are among ``observation``, ``episode_reward``, ``step_count``,
            ``done``, ``terminated``, ``truncated`` (and ``action_mask`` when the env has
            one). It is called once at construction on the
            reset observation (as ``Collector`` does, so random draws line up) to learn its
            outputs, then once per step under ``torch.no_grad``.
        frames_per_batch: frames per batch, a positive multiple of ``num_envs``.
        total_frames: stop after this many frames; ``-1`` (default) iterates forever.
        device: where the policy runs and where batches are returned (``None``: the CPU,
            batches without a TensorDict device, as ``Collector(device=None)``).
        exploration_type: set for every rollout, as ``Collector`` does (a surrounding
            ``set_exploration_type`` context is overridden). Default ``RANDOM``.

    Example:
        >>> from rlkit.envs import make_env
        >>> from rlkit.modules.actors import make_actor
        >>> env = make_env("CartPole-v1", num_envs=4, seed=0)
        >>> actor = make_actor(env.observation_spec, env.action_spec)
        >>> collector = VectorEnvCollector(env, actor, frames_per_batch=32)
        >>> batch = next(iter(collector))
        >>> batch.batch_size, batch.names, batch[keys.ACTION].dtype
        (torch.Size([4, 8]), [None, 'time'], torch.int64)
        >>> collector.shutdown()
    """

    def __init__(
        self,
        env: EnvBase,
        policy: nn.Module,
        *,
        frames_per_batch: int,
        total_frames: int = -1,
        device: torch.device | str | None = None,
        exploration_type: InteractionType = InteractionType.RANDOM,
    ) -> None:
        self.env = env
        self._parts = _parse_env(env)
        self._parts.venv = _CheckedVenv(self._parts)  # type: ignore[assignment]
        self.frames_per_batch = self._check_frames(frames_per_batch, total_frames)
        self.total_frames = total_frames
        self.steps_per_batch = frames_per_batch // self._parts.num_envs
        self.device = self._check_device(policy, device)
        self.exploration_type = exploration_type
        self.policy = policy
        self._carried = carried_state(policy) if isinstance(policy, nn.Module) else {}
        self._scratch = scratch_keys(policy) if isinstance(policy, nn.Module) else set()
        self._policy_in_keys = self._check_policy(policy)
        check_env_compat(policy, env, device=self.device)  # index vs one-hot, count, bounds
        try:
            self._state = self._initial_state()  # through TorchRL, not _CheckedVenv
        except Exception as err:
            raise _venv_fault(self._parts.venv, "reset", err) from err
        first = self._state.obs
        for key, x in first.items() if isinstance(first, dict) else [(keys.OBSERVATION, first)]:
            if x.is_floating_point() and not bool(torch.isfinite(x).all()):
                raise _non_finite(self._parts, "reset", key, x.numpy())
        self._out_keys = self._probe_policy()
        # a policy whose direct path writes exactly the keys the probe saw may take it
        direct_keys = sampled_keys(self.policy) if isinstance(self.policy, nn.Module) else None
        self._direct = direct_keys is not None and set(direct_keys) == set(self._out_keys)
        self.frames = 0
        self.closed = False

    # ------------------------------------------------------------------ construction
    def _check_frames(self, frames_per_batch: int, total_frames: int) -> int:
        n = self._parts.num_envs
        _check_positive_int("frames_per_batch", frames_per_batch)
        if frames_per_batch % n:
            raise ValueError(
                f"frames_per_batch={frames_per_batch} is not a multiple of num_envs={n}; "
                f"use a multiple such as {max(n, frames_per_batch // n * n)}"
            )
        if total_frames != -1:
            _check_positive_int("total_frames (or -1 for endless iteration)", total_frames)
        return frames_per_batch

    @staticmethod
    def _check_device(policy: nn.Module, device: torch.device | str | None) -> torch.device | None:
        if device is not None:
            return torch.device(device)
        params = policy.parameters() if isinstance(policy, nn.Module) else iter(())
        first = next(params, None)
        if first is not None and first.device.type != "cpu":
            raise ValueError(
                f"the policy's parameters are on {first.device} but device=None (the CPU); "
                f"pass device={str(first.device)!r}"
            )
        return None

    def _memory_keys(self) -> list[NestedKey]:
        """A recurrent policy's inputs beyond the env's: ``is_init`` and its state keys."""
        return [keys.IS_INIT, *self._carried] if self._carried else []

    def _obs_keys(self) -> list[str]:
        """``["observation"]``, or a Dict observation's entries (the mask aside)."""
        return self._parts.entries or [keys.OBSERVATION]

    def _root_keys(self) -> list[str]:
        names = [*self._obs_keys(), *_DONE_NAMES]
        if self._parts.mask_spec is not None:
            names.append(keys.ACTION_MASK)
        if self._parts.track_return:
            names.append(keys.EPISODE_RETURN_NAME)
        if self._parts.track_steps:
            names.append(keys.STEP_COUNT_NAME)
        return names

    def _check_policy(self, policy: nn.Module) -> list[NestedKey]:
        in_keys = getattr(policy, "in_keys", None)
        if not callable(policy) or in_keys is None:
            raise TypeError(
                f"policy must be a TensorDict module with in_keys (e.g. a TorchRL "
                f"ProbabilisticActor), got {type(policy).__name__}"
            )
        readable = [*self._root_keys(), *self._memory_keys()]
        extra = [k for k in in_keys if k not in readable]
        if extra:
            raise _unsupported(
                f"a policy reading {extra} (it may read {readable}; other carried keys need "
                "TorchRL's step_mdp)"
            )
        return list(in_keys)

    def _initial_state(self) -> _State:
        """Reset every sub-env through TorchRL, exactly as ``Collector`` does at start-up."""
        with torch.no_grad():
            td = self.env.reset()
        n, p = self._parts.num_envs, self._parts
        ret = td.get(keys.EPISODE_RETURN_NAME).reshape(n).numpy() if p.track_return else None
        steps = td.get(keys.STEP_COUNT_NAME).reshape(n).numpy() if p.track_steps else None
        obs = td.get(keys.OBSERVATION) if p.entries is None else {k: td.get(k) for k in p.entries}
        mask = td.get(keys.ACTION_MASK) if p.mask_spec is not None else None
        state = _State(obs, ret, steps, np.arange(n, dtype=np.int64), next_traj_id=n, mask=mask)
        if self._carried:  # every sub-env starts an episode: zero state, is_init True
            state.memory = initial_state(self._carried, [n])
            state.is_init = torch.ones(n, 1, dtype=torch.bool)
        return state

    def _probe_policy(self) -> list[NestedKey]:
        """Call the policy once (as ``Collector`` does) and list the keys it writes."""
        with torch.no_grad():
            out = self.policy(self._policy_input())
        if not isinstance(out, TensorDictBase):
            raise TypeError(
                f"policy must return a TensorDict, got {type(out).__name__}; wrap the "
                "network in a tensordict.nn.TensorDictModule"
            )
        carried = [(keys.NEXT, k) for k in self._carried]
        missing = [k for k in carried if k not in out.keys(True, True)]
        if missing:
            raise ValueError(
                f"the recurrent policy reads its state {list(self._carried)} but wrote no "
                f"{missing}: a recurrent module writes the state after the step under "
                "('next', key) (docs/memory.md)"
            )
        skip = {*self._policy_in_keys, *self._scratch, *([keys.NEXT] if carried else [])}
        written = [k for k in out.keys() if k not in skip]  # noqa: SIM118 (root keys)
        # nested keys only as a Dict action's parts, under "action"
        nested = [k for k in written if k != keys.ACTION and is_tensor_collection(out.get(k))]
        bad = nested + [k for k in written if k in self._root_keys()]
        if bad or keys.ACTION not in written:
            raise _unsupported(
                f"a policy writing {bad or written} (it must write {keys.ACTION!r} and may not "
                "write nested keys or the env's keys)"
            )
        return written

    # ------------------------------------------------------------------ iteration
    def __iter__(self) -> Iterator[TensorDictBase]:
        while self.total_frames == -1 or self.frames < self.total_frames:
            batch = self.rollout()
            self.frames += batch.numel()
            yield batch

    iterator = __iter__

    def update_policy_weights_(self) -> None:
        """No-op: the policy runs in this process, so it always has the latest weights."""

    def shutdown(self, close_env: bool = True) -> None:
        """Stop collecting; close the env too (default), as ``Collector.shutdown`` does."""
        if not self.closed:
            self.closed = True
            if close_env and not self.env.is_closed:
                self.env.close()

    @torch.no_grad()
    def rollout(self) -> TensorDictBase:
        """Collect one batch ``[N, T]`` (see the class docstring for its keys)."""
        if self.closed:
            raise RuntimeError("the collector was shut down; build a new one")
        root: dict[NestedKey, list] = {k: [] for k in self._stored_root_keys()}
        nxt: dict[str, list] = {k: [] for k in self._stored_next_keys()}
        with set_interaction_type(self.exploration_type):
            for _ in range(self.steps_per_batch):
                self._record_state(root)
                inputs = self._policy_input()
                # a plain ProbabilisticActor: its own draws without the TensorDict dispatch
                out = actor_sample(self.policy, inputs) if self._direct else None
                if out is None:
                    out = self.policy(inputs)
                for k in self._out_keys:
                    root[k].append(out.get(k))
                if self._carried:
                    self._carry(out, nxt)
                self._step(out.get(keys.ACTION), nxt)
        if self._parts.copy_obs:
            obs = self._state.obs
            self._state.obs = (
                {k: v.clone() for k, v in obs.items()} if isinstance(obs, dict) else obs.clone()
            )
        return self._assemble(root, nxt)

    # ------------------------------------------------------------------ per step
    def _carry(self, out: TensorDictBase, nxt: dict[str, list]) -> None:
        """The state after the step (the policy's ``("next", key)``): stored under
        ``"next"`` and carried to the next step (zeroed there if the episode ends)."""
        s = self._state
        for k in self._carried:
            after = out.get((keys.NEXT, k))
            if after.device.type != "cpu":
                after = after.cpu()
            nxt[k].append(after)
            s.memory[k] = after

    def _stored_root_keys(self) -> list[NestedKey]:
        names: list[NestedKey] = [*self._obs_keys(), _TRAJ_IDS, *self._out_keys]
        names += self._memory_keys()
        if self._parts.mask_spec is not None:
            names.append(keys.ACTION_MASK)
        if self._parts.track_return:
            names.append(keys.EPISODE_RETURN_NAME)
        if self._parts.track_steps:
            names.append(keys.STEP_COUNT_NAME)
        return names

    def _stored_next_keys(self) -> list[str]:
        names = [*self._obs_keys(), _REWARD, *_DONE_NAMES, *self._carried]
        if self._parts.mask_spec is not None:
            names.append(keys.ACTION_MASK)
        if self._parts.track_return:
            names.append(keys.EPISODE_RETURN_NAME)
        if self._parts.track_steps:
            names.append(keys.STEP_COUNT_NAME)
        return names

    def _policy_input(self) -> TensorDictBase:
        s, n = self._state, self._parts.num_envs
        source: dict[str, Tensor] = {}
        for k in self._policy_in_keys:
            if k == keys.OBSERVATION and self._parts.entries is None:
                source[k] = s.obs
            elif isinstance(s.obs, dict) and k in s.obs:
                source[k] = s.obs[k]
            elif k == keys.EPISODE_RETURN_NAME:
                source[k] = torch.from_numpy(s.episode_return).view(n, 1)
            elif k == keys.STEP_COUNT_NAME:
                source[k] = torch.from_numpy(s.step_count).view(n, 1)
            elif k == keys.ACTION_MASK:
                source[k] = s.mask
            elif k == keys.IS_INIT:
                source[k] = s.is_init
            elif k in self._carried:
                source[k] = s.memory[k]
            else:  # done / terminated / truncated: always False before a step
                source[k] = torch.zeros(n, 1, dtype=torch.bool)
        device = self.device
        if device is None or device.type == "cpu":
            return TensorDict._new_unsafe(source, batch_size=torch.Size([n]))
        source = {k: v.to(device, non_blocking=True) for k, v in source.items()}
        return TensorDict._new_unsafe(source, batch_size=torch.Size([n]), device=device)

    def _record_state(self, root: dict[NestedKey, list]) -> None:
        s = self._state
        if isinstance(s.obs, dict):
            for k, v in s.obs.items():
                root[k].append(v)
        else:
            root[keys.OBSERVATION].append(s.obs)
        root[_TRAJ_IDS].append(s.traj_ids)
        if s.episode_return is not None:
            root[keys.EPISODE_RETURN_NAME].append(s.episode_return)
        if s.step_count is not None:
            root[keys.STEP_COUNT_NAME].append(s.step_count)
        if s.mask is not None:
            root[keys.ACTION_MASK].append(s.mask)
        if s.memory is not None:
            root[keys.IS_INIT].append(s.is_init)
            for k, v in s.memory.items():
                root[k].append(v)

    def _read_mask(self, obs: dict) -> Tensor:
        """The Dict observation's action mask, as GymWrapper's ``spec.encode`` reads it."""
        p = self._parts
        out = np.asarray(obs[keys.ACTION_MASK], dtype=p.mask_dtype).reshape(p.mask_spec.shape)
        return torch.from_numpy(out.copy() if p.copy_obs or not out.flags.writeable else out)

    def _read_obs(self, obs: np.ndarray | dict) -> Tensor:
        """GymWrapper's ``spec.encode`` (a dtype cast and reshape), then DoubleToFloat.
        A Dict observation (``{"observation", "action_mask"}``) reads its ``"observation"``."""
        p = self._parts
        if p.entries is not None:
            return self._read_entries(obs)
        if p.mask_spec is not None:
            obs = obs[keys.OBSERVATION]
        out = np.asarray(obs, dtype=p.obs_dtype).reshape(p.obs_spec.shape)
        if p.double_to_float:
            out = out.astype(np.float32)
        elif p.copy_obs or not out.flags.writeable:
            out = out.copy()
        return torch.from_numpy(out)

    def _read_entries(self, obs: dict) -> dict[str, Tensor]:
        """A Dict observation's entries, each as :meth:`_read_obs` reads one observation."""
        p, out = self._parts, {}
        for k in p.entries:
            x = np.asarray(obs[k], dtype=p.entry_dtypes[k]).reshape(p.entry_specs[k].shape)
            if k in p.double_entries:
                x = x.astype(np.float32)
            elif p.copy_obs or not x.flags.writeable:
                x = x.copy()
            out[k] = torch.from_numpy(x)
        return out

    def _step(self, action: Tensor, nxt: dict[str, list]) -> None:
        """One env step. Per-env scalars stay numpy arrays ``[N]`` (an op on 8 numbers costs
        about 1 us in numpy, 3-5 us through torch's dispatcher); float32 and int64 adds
        round identically in both."""
        p, s = self._parts, self._state
        if action.device.type != "cpu":
            action = action.cpu()
        obs_np, reward_np, terminated, truncated, _ = p.venv.step(p.to_env_action(action))
        next_obs = self._read_obs(obs_np)
        if p.obs_norm is not None:
            next_obs = p.obs_norm.observe(next_obs)
        reward = np.asarray(reward_np, dtype=p.reward_dtype).reshape(p.num_envs)
        done = terminated | truncated
        if isinstance(next_obs, dict):
            for k, v in next_obs.items():
                nxt[k].append(v)
        else:
            nxt[keys.OBSERVATION].append(next_obs)
        nxt[_DONE].append(done)
        nxt[_TERMINATED].append(terminated)
        nxt[_TRUNCATED].append(truncated)
        if p.mask_spec is not None:
            s.mask = self._read_mask(obs_np)
            nxt[keys.ACTION_MASK].append(s.mask)
        if s.episode_return is not None:
            s.episode_return = s.episode_return + reward
            nxt[keys.EPISODE_RETURN_NAME].append(s.episode_return)
        if s.step_count is not None:
            s.step_count = s.step_count + 1
            nxt[keys.STEP_COUNT_NAME].append(s.step_count)
        if p.sign_reward:  # after RewardSum: returns stay in the game's points
            reward = np.sign(reward)
        if p.reward_norm is not None:  # sees the reward after RewardSum (and the sign)
            shape = p.reward_spec.shape
            done_t = torch.from_numpy(done).view(shape)
            reward = p.reward_norm.observe(torch.from_numpy(reward).view(shape), done_t)
        nxt[_REWARD].append(reward)
        s.obs = next_obs
        if s.memory is not None:  # the next step starts an episode where this one ended
            s.is_init = torch.from_numpy(done).view(-1, 1)
        if done.any():
            self._reset_finished(done)

    def _reset_finished(self, done: np.ndarray) -> None:
        """Reset the finished sub-envs: new observation, zeroed trackers, new traj ids."""
        p, s = self._parts, self._state
        rows = torch.from_numpy(done)
        reset_obs, _ = p.venv.reset(options={"reset_mask": done})
        if p.mask_spec is not None:
            mask = self._read_mask(reset_obs)
            s.mask = torch.where(rows.view(-1, *([1] * (mask.dim() - 1))), mask, s.mask)
        reset_obs = self._read_obs(reset_obs)
        if p.obs_norm is not None:
            reset_obs = p.obs_norm.observe(reset_obs, rows)
        if p.reward_norm is not None:
            p.reward_norm.reset_returns(rows)
        if isinstance(reset_obs, dict):
            s.obs = {k: _where_rows(rows, v, s.obs[k]) for k, v in reset_obs.items()}
        else:
            s.obs = torch.where(rows.view(-1, *([1] * (reset_obs.dim() - 1))), reset_obs, s.obs)
        if s.episode_return is not None:
            s.episode_return = np.where(done, np.float32(0.0), s.episode_return)
        if s.step_count is not None:
            s.step_count = np.where(done, 0, s.step_count)
        if s.memory is not None:  # a new episode starts from a zero state
            s.memory = reset_rows(s.memory, rows)
        count = int(done.sum())
        s.traj_ids = s.traj_ids.copy()
        s.traj_ids[done] = np.arange(s.next_traj_id, s.next_traj_id + count)
        s.next_traj_id += count

    # ------------------------------------------------------------------ batch
    def _assemble(self, root: dict[NestedKey, list], nxt: dict[str, list]) -> TensorDictBase:
        n, t = self._parts.num_envs, self.steps_per_batch
        batch_size = torch.Size([n, t])
        top: dict[str, Any] = {k: _stack(v, n) for k, v in root.items() if k != _TRAJ_IDS}
        false = torch.zeros(n, t, 1, dtype=torch.bool)
        top.update({k: false.clone() for k in _DONE_NAMES})
        next_td = {k: _stack(v, n) for k, v in nxt.items()}
        top["next"] = TensorDict._new_unsafe(next_td, batch_size=batch_size)
        traj_ids = torch.from_numpy(np.stack(root[_TRAJ_IDS], axis=1))
        top[_TRAJ_IDS[0]] = TensorDict._new_unsafe({_TRAJ_IDS[1]: traj_ids}, batch_size=batch_size)
        batch = TensorDict._new_unsafe(top, batch_size=batch_size)
        if self.device is not None:
            batch = batch.to(self.device)
        return batch.refine_names(..., keys.TIME_DIM_NAME)


def _where_rows(rows: Tensor, new: Tensor, old: Tensor) -> Tensor:
    """``new`` in the rows ``rows`` ``[N]`` marks, ``old`` elsewhere."""
    return torch.where(rows.view(-1, *([1] * (new.dim() - 1))), new, old)


def _stack(steps: list, n: int) -> Tensor:
    """``T`` per-step values ``[N, *S]`` -> ``[N, T, *S]``; numpy ``[N]`` scalars per env
    become ``[N, T, 1]`` (the TorchRL shape of rewards, flags and trackers)."""
    if isinstance(steps[0], np.ndarray):
        return torch.from_numpy(np.stack(steps, axis=1)).unsqueeze(-1)
    return torch.stack(steps, dim=1)


def make_collector(
    env: EnvBase,
    policy: nn.Module,
    *,
    frames_per_batch: int,
    total_frames: int = -1,
    device: torch.device | str | None = None,
    exploration_type: InteractionType = InteractionType.RANDOM,
) -> Any:
    """A :class:`VectorEnvCollector`, or TorchRL's ``Collector`` when the env needs it.

    Same arguments and same batches either way; the fallback logs one WARNING line, with
    what in the env needs it and its cost (:func:`fallback_message`;
    ``logging.getLogger("rlkit.data.collector")``, on stderr unless logging is set up).
    Either way the policy's actions are checked against the env's action spec first
    (:func:`rlkit.modules.check_env_compat`): an index-action actor on a one-hot env, a
    wrong action count or dimension, or different bounds raise
    :class:`~rlkit.modules.compat.ActionSpecMismatchError` before any step.
    """
    try:
        return VectorEnvCollector(
            env,
            policy,
            frames_per_batch=frames_per_batch,
            total_frames=total_frames,
            device=device,
            exploration_type=exploration_type,
        )
    except UnsupportedEnvError as err:
        # one line, once per collector (a run builds one): WARNING reaches stderr without
        # any logging set up (Python's last-resort handler), and is not a Python warning,
        # which a test suite may turn into an error
        _log.warning(fallback_message(err.what))
    # TorchRL's Collector would send misfit actions as they are
    check_env_compat(policy, env, device=device)
    _guard_env(env)
    return _checked_collector()(
        env,
        _as_tensordict_module(policy),
        frames_per_batch=frames_per_batch,
        total_frames=total_frames,
        device=device,
        exploration_type=exploration_type,
        auto_register_policy_transforms=False,
    )


def _guard_env(env: EnvBase) -> None:
    """TorchRL's ``Collector`` steps ``env`` itself: its base env's ``step()`` / ``reset()``
    failures and non-finite outputs become the collector's one :class:`EnvFault` line,
    checked where they arise, before the policy reads them (values pass untouched)."""
    base = env.base_env if isinstance(env, TransformedEnv) else env
    if getattr(base, "_rlkit_guarded", False):
        return
    step, reset = base._step, base._reset

    def guarded_step(*args: Any, **kwargs: Any) -> Any:
        try:
            out = step(*args, **kwargs)
        except Exception as err:
            raise env_fault(env, "step", err) from err
        _check_leaves(env, out, "step")
        return out

    def guarded_reset(*args: Any, **kwargs: Any) -> Any:
        try:
            out = reset(*args, **kwargs)
        except Exception as err:
            raise env_fault(env, "reset", err) from err
        _check_leaves(env, out, "reset")
        return out

    base._step, base._reset, base._rlkit_guarded = guarded_step, guarded_reset, True


@functools.cache
def _checked_collector() -> type:
    """TorchRL's ``Collector`` whose batches are checked as :class:`VectorEnvCollector`
    checks its steps: a non-finite reward or observation is one :class:`EnvFault` line
    (:func:`check_finite`); the batches are TorchRL's, untouched. Made on first use: TorchRL's
    collectors module is imported only when a run falls back to it."""
    from torchrl.collectors import Collector

    class CheckedCollector(Collector):
        def __iter__(self) -> Iterator[TensorDictBase]:
            for batch in super().__iter__():  # the transforms' outputs too (ObservationNorm)
                check_finite(self.env, batch, "step")
                yield batch

    CheckedCollector.__name__ = CheckedCollector.__qualname__ = "Collector"
    return CheckedCollector


def _as_tensordict_module(policy: nn.Module) -> nn.Module:
    """``policy`` as TorchRL's ``Collector`` takes it: a plain ``nn.Module`` with ``in_keys``
    and ``out_keys`` (one policy over several blocks of envs) is refused there unless it is a
    ``TensorDictModuleBase``; a thin one calls it, sharing its parameters."""
    if isinstance(policy, TensorDictModuleBase) or not hasattr(policy, "in_keys"):
        return policy
    return _PolicyModule(policy)


class _PolicyModule(TensorDictModuleBase):
    def __init__(self, policy: nn.Module) -> None:
        super().__init__()
        self.policy = policy
        self.in_keys, self.out_keys = list(policy.in_keys), list(policy.out_keys)

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        return self.policy(td)


def rollout_steps_for(min_episodes: int, *, num_envs: int, max_episode_steps: int) -> int:
    r"""The fewest steps per env that guarantee ``min_episodes`` complete episodes per batch.

    pyrado's ``min_rollouts`` as a fixed batch shape. The recipes' ``--min-episodes N``
    (:class:`EpisodeBatches`) now collects until each batch holds N complete episodes, so
    this helper is no longer needed for that; it remains for what the flag cannot give:
    batches of one fixed ``[num_envs, T]`` shape (the same number of minibatches every
    update, one compiled shape) that still always hold N complete episodes. With
    ``--rollout-steps`` set to its result, ``--min-episodes N`` never collects a second
    chunk. Batches continue the envs' episodes across batches (partial episodes bootstrap).

    A row of ``T`` steps may open with the tail of an episode that began in the previous
    batch (up to ``L - 1`` steps, ``L = max_episode_steps``) and every episode lasts at most
    ``L`` steps, so it holds at least :math:`\lfloor (T - L + 1)/L \rfloor`
    complete episodes (first and last step inside the row); ``num_envs`` rows hold
    ``min_episodes`` when each holds :math:`k = \lceil \text{min\_episodes}/\text{num\_envs}
    \rceil`, i.e. :math:`T = (k + 1) L - 1` (the least such T: one step fewer, and an
    unlucky start leaves a row with ``k - 1``).

    Example:
        >>> rollout_steps_for(8, num_envs=4, max_episode_steps=500)  # CartPole-v1: L = 500
        1499
    """
    for name, value in (
        ("min_episodes", min_episodes),
        ("num_envs", num_envs),
        ("max_episode_steps", max_episode_steps),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"rollout_steps_for: {name} must be an int >= 1, got {value!r}")
    per_env = -(-min_episodes // num_envs)
    return (per_env + 1) * max_episode_steps - 1


class EpisodeBatches:
    r"""Batches of at least ``min_episodes`` complete episodes and ``min_frames`` frames.

    pyrado's ``min_rollouts`` / ``min_steps`` (``--min-episodes`` / ``--min-steps`` of the
    GAE recipes). Wraps a collector whose batches are ``[N, T]`` chunks that continue the same
    envs (:class:`VectorEnvCollector` or TorchRL's ``Collector``) and concatenates chunks
    along time until the batch holds enough, so a batch is ``[N, k T]`` with ``k >= 1``
    chosen per batch:

    - ``min_frames`` ``M``: at least ``M`` frames, so ``k >= ceil(M / (N T))``;
    - ``min_episodes`` ``E``: at least ``E`` complete episodes, counted over all rows. An
      episode is complete when its first and its last step are both inside the batch (the
      definition of :func:`rollout_steps_for`): a row whose previous batch ended mid-episode
      opens with that episode's tail, which does not count.

    The envs are never reset between chunks or batches, so a batch's rows are contiguous in
    time and an estimator that runs along the time dim (GAE, V-trace) sees one trajectory
    per row, exactly as if it had been collected in one go.

    Args:
        collector: yields the chunks (``iter``), and has ``update_policy_weights_()`` and
            ``shutdown()``, which are passed through.
        min_episodes: complete episodes per batch (an int >= 1), or None.
        min_frames: frames per batch (an int >= 1), or None. At least one of the two.
        agree: on several ranks, ``agree(enough) -> bool`` must return True on every rank
            only when ``enough`` is True on every rank (an all-reduce), so that all ranks
            collect the same number of chunks and step their optimisers together.

    State: whether each row's next step starts an episode, carried from batch to batch; it
    is not checkpointed. A resumed run builds a new collector, which resets every env, so
    its first batch starts every row at an episode's first step (as the first batch of a
    run does).

    Example:
        >>> from rlkit.envs import make_env
        >>> from rlkit.modules.actors import make_actor
        >>> env = make_env("CartPole-v1", num_envs=2, seed=0)
        >>> actor = make_actor(env.observation_spec, env.action_spec)
        >>> chunks = VectorEnvCollector(env, actor, frames_per_batch=16)
        >>> batch = next(iter(EpisodeBatches(chunks, min_frames=40)))  # ceil(40 / 16) = 3
        >>> batch.batch_size
        torch.Size([2, 24])
        >>> chunks.shutdown()
    """

    def __init__(
        self,
        collector: Any,
        *,
        min_episodes: int | None = None,
        min_frames: int | None = None,
        agree: Any = None,
    ) -> None:
        if min_episodes is None and min_frames is None:
            raise ValueError("EpisodeBatches needs min_episodes or min_frames (or both)")
        for name, value in (("min_episodes", min_episodes), ("min_frames", min_frames)):
            if value is not None:
                _check_positive_int(f"EpisodeBatches: {name}", value)
        self.collector = collector
        self.min_episodes, self.min_frames, self.agree = min_episodes, min_frames, agree
        #: per row: whether its next step is an episode's first (None: every row, at start)
        self._fresh: Tensor | None = None
        #: chunks and complete episodes in the last batch
        self.chunks = 0
        self.episodes = 0

    def __iter__(self) -> Iterator[TensorDictBase]:
        chunks = iter(self.collector)
        while True:
            yield self._gather(chunks)

    iterator = __iter__

    def update_policy_weights_(self) -> None:
        self.collector.update_policy_weights_()

    def shutdown(self, *args: Any, **kwargs: Any) -> None:
        self.collector.shutdown(*args, **kwargs)

    def _enough(self, episodes: int, frames: int) -> bool:
        enough = episodes >= (self.min_episodes or 0) and frames >= (self.min_frames or 0)
        return bool(self.agree(enough)) if self.agree is not None else enough

    def _gather(self, chunks: Iterator[TensorDictBase]) -> TensorDictBase:
        parts: list[TensorDictBase] = []
        episodes = frames = 0
        started: Tensor | None = None  # per row: an episode began inside this batch
        while True:
            chunk = next(chunks)
            parts.append(chunk)
            frames += chunk.numel()
            time_dim = _time_dim(chunk)
            done = chunk.get(keys.DONE).reshape(chunk.shape).movedim(time_dim, -1)
            done = done.reshape(-1, done.shape[-1]).cpu()  # [rows, T]
            if started is None:
                fresh = self._fresh
                started = torch.ones(done.shape[0], dtype=torch.bool) if fresh is None else fresh
            ends = done.sum(-1)
            # a row's first end closes an episode that began before this batch unless the
            # row started fresh (or had already ended one episode inside it)
            episodes += int((ends - ((ends > 0) & ~started).long()).sum())
            started = started | (ends > 0)
            if self._enough(episodes, frames):
                break
        self._fresh = done[:, -1].clone()
        self.chunks, self.episodes = len(parts), episodes
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=time_dim)


def _time_dim(batch: TensorDictBase) -> int:
    """The batch dim named ``keys.TIME_DIM_NAME``, else the last one."""
    names = batch.names if batch.batch_dims else []
    return names.index(keys.TIME_DIM_NAME) if keys.TIME_DIM_NAME in names else batch.batch_dims - 1
