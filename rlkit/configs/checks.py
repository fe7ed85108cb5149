"""Validation shared by the algorithm configs (on top of ``rlkit.configs.base``'s helpers).

``positive`` / ``non_negative`` compare with ``<=`` / ``<``, which NaN passes; a NaN or an
infinite learning rate, coefficient or discount would then run and end in a non-finite loss
(or, for an update-to-data ratio, never end); a value beyond float32's range (the
parameters' dtype) overflows inside the optimiser. :func:`finite_floats` refuses them for
every float field an algorithm declares, before anything is built.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from rlkit.configs.base import TrainConfig

#: float fields where ``inf`` means "no limit" (a clip level): infinities allowed, NaN and
#: finite values beyond float32 not
UNBOUNDED = frozenset({"max_grad_norm", "rho_clip", "c_clip", "pg_rho_clip", "rnd_obs_clip"})

#: the largest float32 (``torch.finfo(torch.float32).max``): a larger value overflows to inf
FLOAT32_MAX = 3.4028234663852886e38

_ENGINE_FIELDS = frozenset(f.name for f in dataclasses.fields(TrainConfig))


def finite_floats(cfg: Any) -> None:
    """Raise a ValueError naming the flag when a float field of ``cfg`` (other than the
    engine's own, :class:`~rlkit.training.TrainConfig`'s) is NaN, or infinite where
    :data:`UNBOUNDED` does not allow it (beyond :data:`FLOAT32_MAX` counts as infinite)."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if f.name in _ENGINE_FIELDS or isinstance(value, bool) or not isinstance(value, float):
            continue
        flag = "--" + f.name.replace("_", "-")
        if math.isnan(value):
            raise ValueError(f"{flag} must be a number, got nan")
        if abs(value) <= FLOAT32_MAX or (f.name in UNBOUNDED and math.isinf(value)):
            continue
        if f.name in UNBOUNDED:  # a huge finite clip overflows when compared in float32
            raise ValueError(
                f"{flag} must be within float32's +-3.4e38, or inf for no limit, got {value}"
            )
        raise ValueError(f"{flag} must be finite (within float32's +-3.4e38), got {value}")


#: help text of ``lr_decay_frames``, declared by the on- and off-policy configs
LR_DECAY_FRAMES_HELP = (
    "frames over which --lr-schedule linear (or cosine) reaches --lr-final, which it then "
    "holds (RLlib's decay_steps, in frames); none: the whole --total-frames"
)

#: the schedules ``--lr-decay-frames`` shapes
SPANNED_SCHEDULES = ("linear", "cosine")


def check_lr_decay_frames(cfg: Any) -> None:
    """``--lr-decay-frames`` must be > 0 and only shapes ``--lr-schedule linear`` / ``cosine``."""
    if cfg.lr_decay_frames is None:
        return
    if cfg.lr_decay_frames <= 0:
        raise ValueError(f"--lr-decay-frames must be > 0, got {cfg.lr_decay_frames}")
    if cfg.lr_schedule not in SPANNED_SCHEDULES:
        raise ValueError(
            f"--lr-decay-frames {cfg.lr_decay_frames} shapes --lr-schedule linear (or cosine), "
            f"but the schedule is {cfg.lr_schedule}: add --lr-schedule linear or drop "
            "--lr-decay-frames"
        )


def check_lr_gamma(cfg: Any) -> None:
    """``--lr-schedule exponential`` needs ``--lr-gamma`` in (0, 1]; nothing else reads it."""
    gamma = cfg.lr_gamma
    if cfg.lr_schedule != "exponential":
        if gamma is not None:
            raise ValueError(
                f"--lr-gamma {gamma} is the factor of --lr-schedule exponential, but the "
                f"schedule is {cfg.lr_schedule}: add --lr-schedule exponential or drop --lr-gamma"
            )
        return
    if gamma is None:
        raise ValueError(
            "--lr-schedule exponential multiplies the learning rate by --lr-gamma after every "
            "update: set it, e.g. --lr-gamma 0.99"
        )
    if not 0 < gamma <= 1:
        raise ValueError(
            f"--lr-gamma must be in (0, 1] (1: constant; above 1 the rate grows without "
            f"bound), got {gamma}"
        )


def check_batch_floor(cfg: Any) -> None:
    """``--min-episodes`` / ``--min-steps``: ints >= 1 (or none), one member per run."""
    for name in ("min_episodes", "min_steps"):
        value = getattr(cfg, name)
        flag = "--" + name.replace("_", "-")
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(
                f"{flag} must be a whole number >= 1 (or none for one --rollout-steps chunk "
                f"per batch), got {value!r}"
            )
        if len(cfg.population_members()) > 1:
            raise ValueError(
                f"{flag} gives batches of varying length, which a --population / --sweep run "
                "cannot stack across its members: drop one or the other"
            )
