"""Aggregate statistics over runs, torch-free: the interquartile mean and its bootstrap
confidence interval (Agarwal et al. 2021, "Deep RL at the Edge of the Statistical
Precipice"), used by population reports and ``benchmarks/bench_learning.py``."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["bootstrap_ci", "iqm"]


def iqm(values: Sequence[float]) -> float:
    """Interquartile mean: the mean of the middle 50% of ``values`` (Agarwal et al. 2021),
    with the quartile boundaries splitting a value by weight when ``n`` is not a multiple
    of 4 (as ``scipy.stats.trim_mean`` does not; rliable uses this fractional form)."""
    x = sorted(float(v) for v in values)
    n = len(x)
    if n == 0:
        raise ValueError("iqm of no values")
    lo, hi = n / 4, 3 * n / 4
    total = 0.0
    for i, v in enumerate(x):  # the weight of sample i inside [lo, hi]
        w = max(0.0, min(i + 1, hi) - max(i, lo))
        total += w * v
    return total / (hi - lo)


def bootstrap_ci(
    values: Sequence[float], *, reps: int = 2000, level: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of the IQM over runs (the rliable protocol's
    stratified bootstrap, with one task: runs are resampled with replacement)."""
    import numpy as np

    x = np.asarray(values, dtype=np.float64)
    rng = np.random.default_rng(seed)
    stats = [iqm(x[rng.integers(0, len(x), len(x))]) for _ in range(reps)]
    low, high = np.quantile(stats, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)
