"""What an algorithm gives the engine (:class:`Learner`) and what its update sees of the engine
(:class:`Context`: device, ranks, progress, the optimiser step), with the run's
:class:`Counters`. The engine (:mod:`rlkit.training.engine`) and the population
(:mod:`rlkit.training.population`) both build on these; importable from the engine too."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict import TensorDictBase
from torch import nn

from rlkit import keys
from rlkit.training.errors import NonFiniteError


class Learner:
    """What the engine needs from an algorithm.

    A learner owns its networks (``modules``), optimisers and the update rule. The engine
    owns everything else: collection, counters, evaluation, checkpoints and logs.
    """

    algo: str = "learner"
    #: modules a warm start (``--init-from``) copies; default: all of them
    warm_start_modules: tuple[str, ...] | None = None
    #: in a population (:mod:`rlkit.training.population`), each member runs its own
    #: :meth:`update` in turn (PPG, IMPALA, APPO) instead of stepping with the others
    population_sequential: bool = False
    #: collect in this process even where the recipe's collector runs worker processes: the
    #: learner's env and collection policy stand for the workers (a population's do)
    collects_in_process: bool = False
    #: a batch holds at least this many finished episodes (per rank; the collector runs more
    #: chunks of ``frames_per_batch`` until it does: :class:`rlkit.data.collector.EpisodeBatches`)
    min_episodes: int | None = None
    #: ... and at least this many frames (per rank)
    min_steps: int | None = None

    def use_rows(self, num_envs: int) -> None:
        """In a population (:mod:`rlkit.training.population`) the learner was built on the
        env of every member's rows and trains on its own ``num_envs`` rows: what it sized by
        the env (an intrinsic reward's per-env returns) is resized to them. Nothing here."""

    def shared_update(self) -> bool:
        """Whether :meth:`update` is ``prepare``, ``phases`` and ``finish`` (the on-policy
        learners' shared update), which a population runs for all members at once."""
        return False

    def modules(self) -> dict[str, nn.Module]:
        raise NotImplementedError

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        raise NotImplementedError

    @property
    def frames_per_batch(self) -> int:
        raise NotImplementedError

    def collect_policy(self) -> nn.Module:
        """The policy the collector runs (samples actions, writes ``action_log_prob``)."""
        raise NotImplementedError

    def eval_policy(self) -> nn.Module:
        """The policy evaluated deterministically (defaults to the collection policy)."""
        return self.collect_policy()

    def update(self, batch: TensorDictBase, ctx: Context) -> dict[str, float]:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """Extra learner state (schedules, counters) as tensors and plain containers."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        del state

    def snapshot_files(self, checkpoint: str, run: Mapping[str, Any]) -> dict[str, Any]:
        """Stand-alone files to write with each checkpoint (rank 0, atomically, after it):
        ``{path relative to the run directory: payload}``, each payload safe to load
        (tensors and plain containers, ``torch.load(weights_only=True)``).

        ``checkpoint`` is the checkpoint's name without ``.pt`` (``"last"``, ``"best"``,
        ``"frames_000000020000"``); ``run`` holds ``algo``, ``env``, ``frames`` and the run's
        ``config`` (as stored in the checkpoint). Default: none (SVPG writes one file per
        particle)."""
        del checkpoint, run
        return {}


@dataclass
class Counters:
    frames: int = 0
    batches: int = 0
    updates: int = 0
    train_seconds: float = 0.0
    solved_frames: int | None = None
    solved_seconds: float | None = None
    last_eval_frames: int = 0
    last_checkpoint_frames: int = 0
    last_video_frames: int = 0
    best_eval_return: float | None = None
    #: the run mode's report state (a population's: the frames each member reached the
    #: target at); checkpointed as ``population``, its name before run modes
    report: dict[str, Any] = field(default_factory=dict)

    def state_dict(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["population"] = state.pop("report")  # the checkpoints' key
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for k, v in state.items():
            k = "report" if k == "population" else k
            if k in self.__dict__:
                setattr(self, k, v)


@dataclass
class Context:
    """What an update sees of the engine: device, ranks, progress, and the optimiser step."""

    fabric: Any
    total_frames: int
    counters: Counters
    generator: torch.Generator = field(default_factory=torch.Generator)
    #: ``--compile``: :func:`rlkit.training.update.update_loop` compiles the losses it runs
    compile: bool = False
    _params: dict[int, list[torch.Tensor]] = field(default_factory=dict, repr=False)

    @property
    def device(self) -> torch.device:
        return self.fabric.device

    @property
    def world_size(self) -> int:
        return self.fabric.world_size

    @property
    def progress(self) -> float:
        """Fraction of the frame budget done, in [0, 1]: the x of every schedule."""
        return min(self.counters.frames / self.total_frames, 1.0)

    def all_reduce_mean(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1:
            return tensor
        # NCCL reduces GPU tensors only: a CPU tensor goes to the rank's device first
        return self.fabric.all_reduce(tensor.to(self.device), reduce_op="mean")

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Stack ``tensor`` from every rank along a new leading dim (none on one rank)."""
        if self.world_size == 1:
            return tensor
        return self.fabric.all_gather(tensor.to(self.device))

    def _optimizer_params(self, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
        params = self._params.get(id(optimizer))
        if params is None:
            params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
            self._params[id(optimizer)] = params
        return params

    def step_optimizer(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        max_grad_norm: float | None = None,
        transform_grads: Callable[[], None] | None = None,
        loss: torch.Tensor | float | None = None,
    ) -> float:
        """All-reduce the gradients already in ``optimizer``'s parameters, clip, check, step.

        ``transform_grads`` (optional) runs after the all-reduce and before clipping: it may
        rewrite the parameters' ``.grad`` in place (SVPG's Stein update mixes the particles'
        gradients there), and sees the same averaged gradients on every rank.
        Returns the gradient norm before clipping. Raises :class:`NonFiniteError` when a
        gradient is NaN or inf: the decision is taken on all-reduced gradients, so every rank
        stops together (``loss``, when given, is quoted in the message).
        """
        params = self._optimizer_params(optimizer)
        if self.world_size > 1:
            # a non-finite loss on any rank stops every rank: its value rides in the
            # gradients' all-reduce (a sum, so NaN or inf anywhere is NaN or inf everywhere)
            total = self._all_reduce_grads(params, extra=loss)
            if total is not None and not math.isfinite(total):
                loss = total
        if transform_grads is not None:
            transform_grads()
        if max_grad_norm:
            norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm, foreach=True)
        else:
            # the norm only: clip_grad_norm_ with an infinite bound scales every gradient by
            # exactly 1 after computing this same norm (one multiply per parameter skipped)
            grads = [p.grad for p in params if p.grad is not None]
            norm = torch.nn.utils.get_total_norm(grads, foreach=True)
        if isinstance(loss, torch.Tensor):  # one transfer for both (a loss term without a
            # graph adds nothing to the gradient: its value is checked here or nowhere)
            norm_value, loss_value = torch.stack((norm.float(), loss.float().to(norm))).tolist()
        else:
            norm_value, loss_value = float(norm), (0.0 if loss is None else float(loss))
        if not (math.isfinite(norm_value) and math.isfinite(loss_value)):
            shown = "?" if loss is None else f"{loss_value:.4g}"
            raise NonFiniteError(
                f"non-finite loss or gradient (loss {shown}, gradient norm "
                f"{norm_value}) at {self.counters.frames:,} frames"
            )
        optimizer.step()
        self.counters.updates += 1
        return norm_value

    def _all_reduce_grads(
        self, params: list[torch.Tensor], *, extra: torch.Tensor | float | None = None
    ) -> float | None:
        """Average gradients over ranks in one all-reduce of a flat buffer.

        A parameter that no rank reached keeps ``grad = None``, so the optimiser skips it
        exactly as it does on one rank (e.g. an auxiliary head outside its phase); one that
        some rank reached gets the mean over ranks, a rank that did not reach it counting 0.
        ``extra`` (a scalar, the loss) is summed over the ranks in the same all-reduce and
        returned (``None`` without one).
        """
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flags = [float(p.grad is not None) for p in params]
        tail = len(params) + (extra is not None)
        reached = torch.tensor(flags, dtype=grads[0].dtype, device=grads[0].device)
        parts = [*(g.reshape(-1) for g in grads), reached]
        if extra is not None:
            parts.append(
                torch.as_tensor(extra, dtype=reached.dtype, device=reached.device).reshape(1)
            )
        flat = self.fabric.all_reduce(torch.cat(parts), reduce_op="sum")
        summed = float(flat[-1]) if extra is not None else None
        reached = flat[-tail : len(flat) - tail + len(params)].tolist()
        flat = flat[:-tail] / self.world_size
        offset = 0
        for p, g, used in zip(params, grads, reached):
            n = g.numel()
            if used == 0:
                p.grad = None
            elif p.grad is None:
                p.grad = flat[offset : offset + n].view_as(p).clone()
            else:
                p.grad.copy_(flat[offset : offset + n].view_as(p))
            offset += n
        return summed


# --------------------------------------------------------------------------- helpers


def episode_stats(batch: TensorDictBase) -> tuple[list[float], list[float]]:
    """Returns and lengths of the episodes that ended in ``batch`` (collector keys)."""
    done = batch.get(keys.DONE).reshape(-1)
    if not done.any():
        return [], []
    returns = batch.get(keys.EPISODE_RETURN).reshape(-1)[done].tolist()
    lengths = []
    if keys.STEP_COUNT in batch.keys(include_nested=True):
        lengths = batch.get(keys.STEP_COUNT).reshape(-1)[done].float().tolist()
    return returns, lengths
