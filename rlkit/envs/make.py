"""Gymnasium ids -> batched, truncation-correct TorchRL environments.

The fast path measured here (``benchmarks/bench_env.py``) is one process stepping a
gymnasium ``SyncVectorEnv`` with auto-reset **disabled**, wrapped by TorchRL's
``GymWrapper``: TorchRL itself resets the sub-environments that finished, through
gymnasium's ``reset(options={"reset_mask": ...})``. Compared with the ``SAME_STEP``
auto-reset mode this needs no per-step parsing of gymnasium's ``final_obs`` info dict
(about 1.5x more frames per second through a TorchRL ``Collector``), no dummy rollout at
construction, and it is the mode TorchRL's ``GymWrapper`` calls preferred. Either way the
step's ``("next", "observation")`` is the true observation reached, also at done steps, and
the next row's ``"observation"`` is the reset one: gymnasium never replaces one with the other.

TorchRL's ``Collector`` needs no special configuration: its default ``step_and_maybe_reset``
loop resets exactly the finished sub-envs once, after the step's transforms ran.
``tests/test_envs.py`` checks a two-batch ``Collector(env, policy, frames_per_batch=200,
total_frames=400, auto_register_policy_transforms=False)`` run with a 20-step limit against a
plain gymnasium loop replaying the same seeds and actions: every observation, reward, flag,
return and step count agrees, every non-done step chains and no done step does.
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium
import numpy as np
import torch
from gymnasium import spaces
from torchrl.data import (
    Binary,
    Bounded,
    Categorical,
    Composite,
    MultiCategorical,
    TensorSpec,
    Unbounded,
)
from torchrl.envs import (
    Compose,
    DoubleToFloat,
    EnvBase,
    GymWrapper,
    RewardSum,
    SerialEnv,
    SignTransform,
    StepCounter,
    Transform,
    TransformedEnv,
)

from rlkit import keys
from rlkit.envs.errors import EnvFault
from rlkit.envs.ids import factory_path, resolve_env
from rlkit.envs.suites import register_suite, suite_make_kwargs, suite_of, suite_wrappers
from rlkit.modules.normalization import ObservationNorm, RewardNorm

__all__ = [
    "TruncationAsTermination",
    "check_same_spaces",
    "get_obs_norm",
    "get_reward_norm",
    "make_env",
    "make_eval_env",
    "reseed",
]

GymWrapperFn = Callable[[gymnasium.Env], gymnasium.Env]

# Box2D's SWIG bindings warn on import (Python >= 3.12 style DeprecationWarning about
# builtin types with no __module__); harmless and not actionable for rlkit users.
_SWIG_IMPORT_WARNING = r"builtin type (SwigPy\w+|swigvarlink) has no __module__ attribute"


class TruncationAsTermination(gymnasium.Wrapper):
    """Report a truncated step as terminated too (``terminated = terminated or truncated``;
    ``truncated`` is kept), so every learner treats a time limit as the end of the return:
    no bootstrap from the state reached. ``make_env(..., bootstrap_truncated=False)`` and
    ``--bootstrap-truncated false`` put it after gymnasium's ``TimeLimit``."""

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, bool(terminated or truncated), truncated, info


class _SyncVectorGymWrapper(GymWrapper):
    """``GymWrapper`` for a gymnasium vector env whose auto-reset mode is ``DISABLED``.

    TorchRL 0.14.1 builds the ``reset_mask`` as ``reset.view(...).numpy()``, which fails
    for a full ``env.reset(td)`` whose TensorDict has no ``"_reset"`` entry
    (``AttributeError: 'NoneType' object has no attribute 'view'``) and for a mask that
    lives on a GPU. Here: no mask means reset all sub-envs, and the mask goes through CPU.
    """

    #: a Dict / Tuple action: the gymnasium space, its entries' names (None otherwise)
    _structured: tuple[spaces.Space, list[str]] | None = None

    def _make_specs(self, env: Any, batch_size: Any = None) -> None:
        """TorchRL's specs, with MultiDiscrete actions as ``MultiCategorical(nvec)``,
        MultiBinary as ``Binary(k)`` and Dict / Tuple actions as a ``Composite`` under
        ``"action"`` (TorchRL 0.14.1's GymWrapper fails on those: "spec.shape must match the
        env batch size", "Stacking specs cannot occur")."""
        space = getattr(env, "single_action_space", None)
        if not isinstance(
            space, spaces.Dict | spaces.Tuple | spaces.MultiDiscrete | spaces.MultiBinary
        ):
            return super()._make_specs(env, batch_size)
        batch = tuple(self.batch_size)
        batched_space = env.action_space
        try:  # TorchRL reads the rest; the action spec is built here
            env.action_space = spaces.Box(-1.0, 1.0, (*batch, 1), np.float32)
            super()._make_specs(env, batch_size)
        finally:
            env.action_space = batched_space
        if isinstance(space, spaces.Dict | spaces.Tuple):
            entries = _action_entries(space)
            self._structured = (space, list(entries))
            leaves = {name: _action_leaf(entry, batch) for name, entry in entries.items()}
            leaf: Any = Composite(leaves, shape=batch)
        else:
            leaf = _action_leaf(space, batch)
        self.full_action_spec = Composite({keys.ACTION: leaf}, shape=batch)

    def read_action(self, action: Any) -> Any:
        if self._structured is None:
            return super().read_action(action)
        return self.structured_to_numpy(action[keys.ACTION])

    def structured_to_numpy(self, action: Any) -> Any:
        """A Dict action (a TensorDict or dict of parts) as the gymnasium vector env takes
        it: a dict of batched arrays, or a tuple of them for a Tuple space."""
        space, names = self._structured
        spec = self.full_action_spec[keys.ACTION]
        parts = {name: spec[name].to_numpy(action[name], safe=False) for name in names}
        if isinstance(space, spaces.Tuple):
            return tuple(parts[name] for name in names)
        return parts

    def _replace_reset(self, reset: torch.Tensor | None, kwargs: dict) -> dict:
        if reset is not None and bool(reset.any()):
            mask = reset.reshape(self.batch_size).cpu().numpy()
            kwargs.setdefault("options", {})["reset_mask"] = mask
        return kwargs


def _action_leaf(space: spaces.Space, batch: tuple[int, ...]) -> TensorSpec:
    """The TorchRL spec of one (flat) gymnasium action space, batched over ``batch``."""
    if isinstance(space, spaces.Discrete):
        return Categorical(int(space.n), shape=batch, dtype=torch.int64)
    if isinstance(space, spaces.MultiDiscrete):
        nvec = torch.as_tensor(np.asarray(space.nvec), dtype=torch.int64)
        return MultiCategorical(nvec.expand(*batch, -1), shape=(*batch, len(nvec)))
    if isinstance(space, spaces.MultiBinary):
        return Binary(int(space.shape[0]), shape=(*batch, int(space.shape[0])), dtype=torch.int8)
    low = torch.as_tensor(space.low, dtype=torch.float32).expand(*batch, *space.shape)
    high = torch.as_tensor(space.high, dtype=torch.float32).expand(*batch, *space.shape)
    if torch.isfinite(low).all() and torch.isfinite(high).all():
        return Bounded(low=low, high=high, shape=(*batch, *space.shape), dtype=torch.float32)
    return Unbounded(shape=(*batch, *space.shape), dtype=torch.float32)


def _check_env_id(env_id: str) -> None:
    if not isinstance(env_id, str):
        raise TypeError(
            f"env_id must be a gymnasium id string or an env factory (a callable returning an "
            f"env), got {type(env_id).__name__}"
        )
    register_suite(env_id)  # MinAtar/* and ALE/* ids, on first use (rlkit.envs.suites)
    try:
        gymnasium.spec(env_id)
    except gymnasium.error.Error as err:
        close = difflib.get_close_matches(env_id, list(gymnasium.registry), n=3, cutoff=0.6)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise ValueError(
            f"unknown environment id {env_id!r}{hint} "
            "(gymnasium.pprint_registry() lists the registered ids)"
        ) from err


#: Names a Dict observation entry may not take: the TensorDict keys the env and its
#: transforms write besides the observation.
_RESERVED_OBS_NAMES = (
    keys.NEXT,
    keys.ACTION,
    keys.REWARD[-1],
    keys.DONE[-1],
    keys.TERMINATED[-1],
    "truncated",
    keys.EPISODE_RETURN_NAME,
    keys.STEP_COUNT_NAME,
    "_reset",
)


def _check_spaces(env_id: str, venv: gymnasium.vector.VectorEnv) -> None:
    obs_space, act_space = venv.single_observation_space, venv.single_action_space
    if isinstance(obs_space, spaces.Dict):
        _check_dict_space(env_id, obs_space)
        _check_action_mask(env_id, obs_space, act_space)
    elif not isinstance(obs_space, spaces.Box | spaces.Discrete):
        raise ValueError(
            f"{env_id!r} has observation space {obs_space}; make_env supports Box, Discrete "
            "and Dict-of-Box/Discrete observations (flatten Tuple or nested observations "
            "with a gymnasium wrapper such as gymnasium.wrappers.FlattenObservation, passed "
            "in wrappers=)"
        )
    if isinstance(act_space, spaces.Dict | spaces.Tuple):
        entries = _action_entries(act_space)
        if not entries:
            raise ValueError(f"{env_id!r} has an empty action space {act_space}")
        for name, entry in entries.items():
            box_vector = not isinstance(entry, spaces.Box) or len(entry.shape) == 1
            if not (_flat_action(entry) and box_vector) or isinstance(entry, spaces.MultiDiscrete):
                raise ValueError(
                    f"{env_id!r} has action space {' '.join(str(act_space).split())}, whose entry "
                    f"{name!r} is {' '.join(str(entry).split())}; "
                    "make_env supports Dict / Tuple actions of Discrete, MultiBinary and "
                    "Box(d) entries (flatten nested ones with a gymnasium ActionWrapper)"
                )
            _check_action_entry(env_id, entry)
    elif not _flat_action(act_space):
        one_line = " ".join(str(act_space).split())
        raise ValueError(
            f"{env_id!r} has action space {one_line}; make_env supports Box (continuous), "
            "Discrete, MultiDiscrete and MultiBinary actions (one dimension) and Dict / Tuple "
            "actions of Discrete, MultiBinary and Box entries"
        )
    else:
        _check_action_entry(env_id, act_space)


def _flat_action(space: spaces.Space) -> bool:
    """A Box, Discrete, or a one-dimensional MultiDiscrete / MultiBinary action space."""
    if isinstance(space, spaces.MultiDiscrete | spaces.MultiBinary):
        return len(space.shape) == 1
    return isinstance(space, spaces.Box | spaces.Discrete)


def _check_action_entry(env_id: str, space: spaces.Space) -> None:
    start = getattr(space, "start", 0)
    if isinstance(space, spaces.Discrete | spaces.MultiDiscrete) and np.any(start != 0):
        raise ValueError(
            f"{env_id!r} has action space {space} with start={start}; make_env supports "
            "Discrete and MultiDiscrete actions numbered from 0"
        )


def _action_entries(space: spaces.Dict | spaces.Tuple) -> dict[str, spaces.Space]:
    """A Dict action's entries by name; a Tuple's named ``"0"``, ``"1"``, ... (TensorDict keys)."""
    if isinstance(space, spaces.Tuple):
        return {str(i): entry for i, entry in enumerate(space.spaces)}
    return dict(space.spaces)


def _mask_width(act_space: spaces.Space) -> int | None:
    """How many flags an action mask holds: one per action of a Discrete space, ``sum(nvec)``
    for a MultiDiscrete one (the gymnasium / PettingZoo convention); None: no mask fits."""
    if isinstance(act_space, spaces.Discrete):
        return int(act_space.n)
    if isinstance(act_space, spaces.MultiDiscrete) and len(act_space.shape) == 1:
        return int(np.sum(act_space.nvec))
    return None


def _check_dict_space(env_id: str, obs_space: spaces.Dict) -> None:
    """A flat Dict of Box / Discrete entries whose names do not collide with the env's keys."""
    if not obs_space.spaces:
        raise ValueError(f"{env_id!r} has an empty Dict observation space")
    for name, entry in obs_space.spaces.items():
        if name == keys.ACTION_MASK and isinstance(entry, spaces.MultiBinary):
            continue  # a mask as MultiBinary(n): checked by _check_action_mask
        if not isinstance(entry, spaces.Box | spaces.Discrete):
            raise ValueError(
                f"{env_id!r} has Dict observation entry {name!r} of space {entry}; make_env "
                "supports Box and Discrete entries (flatten nested ones with a gymnasium "
                "wrapper passed in wrappers=)"
            )
        if name in _RESERVED_OBS_NAMES:
            raise ValueError(
                f"{env_id!r} has a Dict observation entry named {name!r}, a key the env "
                f"writes itself ({', '.join(map(repr, _RESERVED_OBS_NAMES))} are taken): "
                "rename it with a gymnasium wrapper"
            )


def _check_action_mask(env_id: str, obs_space: spaces.Dict, act_space: spaces.Space) -> None:
    """A Dict observation's ``"action_mask"`` entry (PettingZoo's convention): one integer or
    bool flag per action of a Discrete action space, ``sum(nvec)`` flags for a MultiDiscrete
    one, each entry's choices in turn (docs/actions.md)."""
    entry = obs_space.spaces.get(keys.ACTION_MASK)
    if entry is None:
        return
    n = _mask_width(act_space)
    if n is None:
        return  # the recipe refuses it in one line (rlkit.modules.masks.refuse_mask)
    shape = tuple(entry.shape or ())
    floating = np.issubdtype(entry.dtype, np.floating) if entry.dtype is not None else True
    if shape != (n,) or floating or isinstance(entry, spaces.Discrete):
        per = "action" if isinstance(act_space, spaces.Discrete) else "choice of every entry"
        raise ValueError(
            f"{env_id!r} has an {keys.ACTION_MASK!r} observation entry {entry}; an action mask "
            f"holds one integer or bool flag per {per}: Box(0, 1, ({n},), int8) or MultiBinary"
            f"({n}) (nonzero: the action may be taken)"
        )


def _make_vector_env(
    env_id: str,
    *,
    num_envs: int,
    max_episode_steps: int | None,
    render_mode: str | None,
    env_kwargs: Mapping[str, Any] | None,
    wrappers: Sequence[GymWrapperFn],
    evaluation: bool = False,
) -> gymnasium.vector.VectorEnv:
    kwargs = {**suite_make_kwargs(env_id), **(env_kwargs or {})}
    wrappers = [*suite_wrappers(env_id, training=not evaluation), *wrappers]
    if max_episode_steps is not None:
        kwargs["max_episode_steps"] = max_episode_steps  # gymnasium's TimeLimit truncates
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", _SWIG_IMPORT_WARNING, DeprecationWarning)
        try:
            return gymnasium.make_vec(
                env_id,
                num_envs=num_envs,
                vectorization_mode="sync",
                vector_kwargs={"autoreset_mode": gymnasium.vector.AutoresetMode.DISABLED},
                wrappers=list(wrappers),
                **kwargs,
            )
        except gymnasium.error.DependencyNotInstalled as err:
            said = " ".join(str(err).split())
            extra = 'pip install -e ".[mujoco]"' if "mujoco" in said.lower() else said
            raise ValueError(
                f"{env_id} needs a package that is not installed ({said}): {extra}"
            ) from None
        except TypeError as err:
            if not env_kwargs or "unexpected keyword argument" not in str(err):
                raise
            raise ValueError(
                f"{env_id} does not take the argument(s) {sorted(env_kwargs)} given by "
                f"--env-kwargs / env_kwargs ({str(err).split(' was raised')[0]}): drop or "
                "rename them; the env's constructor lists what it takes"
            ) from None


def _check_args(num_envs: int, max_episode_steps: int | None, gamma: float) -> None:
    if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
        raise ValueError(f"num_envs must be an int >= 1, got {num_envs!r}")
    if max_episode_steps is not None and (
        isinstance(max_episode_steps, bool)
        or not isinstance(max_episode_steps, int)
        or max_episode_steps < 1
    ):
        raise ValueError(
            f"max_episode_steps must be an int >= 1 or None (the id's default), "
            f"got {max_episode_steps!r}"
        )
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must lie in [0, 1], got {gamma}")


def make_env(
    env_id: str | Callable[..., Any],
    *,
    num_envs: int = 1,
    seed: int | Sequence[int] | None = None,
    max_episode_steps: int | None = None,
    normalize_obs: bool = False,
    obs_norm: ObservationNorm | None = None,
    normalize_reward: bool = False,
    gamma: float = 0.99,
    device: torch.device | str = "cpu",
    render_mode: str | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    wrappers: Sequence[GymWrapperFn] = (),
    evaluation: bool = False,
    bootstrap_truncated: bool = True,
) -> TransformedEnv:
    """Build ``num_envs`` copies of a gymnasium env as one TorchRL env, batch ``[num_envs]``.

    One process steps a gymnasium ``SyncVectorEnv`` (auto-reset disabled; TorchRL resets
    finished sub-envs), see the module docstring for why this path.

    Keys written (``N = num_envs``):

    - ``observation`` / ``("next", "observation")`` ``[N, *O]`` float32 (or int64 ``[N]``
      for a Discrete observation space); the ``"next"`` one is the true observation
      reached, also at done steps, never the reset observation.
    - a ``Dict`` observation space (of Box / Discrete entries) writes each entry under its
      own key instead (``"position"``, ``("next", "position")``, ...; float64 entries cast
      to float32), so an actor and a critic can read different entries
      (``make_actor(..., obs_key="position")``, ``make_value(..., obs_key="velocity")``).
      Entry names may not be keys the env writes (``"reward"``, ``"done"``, ...), and
      ``normalize_obs`` applies to a single Box observation only.
    - ``("next", "reward")`` ``[N, 1]`` float32.
    - ``("next", "terminated" | "truncated" | "done")`` ``[N, 1]`` bool; truncation comes
      from gymnasium's ``TimeLimit`` (``max_episode_steps``).
    - ``keys.EPISODE_RETURN`` ``[N, 1]`` float32: undiscounted return so far (TorchRL
      ``RewardSum``, always in the environment's reward units); ``keys.STEP_COUNT``
      ``[N, 1]`` int64: steps taken in the episode (TorchRL ``StepCounter``).
    - ``action`` is read as int64 ``[N]`` for Discrete spaces, float32 ``[N, *A]`` for Box.

    Args:
        env_id: a gymnasium id, e.g. ``"CartPole-v1"``; gymnasium's ``"module:Env-vN"``
            (the module is imported first: it registers its ids); or an env factory, a
            callable or its ``"module:qualname"`` (:mod:`rlkit.envs.ids`), see "Env
            factories" below.
        num_envs: number of sub-environments, ``>= 1``.
        seed: seeds sub-env ``i`` with ``seed + i`` (gymnasium's convention) by one reset
            at construction; later resets continue the seeded generators, so equal seeds
            and equal actions give equal rollouts. A sequence of ``num_envs`` ints seeds each
            sub-env with its own (a population's members, each block as its own run's).
            ``None``: unseeded.
        max_episode_steps: time limit; ``None`` keeps the id's registered limit.
        normalize_obs: append an :class:`ObservationNorm` with fresh statistics.
        obs_norm: an :class:`ObservationNorm` to use instead (implies ``normalize_obs``).
            If it already belongs to an env, this env gets ``obs_norm.shared()``: a view
            on the same statistics, so both envs read and update the same numbers.
        normalize_reward: append a :class:`RewardNorm` (scale by the running std of the
            discounted return with discount ``gamma``).
        gamma: discount used by ``normalize_reward``.
        device: where the env's tensors live. On the CPU the env is built without a
            TensorDict device (``env.device is None``, tensors on the CPU): TorchRL then
            skips its per-step device casts, which cost about 20% of CartPole collection
            speed here; any other device is set on the env.
        render_mode: passed to ``gymnasium.make``.
        env_kwargs: extra keyword arguments for ``gymnasium.make`` (e.g.
            ``{"continuous": True}`` for LunarLander).
        wrappers: gymnasium wrapper constructors applied to each sub-env, in order, after
            gymnasium's own (``TimeLimit`` included), e.g. ``[FlattenObservation]``.
        bootstrap_truncated: ``False`` marks every truncated step terminated too
            (:class:`TruncationAsTermination`, after gymnasium's ``TimeLimit``), so value
            targets do not bootstrap there: CleanRL's ``ppo.py`` and gymnax's envs. The
            default keeps truncations apart, and the learners bootstrap from them.
        evaluation: build the evaluation variant of a pixel suite's protocol
            (:mod:`rlkit.envs.suites`; ``ALE/*``: no episode end at a life loss, raw
            rewards); other ids are built the same either way.

    ``MinAtar/<Game>-v1`` and ``ALE/<Game>-v5`` ids are registered on first use and get
    their suite's protocol (:mod:`rlkit.envs.suites`): ``uint8`` observations, MinAtar
    ``[N, 10, 10, C]`` in ``{0, 255}``, ALE ``[N, 4, 84, 84]`` stacked grayscale frames
    with sign-clipped training rewards (``keys.EPISODE_RETURN`` stays the raw score).

    Env factories: a callable that returns a gymnasium env, a gymnasium vector env or a
    TorchRL ``EnvBase``. Without a ``num_envs`` parameter it is called once per sub-env
    (a gymnasium env's copies are stepped by one ``SyncVectorEnv`` as an id's are, so
    :class:`~rlkit.data.collector.VectorEnvCollector` steps them; an ``EnvBase``'s by one
    TorchRL ``SerialEnv``); with one, once, as ``factory(num_envs=N)``, and must return
    that many (a gymnasium vector env with ``autoreset_mode`` ``DISABLED`` or a batched
    ``EnvBase`` of batch size ``[N]``). A factory with a ``seed`` parameter is called with
    its sub-env's seed (``seed + i``, or ``seed[i]``; the first one for ``num_envs``
    factories); either way every sub-env is then seeded as an id's is: gymnasium's
    ``reset(seed=...)``, or ``set_seed`` of each ``EnvBase``. ``env_kwargs`` are passed to
    the factory as keyword arguments, ``render_mode`` too (``--video``) when it takes one.
    ``max_episode_steps`` wraps a gymnasium env in ``TimeLimit`` and sets an ``EnvBase``'s
    ``StepCounter(max_steps=...)``; ``wrappers`` and ``bootstrap_truncated=False`` apply to
    gymnasium envs only. The keys written are those above, and an ``EnvBase`` must write
    ``observation`` (or its own observation keys), ``reward``, ``done`` and ``terminated``.

    Raises:
        ValueError: unknown id (with close matches), unimportable module, unsupported
            spaces, bad numbers.

    Example:
        >>> env = make_env("CartPole-v1", num_envs=4, seed=0)
        >>> td = env.rollout(3)
        >>> td["next", "observation"].shape, td["action"].dtype
        (torch.Size([4, 3, 4]), torch.int64)
    """
    source = resolve_env(env_id) if isinstance(env_id, str) else env_id
    if callable(source):
        _check_args(num_envs, max_episode_steps, gamma)
        return _make_from_factory(
            source,
            name=env_id if isinstance(env_id, str) else factory_path(env_id),
            num_envs=num_envs,
            seed=seed,
            max_episode_steps=max_episode_steps,
            render_mode=render_mode,
            env_kwargs=env_kwargs,
            wrappers=wrappers if bootstrap_truncated else [*wrappers, TruncationAsTermination],
            device=device,
            norms=dict(
                normalize_obs=normalize_obs,
                obs_norm=obs_norm,
                normalize_reward=normalize_reward,
                gamma=gamma,
            ),
        )
    env_id = source  # a module:Env-vN id without its module, the module imported
    _check_env_id(env_id)
    _check_args(num_envs, max_episode_steps, gamma)
    venv = _make_vector_env(
        env_id,
        num_envs=num_envs,
        max_episode_steps=max_episode_steps,
        render_mode=render_mode,
        env_kwargs=env_kwargs,
        wrappers=wrappers if bootstrap_truncated else [*wrappers, TruncationAsTermination],
        evaluation=evaluation,
    )
    try:
        _check_spaces(env_id, venv)
        env_device = None if torch.device(device).type == "cpu" else torch.device(device)
        base = _SyncVectorGymWrapper(venv, categorical_action_encoding=True, device=env_device)
        transforms = _transforms(
            env_id,
            base,
            normalize_obs=normalize_obs,
            obs_norm=obs_norm,
            normalize_reward=normalize_reward,
            gamma=gamma,
            clip_reward=suite_of(env_id) == "ALE" and not evaluation,
        )
    except ValueError:
        venv.close()
        raise
    if isinstance(seed, Sequence) and len(seed) != num_envs:
        venv.close()
        raise ValueError(f"make_env: {len(seed)} seeds for num_envs={num_envs} sub-envs")
    if seed is not None:
        _first_reset(base, seed, env_id)
    return TransformedEnv(base, Compose(*transforms))


# --------------------------------------------------------------------------- env factories


def _parameters(factory: Callable[..., Any]) -> tuple[set[str], bool]:
    """The keyword names ``factory`` takes, and whether it takes ``**kwargs``."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: call it with no arguments
        return set(), False
    named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return named, any(p.kind is p.VAR_KEYWORD for p in params)


def _seed_list(seed: int | Sequence[int] | None, n: int) -> list[int] | None:
    if seed is None:
        return None
    if isinstance(seed, Sequence):
        if len(seed) != n:
            raise ValueError(f"make_env: {len(seed)} seeds for num_envs={n} sub-envs")
        return [int(s) for s in seed]
    return [int(seed) + i for i in range(n)]


def _call_factory(factory, name: str, kwargs: dict[str, Any], seed: int | None):
    named, var_kw = _parameters(factory)
    if seed is not None and "seed" in named:
        kwargs = {**kwargs, "seed": seed}
    missing = [k for k in kwargs if k not in named and k != "seed" and not var_kw]
    if missing:
        raise ValueError(
            f"env factory {name!r} takes no argument {missing[0]!r} (given by --env-kwargs, "
            "or render_mode for --video): add it to the factory's parameters or drop it"
        )
    return factory(**kwargs)


def _make_from_factory(
    factory: Callable[..., Any],
    *,
    name: str,
    num_envs: int,
    seed: int | Sequence[int] | None,
    max_episode_steps: int | None,
    render_mode: str | None,
    env_kwargs: Mapping[str, Any] | None,
    wrappers: Sequence[GymWrapperFn],
    device: torch.device | str,
    norms: dict[str, Any],
) -> TransformedEnv:
    """:func:`make_env` for an env factory (see its docstring)."""
    seeds = _seed_list(seed, num_envs)
    kwargs = dict(env_kwargs or {})
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    batched = "num_envs" in _parameters(factory)[0]
    if batched:
        kwargs["num_envs"] = num_envs
    env = _call_factory(factory, name, kwargs, None if seeds is None else seeds[0])
    env_device = None if torch.device(device).type == "cpu" else torch.device(device)
    if isinstance(env, EnvBase):
        if wrappers:
            env.close()
            raise ValueError(
                f"env factory {name!r} returns a TorchRL env: gymnasium wrappers and "
                "--bootstrap-truncated false apply to gymnasium envs; append TorchRL "
                "transforms in the factory instead"
            )
        base = _batched_envbase(factory, name, env, kwargs, seeds, num_envs, batched)
        if env_device is not None:
            base = base.to(env_device)
    else:
        venv = _factory_vector_env(
            factory, name, env, kwargs, seeds, num_envs, batched, wrappers, max_episode_steps
        )
        try:
            _check_spaces(name, venv)
        except ValueError:
            venv.close()
            raise
        base = _SyncVectorGymWrapper(venv, categorical_action_encoding=True, device=env_device)
    steps = max_episode_steps if isinstance(env, EnvBase) else None
    try:
        transforms = _transforms(name, base, **norms, max_steps=steps)
    except ValueError:
        base.close()
        raise
    if seeds is not None:
        _first_reset(base, seeds, name)
    return TransformedEnv(base, Compose(*transforms))


def _batched_envbase(factory, name, env, kwargs, seeds, num_envs, batched) -> EnvBase:
    """The factory's TorchRL env as one env of batch size ``[num_envs]``."""
    if batched:
        if tuple(env.batch_size) != (num_envs,):
            env.close()
            raise ValueError(
                f"env factory {name!r} was asked for num_envs={num_envs} and returned a TorchRL "
                f"env of batch size {list(env.batch_size)}: return batch size [{num_envs}]"
            )
        return env
    if tuple(env.batch_size) != ():
        env.close()
        raise ValueError(
            f"env factory {name!r} returns a batched TorchRL env (batch size "
            f"{list(env.batch_size)}): give the factory a num_envs parameter and return that "
            "many, or return one unbatched env (rlkit batches the copies)"
        )
    env.close()  # the probe: SerialEnv calls the factory for each sub-env itself

    def one(i: int):
        return lambda: _call_factory(factory, name, kwargs, None if seeds is None else seeds[i])

    return SerialEnv(num_envs, [one(i) for i in range(num_envs)])


def _check_factory_vector_env(name, env, num_envs, batched, wrappers, max_episode_steps):
    """A factory's gymnasium vector env, as the collectors step one: ``num_envs`` sub-envs,
    auto-reset disabled, no per-sub-env options left to apply."""
    mode = getattr(env, "autoreset_mode", None) or env.metadata.get("autoreset_mode")
    problem = None
    if not batched:
        problem = "returns a gymnasium vector env: give it a num_envs parameter"
    elif env.num_envs != num_envs:
        problem = f"was asked for num_envs={num_envs} and returned {env.num_envs} sub-envs"
    elif mode != gymnasium.vector.AutoresetMode.DISABLED:
        problem = (
            f"returns a vector env with autoreset_mode={mode}: build it with "
            "vector_kwargs={'autoreset_mode': gymnasium.vector.AutoresetMode.DISABLED}"
        )
    elif wrappers or max_episode_steps is not None:
        problem = (
            "returns a vector env: --max-episode-steps, wrappers and --bootstrap-truncated "
            "false apply to single gymnasium envs; set them inside the factory"
        )
    if problem:
        env.close()
        raise ValueError(f"env factory {name!r} {problem}")


def _factory_vector_env(
    factory, name, env, kwargs, seeds, num_envs, batched, wrappers, max_episode_steps
) -> gymnasium.vector.VectorEnv:
    """The factory's gymnasium env(s) as one vector env of ``num_envs`` sub-envs, auto-reset
    disabled (TorchRL resets the finished ones), as :func:`_make_vector_env` builds an id's."""
    if isinstance(env, gymnasium.vector.VectorEnv):
        _check_factory_vector_env(name, env, num_envs, batched, wrappers, max_episode_steps)
        return env
    if not isinstance(env, gymnasium.Env):
        raise TypeError(
            f"env factory {name!r} returned {type(env).__name__}: return a gymnasium env, a "
            "gymnasium vector env or a TorchRL EnvBase"
        )
    if batched:
        env.close()
        raise ValueError(
            f"env factory {name!r} takes num_envs but returned one gymnasium env: return a "
            "vector env of num_envs sub-envs, or drop the parameter (rlkit makes the copies)"
        )

    def wrap(e: gymnasium.Env) -> gymnasium.Env:
        if max_episode_steps is not None:
            e = gymnasium.wrappers.TimeLimit(e, max_episode_steps)
        for w in wrappers:
            e = w(e)
        return e

    def one(i: int):
        if i == 0:
            return lambda: wrap(env)
        return lambda: wrap(
            _call_factory(factory, name, kwargs, None if seeds is None else seeds[i])
        )

    return gymnasium.vector.SyncVectorEnv(
        [one(i) for i in range(num_envs)],
        autoreset_mode=gymnasium.vector.AutoresetMode.DISABLED,
    )


def _first_reset(base: EnvBase, seed: int | Sequence[int], name: str) -> None:
    """:func:`_seed` at construction: an env that raises there is closed and named in one
    :class:`~rlkit.envs.errors.EnvFault` line (a traceback from inside gymnasium before)."""
    try:
        _seed(base, seed)
    except Exception as err:
        with contextlib.suppress(Exception):
            base.close()
        message = " ".join(str(err).split()) or "(no message)"
        raise EnvFault(
            f"env {str(name)!r} raised in reset() (its first, seeded at construction): "
            f"{type(err).__name__}: {message}"
        ) from err


def _seed(base: EnvBase, seed: int | Sequence[int]) -> None:
    if isinstance(base, SerialEnv):  # sub-env i with seed + i (or seed[i]), as gymnasium's
        if base.is_closed:
            base.start()
        for env, s in zip(base._envs, _seed_list(seed, int(base.batch_size[0])), strict=True):
            env.set_seed(s)
        return
    if isinstance(seed, Sequence):
        base.reset(seed=[int(s) for s in seed])  # gymnasium seeds sub-env i with seeds[i]
    else:
        base.set_seed(seed)


def reseed(env: EnvBase, seed: int | Sequence[int]) -> None:
    """Seed an env :func:`make_env` built again, as ``make_env(..., seed=seed)`` seeds it
    (sub-env ``i`` with ``seed + i``, or with ``seed[i]``): its next reset starts the
    episodes those seeds give. A resumed run uses it so that its envs do not replay the
    run's first episodes."""
    base = env.base_env if isinstance(env, TransformedEnv) else env
    if isinstance(seed, Sequence) and len(seed) != int(base.batch_size[0]):
        raise ValueError(f"reseed: {len(seed)} seeds for {int(base.batch_size[0])} sub-envs")
    _seed(base, seed)


def _transforms(
    env_id: str,
    base: EnvBase,
    *,
    normalize_obs: bool,
    obs_norm: ObservationNorm | None,
    normalize_reward: bool,
    gamma: float,
    clip_reward: bool = False,
    max_steps: int | None = None,
) -> list[Transform]:
    """Float casts, optional observation normaliser, return and step trackers, reward norm
    (``clip_reward``: the reward's sign, after the return tracker, so returns stay raw)."""
    obs_keys = list(base.observation_spec.keys(True, True))
    transforms: list[Transform] = []
    doubles = [k for k in obs_keys if base.observation_spec[k].dtype == torch.float64]
    if doubles:
        transforms.append(DoubleToFloat(in_keys=doubles))
    # an action mask beside the observation is not observed: normalise "observation" alone
    observed = [k for k in obs_keys if k != keys.ACTION_MASK]
    if (obs_norm is not None or normalize_obs) and observed != [keys.OBSERVATION]:
        raise ValueError(
            f"{env_id!r} has Dict observations {[str(k) for k in obs_keys]}; "
            "observation normalisation applies to a single Box observation: append "
            "rlkit.modules.ObservationNorm(shape, key=...) per entry to the env yourself"
        )
    obs_spec = base.observation_spec[(observed or obs_keys)[0]]
    if obs_norm is not None or normalize_obs:
        if not obs_spec.dtype.is_floating_point:
            raise ValueError(
                f"{env_id!r} has {obs_spec.dtype} (discrete) observations; observation "
                "normalisation applies to continuous (Box) observations only"
            )
        shape = obs_spec.shape[base.batch_dims :]
        if obs_norm is None:
            obs_norm = ObservationNorm(shape)
        elif obs_norm.stats.shape != shape:
            raise ValueError(
                f"obs_norm holds statistics of shape {tuple(obs_norm.stats.shape)} but "
                f"{env_id!r} has observations of shape {tuple(shape)}"
            )
        elif obs_norm.parent is not None:
            obs_norm = obs_norm.shared()
        transforms.append(obs_norm)
    transforms.append(RewardSum(in_keys=[keys.REWARD[-1]], out_keys=[keys.EPISODE_RETURN_NAME]))
    transforms.append(StepCounter(max_steps, step_count_key=keys.STEP_COUNT_NAME))
    if clip_reward:  # Mnih et al. 2015: the learner sees sign(r), the logs the game's score
        transforms.append(SignTransform(in_keys=[keys.REWARD[-1]]))
    if normalize_reward:
        transforms.append(RewardNorm(gamma=gamma))
    return transforms


def make_eval_env(
    env_id: str,
    *,
    seed: int | None,
    obs_norm: ObservationNorm | None = None,
    max_episode_steps: int | None = None,
    device: torch.device | str = "cpu",
    render_mode: str | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    wrappers: Sequence[GymWrapperFn] = (),
) -> TransformedEnv:
    """One evaluation env (``num_envs=1``) with raw rewards and frozen observation stats.

    ``obs_norm`` is the training env's normaliser (``get_obs_norm(train_env)``): the
    evaluation env reads the same statistics live and never updates them. Pass it whenever
    the training env normalises observations, or the policy sees unnormalised inputs.
    """
    return make_env(
        env_id,
        num_envs=1,
        seed=seed,
        max_episode_steps=max_episode_steps,
        obs_norm=None if obs_norm is None else obs_norm.shared(update_stats=False),
        device=device,
        render_mode=render_mode,
        env_kwargs=env_kwargs,
        wrappers=wrappers,
        evaluation=True,
    )


def _describe(spec) -> str:
    space = getattr(spec, "space", None)
    n = getattr(space, "n", None)
    return f"{type(spec).__name__}{list(spec.shape)}" + (f"(n={n})" if n is not None else "")


def check_same_spaces(train_env: EnvBase, eval_env: EnvBase, *, train_id: str, eval_id: str):
    """Raise ``ValueError`` unless a policy for ``train_env`` can act in ``eval_env``.

    Per sub-environment, the observation must have the same shape and dtype and the action
    spec must be equal (kind, shape, dtype and bounds); batch sizes may differ.
    """
    tb, eb = len(train_env.batch_size), len(eval_env.batch_size)
    problems = []
    train_keys, eval_keys = _observation_keys(train_env), _observation_keys(eval_env)
    if train_keys != eval_keys:
        problems.append(f"observation keys {train_keys} vs {eval_keys}")
    for key in train_keys if train_keys == eval_keys else ():
        to, eo = train_env.observation_spec[key], eval_env.observation_spec[key]
        if to.shape[tb:] != eo.shape[eb:] or to.dtype != eo.dtype:
            name = "observations" if key == keys.OBSERVATION else f"observation {key!r}"
            problems.append(
                f"{name} {list(to.shape[tb:])} {to.dtype} vs {list(eo.shape[eb:])} {eo.dtype}"
            )
    ta, ea = train_env.action_spec, eval_env.action_spec
    ta, ea = ta[(0,) * tb] if tb else ta, ea[(0,) * eb] if eb else ea
    if ta.to("cpu") != ea.to("cpu"):  # an evaluation env on the GPU has GPU specs
        problems.append(f"actions {_describe(ta)} vs {_describe(ea)}")
    if problems:
        raise ValueError(
            f"--eval-env {eval_id!r} does not match --env {train_id!r}: "
            + "; ".join(problems)
            + ". Evaluate on a task with the same observation and action spaces, or drop --eval-env"
        )


def _observation_keys(env: EnvBase) -> list:
    """The base env's observation keys: ``["observation"]``, or a Dict space's entries."""
    base = env.base_env if isinstance(env, TransformedEnv) else env
    return sorted(base.observation_spec.keys(True, True), key=str)


def _find_transform(env: EnvBase, cls: type[Transform]) -> Any:
    if not isinstance(env, TransformedEnv):
        return None
    found = [t for t in env.transform.modules() if isinstance(t, cls)]
    return found[0] if found else None


def get_obs_norm(env: EnvBase) -> ObservationNorm | None:
    """The :class:`ObservationNorm` inside an env made by :func:`make_env`, or ``None``."""
    return _find_transform(env, ObservationNorm)


def get_reward_norm(env: EnvBase) -> RewardNorm | None:
    """The :class:`RewardNorm` inside an env made by :func:`make_env`, or ``None``."""
    return _find_transform(env, RewardNorm)
