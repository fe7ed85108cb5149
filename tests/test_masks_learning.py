"""PPO and DQN learn a masked task (``rlkit/MaskedPick-v0``) in 5/5 seeds, and the same runs
without the mask do worse (issue 47, "Masks").

The task (:mod:`rlkit.envs.masked`): 8 items with values in [0, 1], 4 of them on offer at each
step and chosen at random, 20 steps. Picking an item not on offer ends the episode (reward -1).
Random valid picks score 10, the best valid pick 16 on average, and a policy that cannot read the
mask about 0 (it loses the episode on every other step). The bar: a deterministic evaluation
(10 episodes) of at least 15.

Measured with these flags (2 shared, busy cores; ``benchmarks/results/bench_masked.md``):
PPO reaches the bar in 5/5 seeds at 4,096, 6,144, 4,096, 4,096 and 6,144 frames (seeds 0-4,
evaluated every 2,048); DQN in 5/5 seeds at its first evaluation, 1,024 frames (its first batch:
the warm-up's 1,000 uniform valid actions, then 256 gradient steps); without the mask, at 4,096
frames, PPO scores -0.1 and DQN -0.7.
"""

from __future__ import annotations

import json

import pytest

from tests.test_engine import load_recipe

ENV = "rlkit/MaskedPick-v0"
BAR = 15.0
QUIET = ["--progress", "false", "--eval-episodes", "10", "--env", ENV]
#: DQN at a CPU test's size: 4 envs, a 64x64 network, a gradient step per 4 frames
DQN_FLAGS = ["--num-envs", "4", "--hidden", "64", "64", "--utd-ratio", "0.25"]
NO_MASK = ["--env-kwargs", "expose_mask=false"]


def train(recipe, tmp_path, *, seed, frames, eval_every, extra=(), target=BAR):
    flags = [*QUIET, *extra, "--seed", str(seed), "--total-frames", str(frames)]
    flags += ["--eval-every", str(eval_every), "--run-dir", str(tmp_path / f"{recipe}{seed}")]
    if target is not None:
        flags += ["--target-return", str(target)]
    return load_recipe(recipe).main(flags)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(5))
def test_ppo_learns_the_masked_task(tmp_path, seed):
    summary = train("ppo", tmp_path, seed=seed, frames=16384, eval_every=2048)
    assert summary["solved"], summary["eval_return_mean"]
    assert summary["eval_return_mean"] >= BAR


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(5))
def test_dqn_learns_the_masked_task(tmp_path, seed):
    summary = train("dqn", tmp_path, seed=seed, frames=8192, eval_every=1024, extra=DQN_FLAGS)
    assert summary["solved"], summary["eval_return_mean"]
    assert summary["eval_return_mean"] >= BAR


@pytest.mark.slow
@pytest.mark.parametrize(
    ("recipe", "frames", "extra"), [("ppo", 4096, ()), ("dqn", 4096, tuple(DQN_FLAGS))]
)
def test_without_the_mask_the_same_run_does_worse(tmp_path, recipe, frames, extra):
    """The control: the same task with the mask hidden (the observation is the values alone),
    the same budget as the masked runs needed (and twice PPO's)."""
    summary = train(
        recipe,
        tmp_path,
        seed=0,
        frames=frames,
        eval_every=frames,
        extra=(*extra, *NO_MASK),
        target=None,
    )
    assert summary["eval_return_mean"] < 5.0  # the masked runs: >= 15 by 2,048 frames


@pytest.mark.slow
def test_population_members_read_the_mask(tmp_path):
    """A sweep's members (one run, rlkit's collector per member block) act on valid actions
    only: each scores above random valid play's 10 after 2,048 frames; an unmasked member
    would lose its episodes (about 0)."""
    train(
        "ppo",
        tmp_path,
        seed=0,
        frames=2048,
        eval_every=2048,
        extra=("--sweep", "lr=0.001,0.003", "--population-seeds", "2"),
        target=None,
    )
    members = json.loads((tmp_path / "ppo0" / "population.json").read_text())["members"]
    assert len(members) == 4
    assert all(m["eval_return_mean"] > 12 for m in members), members
