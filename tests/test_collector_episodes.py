"""pyrado's min_rollouts as batch sizing: rollout_steps_for(N, num_envs, L) gives the fewest
steps per env after which every [num_envs, T] batch holds N complete episodes."""

from __future__ import annotations

from functools import cache

import pytest
import torch

from rlkit import keys
from rlkit.data.collector import make_collector, rollout_steps_for
from rlkit.envs import make_env
from rlkit.modules import make_actor


def fewest_complete(steps: int, longest: int) -> int:
    """Worst case over every episode-length sequence (each 1..longest) and start offset: the
    complete episodes (first and last step inside) in a window of ``steps`` steps."""

    @cache
    def from_boundary(r: int) -> int:  # the window's remaining r steps start an episode
        if r == 0:
            return 0
        return min(1 + from_boundary(r - n) if n <= r else 0 for n in range(1, longest + 1))

    tails = [from_boundary(steps - p) if p < steps else 0 for p in range(1, longest)]
    return min([from_boundary(steps), *tails])


@pytest.mark.parametrize("longest", [1, 2, 3, 5])
@pytest.mark.parametrize("episodes,num_envs", [(1, 1), (3, 1), (4, 2), (5, 2), (7, 3)])
def test_rollout_steps_is_the_least_sufficient(episodes, num_envs, longest):
    steps = rollout_steps_for(episodes, num_envs=num_envs, max_episode_steps=longest)
    per_row = -(-episodes // num_envs)  # every row must hold this many
    assert fewest_complete(steps, longest) >= per_row
    assert fewest_complete(steps - 1, longest) < per_row  # the least such T


def test_collected_batches_hold_the_episodes():
    """CartPole cut at 6 steps, 2 envs, 5 episodes: 3 per row, T = 4 * 6 - 1 = 23."""
    steps = rollout_steps_for(5, num_envs=2, max_episode_steps=6)
    assert steps == 23
    env = make_env("CartPole-v1", num_envs=2, seed=0, max_episode_steps=6)
    torch.manual_seed(0)
    actor = make_actor(env.observation_spec, env.action_spec, hidden=(8,))
    collector = make_collector(env, actor, frames_per_batch=2 * steps)
    for _, batch in zip(range(6), collector, strict=False):
        done = batch[keys.DONE].squeeze(-1)
        count = batch[keys.STEP_COUNT].squeeze(-1)  # steps into the episode, after the step
        index = torch.arange(steps).expand_as(done)
        complete = done & (count <= index + 1)  # the episode's first step is in the row
        assert int(complete.sum()) >= 5
    collector.shutdown()
    env.close()


@pytest.mark.parametrize(
    "kw", [dict(min_episodes=0), dict(num_envs=1.5), dict(max_episode_steps=True)]
)
def test_bad_arguments_are_named(kw):
    args = dict(min_episodes=2, num_envs=2, max_episode_steps=10) | kw
    name = next(iter(kw))
    with pytest.raises(ValueError, match=rf"^rollout_steps_for: {name} must be an int >= 1"):
        rollout_steps_for(args.pop("min_episodes"), **args)


def test_the_envs_page_example_runs(capsys):
    import re
    from pathlib import Path

    page = Path(__file__).resolve().parents[1] / "docs" / "envs.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
    (block,) = [b for b in blocks if "rollout_steps_for(8" in b]
    exec(compile(block, "docs/envs.md", "exec"), {})
    assert capsys.readouterr().out.splitlines() == ["1499"]
