"""Learning tests: fixed seeds, return thresholds, budgets well inside the issue's bars.

The full bars (5 seeds each) are measured by ``benchmarks/bench_learning.py``; these short
runs keep a regression in the update, estimator or engine from passing CI.
"""

from __future__ import annotations

import pytest

from tests.test_engine import load_recipe

QUIET = ["--progress", "false", "--eval-episodes", "10"]


@pytest.mark.slow
def test_ppo_solves_cartpole(tmp_path):
    summary = load_recipe("ppo").main(
        [
            *QUIET,
            "--seed",
            "11",
            "--target-return",
            "475",
            "--total-frames",
            "60000",
            "--eval-every",
            "5000",
            "--run-dir",
            str(tmp_path),
        ]
    )
    assert summary["solved"], summary["eval_return_mean"]
    assert summary["eval_return_mean"] >= 475


@pytest.mark.slow
def test_ppo_learns_pendulum(tmp_path):
    summary = load_recipe("ppo").main(
        [
            *QUIET,
            "--env",
            "Pendulum-v1",
            "--seed",
            "11",
            "--target-return",
            "-300",
            "--total-frames",
            "102400",
            "--eval-every",
            "20480",
            "--run-dir",
            str(tmp_path),
        ]
    )
    assert summary["solved"], summary["eval_return_mean"]
    assert summary["eval_return_mean"] >= -300  # a random policy scores about -1200


@pytest.mark.slow
def test_a2c_solves_cartpole(tmp_path):
    summary = load_recipe("a2c").main(
        [
            *QUIET,
            "--seed",
            "11",
            "--target-return",
            "475",
            "--total-frames",
            "150000",
            "--eval-every",
            "10000",
            "--run-dir",
            str(tmp_path),
        ]
    )
    assert summary["solved"], summary["eval_return_mean"]
