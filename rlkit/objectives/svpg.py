r"""Stein variational policy gradient (SVPG): the RBF kernel and the Stein update, as pure
functions on flattened particle parameters.

SVPG (Liu, Ramachandran, Liu & Peng 2017) keeps :math:`P` policy particles
:math:`\theta_1..\theta_P \in \mathbb{R}^D` and moves them along the Stein variational
gradient (SVGD, Liu & Wang 2016) of the distribution
:math:`q(\theta) \propto \exp(J(\theta) / \alpha)` (a flat prior :math:`q_0`):

.. math::
    \phi(\theta_i) = \frac1P \sum_{j=1}^{P} \Big[
        k(\theta_j, \theta_i)\, \frac{\nabla_{\theta_j} J(\theta_j)}{\alpha}
        + \nabla_{\theta_j} k(\theta_j, \theta_i) \Big],
    \qquad \theta_i \leftarrow \theta_i + \epsilon\, \phi(\theta_i).

The first term is a kernel-weighted average of the particles' policy gradients (the
driving force), the second pushes particles apart (the repulsive force); the temperature
:math:`\alpha` trades them off. With one particle :math:`\phi = \nabla J / \alpha`; as
:math:`\alpha \to \infty` only the repulsion is left.

Kernel (the convention of Liu & Wang's reference SVGD code, ``svgd.py`` in
``dilinwang820/Stein-Variational-Gradient-Descent``, which pyrado's ``SVPG.kernel`` copies):

.. math::
    k(x, y) = \exp\big(-\lVert x - y\rVert^2 / h\big), \qquad
    h = \frac{\mathrm{med}}{\log(P + 1)},

where :math:`\mathrm{med}` is the median (``numpy.median`` semantics: the mean of the two
middle values for an even count) of all :math:`P^2` entries of the squared-distance matrix
:math:`\lVert\theta_i - \theta_j\rVert^2`, **diagonal zeros included**. (The reference
code writes :math:`\exp(-d^2 / 2h_r^2)` with :math:`h_r^2 = \tfrac12 \mathrm{med} / \log(P+1)`,
which is the same kernel.) For two particles at distance :math:`d` this gives
:math:`\mathrm{med} = d^2/2` and :math:`k_{12} = \exp(-2\log 3) = 1/9`. When the median is
0 (one particle, or more than half the entries zero, e.g. all particles equal) ``h = 1``
is used instead of dividing by zero; for coincident particles ``K`` is all ones and the
repulsion is 0 whatever ``h`` is. The bandwidth is treated as a constant with respect to
:math:`\theta` (the median is not differentiated), as in the reference code.

The repulsion summed over :math:`j` has the closed form

.. math::
    \sum_j \nabla_{\theta_j} k(\theta_j, \theta_i)
        = \frac{2}{h} \sum_j k_{ij} (\theta_i - \theta_j)
        = \frac{2}{h}\Big(\theta_i \sum_j k_{ij} - (K\theta)_i\Big),

the ``dxkxy`` of the reference code. It points away from the other particles.

References: Liu, Ramachandran, Liu & Peng 2017, "Stein Variational Policy Gradient"
(arXiv:1704.02399); Liu & Wang 2016, "Stein Variational Gradient Descent" (NeurIPS);
pyrado ``pyrado/algorithms/meta/svpg.py`` (``SVPG.step`` / ``SVPG.kernel``). Deviation from
pyrado: pyrado stores the *loss* gradient (the descent direction :math:`-\nabla J`) and
feeds ``(K g / alpha + dxkxy) / P`` to a minimising optimiser, which flips the sign of the
repulsion (the particles attract). Here :func:`stein_update` takes the ascent direction
:math:`\nabla J` and returns the ascent direction :math:`\phi`; a learner sets
``param.grad = -phi`` for its minimising optimiser.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor

__all__ = ["median_bandwidth", "rbf_kernel", "stein_update"]


def _check_particles(theta: Tensor, name: str = "theta") -> None:
    if not isinstance(theta, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor [P, D], got {type(theta).__name__}")
    if theta.dim() != 2:
        raise ValueError(
            f"{name} must be 2-D [particles, parameters], got shape {list(theta.shape)}: "
            "flatten each particle's parameters into one row"
        )
    if theta.shape[0] < 1:
        raise ValueError(f"{name} needs at least 1 particle (row), got {theta.shape[0]}")
    if not theta.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {theta.dtype}")


def _check_positive(name: str, value: object, hint: str) -> float:
    if isinstance(value, Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be finite and > 0, got {value!r} ({hint})")
    return value


def squared_distances(theta: Tensor) -> Tensor:
    r"""Pairwise squared Euclidean distances :math:`\lVert\theta_i - \theta_j\rVert^2`,
    ``[P, P]``, computed from differences (no :math:`\lVert x\rVert^2 + \lVert y\rVert^2 -
    2x^\top y` cancellation), with an exactly zero diagonal."""
    _check_particles(theta)
    dist = torch.cdist(theta, theta, compute_mode="donot_use_mm_for_euclid_dist")
    return dist.square().fill_diagonal_(0.0)


def median_bandwidth(theta: Tensor) -> Tensor:
    r"""The median heuristic :math:`h = \mathrm{med} / \log(P+1)` (see the module docstring).

    ``med`` is the median of all :math:`P^2` squared distances, diagonal included, with
    ``numpy.median``'s averaging of the two middle values (``torch.median`` would return the
    lower one). Returns a 0-d tensor; ``1.0`` when the median is 0.

    Example:
        >>> round(float(median_bandwidth(torch.tensor([[0.0], [1.0]]))), 6)  # (1/2) / log 3
        0.45512
    """
    num = theta.shape[0] if isinstance(theta, Tensor) and theta.dim() == 2 else 0
    sq = squared_distances(theta)
    med = torch.quantile(sq.reshape(-1).double(), 0.5)  # linear interpolation = np.median
    h = med / math.log(num + 1)
    return torch.where(h > 0, h, torch.ones_like(h)).to(theta.dtype)


def rbf_kernel(theta: Tensor, *, bandwidth: float | Tensor | None = None) -> tuple[Tensor, Tensor]:
    r"""RBF kernel matrix and the summed kernel gradient (the SVGD repulsion).

    .. math::
        K_{ij} = \exp(-\lVert\theta_i - \theta_j\rVert^2 / h), \qquad
        \mathrm{grad\_K}_i = \sum_j \nabla_{\theta_j} k(\theta_j, \theta_i)
            = \frac2h \Big(\theta_i \sum_j K_{ij} - \sum_j K_{ij}\theta_j\Big).

    Args:
        theta: ``[P, D]`` particles, one flattened parameter vector per row (``P >= 1``).
        bandwidth: ``h > 0``; ``None`` (default) uses :func:`median_bandwidth`. Either way
            ``h`` is a constant with respect to ``theta``.

    Returns:
        ``(K, grad_K)``: ``K`` ``[P, P]`` symmetric with a unit diagonal; ``grad_K``
        ``[P, D]``, row ``i`` the repulsion acting on particle ``i``. One particle gives
        ``K = [[1]]`` and ``grad_K = 0``.

    Example:
        >>> K, grad_K = rbf_kernel(torch.tensor([[0.0], [1.0]]), bandwidth=1.0)
        >>> [round(v, 4) for v in K[0].tolist()], [round(v, 4) for v in grad_K[:, 0].tolist()]
        ([1.0, 0.3679], [-0.7358, 0.7358])
    """
    sq = squared_distances(theta)
    if bandwidth is None:
        h = median_bandwidth(theta)
    else:
        h = _check_positive("bandwidth", bandwidth, "the RBF kernel width h in exp(-d^2 / h)")
    kernel = torch.exp(-sq / h)
    grad_kernel = (theta * kernel.sum(dim=1, keepdim=True) - kernel @ theta) * (2.0 / h)
    return kernel, grad_kernel


def stein_update(
    theta: Tensor,
    grads: Tensor,
    *,
    temperature: float,
    bandwidth: float | Tensor | None = None,
) -> Tensor:
    r"""The Stein variational policy gradient :math:`\phi` (an ascent direction), ``[P, D]``.

    .. math::
        \phi_i = \frac1P \sum_j \Big[ K_{ji} \frac{\nabla J(\theta_j)}{\alpha}
            + \nabla_{\theta_j} k(\theta_j, \theta_i) \Big]
        = \frac1P\Big(\frac{K\, G}{\alpha} + \mathrm{grad\_K}\Big)_i

    with :math:`G` the stacked policy gradients and :math:`K` symmetric.

    Args:
        theta: ``[P, D]`` particle parameters (flattened).
        grads: ``[P, D]`` each particle's policy gradient :math:`\nabla_\theta J` (the
            ascent direction: the negative of a loss gradient).
        temperature: :math:`\alpha > 0`; large values weight the repulsion, small ones the
            policy gradients (the SVPG paper searches 0.001 to 10).
        bandwidth: kernel width ``h``; ``None`` (default) uses the median heuristic.

    Returns:
        ``phi`` ``[P, D]``. A minimising optimiser steps along ``-phi``: set
        ``param.grad = -phi``. One particle gives ``phi = grads / temperature``.

    Example:
        >>> theta, g = torch.tensor([[0.0], [1.0]]), torch.tensor([[1.0], [1.0]])
        >>> phi = stein_update(theta, g, temperature=1.0, bandwidth=1.0)
        >>> [round(v, 5) for v in phi.flatten().tolist()]  # (1 - 1/e) / 2, (1 + 3/e) / 2
        [0.31606, 1.05182]
    """
    _check_particles(theta)
    _check_particles(grads, "grads")
    if grads.shape != theta.shape:
        raise ValueError(
            f"grads has shape {list(grads.shape)} but theta has {list(theta.shape)}: pass "
            "one policy gradient row per particle, flattened like its parameters"
        )
    alpha = _check_positive(
        "temperature", temperature, "the SVPG temperature alpha; typical 0.001 to 10"
    )
    kernel, grad_kernel = rbf_kernel(theta, bandwidth=bandwidth)
    return (kernel @ grads / alpha + grad_kernel) / theta.shape[0]
