"""PPO learns a MultiDiscrete task with a mask and a hybrid-action task (issue 47, "Action
spaces"), at a CPU test's size. The 5-seed runs to the bars of docs/actions.md are in
benchmarks/results/learning_ppo_rlkit-MultiPick-v0.md and
learning_ppo_rlkit-HybridReach-v0.md.

``rlkit/MultiPick-v0``: random valid play scores 15, the best valid play 20 (a masked pick
would end the episode at -1). ``rlkit/HybridReach-v0``: random play scores about -10, the best
kind aimed at the centre 3.2, a random kind with a perfect aim 5, the best play 7.5.
"""

from __future__ import annotations

import pytest

from tests.test_engine import load_recipe


def train(tmp_path, env, *, frames, seed=0):
    flags = ["--progress", "false", "--eval-episodes", "10", "--env", env, "--seed", str(seed)]
    flags += ["--total-frames", str(frames), "--eval-every", str(frames)]
    return load_recipe("ppo").main([*flags, "--run-dir", str(tmp_path / "run")])


@pytest.mark.slow
def test_ppo_learns_the_multidiscrete_task(tmp_path):
    summary = train(tmp_path, "rlkit/MultiPick-v0", frames=4096)
    assert summary["eval_return_mean"] >= 17.5  # random valid play: 15


@pytest.mark.slow
def test_ppo_learns_both_parts_of_the_hybrid_task(tmp_path):
    summary = train(tmp_path, "rlkit/HybridReach-v0", frames=8192)
    # the aim is learned: the best kind aimed at the centre scores 3.2
    assert summary["eval_return_mean"] >= 4.0
