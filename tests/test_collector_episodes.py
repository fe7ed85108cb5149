"""pyrado's min_rollouts / min_steps: rollout_steps_for(N, num_envs, L) gives the fewest
steps per env after which every [num_envs, T] batch holds N complete episodes, and
--min-episodes / --min-steps (EpisodeBatches) collect chunks until a batch holds them."""

from __future__ import annotations

from functools import cache

import gymnasium
import numpy as np
import pytest
import torch

from rlkit import keys
from rlkit.data.collector import EpisodeBatches, make_collector, rollout_steps_for
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


# --------------------------------------------------------------------------- --min-episodes
class FixedLength(gymnasium.Env):
    """Every episode lasts exactly ``length`` steps (terminated at the last): reward 1 per
    step, observation (step / length, 1), two actions that change nothing."""

    def __init__(self, length: int = 5):
        self.length, self.t = length, 0
        self.observation_space = gymnasium.spaces.Box(-2.0, 2.0, (2,), dtype=np.float32)
        self.action_space = gymnasium.spaces.Discrete(2)

    def _obs(self):
        return np.array([self.t / self.length, 1.0], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), 1.0, self.t == self.length, False, {}


FIXED = "rlkit-test/FixedLength-v0"
if FIXED not in gymnasium.registry:
    gymnasium.register(FIXED, entry_point=FixedLength, max_episode_steps=None)


def chunks_by_hand(*, length: int, steps: int, num_envs: int, episodes: int, batches: int):
    """Chunks per batch for envs that all run episodes of exactly ``length`` steps from step 1:
    episode j of a row covers the run's steps j L + 1 .. (j + 1) L; a batch covers steps
    start .. start + k T - 1 and needs ``episodes`` episodes lying wholly inside it."""
    out, start = [], 1
    for _ in range(batches):
        k = 0
        while True:
            k += 1
            end = start + k * steps - 1
            inside = [j for j in range(end // length + 1) if j * length + 1 >= start]
            inside = [j for j in inside if (j + 1) * length <= end]
            if len(inside) * num_envs >= episodes:
                break
        out.append(k)
        start = end + 1
    return out


def _fixed_collector(num_envs: int, steps: int):
    env = make_env(FIXED, num_envs=num_envs, seed=0)
    torch.manual_seed(0)
    actor = make_actor(env.observation_spec, env.action_spec, hidden=(8,))
    return env, make_collector(env, actor, frames_per_batch=num_envs * steps)


def complete_episodes(batch) -> int:
    """Episodes whose first and last step are both in the batch (from its step counters)."""
    done = batch[keys.DONE].squeeze(-1)
    count = batch[keys.STEP_COUNT].squeeze(-1)  # steps into the episode, after the step
    index = torch.arange(done.shape[1]).expand_as(done)
    return int((done & (count <= index + 1)).sum())


@pytest.mark.parametrize("num_envs,steps,episodes", [(2, 4, 3), (1, 3, 2), (3, 7, 1)])
def test_min_episodes_batches_have_the_hand_computed_length(num_envs, steps, episodes):
    """L = 5, T = 4, 2 envs, 3 episodes: [3, 4, 3, 3, 4] chunks. Batch 1 (steps 1-12) holds
    the episodes 1-5 and 6-10 of both rows (4); batch 2 (13-28) opens inside 11-15, so it
    needs 16-20 and 21-25 (4 chunks, to step 28); batch 3 (29-40) opens inside 26-30: 31-35,
    36-40; batch 4 (41-52) opens at an episode's first step: 41-45, 46-50; batch 5 as 2."""
    expected = chunks_by_hand(
        length=5, steps=steps, num_envs=num_envs, episodes=episodes, batches=5
    )
    if (num_envs, steps, episodes) == (2, 4, 3):
        assert expected == [3, 4, 3, 3, 4]
    env, chunks = _fixed_collector(num_envs, steps)
    batches = EpisodeBatches(chunks, min_episodes=episodes)
    for k, batch in zip(expected, batches, strict=False):
        assert batch.batch_size == (num_envs, k * steps)
        assert batches.chunks == k
        assert batches.episodes == complete_episodes(batch) >= episodes
        assert batch.names == [None, keys.TIME_DIM_NAME]
        # the rows are contiguous in time: the step counter runs on across the chunks
        count = batch[keys.STEP_COUNT].squeeze(-1)
        assert ((count[:, 1:] == count[:, :-1] + 1) | (count[:, 1:] == 1)).all()
    chunks.shutdown()
    env.close()


def test_min_frames_is_ceil_of_the_chunks():
    env, chunks = _fixed_collector(2, 4)
    batches = EpisodeBatches(chunks, min_frames=20)  # ceil(20 / 8) = 3 chunks
    for _, batch in zip(range(3), batches, strict=False):
        assert batch.batch_size == (2, 12)
    both = EpisodeBatches(chunks, min_frames=8, min_episodes=3)  # the episodes decide
    assert next(iter(both)).shape[1] > 4
    chunks.shutdown()
    env.close()


def test_gae_over_a_longer_batch_is_one_trajectory_per_row():
    """GAE on a [N, k T] batch equals a textbook loop over each whole row (values from the
    same critic), so a chunk boundary is no bootstrap point."""
    from rlkit.modules import make_value
    from rlkit.value import GAE

    env, chunks = _fixed_collector(2, 4)
    batch = next(iter(EpisodeBatches(chunks, min_episodes=3)))
    chunks.shutdown()
    env.close()
    critic = make_value(env.observation_spec, hidden=(8,))
    gamma, lmbda = 0.9, 0.8
    with torch.no_grad():
        GAE(gamma=gamma, lmbda=lmbda, value_network=critic)(batch)
        value = critic.module(batch[keys.OBSERVATION]).squeeze(-1)
        next_value = critic.module(batch[keys.NEXT_OBSERVATION]).squeeze(-1)
    reward = batch[keys.REWARD].squeeze(-1)
    done = batch[keys.DONE].squeeze(-1).float()
    terminated = batch[keys.TERMINATED].squeeze(-1).float()
    expected = torch.zeros_like(value)
    for row in range(value.shape[0]):
        running = 0.0
        for t in reversed(range(value.shape[1])):
            delta = reward[row, t] + gamma * (1 - terminated[row, t]) * next_value[row, t]
            delta = delta - value[row, t]
            running = delta + gamma * lmbda * (1 - done[row, t]) * running
            expected[row, t] = running
    assert batch.shape[1] == 12
    torch.testing.assert_close(batch[keys.ADVANTAGE].squeeze(-1), expected)


@pytest.mark.parametrize(
    "kw,message",
    [
        (dict(min_episodes=0), "min_episodes must be an int >= 1"),
        (dict(min_frames=-8), "min_frames must be an int >= 1"),
        (dict(min_episodes=2.5), "min_episodes must be an int >= 1"),
        ({}, "needs min_episodes or min_frames"),
    ],
)
def test_episode_batches_refuse_impossible_minimums(kw, message):
    with pytest.raises(ValueError, match=message):
        EpisodeBatches(object(), **kw)


@pytest.mark.parametrize("flag", ["--min-episodes", "--min-steps"])
@pytest.mark.parametrize("value", ["0", "-3"])
def test_recipes_refuse_impossible_minimums(flag, value):
    from rlkit.configs.ppo import PPOConfig
    from rlkit.training import parse_config

    with pytest.raises(SystemExit):
        parse_config(PPOConfig, [flag, value])
    name = flag[2:].replace("-", "_")
    with pytest.raises(ValueError, match=f"^{flag} must be a whole number >= 1"):
        PPOConfig(**{name: int(value)})
    with pytest.raises(ValueError, match="cannot stack across its members"):
        PPOConfig(**{name: 4}, population=2)


def _metrics(run_dir) -> list[dict]:
    import csv

    with open(run_dir / "metrics.csv") as f:
        return list(csv.DictReader(f))


SMALL = ["--env", FIXED, "--num-envs", "2", "--rollout-steps", "4", "--minibatch-size", "8",
         "--epochs", "1", "--eval-every", "0", "--eval-episodes", "1", "--progress", "false",
         "--log-every", "1", "--threads", "1"]  # fmt: skip


@pytest.mark.parametrize("algo", ["ppo", "a2c", "ppg", "daac"])
def test_recipes_train_on_min_episode_batches_and_count_their_frames(algo, tmp_path):
    """Batches of 3, 4, 3 chunks of 8 frames (the hand count above): the run counts 24, 56,
    80 frames, and the linear learning rate of each batch is read at those frames."""
    from tests.test_engine import load_recipe

    extra = {"ppg": ["--n-pi", "2", "--aux-epochs", "1"], "daac": ["--value-epochs", "1"]}
    argv = [*SMALL, "--min-episodes", "3", "--total-frames", "60", "--lr", "0.001",
            "--lr-schedule", "linear", "--lr-final", "0", "--run-dir", str(tmp_path / "run"),
            *extra.get(algo, [])]  # fmt: skip
    summary = load_recipe(algo).main(argv)
    assert summary["frames"] == 80
    rows = _metrics(tmp_path / "run")
    assert [int(r["frames"]) for r in rows] == [24, 56, 80]
    for row, before in zip(rows, [0, 24, 56], strict=True):
        assert float(row["lr"]) == pytest.approx(0.001 * (1 - before / 60))


def test_min_steps_sets_the_batch_and_a2c_takes_it_whole(tmp_path):
    from rlkit.algorithms import a2c

    argv = [*SMALL, "--min-steps", "20", "--total-frames", "48", "--run-dir", str(tmp_path)]
    argv[argv.index("--minibatch-size") + 1] = "none"
    summary = a2c.main(argv)
    assert [int(r["frames"]) for r in _metrics(tmp_path)] == [24, 48]  # ceil(20 / 8) = 3
    assert summary["frames"] == 48
    cfg = a2c.A2CConfig(env=FIXED, num_envs=2, rollout_steps=4, minibatch_size=None)
    env = make_env(FIXED, num_envs=2, seed=0)
    learner = a2c.build(cfg, env)
    env.close()
    flat = next(iter(EpisodeBatches(_fixed_collector(2, 4)[1], min_frames=20))).reshape(-1)
    (whole,) = learner._minibatches(flat, torch.Generator())  # the whole batch, one step
    assert whole.shape == (24,)


def test_a_min_episode_run_resumes(tmp_path):
    """The mid-batch state (which rows start an episode) is not checkpointed: the resumed
    run resets the envs, so its first batch is counted as a run's first: 3 chunks again."""
    from rlkit.algorithms import ppo

    run = ["--min-episodes", "3", "--run-dir", str(tmp_path / "run")]
    ppo.main([*SMALL, *run, "--total-frames", "50"])  # 24, 56
    summary = ppo.main([*SMALL, *run, "--total-frames", "100", "--resume", "last"])
    assert [int(r["frames"]) for r in _metrics(tmp_path / "run")][-2:] == [80, 112]
    assert summary["frames"] == 112


def test_ppg_stores_longer_batches_as_rollouts_and_checkpoints_them():
    """A [N, k T] batch enters PPG's buffer as k N rollouts of T steps; a buffer of batches
    of different lengths survives state_dict / load_state_dict."""
    from tensordict import TensorDict

    from rlkit.algorithms import ppg

    cfg = ppg.PPGConfig(env=FIXED, num_envs=2, rollout_steps=4, minibatch_size=8, n_pi=4)
    env = make_env(FIXED, num_envs=2, seed=0)
    learner, other = ppg.build(cfg, env), ppg.build(cfg, env)
    env.close()

    def batch(steps: int) -> TensorDict:
        obs = torch.arange(2 * steps * 2, dtype=torch.float32).reshape(2, steps, 2)
        return TensorDict({keys.OBSERVATION: obs, keys.VALUE_TARGET: obs[..., :1]}, [2, steps])

    short, long = learner._store(batch(4)), learner._store(batch(12))
    assert short.shape == (2, 4) and long.shape == (6, 4)
    # rollout j of chunk c is row j, steps c T .. (c + 1) T - 1 of the batch
    torch.testing.assert_close(long[3][keys.OBSERVATION], batch(12)[1, 4:8][keys.OBSERVATION])
    learner.buffer, learner.phase_iteration = [short, long], 2
    other.load_state_dict(learner.state_dict())
    assert [b.shape for b in other.buffer] == [(2, 4), (6, 4)]
    for mine, theirs in zip(learner.buffer, other.buffer, strict=True):
        assert (mine == theirs).all()
