"""make_env: truncation-correct batched envs, checked against plain gymnasium loops."""

from __future__ import annotations

import doctest
import warnings

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium import spaces
from tensordict import TensorDict, TensorDictBase
from torchrl.collectors import Collector

from rlkit import keys
from rlkit.envs import get_obs_norm, get_reward_norm, make_env, make_eval_env
from rlkit.modules.normalization import ObservationNorm

N_ENVS, HORIZON, LIMIT, SEED = 4, 100, 20, 3


class RandomDiscretePolicy(torch.nn.Module):
    """Uniform actions from a private generator, so every run draws the same actions."""

    def __init__(self, n: int, seed: int = 0) -> None:
        super().__init__()
        self.n = n
        self.gen = torch.Generator().manual_seed(seed)

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        td.set(keys.ACTION, torch.randint(0, self.n, td.batch_size, generator=self.gen))
        return td


def collect(env, *, frames_per_batch: int, total_frames: int) -> TensorDictBase:
    """All collector batches of ``env`` concatenated along time: ``[N, T]``."""
    collector = Collector(
        env,
        RandomDiscretePolicy(2),
        frames_per_batch=frames_per_batch,
        total_frames=total_frames,
        auto_register_policy_transforms=False,
    )
    batches = [batch.clone() for batch in collector]
    collector.shutdown()
    return torch.cat(batches, dim=-1)


def rollout(env, steps: int) -> TensorDictBase:
    return env.rollout(steps, RandomDiscretePolicy(2), break_when_any_done=False)


@pytest.fixture(scope="module", params=["collector", "rollout"])
def cartpole_batch(request) -> TensorDictBase:
    env = make_env("CartPole-v1", num_envs=N_ENVS, seed=SEED, max_episode_steps=LIMIT)
    if request.param == "collector":
        # two batches, so episodes cross a batch boundary
        return collect(env, frames_per_batch=N_ENVS * HORIZON // 2, total_frames=N_ENVS * HORIZON)
    return rollout(env, HORIZON)


def replay_gymnasium(env_index: int, actions: np.ndarray, seed: int = SEED) -> dict:
    """Plain gymnasium loop: sub-env i is seeded with seed + i by make_env's seeding reset,
    then reset once more by the collector / rollout; finished episodes reset unseeded.

    ``resets`` lists every observation a reset produced, including one after the last step.
    """
    env = gymnasium.make("CartPole-v1", max_episode_steps=LIMIT)
    env.reset(seed=seed + env_index)
    obs, _ = env.reset()
    out = {k: [] for k in ("obs", "next_obs", "reward", "term", "trunc", "ret", "len")}
    out["resets"] = [obs]
    ret, length = 0.0, 0
    for action in actions:
        out["obs"].append(obs)
        next_obs, reward, term, trunc, _ = env.step(int(action))
        ret, length = ret + reward, length + 1
        for k, v in zip(
            ("next_obs", "reward", "term", "trunc", "ret", "len"),
            (next_obs, reward, term, trunc, ret, length),
            strict=True,
        ):
            out[k].append(v)
        if term or trunc:
            (obs, _), ret, length = env.reset(), 0.0, 0
            out["resets"].append(obs)
        else:
            obs = next_obs
    return {k: np.asarray(v) for k, v in out.items()}


def test_batch_layout(cartpole_batch):
    td = cartpole_batch
    assert td.batch_size == (N_ENVS, HORIZON)
    assert td[keys.ACTION].dtype == torch.int64 and td[keys.ACTION].shape == (N_ENVS, HORIZON)
    for key in (keys.DONE, keys.TERMINATED, keys.TRUNCATED):
        assert td[key].shape == (N_ENVS, HORIZON, 1) and td[key].dtype == torch.bool
    assert td[keys.NEXT_OBSERVATION].dtype == torch.float32
    assert td[keys.REWARD].dtype == torch.float32
    assert torch.equal(td[keys.DONE], td[keys.TERMINATED] | td[keys.TRUNCATED])


def test_matches_independent_gymnasium_loop(cartpole_batch):
    td = cartpole_batch
    for i in range(N_ENVS):
        ref = replay_gymnasium(i, td[keys.ACTION][i].numpy())
        np.testing.assert_allclose(td[keys.OBSERVATION][i].numpy(), ref["obs"], rtol=0, atol=0)
        np.testing.assert_allclose(td[keys.NEXT_OBSERVATION][i].numpy(), ref["next_obs"], atol=0)
        np.testing.assert_array_equal(td[keys.REWARD][i, :, 0].numpy(), ref["reward"])
        np.testing.assert_array_equal(td[keys.TERMINATED][i, :, 0].numpy(), ref["term"])
        np.testing.assert_array_equal(td[keys.TRUNCATED][i, :, 0].numpy(), ref["trunc"])
        np.testing.assert_allclose(td[keys.EPISODE_RETURN][i, :, 0].numpy(), ref["ret"])
        np.testing.assert_array_equal(td[keys.STEP_COUNT][i, :, 0].numpy(), ref["len"])


def test_final_observation_kept_and_steps_chain(cartpole_batch):
    td = cartpole_batch
    obs, next_obs = td[keys.OBSERVATION], td[keys.NEXT_OBSERVATION]
    done = td[keys.DONE][:, :-1, 0]
    chained = (obs[:, 1:] == next_obs[:, :-1]).all(-1)
    assert chained[~done].all(), "a non-done step does not chain: a step was lost or reset twice"
    assert not chained[done].any(), "a done step's next observation is the reset observation"
    truncated_only = td[keys.TRUNCATED][..., 0] & ~td[keys.TERMINATED][..., 0]
    assert truncated_only.sum() >= 4 and td[keys.TERMINATED].sum() >= 4  # both kinds occur
    # a truncation happens exactly when the episode reaches LIMIT steps
    assert torch.equal(td[keys.TRUNCATED][..., 0], td[keys.STEP_COUNT][..., 0] == LIMIT)


def test_episode_return_and_length_from_rewards(cartpole_batch):
    td = cartpole_batch
    reward, done = td[keys.REWARD][..., 0], td[keys.DONE][..., 0]
    for i in range(N_ENVS):
        ret, length = 0.0, 0
        for t in range(HORIZON):
            ret, length = ret + reward[i, t].item(), length + 1
            assert td[keys.EPISODE_RETURN][i, t, 0].item() == pytest.approx(ret)
            assert td[keys.STEP_COUNT][i, t, 0].item() == length
            if done[i, t]:
                ret, length = 0.0, 0


def test_unknown_id_suggests_close_match():
    with pytest.raises(ValueError, match=r"unknown environment id 'CartPol-v1'; did you mean "):
        make_env("CartPol-v1")
    with pytest.raises(ValueError, match=r"did you mean 'CartPole-v1'"):
        make_env("CartPol-v1")
    with pytest.raises(ValueError, match=r"unknown environment id 'NoSuchThing-v9'"):
        make_env("NoSuchThing-v9")


class _SpaceEnv(gymnasium.Env):
    def __init__(self, observation_space, action_space):
        self.observation_space, self.action_space = observation_space, action_space

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 1.0, False, False, {}


_BOX = spaces.Box(-1.0, 1.0, (3,), np.float32)
_SPACES = {
    "MultiDiscreteAction": (_BOX, spaces.MultiDiscrete([2, 3])),
    "MultiBinaryAction": (_BOX, spaces.MultiBinary(3)),
    "MultiBinary2DAction": (_BOX, spaces.MultiBinary((2, 2))),
    "NestedDictAction": (_BOX, spaces.Dict({"a": spaces.Dict({"b": spaces.Discrete(2)})})),
    "NestedDictObs": (spaces.Dict({"a": spaces.Dict({"b": _BOX})}), spaces.Discrete(2)),
    "RewardNamedObs": (spaces.Dict({"reward": _BOX}), spaces.Discrete(2)),
    "Float64DictObs": (
        spaces.Dict({"a": spaces.Box(-1.0, 1.0, (3,), np.float64), "b": spaces.Discrete(4)}),
        spaces.Discrete(2),
    ),
    "TupleObs": (spaces.Tuple((_BOX, _BOX)), spaces.Discrete(2)),
    "ShiftedDiscrete": (_BOX, spaces.Discrete(3, start=1)),
    "Float64Obs": (spaces.Box(-1.0, 1.0, (3,), np.float64), spaces.Discrete(2)),
}
for _name, (_obs, _act) in _SPACES.items():
    gymnasium.register(
        f"rlkit-test/{_name}-v0",
        entry_point=lambda obs=_obs, act=_act, **kw: _SpaceEnv(obs, act),
        max_episode_steps=5,
    )


@pytest.mark.parametrize(
    ("name", "space"),
    [
        ("MultiBinary2DAction", "MultiBinary"),
        ("NestedDictAction", "Dict"),
        ("TupleObs", "Tuple"),
        ("ShiftedDiscrete", "start=1"),
    ],
)
def test_unsupported_spaces_named(name, space):
    env_id = f"rlkit-test/{name}-v0"
    with pytest.raises(ValueError, match=rf"'{env_id}' has (observation|action) space .*{space}"):
        make_env(env_id)


@pytest.mark.parametrize(
    ("name", "shape"), [("MultiDiscreteAction", (2, 2)), ("MultiBinaryAction", (2, 3))]
)
def test_multidiscrete_and_multibinary_actions_are_taken(name, shape):
    """Issue 47: tests/test_actions.py covers them from the env to the loss."""
    env = make_env(f"rlkit-test/{name}-v0", num_envs=2)
    assert env.rand_step(env.reset())["action"].shape == shape


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("NestedDictObs", r"Dict observation entry 'a' of space Dict\(.*supports Box and"),
        ("RewardNamedObs", r"Dict observation entry named 'reward', a key the env writes"),
    ],
)
def test_unsupported_dict_entries_named(name, message):
    with pytest.raises(ValueError, match=rf"^'rlkit-test/{name}-v0' has .*{message}"):
        make_env(f"rlkit-test/{name}-v0")


def test_dict_entries_get_their_own_keys_float32():
    env = make_env("rlkit-test/Float64DictObs-v0", num_envs=2, seed=0)
    td = env.rollout(3)
    assert td["a"].dtype == td["next", "a"].dtype == torch.float32 and td["a"].shape == (2, 3, 3)
    assert td["b"].dtype == torch.int64 and td["b"].shape == (2, 3)
    assert keys.OBSERVATION not in td
    with pytest.raises(ValueError, match=r"Dict observations \['a', 'b'\]; observation norm"):
        make_env("rlkit-test/Float64DictObs-v0", normalize_obs=True)


def test_float64_observations_become_float32():
    env = make_env("rlkit-test/Float64Obs-v0", num_envs=2, seed=0)
    td = env.rollout(3)
    assert td[keys.OBSERVATION].dtype == torch.float32
    assert td[keys.NEXT_OBSERVATION].dtype == torch.float32


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_envs": 0}, "num_envs must be an int >= 1"),
        ({"num_envs": 2.0}, "num_envs must be an int >= 1"),
        ({"max_episode_steps": 0}, "max_episode_steps must be an int >= 1"),
        ({"gamma": 1.5}, r"gamma must lie in \[0, 1\]"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_env("CartPole-v1", **kwargs)


def test_discrete_observations_and_no_normalisation_for_them():
    td = make_env("FrozenLake-v1", num_envs=2, seed=0).rollout(4, break_when_any_done=False)
    assert td[keys.OBSERVATION].dtype == torch.int64 and td[keys.OBSERVATION].shape == (2, 4)
    with pytest.raises(ValueError, match="'FrozenLake-v1' has torch.int64 .*Box"):
        make_env("FrozenLake-v1", normalize_obs=True)


def _random_rollout(env, steps: int, torch_seed: int) -> TensorDictBase:
    torch.manual_seed(torch_seed)  # env.rollout without a policy samples from the spec
    return env.rollout(steps, break_when_any_done=False)


def test_seeding_reproducible_and_seed_dependent():
    runs = [_random_rollout(make_env("CartPole-v1", num_envs=3, seed=s), 40, 0) for s in (7, 7, 8)]
    assert torch.equal(runs[0][keys.NEXT_OBSERVATION], runs[1][keys.NEXT_OBSERVATION])
    assert torch.equal(runs[0][keys.ACTION], runs[1][keys.ACTION])
    assert not torch.equal(runs[0][keys.OBSERVATION][:, 0], runs[2][keys.OBSERVATION][:, 0])
    # sub-environments get different seeds
    first = runs[0][keys.OBSERVATION][:, 0]
    assert not torch.equal(first[0], first[1])


def test_pendulum_continuous_float32():
    env = make_env("Pendulum-v1", num_envs=2, seed=0, max_episode_steps=10)
    td = _random_rollout(env, 25, 0)
    assert td[keys.ACTION].shape == (2, 25, 1) and td[keys.ACTION].dtype == torch.float32
    assert td[keys.NEXT_OBSERVATION].shape == (2, 25, 3)
    for key in (keys.NEXT_OBSERVATION, keys.REWARD, keys.EPISODE_RETURN):
        assert td[key].dtype == torch.float32, key
    # Pendulum never terminates: every done is a truncation at the 10-step limit
    assert not td[keys.TERMINATED].any()
    assert td[keys.TRUNCATED][:, :, 0].nonzero()[:, 1].unique().tolist() == [9, 19]


def test_lunar_lander_discrete_and_continuous():
    td = _random_rollout(make_env("LunarLander-v3", num_envs=2, seed=0), 30, 0)
    assert td[keys.NEXT_OBSERVATION].shape == (2, 30, 8) and td[keys.ACTION].max() <= 3
    env = make_env("LunarLander-v3", num_envs=2, seed=0, env_kwargs={"continuous": True})
    td = _random_rollout(env, 5, 0)
    assert td[keys.ACTION].shape == (2, 5, 2) and td[keys.ACTION].dtype == torch.float32


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1", "LunarLander-v3"])
def test_construction_is_silent(env_id, capfd):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_env(env_id, num_envs=2, seed=0, normalize_obs=True, normalize_reward=True)
    assert [str(w.message) for w in caught] == []
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_full_reset_with_tensordict_and_partial_reset():
    env = make_env("CartPole-v1", num_envs=3, seed=0)
    td = env.reset()
    before = td[keys.OBSERVATION].clone()
    env.reset(td.exclude("_reset"))  # TorchRL 0.14.1's wrapper raised AttributeError here
    partial = TensorDict({"_reset": torch.tensor([[True], [False], [False]])}, batch_size=[3])
    after = env.reset(td.clone().update(partial))[keys.OBSERVATION]
    assert not torch.equal(after[0], before[0]) and torch.equal(after[1:], before[1:])


def test_wrappers_applied_per_env():
    seen = []

    def record(env):
        seen.append(env)
        return gymnasium.wrappers.TransformReward(env, lambda r: 2.0 * r)

    td = make_env("CartPole-v1", num_envs=2, seed=0, wrappers=[record]).rollout(3)
    assert len(seen) == 2 and torch.all(td[keys.REWARD] == 2.0)


def _prior_merged(data: np.ndarray, eps: float = 1e-4) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance of ``eps`` pseudo-samples (mean 0, var 1) pooled with ``data``."""
    n, m = len(data), data.mean(0)
    return m * n / (n + eps), (eps + n * data.var(0) + m**2 * eps * n / (n + eps)) / (n + eps)


def test_observation_normalisation_statistics_and_output():
    env = make_env("CartPole-v1", num_envs=4, seed=1, max_episode_steps=LIMIT, normalize_obs=True)
    normed = collect(env, frames_per_batch=160, total_frames=320)
    stats = get_obs_norm(env).stats
    # every observation the env emitted, once: each step's and each reset's, from gymnasium;
    # the collector resets sub-envs done at the last step after that step was normalised
    refs = [replay_gymnasium(i, a.numpy(), seed=1) for i, a in enumerate(normed[keys.ACTION])]
    seen_by_last_step = [np.concatenate([r["next_obs"], r["resets"]]) for r in refs]
    trailing = [r["resets"][-1:] if r["term"][-1] or r["trunc"][-1] else [] for r in refs]
    seen_by_last_step = [
        s[: len(s) - len(t)] for s, t in zip(seen_by_last_step, trailing, strict=True)
    ]
    raw = np.concatenate([*seen_by_last_step, *[np.reshape(t, (-1, 4)) for t in trailing]])
    mean, var = _prior_merged(raw.astype(np.float64))
    assert stats.count.item() == pytest.approx(len(raw) + 1e-4)
    np.testing.assert_allclose(stats.mean.numpy(), mean, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(stats.var.numpy(), var, rtol=1e-10)
    # the last step was normalised with the statistics of everything seen up to it
    mean, var = _prior_merged(np.concatenate(seen_by_last_step).astype(np.float64))
    last = np.stack([r["next_obs"][-1] for r in refs])
    expected = np.clip((last - mean) / np.sqrt(var + 1e-8), -10, 10)
    np.testing.assert_allclose(
        normed[keys.NEXT_OBSERVATION][:, -1].numpy(), expected, rtol=1e-5, atol=1e-6
    )
    # normalised data still chains and keeps the final observation
    done = normed[keys.DONE][:, :-1, 0]
    chained = (normed[keys.OBSERVATION][:, 1:] == normed[keys.NEXT_OBSERVATION][:, :-1]).all(-1)
    assert chained[~done].all() and not chained[done].any()


def test_eval_env_reads_shared_statistics_without_updating():
    train = make_env("CartPole-v1", num_envs=2, seed=0, normalize_obs=True)
    train.rollout(20, break_when_any_done=False)
    stats = get_obs_norm(train).stats
    count = stats.count.clone()
    evaluation = make_eval_env("CartPole-v1", seed=1, obs_norm=get_obs_norm(train))
    eval_norm = get_obs_norm(evaluation)
    assert eval_norm.stats is stats and not eval_norm.update_stats
    evaluation.rollout(30)
    assert torch.equal(stats.count, count)
    # a second training env on the same normaliser shares (and updates) it
    other = make_env("CartPole-v1", num_envs=2, seed=2, obs_norm=get_obs_norm(train))
    other.rollout(5)
    assert get_obs_norm(other).stats is stats and stats.count > count
    assert isinstance(get_obs_norm(other), ObservationNorm) and get_reward_norm(other) is None


def test_reward_normalisation_matches_reference_loop():
    plain = collect(
        make_env("CartPole-v1", num_envs=4, seed=5, max_episode_steps=LIMIT),
        frames_per_batch=200,
        total_frames=200,
    )
    env = make_env(
        "CartPole-v1", num_envs=4, seed=5, max_episode_steps=LIMIT, normalize_reward=True, gamma=0.9
    )
    scaled = collect(env, frames_per_batch=200, total_frames=200)
    reward, done = plain[keys.REWARD][..., 0].double().numpy(), plain[keys.DONE][..., 0].numpy()
    returns, seen, eps = np.zeros(4), [], 1e-4
    for t in range(reward.shape[1]):
        returns = 0.9 * returns + reward[:, t]
        seen.extend(returns)
        data = np.asarray(seen)
        _, var = _prior_merged(data, eps)
        expected = np.clip(reward[:, t] / np.sqrt(var + 1e-8), -10, 10)
        np.testing.assert_allclose(scaled[keys.REWARD][:, t, 0].numpy(), expected, rtol=1e-5)
        returns[done[:, t]] = 0.0
    # the tracked episode return stays in the environment's units
    assert torch.equal(scaled[keys.EPISODE_RETURN], plain[keys.EPISODE_RETURN])
    assert get_reward_norm(env).stats.count.item() == pytest.approx(200 + eps)


def test_obs_norm_shape_must_match():
    with pytest.raises(
        ValueError, match=r"statistics of shape \(3,\) but 'CartPole-v1' has .*\(4,\)"
    ):
        make_env("CartPole-v1", obs_norm=ObservationNorm(3))


def test_docstring_examples_run():
    import rlkit.envs.make
    import rlkit.modules.normalization

    for module in (rlkit.envs.make, rlkit.modules.normalization):
        result = doctest.testmod(module, extraglobs={"torch": torch})
        assert result.failed == 0 and result.attempted > 0, module.__name__


def test_cpu_env_has_no_tensordict_device():
    env = make_env("CartPole-v1", num_envs=2, device="cpu")
    td = env.rollout(2)
    assert env.device is None and td[keys.NEXT_OBSERVATION].device.type == "cpu"


# --------------------------------------------------------------------------- sparse variants


def _velocity_policy(obs) -> int:
    """Push in the direction of motion: reaches MountainCar's goal in ~100-160 steps."""
    return 2 if obs[1] >= 0 else 0


@pytest.mark.parametrize("seed", [0, 3])
def test_sparse_mountain_car_reward_is_one_exactly_at_the_goal(seed):
    dense, sparse = gymnasium.make("MountainCar-v0"), gymnasium.make("rlkit/MountainCarSparse-v0")
    od, _ = dense.reset(seed=seed)
    os_, _ = sparse.reset(seed=seed)
    np.testing.assert_array_equal(od, os_)
    rewards, steps = [], 0
    while True:
        a = _velocity_policy(od)
        od, rd, td, trd, _ = dense.step(a)
        os_, rs, ts, trs, _ = sparse.step(a)
        steps += 1
        np.testing.assert_array_equal(od, os_)  # same dynamics, step by step
        assert (td, trd) == (ts, trs) and rd == -1.0
        rewards.append(rs)
        if td or trd:
            break
    assert td and not trd and steps < 200  # the goal, not the time limit
    assert rewards == [0.0] * (steps - 1) + [1.0]


def test_sparse_mountain_car_keeps_the_200_step_limit_and_batched_rewards():
    env = make_env("rlkit/MountainCarSparse-v0", num_envs=3, seed=0)
    td = env.rollout(200, break_when_any_done=False)  # uniform random actions, seeded
    assert not td.get(keys.TERMINATED).any()  # a random policy does not reach the goal...
    assert td.get(keys.REWARD).abs().sum() == 0  # ...so it sees only 0s...
    assert td.get(keys.TRUNCATED)[:, -1].all() and not td.get(keys.TRUNCATED)[:, :-1].any()


def test_check_same_spaces_names_both_tasks_and_the_mismatch():
    from rlkit.envs import check_same_spaces

    sparse = make_env("rlkit/MountainCarSparse-v0", num_envs=4, seed=0)
    check_same_spaces(  # same spaces, different batch sizes: fine
        sparse, make_env("MountainCar-v0", num_envs=2, seed=0), train_id="a", eval_id="b"
    )
    with pytest.raises(ValueError, match=r"'CartPole-v1' does not match --env 'sp'.*\[2\].*\[4\]"):
        cartpole = make_env("CartPole-v1", num_envs=2, seed=0)
        check_same_spaces(sparse, cartpole, train_id="sp", eval_id="CartPole-v1")
    with pytest.raises(ValueError, match=r"actions Categorical\[\]\(n=3\) vs Bounded"):
        check_same_spaces(  # same observation shape, continuous actions
            sparse,
            make_env("MountainCarContinuous-v0", num_envs=2, seed=0),
            train_id="a",
            eval_id="b",
        )
