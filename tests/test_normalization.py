"""RunningMeanStd, ObservationNorm and RewardNorm against numpy and hand computations."""

from __future__ import annotations

import io
import json
import math
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from tensordict import TensorDict
from torchrl.envs import VecNormV2

from rlkit import keys
from rlkit.envs import get_obs_norm, make_env
from rlkit.modules.normalization import ObservationNorm, RewardNorm, RunningMeanStd

RNG = np.random.default_rng(0)
# uneven batches, far from zero mean and unit variance, one of them a single sample
BATCHES = [RNG.normal(5.0, 3.0, size=(n, 3)) for n in (7, 1, 30, 12)]


def _with_prior(data: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """Mean and (population) variance of ``eps`` pseudo-samples N(0, 1) pooled with data."""
    n, m = len(data), data.mean(0)
    return m * n / (n + eps), (eps + n * data.var(0) + m**2 * eps * n / (n + eps)) / (n + eps)


def _fed(batches, *, epsilon=1e-4) -> RunningMeanStd:
    rms = RunningMeanStd((3,), epsilon=epsilon)
    for b in batches:
        rms.update(torch.as_tensor(b, dtype=torch.float32 if epsilon else torch.float64))
    return rms


def test_update_equals_numpy_over_concatenation():
    data = np.concatenate(BATCHES)
    exact = _fed(BATCHES, epsilon=0.0)
    np.testing.assert_allclose(exact.mean.numpy(), data.mean(0), rtol=1e-12)
    np.testing.assert_allclose(exact.var.numpy(), data.var(0), rtol=1e-12)
    assert exact.count.item() == len(data)
    # default prior: 1e-4 pseudo-samples with mean 0, variance 1 (data fed as float32)
    rms = _fed(BATCHES)
    data32 = np.concatenate([b.astype(np.float32) for b in BATCHES]).astype(np.float64)
    mean, var = _with_prior(data32, 1e-4)
    np.testing.assert_allclose(rms.mean.numpy(), mean, rtol=1e-12)
    np.testing.assert_allclose(rms.var.numpy(), var, rtol=1e-12)
    assert rms.mean.dtype == torch.float64


def test_update_flattens_leading_dims_and_checks_shape():
    data = torch.as_tensor(RNG.normal(size=(2, 5, 3)))
    rms = RunningMeanStd((3,), epsilon=0.0)
    rms.update(data)
    np.testing.assert_allclose(rms.mean.numpy(), data.reshape(-1, 3).mean(0).numpy())
    with pytest.raises(ValueError, match=r"samples of shape \(3,\) .* shape \(5, 2\)"):
        rms.update(torch.zeros(5, 2))
    with pytest.raises(ValueError, match="epsilon must be >= 0"):
        RunningMeanStd((3,), epsilon=-1.0)


@pytest.mark.parametrize("epsilon", [0.0, 1e-4])
def test_merge_of_two_workers_equals_one_over_all_data(epsilon):
    one = _fed(BATCHES, epsilon=epsilon)
    worker_a, worker_b = _fed(BATCHES[:2], epsilon=epsilon), _fed(BATCHES[2:], epsilon=epsilon)
    worker_a.merge_(worker_b)  # the prior is counted once, not twice
    for name in ("mean", "var", "count"):
        torch.testing.assert_close(getattr(worker_a, name), getattr(one, name), rtol=1e-12, atol=0)


def test_merge_raw_statistics_as_mapping_or_tuple():
    data = np.concatenate(BATCHES)
    head, tail = data[:10], data[10:]
    stats = {"mean": tail.mean(0), "var": tail.var(0), "count": len(tail)}
    for other in (stats, (stats["mean"], stats["var"], stats["count"])):
        rms = RunningMeanStd((3,), epsilon=0.0)
        rms.update(torch.as_tensor(head))
        rms.merge_(other)
        np.testing.assert_allclose(rms.mean.numpy(), data.mean(0), rtol=1e-12)
        np.testing.assert_allclose(rms.var.numpy(), data.var(0), rtol=1e-12)
    with pytest.raises(ValueError, match=r"cannot merge into a RunningMeanStd of shape \(3,\)"):
        rms.merge_({"mean": np.zeros(2), "var": np.ones(2), "count": 1})


def test_state_dict_round_trip_through_a_checkpoint():
    rms = _fed(BATCHES)
    buffer = io.BytesIO()
    torch.save(rms.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    assert set(state) == {"mean", "var", "count"}
    restored = RunningMeanStd((3,))
    restored.load_state_dict(state)
    for name in ("mean", "var", "count"):
        assert torch.equal(getattr(restored, name), getattr(rms, name))
    # whole modules pickle too (process-based collectors ship transforms to workers)
    clone = pickle.loads(pickle.dumps(ObservationNorm(3, stats=restored)))
    assert torch.equal(clone.stats.mean, rms.mean)


def test_sync_from_copies_values_not_a_link():
    source, target = _fed(BATCHES), RunningMeanStd((3,))
    target.sync_from(source)
    for name in ("mean", "var", "count"):
        assert torch.equal(getattr(target, name), getattr(source, name))
    source.update(torch.ones(4, 3))
    assert not torch.equal(target.count, source.count)
    norm_a, norm_b = ObservationNorm(3, stats=source), ObservationNorm(3)
    norm_b.sync_from(norm_a)
    assert torch.equal(norm_b.stats.var, source.var)
    with pytest.raises(ValueError, match=r"cannot sync statistics of shape \(3,\) into \(2,\)"):
        RunningMeanStd((2,)).sync_from(source)


def test_all_reduce_is_a_no_op_without_distributed():
    rms = _fed(BATCHES)
    before = rms.mean.clone()
    assert not dist.is_initialized()
    rms.all_reduce_()
    assert torch.equal(rms.mean, before)


def all_reduce_on_this_rank(argv: list[str]) -> None:
    """One rank of a two-rank gloo group (tests/ddp_shared.py's job "all-reduce"): the
    statistics of BATCHES as this rank sees them, synchronised three times, written to
    ``<run-dir>/rank<r>.json``."""
    rank = int(os.environ["LOCAL_RANK"])
    out = Path(argv[argv.index("--run-dir") + 1])
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        rms = RunningMeanStd((3,))
        rms.update(torch.as_tensor(BATCHES[0]))  # data every rank saw before the first sync
        rms.all_reduce_()
        rms.update(torch.as_tensor(BATCHES[1 + rank]))  # rank-specific data
        rms.all_reduce_()
        rms.update(torch.as_tensor(BATCHES[3][rank::2]))  # a second round
        rms.all_reduce_()
        out.mkdir(parents=True, exist_ok=True)
        result = [rms.mean.tolist(), rms.var.tolist(), rms.count.item()]
        (out / f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.ddp_jobs("all-reduce")  # a shared launch (tests/ddp_shared.py)
def test_all_reduce_across_two_ranks_counts_each_sample_once(ddp_jobs):
    run = ddp_jobs["all-reduce"]
    run.check()
    results = [json.loads((run.dir / f"rank{r}.json").read_text()) for r in (0, 1)]
    # the first batch was seen by both ranks before the first all_reduce_: once per rank
    data = np.concatenate([BATCHES[0], BATCHES[0], BATCHES[1], BATCHES[2], BATCHES[3]])
    mean, var = _with_prior(data, 1e-4)
    for rank_mean, rank_var, rank_count in results:
        np.testing.assert_allclose(rank_mean, mean, rtol=1e-10)
        np.testing.assert_allclose(rank_var, var, rtol=1e-10)
        assert rank_count == pytest.approx(len(data) + 1e-4)
    assert results[0] == results[1]


def test_observation_norm_output_by_hand():
    stats = _fed(BATCHES)
    norm = ObservationNorm(3, clip=1.5, epsilon=1e-3, stats=stats)
    obs = torch.as_tensor(RNG.normal(5.0, 6.0, size=(8, 3)), dtype=torch.float32)
    td = TensorDict({keys.OBSERVATION: obs, keys.NEXT_OBSERVATION: obs + 1}, batch_size=[8])
    count = stats.count.clone()
    out = norm(td)
    mean, var = stats.mean.numpy(), stats.var.numpy()
    for key, x in ((keys.OBSERVATION, obs), (keys.NEXT_OBSERVATION, obs + 1)):
        expected = np.clip((x.double().numpy() - mean) / np.sqrt(var + 1e-3), -1.5, 1.5)
        np.testing.assert_allclose(out[key].numpy(), expected, rtol=1e-5, atol=1e-6)
        assert out[key].dtype == torch.float32
    assert (out[keys.OBSERVATION].abs() == 1.5).any()  # clipping was exercised
    assert torch.equal(stats.count, count)  # applying the transform outside an env: no update
    with pytest.raises(ValueError, match="clip must be positive or None"):
        ObservationNorm(3, clip=0.0)


def test_frozen_statistics_do_not_change_in_an_env():
    env = make_env("Pendulum-v1", num_envs=2, seed=0, normalize_obs=True)
    norm = get_obs_norm(env)
    norm.update_stats = False
    norm.stats.update(torch.as_tensor(RNG.normal(size=(10, 3))))
    state = {k: v.clone() for k, v in norm.state_dict().items()}
    raw = make_env("Pendulum-v1", num_envs=2, seed=0)
    torch.manual_seed(0)
    td = env.rollout(15)
    torch.manual_seed(0)
    td_raw = raw.rollout(15)
    for k, v in norm.state_dict().items():
        assert torch.equal(v, state[k]), k
    expected = norm.stats.normalize(td_raw[keys.NEXT_OBSERVATION], clip=10.0)
    torch.testing.assert_close(td[keys.NEXT_OBSERVATION], expected)


def test_shared_norm_uses_the_same_statistics():
    norm = ObservationNorm(3)
    view = norm.shared(update_stats=False)
    assert view.stats is norm.stats and norm.update_stats and not view.update_stats
    with pytest.raises(ValueError, match=r"stats of shape \(3,\) != shape 2"):
        ObservationNorm(2, stats=norm.stats)


def test_reward_norm_arguments():
    with pytest.raises(ValueError, match=r"gamma must lie in \[0, 1\]"):
        RewardNorm(gamma=-0.1)
    with pytest.raises(ValueError, match="clip must be positive or None"):
        RewardNorm(gamma=0.99, clip=-1.0)


@pytest.mark.filterwarnings("ignore:Support of VecNormV2 for containers:UserWarning")
def test_torchrl_vecnormv2_is_not_reward_scaling():
    """Why rlkit has its own normalisers (torchrl 0.14.1 behaviour, pinned)."""
    env = make_env("CartPole-v1", num_envs=4, seed=0)
    env.append_transform(VecNormV2(in_keys=[keys.OBSERVATION, "reward"], decay=1.0))
    td = env.rollout(30, break_when_any_done=False)
    vecnorm = env.transform[-1]
    # one set of statistics per sub-environment, not one for the whole batch
    assert vecnorm._loc[keys.OBSERVATION].shape == (4, 4)
    # the reward is standardised: CartPole's constant +1 reward becomes 0 everywhere
    assert torch.all(td[keys.REWARD] == 0)
    scaled = make_env("CartPole-v1", num_envs=4, seed=0, normalize_reward=True).rollout(30)
    assert torch.all(scaled[keys.REWARD] > 0)


def _textbook_reward_scale(segments, *, gamma, clip=10.0, eps=1e-8, prior=1e-4):
    """SB3 VecNormalize's reward scaling written out: per env, G = gamma G + r; every step's
    G of all envs stepping together goes into a running mean/var (Chan's merge, prior of
    ``prior`` pseudo-samples with mean 0 and variance 1); r / sqrt(var + eps), clipped; G = 0
    after a done. ``segments``: list of (env_ids, rewards [n, T], dones [n, T]) in order,
    env ids distinct within a segment."""
    mean, var, count = 0.0, 1.0, prior
    ret: dict[int, float] = {}
    out = []
    for ids, rewards, dones in segments:
        scaled = [[0.0] * len(rewards[0]) for _ in ids]
        for t in range(len(rewards[0])):
            gs = []
            for i, env in enumerate(ids):
                ret[env] = ret.get(env, 0.0) * gamma + rewards[i][t]
                gs.append(ret[env])
            b_mean = sum(gs) / len(gs)
            b_var = sum((g - b_mean) ** 2 for g in gs) / len(gs)
            n = count + len(gs)
            delta = b_mean - mean
            mean, var = (
                mean + delta * len(gs) / n,
                (count * var + len(gs) * b_var + delta**2 * count * len(gs) / n) / n,
            )
            count = n
            for i, env in enumerate(ids):
                r = rewards[i][t] / math.sqrt(var + eps)
                scaled[i][t] = max(-clip, min(clip, r))
                if dones[i][t]:
                    ret[env] = 0.0
        out.append(scaled)
    return out, (mean, var, count)


def test_batch_reward_norm_matches_the_textbook_loop_across_batches_and_shuffled_rows():
    """Rows arrive in any order, one env twice in a batch (a fast worker's two rollouts):
    each env's return continues across rows and batches as if its steps came one by one."""
    from rlkit.modules import BatchRewardNorm

    g = torch.Generator().manual_seed(0)
    gamma, steps = 0.9, 5
    order = [[0, 1, 2, 3], [2, 0, 3, 1], [1, 1, 3, 0]]  # batch 3: env 1 twice, env 2 absent
    norm = BatchRewardNorm(4, gamma=gamma)
    segments = []  # (batch, rows, env ids, rewards, dones): groups of distinct envs in order
    got = []
    for b, ids in enumerate(order):
        reward = torch.randn(4, steps, 1, generator=g) * 3
        done = torch.rand(4, steps, 1, generator=g) < 0.2
        td = TensorDict({"next": {"reward": reward.clone(), "done": done}}, [4, steps])
        got.append(norm(td, torch.tensor(ids))["next", "reward"][..., 0])
        first = [r for r, env in enumerate(ids) if env not in ids[:r]]
        again = [r for r in range(4) if r not in first]  # an env's second rollout: later
        for rows in (first, again):
            if rows:
                rw, dn = reward[rows, :, 0].tolist(), done[rows, :, 0].tolist()
                segments.append((b, rows, [ids[r] for r in rows], rw, dn))
    want, (mean, var, count) = _textbook_reward_scale(
        [(envs, rw, dn) for _, _, envs, rw, dn in segments], gamma=gamma
    )
    for (b, rows, *_), scaled in zip(segments, want, strict=True):
        torch.testing.assert_close(got[b][rows], torch.tensor(scaled, dtype=torch.float32))
    stats = norm.norm.stats
    assert float(stats.count) == pytest.approx(count)
    assert float(stats.mean) == pytest.approx(mean) and float(stats.var) == pytest.approx(var)
    assert len(segments) == 4  # the repeated env really took the second pass


def test_batch_reward_norm_names_env_ids_outside_its_envs():
    from rlkit.modules import BatchRewardNorm

    td = TensorDict(
        {"next": {"reward": torch.ones(2, 3, 1), "done": torch.zeros(2, 3, 1, dtype=torch.bool)}},
        [2, 3],
    )
    with pytest.raises(ValueError, match=r"outside \[0, 2\).*number of envs"):
        BatchRewardNorm(2, gamma=0.9)(td, torch.tensor([0, 5]))
