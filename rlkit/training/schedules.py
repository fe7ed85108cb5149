"""Hyperparameter schedules.

Frame-driven schedules (:func:`linear`, :func:`cosine`) are pure functions of training
progress (frames done / total frames), so a resumed run lands on the same schedule position
without saving anything. The per-update :class:`ExponentialLR` and the adaptive KL learning
rate depend on history (updates done, measured KL) and keep their state in ``state_dict``.

Every schedule returns a Python float, which the learners write into the optimisers'
``param_groups`` (:func:`set_lr`): the learning rate is read by the optimiser step, outside
the compiled loss of ``--compile``, so a changing rate never recompiles anything (the loss
hyperparameters that a compiled graph reads are tensors instead, see
:class:`rlkit.objectives.common.Hyperparameter`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

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
