"""Settings of the test processes themselves (pytest and its xdist workers), and the shared
two-rank runs (tests/ddp_shared.py)."""

from __future__ import annotations

import os

import pytest
import torch


def pytest_configure(config):
    # One intra-op thread per test process, as every recipe runs by default (--threads 1).
    # Tests that build learners directly would otherwise use a thread per core, and with
    # -n 2 on two cores the workers' threads wait on each other: a population test took
    # 2.5x the CPU time and wall time with torch's default.
    torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    """Long tests first (the shared two-rank runs, then the other slow tests, each in file
    order), so that a worker is not left alone with a long test while the other has none."""

    def rank(item) -> int:
        if item.get_closest_marker("ddp_jobs"):
            return 0
        return 1 if item.get_closest_marker("slow") else 2

    items.sort(key=rank)  # stable


@pytest.fixture(scope="session")
def _ddp_launch(request, tmp_path_factory):
    """The two-rank runs of every selected test (``@pytest.mark.ddp_jobs``), in one launch
    per session: the first xdist worker to need them runs it, another waits for it."""
    from filelock import FileLock

    from tests import ddp_shared

    names = sorted(
        {n for item in request.session.items for m in item.iter_markers("ddp_jobs") for n in m.args}
    )
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "ddp-shared"
    with FileLock(f"{root}.lock"):
        if not (root / "spec.json").is_file():
            ddp_shared.launch(root, names)
    return {job.name: ddp_shared.Result(job, root) for job in ddp_shared.with_earlier(names)}


@pytest.fixture
def ddp_jobs(request, _ddp_launch):
    """The outcomes of this test's two-rank runs (``@pytest.mark.ddp_jobs("name", ...)``,
    tests/ddp_shared.py's JOBS), by name."""
    names = [n for m in request.node.iter_markers("ddp_jobs") for n in m.args]
    assert names, "mark the test with @pytest.mark.ddp_jobs(...)"
    return {name: _ddp_launch[name] for name in names}
