"""Target networks with an exact, resumable update schedule (DQN, SAC, TD3, ...).

:class:`TargetNetwork` holds a frozen deep copy :math:`\\bar\\theta` of a source network
:math:`\\theta` and updates it every ``period`` calls to :meth:`TargetNetwork.step`:

- ``mode="hard"`` (DQN, Mnih et al. 2015): :math:`\\bar\\theta \\leftarrow \\theta` at steps
  ``period, 2 * period, ...``;
- ``mode="soft"`` (DDPG, Lillicrap et al. 2016; SAC): Polyak averaging
  :math:`\\bar\\theta \\leftarrow (1 - \\tau)\\,\\bar\\theta + \\tau\\,\\theta` at the same steps
  (``period=1``: every step).

Buffers (e.g. observation-normaliser statistics inside the source) are copied exactly at
every update in both modes: averaging counters or running statistics would be meaningless.

Why not TorchRL's ``HardUpdate``: ``HardUpdate(value_network_update_interval=k)`` updates
every ``k + 1`` steps (measured on torchrl 0.14.1; see ARCHITECTURE.md), and its counter
is not part of any ``state_dict``, so a resumed run restarts the schedule.
"""

from __future__ import annotations

import copy
from typing import Any, Literal

import torch
from tensordict import NestedKey, TensorDictBase
from torch import Tensor, nn

from rlkit.modules.direct import module_output

__all__ = ["TargetNetwork", "call_network"]


def _check_args(mode: str, period: int, tau: float) -> None:
    if mode not in ("hard", "soft"):
        raise ValueError(f"mode must be 'hard' or 'soft', got {mode!r}")
    if isinstance(period, bool) or not isinstance(period, int) or period < 1:
        raise ValueError(
            f"period must be an int >= 1 (update every `period` learner steps), got {period!r}"
        )
    if not isinstance(tau, int | float) or not 0.0 < tau <= 1.0:
        raise ValueError(
            f"tau must satisfy 0 < tau <= 1 (Polyak weight of the source; 0.005 in SAC), "
            f"got {tau!r}"
        )


class TargetNetwork(nn.Module):
    """A frozen copy of ``source`` updated on a fixed schedule of learner steps.

    Args:
        source: the online network (any ``nn.Module``, e.g. a TorchRL ``TensorDictModule``).
            It is referenced, not registered: ``TargetNetwork.parameters()`` and its
            ``state_dict`` hold only the target copy and the step counter.
        mode: ``"hard"`` (copy) or ``"soft"`` (Polyak average).
        period: update every ``period`` calls to :meth:`step` (>= 1).
        tau: Polyak weight of the source for ``mode="soft"``, ``0 < tau <= 1``;
            ignored by hard updates.

    Attributes:
        module: the target copy (same type as ``source``: a ``TensorDictModule`` source
            gives a target callable on a TensorDict). ``requires_grad`` is False.
        step_count: int64 buffer, learner steps seen; saved in ``state_dict`` so a resumed
            run continues the schedule.

    Calling the ``TargetNetwork`` calls ``module``.

    Example:
        >>> online = nn.Linear(2, 1)
        >>> target = TargetNetwork(online, mode="hard", period=3)
        >>> [target.step() for _ in range(6)]
        [False, False, True, False, False, True]
    """

    step_count: torch.Tensor

    def __init__(
        self,
        source: nn.Module,
        *,
        mode: Literal["hard", "soft"] = "hard",
        period: int = 1,
        tau: float = 0.005,
    ) -> None:
        super().__init__()
        if not isinstance(source, nn.Module):
            raise TypeError(f"source must be an nn.Module, got {type(source).__name__}")
        _check_args(mode, period, tau)
        self.mode = mode
        self.period = period
        self.tau = float(tau)
        # Kept out of the module tree: a plain list hides it from parameters()/state_dict().
        self._source = [source]
        self.module = copy.deepcopy(source)
        self.module.requires_grad_(False)
        self.module.train(False)
        self.register_buffer("step_count", torch.zeros((), dtype=torch.int64))
        self._check_structure()

    @property
    def source(self) -> nn.Module:
        """The online network the target tracks."""
        return self._source[0]

    def _pairs(self) -> tuple[list[torch.Tensor], list[torch.Tensor], list[Any], list[Any]]:
        src_p = [p for _, p in self.source.named_parameters()]
        tgt_p = [p for _, p in self.module.named_parameters()]
        src_b = [b for _, b in self.source.named_buffers()]
        tgt_b = [b for _, b in self.module.named_buffers()]
        return src_p, tgt_p, src_b, tgt_b

    def _check_structure(self) -> None:
        src = [n for n, _ in self.source.named_parameters()]
        tgt = [n for n, _ in self.module.named_parameters()]
        src += [n for n, _ in self.source.named_buffers()]
        tgt += [n for n, _ in self.module.named_buffers()]
        if src != tgt:
            raise RuntimeError(
                "source and target networks no longer have the same parameters/buffers; "
                "do not add or remove submodules of the source after creating its target"
            )

    @torch.no_grad()
    def hard_update(self) -> None:
        """Copy parameters and buffers now: :math:`\\bar\\theta \\leftarrow \\theta`."""
        src_p, tgt_p, src_b, tgt_b = self._pairs()
        for t, s in zip(tgt_p + tgt_b, src_p + src_b, strict=True):
            t.copy_(s)

    @torch.no_grad()
    def soft_update(self) -> None:
        """Polyak step now: :math:`\\bar\\theta \\leftarrow (1-\\tau)\\bar\\theta + \\tau\\theta`;
        buffers are copied."""
        src_p, tgt_p, src_b, tgt_b = self._pairs()
        if tgt_p:
            torch._foreach_lerp_(tgt_p, src_p, self.tau)
        for t, s in zip(tgt_b, src_b, strict=True):
            t.copy_(s)

    def step(self) -> bool:
        """Count one learner step; update if the count is a multiple of ``period``.

        Call it once per optimiser step of the source, after ``optimizer.step()``.
        Returns whether the target was updated.
        """
        self.step_count += 1
        if int(self.step_count) % self.period != 0:
            return False
        if self.mode == "hard":
            self.hard_update()
        else:
            self.soft_update()
        return True

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def train(self, mode: bool = True) -> TargetNetwork:
        """Keep the target copy in eval mode (no dropout noise, frozen batch-norm stats)."""
        super().train(mode)
        self.module.train(False)
        return self

    def extra_repr(self) -> str:
        tau = f", tau={self.tau}" if self.mode == "soft" else ""
        return f"mode={self.mode!r}, period={self.period}{tau}"


def call_network(
    network: nn.Module,
    tensordict: TensorDictBase,
    out_key: NestedKey,
    overrides: dict[NestedKey, Tensor] | None = None,
) -> Tensor:
    """``network(tensordict)[out_key]``, with ``overrides`` replacing some inputs, without
    writing into ``tensordict``.

    A plain ``TensorDictModule`` / ``ValueOperator`` (also inside a
    :class:`~rlkit.modules.TargetNetwork`) is called on its input tensors directly, which is
    what its ``forward`` does, minus the TensorDict bookkeeping (about half the cost of a
    small MLP's forward on the CPU): :func:`rlkit.modules.direct.module_output`.
    """
    inner = network.module if isinstance(network, TargetNetwork) else network
    return module_output(inner, tensordict, out_key, overrides, call=network)
