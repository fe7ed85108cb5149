"""Aggregate statistics over runs, torch-free: the interquartile mean and its bootstrap
confidence interval (Agarwal et al. 2021, "Deep RL at the Edge of the Statistical
Precipice"), used by population reports and ``benchmarks/bench_learning.py``."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["bootstrap_ci", "iqm"]


def iqm(values: Sequence[float]) -> float:
    """Interquartile mean as rliable computes it (``metrics.aggregate_iqm``, which is
    ``scipy.stats.trim_mean(values, 0.25)``): drop ``int(n / 4)`` values from each end of
    the sorted ``values`` and average the rest. For ``n`` a multiple of 4 that is exactly the
    middle 50%. (Until 2026-11-26 this weighted the boundary values fractionally, which
    differs from rliable's for other ``n``: e.g. -84.9 against -81.7 on seven runs.)"""
    x = sorted(float(v) for v in values)
    n = len(x)
    if n == 0:
        raise ValueError("iqm of no values")
    cut = n // 4
    middle = x[cut : n - cut]
    return sum(middle) / len(middle)


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
