"""Typed recipe configuration and its command line.

A recipe declares a frozen dataclass that extends :class:`TrainConfig`; every field becomes a
``--flag`` whose help text is the field's ``help`` metadata. Values are resolved in this order:
the dataclass default, a per-environment preset (``presets``), ``--config FILE.yaml``, then the
flags typed on the command line. The resolved config is saved in the run directory.

Example::

    @dataclass(frozen=True)
    class MyConfig(TrainConfig):
        lr: float = field(default=3e-4, metadata={"help": "Adam learning rate"})

    cfg = parse_config(MyConfig, ["--lr", "1e-3", "--env", "Pendulum-v1"])
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import functools
import math
import re
import sys
import types
import typing
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rlkit.configs.suites import UNTIMED_SUITES, preset_for, preset_name, suite_key


def _help(text: str, **kw: Any) -> dict[str, Any]:
    return {"help": text, **kw}


# --------------------------------------------------------------------------- read tracking


class _ReadLog:
    """The config fields read while :func:`track_reads` is on (``names``; None: off), and
    how deep :func:`untracked` sections are nested (``paused``)."""

    def __init__(self) -> None:
        self.names: set[str] | None = None
        self.paused = 0


_READS = _ReadLog()

#: reads that do not use a setting: the generated comparisons and repr, and the stdlib's
#: copies (``dataclasses.replace``, ``asdict``, ``copy``, ``pickle``) read every field
_NOT_USES = frozenset({"__eq__", "__repr__", "__hash__"})
_NOT_USING_MODULES = frozenset({"dataclasses", "copy", "copyreg", "pickle"})


def _note_read(name: str) -> None:
    if _READS.paused or _READS.names is None:
        return
    caller = sys._getframe(2)  # _note_read <- __getattribute__ <- the reader
    if caller.f_code.co_name in _NOT_USES or caller.f_globals.get("__name__") in (
        _NOT_USING_MODULES
    ):
        return
    _READS.names.add(name)


def _tracking_getattribute(self: Any, name: str) -> Any:
    """``TrainConfig.__getattribute__`` while reads are recorded (only then: otherwise an
    attribute read costs what a plain dataclass's does)."""
    if name[0] != "_":
        _note_read(name)
    return object.__getattribute__(self, name)


def _record(names: set[str] | None) -> None:
    _READS.names = names
    if names is not None:
        TrainConfig.__getattribute__ = _tracking_getattribute  # type: ignore[method-assign]
    elif "__getattribute__" in TrainConfig.__dict__:
        del TrainConfig.__getattribute__


def start_tracking() -> set[str]:
    """Record the names of the config attributes read (``cfg.lr``, ``getattr(cfg, "lr",
    None)``) on any :class:`TrainConfig` of this process, from now until
    :func:`stop_tracking`, into the set returned (the one already recording, if any).

    Making a config starts it, so what a recipe reads between making its config and the
    engine's first update counts. Validation (``__post_init__``), :func:`to_dict` and the
    stdlib's copies (``dataclasses.replace`` / ``asdict``, ``copy``, ``pickle``) are not
    reads."""
    if _READS.names is None:
        _record(set())
    return _READS.names  # type: ignore[return-value]


def stop_tracking() -> set[str]:
    """Stop recording reads (:func:`start_tracking`); returns the names recorded."""
    names = _READS.names
    _record(None)
    return names if names is not None else set()


@contextlib.contextmanager
def track_reads() -> Iterator[set[str]]:
    """The config attributes read while the block runs, recorded into the set it yields
    (:func:`start_tracking`); the recording in progress before, if any, goes on after."""
    previous, names = _READS.names, set()
    _record(names)
    try:
        yield names
    finally:
        if previous is not None:
            previous |= names
        _record(previous)


@contextlib.contextmanager
def untracked() -> Iterator[None]:
    """Config reads in this block are not recorded by :func:`track_reads` (a config's own
    validation, a copy of every field)."""
    _READS.paused += 1
    try:
        yield
    finally:
        _READS.paused -= 1


def _untracked_call(fn):
    if getattr(fn, "_untracked", False):
        return fn

    def wrapper(self, *args, **kwargs):
        with untracked():
            return fn(self, *args, **kwargs)

    wrapper._untracked = True  # type: ignore[attr-defined]
    wrapper.__name__, wrapper.__qualname__, wrapper.__doc__ = (
        fn.__name__,
        fn.__qualname__,
        fn.__doc__,
    )
    return wrapper


@dataclass(frozen=True)
class TrainConfig:
    """Flags shared by every recipe."""

    env: str = field(
        default="CartPole-v1",
        metadata=_help(
            "gymnasium environment id; MODULE:ID imports MODULE first (it registers ID, "
            "gymnasium's syntax), MODULE:FACTORY calls an env factory of MODULE "
            "(docs/own_env.md)"
        ),
    )
    env_kwargs: tuple[str, ...] | None = field(
        default=None,
        metadata=_help(
            "keyword arguments for gymnasium.make, KEY=VALUE (repeatable; VALUE read as YAML: "
            "0.0, true, text), for the training and evaluation envs, e.g. --env-kwargs "
            "sticky_action_prob=0.0 (MinAtar) or --env-kwargs continuous=true (LunarLander)",
            extend=True,
        ),
    )
    max_episode_steps: int | None = field(
        default=None,
        metadata=_help(
            "time limit of the training and evaluation envs: episodes are truncated after "
            "this many steps (gymnasium's TimeLimit); none: the id's registered limit"
        ),
    )
    bootstrap_truncated: bool = field(
        default=True,
        metadata=_help(
            "bootstrap from the value of the state reached when an episode is truncated "
            "(a time limit); false: a truncation ends the return like a terminal, as CleanRL's "
            "ppo.py and gymnax's envs do. Training envs only: evaluation returns do not "
            "depend on it"
        ),
    )
    obs_keys: tuple[str, ...] | None = field(
        default=None,
        metadata=_help(
            "the entries of a Dict observation the networks read, e.g. --obs-keys image "
            "vector: vectors concatenated, each image through its own --encoder, each entry "
            "normalised on its own with --normalize-obs (docs/actions.md, 'Dict "
            "observations'); none: every entry but action_mask"
        ),
    )
    total_frames: int = field(
        default=100_000, metadata=_help("environment frames to train for, over all ranks")
    )
    seed: int = field(default=0, metadata=_help("random seed (rank r uses seed + 1000 * r)"))
    num_envs: int = field(default=8, metadata=_help("parallel environments per rank"))
    target_return: float | None = field(
        default=None,
        metadata=_help("stop once the evaluation mean return reaches this value"),
    )
    eval_every: int = field(
        default=10_000, metadata=_help("evaluate every this many frames (0: only at the end)")
    )
    eval_episodes: int = field(default=10, metadata=_help("evaluation episodes per evaluation"))
    eval_deterministic: bool = field(
        default=True,
        metadata=_help(
            "evaluate the policy's mode (argmax / mean); false: sample its actions, so a "
            "near-uniform policy scores as it acts rather than by its argmax"
        ),
    )
    eval_max_steps: int | None = field(
        default=None,
        metadata=_help(
            "cut evaluation episodes off after this many steps and score the return so far "
            "(RLlib's max_val_steps); none: each episode runs to its end"
        ),
    )
    eval_env: str | None = field(
        default=None,
        metadata=_help(
            "evaluate on this gymnasium id instead of --env (same observation and action "
            "spaces), e.g. the original task of a reward-shaped or sparse variant"
        ),
    )
    checkpoint_every: int = field(
        default=50_000, metadata=_help("write a checkpoint every this many frames (0: only at end)")
    )
    run_dir: str | None = field(
        default=None, metadata=_help("run directory (default: runs/<algo>-<env>-s<seed>-<time>)")
    )
    config: str | None = field(
        default=None, metadata=_help("YAML file of flag values; flags typed after it win")
    )
    resume: str | None = field(
        default=None,
        metadata=_help("checkpoint to resume from, or 'last' for <run-dir>/checkpoints/last.pt"),
    )
    overwrite: bool = field(
        default=False,
        metadata=_help(
            "start a new run in an existing --run-dir that holds another run: the old run is "
            "moved aside to <run-dir>.old-<time> first (never mixed with the new one)"
        ),
    )
    init_from: str | None = field(
        default=None, metadata=_help("warm start: load network weights only from a checkpoint")
    )
    eval_only: bool = field(
        default=False,
        metadata=_help(
            "evaluate the policy of the --init-from checkpoint for --eval-episodes episodes "
            "(--eval-env and --video apply), write evaluation.json and exit without training; "
            "network and evaluation settings default to the checkpoint's run"
        ),
    )
    export: str | None = field(
        default=None,
        metadata=_help(
            "with --eval-only --init-from: also write the checkpoint's deterministic policy "
            "(observation normalisation included) as onnx, torchscript or pt2 "
            "(docs/deploy.md); none: no export",
            choices=("onnx", "torchscript", "pt2"),
        ),
    )
    export_path: str | None = field(
        default=None,
        metadata=_help(
            "where --export writes the policy (default: <run-dir>/policy.onnx, .ts or .pt2)"
        ),
    )
    accelerator: str = field(default="cpu", metadata=_help("cpu, gpu, cuda, mps or auto"))
    devices: str = field(default="1", metadata=_help("devices per node: a count, or 'auto'"))
    strategy: str = field(default="auto", metadata=_help("auto, ddp or ddp_spawn"))
    num_nodes: int = field(default=1, metadata=_help("number of nodes (multi-node DDP)"))
    threads: int = field(default=1, metadata=_help("torch CPU threads per process"))
    compile: bool = field(
        default=False,
        metadata=_help(
            "torch.compile every loss the update runs (forward and backward), on its first "
            "update: costs 10-60 s of compilation, pays back on long runs "
            "(docs/training.md, 'Compiling the update')"
        ),
    )
    video: bool = field(default=False, metadata=_help("save a GIF of one evaluation episode"))
    video_every: int = field(
        default=0,
        metadata=_help(
            "also save videos/eval_<frames>.gif at the first evaluation after every this many "
            "frames (RLlib's render_freq; 0: only eval.gif at the end, with --video)"
        ),
    )
    snapshot_best: bool = field(
        default=False,
        metadata=_help(
            "keep checkpoints/best.pt: the checkpoint of the best evaluation so far (pyrado's "
            "snapshot_mode on a new highscore)"
        ),
    )
    log_scalars: bool = field(
        default=True,
        metadata=_help(
            "write training metrics (metrics.csv, TensorBoard); false: only evaluations, "
            "checkpoints and the summary (RLlib's log_scalars)"
        ),
    )
    progress: bool = field(
        default=True,
        metadata=_help(
            "show a progress bar (false: no bar, but still the run directory, one line per "
            "evaluation and the result)"
        ),
    )
    log_every: int = field(
        default=1, metadata=_help("write training metrics every this many batches")
    )
    logger: tuple[str, ...] = field(
        default=("csv", "tensorboard"),
        metadata=_help(
            "where metrics, evaluations, the config and the summary go, through Lightning's "
            "loggers: csv (metrics.csv, eval.csv: always written, the run directory is the "
            "source of truth), tensorboard (tb/, when installed), wandb (offline unless "
            "WANDB_MODE says otherwise, in <run-dir>/wandb) and mlflow (a file store "
            "<run-dir>/mlruns, or --mlflow-uri), e.g. --logger csv,wandb,mlflow "
            "(docs/tracking.md)"
        ),
    )
    mlflow_uri: str | None = field(
        default=None,
        metadata=_help(
            "MLflow tracking URI for --logger mlflow (a server, sqlite:///FILE.db, "
            "file:DIR); none: the file store <run-dir>/mlruns"
        ),
    )
    population: int = field(
        default=1,
        metadata=_help(
            "train this many independent members as one run, seeds --seed, --seed+1, ... "
            "(ppo, a2c, daac, ppg, impala and appo with --sync-collect true; see "
            "docs/population.md); with --sweep: the grid x "
            "--population-seeds; with --devices N each process trains its own 1/N of them"
        ),
    )
    population_seeds: int = field(
        default=1, metadata=_help("seeds per --sweep setting (--seed, --seed+1, ...)")
    )
    sweep: tuple[str, ...] | None = field(
        default=None,
        metadata=_help(
            "train a population over a grid of float or bool settings, e.g. --sweep "
            "lr=1e-4,3e-4,1e-3 --sweep clip_epsilon=0.1,0.2 (repeatable; one member per "
            "combination and seed)",
            extend=True,
        ),
    )
    search: int = field(
        default=0,
        metadata=_help(
            "run a hyperparameter search of this many trials on Optuna over --search-space, "
            "in --run-dir (study.db, trials.csv, best_config.yaml; docs/search.md); "
            "0: no search"
        ),
    )
    search_space: tuple[str, ...] | None = field(
        default=None,
        metadata=_help(
            "what --search varies: NAME=LOW:HIGH, NAME=log:LOW:HIGH, NAME=int:LOW:HIGH, "
            "NAME=A|B|C, and/or a YAML file of them, e.g. --search-space lr=log:1e-5:1e-2 "
            "entropy_coef=0:0.05",
            extend=True,
        ),
    )
    search_sampler: str = field(
        default="tpe",
        metadata=_help("Optuna sampler of --search: tpe or random", choices=("tpe", "random")),
    )
    search_pruner: str = field(
        default="median",
        metadata=_help(
            "Optuna pruner of --search, on each evaluation's return: median (MedianPruner), "
            "halving (SuccessiveHalvingPruner) or none",
            choices=("median", "halving", "none"),
        ),
    )
    search_batch: int = field(
        default=8,
        metadata=_help(
            "trials of --search trained together as one population (where the recipe "
            "trains populations; elsewhere trials run one after another)"
        ),
    )

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # a config's validation reads its fields without using them (track_reads)
        cls.__post_init__ = _untracked_call(cls.__post_init__)  # type: ignore[method-assign]

    def population_members(self) -> list[tuple[int, dict[str, Any]]]:
        """``(seed, settings)`` of every member: one run without a population."""
        explicit = self.__dict__.get(MEMBERS)
        if explicit is not None:  # a search's batch of trials: each member its own settings
            return [(seed, dict(setting)) for seed, setting in explicit]
        grid = _sweep_grid(self)
        if not grid:
            return [(self.seed + k, {}) for k in range(self.population)]
        return [(self.seed + k, dict(s)) for s in grid for k in range(self.population_seeds)]

    def env_options(self) -> dict[str, Any]:
        """Extra :func:`rlkit.envs.make_env` arguments for the training env (none here)."""
        return {}

    def gym_options(self, *, evaluation: bool = False) -> dict[str, Any]:
        """``--env-kwargs`` and ``--max-episode-steps`` as :func:`rlkit.envs.make_env`
        arguments (``env_kwargs``, ``max_episode_steps``), for every env a run builds:
        training, collector workers and evaluation; and, for the training envs only
        (``evaluation`` false), ``--bootstrap-truncated false`` (``bootstrap_truncated``).
        Empty when none is set."""
        options: dict[str, Any] = {}
        kwargs = parse_env_kwargs(self.env_kwargs)
        if kwargs:
            options["env_kwargs"] = kwargs
        if self.max_episode_steps is not None:
            options["max_episode_steps"] = self.max_episode_steps
        if not self.bootstrap_truncated and not evaluation:
            options["bootstrap_truncated"] = False
        return options

    def worker_seeds(self, seed: int) -> list[int] | None:
        """How a standalone run with ``seed`` collects: ``None`` when it steps its envs in its
        own process (sub-env ``k`` seeded ``seed + k``, actions drawn from the run's own
        random stream); else one seed per collector worker process, worker ``w`` stepping
        the ``w``-th equal block of the envs (sub-env ``k`` of the block seeded
        ``worker_seeds[w] + k``) and drawing its actions from ``torch.manual_seed``
        of its seed. A population member collects as its standalone run would."""
        del seed
        return None

    def __post_init__(self) -> None:
        start_tracking()  # what reads this config from now on (the engine stops it)
        check_field_types(self)  # whatever the source: flags, a file, a checkpoint, Python
        _positive(self, "total_frames", "num_envs", "eval_episodes", "num_nodes", "threads")
        _positive(self, "log_every", "eval_max_steps", "max_episode_steps")
        parse_env_kwargs(self.env_kwargs)  # refuses a malformed KEY=VALUE here, at parse time
        _check_env_module(self.env)
        _check_env_module(self.eval_env)
        _check_truncation_setting(self)
        _check_obs_keys(self.obs_keys)
        _non_negative(self, "eval_every", "checkpoint_every", "seed", "video_every")
        if self.target_return is not None and not math.isfinite(self.target_return):
            raise ValueError(
                f"--target-return must be a finite return, got {self.target_return} (use none "
                "to train for the whole budget)"
            )
        if self.strategy not in ("auto", "ddp", "ddp_spawn", "ddp_fork", "ddp_notebook"):
            raise ValueError(
                f"strategy {self.strategy!r} is not supported; use auto, ddp or ddp_spawn "
                "(rlkit all-reduces gradients itself, so sharded strategies do not apply)"
            )
        if self.compile and (self.population > 1 or self.sweep):
            raise ValueError(
                "--compile does not apply to --population / --sweep runs (their members' "
                "losses run under torch.vmap): drop --compile"
            )
        if self.eval_only and not self.init_from:
            raise ValueError(
                "--eval-only needs --init-from PATH: the checkpoint whose policy to evaluate "
                "(its network and evaluation settings come from the checkpoint)"
            )
        _check_export(self)
        if self.eval_only and self.resume:
            raise ValueError("--eval-only takes its checkpoint from --init-from, not --resume")
        if self.overwrite and self.resume:
            raise ValueError(
                "--overwrite starts a new run and --resume continues one: drop one of them"
            )
        if self.resume == "last" and not self.run_dir:
            raise ValueError("--resume last needs --run-dir: the run whose last checkpoint to load")
        if self.devices != "auto":
            try:
                n = int(self.devices)
            except ValueError:
                raise ValueError(
                    f"devices must be a positive count or 'auto', got {self.devices!r}"
                ) from None
            if n < 1:
                raise ValueError(f"devices must be >= 1, got {n}")
        _check_population(self)
        _check_loggers(self)
        from rlkit.configs.search import check_search

        check_search(self)
        if self.eval_only and (self.devices != "1" or self.num_nodes != 1):
            raise ValueError(
                "--eval-only runs in one process: drop --devices / --num-nodes (the "
                "evaluation is seeded, more ranks would play the same episodes)"
            )


def _check_export(cfg: TrainConfig) -> None:
    """``--export`` writes the policy of the checkpoint ``--eval-only --init-from`` reads."""
    if cfg.export is not None and not (cfg.eval_only and cfg.init_from):
        raise ValueError(
            f"--export {cfg.export} writes the policy of a checkpoint: add --eval-only "
            "--init-from CKPT (or call rlkit.export from Python)"
        )
    if cfg.export_path is not None and cfg.export is None:
        raise ValueError("--export-path needs --export onnx|torchscript|pt2: add it or drop it")


def _check_obs_keys(obs_keys: tuple[str, ...] | None) -> None:
    """``--obs-keys``: names, each once (the env's entries are checked when the networks are
    built, which lists them)."""
    if obs_keys is None:
        return
    if not obs_keys or any(not k for k in obs_keys):
        raise ValueError("--obs-keys needs one or more entry names, e.g. --obs-keys image vector")
    twice = sorted({k for k in obs_keys if obs_keys.count(k) > 1})
    if twice:
        raise ValueError(f"--obs-keys names {', '.join(map(repr, twice))} twice: name each once")


#: ``--logger`` choices, with the package each needs and the extra that installs it
LOGGERS = {
    "csv": (None, None),
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow"),
}


def _check_loggers(cfg: Any) -> None:
    """``--logger``: known names, each once; a tracker's package installed (one line naming
    the extra; TensorBoard, a default, is skipped when missing, as before); ``--mlflow-uri``
    only with ``mlflow``. Decided here, before anything is built or written."""
    import importlib.util

    seen: set[str] = set()
    for name in cfg.logger:
        if name not in LOGGERS:
            raise ValueError(
                f"--logger {name!r} is not a logger; choose from {', '.join(LOGGERS)} "
                "(comma-separated, e.g. --logger csv,tensorboard,wandb)"
            )
        if name in seen:
            raise ValueError(f"--logger lists {name} twice: list it once")
        seen.add(name)
        package, extra = LOGGERS[name]
        if name != "tensorboard" and package and importlib.util.find_spec(package) is None:
            raise ValueError(
                f'--logger {name} needs the {package} package: pip install "rlkit[{extra}]" '
                f"(or pip install {package}), or drop {name} from --logger"
            )
    if cfg.mlflow_uri is not None and "mlflow" not in seen:
        raise ValueError(
            "--mlflow-uri applies only with --logger ...,mlflow: add mlflow to --logger or "
            "drop --mlflow-uri"
        )


def _check_env_module(env: str | None) -> None:
    """``--env MODULE:NAME``: import MODULE now (it registers its ids) and refuse, in one
    line, a module that cannot be imported or a NAME it neither registers nor defines. A
    factory that only the training script can import (``__main__``, a lambda) is checked by
    the engine, where the script passes it (:mod:`rlkit.envs.ids`)."""
    if not isinstance(env, str) or ":" not in env:
        return
    from rlkit.envs.ids import not_importable, resolve_env

    if not not_importable(env):
        resolve_env(env)


TrainConfig.__post_init__ = _untracked_call(TrainConfig.__post_init__)  # type: ignore[method-assign]


#: ``gymnasium.make`` arguments that have their own flag or that rlkit sets itself
_RESERVED_ENV_KWARGS = {
    "max_episode_steps": "use --max-episode-steps N",
    "render_mode": "rlkit sets it (rgb_array for --video)",
}


def parse_env_kwargs(items: Sequence[str] | None) -> dict[str, Any]:
    """``("sticky_action_prob=0.0", "continuous=true")`` -> ``{"sticky_action_prob": 0.0,
    "continuous": True}``: each value read as YAML (a number, a bool, ``null``, a list or
    text). Raises ValueError naming the malformed item and the fix."""
    out: dict[str, Any] = {}
    for item in items or ():
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise ValueError(
                f"--env-kwargs {item!r} is not KEY=VALUE with KEY a Python name: write e.g. "
                "--env-kwargs sticky_action_prob=0.0"
            )
        if key in _RESERVED_ENV_KWARGS:
            raise ValueError(f"--env-kwargs {key}=...: {_RESERVED_ENV_KWARGS[key]}")
        if key in out:
            raise ValueError(f"--env-kwargs sets {key} twice: keep one {key}=VALUE")
        try:
            out[key] = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError:
            raise ValueError(
                f"--env-kwargs {item!r}: the value is not a YAML scalar or list; quote text "
                "or write a number, true/false or null"
            ) from None
    return out


#: the attribute where a search keeps a batch's members, each with its own settings
#: (:func:`with_members`)
MEMBERS = "_population_members"


def with_members(cfg: Any, members: Sequence[tuple[int, Mapping[str, Any]]]) -> Any:
    """``cfg`` as a population of ``members`` (``(seed, settings)`` each, any settings a
    ``--sweep`` may vary), where ``--sweep`` gives only grids: a search's batch of trials."""
    out = dataclasses.replace(cfg, population=len(members), sweep=None, population_seeds=1)
    object.__setattr__(out, MEMBERS, tuple((int(s), dict(x)) for s, x in members))
    return out


#: settings a sweep may not vary: where and how long a run goes, and what fixes tensor shapes
#: (the members' networks and batches are stacked)
_NOT_SWEPT = frozenset(
    {"seed", "total_frames", "target_return", "population", "population_seeds", "sweep"}
)


def _sweep_grid(cfg: Any) -> list[tuple[tuple[str, Any], ...]]:
    """The combinations of ``--sweep name=v1,v2 ...`` as tuples of ``(name, value)``."""
    if not cfg.sweep:
        return []
    import itertools

    specs = field_specs(type(cfg))
    axes: list[list[tuple[str, Any]]] = []
    seen: set[str] = set()
    for entry in cfg.sweep:
        name, sep, values = str(entry).partition("=")
        name = name.strip().replace("-", "_")
        if not sep or not values.strip():
            raise ValueError(f"--sweep {entry!r}: write NAME=V1,V2,... (e.g. --sweep lr=1e-4,3e-4)")
        if name not in specs:
            raise ValueError(f"--sweep {entry!r}: {type(cfg).__name__} has no setting {name!r}")
        if name in _NOT_SWEPT or specs[name].kind not in (float, bool):
            raise ValueError(
                f"--sweep {name}: only float and bool settings that leave tensor shapes alone "
                "can be swept (lr, clip_epsilon, entropy_coef, gamma, ...); seeds come from "
                "--population-seeds"
            )
        if name in seen:
            raise ValueError(f"--sweep {name} is given twice: list all its values in one entry")
        seen.add(name)
        try:  # each value as the flag typed with it would give it
            axis = [(name, value_from_text(specs[name], v.strip())) for v in values.split(",")]
            axes.append(axis)
        except FieldValueError as err:
            raise ValueError(f"--sweep {entry!r}: {name}: {err}") from None
    return [tuple(combo) for combo in itertools.product(*axes)]


def _check_truncation_setting(cfg: Any) -> None:
    """``--bootstrap-truncated false`` needs an env that truncates: an id of an
    :data:`~rlkit.configs.suites.UNTIMED_SUITES` suite needs ``--max-episode-steps``."""
    if (
        not cfg.bootstrap_truncated
        and cfg.max_episode_steps is None
        and suite_key(cfg.env) in UNTIMED_SUITES
    ):
        raise ValueError(
            f"--bootstrap-truncated false has nothing to act on: {cfg.env} has no time "
            "limit, so no episode is truncated; add --max-episode-steps N (gymnax's "
            "protocol: 1000) or drop the flag"
        )


def _check_population(cfg: Any) -> None:
    _positive(cfg, "population", "population_seeds")
    grid = _sweep_grid(cfg)
    if not grid:
        if cfg.population_seeds != 1:
            raise ValueError(
                "--population-seeds repeats a --sweep grid over seeds; without --sweep use "
                "--population N"
            )
        return
    size = len(grid) * cfg.population_seeds
    if cfg.population not in (1, size):
        raise ValueError(
            f"--population {cfg.population} does not match the sweep: {len(grid)} settings x "
            f"--population-seeds {cfg.population_seeds} = {size} members; drop --population"
        )
    # the members share one training env (rlkit.training.population.make_population_env),
    # built from the base settings: a value that would change it would be silently dropped
    shared = population_env_options(cfg)
    for combo in grid:  # each member's settings must be a valid config on their own
        member = dataclasses.replace(
            cfg, sweep=None, population=1, population_seeds=1, **dict(combo)
        )
        own = population_env_options(member)
        if own != shared:
            differ = {k for k in shared.keys() | own.keys() if shared.get(k) != own.get(k)}
            name = next((n for n, _ in combo if n in differ), combo[0][0])
            flag = "--" + name.replace("_", "-")
            raise ValueError(
                f"--sweep {name}: the members share one training env, built with one value "
                f"of {flag}; train each value as its own run (or population)"
            )


def population_env_options(cfg: Any) -> dict[str, Any]:
    """What a population's one shared training env is built from
    (:func:`rlkit.training.population.make_population_env`): the training env's
    :func:`rlkit.envs.make_env` options, without ``gamma`` (the reward normaliser's
    discount), which is set per member."""
    options = {**cfg.env_options(), **cfg.gym_options()}
    options.pop("gamma", None)
    return options


def _positive(cfg: Any, *names: str) -> None:
    for name in names:
        value = getattr(cfg, name)
        if value is not None and value <= 0:
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag} must be > 0, got {value}")


def _non_negative(cfg: Any, *names: str) -> None:
    for name in names:
        value = getattr(cfg, name)
        if value is not None and value < 0:
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag} must be >= 0, got {value}")


def positive(cfg: Any, *names: str) -> None:
    """Raise a ValueError naming the flag when one of ``names`` is not > 0."""
    _positive(cfg, *names)


def non_negative(cfg: Any, *names: str) -> None:
    """Raise a ValueError naming the flag when one of ``names`` is < 0."""
    _non_negative(cfg, *names)


def in_unit_interval(cfg: Any, *names: str, closed_low: bool = True) -> None:
    """Raise a ValueError naming the flag when one of ``names`` is outside [0, 1]."""
    for name in names:
        value = getattr(cfg, name)
        low_ok = value >= 0 if closed_low else value > 0
        if not (low_ok and value <= 1):
            bracket = "[" if closed_low else "("
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag} must be in {bracket}0, 1], got {value}")


# --------------------------------------------------------------------------- field values
#
# One validation path for every source of settings. A value typed as a flag, written in a
# ``--config`` file, stored in a checkpoint being resumed or listed in a ``--sweep`` becomes
# a field's value through the functions below (:func:`value_from_text`,
# :func:`value_from_tokens`, :func:`value_from_data`): the same types and choices, and a
# refusal that names the field, whatever the source. Ranges and cross-field rules are the
# config's own ``__post_init__``, which every source reaches with values of the right type
# (:func:`check_field_types` refuses any other, a config built in Python included).


def _base_type(tp: Any) -> tuple[Any, bool]:
    """Return (scalar type, optional) for annotations like ``float | None``."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0], True
    return tp, False


class FieldValueError(ValueError):
    """A value that field :attr:`FieldSpec.name` does not take; the message names no field
    (the caller says which, and from which source)."""


@dataclass(frozen=True)
class FieldSpec:
    """What values a config field takes: ``kind`` (bool, int, float, str or tuple), the
    ``item`` type of a tuple field, whether ``None`` is allowed (``optional``), the
    ``choices`` of a str field, and whether a tuple field keeps each item whole (``whole``:
    ``--env-kwargs``, ``--sweep``) instead of splitting it on commas and spaces."""

    name: str
    kind: Any
    item: Any = None
    optional: bool = False
    choices: tuple[str, ...] | None = None
    whole: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def expected(self) -> str:
        """What the field takes, in words: ``a float``, ``true or false``, ..."""
        if self.kind is bool:
            text = "true or false"
        elif self.kind is tuple:
            text = f"a list of {self.item.__name__}"
        elif self.choices is not None:
            text = "one of " + ", ".join(self.choices)
        else:
            text = {int: "an int", float: "a float", str: "text"}.get(self.kind, "a value")
        return f"{text} or none" if self.optional else text


@functools.cache
def field_specs(cls: type) -> dict[str, FieldSpec]:
    """:class:`FieldSpec` of every field of config class ``cls``, by name."""
    hints = typing.get_type_hints(cls)
    specs = {}
    for f in dataclasses.fields(cls):
        tp, optional = _base_type(hints[f.name])
        meta = field_metadata(cls, f.name)
        choices = tuple(meta["choices"]) if "choices" in meta else None
        if typing.get_origin(tp) is tuple:
            item = typing.get_args(tp)[0]
            spec = FieldSpec(f.name, tuple, item, optional, whole=bool(meta.get("extend")))
        else:
            spec = FieldSpec(f.name, tp, optional=optional, choices=choices)
        specs[f.name] = spec
    return specs


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise FieldValueError(f"expected true or false, got {text!r}")


def _is_none(text: str) -> bool:
    return text.strip().lower() in ("none", "null")


def value_from_text(spec: FieldSpec, text: str) -> Any:
    """The value ``--flag TEXT`` gives field ``spec`` (``none`` or ``null``: None, where the
    field is optional). Raises :class:`FieldValueError`."""
    if spec.optional and _is_none(text):
        return None
    if spec.kind is tuple:
        return value_from_tokens(spec, [text])
    if spec.kind is bool:
        return _parse_bool(text)
    if spec.kind in (int, float):
        try:
            return spec.kind(text)
        except ValueError:
            raise FieldValueError(f"expected {spec.kind.__name__}, got {text!r}") from None
    if spec.choices is not None and text not in spec.choices:
        choices = ", ".join(repr(c) for c in spec.choices)
        raise FieldValueError(f"invalid choice: {text!r} (choose from {choices})")
    return text


def value_from_tokens(spec: FieldSpec, tokens: Sequence[str]) -> Any:
    """The value ``--flag T1 T2 ...`` gives tuple field ``spec``: the items of every token
    (``64 64`` and ``64,64`` alike), each token kept whole for ``--env-kwargs`` / ``--sweep``;
    a lone ``none`` is None where the field is optional."""
    if spec.optional and any(_is_none(t) for t in tokens):
        if len(tokens) > 1:
            raise FieldValueError("'none' stands alone")
        return None
    if spec.whole:
        return tuple(tokens)
    items = []
    for token in tokens:
        for part in token.replace(",", " ").split():
            try:
                items.append(spec.item(part))
            except ValueError:
                raise FieldValueError(
                    f"expected {spec.item.__name__} values, got {token!r}"
                ) from None
    return tuple(items)


def _as_text(value: Any, spec: FieldSpec) -> str:
    """A scalar of a config file or a checkpoint as it would be typed as a flag."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)  # round-trips: 1e-05, nan, inf, -inf
    if isinstance(value, (int, str)):
        return str(value)
    if value is None:
        return "none"
    if isinstance(value, datetime.date):  # YAML reads 2024-01-01 as a date: the text typed
        return value.isoformat()
    what = "a list" if isinstance(value, (list, tuple)) else f"a {type(value).__name__}"
    raise FieldValueError(f"expected {spec.expected}, got {what} ({value!r})")


def value_from_data(spec: FieldSpec, value: Any) -> Any:
    """The value a config file or a checkpoint's stored settings give field ``spec``: what
    the flag typed as that value would give (``true`` is not a number, ``1.5`` not an int,
    ``fast`` not a float), with None only where the field is optional and a list only for a
    list field. Raises :class:`FieldValueError`."""
    if value is None:
        if spec.optional:
            return None
        raise FieldValueError(f"expected {spec.expected}, got null (the setting is not optional)")
    if isinstance(value, (list, tuple)):
        if spec.kind is not tuple:
            raise FieldValueError(f"expected {spec.expected}, got a list ({list(value)!r})")
        if any(isinstance(v, (list, tuple, Mapping)) for v in value):
            raise FieldValueError(f"expected {spec.expected}, got a nested list ({list(value)!r})")
        if spec.whole and not value:  # --env-kwargs / --sweep take one item at least
            raise FieldValueError(
                f"expected {spec.expected}, got an empty list (write none, or leave it out)"
            )
        return value_from_tokens(spec, [_as_text(v, spec) for v in value])
    return value_from_text(spec, _as_text(value, spec))


def _conforms(spec: FieldSpec, value: Any) -> bool:
    if value is None:
        return spec.optional
    if spec.kind is tuple:
        return isinstance(value, tuple) and all(_is_a(spec.item, v) for v in value)
    if not _is_a(spec.kind, value):
        return False
    return spec.choices is None or value in spec.choices


def _is_a(kind: Any, value: Any) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    if kind is float:  # an int is a float's value; a bool is not a number
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind) if isinstance(kind, type) else True


def check_field_types(cfg: Any) -> None:
    """Raise a ValueError naming the flag when a field of ``cfg`` holds a value of another
    type than its annotation's (a bool for a number, None for a setting that is not
    optional, a list for a tuple) or a str outside its ``choices``: a config built in Python
    gets the refusal that a flag, a config file or a checkpoint would."""
    values = cfg.__dict__  # not getattr: a check is no read (track_reads)
    for name, spec in field_specs(type(cfg)).items():
        value = values[name]
        if not _conforms(spec, value):
            raise ValueError(f"{spec.flag} must be {spec.expected}, got {value!r}")


# --------------------------------------------------------------------------- parsing


def _converter(spec: FieldSpec):
    """argparse's ``type`` of a scalar flag: :func:`value_from_text`."""

    def convert(text: str):
        try:
            return value_from_text(spec, text)
        except FieldValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    return convert


def field_metadata(cls: type, name: str) -> Mapping[str, Any]:
    """The help text and choices of field ``name``: its own, or, when a subclass only
    changes the default (``epochs: int = 20``), those of the nearest base that declares
    them."""
    for klass in cls.__mro__:
        f = getattr(klass, "__dataclass_fields__", {}).get(name)
        if f is not None and f.metadata:
            return f.metadata
    return {}


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line: ``error: <what> (see --help)``, exit status 2,
    instead of a usage block of every flag followed by the error."""

    def error(self, message: str):  # type: ignore[override]
        if message.startswith("unrecognized arguments"):
            hints = [hint for flag, hint in ELSEWHERE.items() if flag in message.split()]
            if hints:
                self.exit(2, f"error: {message}: {hints[0]}\n")
        self.exit(2, f"error: {message} (see --help)\n")


#: flags some recipes have and others do not: what an unknown one says
ELSEWHERE = {
    "--recurrent": "this recipe has no recurrent networks; the recipes with memory are "
    "ppo, a2c, rnd, impala and appo (docs/memory.md)",
}


def build_parser(cls: type, *, description: str | None = None) -> argparse.ArgumentParser:
    """An argparse parser with one ``--flag`` per dataclass field of ``cls``. A tuple flag's
    tokens come back as a list of str (:func:`parse_config` converts them with
    :func:`value_from_tokens`)."""
    parser = _Parser(
        description=description or (cls.__doc__ or "").strip(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    for f in dataclasses.fields(cls):
        spec = field_specs(cls)[f.name]
        meta = field_metadata(cls, f.name)
        kwargs: dict[str, Any] = {
            "dest": f.name,
            "default": argparse.SUPPRESS,
            "help": meta.get("help", "") + f" (default: {f.default!r})",
            "type": _converter(spec),
        }
        if spec.choices is not None:
            kwargs["choices"] = spec.choices
        if spec.kind is tuple:
            kwargs["nargs"] = "+"
            kwargs["type"] = str
            if spec.whole:  # repeated flags add up; each value kept whole
                kwargs["action"] = "extend"
        if spec.kind is bool:
            kwargs["nargs"] = "?"
            kwargs["const"] = True
            kwargs["metavar"] = "BOOL"
        parser.add_argument(flag_name(f.name), **kwargs)
    return parser


def flag_name(name: str) -> str:
    """``value_lr`` -> ``--value-lr``."""
    return "--" + name.replace("_", "-")


#: Settings of where and how a process runs. They are never taken from a ``--config`` file
#: (a run's own ``config.yaml`` passed back must not train into that run's directory) nor
#: from a checkpoint's stored config; type them as flags.
LAUNCH_FIELDS = frozenset(
    {
        "run_dir",
        "resume",
        "init_from",
        "eval_only",
        "export",
        "export_path",
        "overwrite",
        "config",
        "accelerator",
        "devices",
        "strategy",
        "num_nodes",
    }
)

#: Settings a resumed run may change (``--resume`` with these flags): the budget, the
#: evaluation and checkpoint cadence, logging and how the process runs. Every other setting
#: comes from the checkpoint; typing another value for one is refused (it would change the
#: algorithm in the middle of the run).
RESUME_SAFE = LAUNCH_FIELDS | {
    "total_frames",
    "target_return",
    "eval_every",
    "eval_episodes",
    "checkpoint_every",
    "log_every",
    "progress",
    "video",
    "video_every",
    "snapshot_best",
    "log_scalars",
    "logger",
    "mlflow_uri",
    "threads",
    "compile",
    "save_buffer",
}


def _load_yaml(path: str, cls: type) -> dict[str, Any]:
    file = Path(path)
    if file.is_dir() or not file.exists():
        raise FileNotFoundError(f"--config {path!r}: no such file (pass a YAML file of flags)")
    try:
        data = yaml.safe_load(file.read_text()) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(err, "problem", None) or type(err).__name__
        raise ValueError(
            f"--config {path!r} is not valid YAML ({where}{problem}); write one "
            "'flag_name: value' per line"
        ) from None
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"--config {path!r} cannot be read ({err}); pass a YAML file") from None
    if not isinstance(data, Mapping):
        raise ValueError(f"--config {path!r} must hold a mapping of flag names to values")
    data = {str(k).replace("-", "_"): v for k, v in data.items()}
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"--config {path!r}: unknown keys {unknown}; see --help for the flags")
    # launch settings are typed, not replayed (a run's config.yaml names its own run_dir)
    data = {k: v for k, v in data.items() if k not in LAUNCH_FIELDS}
    return field_values(data, cls, source=f"--config {path!r}")


def field_values(data: Mapping[str, Any], cls: type, *, source: str) -> dict[str, Any]:
    """``data`` (settings of ``cls`` read from a config file or a checkpoint) as the fields'
    values, each converted as the flag typed with that value would be
    (:func:`value_from_data`); raises a one-line ValueError naming ``source`` and the field."""
    specs = field_specs(cls)
    out = {}
    for name, value in data.items():
        try:
            out[name] = value_from_data(specs[name], value)
        except FieldValueError as err:
            raise ValueError(f"{source} sets {name}: {err}") from None
    return out


_NEGATIVE_VALUE = re.compile(r"^-(inf|infinity|nan|\d+\.?\d*(e[-+]?\d+)?|\.\d+(e[-+]?\d+)?)$", re.I)


#: what argparse itself reads as a negative number (a value, not an option)
_ARGPARSE_NEGATIVE = re.compile(r"^-\d+$|^-\d*\.\d+$")


def _attach_negative_values(argv: list[str]) -> list[str]:
    """``--flag -1e-3`` / ``--flag -inf`` as ``--flag=-1e-3``: argparse reads a token that
    starts with ``-`` and is not a plain negative decimal as another option. A plain one
    (``--hidden -1 64``) is left to argparse, which takes it and the values after it."""
    out: list[str] = []
    for token in argv:
        if (
            out
            and out[-1].startswith("--")
            and "=" not in out[-1]
            and _NEGATIVE_VALUE.match(token)
            and not _ARGPARSE_NEGATIVE.match(token)
        ):
            out[-1] = f"{out[-1]}={token}"
        else:
            out.append(token)
    return out


def resume_checkpoint_path(resume: str | None, run_dir: str | None) -> Path | None:
    """The checkpoint ``--resume`` names: ``<run-dir>/checkpoints/last.pt`` for ``last``."""
    if not resume:
        return None
    if resume == "last":
        if not run_dir:
            raise ValueError("--resume last needs --run-dir: the run whose last checkpoint to load")
        return Path(run_dir) / "checkpoints" / "last.pt"
    return Path(resume)


#: reads the run settings stored in a checkpoint (a mapping, or None when the file cannot be
#: read): the engine's checkpoint reader, which :func:`rlkit.training.parse_config` passes
ReadCheckpoint = Callable[[Path], "Mapping[str, Any] | None"]


def _stored_config(path: str | Path, cls: type, read: ReadCheckpoint | None) -> dict[str, Any]:
    """The run settings stored in the checkpoint at ``path``, restricted to ``cls``'s fields
    and without launch settings; ``{}`` when the file cannot be read (the engine then names
    the problem with the checkpoint itself, after the flags are checked)."""
    if read is None:  # a caller's mistake, not the user's: this layer reads no checkpoint
        raise TypeError(
            "parse_config needs read_checkpoint to take a checkpoint's settings (--resume, "
            "--eval-only --init-from): call rlkit.training.parse_config, which passes it"
        )
    stored = read(Path(path))
    if not isinstance(stored, Mapping):
        return {}
    return stored_fields(stored, cls, source=f"the checkpoint {str(path)!r}")


def stored_fields(
    stored: Mapping[str, Any], cls: type, *, source: str = "the checkpoint"
) -> dict[str, Any]:
    """A stored config (a checkpoint's ``config``) restricted to ``cls``'s fields, without
    launch settings, with values converted to the fields' types as a flag's would be
    (:func:`field_values`: a value of another type is refused, naming the field)."""
    names = {f.name for f in dataclasses.fields(cls)} - LAUNCH_FIELDS
    return field_values({k: v for k, v in stored.items() if k in names}, cls, source=source)


def _resumed_config(path: str | Path, cls: type, read: ReadCheckpoint | None) -> dict[str, Any]:
    """The settings a resumed run keeps: the checkpoint's (:func:`_stored_config`), and for a
    setting it does not name, added after it was written, that setting's default: the run
    trained with it (a new setting's default keeps the old behaviour), not with what a
    preset would give it now."""
    stored = _stored_config(path, cls, read)
    if not stored:  # unreadable: the engine names the problem with the file
        return stored
    return {**_defaults(cls, exclude=RESUME_SAFE | stored.keys()), **stored}


def _defaults(cls: type, *, exclude: Collection[str] = ()) -> dict[str, Any]:
    """``cls``'s default values, but for the fields in ``exclude``."""
    out = {}
    for f in dataclasses.fields(cls):
        if f.name in exclude:
            continue
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        try:
            return float(a) == float(b)
        except (TypeError, ValueError):
            return False
    return a == b


def _refuse_changes(typed: Mapping[str, Any], stored: Mapping[str, Any], path: Path) -> None:
    """A resume keeps the run's algorithm: a typed value that differs from the stored one is
    refused unless the setting is in :data:`RESUME_SAFE`."""
    changed = [
        name
        for name, value in typed.items()
        if name not in RESUME_SAFE and name in stored and not _same(value, stored[name])
    ]
    if changed:
        name = changed[0]
        flag = "--" + name.replace("_", "-")
        more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
        raise ValueError(
            f"{flag} {typed[name]!r} would change the resumed run of {str(path)!r}, which has "
            f"{stored[name]!r}{more}: a resume keeps the run's settings; drop {flag}, or start "
            "a new run from its weights with --init-from"
        )


@functools.lru_cache(maxsize=64)
def _parser(cls: type, description: str | None) -> argparse.ArgumentParser:
    """:func:`build_parser`, built once per config class (building one costs ~10 ms)."""
    return build_parser(cls, description=description)


def parse_config(
    cls: type,
    argv: Sequence[str] | None = None,
    *,
    presets: Mapping[str, Mapping[str, Any]] | None = None,
    description: str | None = None,
    read_checkpoint: ReadCheckpoint | None = None,
):
    """Resolve a config from defaults, env presets, ``--config`` YAML and flags.

    ``--resume`` continues the stored run: its settings come from the checkpoint, and flags
    typed with it (or a ``--config`` file) may change only :data:`RESUME_SAFE` settings (the
    budget, evaluation and checkpoint cadence, logging); a different value for any other
    setting is refused with one line.

    With ``--eval-only --init-from PATH`` the settings stored in that checkpoint (its
    networks, ``--env``, ``--eval-env``, ...) come between the presets and ``--config``, so a
    checkpoint evaluates without retyping the flags of its run.

    Launch settings (:data:`LAUNCH_FIELDS`: ``--run-dir``, ``--resume``, ``--devices``, ...)
    are only ever taken from the command line.

    Unknown flags and invalid values exit with a one-line error (status 2). A ValueError
    from the config's own validation is reported the same way, before anything is built.

    ``read_checkpoint`` reads a checkpoint's stored settings (torch is needed for that, and this
    layer imports none): :func:`rlkit.training.parse_config` passes the engine's reader, and is
    what recipes and scripts call.
    """
    parser = _parser(cls, description)
    argv = _attach_negative_values(sys.argv[1:] if argv is None else list(argv))
    args = vars(parser.parse_args(argv))
    specs = field_specs(cls)
    for name, value in args.items():  # "--hidden 64 64" and "--hidden 64,64" alike
        if isinstance(value, list):
            try:
                args[name] = value_from_tokens(specs[name], value)
            except FieldValueError as err:
                parser.error(f"argument {specs[name].flag}: {err}")
    typed: dict[str, Any] = {}
    try:
        if args.get("config"):
            typed.update(_load_yaml(args["config"], cls))
        typed.update(args)
        stored: dict[str, Any] = {}
        if typed.get("resume") and not typed.get("eval_only"):
            path = resume_checkpoint_path(typed["resume"], typed.get("run_dir"))
            stored = _resumed_config(path, cls, read_checkpoint)
            _refuse_changes(typed, stored, path)
        elif typed.get("eval_only") and typed.get("init_from"):
            stored = _stored_config(typed["init_from"], cls, read_checkpoint)
    except (OSError, ValueError) as err:
        parser.error(str(err))
    env_default = next(f.default for f in dataclasses.fields(cls) if f.name == "env")
    env = typed.get("env", stored.get("env", env_default))
    preset = preset_for(presets, env, cls)  # the id's own, else its suite's (MinAtar/*, ALE/*)
    # a preset fills only what neither the checkpoint, the YAML file nor the command line set
    resolved = {**preset, **stored, **typed}
    try:
        cfg = cls(**resolved)
    except (ValueError, TypeError) as err:
        parser.error(str(err))
    # what the user typed that changes the config: a value that differs from what the
    # setting would be without it (its default, the env's preset, the resumed checkpoint's)
    untyped = {**_defaults(cls), **preset, **stored}
    changed = [n for n, v in typed.items() if n not in untyped or not _same(v, untyped[n])]
    object.__setattr__(cfg, _TYPED, frozenset(changed))
    object.__setattr__(cfg, _PRESET, preset_name(presets, env, cls))
    return cfg


#: the attribute where :func:`parse_config` keeps what preset applied (:func:`applied_preset`)
_PRESET = "_applied_preset"


def applied_preset(cfg: Any) -> str | None:
    """What :func:`parse_config` applied to ``cfg`` for its env: ``"preset MuJoCo/*"``,
    ``"defaults"``, ...; ``None`` for a config built in Python (no preset is looked up)."""
    return cfg.__dict__.get(_PRESET)


# --------------------------------------------------------------------------- typed settings

#: the attribute where :func:`parse_config` keeps the names of the settings typed
_TYPED = "_typed_settings"


def typed_settings(cfg: Any) -> list[str]:
    """The settings of ``cfg`` its user set, in field order: those typed as flags or in a
    ``--config`` file with a value that changes them (:func:`parse_config`); for a config
    built in Python (``PPOConfig(value_lr=5e-4)``), every field that differs from its
    default."""
    recorded = cfg.__dict__.get(_TYPED)
    with untracked():
        fields = dataclasses.fields(cfg)
        if recorded is not None:
            return [f.name for f in fields if f.name in recorded]
        defaults = _defaults(type(cfg))
        return [
            f.name
            for f in fields
            if f.name in defaults and not _same(getattr(cfg, f.name), defaults[f.name])
        ]


def _flag_value(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "none"
    if isinstance(value, (list, tuple)):
        return " ".join(_flag_value(v) for v in value)
    return str(value)


def as_flag(cfg: Any, name: str) -> str:
    """Setting ``name`` of ``cfg`` as typed on the command line: ``--value-lr 0.0005``."""
    with untracked():
        value = getattr(cfg, name)
    return f"--{name.replace('_', '-')} {_flag_value(value)}"


def unread_settings(cfg: Any, reads: Collection[str]) -> list[str]:
    """The settings of ``cfg`` its user set (:func:`typed_settings`) that are not in
    ``reads`` (:func:`track_reads`), in field order."""
    return [name for name in typed_settings(cfg) if name not in reads]


def to_dict(cfg: Any) -> dict[str, Any]:
    """The config as plain YAML/JSON-safe values (tuples become lists)."""
    out = {}
    with untracked():  # a copy of every field, not a use of any (track_reads)
        for f in dataclasses.fields(cfg):
            value = getattr(cfg, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


def save_config(cfg: Any, path: Path) -> None:
    path.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
