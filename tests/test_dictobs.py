"""Dict observations in every recipe (issue 47): ``--obs-keys`` chooses the entries, the
networks read exactly those, each float vector entry has its own statistics, rlkit's collector
carries every entry (the same batches as TorchRL's Collector), the replay stores every entry and
next entry, and bad names get one line listing the entries."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium import spaces
from tensordict import TensorDict

from rlkit.envs import make_env
from rlkit.modules import actor_critic_networks
from rlkit.modules.dictobs import DictObsEncoder, EntryNorms, resolve_obs_keys
from tests.dictobs_task import ImageVector

ENV = "tests.dictobs_task:ImageVector"


class ThreeEntries(gymnasium.Env):
    """An image, a vector and an extra vector; 3 actions; 5-step episodes."""

    def __init__(self):
        self.observation_space = spaces.Dict(
            {
                "image": spaces.Box(0, 255, (5, 5, 3), np.uint8),
                "vector": spaces.Box(-5.0, 5.0, (3,), np.float32),
                "extra": spaces.Box(-5.0, 5.0, (2,), np.float64),
            }
        )
        self.action_space = spaces.Discrete(3)
        self._t = 0

    def _obs(self):
        r = self.np_random
        return {
            "image": r.integers(0, 256, (5, 5, 3)).astype(np.uint8),
            "vector": r.normal(1.0, 2.0, 3).astype(np.float32),
            "extra": r.normal(-1.0, 0.5, 2),
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return self._obs(), {}

    def step(self, action):
        self._t += 1
        return self._obs(), float(action == 1), self._t >= 5, False, {}


def _inputs(env, n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return TensorDict(
        {
            "image": torch.randint(0, 256, (n, 5, 5, 3), generator=g, dtype=torch.uint8),
            "vector": torch.randn(n, 3, generator=g),
            "extra": torch.randn(n, 2, generator=g),
        },
        [n],
    )


@pytest.fixture(scope="module")
def three():
    env = make_env(ThreeEntries, num_envs=2, seed=0)
    yield env
    env.close()


def _outputs(actor, critic, td):
    with torch.no_grad():
        return actor(td.clone())["logits"], critic(td.clone())["state_value"]


@pytest.mark.parametrize("chosen", [("image", "vector"), ("vector",), ("extra", "image")])
def test_the_networks_read_exactly_the_chosen_entries(three, chosen):
    torch.manual_seed(0)
    actor, critic, _ = actor_critic_networks(three, encoder="minatar", obs_keys=chosen)
    assert [k for k in actor.in_keys] == list(chosen)
    assert list(critic.in_keys) == list(chosen)
    td = _inputs(three)
    logits, value = _outputs(actor, critic, td)
    for key in ("image", "vector", "extra"):
        changed = td.clone()
        other = _inputs(three, seed=1).get(key)
        changed.set(key, other)
        new_logits, new_value = _outputs(actor, critic, changed)
        if key in chosen:  # every row's inputs changed: its outputs change
            assert not torch.isclose(new_logits, logits).all(-1).any(), key
            assert not torch.isclose(new_value, value).any(), key
        else:
            assert torch.equal(new_logits, logits) and torch.equal(new_value, value), key


def test_the_q_network_reads_exactly_the_chosen_entries(three):
    from rlkit.algorithms.dqn import q_network

    torch.manual_seed(0)
    q = q_network(three, hidden=(16,), activation="relu", encoder="minatar", obs_keys=["image"])
    assert list(q.in_keys) == ["image"]
    td = _inputs(three)
    with torch.no_grad():
        before = q(td.clone())["action_value"]
        moved = td.clone().set("vector", td["vector"] + 1).set("extra", td["extra"] - 1)
        assert torch.equal(q(moved)["action_value"], before)
        flipped = td.clone().set("image", 255 - td["image"])
        assert not torch.isclose(q(flipped)["action_value"], before).all(-1).any()


def test_default_entries_are_all_but_the_mask(three):
    # the Dict space sorts them by name
    assert resolve_obs_keys(three, None) == ["extra", "image", "vector"]
    assert resolve_obs_keys(three, ["extra"]) == ["extra"]
    cart = make_env("CartPole-v1", num_envs=1)
    assert resolve_obs_keys(cart, None) is None  # one "observation": the flat path
    assert resolve_obs_keys(cart, ["observation"]) is None
    cart.close()


def test_an_unknown_entry_gets_one_line_listing_the_entries(three):
    with pytest.raises(ValueError) as info:
        resolve_obs_keys(three, ["image", "vectr"])
    message = str(info.value)
    assert "\n" not in message
    assert message == (
        "--obs-keys names 'vectr', which this env's observation does not have; its entries "
        "are 'extra', 'image', 'vector'"
    )
    with pytest.raises(ValueError, match="'action_mask', the action mask"):
        resolve_obs_keys(three, ["action_mask"])


def test_the_recipe_refuses_an_unknown_entry_before_the_run_directory(tmp_path):
    from tests.test_engine import load_recipe

    run_dir = tmp_path / "run"
    flags = ["--env", ENV, "--obs-keys", "image", "vectr", "--encoder", "minatar"]
    flags += ["--total-frames", "64", "--progress", "false", "--run-dir", str(run_dir)]
    with pytest.raises(ValueError, match=r"^--obs-keys names 'vectr', .* 'image', 'vector'$"):
        load_recipe("ppo").main(flags)
    assert not run_dir.exists()


def test_obs_keys_named_twice_is_refused_by_the_config():
    from rlkit.configs.base import parse_config
    from rlkit.configs.ppo import PPOConfig

    with pytest.raises(SystemExit):
        parse_config(PPOConfig, ["--obs-keys", "image", "image"])
    cfg = parse_config(PPOConfig, ["--obs-keys", "image", "vector"])
    assert cfg.obs_keys == ("image", "vector")


def test_svpg_refuses_an_image_entry_in_one_line_naming_the_recipes(tmp_path):
    from tests.test_engine import load_recipe

    flags = ["--env", ENV, "--num-envs", "4", "--eval-episodes", "4", "--total-frames", "64"]
    flags += ["--progress", "false", "--run-dir", str(tmp_path / "run")]
    with pytest.raises(ValueError, match=r"^observation entry 'image' .* svpg's particles read "):
        load_recipe("svpg").main(flags)


def test_svpg_particles_read_a_dict_observation_as_each_particle_alone():
    """The stacked particles on Dict entries: row r's logits and value are those of particle
    ``floor(r P / N)`` run alone (a per-row loop over the members), for P | N and P not | N."""
    from rlkit.envs import make_env
    from rlkit.modules.particles import (
        _network_slot,
        build_particles,
        particle_index,
        particle_member,
    )

    env = make_env("tests.dictobs_task:TwoVectors", num_envs=1, seed=0)
    torch.manual_seed(0)
    actor, critic = build_particles(env, num_particles=3, hidden=(8,), obs_keys=["bit", "vector"])
    assert list(actor.in_keys) == ["bit", "vector"]
    for rows in (6, 4):
        td = TensorDict(
            {"bit": torch.randint(0, 2, (rows,)), "vector": torch.randn(rows, 4)}, [rows]
        )
        logits = actor(td.clone())["logits"]
        values = critic(td.clone())["state_value"]
        owner = particle_index(rows, 3)
        for r in range(rows):
            one = td[r : r + 1].clone()
            p = int(owner[r])
            torch.testing.assert_close(
                particle_member(actor, p)(one.clone())["logits"][0], logits[r]
            )
            torch.testing.assert_close(
                particle_member(critic, p)(one.clone())["state_value"][0], values[r]
            )
            # by hand: the one-hot bit, then the vector, into particle p's own layers
            head = _network_slot(particle_member(actor, p)).module[1]
            x = torch.cat([torch.nn.functional.one_hot(td["bit"][r], 2).float(), td["vector"][r]])
            torch.testing.assert_close(head(x), logits[r])
    env.close()


@pytest.mark.slow
def test_svpg_learns_a_dict_observation_task(tmp_path):
    """Both entries are needed: 8 is perfect, one entry alone at most 4, random 2."""
    from tests.test_engine import load_recipe

    flags = ["--env", "tests.dictobs_task:TwoVectors", "--seed", "3", "--total-frames", "12288"]
    flags += ["--eval-episodes", "8", "--progress", "false", "--run-dir", str(tmp_path / "r")]
    summary = load_recipe("svpg").main(flags)
    assert summary["eval_return_mean"] >= 6.0, summary["eval_return_mean"]


def _hand_moments(rows: np.ndarray, epsilon: float = 1e-4):
    """Mean and population variance of ``rows`` [n, d] merged with the prior (mean 0, var 1,
    epsilon pseudo-samples), one column at a time with plain loops."""
    n, d = rows.shape
    means, variances = [], []
    for j in range(d):
        column = [float(rows[i, j]) for i in range(n)]
        m = sum(column) / n
        v = sum((x - m) ** 2 for x in column) / n
        total = epsilon + n
        mean = (n * m) / total
        m2 = epsilon * 1.0 + n * v + (m - 0.0) ** 2 * epsilon * n / total
        means.append(mean)
        variances.append(m2 / total)
    return np.array(means), np.array(variances)


def test_each_entry_is_normalised_on_its_own_by_the_learner(three, tmp_path):
    """The PPO learner's update merges each float vector entry of the batch into its own
    statistics (the image has none); the networks then standardise each entry with its own."""
    from rlkit.algorithms import ppo
    from rlkit.configs.base import parse_config
    from rlkit.configs.ppo import PPOConfig

    cfg = parse_config(PPOConfig, ["--normalize-obs", "true", "--encoder", "minatar"])
    learner = ppo.build(cfg, three)
    norms = learner.obs_norm
    assert isinstance(norms, EntryNorms) and norms.keys == ["extra", "vector"]  # not the image
    g = torch.Generator().manual_seed(3)
    batch = TensorDict(
        {
            "image": torch.randint(0, 256, (2, 7, 5, 5, 3), generator=g, dtype=torch.uint8),
            "vector": torch.randn(2, 7, 3, generator=g) * 3 + 2,
            "extra": torch.randn(2, 7, 2, generator=g) - 5,
        },
        [2, 7],
    )

    class Ctx:
        @staticmethod
        def all_gather(x):
            return x

    learner.obs_norm.update_from(batch, Ctx.all_gather)  # what after_update calls
    for key, width in (("vector", 3), ("extra", 2)):
        mean, var = _hand_moments(batch[key].reshape(-1, width).double().numpy())
        stats = norms.of(key)
        np.testing.assert_allclose(stats.mean.numpy(), mean, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(stats.var.numpy(), var, rtol=1e-12, atol=1e-12)
    # the encoder's vector parts: (x - mean) / sqrt(var + 1e-8), clipped to 10, per entry
    encoder = next(m for m in learner.actor.modules() if isinstance(m, DictObsEncoder))
    assert encoder.in_keys == ["extra", "image", "vector"]
    x = batch[0, :3]
    features = encoder(*(x[k] for k in encoder.in_keys)).detach().double().numpy()
    parts = {"extra": features[:, :2], "vector": features[:, -3:]}
    for key, width in (("extra", 2), ("vector", 3)):
        mean, var = _hand_moments(batch[key].reshape(-1, width).double().numpy())
        want = (x[key].double().numpy() - mean) / np.sqrt(var + 1e-8)
        np.testing.assert_allclose(parts[key], want, rtol=1e-5, atol=1e-5)


def test_the_rlkit_collector_gives_torchrls_batches_for_a_dict_observation(three):
    """No fallback: rlkit's collector carries every entry (and every next entry), key for key
    and bit for bit what TorchRL's Collector yields, over two batches with episode ends."""
    from torchrl.collectors import Collector

    from rlkit.data.collector import VectorEnvCollector, make_collector

    torch.manual_seed(0)
    actor, _, _ = actor_critic_networks(three, encoder="minatar", obs_keys=["image", "vector"])
    assert isinstance(make_collector(three, actor, frames_per_batch=12), VectorEnvCollector)

    def batches(cls, **kw):
        torch.manual_seed(1)
        env = make_env(ThreeEntries, num_envs=2, seed=5)
        it = iter(cls(env, actor, frames_per_batch=16, total_frames=-1, **kw))
        out = [next(it) for _ in range(2)]
        env.close()
        return out

    ours = batches(VectorEnvCollector)
    theirs = batches(Collector, auto_register_policy_transforms=False)
    for a, b in zip(ours, theirs, strict=True):
        assert b.get(("next", "done")).any()
        for key in ("image", "vector", "extra"):
            for k in (key, ("next", key)):
                assert a.get(k).dtype == b.get(k).dtype, k
                assert torch.equal(a.get(k), b.get(k)), k
        assert a.get("extra").dtype == torch.float32  # float64 entries cast, as make_env does
        for k in ("action", ("next", "reward"), ("next", "done"), ("next", "episode_reward")):
            assert torch.equal(a.get(k), b.get(k)), k


def _dqn_learner(env, n_steps):
    from rlkit.algorithms import dqn
    from rlkit.configs.base import parse_config
    from rlkit.configs.dqn import DQNConfig

    flags = ["--encoder", "minatar", "--n-steps", str(n_steps), "--num-envs", "2"]
    return dqn.build(parse_config(DQNConfig, flags), env)


def _steps(num=2, steps=6):
    """A collector batch [2, 6] whose entries encode (env, step): entry value = 100 env + t
    (the next entry 100 env + t + 0.5), with a done at env 0, step 2."""
    i = torch.arange(num)[:, None] * 100 + torch.arange(steps)[None, :]
    done = torch.zeros(num, steps, 1, dtype=torch.bool)
    done[0, 2] = True

    def entries(value):
        return {
            "image": value.to(torch.uint8)[..., None, None, None].expand(num, steps, 5, 5, 3),
            "vector": value.float()[..., None].expand(num, steps, 3).clone(),
            "extra": (value.float() * 2)[..., None].expand(num, steps, 2).clone(),
        }

    return TensorDict(
        {
            **entries(i),
            "action": torch.zeros(num, steps, dtype=torch.long),
            "next": {
                **{k: v + (1 if k == "image" else 0.5) for k, v in entries(i).items()},
                "reward": torch.ones(num, steps, 1),
                "done": done,
                "terminated": done.clone(),
            },
        },
        [num, steps],
    )


@pytest.mark.parametrize("n_steps", [1, 3])
def test_the_replay_stores_every_entry_and_next_entry(three, n_steps):
    from rlkit.data.replay import Replay

    learner = _dqn_learner(three, n_steps)
    assert learner.obs_entries == ["extra", "image", "vector"]
    batch = _steps()
    replay = Replay(64)
    replay.extend(learner.transitions(batch))
    rows = replay.buffer.storage.get(torch.arange(len(replay)))
    # hand-computed windows: a transition from step t bootstraps from the next entry of step
    # min(t + n - 1, its episode's done step), only those whose n steps are in (t <= T - n)
    want = []
    for env in range(2):
        for t in range(6 - n_steps + 1):
            end = t
            for k in range(1, n_steps):
                if bool(batch["next", "done"][env, end]):
                    break
                end = t + k
            want.append((env, t, end))
    assert len(rows) == len(want)
    for row, (env, t, end) in zip(rows, want, strict=True):
        for key in ("image", "vector", "extra"):
            assert torch.equal(row[key], batch[key][env, t]), (key, env, t)
            assert torch.equal(row["next", key], batch["next", key][env, end]), (key, env, t)
    assert "observation" not in rows and ("next", "observation") not in rows.keys(True)


def test_dict_observation_learning_task_scores_as_designed():
    """The learning task: reading both entries scores 8, one entry at most about 4."""
    env = ImageVector()
    obs, _ = env.reset(seed=0)
    total = {"both": 0.0, "image": 0.0}
    for _ in range(8):
        a = int(obs["image"][..., 1].any())
        b = int(obs["vector"][1] > 0.5)
        obs_next, r, *_ = env.step(2 * a + b)
        total["both"] += r
        obs = obs_next
    assert total["both"] == 8.0


def test_a_recipe_collects_with_rlkits_collector_and_renders_a_video(tmp_path, caplog):
    """No silent fallback: no "collecting with TorchRL's Collector" line; the evaluation and
    the video read the entries as the training env writes them."""
    from tests.test_engine import load_recipe

    run_dir = tmp_path / "run"
    flags = ["--env", ENV, "--encoder", "minatar", "--num-envs", "2", "--rollout-steps", "32"]
    flags += ["--minibatch-size", "32", "--total-frames", "128", "--eval-episodes", "2"]
    flags += ["--video", "true", "--progress", "false", "--run-dir", str(run_dir)]
    with caplog.at_level("WARNING", logger="rlkit.data.collector"):
        summary = load_recipe("ppo").main(flags)
    assert "TorchRL's Collector" not in caplog.text
    assert summary["frames"] == 128 and 0.0 <= summary["eval_return_mean"] <= 8.0
    assert (run_dir / "eval.gif").stat().st_size > 0


@pytest.mark.slow
def test_worker_processes_collect_a_dict_observation(tmp_path):
    """impala --workers: each worker process's rlkit collector carries the entries."""
    from tests.test_engine import load_recipe

    flags = ["--env", ENV, "--encoder", "minatar", "--num-envs", "4", "--workers", "2"]
    flags += ["--minibatch-size", "32", "--total-frames", "256", "--eval-episodes", "2"]
    flags += ["--progress", "false", "--run-dir", str(tmp_path / "run")]
    summary = load_recipe("impala").main(flags)
    assert summary["frames"] >= 256 and 0.0 <= summary["eval_return_mean"] <= 8.0


class MaskedEntries(ThreeEntries):
    """ThreeEntries with an action mask beside the entries: one random action forbidden."""

    def __init__(self):
        super().__init__()
        entries = dict(self.observation_space.spaces)
        entries["action_mask"] = spaces.Box(0, 1, (3,), np.int8)
        self.observation_space = spaces.Dict(entries)

    def _obs(self):
        mask = np.ones(3, np.int8)
        mask[self.np_random.integers(3)] = 0
        self._mask = mask
        return {**super()._obs(), "action_mask": mask}


def test_a_mask_beside_the_entries_is_the_mask_not_an_input():
    from rlkit.algorithms.dqn import q_network
    from rlkit.data.collector import VectorEnvCollector

    env = make_env(MaskedEntries, num_envs=2, seed=0)
    assert resolve_obs_keys(env, None) == ["extra", "image", "vector"]
    torch.manual_seed(0)
    actor, critic, _ = actor_critic_networks(env, encoder="minatar")
    assert list(actor.in_keys) == ["extra", "image", "vector", "action_mask"]
    assert list(critic.in_keys) == ["extra", "image", "vector"]
    q = q_network(env, hidden=(16,), activation="relu", encoder="minatar")
    assert list(q.in_keys) == ["extra", "image", "vector", "action_mask"]
    collector = VectorEnvCollector(env, actor, frames_per_batch=40)
    batch = next(iter(collector))
    collector.shutdown()
    allowed = batch["action_mask"].gather(-1, batch["action"][..., None])
    assert bool(allowed.all())
    for key in ("extra", "image", "vector", "action_mask"):
        assert key in batch and ("next", key) in batch.keys(True)
