"""``rlkit.load``: a run's policy from its checkpoint acts as the run's own evaluation policy.

Each recipe trains a tiny run in this process; the learner the run trained (captured from its
``build``, never read back from a file) is the reference: its ``eval_policy()`` on 1,000 real
observations (random-action rollouts) under ``ExplorationType.DETERMINISTIC`` must give the
actions that ``rlkit.load(run_dir)`` gives on the same observations as numpy arrays.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torchrl.envs.utils import ExplorationType, set_exploration_type

import rlkit
from rlkit import keys
from rlkit.training import CheckpointError

QUIET = ["--progress", "false", "--eval-episodes", "2", "--eval-max-steps", "20"]
TINY = {
    "ppo": "--num-envs 2 --rollout-steps 16 --minibatch-size 16 --epochs 1",
    "a2c": "--num-envs 2 --rollout-steps 8",
    "ppg": "--num-envs 2 --rollout-steps 16 --minibatch-size 16 --epochs 1 --n-pi 2 "
    "--aux-epochs 1 --aux-minibatches 2",
    "daac": "--num-envs 2 --rollout-steps 16 --minibatch-size 16 --epochs 1 --value-epochs 1",
    "rnd": "--num-envs 2 --rollout-steps 16 --minibatch-size 16 --epochs 1",
    "impala": "--num-envs 2 --rollout-steps 16 --minibatch-size 16 --epochs 1",
    "appo": "--num-envs 2 --rollout-steps 16 --minibatch-size 16 --epochs 1",
    "dqn": "--steps-per-batch 16 --learning-starts 16 --batch-size 8 --buffer-size 256 "
    "--hidden 32 32",
    "sac": "--steps-per-batch 8 --learning-starts 16 --batch-size 8 --buffer-size 256 "
    "--hidden 32 32",
    "svpg": "--particles 2 --num-envs 2 --rollout-steps 8",
}
ENV = {"sac": "Pendulum-v1"}


def train(algo: str, run_dir: Path, *extra: str, frames: int = 64):
    """A tiny run of ``algo``; returns the learner it trained (its ``build``'s result)."""
    module = importlib.import_module(f"rlkit.algorithms.{algo}")
    built = []
    original = module.build

    def build(*args, **kwargs):
        learner = original(*args, **kwargs)
        built.append(learner)
        return learner

    module.build = build
    try:
        argv = [*TINY[algo].split(), *QUIET, "--env", ENV.get(algo, "CartPole-v1")]
        argv += ["--total-frames", str(frames), "--run-dir", str(run_dir), *extra]
        module.main(argv)
    finally:
        module.build = original
    return built[0]


def observations(env_id: str, n: int = 1000, **kwargs) -> dict[str, torch.Tensor]:
    """``n`` observations of random-action rollouts of ``env_id`` (every entry of a Dict
    observation), as the env writes them."""
    from rlkit.envs import make_env

    env = make_env(env_id, num_envs=8, seed=3, **kwargs)
    try:
        rollout = env.rollout(n // 8, break_when_any_done=False)
    finally:
        env.close()
    skip = {keys.NEXT, "done", "terminated", "truncated", keys.ACTION}
    skip |= {keys.EPISODE_RETURN_NAME, keys.STEP_COUNT_NAME}
    names = [k for k in rollout.keys() if k not in skip]  # noqa: SIM118 (its rows otherwise)
    return {k: rollout.get(k).reshape(n, *rollout.get(k).shape[2:]) for k in names}


def reference_actions(learner, obs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The recipe's evaluation policy on ``obs``, as the evaluator plays it."""
    n = next(iter(obs.values())).shape[0]
    td = TensorDict(dict(obs), batch_size=[n])
    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
        return learner.eval_policy()(td).get(keys.ACTION)


def _check_equal(loaded, want: torch.Tensor) -> None:
    assert isinstance(loaded, np.ndarray)
    assert loaded.shape == tuple(want.shape)
    if want.dtype.is_floating_point:
        np.testing.assert_allclose(loaded, want.numpy(), rtol=0, atol=1e-6)
    else:
        assert (loaded == want.numpy()).all()


@pytest.mark.parametrize(
    "algo",
    [
        "ppo",
        "a2c",
        "dqn",
        "sac",
        pytest.param("ppg", marks=pytest.mark.slow),
        pytest.param("daac", marks=pytest.mark.slow),
        pytest.param("rnd", marks=pytest.mark.slow),
        pytest.param("impala", marks=pytest.mark.slow),
        pytest.param("appo", marks=pytest.mark.slow),
        pytest.param("svpg", marks=pytest.mark.slow),
    ],
)
def test_loaded_policy_acts_as_the_recipes_evaluation_policy(algo, tmp_path):
    learner = train(algo, tmp_path / "run")
    obs = observations(ENV.get(algo, "CartPole-v1"))
    want = reference_actions(learner, obs)
    policy = rlkit.load(tmp_path / "run")
    assert policy.info["algo"] == algo and policy.info["frames"] == 64
    _check_equal(policy(obs[keys.OBSERVATION].numpy()), want)
    # one observation at a time: the same actions, without a batch dim
    for i in (0, 17, 999):
        one = policy(obs[keys.OBSERVATION][i].numpy())
        assert one.shape == tuple(want.shape[1:])
        if algo != "svpg":  # svpg routes rows to particles by their place in the batch
            np.testing.assert_allclose(one, want[i].numpy(), rtol=0, atol=1e-6)


def test_sampled_actions_follow_the_policys_distribution(tmp_path):
    """``deterministic=False`` samples as the evaluator's sampled mode does (the same
    generator state gives the same actions); torch tensors in, tensors out."""
    learner = train("ppo", tmp_path / "run")
    obs = observations("CartPole-v1", n=400)[keys.OBSERVATION]
    policy = rlkit.load(tmp_path / "run", deterministic=False)
    torch.manual_seed(5)
    got = policy(obs)
    torch.manual_seed(5)
    with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
        want = learner.eval_policy()(TensorDict({keys.OBSERVATION: obs}, [400])).get(keys.ACTION)
    assert isinstance(got, torch.Tensor) and torch.equal(got, want)
    greedy = policy(obs, deterministic=True)
    assert not torch.equal(got, greedy)  # sampled, not the mode
    assert torch.equal(greedy, reference_actions(learner, {keys.OBSERVATION: obs}))


def test_dict_observations_read_their_entries(tmp_path):
    env = "tests.dictobs_task:ImageVector"
    flags = ["--env", env, "--obs-keys", "vector", "image", "--encoder", "flatten"]
    learner = train("ppo", tmp_path / "run", *flags)
    obs = observations(env, n=200)
    want = reference_actions(learner, obs)
    policy = rlkit.load(tmp_path / "run")
    assert list(policy.entries) == ["image", "vector"]
    _check_equal(policy({k: v.numpy() for k, v in obs.items()}), want)
    with pytest.raises(ValueError, match="pass a mapping with image, vector"):
        policy(obs["vector"].numpy())


def test_masked_policy_reads_the_mask_and_never_picks_a_masked_action(tmp_path):
    env = "rlkit/MaskedPick-v0"
    learner = train("ppo", tmp_path / "run", "--env", env)
    obs = observations(env, n=400)
    want = reference_actions(learner, obs)
    policy = rlkit.load(tmp_path / "run")
    mask = obs[keys.ACTION_MASK].numpy()
    got = policy(obs[keys.OBSERVATION].numpy(), mask=mask)
    _check_equal(got, want)
    assert mask[np.arange(len(got)), got].all()
    # every action but one masked: that one is chosen
    only = np.zeros_like(mask)
    only[:, 2] = True
    assert (policy(obs[keys.OBSERVATION].numpy(), mask=only) == 2).all()
    with pytest.raises(ValueError, match="reads an action mask.*pass mask="):
        policy(obs[keys.OBSERVATION].numpy())


def test_recurrent_policy_carries_its_state_and_resets(tmp_path):
    """A hand loop carries the LSTM state (``("next", state)`` into the next step, zero
    with ``is_init`` at the first step and after a reset): the loaded policy acts the same
    and holds the same state, step by step."""
    learner = train("ppo", tmp_path / "run", "--recurrent", "lstm", "--recurrent-size", "8")
    obs = observations("CartPole-v1", n=200)[keys.OBSERVATION].reshape(25, 8, -1)
    policy = rlkit.load(tmp_path / "run")
    assert policy.recurrent
    actor = learner.eval_policy()
    shapes = {keys.POLICY_STATE_H: (1, 8), keys.POLICY_STATE_C: (1, 8)}  # one layer of 8
    state = {k: torch.zeros(8, *s) for k, s in shapes.items()}
    is_init = torch.ones(8, 1, dtype=torch.bool)
    want, got = [], []
    for t in range(25):
        if t == 12:  # a new episode in rows 0-3
            rows = torch.arange(8) < 4
            policy.reset(rows.numpy())
            is_init = rows[:, None]
            state = {k: torch.where(rows[:, None, None], 0.0, v) for k, v in state.items()}
        td = TensorDict({keys.OBSERVATION: obs[t], keys.IS_INIT: is_init, **state}, [8])
        with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
            td = actor(td)
        want.append(td.get(keys.ACTION))
        state = {k: td.get((keys.NEXT, k)) for k in shapes}
        is_init = torch.zeros(8, 1, dtype=torch.bool)
        got.append(policy(obs[t].numpy()))
        for k in shapes:
            torch.testing.assert_close(policy.state[k], state[k], rtol=0, atol=1e-6)
    assert (np.stack(got) == torch.stack(want).numpy()).all()
    assert float(state[keys.POLICY_STATE_H].abs().min()) > 0  # a state was carried
    policy.reset()
    assert policy.state is None


@pytest.mark.parametrize("bad", ["missing", "corrupt", "empty_dir"])
def test_a_missing_or_corrupt_path_is_one_line(tmp_path, bad):
    path = tmp_path / "x.pt"
    if bad == "corrupt":
        path.write_bytes(b"not a checkpoint")
    elif bad == "empty_dir":
        path = tmp_path
    with pytest.raises(CheckpointError) as err:
        rlkit.load(path)
    assert "\n" not in str(err.value)
    assert str(path) in str(err.value)


def test_importing_rlkit_stays_light():
    """``rlkit.load`` / ``rlkit.export`` import the kit when called, not with ``rlkit``."""
    import subprocess
    import sys

    code = "import sys, rlkit; print(rlkit.load.__module__, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["rlkit", "False"]


def test_structured_actions_come_back_as_a_dict_of_parts(tmp_path):
    """A Dict action (``rlkit/HybridReach-v0``: a kind and its parameters) loads and acts:
    one array per part, as the evaluation policy's action TensorDict holds them."""
    env = "rlkit/HybridReach-v0"
    learner = train("ppo", tmp_path / "run", "--env", env)
    obs = observations(env, n=200)
    want = reference_actions(learner, obs)
    got = rlkit.load(tmp_path / "run")(obs[keys.OBSERVATION].numpy())
    assert sorted(got) == ["kind", "params"]
    for part, value in got.items():
        _check_equal(value, want.get(part))
