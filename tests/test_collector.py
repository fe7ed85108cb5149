"""VectorEnvCollector: batch for batch equal to TorchRL's Collector, and to plain gymnasium."""

from __future__ import annotations

import doctest

import gymnasium
import numpy as np
import pytest
import torch
from tensordict import TensorDictBase
from tensordict.nn import InteractionType, TensorDictModule
from torch import nn
from torchrl.collectors import Collector
from torchrl.envs import RewardScaling

import rlkit.data.collector as collector_module
from rlkit import keys
from rlkit.data.collector import UnsupportedEnvError, VectorEnvCollector, make_collector
from rlkit.envs import get_obs_norm, get_reward_norm, make_env
from rlkit.modules.actors import make_actor

N_ENVS, STEPS, BATCHES, SEED = 4, 7, 6, 3
# time limits: random CartPole episodes often reach 20 steps; Pendulum's all end at 14, the
# last step of every second batch
LIMIT = {"CartPole-v1": 20, "Pendulum-v1": 14}


def build(env_id: str, **env_kw):
    env = make_env(env_id, num_envs=N_ENVS, seed=SEED, max_episode_steps=LIMIT[env_id], **env_kw)
    torch.manual_seed(0)
    return env, make_actor(env.observation_spec, env.action_spec)


def collect(cls, env_id: str, *, batches: int = BATCHES, env_kw=None, **kw):
    """``batches`` consecutive batches from a fresh env, policy and torch seed."""
    env, actor = build(env_id, **(env_kw or {}))
    torch.manual_seed(1)  # the sampling stream: both collectors must draw it identically
    if cls is Collector:
        kw["auto_register_policy_transforms"] = False
    collector = cls(env, actor, frames_per_batch=N_ENVS * STEPS, total_frames=-1, **kw)
    it = iter(collector)
    out = [next(it) for _ in range(batches)]
    collector.shutdown()
    return out, env, actor


def assert_same_batch(ours: TensorDictBase, ref: TensorDictBase) -> None:
    assert set(ours.keys(True, True)) == set(ref.keys(True, True))
    assert ours.batch_size == ref.batch_size and ours.device == ref.device
    assert ours.names == ref.names == [None, keys.TIME_DIM_NAME]
    assert ours["next"].names == ref["next"].names
    for key in ref.keys(True, True):
        a, b = ours.get(key), ref.get(key)
        assert a.dtype == b.dtype and a.shape == b.shape, key
        assert torch.equal(a, b), key
        assert a.is_contiguous(), key


def assert_boundaries_covered(batches: list[TensorDictBase]) -> None:
    """The data must hold truncations, a done on a batch's last step, and an episode
    running across a batch boundary, or the equivalence test proves less than it says."""
    trunc = torch.stack([b[keys.TRUNCATED] for b in batches])
    done = torch.stack([b[keys.DONE] for b in batches])
    assert trunc.any()
    assert done[:, :, -1].any()
    assert (~done[:, :, -1]).any()


CASES = [
    ("CartPole-v1", {}),
    ("CartPole-v1", {"normalize_obs": True, "normalize_reward": True, "gamma": 0.9}),
    ("Pendulum-v1", {}),
    ("Pendulum-v1", {"normalize_obs": True, "normalize_reward": True}),
]


@pytest.mark.parametrize(("env_id", "env_kw"), CASES)
@pytest.mark.parametrize("exploration", [InteractionType.RANDOM, InteractionType.DETERMINISTIC])
def test_batches_equal_torchrl_collector(env_id, env_kw, exploration):
    ref, ref_env, _ = collect(Collector, env_id, env_kw=env_kw, exploration_type=exploration)
    ours, our_env, _ = collect(
        VectorEnvCollector, env_id, env_kw=env_kw, exploration_type=exploration
    )
    if env_id == "Pendulum-v1" or exploration is InteractionType.RANDOM:
        assert_boundaries_covered(ref)  # (greedy CartPole falls long before the limit)
    for a, b in zip(ours, ref):
        assert_same_batch(a, b)
    # the normalisers' statistics and state end equal too
    for get in (get_obs_norm, get_reward_norm):
        if get(ref_env) is not None:
            for name, value in get(ref_env).stats.state_dict().items():
                assert torch.equal(get(our_env).stats.state_dict()[name], value), name
    if get_reward_norm(ref_env) is not None:
        assert torch.equal(get_reward_norm(our_env)._returns, get_reward_norm(ref_env)._returns)


def test_device_cpu_batches_carry_the_device():
    ref, _, _ = collect(Collector, "CartPole-v1", batches=2, device="cpu")
    ours, _, _ = collect(VectorEnvCollector, "CartPole-v1", batches=2, device="cpu")
    assert ours[0].device == torch.device("cpu")
    for a, b in zip(ours, ref):
        assert_same_batch(a, b)


def test_stored_log_prob_scores_the_stored_action():
    for env_id in ("CartPole-v1", "Pendulum-v1"):
        batches, _, actor = collect(VectorEnvCollector, env_id, batches=2)
        for batch in batches:
            dist = actor.get_dist(batch.clone())
            expected = dist.log_prob(batch[keys.ACTION])
            torch.testing.assert_close(batch[keys.ACTION_LOG_PROB], expected)


def replay_gymnasium(env_id: str, actions: np.ndarray) -> dict[str, np.ndarray]:
    """A plain gymnasium loop per sub-env fed the collected actions ``[N, T, *A]``.

    make_env seeds sub-env i by ``reset(seed=SEED + i)``; the collector resets once more at
    start-up; a finished episode is reset (unseeded) right after its last step. ``resets``
    holds every observation a reset produced (start-up included), flattened.
    """
    names = ("obs", "next_obs", "reward", "term", "trunc", "ret", "len")
    out: dict[str, list] = {k: [] for k in (*names, "resets")}
    for i, env_actions in enumerate(actions):
        env = gymnasium.make(env_id, max_episode_steps=LIMIT[env_id])
        env.reset(seed=SEED + i)
        obs, _ = env.reset()
        rows: dict[str, list] = {k: [] for k in names}
        out["resets"].append(obs)
        ret, length = np.float32(0.0), 0
        for action in env_actions:
            action = int(action) if env_id == "CartPole-v1" else action
            next_obs, reward, term, trunc, _ = env.step(action)
            ret, length = np.float32(ret + np.float32(reward)), length + 1  # RewardSum: float32
            for k, v in zip(names, (obs, next_obs, reward, term, trunc, ret, length)):
                rows[k].append(v)
            obs = next_obs
            if term or trunc:
                (obs, _), ret, length = env.reset(), np.float32(0.0), 0
                out["resets"].append(obs)
        for k in names:
            out[k].append(np.array(rows[k]))
    return {k: np.stack(v) for k, v in out.items()}


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_matches_a_plain_gymnasium_loop(env_id):
    batches, _, _ = collect(VectorEnvCollector, env_id)
    data = torch.cat(batches, dim=1)
    ref = replay_gymnasium(env_id, data[keys.ACTION].numpy())
    np.testing.assert_array_equal(data[keys.OBSERVATION].numpy(), ref["obs"])
    # the true final observation at done steps, never the reset one
    np.testing.assert_array_equal(data[keys.NEXT_OBSERVATION].numpy(), ref["next_obs"])
    np.testing.assert_array_equal(
        data[keys.REWARD].squeeze(-1).numpy(), ref["reward"].astype(np.float32)
    )
    np.testing.assert_array_equal(data[keys.TERMINATED].squeeze(-1).numpy(), ref["term"])
    np.testing.assert_array_equal(data[keys.TRUNCATED].squeeze(-1).numpy(), ref["trunc"])
    np.testing.assert_array_equal(data[keys.STEP_COUNT].squeeze(-1).numpy(), ref["len"])
    np.testing.assert_array_equal(data[keys.EPISODE_RETURN].squeeze(-1).numpy(), ref["ret"])


def test_episode_return_is_the_sum_of_the_episode_rewards():
    batches, _, _ = collect(VectorEnvCollector, "Pendulum-v1")
    reward = torch.cat([b[keys.REWARD] for b in batches], 1).squeeze(-1).tolist()
    done = torch.cat([b[keys.DONE] for b in batches], 1).squeeze(-1).tolist()
    ret = torch.cat([b[keys.EPISODE_RETURN] for b in batches], 1).squeeze(-1)
    count = torch.cat([b[keys.STEP_COUNT] for b in batches], 1).squeeze(-1)
    traj = torch.cat([b["collector", "traj_ids"] for b in batches], 1)
    finished = 0
    for env in range(N_ENVS):
        episode: list[float] = []
        for t in range(len(reward[env])):
            episode.append(reward[env][t])
            if done[env][t]:
                assert ret[env, t].item() == pytest.approx(sum(episode), rel=1e-5)
                assert count[env, t].item() == len(episode)
                episode, finished = [], finished + 1
    assert finished >= N_ENVS * 2
    # trajectory ids (TorchRL's rule): env i starts with id i; when envs finish, they take
    # the next unused ids in order of env index
    current, next_id = list(range(N_ENVS)), N_ENVS
    for t in range(traj.shape[1]):
        assert traj[:, t].tolist() == current
        for env in range(N_ENVS):
            if done[env][t]:
                current[env], next_id = next_id, next_id + 1


def test_obs_norm_statistics_count_every_emitted_observation_once():
    batches, env, _ = collect(VectorEnvCollector, "CartPole-v1", env_kw={"normalize_obs": True})
    data = torch.cat(batches, dim=1)
    ref = replay_gymnasium("CartPole-v1", data[keys.ACTION].numpy())
    # emitted: every reset's observation (start-up included) and every step's observation
    raw = np.concatenate([ref["resets"], ref["next_obs"].reshape(-1, 4)]).astype(np.float64)
    stats = get_obs_norm(env).stats
    eps = 1e-4  # RunningMeanStd's prior: eps pseudo-samples with mean 0, variance 1
    n = raw.shape[0]
    mean = raw.sum(0) / (n + eps)
    var = (((raw - mean) ** 2).sum(0) + eps * (1.0 + mean**2)) / (n + eps)
    assert stats.count.item() == pytest.approx(n + eps, abs=1e-9)
    np.testing.assert_allclose(stats.mean.numpy(), mean, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(stats.var.numpy(), var, rtol=1e-9)


def test_iteration_stops_at_total_frames_and_batches_are_independent():
    env, actor = build("CartPole-v1")
    collector = VectorEnvCollector(env, actor, frames_per_batch=8, total_frames=20)
    batches = list(collector)
    assert [b.numel() for b in batches] == [8, 8, 8]  # like Collector: up to >= total_frames
    assert not torch.equal(batches[0][keys.OBSERVATION], batches[1][keys.OBSERVATION])
    assert batches[0][keys.OBSERVATION].data_ptr() != batches[1][keys.OBSERVATION].data_ptr()
    collector.update_policy_weights_()
    collector.shutdown()
    assert env.is_closed
    env.close()  # the engine closes the env after shutting the collector down
    with pytest.raises(RuntimeError, match="shut down"):
        collector.rollout()


def test_policy_reading_episode_state_gets_it():
    env, _ = build("CartPole-v1")

    class CountPolicy(nn.Module):
        def forward(self, steps: torch.Tensor) -> torch.Tensor:
            return (steps.squeeze(-1) % 2).long()

    policy = TensorDictModule(CountPolicy(), in_keys=[keys.STEP_COUNT_NAME], out_keys=["action"])
    batch = next(iter(VectorEnvCollector(env, policy, frames_per_batch=N_ENVS * STEPS)))
    torch.testing.assert_close(batch[keys.ACTION], batch[keys.STEP_COUNT_NAME].squeeze(-1) % 2)


def test_bad_frames_per_batch():
    env, actor = build("CartPole-v1")
    with pytest.raises(ValueError, match="not a multiple of num_envs=4; use a multiple"):
        VectorEnvCollector(env, actor, frames_per_batch=10)
    with pytest.raises(ValueError, match="frames_per_batch must be an int >= 1"):
        VectorEnvCollector(env, actor, frames_per_batch=0)
    with pytest.raises(ValueError, match="total_frames"):
        VectorEnvCollector(env, actor, frames_per_batch=8, total_frames=0)


def test_unsupported_env_raises_and_make_collector_falls_back():
    env, actor = build("CartPole-v1")
    env.append_transform(RewardScaling(loc=0.0, scale=2.0))
    with pytest.raises(UnsupportedEnvError, match="RewardScaling in this place.*make_collector"):
        VectorEnvCollector(env, actor, frames_per_batch=8)
    fallback = make_collector(env, actor, frames_per_batch=8)
    assert isinstance(fallback, Collector)
    fallback.shutdown()
    env2, actor2 = build("CartPole-v1")
    assert isinstance(make_collector(env2, actor2, frames_per_batch=8), VectorEnvCollector)


def test_unsupported_policies_raise():
    env, _ = build("CartPole-v1")
    reads_other = TensorDictModule(nn.Identity(), in_keys=["hidden"], out_keys=["action"])
    with pytest.raises(UnsupportedEnvError, match=r"a policy reading \['hidden'\]"):
        VectorEnvCollector(env, reads_other, frames_per_batch=8)
    with pytest.raises(TypeError, match="TensorDict module with in_keys"):
        VectorEnvCollector(env, lambda td: td, frames_per_batch=8)


def test_docstring_examples():
    result = doctest.testmod(collector_module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
