"""``--env-kwargs KEY=VALUE`` and ``--max-episode-steps N``: gymnasium.make arguments that
reach every env a run builds (training, collector workers, population members, evaluation,
``--eval-only``), checked through rewards whose values the arguments fix exactly:

- CartPole's ``sutton_barto_reward=True`` pays 0 per step and -1 at the fall, so every
  episode of an untrained policy returns exactly -1 (without it, one per step survived);
- MountainCar-v0 pays -1 per step and cannot reach its goal in under ~80 steps from rest,
  so with a time limit of 37 every episode returns exactly -37 and lasts 37 steps.
"""

from __future__ import annotations

import csv
import json
import shlex

import pytest

from rlkit.algorithms import load
from rlkit.configs.base import parse_env_kwargs

FAST = shlex.split(
    "--num-envs 4 --rollout-steps 32 --minibatch-size 64 --epochs 1 --eval-episodes 3 "
    "--progress false --checkpoint-every 0"
)


def _rows(path):
    with path.open() as f:
        return list(csv.DictReader(f))


def _train(algo, tmp_path, *args, name="run"):
    run_dir = tmp_path / name
    summary = load(algo).main([*args, "--run-dir", str(run_dir)])
    return summary, _rows(run_dir / "metrics.csv"), _rows(run_dir / "eval.csv")


def _returns(rows):
    return {float(r["episode_return"]) for r in rows if r.get("episode_return")}


def test_values_are_read_as_yaml():
    items = ["p=0.0", "flag=true", "n=3", "nothing=null", "sizes=[1, 2]", "name=left", "e="]
    assert parse_env_kwargs(items) == {
        "p": 0.0,
        "flag": True,
        "n": 3,
        "nothing": None,
        "sizes": [1, 2],
        "name": "left",
        "e": "",
    }
    assert parse_env_kwargs(None) == {}


@pytest.mark.parametrize(
    "items, fix",
    [
        (["sticky"], "KEY=VALUE"),
        (["1x=2"], "KEY=VALUE"),
        (["max_episode_steps=5"], "--max-episode-steps"),
        (["render_mode=human"], "rlkit sets it"),
        (["a=1", "a=2"], "twice"),
        (["a=[1"], "not a YAML"),
    ],
)
def test_malformed_items_are_refused_with_the_fix(items, fix):
    with pytest.raises(ValueError, match=fix):
        parse_env_kwargs(items)


def test_training_and_evaluation_envs_take_the_kwargs(tmp_path):
    args = [*FAST, "--total-frames", "512", "--eval-every", "256"]
    _, rows, evals = _train("ppo", tmp_path, *args, "--env-kwargs", "sutton_barto_reward=true")
    assert _returns(rows) == {-1.0}
    assert {float(r["return_mean"]) for r in evals} == {-1.0}
    # the same run without the argument: one reward per step survived
    _, rows, evals = _train("ppo", tmp_path, *args, name="plain")
    assert min(_returns(rows)) > 5.0
    assert min(float(r["return_mean"]) for r in evals) > 5.0


def test_time_limit_truncates_training_and_evaluation_episodes(tmp_path):
    args = [*FAST, "--env", "MountainCar-v0", "--total-frames", "512", "--eval-every", "256"]
    _, rows, evals = _train("ppo", tmp_path, *args, "--max-episode-steps", "37")
    assert _returns(rows) == {-37.0}
    assert {float(r["episode_length"]) for r in rows if r["episode_length"]} == {37.0}
    assert {float(r["return_mean"]) for r in evals} == {-37.0}


def test_collector_workers_take_the_kwargs(tmp_path):
    """IMPALA's worker processes build their own envs from the config."""
    args = [
        *shlex.split("--num-envs 4 --workers 2 --rollout-steps 32 --minibatch-size 64"),
        *shlex.split("--epochs 1 --eval-episodes 2 --progress false --checkpoint-every 0"),
        *shlex.split("--total-frames 512 --eval-every 0 --env-kwargs sutton_barto_reward=true"),
    ]
    _, rows, evals = _train("impala", tmp_path, *args)
    assert _returns(rows) == {-1.0}
    assert [float(r["return_mean"]) for r in evals] == [-1.0]


def test_population_members_take_the_kwargs(tmp_path):
    args = [*FAST, "--total-frames", "512", "--eval-every", "0", "--population", "2"]
    _, rows, evals = _train("ppo", tmp_path, *args, "--env-kwargs", "sutton_barto_reward=true")
    assert {r["member"] for r in rows} >= {"0", "1"}  # and "" for the aggregate rows
    assert _returns(rows) == {-1.0}
    assert {float(r["return_mean"]) for r in evals} == {-1.0}


def test_eval_only_applies_the_typed_kwargs_and_a_resume_keeps_the_runs(tmp_path):
    _train("ppo", tmp_path, *FAST, "--total-frames", "256", "--eval-every", "0")
    checkpoint = tmp_path / "run" / "checkpoints" / "last.pt"
    out = tmp_path / "eval"
    load("ppo").main(
        ["--eval-only", "--init-from", str(checkpoint), "--run-dir", str(out), "--progress"]
        + ["false", "--eval-episodes", "4", "--env-kwargs", "sutton_barto_reward=true"]
    )
    assert json.loads((out / "evaluation.json").read_text())["returns"] == [-1.0] * 4
    with pytest.raises(SystemExit):  # a resume keeps its run's env
        load("ppo").main(
            [*FAST, "--run-dir", str(tmp_path / "run"), "--resume", "last"]
            + ["--total-frames", "512", "--env-kwargs", "sutton_barto_reward=true"]
        )


def test_an_argument_the_env_does_not_take_names_it(tmp_path):
    with pytest.raises(ValueError, match=r"does not take the argument\(s\) \['sutton_barto'\]"):
        _train("ppo", tmp_path, *FAST, "--total-frames", "256", "--env-kwargs", "sutton_barto=1")


# --bootstrap-truncated false ------------------------------------------------------------------


def _gae_of_a_time_limited_rollout(bootstrap_truncated):
    """MountainCar-v0 (-1 per step, no goal within 5 steps) cut at 5 steps, 12 steps of one
    env, every state valued 1: GAE with lambda 1 is then the return minus 1."""
    import torch

    from rlkit import keys
    from rlkit.envs import make_env
    from rlkit.value import GAE

    env = make_env(
        "MountainCar-v0",
        num_envs=1,
        seed=0,
        max_episode_steps=5,
        bootstrap_truncated=bootstrap_truncated,
    )
    td = env.rollout(12, break_when_any_done=False)
    td[keys.STATE_VALUE] = torch.ones(1, 12, 1)
    td[keys.NEXT_STATE_VALUE] = torch.ones(1, 12, 1)
    GAE(gamma=0.9, lmbda=1.0)(td)
    return td, td[keys.ADVANTAGE].flatten().tolist()


@pytest.mark.parametrize("bootstrap_truncated", [True, False])
def test_a_truncation_bootstraps_unless_told_not_to(bootstrap_truncated):
    td, adv = _gae_of_a_time_limited_rollout(bootstrap_truncated)
    truncated = td["next", "truncated"].flatten().tolist()
    terminated = td["next", "terminated"].flatten().tolist()
    assert [i for i, t in enumerate(truncated) if t] == [4, 9]
    assert terminated == [(not bootstrap_truncated) and t for t in truncated]
    # hand-written returns: -1 per step to the episode's end (steps 0-4, 5-9), then
    # gamma^k x V = 0.9^k when the truncation bootstraps; the batch's last two steps always
    # bootstrap from the batch's end
    for t in range(12):
        end = 5 if t < 5 else 10 if t < 10 else 12
        k = end - t
        ret = -sum(0.9**i for i in range(k))
        if bootstrap_truncated or end == 12:
            ret += 0.9**k
        assert adv[t] == pytest.approx(ret - 1.0, abs=1e-5), t


def test_only_the_training_envs_treat_truncation_as_terminal(tmp_path):
    from rlkit.configs.ppo import PPOConfig

    cfg = PPOConfig(bootstrap_truncated=False, max_episode_steps=9)
    assert cfg.gym_options() == {"max_episode_steps": 9, "bootstrap_truncated": False}
    assert cfg.gym_options(evaluation=True) == {"max_episode_steps": 9}
    assert PPOConfig().gym_options() == {}
    # a run, a population and IMPALA's collector workers build their envs with it: the time
    # limit still ends every episode at 37 steps
    args = [*FAST, "--env", "MountainCar-v0", "--total-frames", "512", "--eval-every", "256"]
    args += ["--max-episode-steps", "37", "--bootstrap-truncated", "false"]
    for algo, extra in (
        ("ppo", []),
        ("ppo", ["--population", "2"]),
        ("impala", ["--workers", "2"]),
    ):
        name = f"{algo}{len(extra)}"
        _, rows, evals = _train(algo, tmp_path, *args, *extra, name=name)
        assert _returns(rows) == {-37.0}, name
        assert {float(r["return_mean"]) for r in evals} == {-37.0}, name


def test_a_terminal_time_limit_on_minatar_needs_a_time_limit():
    """MinAtar's ids have no time limit: ``--bootstrap-truncated false`` alone would change
    nothing, so it is refused with the fix; with ``--max-episode-steps`` it is accepted."""
    from rlkit.configs.ppo import PPOConfig

    with pytest.raises(ValueError, match=r"nothing to act on.*--max-episode-steps N"):
        PPOConfig(env="MinAtar/Breakout-v1", bootstrap_truncated=False)
    cfg = PPOConfig(env="MinAtar/Breakout-v1", bootstrap_truncated=False, max_episode_steps=1000)
    assert cfg.gym_options() == {"max_episode_steps": 1000, "bootstrap_truncated": False}
    # an id with a registered limit needs no flag
    assert PPOConfig(env="CartPole-v1", bootstrap_truncated=False).gym_options() == {
        "bootstrap_truncated": False
    }
