"""Minibatch iteration over a flat TensorDict batch."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from tensordict import TensorDictBase


def minibatch_indices(
    n: int, minibatch_size: int, *, generator: torch.Generator | None = None
) -> list[torch.Tensor]:
    """A random partition of ``range(n)`` into chunks of ``minibatch_size``.

    The last chunk is shorter when ``minibatch_size`` does not divide ``n``; every sample is
    used exactly once per epoch.
    """
    if minibatch_size <= 0:
        raise ValueError(f"minibatch_size must be > 0, got {minibatch_size}")
    if minibatch_size > n:
        raise ValueError(
            f"minibatch_size {minibatch_size} is larger than the batch ({n} samples): lower "
            "--minibatch-size or raise --num-envs x --rollout-steps"
        )
    perm = torch.randperm(n, generator=generator)
    return list(perm.split(minibatch_size))


def minibatches(
    batch: TensorDictBase, minibatch_size: int, *, generator: torch.Generator | None = None
) -> Iterator[TensorDictBase]:
    """Yield random minibatches of a 1-D TensorDict, covering it once."""
    if batch.batch_dims != 1:
        raise ValueError(f"expected a flat [B] TensorDict, got batch size {tuple(batch.shape)}")
    for idx in minibatch_indices(batch.shape[0], minibatch_size, generator=generator):
        yield batch[idx]
