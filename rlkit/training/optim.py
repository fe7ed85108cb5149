"""The one optimiser factory: every learner's optimisers are built by :func:`make_optimizer`.

A recipe's ``build`` reads ``--optimizer``, ``--lr``, ``--adam-eps`` and ``--weight-decay``
and calls it; research code calls it (or passes any ``torch.optim.Optimizer`` of its own) the
same way. The settings are torch's, chosen once here for speed: Adam and AdamW fused, RMSprop
and SGD foreach (see the measurements below).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["OPTIMIZER_KINDS", "make_like", "make_optimizer", "unique_parameters"]

#: the kinds :func:`make_optimizer` builds
OPTIMIZER_KINDS = ("adam", "adamw", "rmsprop", "sgd")


def make_optimizer(
    kind: str,
    params: Iterable[Any],
    *,
    lr: float,
    eps: float | None,
    weight_decay: float | None = None,
    alpha: float = 0.99,
    momentum: float = 0.0,
    centered: bool = False,
) -> torch.optim.Optimizer:
    """A ``kind`` optimiser over ``params`` at ``lr``.

    Args:
        kind: ``adam``, ``adamw`` (decoupled weight decay), ``rmsprop`` or ``sgd``.
        params: tensors, or parameter groups (dicts, each with its own ``lr`` if it likes).
        lr: the learning rate (of every group that names none).
        eps: the epsilon of Adam, AdamW and RMSprop (SGD has none: pass None).
        weight_decay: the optimiser's weight decay; None: torch's default (0.01 for AdamW,
            0 for the others).
        alpha, momentum, centered: RMSprop's smoothing constant, momentum and centring
            (0.99, 0, False: the on-policy recipes'; DQN's centered RMSprop of Mnih et al.
            2015 passes 0.95, 0.95, True with ``eps=0.01``).

    Raises:
        ValueError: an unknown ``kind``, or ``eps`` None for a kind that needs one.
    """
    if kind not in OPTIMIZER_KINDS:
        raise ValueError(f"optimizer must be one of {OPTIMIZER_KINDS}, got {kind!r}")
    if eps is None and kind != "sgd":
        raise ValueError(f"optimizer {kind!r} needs an eps (only sgd has none)")
    params = list(params)
    kw: dict[str, Any] = {}
    if weight_decay is not None:
        kw["weight_decay"] = weight_decay
    # Adam: fused (one kernel for every parameter, CPU and CUDA), measured 140 us per step
    # here against 374 us for foreach and 491 us for torch's CPU default (a Python loop over
    # parameters); for a [256, 256] MLP 0.15 ms against 0.38 ms with foreach=True and 0.40 ms
    # with the per-parameter loop. RMSprop has no fused kernel, so foreach (for DQN's centered
    # RMSprop bit for bit what torch's default loop computes on the CPU, measured over 200
    # steps, and what torch picks by itself on CUDA).
    if kind == "rmsprop":
        return torch.optim.RMSprop(
            params,
            lr=lr,
            eps=eps,
            alpha=alpha,
            momentum=momentum,
            centered=centered,
            foreach=True,
            **kw,
        )
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr, foreach=True, **kw)
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=lr, eps=eps, fused=True, **kw)
    return torch.optim.Adam(params, lr=lr, eps=eps, fused=True, **kw)


def make_like(
    optimizer: torch.optim.Optimizer, params: Iterable[Any], *, lr: float
) -> torch.optim.Optimizer:
    """A new optimiser over ``params`` at ``lr`` with the kind and settings of ``optimizer``
    (one :func:`make_optimizer` built): e.g. an intrinsic reward's, like the policy's.

    Raises:
        TypeError: ``optimizer`` is not of a kind :func:`make_optimizer` builds.
    """
    kinds = {
        torch.optim.AdamW: "adamw",
        torch.optim.Adam: "adam",
        torch.optim.RMSprop: "rmsprop",
        torch.optim.SGD: "sgd",
    }
    kind = kinds.get(type(optimizer))
    if kind is None:
        raise TypeError(
            f"cannot build an optimiser like a {type(optimizer).__name__} (only "
            f"{', '.join(OPTIMIZER_KINDS)}): pass one built for the new parameters"
        )
    settings = optimizer.defaults
    extra: dict[str, Any] = {}
    if kind == "rmsprop":
        extra = {k: settings[k] for k in ("alpha", "momentum", "centered")}
    return make_optimizer(
        kind,
        params,
        lr=lr,
        eps=settings.get("eps"),
        weight_decay=settings["weight_decay"],
        **extra,
    )


def unique_parameters(
    *sources: torch.nn.Module | Iterable[torch.Tensor], but: Iterable[torch.Tensor] = ()
) -> list[torch.Tensor]:
    """The parameters of ``sources`` (modules, or iterables of tensors), each once (shared
    trunks), in order of first appearance, without those in ``but``."""
    skip = {id(p) for p in but}
    out: dict[int, torch.Tensor] = {}
    for source in sources:
        params = source.parameters() if isinstance(source, torch.nn.Module) else source
        for p in params:
            if id(p) not in skip:
                out.setdefault(id(p), p)
    return list(out.values())
