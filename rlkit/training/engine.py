"""The training engine: one loop for every recipe, on Lightning Fabric.

Why Fabric and not ``Trainer``: an RL run is a loop over collector batches, not epochs over a
dataset. Under ``Trainer`` with manual optimisation, ``global_step`` counts optimiser steps,
``ModelCheckpoint(train_time_interval=...)`` never fires, ``gradient_clip_val`` raises, and a
finite collector leaves epoch 2 empty (all measured here with lightning 2.6.6). Fabric gives
what an RL loop needs from Lightning (the launcher, devices, process groups for DDP on one or
many nodes, collective ops) and leaves the loop explicit, as in Lightning's own RL example.

Gradients are all-reduced by :meth:`Context.optimize` as one flat buffer per optimiser step,
instead of wrapping networks in ``DistributedDataParallel``. DDP only syncs gradients of
modules called through the wrapper's ``forward`` and fails when a backward misses a
parameter (PPG's auxiliary phase, SAC's separate backwards); it also overwrites buffers
(normaliser statistics) with rank 0's each step. The explicit all-reduce works for every loss
and strategy that provides a process group (``ddp``, ``ddp_spawn``, multi-node).

The loop::

    launch ranks -> seed -> env + learner -> (resume | warm start) -> collector
    repeat: batch = collect() -> learner.update(batch) -> log -> evaluate -> checkpoint
    until total frames or target return -> final evaluation, checkpoint, summary
"""

from __future__ import annotations

import dataclasses
import json
import math
import signal
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDictBase
from torch import nn

from rlkit import _quiet, _speedups
from rlkit.configs.base import (
    TrainConfig,
    applied_preset,
    as_flag,
    resume_checkpoint_path,
    start_tracking,
    stop_tracking,
    to_dict,
    typed_settings,
    unread_settings,
)
from rlkit.configs.base import save_config as _save_config
from rlkit.data.errors import ActorLost, EnvFault
from rlkit.training import checkpoint as ckpt

# the command line and the exception classes are torch-free (``--help`` imports no torch),
# and importable from here, where they were defined before
from rlkit.training.cli import _one_line
from rlkit.training.errors import (
    ActorLostError,
    CheckpointWriteError,
    EnvFaultError,
    NonFiniteError,
    RankLostError,
    RunInterrupted,
)
from rlkit.training.learner import Context, Counters, Learner, episode_stats
from rlkit.training.runlog import (
    CallbackError,
    RunLog,
    call_back,
    check_callbacks,
    check_run_dir,
    claim_run_dir,
)
from rlkit.training.signals import ForwardStop, RankWatch, StopRequest


def resolve_run_dir(cfg: TrainConfig, algo: str) -> Path:
    """``--run-dir``, the run of ``--resume PATH``, or a fresh unique name:
    ``runs/<algo>-<env>-s<seed>-<date>-<time>-<6 random hex digits>`` (unique for runs
    started in the same second, on one machine or several)."""
    if cfg.run_dir:
        return Path(cfg.run_dir)
    if cfg.resume and cfg.resume != "last":
        # <run-dir>/checkpoints/<file>.pt
        return Path(cfg.resume).resolve().parent.parent
    from rlkit.envs.ids import env_label

    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    # rlkit/MountainCarSparse-v0 -> rlkit-MountainCarSparse-v0; mypkg.envs:Corridor-v0 ->
    # Corridor-v0; an env factory mypkg.envs:make_corridor -> make_corridor
    env = env_label(cfg.env)
    return Path("runs") / f"{algo}-{env}-s{cfg.seed}-{stamp}-{uuid.uuid4().hex[:6]}"


def make_fabric(cfg: TrainConfig):
    from lightning.fabric import Fabric

    devices: int | str = cfg.devices if cfg.devices == "auto" else int(cfg.devices)
    return Fabric(
        accelerator=cfg.accelerator,
        devices=devices,
        strategy=cfg.strategy,
        num_nodes=cfg.num_nodes,
    )


def _broadcast_parameters(fabric, modules: Mapping[str, nn.Module]) -> None:
    """Copy rank 0's parameters and buffers to every rank (same start everywhere)."""
    if fabric.world_size == 1:
        return
    for module in modules.values():
        for t in list(module.parameters()) + list(module.buffers()):
            t.data.copy_(fabric.broadcast(t.data, src=0))


def _payload(
    cfg, learner: Learner, counters: Counters, *, extra_modules=None, generator=None
) -> dict[str, Any]:
    modules = dict(learner.modules())
    if extra_modules:
        modules |= extra_modules
    rng = ckpt.rng_state()
    if generator is not None:  # the update's minibatch permutations (Context.generator)
        rng["generator"] = generator.get_state()
    return {
        "format": ckpt.FORMAT,
        "algo": learner.algo,
        "env": cfg.env,
        "modules": {k: m.state_dict() for k, m in modules.items()},
        "optimizers": {k: o.state_dict() for k, o in learner.optimizers().items()},
        "learner": learner.state_dict(),
        "counters": counters.state_dict(),
        "rng": rng,
        "config": to_dict(cfg),
    }


def _load_modules(payload: Mapping[str, Any], path: Path, modules: Mapping[str, nn.Module]):
    for name, module in modules.items():
        if name not in payload["modules"]:
            raise ckpt.CheckpointError(
                f"checkpoint {str(path)!r} has no module {name!r}: it was written by another "
                "version or configuration of this recipe (its settings come from the "
                "checkpoint; a flag typed now may ask for a network it never had): drop the "
                "network flags or start a new run"
            )
        ckpt.load_module_state(module, payload["modules"][name], name=name, path=path)


def _apply(
    payload: Mapping[str, Any], path: Path, learner: Learner, counters: Counters, extra_modules
) -> None:
    """Load a checkpoint's networks, statistics, optimisers, learner state and counters."""
    ckpt.check_compatible(payload, algo=learner.algo, path=path)
    _load_modules(payload, path, dict(learner.modules()) | dict(extra_modules or {}))
    for name, opt in learner.optimizers().items():
        opt.load_state_dict(payload["optimizers"][name])
    learner.load_state_dict(payload.get("learner", {}))
    counters.load_state_dict(payload["counters"])


def rank_checkpoint_path(path: Path, rank: int) -> Path:
    """Where rank ``rank > 0`` keeps its copy of checkpoint ``path``: ``<dir>/rank<r>/<name>``.

    On several ranks, state that each rank keeps for itself (reward-scaling statistics of its
    own envs, RND's per-env intrinsic return, an off-policy replay buffer, the RNG) differs
    between ranks; rank 0's file holds rank 0's, and every other rank writes its own payload
    next to it so that a resume restores each rank's own.
    """
    return path if rank == 0 else path.parent / f"rank{rank}" / path.name


def _resume_rank(fabric, path: Path, learner, counters, env_modules) -> dict[str, Any] | None:
    """Restore this rank from ``path`` (rank 0's file) or, on rank r > 0, from its own copy
    (:func:`rank_checkpoint_path`) when that copy was written by the same save as ``path``.

    Returns the payload applied when it holds this rank's own state (its RNG state applies),
    ``None`` when rank r > 0 fell back to rank 0's file. No collective call: a rank whose own
    file is unreadable falls back alone, and an unreadable ``path`` fails every rank alike,
    so no rank is left waiting for another. Exactly one payload is applied.
    """
    rank = fabric.global_rank
    payload = ckpt.load(path)
    chosen, source, own_state = payload, path, rank == 0
    own = rank_checkpoint_path(path, rank)
    if rank > 0 and own.is_file():
        try:
            mine = ckpt.load(own)
        except ckpt.CheckpointError as err:
            mine, why = None, str(err)
        else:
            # the same save of the same run (a run killed between the ranks' writes, or a
            # later run of another size in this directory, leaves another id behind)
            same = mine.get("save_id") is not None and mine.get("save_id") == payload.get("save_id")
            why = "written by another save (frame count, run or number of ranks)"
            if same and mine.get("world_size") == fabric.world_size:
                chosen, source, own_state = mine, own, True
        if not own_state:
            warnings.warn(
                f"rank {rank}: {str(own)!r} does not match {str(path)!r} ({why}); this rank "
                "resumes with rank 0's copy of its per-rank state",
                stacklevel=2,
            )
    _apply(chosen, source, learner, counters, env_modules)
    return chosen if own_state else None


def _on_every_rank(fabric, action: Callable[[], Any]) -> Any:
    """``action()`` on every rank, the ranks agreeing on its outcome: a refusal
    (``CheckpointError``, ``ValueError``, a missing file) on any rank is raised on every
    rank, after an all-gather, instead of leaving the others waiting in a collective."""
    rank, world = fabric.global_rank, fabric.world_size
    refusal, result = "", None
    try:
        result = action()
    except (ckpt.CheckpointError, FileNotFoundError, ValueError, KeyError) as err:
        refusal = f"rank {rank}: {_one_line(str(err))}" if world > 1 else str(err)
    refusals: list[str] = [refusal]
    if world > 1:
        refusals = [""] * world
        torch.distributed.all_gather_object(refusals, refusal)
    first = next((r for r in refusals if r), "")
    if first:
        raise ckpt.CheckpointError(first)
    return result


def _warm_start(path: Path, learner: Learner) -> None:
    payload = ckpt.load(path)
    names = learner.warm_start_modules or tuple(learner.modules())
    modules = learner.modules()
    for name in names:
        if name in payload["modules"]:
            ckpt.load_module_state(modules[name], payload["modules"][name], name=name, path=path)


def _evaluate_only(
    fabric, cfg: TrainConfig, learner: Learner, env, run_dir: Path, source: Any = None
) -> dict:
    """``--eval-only``: every network of ``--init-from``, ``--eval-episodes`` episodes
    (deterministic unless ``--eval-deterministic false``) on ``--eval-env`` (or ``--env``),
    ``evaluation.json`` (+ ``eval.gif``), no training."""
    from rlkit.envs import check_same_spaces

    path = Path(cfg.init_from)
    payload = ckpt.load(path)
    ckpt.check_compatible(payload, algo=learner.algo, path=path)
    _load_modules(payload, path, learner.modules())
    env_id = cfg.eval_env or cfg.env
    evaluator = _run_evaluator(cfg, fabric.device, source)
    if cfg.eval_env:
        check_same_spaces(env, evaluator.env, train_id=cfg.env, eval_id=cfg.eval_env)
    returns = evaluator.returns(learner.eval_policy()).tolist()
    mode = "deterministic" if cfg.eval_deterministic else "sampled-action"
    mean = sum(returns) / len(returns)
    std = math.sqrt(sum((r - mean) ** 2 for r in returns) / len(returns))
    result = {
        "algo": learner.algo,
        "checkpoint": str(path),
        "trained_frames": payload["counters"]["frames"],
        "env": env_id,
        "episodes": len(returns),
        "deterministic": cfg.eval_deterministic,
        "eval_return_mean": mean,
        "eval_return_std": std,
        "returns": returns,
    }
    run_dir.mkdir(parents=True, exist_ok=True)
    if cfg.export is not None:  # asked for: a failure is the command's, after evaluating
        result["export"] = str(_export(cfg, learner, env, run_dir, path))
    (run_dir / "evaluation.json").write_text(json.dumps(result, indent=2) + "\n")
    if cfg.video:
        _try_video(cfg, learner, run_dir, print_fn=_stderr, device=fabric.device, env=source)
    print(
        f"{learner.algo} policy of {str(path)!r} ({result['trained_frames']:,} frames) on "
        f"{env_id}: return {mean:.2f} +- {std:.2f} over {len(returns)} {mode} episodes "
        f"-> {run_dir / 'evaluation.json'}"
    )
    return result


def _export(cfg: TrainConfig, learner: Learner, env, run_dir: Path, checkpoint: Path) -> Path:
    """``--export``: the deterministic policy of ``--init-from`` (the evaluated one, its
    observation normaliser inside its networks) written as ``--export`` to ``--export-path``
    (default ``<run-dir>/policy.<suffix>``): :func:`rlkit.modules.deploy.export_policy`."""
    from rlkit.modules.deploy import EXPORT_FORMATS, Policy, export_policy, observation_layout

    target = Path(cfg.export_path or run_dir / f"policy{EXPORT_FORMATS[cfg.export]}")
    info = {"algo": learner.algo, "env": cfg.env, "checkpoint": str(checkpoint)}
    policy = Policy(learner.eval_policy(), observation_layout(env), info=info)
    try:
        written = export_policy(policy, cfg.export, target)
    except ImportError as err:  # onnx / onnxscript missing: one line with the fix
        raise ValueError(str(err)) from None
    print(f"exported the {learner.algo} policy as {cfg.export} -> {written}")
    return written


def _kept_at_start(resume_path: Path | None) -> str:
    """What a fault before the first batch's update leaves: no checkpoint, or the resumed."""
    if resume_path is not None:
        return "the checkpoint resumed from is intact"
    return "no checkpoint had been written yet"


def _kept(run_dir: Path) -> str:
    """What a run stopped by a fault keeps, and how to continue it."""
    last = run_dir / "checkpoints" / "last.pt"
    if not last.exists():
        return "no checkpoint had been written yet"
    return (
        f"the last checkpoint {str(last)!r} is intact; continue with --resume last --run-dir "
        f"{run_dir}"
    )


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _run_evaluator(cfg: TrainConfig, device, source: Any = None):
    """The :class:`~rlkit.training.evaluation.Evaluator` of a run's evaluation flags, on
    ``--eval-env`` (or the run's env: ``source``, the env factory given to :func:`run`, else
    ``--env``) built with the run's ``gymnasium.make`` arguments."""
    from rlkit.training.evaluation import Evaluator

    return Evaluator(
        cfg.eval_env or source or cfg.env,
        episodes=cfg.eval_episodes,
        device=device,
        deterministic=cfg.eval_deterministic,
        max_steps=cfg.eval_max_steps,
        **cfg.gym_options(evaluation=True),
    )


def _try_video(
    cfg: TrainConfig,
    learner: Learner,
    run_dir: Path,
    print_fn,
    name="eval.gif",
    device=None,
    env: Any = None,
):
    """``<run-dir>/<name>``: a GIF of one evaluation episode, played as the run's evaluations
    are (``--eval-env`` or ``--env``, its ``gymnasium.make`` arguments, its action mode); an
    optional extra, so a failure warns in one line and the run keeps its results."""
    from rlkit.training.evaluation import record_gif

    try:
        record_gif(
            cfg.eval_env or env or cfg.env,
            learner.eval_policy(),
            run_dir / name,
            deterministic=cfg.eval_deterministic,
            device=device,  # the policy's (SAC's collection policy registers no parameters)
            **cfg.gym_options(evaluation=True),
        )
    except Exception as err:
        text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        print_fn(f"warning: could not record {name} ({type(err).__name__}: {text})")


def _agree(fabric, shared, check: Callable[[], Any]):
    """Run ``check`` on rank 0 and make every rank agree on its outcome.

    Rank 0's ``shared`` value (the run directory, the save token) reaches every rank; a
    ``ValueError`` of ``check`` is raised on every rank, so no rank is left waiting in a
    collective for one that stopped. Returns ``(shared, result of check)`` flattened as
    ``shared`` when ``shared`` is not None (rank 0's result is only returned on rank 0).
    """
    refusal, result = "", None
    if fabric.global_rank == 0:
        try:
            result = check()
        except ValueError as err:
            refusal = str(err)
    if fabric.world_size > 1:
        payload = (tuple(str(x) for x in shared) if shared is not None else None, refusal)
        payload = fabric.broadcast(payload, src=0)
        refusal = payload[1]
        if shared is not None:
            shared = (Path(payload[0][0]), payload[0][1])
    if refusal:
        raise ValueError(refusal)
    return shared if shared is not None else result


# --------------------------------------------------------------------------- typed settings

#: the engine's own settings (:class:`TrainConfig`'s)
_ENGINE_SETTINGS = tuple(f.name for f in dataclasses.fields(TrainConfig))


def _swept(cfg: TrainConfig) -> dict[str, str]:
    """The settings ``--sweep`` varies, each with its entry (``lr=1e-4,3e-4``)."""
    entries = cfg.sweep or ()
    return {str(e).partition("=")[0].strip().replace("-", "_"): str(e) for e in entries}


def _read_engine_settings(cfg: TrainConfig) -> None:
    """Read every engine setting where the engine may read it only later (at the first
    evaluation, checkpoint or log row) or before reads are tracked (the launch): a typed one
    counts as read. ``--eval-only`` reads the training settings too (a training command with
    ``--eval-only`` added evaluates what it would train). ``--init-from`` is read where it
    is used: a resumed run does not read it."""
    for name in _ENGINE_SETTINGS:
        if name != "init_from" or cfg.eval_only:
            getattr(cfg, name)


def _unread_message(cfg: TrainConfig, unread: list[str], build: Callable) -> str:
    """One line naming the first of the typed settings nothing read, why, and the fix."""
    name = unread[0]
    fix = "drop it"
    if name == "init_from":
        why = "--resume continues the run from its own weights"
    elif name in _ENGINE_SETTINGS:
        why = f"the engine never read cfg.{name}"
    else:
        build = getattr(build, "func", build)  # functools.partial(ppo.build, loss_cls=...)
        where = getattr(build, "__qualname__", None) or type(build).__name__
        module = getattr(build, "__module__", None)
        where = f"{module}.{where}" if module else where
        why = (
            f"the build given to run(), {where}, and the first update never read "
            f"cfg.{name}; a setting may apply only together with another"
        )
        fix = "drop it, or read it in your build"
    more = ""
    if len(unread) > 1:
        more = "; also unread: " + ", ".join("--" + n.replace("_", "-") for n in unread[1:])
    swept = _swept(cfg)
    shown = f"--sweep {swept[name]}" if name in swept else as_flag(cfg, name)
    return f"{shown} was set but nothing in this run reads it ({why}): {fix}{more}"


# --------------------------------------------------------------------------- the loop


@dataclass
class _Built:
    """What :meth:`Engine._build` made: the env (with its env-held statistics), the learner,
    the evaluator, the counters and, on a resume, this rank's own checkpoint payload."""

    env: Any
    env_modules: dict[str, nn.Module]
    learner: Learner
    evaluator: Any = None
    counters: Counters = field(default_factory=Counters)
    payload: dict[str, Any] | None = None


@dataclass
class _Start:
    """What :meth:`Engine._start` made before anything is written: the run directory (not
    yet claimed), what :meth:`Engine._build` built, and for a training run the update's
    context, the collector and the first batch with its update's metrics."""

    run_dir: Path
    resume_path: Path | None
    new_run: bool
    save_token: str
    built: _Built
    ctx: Any = None
    collector: Any = None
    iterator: Any = None
    first_seconds: float = 0.0
    first: tuple[TensorDictBase, dict[str, float]] | None = None

    def close(self) -> None:
        """Stop the collector (its workers) and close the env."""
        try:
            if self.collector is not None:
                self.collector.shutdown()
        finally:
            self.built.env.close(raise_if_closed=False)  # TorchRL's Collector closes it


class RunReport:
    """What the engine reports of a run, through its mode: the episodes of each batch, the
    evaluations, the summary. This class reports one run; a population's report
    (:class:`rlkit.training.population.PopulationRunReport`) reports every member."""

    #: every rank holds the same parameters (compared at the end: ``rank_param_max_diff``)
    replicated = True

    def __init__(self, learner: Learner, fabric) -> None:
        self.learner, self.fabric = learner, fabric

    def gather(
        self, batch: TensorDictBase, metrics: Mapping[str, float]
    ) -> tuple[Mapping[str, float], list[float], list[float]]:
        """The batch's metrics and the returns and lengths of its episodes that ended (this
        rank's: every rank runs the same schedule whatever its episodes)."""
        returns, lengths = episode_stats(batch)
        return metrics, returns, lengths

    def write_rows(self, log, frames: int, batch, metrics: Mapping[str, float]) -> dict:
        """Rows of their own (none here), and the run's row of ``metrics.csv`` to complete."""
        return dict(metrics)

    def evaluate(self, evaluator, counters: Counters, log) -> tuple[float, float, dict] | None:
        """``(mean, std, details)`` of an evaluation on rank 0 (None on the others, which
        receive rank 0's); ``details`` is the learner's breakdown (``evaluation_details``,
        e.g. SVPG's per-particle returns, written to eval.csv)."""
        if self.fabric.global_rank != 0:
            return None
        details = getattr(self.learner, "evaluation_details", None)
        if details is None:
            mean, std = evaluator(self.learner.eval_policy())
            return mean, std, {}
        returns = evaluator.returns(self.learner.eval_policy())
        mean = float(returns.mean())
        std = float(returns.std(unbiased=False)) if returns.numel() > 1 else 0.0
        return mean, std, details(returns)

    def reached(self, mean: float, target: float) -> bool:
        """Whether ``--target-return`` is reached, after an evaluation of mean ``mean``."""
        return mean >= target

    def ended(self) -> bool:
        """Whether the run ends after this evaluation, its target aside (a search's trial
        pruned, every member of a search's batch pruned)."""
        return False

    def finish(self, run_dir: Path, summary: Mapping[str, Any]) -> dict[str, Any]:
        """Files of its own at the end (rank 0) and entries added to ``summary.json``."""
        return {}

    def result_text(self, mean: float, std: float) -> str:
        """The result in the ``done:`` line (a population's: per setting)."""
        return f"eval return {mean:.1f} +- {std:.1f}"

    def eval_text(self, mean: float, std: float) -> str:
        """The result in an ``eval @ N frames:`` progress line (a sweep's: per setting)."""
        return f"return {mean:.1f} +- {std:.1f}"

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        pass


class RunMode:
    """How the engine runs what a recipe's ``build`` makes: one run (this class) or a
    population of members (:class:`rlkit.training.population.PopulationMode`). The engine
    chooses the mode once (:func:`run_mode`) and talks to it through these methods only:
    the envs, the build, the frames a batch counts, the report, the restore.

    Args:
        cfg: the run's config.
    """

    #: every rank holds the same parameters: rank 0's are broadcast after the build and
    #: after a warm start (DDP)
    replicated = True

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg

    def check(self, world_size: int) -> None:
        """Refuse, before any rank starts, what the mode cannot run on ``world_size`` ranks."""

    def make_env(self, make: Callable[..., Any], *, rank: int, world_size: int):
        """This rank's training env, from ``make(num_envs=..., seed=..., **options)``."""
        cfg = self.cfg
        return make(
            num_envs=cfg.num_envs,
            seed=cfg.seed + 1000 * rank,
            **cfg.env_options(),
            **cfg.gym_options(),
        )

    def build(self, build: Callable[..., Learner], env, *, rank: int, world_size: int) -> Learner:
        """This rank's learner: the recipe's ``build(cfg, env)``."""
        return build(self.cfg, env)

    def frames(self, batch: TensorDictBase, world_size: int) -> int:
        """The frames a batch of this rank adds to the run's count (every rank's)."""
        return batch.numel() * world_size

    def reseed(
        self, env, learner: Learner, seed: int, frames: int, *, rank: int, world_size: int
    ) -> None:
        """A resumed run's training envs, seeded with ``seed`` (the rank's start seed plus
        the ``frames`` done), so it does not replay the episodes it began with."""
        from rlkit.envs import reseed

        reseed(env, seed)

    def restore_streams(self, learner, payload: Mapping[str, Any]) -> None:
        """The random streams of ``payload`` (this rank's own) once the collector is built:
        a standalone run's is the global stream, restored by the engine right there."""

    def resume(self, fabric, path: Path, learner, counters, env_modules) -> dict | None:
        """Restore this rank from checkpoint ``path``; the payload holding its own state."""
        return _resume_rank(fabric, path, learner, counters, env_modules)

    def warm_start(self, fabric, path: Path, learner: Learner) -> None:
        """``--init-from``: the networks of ``path``, the same on every rank."""
        _warm_start(path, learner)
        _broadcast_parameters(fabric, learner.modules())

    def report(self, learner: Learner, fabric) -> RunReport:
        return RunReport(learner, fabric)


def run_mode(cfg: TrainConfig) -> RunMode:
    """The run's mode: a population with ``--population N > 1`` or ``--sweep``, else one run."""
    if cfg.population > 1 or cfg.sweep:
        from rlkit.training.population import PopulationMode

        return PopulationMode(cfg)
    return RunMode(cfg)


@dataclass  # not frozen: Lightning moves the returned value to the CPU field by field
class _Stopped:
    """What a rank started by a spawning launcher returns when a signal stopped it
    (:meth:`Engine._run_launched_rank`); the launching process raises it again."""

    message: str
    signum: int | None  # None: stopped at once, without a checkpoint of its own
    frames: int | None


class Engine:
    """Runs a learner under a config. See the module docstring for the loop."""

    def __init__(
        self,
        cfg: TrainConfig,
        build: Callable[[Any, Any], Learner],
        *,
        algo: str,
        make_collector: Callable[..., Any] | None = None,
        env: str | Callable[..., Any] | None = None,
        callbacks: Any = None,
    ) -> None:
        self.cfg, self.build, self.algo = cfg, build, algo
        #: research code's hooks (:class:`rlkit.training.Callback`), called on rank 0
        self.callbacks = check_callbacks(callbacks)
        self.make_collector = make_collector or default_collector
        #: what every env of the run is built from (training on every rank, a population's,
        #: evaluation, video): the env factory given, else ``cfg.env``
        self.env_source: str | Callable[..., Any] = cfg.env
        if env is not None:
            self.cfg, self.env_source = with_env(cfg, env)
        #: one run, or a population (the only place the engine tells them apart)
        self.mode = run_mode(self.cfg)
        self._reads_before: set[str] = set()
        self._watch = RankWatch()  # names a rank that ended under the others

    def fit(self) -> dict[str, Any]:
        # the config reads so far (the recipe's, since its config was made), carried to the
        # ranks (a launcher may start them in new processes), which record their own
        self._reads_before = stop_tracking()
        fabric = make_fabric(self.cfg)
        self.mode.check(fabric.world_size)  # refused before any rank starts
        if self.cfg.strategy in ("ddp_spawn", "ddp_fork", "ddp_notebook"):
            # these launchers start the ranks themselves and run a function in each; rank 0's
            # return value comes back here. This process passes a stop signal on to the ranks
            # and waits for them (rlkit.training.signals.ForwardStop).
            with ForwardStop():
                result = fabric.launch(self._run_launched_rank)
            if isinstance(result, _Stopped) and result.signum is None:
                raise KeyboardInterrupt(result.message)
            if isinstance(result, _Stopped):
                raise RunInterrupted(result.message, signum=result.signum, frames=result.frames)
            return result
        fabric.launch()  # "ddp" re-runs the script for the other ranks (needs a main guard)
        return self._run_rank(fabric)

    def _run_launched_rank(self, fabric) -> dict[str, Any] | _Stopped:
        """A rank under ddp_spawn / ddp_fork / ddp_notebook: a signal's stop is returned,
        not raised. torch's spawn wrapper (``torch.multiprocessing.spawn._wrap``) swallows a
        ``KeyboardInterrupt``, which :class:`RunInterrupted` is, and exits 0 without a result,
        so the launcher waited forever for rank 0's."""
        if threading.current_thread() is threading.main_thread():
            # a forked rank inherits the launcher's ForwardStop, which would swallow a signal
            # here (it has no children to pass it to): Python's own handlers until the loop's
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        try:
            return self._run_rank(fabric)
        except RunInterrupted as err:
            return _Stopped(str(err), err.signum, err.frames)
        except KeyboardInterrupt as err:  # stopped at once (a second signal, or in set-up)
            return _Stopped(str(err) or "stopped before training began", None, None)

    def _run_rank(self, fabric) -> dict[str, Any]:
        watch = self._watch = RankWatch()
        lost = False
        try:
            if fabric.world_size > 1 and torch.distributed.is_initialized():
                watch.start(fabric.global_rank, fabric.world_size)
            return self._fit(fabric)
        except Exception as err:
            # a collective with a rank that has ended: one line naming it (exit status 3)
            if fabric.world_size > 1 and watch.peers:
                comms = isinstance(err, torch.distributed.DistError) or "gloo" in str(err)
                gone = watch.lost(wait_s=2.0 if comms else 0.0)
                if gone and watch.claim():
                    lost = True
                    raise RankLostError(watch.message(gone)) from None
            raise
        finally:
            if lost:  # the dead rank would never join a barrier
                pass
            elif fabric.world_size > 1 and torch.distributed.is_initialized():
                # without this, DDP runs aborted at exit ("terminate called without an
                # active exception") in 3 of 6 runs measured here. A rank stopped at once by
                # a second signal mid-batch does not hang here either: every rank had exited
                # within 60 s in the 3 runs measured (two SIGTERMs 1.5 s apart to rank 0)
                torch.distributed.barrier()
                torch.distributed.destroy_process_group()

    def _fit(self, fabric) -> dict[str, Any]:
        cfg = self.cfg
        # 1-2. everything up to the first update writes nothing, with the config's reads
        # recorded (since the config was made): a setting the user typed that none of it
        # read is refused (3)
        reads = start_tracking()
        try:
            _read_engine_settings(cfg)
            start = self._start(fabric)
        finally:
            reads = stop_tracking() | self._reads_before
        # 3. a setting typed that nothing read, refused before anything is written (not for
        # --eval-only: it runs no update, which reads the training settings)
        try:
            if cfg.eval_only:
                reads = set(typed_settings(cfg))
            self._check_typed(fabric, reads)
        except BaseException:
            start.close()
            raise
        if cfg.eval_only:
            try:
                built = start.built
                return _evaluate_only(
                    fabric, cfg, built.learner, built.env, start.run_dir, self.env_source
                )
            except KeyboardInterrupt:  # Ctrl-C: no checkpoint to speak of, unlike a training run
                raise KeyboardInterrupt(
                    "evaluation stopped (--eval-only trains nothing and writes no checkpoint)"
                ) from None
            finally:
                start.built.env.close()
        # 4. the run directory: created (old run moved aside with --overwrite) and locked
        try:
            lock = _agree(
                fabric,
                None,
                lambda: claim_run_dir(
                    start.run_dir, new_run=start.new_run, overwrite=cfg.overwrite
                ),
            )
        except BaseException:
            start.close()
            raise
        try:
            return self._train(fabric, start)
        finally:
            if lock is not None:
                lock.release()

    def _start(self, fabric) -> _Start:
        """Everything before the run directory is written: the run directory's checks, the
        env, learner, evaluator and restored state (:meth:`_build`), the collector and the
        first batch collected and learned from (every refusal the flags, the env's spaces
        and the first update decide happens here)."""
        cfg = self.cfg
        torch.set_num_threads(cfg.threads)
        run_dir = resolve_run_dir(cfg, self.algo)
        self._watch.where = partial(_kept, run_dir)
        resume_path = resume_checkpoint_path(cfg.resume, cfg.run_dir)
        new_run = resume_path is None and not cfg.eval_only
        save_token = uuid.uuid4().hex  # names this run's checkpoint saves (see _resume_rank)
        # checks that write nothing: the run directory
        run_dir, save_token = _agree(
            fabric,
            (run_dir, save_token),
            lambda: check_run_dir(run_dir, new_run=new_run, overwrite=cfg.overwrite),
        )
        try:
            built = self._build(fabric, resume_path)
        except EnvFault as err:  # an env's first, seeded reset (make_env)
            raise EnvFaultError(
                f"{err}; training stopped before its first batch, {_kept_at_start(resume_path)}"
            ) from None
        start = _Start(run_dir, resume_path, new_run, save_token, built)
        if cfg.eval_only:
            return start
        try:
            self._first_update(fabric, start)
        except NonFiniteError as err:
            start.close()
            advice = err.advice or "Lower the learning rate or clip gradients (--max-grad-norm)"
            raise NonFiniteError(
                f"{err}: training stopped; no checkpoint had been written yet. {advice}"
            ) from None
        except EnvFault as err:
            start.close()
            kept = _kept_at_start(start.resume_path)
            raise EnvFaultError(f"{err}; training stopped in its first batch, {kept}") from None
        except ActorLost as err:
            start.close()
            kept = _kept_at_start(start.resume_path)
            raise ActorLostError(f"{err}; training stopped in its first batch, {kept}") from None
        except BaseException:
            start.close()
            raise
        return start

    def _first_update(self, fabric, start: _Start) -> None:
        """The collector, the random streams of a resumed run, and the first batch and its
        update (none when a resumed run has its frames already)."""
        cfg, rank, built = self.cfg, fabric.global_rank, start.built
        env, learner, counters = built.env, built.learner, built.counters
        ctx = start.ctx = Context(fabric, cfg.total_frames, counters, compile=cfg.compile)
        # the seed this rank's envs and collector streams start from. A resumed run's counts
        # its frames: the run's first seeds again would replay its first episodes after
        # every resume
        seed = cfg.seed + 1000 * rank
        if start.resume_path is not None:
            seed += counters.frames
            self.mode.reseed(
                env, learner, seed, counters.frames, rank=rank, world_size=fabric.world_size
            )
        start.collector = batch_floor(
            learner, self.make_collector(env, learner, fabric.device, seed=seed), fabric
        )
        # random streams last, after everything built: the run goes on with the streams it
        # had when the checkpoint was written
        payload = built.payload
        if payload is not None:  # this rank's own state
            ckpt.set_rng_state(payload["rng"])
            self.mode.restore_streams(learner, payload)
            if "generator" in payload["rng"]:
                ctx.generator.set_state(payload["rng"]["generator"])
            else:  # checkpoints written before the generator was saved
                ctx.generator.manual_seed(cfg.seed + 1000 * rank + counters.frames)
        else:
            if start.resume_path is not None:  # rank 0's copy: a stream of this rank's own
                torch.manual_seed(cfg.seed + 1000 * rank + counters.frames)
            ctx.generator.manual_seed(cfg.seed + 1000 * rank + counters.frames)
        tick = time.perf_counter()
        start.iterator = iter(start.collector)
        if counters.frames < cfg.total_frames:
            batch = next(start.iterator)
            start.first = (batch, learner.update(batch, ctx))
        start.first_seconds = time.perf_counter() - tick  # its share of the training time

    def _check_typed(self, fabric, reads: set[str]) -> None:
        """Refuse a setting the user typed that nothing has read (:func:`typed_settings`),
        the same on every rank (the union of the ranks' reads: a population's ranks build
        different members)."""
        if fabric.world_size > 1:
            gathered: list[Any] = [None] * fabric.world_size
            torch.distributed.all_gather_object(gathered, sorted(reads))
            reads = set().union(*gathered)
        unread = unread_settings(self.cfg, reads)
        # a swept setting is typed too: each member's config has its own value of it
        unread += [n for n in _swept(self.cfg) if n not in reads and n not in unread]
        if unread:
            raise ValueError(_unread_message(self.cfg, unread, self.build))

    def _build(self, fabric, resume_path: Path | None) -> _Built:
        """Env, learner, evaluator (not for ``--eval-only``) and the resumed or warm-started
        state; the env is closed when anything fails."""
        from rlkit.envs import check_same_spaces, get_reward_norm, make_env

        cfg, rank, mode = self.cfg, fabric.global_rank, self.mode
        fabric.seed_everything(cfg.seed, verbose=False)  # identical networks on every rank
        split = {"rank": rank, "world_size": fabric.world_size}
        source = self.env_source
        env = mode.make_env(partial(make_env, source), **split)
        try:
            # statistics that live in the env (reward scaling) are checkpointed with the
            # learner; on several ranks each keeps its own, in its own file
            # (rank_checkpoint_path)
            reward_norm = get_reward_norm(env)
            env_modules = {"reward_norm": reward_norm} if reward_norm is not None else {}
            learner = mode.build(self.build, env, **split)
            modules = learner.modules()
            for m in modules.values():
                m.to(fabric.device)
            for optimizer in learner.optimizers().values():
                _speedups.skip_cpu_graph_capture_check(optimizer)
            if mode.replicated:
                _broadcast_parameters(fabric, modules)
            built = _Built(env, env_modules, learner)
            if cfg.eval_only:
                return built
            built.evaluator = _run_evaluator(cfg, fabric.device, source)
            if cfg.eval_env:
                check_same_spaces(env, built.evaluator.env, train_id=cfg.env, eval_id=cfg.eval_env)
            self._restore(fabric, resume_path, built)
            return built
        except BaseException:
            env.close()
            raise

    def _restore(self, fabric, resume_path: Path | None, built: _Built):
        """Resume from ``resume_path`` (this rank's own state) or warm start (--init-from)."""
        learner, counters, env_modules = built.learner, built.counters, built.env_modules
        if resume_path is not None:
            built.payload = self.mode.resume(fabric, resume_path, learner, counters, env_modules)
        elif self.cfg.init_from:
            self.mode.warm_start(fabric, Path(self.cfg.init_from), learner)

    def _train(self, fabric, start: _Start) -> dict[str, Any]:
        built, run_dir, resume_path = start.built, start.run_dir, start.resume_path
        learner, evaluator, counters = built.learner, built.evaluator, built.counters
        cfg, rank = self.cfg, fabric.global_rank
        try:
            log = RunLog(
                run_dir,
                total_frames=cfg.total_frames,
                enabled=rank == 0,
                progress=cfg.progress,
                scalars=cfg.log_scalars,
                resume_frames=counters.frames if resume_path is not None else None,
                loggers=cfg.logger,
                mlflow_uri=cfg.mlflow_uri,
            )
        except BaseException:
            start.close()
            raise
        if rank == 0:
            _save_config(cfg, run_dir / "config.yaml")
            # the config as the trackers' hyperparameters
            log.start(to_dict(cfg), resumed=resume_path is not None)
        scored = f", evaluated on {cfg.eval_env}" if cfg.eval_env else ""
        begun = f"resumed at {counters.frames:,} of " if resume_path is not None else ""
        preset = applied_preset(cfg)
        preset = f" ({preset})" if preset else ""
        log.progress.message(
            f"{self.algo} on {cfg.env}{preset}{scored}: {begun}{cfg.total_frames:,} frames, seed "
            f"{cfg.seed}, {fabric.world_size} process(es), run dir {run_dir}"
        )
        state = _LoopState(
            fabric, cfg, self.mode, learner, counters, log, evaluator, run_dir, start.save_token
        )
        state.extra_modules = built.env_modules
        state.env_source = self.env_source
        state.callbacks = self.callbacks if rank == 0 else ()
        state.generator = start.ctx.generator
        try:
            # the handlers stay through the final evaluation and checkpoint: a signal there
            # waits for them instead of ending the run before its last checkpoint
            with StopRequest(log.progress.message) as stop:
                try:
                    self._loop(state, start, stop)
                finally:
                    start.close()
                return state.finish(stop)
        except KeyboardInterrupt:  # RunInterrupted, or a second signal (stopped at once)
            log.close("interrupted")
            raise
        except CallbackError:
            log.close("failed")
            raise
        except EnvFault as err:
            log.close("failed")
            raise EnvFaultError(f"{err}; training stopped: {state.keep_last_batch()}") from None
        except ActorLost as err:
            log.close("failed")
            kept = state.keep_last_batch("see why the workers were lost")
            raise ActorLostError(f"{err}; training stopped: {kept}") from None
        except NonFiniteError as err:
            log.close("failed")
            last = run_dir / "checkpoints" / "last.pt"
            kept = (
                f"the last good checkpoint {str(last)!r} is intact"
                if last.exists()
                else ("no checkpoint had been written yet")
            )
            advice = err.advice or "Lower the learning rate or clip gradients (--max-grad-norm)"
            raise NonFiniteError(f"{err}: training stopped; {kept}. {advice}") from None

    def _loop(self, s: _LoopState, start: _Start, stop: StopRequest) -> None:
        cfg, counters, world = self.cfg, s.counters, s.fabric.world_size
        ctx, collector, iterator = start.ctx, start.collector, start.iterator
        # the first batch's time counts; the checks and the run directory's set-up do not
        tick = time.perf_counter() - start.first_seconds
        while counters.frames < cfg.total_frames:
            if start.first is not None:  # collected and learned from in Engine._start
                (batch, metrics), start.first = start.first, None
            else:
                batch = next(iterator)
                metrics = s.learner.update(batch, ctx)
            collector.update_policy_weights_()
            counters.frames += self.mode.frames(batch, world)
            counters.batches += 1
            now = time.perf_counter()
            counters.train_seconds += now - tick
            s.record(batch, metrics)
            solved = s.maybe_evaluate()
            s.maybe_checkpoint()
            if solved:  # finished: a stop request changes nothing
                break
            signum = stop.agreed(s.fabric)
            if signum and counters.frames < cfg.total_frames:
                s.interrupt(signum)  # after the last batch, finish() says the run is complete
            tick = time.perf_counter()


def batch_floor(learner: Learner, collector, fabric):
    """``collector`` wrapped in :class:`~rlkit.data.collector.EpisodeBatches` when the learner
    asks for a floor (``min_episodes`` or ``min_steps``: the GAE recipes' ``--min-episodes``,
    ``--min-steps``), else as it is. On several ranks the ranks agree after each chunk, so
    all collect the same number of chunks."""
    min_episodes, min_steps = learner.min_episodes, learner.min_steps
    if min_episodes is None and min_steps is None:
        return collector
    from rlkit.data.collector import EpisodeBatches

    def agree(enough: bool) -> bool:
        short = torch.tensor(0.0 if enough else 1.0, device=fabric.device)
        return float(fabric.all_reduce(short, reduce_op="sum")) == 0.0

    return EpisodeBatches(
        collector,
        min_episodes=min_episodes,
        min_frames=min_steps,
        agree=agree if fabric.world_size > 1 else None,
    )


def default_collector(env, learner: Learner, device, *, seed: int | None = None):
    """A synchronous, in-process collector over the batched env (seeded already: ``seed``,
    the engine's seed for this rank's collection, is for collectors with envs of their own).

    ``VectorEnvCollector`` steps ``make_env``'s gymnasium vector env directly and yields
    batches identical to TorchRL's ``Collector`` (tested key by key) at 2.2x its frames/s on
    CartPole (benchmarks/results/bench_collect.md); other envs fall back to ``Collector``.
    """
    from rlkit.data.collector import make_collector

    return make_collector(
        env,
        learner.collect_policy(),
        frames_per_batch=learner.frames_per_batch,
        total_frames=-1,
        device=device,
    )


class _LoopState:
    """Book-keeping of one run: metrics, evaluation, checkpoints, summary."""

    def __init__(
        self, fabric, cfg, mode, learner, counters, log, evaluator, run_dir, save_token
    ) -> None:
        self.fabric, self.cfg, self.learner = fabric, cfg, learner
        self.counters, self.log, self.evaluator, self.run_dir = counters, log, evaluator, run_dir
        self.extra_modules: dict[str, nn.Module] = {}
        self.env_source: Any = cfg.env  # the env factory of the run, else --env (videos)
        self.generator: torch.Generator | None = None  # Context.generator, checkpointed
        self.save_token = save_token  # the same on every rank (broadcast by rank 0)
        self.callbacks: tuple[Any, ...] = ()  # research code's hooks (rank 0's)
        self.recent_returns: list[float] = []
        self.last_eval: tuple[float, float] | None = None
        self.start_frames = counters.frames
        self.start_seconds = counters.train_seconds
        self.wall_start = time.perf_counter()
        #: the learner's breakdown of the last evaluation (``evaluation_details``), if any
        self.eval_details: dict[str, float] = {}
        #: what the run mode reports: the episodes and evaluations of the run, or of every
        #: member of a population (its rows, population.json)
        self.report: RunReport = mode.report(learner, fabric)
        self.report.load_state_dict(counters.report)

    @property
    def is_zero(self) -> bool:
        return self.fabric.global_rank == 0

    def record(self, batch: TensorDictBase, metrics: Mapping[str, float]) -> None:
        c = self.counters
        metrics, returns, lengths = self.report.gather(batch, metrics)  # the same on every rank
        self.recent_returns = (self.recent_returns + returns)[-20:]
        if c.batches % self.cfg.log_every == 0 or returns:
            row = self.report.write_rows(self.log, c.frames, batch, metrics)
            if returns:
                row["episode_return"] = sum(returns) / len(returns)
            if lengths:
                row["episode_length"] = sum(lengths) / len(lengths)
            row["fps"] = self._fps()
            row["train_seconds"] = c.train_seconds
            self.log.log(c.frames, row)
        if self.callbacks:
            self._call_back("on_batch", c.frames, self._batch_metrics(metrics, returns, lengths))
        fields = {"fps": f"{self._fps():,.0f}"}
        if self.recent_returns:
            fields["return"] = f"{sum(self.recent_returns) / len(self.recent_returns):.1f}"
        if self.last_eval is not None:
            fields["eval"] = f"{self.last_eval[0]:.1f}"
        self.log.progress.update(c.frames, fields)

    def _batch_metrics(self, metrics, returns: list[float], lengths: list[float]) -> dict:
        """What :meth:`Callback.on_batch` receives: the batch's metrics as the log row has
        them, every batch."""
        out = dict(metrics)
        if returns:
            out["episode_return"] = sum(returns) / len(returns)
        if lengths:
            out["episode_length"] = sum(lengths) / len(lengths)
        out["fps"], out["train_seconds"] = self._fps(), self.counters.train_seconds
        return out

    def _call_back(self, hook: str, *args: Any) -> None:
        call_back(self.callbacks, hook, *args, run_dir=self.run_dir, frames=self.counters.frames)

    def _fps(self) -> float:
        frames = self.counters.frames - self.start_frames
        seconds = self.counters.train_seconds - self.start_seconds
        return frames / seconds if seconds > 0 else 0.0

    def evaluate(self) -> tuple[float, float]:
        """Rank 0 evaluates; every rank receives the result."""
        result = torch.zeros(2, dtype=torch.float64)
        scored = self.report.evaluate(self.evaluator, self.counters, self.log)
        if scored is not None:  # on rank 0, or on every rank (a population's)
            mean, std, self.eval_details = scored
            result = torch.tensor([mean, std], dtype=torch.float64)
        self.counters.report = self.report.state_dict()
        if self.fabric.world_size > 1:
            result = self.fabric.broadcast(result, src=0)
        mean, std = float(result[0]), float(result[1])
        self.last_eval = (mean, std)
        c = self.counters
        c.last_eval_frames = c.frames
        self.log.log_eval(
            c.frames,
            c.train_seconds,
            mean,
            std,
            extra=self.eval_details,
            text=self.report.eval_text(mean, std),
        )
        if self.callbacks:
            seconds = round(c.train_seconds, 3)
            row = {"train_seconds": seconds, "return_mean": mean, "return_std": std}
            self._call_back("on_eval", c.frames, row | dict(self.eval_details))
        target = self.cfg.target_return
        if target is not None and self.report.reached(mean, target) and c.solved_frames is None:
            c.solved_frames, c.solved_seconds = c.frames, c.train_seconds
        if self.cfg.snapshot_best and (c.best_eval_return is None or mean > c.best_eval_return):
            c.best_eval_return = mean
            self.save_checkpoint(snapshot=False, names=("best.pt",))
        every = self.cfg.video_every
        if every and c.frames - c.last_video_frames >= every:
            c.last_video_frames = c.frames
            if self.is_zero:
                _try_video(
                    self.cfg,
                    self.learner,
                    self.run_dir,
                    print_fn=self.log.progress.message,
                    name=f"videos/eval_{c.frames:012d}.gif",
                    device=self.fabric.device,
                    env=self.env_source,
                )
        return mean, std

    def maybe_evaluate(self) -> bool:
        """Evaluate when due; True when the target return has been reached."""
        c, every = self.counters, self.cfg.eval_every
        if every and c.frames - c.last_eval_frames >= every:
            self.evaluate()
            return c.solved_frames is not None or self.report.ended()
        return False

    def maybe_checkpoint(self, *, force: bool = False) -> None:
        c, every = self.counters, self.cfg.checkpoint_every
        if force or (every and c.frames - c.last_checkpoint_frames >= every):
            c.last_checkpoint_frames = c.frames
            self.save_checkpoint(snapshot=not force)

    def interrupt(self, signum: int) -> None:
        """Stop on a signal (:mod:`rlkit.training.signals`): ``last.pt`` at this batch
        boundary (unless the periodic checkpoint has just written it), then
        :class:`RunInterrupted`. The counters keep the periodic schedule, so the resumed run
        evaluates and checkpoints at the frames the uninterrupted run would."""
        c = self.counters
        if c.last_checkpoint_frames != c.frames:
            self.save_checkpoint(snapshot=False)
        name = signal.Signals(signum).name
        last = self.run_dir / "checkpoints" / "last.pt"
        message = (
            f"{name}: stopped at {c.frames:,} of {self.cfg.total_frames:,} frames; checkpoint "
            f"{str(last)!r}; continue with --resume last --run-dir {self.run_dir}"
        )
        self.log.progress.message(message)
        raise RunInterrupted(message, signum=signum, frames=c.frames)

    def save_checkpoint(self, *, snapshot: bool, names: tuple[str, ...] = ("last.pt",)) -> None:
        modules = self.learner.modules()
        if not ckpt.all_finite(modules):
            raise NonFiniteError(f"non-finite parameters at {self.counters.frames:,} frames")
        payload = _payload(
            self.cfg,
            self.learner,
            self.counters,
            extra_modules=self.extra_modules,
            generator=self.generator,
        )
        payload["world_size"] = self.fabric.world_size
        # one CPU copy for every file of this save (last, snapshot, best): atomic_save's own
        # to_cpu then finds CPU tensors and copies nothing again
        payload = ckpt.to_cpu(payload)
        # the same id in every rank's file of this save: a resume pairs rank files by it
        payload["save_id"] = f"{self.save_token}:{self.counters.frames}"
        rank = self.fabric.global_rank
        folder = self.run_dir / "checkpoints"
        paths = [folder / name for name in names]
        if snapshot:
            paths.append(folder / f"frames_{self.counters.frames:012d}.pt")
        files = [(rank_checkpoint_path(path, rank), payload) for path in paths]
        snapshot_files = getattr(self.learner, "snapshot_files", None)  # Learner's hook
        if rank == 0 and snapshot_files is not None:  # stand-alone files (SVPG's particles)
            run = {k: payload[k] for k in ("algo", "env", "config")}
            run["frames"] = self.counters.frames
            for path in paths:
                extra = snapshot_files(path.stem, run)
                files += [(self.run_dir / rel, obj) for rel, obj in extra.items()]
        for target, obj in files:
            try:
                ckpt.atomic_save(obj, target)
            except OSError as err:
                reason = err.strerror or str(err) or type(err).__name__
                raise CheckpointWriteError(
                    f"could not write checkpoint {str(target)!r} ({reason}) at "
                    f"{self.counters.frames:,} frames; the previous checkpoint is intact: free "
                    f"space and continue with --resume last --run-dir {self.run_dir}"
                ) from None

    def keep_last_batch(self, fix: str = "fix the env") -> str:
        """After a fault inside a batch (an env's, a lost collector worker's), ``last.pt`` at
        the last complete batch: the learner and counters are as that batch's update left
        them. Says what was kept, and ``fix`` before the command that continues.
        On several ranks the other ranks write nothing now (they may be inside a collective),
        so the last checkpoint the ranks wrote together stays the one to resume."""
        c, run = self.counters, f"--resume last --run-dir {self.run_dir}"
        last = self.run_dir / "checkpoints" / "last.pt"
        if self.fabric.world_size > 1:
            if not last.exists():
                return "no checkpoint had been written yet"
            return f"the last checkpoint written {str(last)!r} is intact; continue with {run}"
        if c.batches == 0 and not last.exists():
            return "no batch had been completed, no checkpoint written"
        try:
            if c.last_checkpoint_frames != c.frames:
                self.save_checkpoint(snapshot=False)
        except (OSError, NonFiniteError) as err:
            kept = f"{str(last)!r} is the last one" if last.exists() else "none was written"
            return f"could not write a checkpoint ({_first_line(err)}); {kept}"
        return (
            f"checkpoint {str(last)!r} at the last complete batch ({c.frames:,} frames); {fix} "
            f"and continue with {run}"
        )

    def rank_param_max_diff(self) -> float | None:
        """Largest difference of any parameter between ranks (0.0 when they agree; None for
        a population, whose ranks hold different members)."""
        if not self.report.replicated and self.fabric.world_size > 1:
            return None
        if self.fabric.world_size == 1:
            return 0.0
        flat = torch.cat(
            [
                p.detach().reshape(-1)
                for m in self.learner.modules().values()
                for p in m.parameters()
            ]
        )
        high = self.fabric.all_reduce(flat.clone(), reduce_op="max")
        low = -self.fabric.all_reduce(-flat, reduce_op="max")
        return float((high - low).abs().max())

    def finish(self, stop: StopRequest | None = None) -> dict[str, Any]:
        """Final evaluation, checkpoint and results (summary.json, curve.png), then the
        optional extras (video), each of which warns in one line when it fails.

        The frames trained are checkpointed before the final evaluation, so a run killed
        during it (a second signal, or a scheduler's SIGKILL after its grace period) keeps
        them; ``--resume last`` then only evaluates. A first signal during these steps waits
        for them: the run is complete, and says so."""
        c, cfg = self.counters, self.cfg
        if self.last_eval is None or c.last_eval_frames != c.frames:
            if c.last_checkpoint_frames != c.frames:
                self.save_checkpoint(snapshot=False)  # the schedule's counters unchanged
            self.evaluate()
        self.maybe_checkpoint(force=True)
        mean, std = self.last_eval or (math.nan, math.nan)
        summary = {
            "algo": self.learner.algo,
            "env": cfg.env,
            "seed": cfg.seed,
            "frames": c.frames,
            "train_seconds": round(c.train_seconds, 3),
            "fps": round(c.frames / c.train_seconds, 1) if c.train_seconds else 0.0,
            "eval_return_mean": mean,
            "eval_return_std": std,
            "solved": c.solved_frames is not None,
            "solved_frames": c.solved_frames,
            "solved_seconds": None if c.solved_seconds is None else round(c.solved_seconds, 3),
            "wall_seconds": round(time.perf_counter() - self.wall_start, 3),
            "world_size": self.fabric.world_size,
            "rank_param_max_diff": self.rank_param_max_diff(),
            "run_dir": str(self.run_dir),
            "config": to_dict(cfg),
        }
        if self.is_zero:
            summary |= self.report.finish(self.run_dir, summary)
        self.log.finish(summary)
        self._call_back("on_end", summary)
        if self.is_zero and cfg.video:
            _try_video(
                cfg,
                self.learner,
                self.run_dir,
                print_fn=self.log.progress.message,
                device=self.fabric.device,
                env=self.env_source,
            )
        if stop is not None and stop.signum is not None:
            name = signal.Signals(stop.signum).name
            self.log.progress.message(
                f"{name} came after the last batch: the run is complete, its final "
                "evaluation and checkpoint are written"
            )
        solved = f", target reached at {c.solved_frames:,} frames" if summary["solved"] else ""
        self.log.progress.message(
            f"done: {c.frames:,} frames in {c.train_seconds:.1f} s ({summary['fps']:,.0f} "
            f"frames/s), {self.report.result_text(mean, std)}{solved}; results in {self.run_dir}"
        )
        return summary


def with_env(cfg: TrainConfig, env: str | Callable[..., Any]) -> tuple[TrainConfig, Any]:
    """``cfg`` naming ``env`` (its ``env`` field: the id, or the factory's import path
    ``module:qualname``, :func:`rlkit.envs.ids.factory_path`), and what to build the run's
    envs from: the id, or the factory itself. The stored name is what ``config.yaml``,
    ``summary.json``, the checkpoints and the run directory's name show, and what a resumed
    run builds its env from when no factory is passed again."""
    import dataclasses

    from rlkit.envs.ids import factory_path

    if isinstance(env, str):
        return dataclasses.replace(cfg, env=env), env
    if not callable(env):
        raise TypeError(
            f"env must be a gymnasium id or an env factory (a callable returning a gymnasium "
            f"env or a TorchRL EnvBase), got {type(env).__name__}"
        )
    name = factory_path(env)
    return (cfg if cfg.env == name else dataclasses.replace(cfg, env=name)), env


def run(
    cfg: TrainConfig,
    build: Callable[[Any, Any], Learner],
    *,
    algo: str,
    env: str | Callable[..., Any] | None = None,
    **kw,
) -> dict:
    """Train ``build(cfg, env)`` under ``cfg``; returns the run summary (also summary.json).

    ``env``: what every env of the run is built from instead of ``cfg.env``: a gymnasium id,
    or an env factory, a callable returning a gymnasium env, a gymnasium vector env or a
    TorchRL ``EnvBase`` (:func:`rlkit.envs.make_env` says how it is called, batched and
    seeded). It builds the training env on every rank, a population's env, the evaluation
    env (unless ``--eval-env``) and videos. The run stores the factory's import path
    ``module:qualname`` as its ``env``, so ``--resume`` builds it again; a factory without
    one (a lambda, a function defined inside another or in a script run as ``__main__``) must
    be passed again to resume, which a resume without it says in one line.

    ``callbacks``: research code's hooks, objects with any of ``on_batch(frames, metrics)``,
    ``on_eval(frames, metrics)`` and ``on_end(summary)`` (:class:`rlkit.training.Callback`),
    called on rank 0; one that raises stops the run in one line naming it
    (:class:`~rlkit.training.runlog.CallbackError`). ``make_collector`` replaces the
    collector. See docs/tracking.md.

    Third-party notices are silenced and tensordict's measured slow path is patched for the
    duration of the run only (``rlkit._quiet``, ``rlkit._speedups``).
    """
    with _quiet.quiet(), _speedups.patched():
        if getattr(cfg, "search", 0):  # --search N: trials of this run (docs/search.md)
            from rlkit.training.search import search

            return search(cfg, build, algo=algo, env=env, **kw)
        return Engine(cfg, build, algo=algo, env=env, **kw).fit()
