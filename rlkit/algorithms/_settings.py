"""What a recipe's ``build`` reads from its config for the pieces every learner takes: the
optimiser (:func:`config_optimizer`, through the one factory
:func:`rlkit.training.optim.make_optimizer`) and the learning-rate schedule
(:func:`config_lr_schedule`, the one :class:`rlkit.training.schedules.LRSchedule`).

Learners take these objects, never the config: a setting is read here, by the build, and
only when it applies (``--adam-eps`` not for SGD, ``--lr-final`` only for a linear or cosine
schedule, the ``--kl-*`` settings only for ``--lr-schedule kl``), so a setting typed without
its switch is one that nothing read, and the engine refuses it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rlkit.training.optim import make_optimizer
from rlkit.training.schedules import KLAdaptiveLR, LRSchedule

__all__ = ["config_lr_schedule", "config_optimizer"]


def config_optimizer(cfg: Any, params: Iterable[Any], *, lr: float | None = None):
    """``--optimizer`` over ``params`` at ``lr`` (default ``--lr``), with ``--adam-eps``
    (all but sgd) and ``--weight-decay``: :func:`~rlkit.training.optim.make_optimizer`."""
    kind = cfg.optimizer
    return make_optimizer(
        kind,
        params,
        lr=cfg.lr if lr is None else lr,
        eps=None if kind == "sgd" else cfg.adam_eps,
        weight_decay=cfg.weight_decay,
    )


def config_lr_schedule(cfg: Any) -> LRSchedule:
    """``--lr-schedule`` from ``--lr``: ``linear`` / ``cosine`` to ``--lr-final`` over the
    budget (or ``--lr-decay-frames``), ``exponential`` by ``--lr-gamma``, ``kl`` from
    ``--kl-target`` and the other ``--kl-*`` settings, or ``constant``."""
    kind = cfg.lr_schedule
    if kind in ("linear", "cosine"):
        return LRSchedule(
            kind,
            cfg.lr,
            final=cfg.lr_final,
            total_frames=cfg.total_frames,
            span_frames=cfg.lr_decay_frames,
        )
    if kind == "exponential":
        return LRSchedule(kind, cfg.lr, gamma=cfg.lr_gamma)
    if kind == "kl":
        rule = KLAdaptiveLR(
            lr=cfg.lr,
            target=cfg.kl_target,
            lr_min=cfg.kl_lr_min,
            lr_max=cfg.kl_lr_ceiling,
            factor_kl=cfg.kl_factor,
            factor_lr=cfg.kl_lr_factor,
        )
        return LRSchedule(kind, cfg.lr, kl=rule)
    return LRSchedule(kind, cfg.lr)
