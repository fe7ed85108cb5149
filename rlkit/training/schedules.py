"""Hyperparameter schedules.

Frame-driven schedules (:func:`linear`, :func:`cosine`) are pure functions of training
progress (frames done / total frames), so a resumed run lands on the same schedule position
without saving anything. The per-update :class:`ExponentialLR` and the adaptive KL learning
rate depend on history (updates done, measured KL) and keep their state in ``state_dict``.

:class:`LRSchedule` is the one learning-rate schedule every learner follows (``--lr-schedule``
of every recipe, or one built in research code): it composes these and an attached
``torch.optim.lr_scheduler``.

Every schedule returns a Python float, which the learners write into the optimisers'
``param_groups`` (:func:`set_lr`): the learning rate is read by the optimiser step, outside
the compiled loss of ``--compile``, so a changing rate never recompiles anything (the loss
hyperparameters that a compiled graph reads are tensors instead, see
:class:`rlkit.objectives.common.Hyperparameter`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch-free at run time
    from torch.optim import Optimizer


def linear(start: float, end: float, progress: float) -> float:
    """Linear interpolation from ``start`` (progress 0) to ``end`` (progress >= 1)."""
    p = min(max(progress, 0.0), 1.0)
    return start + (end - start) * p


def cosine(start: float, end: float, progress: float) -> float:
    r"""Cosine annealing from ``start`` (progress 0) to ``end`` (progress >= 1):
    :math:`\text{end} + (\text{start} - \text{end}) (1 + \cos(\pi p)) / 2` with ``p``
    clipped to [0, 1] (``torch.optim.lr_scheduler.CosineAnnealingLR`` over the budget, without
    restarts)."""
    p = min(max(progress, 0.0), 1.0)
    return end + (start - end) * (1.0 + math.cos(math.pi * p)) / 2.0


def span_progress(progress: float, total_frames: int, span_frames: int | None) -> float:
    """``progress`` (frames / ``total_frames``) re-expressed over a schedule that spans
    ``span_frames`` frames instead (RLlib's ``decay_steps``): frames / ``span_frames``,
    past 1 once the span is over (:func:`linear` then holds its end value); ``progress``
    itself when ``span_frames`` is None."""
    return progress if span_frames is None else progress * total_frames / span_frames


def set_lr(optimizer: Optimizer, lr: float) -> None:
    """Set the learning rate of every parameter group."""
    for group in optimizer.param_groups:
        group["lr"] = lr


@dataclass
class ExponentialLR:
    """``lr x gamma^n`` after ``n`` updates (``torch.optim.lr_scheduler.ExponentialLR``
    stepped once per update, pyrado's ``lr_scheduler=ExponentialLR``): :meth:`step` after each
    update. The rate is computed from the count, not multiplied in, so it is the same float
    ``lr * gamma ** n`` however long the run and across a resume."""

    start: float
    gamma: float
    updates: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.gamma <= 1:
            raise ValueError(f"--lr-gamma must be in (0, 1], got {self.gamma}")

    @property
    def lr(self) -> float:
        return self.start * self.gamma**self.updates

    def step(self) -> float:
        self.updates += 1
        return self.lr

    def state_dict(self) -> dict[str, int]:
        return {"updates": self.updates}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.updates = int(state["updates"])


@dataclass
class KLAdaptiveLR:
    """Learning rate adapted from the measured KL of each update phase.

    After an update phase with mean approximate KL ``kl``: if ``kl > factor_kl * target``
    the learning rate is divided by ``factor_lr``; if ``kl < target / factor_kl`` it is
    multiplied by ``factor_lr``; it stays within ``[lr_min, lr_max]``. This is the rule of
    rl_games and of the IMPACT learner the kit's APPO follows (targets about 0.008-0.02).
    """

    lr: float
    target: float
    lr_min: float = 1e-6
    lr_max: float = 1e-2
    factor_kl: float = 2.0
    factor_lr: float = 1.5

    def __post_init__(self) -> None:
        if self.target <= 0:
            raise ValueError(
                f"--kl-target must be > 0 for the adaptive learning rate, got {self.target}"
            )
        if not 0 < self.lr_min <= self.lr <= self.lr_max:
            raise ValueError(
                f"need 0 < lr_min <= lr <= lr_max, got {self.lr_min}, {self.lr}, {self.lr_max}"
            )

    def update(self, kl: float) -> float:
        if kl > self.factor_kl * self.target:
            self.lr = max(self.lr / self.factor_lr, self.lr_min)
        elif kl < self.target / self.factor_kl:
            self.lr = min(self.lr * self.factor_lr, self.lr_max)
        return self.lr

    def state_dict(self) -> dict[str, float]:
        return {"lr": self.lr}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.lr = float(state["lr"])


#: the kinds of :class:`LRSchedule` (``--lr-schedule``)
LR_SCHEDULE_KINDS = ("constant", "linear", "cosine", "exponential", "kl")


class LRSchedule:
    """The learning rate of a run: one object per learner, whatever the schedule.

    Args:
        kind: ``constant`` (``lr``), ``linear`` or ``cosine`` (``lr`` to ``final`` over the
            frame budget, or over ``span_frames``, then ``final`` held: :func:`linear`,
            :func:`cosine`), ``exponential`` (``lr x gamma^n`` after ``n`` updates:
            :class:`ExponentialLR`) or ``kl`` (adapted to each update's measured KL:
            :class:`KLAdaptiveLR`, given as ``kl``).
        lr: the initial rate (the base every other optimiser's rate follows in proportion).
        final: the end rate of ``linear`` and ``cosine``.
        total_frames: the frame budget (``--total-frames``); needed with ``span_frames``.
        span_frames: frames over which ``linear`` / ``cosine`` reach ``final``
            (``--lr-decay-frames``); None: the whole budget.
        gamma: the factor of ``exponential`` (``--lr-gamma``).
        kl: the adaptive rule of ``kl`` (its ``lr`` is the initial rate).

    A learner reads :meth:`lr_at` before each update (``progress``: frames done / budget),
    calls :meth:`observe_kl` with the update's mean approximate KL and :meth:`step` after it.
    ``linear`` and ``cosine`` are pure functions of ``progress``; ``exponential``, ``kl`` and
    an attached scheduler (:meth:`attach`) keep their state in :meth:`state_dict`.

    >>> s = LRSchedule("linear", 1e-3, final=0.0)
    >>> s.lr_at(0.25)
    0.00075
    >>> s = LRSchedule("exponential", 1.0, gamma=0.5)
    >>> s.step(); s.step(); s.lr_at(0.9)
    0.25
    """

    def __init__(
        self,
        kind: str,
        lr: float,
        *,
        final: float | None = None,
        total_frames: int | None = None,
        span_frames: int | None = None,
        gamma: float | None = None,
        kl: KLAdaptiveLR | None = None,
    ) -> None:
        if kind not in LR_SCHEDULE_KINDS:
            raise ValueError(f"lr schedule must be one of {LR_SCHEDULE_KINDS}, got {kind!r}")
        if kind in ("linear", "cosine") and final is None:
            raise ValueError(f"lr schedule {kind!r} needs its final rate (final=)")
        if span_frames is not None and total_frames is None:
            raise ValueError("span_frames needs total_frames (the span is a share of the budget)")
        if (kind == "exponential") != (gamma is not None):
            raise ValueError(f"gamma= is the factor of lr schedule 'exponential', not {kind!r}")
        if (kind == "kl") != (kl is not None):
            raise ValueError(f"kl= is the adaptive rule of lr schedule 'kl', not {kind!r}")
        self.kind, self.lr, self.final = kind, float(lr), final
        self.total_frames, self.span_frames = total_frames, span_frames
        self.kl = kl
        self.exp_lr = ExponentialLR(self.lr, gamma) if gamma is not None else None
        #: a ``torch.optim.lr_scheduler`` driving the rate (:meth:`attach`), or None
        self.lr_scheduler: Any = None

    def __repr__(self) -> str:
        return f"LRSchedule({self.kind!r}, {self.lr})"

    @property
    def adapts_to_kl(self) -> bool:
        """Whether :meth:`observe_kl` moves the rate (``kl``)."""
        return self.kl is not None

    def attach(self, scheduler: Any) -> None:
        """Drive the rate with ``scheduler`` (a ``torch.optim.lr_scheduler``): :meth:`lr_at`
        reads its optimiser's rate, :meth:`step` steps it, :meth:`state_dict` holds its state.
        Only a ``constant`` schedule takes one (any other would overwrite its rate)."""
        if self.kind != "constant":
            raise ValueError(
                f"the learner already follows --lr-schedule {self.kind}, which would overwrite "
                "the scheduler's rate: build it with lr_schedule='constant'"
            )
        self.lr_scheduler = scheduler

    def lr_at(self, progress: float) -> float:
        """The rate of the next update at ``progress`` (frames done / budget, in [0, 1])."""
        if self.kind in ("linear", "cosine"):
            assert self.final is not None
            p = span_progress(progress, self.total_frames or 0, self.span_frames)
            shape = linear if self.kind == "linear" else cosine
            return shape(self.lr, self.final, p)
        if self.kl is not None:
            return self.kl.lr
        if self.exp_lr is not None:
            return self.exp_lr.lr
        if self.lr_scheduler is not None:
            return float(self.lr_scheduler.optimizer.param_groups[0]["lr"])
        return self.lr

    def observe_kl(self, kl: float) -> None:
        """After an update: the update's mean approximate KL (``kl`` schedules adapt)."""
        if self.kl is not None:
            self.kl.update(kl)

    def step(self) -> None:
        """After an update: ``exponential`` counts it, an attached scheduler steps."""
        if self.exp_lr is not None:
            self.exp_lr.step()
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()

    def state_dict(self) -> dict[str, Any]:
        """The history a resume needs, under the keys learners have always checkpointed it:
        ``kl_lr``, ``exp_lr``, ``lr_scheduler`` (none for ``constant``, ``linear``,
        ``cosine``)."""
        state: dict[str, Any] = {}
        if self.kl is not None:
            state["kl_lr"] = self.kl.state_dict()
        if self.exp_lr is not None:
            state["exp_lr"] = self.exp_lr.state_dict()
        if self.lr_scheduler is not None:
            state["lr_scheduler"] = self.lr_scheduler.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` wrote (keys of other schedules are ignored)."""
        if self.kl is not None and "kl_lr" in state:
            self.kl.load_state_dict(state["kl_lr"])
        if self.exp_lr is not None and "exp_lr" in state:
            self.exp_lr.load_state_dict(state["exp_lr"])
        if self.lr_scheduler is not None and "lr_scheduler" in state:
            self.lr_scheduler.load_state_dict(state["lr_scheduler"])


# exploration ------------------------------------------------------------------------------
def linear_epsilon(start: float, end: float, fraction: float, progress: float) -> float:
    """:math:`\\epsilon` from ``start`` to ``end`` over the first ``fraction`` of the budget
    (SB3's ``exploration_fraction``), then ``end``."""
    if fraction <= 0:
        return end
    return linear(start, end, progress / fraction)


def exponential_epsilon(start: float, end: float, decay: float, batches: int) -> float:
    """:math:`\\epsilon_k = \\max(\\epsilon_{end}, \\epsilon_0 \\gamma_\\epsilon^k)` after k
    batches (the seed's ``eps_schedule_gamma``; ``decay = 1`` keeps it constant)."""
    return max(end, start * decay**batches)


@dataclass(frozen=True)
class EpsilonSchedule:
    """Exploration of DQN after the initial random fill (``learning_starts`` frames).

    ``"linear"``: from ``start`` to ``end`` over the first ``fraction`` of the frame budget
    (SB3's ``exploration_fraction``); ``"exponential"``: ``max(end, start * decay**k)``
    after ``k`` collected batches (the seed's ``eps_schedule_gamma``).
    """

    kind: str = "linear"
    start: float = 1.0
    end: float = 0.05
    fraction: float = 0.1
    decay: float = 0.99

    def __post_init__(self) -> None:
        if self.kind not in ("linear", "exponential"):
            raise ValueError(
                f"--epsilon-schedule must be 'linear' or 'exponential', got {self.kind!r}"
            )
        for name in ("start", "end", "fraction", "decay"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                flag = {"fraction": "exploration-fraction", "decay": "epsilon-decay"}.get(
                    name, f"epsilon-{name}"
                )
                raise ValueError(f"--{flag} must be in [0, 1], got {value}")

    def value(self, *, progress: float, batches: int) -> float:
        if self.kind == "linear":
            return linear_epsilon(self.start, self.end, self.fraction, progress)
        return exponential_epsilon(self.start, self.end, self.decay, batches)
