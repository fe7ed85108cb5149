r"""Advantage standardisation with statistics carried across batches.

:class:`RunningStandardizer` is pyrado's ``GAE(standardizer=RunningStandardizer())``: the
advantages of each batch are standardised with the mean and standard deviation of *every*
advantage seen so far (this batch's included), not of the batch or the minibatch alone.
It runs once per batch, after the value estimator and before the minibatches, so the loss
sees constants; its statistics are buffers (``stats.mean``, ``stats.var``, ``stats.count``,
float64), so a learner that lists it among its modules checkpoints and resumes them exactly.

Difference from pyrado: pyrado's ``RunningStandardizer`` runs Welford's update on each
batch's *mean* (it tracks the mean and the spread of the batch means, and returns the first
batch unchanged); here the statistics are those of all the advantage samples, merged per
batch with the parallel algorithm of Chan et al. (:class:`rlkit.modules.RunningMeanStd`
with no prior), so the first batch is standardised by its own statistics and later ones by
the pooled ones.
"""

from __future__ import annotations

import torch
from tensordict import NestedKey, TensorDictBase
from torch import Tensor, nn

from rlkit import keys
from rlkit.keys import MissingKeyError
from rlkit.modules.normalization import RunningMeanStd

__all__ = ["RunningStandardizer"]


class RunningStandardizer(nn.Module):
    r"""Standardise ``keys.ADVANTAGE`` with running statistics: :math:`(A - \mu)/(\sigma +
    \varepsilon)`, :math:`\mu, \sigma^2` the mean and population variance of all advantages
    passed so far, this call's included.

    Args:
        key: the key read and overwritten (default ``keys.ADVANTAGE``).
        eps: :math:`\varepsilon > 0` added to :math:`\sigma` (default ``1e-8``, as
            :func:`rlkit.objectives.standardize`).

    ``forward(td, samples=None)`` merges ``samples`` (default: ``td[key]``; a learner under
    DDP passes every rank's advantages so all ranks keep the same statistics) into the
    running statistics, then writes ``td[key]`` standardised (same shape and dtype) and
    returns ``td``. :meth:`update` and :meth:`standardize` are the two halves on tensors.

    Example:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> norm = RunningStandardizer()
        >>> td = TensorDict({"advantage": torch.tensor([[1.0], [3.0]])}, batch_size=[2])
        >>> norm(td)["advantage"].flatten().tolist()        # first batch: its own mean, std
        [-1.0, 1.0]
        >>> td = TensorDict({"advantage": torch.tensor([[5.0], [7.0]])}, batch_size=[2])
        >>> [round(x, 4) for x in norm(td)["advantage"].flatten().tolist()]  # mean 4, std 2.236
        [0.4472, 1.3416]
    """

    def __init__(self, *, key: NestedKey = keys.ADVANTAGE, eps: float = 1e-8) -> None:
        super().__init__()
        if isinstance(eps, bool) or not isinstance(eps, int | float) or not eps > 0:
            raise ValueError(f"RunningStandardizer: eps must be a number > 0, got {eps!r}")
        self.key, self.eps = key, float(eps)
        self.stats = RunningMeanStd((), epsilon=0.0)

    @property
    def mean(self) -> Tensor:
        return self.stats.mean

    @property
    def std(self) -> Tensor:
        return self.stats.std

    @property
    def count(self) -> Tensor:
        return self.stats.count

    @torch.no_grad()
    def update(self, samples: Tensor) -> None:
        """Merge every element of ``samples`` into the running statistics."""
        if not isinstance(samples, Tensor) or not samples.is_floating_point():
            raise TypeError(
                "RunningStandardizer.update needs a floating-point tensor of advantages, got "
                f"{getattr(samples, 'dtype', type(samples).__name__)}"
            )
        self.stats.update(samples.reshape(-1))

    @torch.no_grad()
    def standardize(self, x: Tensor) -> Tensor:
        """``(x - mean) / (std + eps)`` with the current statistics, in ``x``'s dtype."""
        if float(self.count) == 0:
            raise RuntimeError(
                "RunningStandardizer.standardize before any update: call update(samples) or "
                "the module on a batch first"
            )
        out = (x.to(torch.float64) - self.mean) / (self.std + self.eps)
        return out.to(x.dtype)

    @torch.no_grad()
    def forward(self, td: TensorDictBase, *, samples: Tensor | None = None) -> TensorDictBase:
        advantage = td.get(self.key, None)
        if advantage is None:
            raise MissingKeyError(
                f"RunningStandardizer: {keys.describe(self.key)} is missing: run a value "
                "estimator (e.g. rlkit.value.GAE) on the batch first"
            )
        self.update(advantage if samples is None else samples)
        td.set(self.key, self.standardize(advantage))
        return td

    def extra_repr(self) -> str:
        return f"key={self.key!r}, eps={self.eps}"
