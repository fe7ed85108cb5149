"""Settings of the test processes themselves (pytest and its xdist workers)."""

from __future__ import annotations

import torch


def pytest_configure(config):
    # One intra-op thread per test process, as every recipe runs by default (--threads 1).
    # Tests that build learners directly would otherwise use a thread per core, and with
    # -n 2 on two cores the workers' threads wait on each other: a population test took
    # 2.5x the CPU time and wall time with torch's default.
    torch.set_num_threads(1)
