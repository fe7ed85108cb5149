"""Hyperparameter schedules.

Frame-driven schedules are pure functions of training progress (frames done / total frames),
so a resumed run lands on the same schedule position without saving anything. The adaptive
KL learning rate depends on history and keeps its state in :meth:`KLAdaptiveLR.state_dict`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch-free at run time: configs (rlkit.configs.dqn) use these schedules
    from torch.optim import Optimizer


def linear(start: float, end: float, progress: float) -> float:
    """Linear interpolation from ``start`` (progress 0) to ``end`` (progress >= 1)."""
    p = min(max(progress, 0.0), 1.0)
    return start + (end - start) * p


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
