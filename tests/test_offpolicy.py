"""Off-policy engine: target schedules, replay resume, update-to-data ratio, exploration."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rlkit import keys
from rlkit.algorithms.offpolicy import OffPolicyConfig
from rlkit.data.collector import VectorEnvCollector
from rlkit.envs import make_env
from rlkit.modules.policies import EpsilonExploration, GreedyQPolicy
from rlkit.objectives import DiscreteSACLoss
from rlkit.training.engine import Context, Counters

ROOT = Path(__file__).resolve().parents[1]


def load_recipe(name: str):
    from rlkit import algorithms

    return algorithms.load(name)


@pytest.fixture(scope="module")
def dqn():
    return load_recipe("dqn")


@pytest.fixture(scope="module")
def sac():
    return load_recipe("sac")


def context(total_frames: int = 10_000) -> Context:
    fabric = SimpleNamespace(device=torch.device("cpu"), world_size=1)
    return Context(fabric, total_frames, Counters())


class Rig:
    """A learner, its env and collector, and the engine's per-batch bookkeeping."""

    def __init__(self, recipe, cfg) -> None:
        torch.manual_seed(cfg.seed)
        np.random.seed(cfg.seed)  # TorchRL's prioritized sampler draws from numpy
        self.env = make_env(cfg.env, num_envs=cfg.num_envs, seed=cfg.seed)
        self.learner = recipe.build(cfg, self.env)
        self.collector = VectorEnvCollector(
            self.env, self.learner.collect_policy(), frames_per_batch=cfg.frames_per_batch
        )
        self.batches = iter(self.collector)
        self.ctx = context(cfg.total_frames)

    def step(self, batch=None) -> dict:
        batch = next(self.batches) if batch is None else batch
        metrics = self.learner.update(batch, self.ctx)
        self.ctx.counters.frames += batch.numel()
        return metrics

    def close(self) -> None:
        self.collector.shutdown()


SMALL_DQN = dict(
    num_envs=2,
    steps_per_batch=8,
    batch_size=8,
    buffer_size=50,
    learning_starts=16,
    utd_ratio=0.25,
    hidden=(16,),
    total_frames=1000,
)


# --------------------------------------------------------------------------- targets


def test_hard_target_update_happens_exactly_every_k_gradient_steps(dqn):
    rig = Rig(dqn, dqn.DQNConfig(**SMALL_DQN, target_update_period=3))
    loss = rig.learner.loss
    online = loss.q_network.module[-1].weight
    target = loss.target_network.module.module[-1].weight
    equal_after_step = []
    original = loss.update_target

    def update_target():
        updated = original()
        equal_after_step.append((updated, torch.equal(online, target)))
        return updated

    loss.update_target = update_target
    for _ in range(5):  # 16 frames per batch, 4 gradient steps per batch once learning
        rig.step()
    rig.close()
    assert len(equal_after_step) == 20  # the first batch already holds learning_starts
    for step, (updated, equal) in enumerate(equal_after_step, start=1):
        assert updated == (step % 3 == 0)
        assert equal == (step % 3 == 0), step  # the online net moves every step


def test_soft_target_update_matches_polyak(sac):
    cfg = sac.SACConfig(
        num_envs=2, steps_per_batch=4, batch_size=8, buffer_size=100, learning_starts=8,
        hidden=(16,), tau=0.2, total_frames=1000,
    )  # fmt: skip
    rig = Rig(sac, cfg)
    loss = rig.learner.loss
    checked = []
    original = loss.update_target

    def update_target():
        before = [p.clone() for p in loss.q2_target.parameters()]
        source = [p.clone() for p in loss.q2.parameters()]
        original()
        for b, s, t in zip(before, source, loss.q2_target.parameters()):
            torch.testing.assert_close(t, 0.8 * b + 0.2 * s, rtol=0, atol=1e-6)
        checked.append(True)

    loss.update_target = update_target
    for _ in range(3):
        rig.step()
    rig.close()
    assert len(checked) == 24  # 8 frames per batch, utd 1, learning from the first


# --------------------------------------------------------------------------- replay


def storage_rows(replay) -> dict:
    n = len(replay)
    rows = replay.buffer.storage.get(torch.arange(n))
    return {k: rows.get(k).clone() for k in rows.keys(True, True)}


@pytest.mark.parametrize("prioritized", [False, True])
def test_resume_with_saved_buffer_continues_from_the_same_contents(dqn, prioritized, tmp_path):
    cfg = dqn.DQNConfig(**SMALL_DQN | {"buffer_size": 40}, prioritized=prioritized)
    rig = Rig(dqn, cfg)
    for _ in range(4):  # 64 transitions into 40 slots: the buffer has wrapped
        rig.step()
    if prioritized:  # the largest priority ever set is no longer held by any row
        cursor = rig.learner.replay.buffer._writer.state_dict()["_cursor"]
        for priority in (100.0, 0.5):
            rig.learner.replay.update_priority(torch.tensor([cursor]), torch.tensor([priority]))
    path = tmp_path / "state.pt"
    torch.save(rig.learner.state_dict(), path)
    state = torch.load(path, weights_only=True)  # as the engine loads checkpoints

    fresh = Rig(dqn, cfg)
    fresh.learner.load_state_dict(state)
    restored = fresh.learner._replay(fresh.ctx)
    replay = rig.learner.replay
    assert len(restored) == len(replay) == 40
    before, after = storage_rows(replay), storage_rows(restored)
    assert before.keys() == after.keys()
    for key in before:
        torch.testing.assert_close(after[key], before[key], rtol=0, atol=0)
    assert restored.buffer._writer.state_dict() == replay.buffer._writer.state_dict()
    # the next batch overwrites the same slots in both
    batch = next(rig.batches)
    replay.extend(rig.learner.transitions(batch))
    restored.extend(fresh.learner.transitions(batch))
    for key, value in storage_rows(replay).items():
        torch.testing.assert_close(storage_rows(restored)[key], value, rtol=0, atol=0)
    if prioritized:
        torch.testing.assert_close(restored.priorities, replay.priorities)
        assert replay.priorities[cursor].item() == 100.0  # new rows: the maximum seen
        # identical priority trees: the same draws give the same indices and weights
        samples = []
        for r in (replay, restored):
            r.sampler.beta = 0.7  # set from training progress before every update phase
            np.random.seed(5)
            torch.manual_seed(5)
            samples.append(r.buffer.sample(16))
        torch.testing.assert_close(samples[0]["index"], samples[1]["index"])
        torch.testing.assert_close(samples[0]["priority_weight"], samples[1]["priority_weight"])
    assert fresh.learner.frames == rig.learner.frames
    assert fresh.learner.explore.epsilon == rig.learner.explore.epsilon
    rig.close()
    fresh.close()


def test_prioritized_replay_updates_priorities_from_td_errors(dqn):
    rig = Rig(dqn, dqn.DQNConfig(**SMALL_DQN, prioritized=True))
    for _ in range(3):
        rig.step()
    replay = rig.learner.replay
    priorities = replay.priorities[: len(replay)]
    assert (priorities != 1.0).any()  # new rows start at the max (1.0); trained rows moved
    # the sampler's tree holds (p + eps) ** alpha of the mirrored raw priorities
    tree = torch.as_tensor(replay.sampler._sum_tree[torch.arange(len(replay))])
    expected = (priorities + replay.sampler._eps) ** 0.6
    torch.testing.assert_close(tree.float(), expected, rtol=1e-5, atol=1e-6)
    rig.close()


def run_recipe(recipe, args, run_dir) -> list[dict]:
    recipe.main([*args, "--progress", "false", "--eval-every", "0", "--run-dir", str(run_dir)])
    with (run_dir / "metrics.csv").open() as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("save_buffer", [True, False])
def test_resumed_run_trains_at_once_only_with_a_saved_buffer(dqn, tmp_path, save_buffer):
    args = [
        "--num-envs", "2", "--steps-per-batch", "64", "--batch-size", "16",
        "--buffer-size", "1000", "--learning-starts", "200", "--utd-ratio", "0.125",
        "--hidden", "16", "--eval-episodes", "1", "--save-buffer", str(save_buffer),
    ]  # fmt: skip
    run_dir = tmp_path / "run"
    rows = run_recipe(dqn, [*args, "--total-frames", "256"], run_dir)
    assert [r["gradient_steps"] for r in rows] == ["0.0", "16.0"]
    rows = run_recipe(dqn, [*args, "--total-frames", "384", "--resume", "last"], run_dir)
    last = rows[-1]
    assert last["frames"] == "384"
    if save_buffer:  # the buffer holds 384 transitions and learning goes on
        assert (last["buffer_size"], last["gradient_steps"]) == ("384.0", "32.0")
    else:  # refilling from empty: 128 < learning_starts, no update yet
        assert (last["buffer_size"], last["gradient_steps"]) == ("128.0", "16.0")


# --------------------------------------------------------------------------- schedules


def test_utd_ratio_carries_fractional_steps(dqn):
    cfg = dqn.DQNConfig(**SMALL_DQN | {"utd_ratio": 0.15625, "learning_starts": 0})
    rig = Rig(dqn, cfg)
    counts = []
    for _ in range(4):
        rig.step()
        counts.append(rig.learner.gradient_steps)
    rig.close()
    # 16 frames x 0.15625 = 2.5 gradient steps per batch
    assert counts == [math.floor(2.5 * k) for k in range(1, 5)]


def test_learning_starts_and_epsilon_schedules(dqn):
    cfg = dqn.DQNConfig(
        **SMALL_DQN | {"learning_starts": 32, "total_frames": 1000},
        epsilon_start=0.9, epsilon_end=0.1, exploration_fraction=0.5,
    )  # fmt: skip
    learner = Rig(dqn, cfg).learner
    assert learner.explore.epsilon == 1.0  # uniform random fill from the start
    assert learner.exploration_epsilon(31, 1) == 1.0
    for frames in (32, 100, 250, 499, 500, 900):
        by_hand = 0.9 + (0.1 - 0.9) * min(1.0, frames / 1000 / 0.5)
        assert learner.exploration_epsilon(frames, 3) == pytest.approx(by_hand)
    cfg = dqn.DQNConfig(
        **SMALL_DQN, epsilon_schedule="exponential", epsilon_start=0.8, epsilon_decay=0.9,
        epsilon_end=0.2,
    )  # fmt: skip
    learner = Rig(dqn, cfg).learner
    for batches in (0, 1, 5, 13, 14, 40):
        by_hand = max(0.2, 0.8 * 0.9**batches)
        assert learner.exploration_epsilon(100, batches) == pytest.approx(by_hand)


def test_warmup_with_policy_acts_with_the_policys_exploration(dqn, sac):
    """pyrado's use_trained_policy_for_refill: the warm-up frames use the policy's own
    exploration (DQN: its epsilon schedule from the start; SAC: its stochastic policy) and
    the updates still wait for --learning-starts transitions."""
    base = SMALL_DQN | {"learning_starts": 40, "total_frames": 1000}
    cfg = dqn.DQNConfig(
        **base, epsilon_start=0.9, epsilon_end=0.1, exploration_fraction=0.5,
        warmup_with_policy=True,
    )  # fmt: skip
    rig = Rig(dqn, cfg)
    learner = rig.learner
    assert learner.explore.epsilon == pytest.approx(0.9)  # not 1.0: the schedule's start
    for frames in (0, 20, 39):
        by_hand = 0.9 + (0.1 - 0.9) * min(1.0, frames / 1000 / 0.5)
        assert learner.exploration_epsilon(frames, 1) == pytest.approx(by_hand)
    steps = [rig.step()["gradient_steps"] for _ in range(3)]
    rig.close()
    assert steps == [0.0, 0.0, 4.0]  # updates still start at learning_starts
    sac_cfg = sac.SACConfig(
        env="Pendulum-v1", num_envs=1, steps_per_batch=8, batch_size=8, buffer_size=100,
        learning_starts=50, warmup_with_policy=True,
    )  # fmt: skip
    sac_learner = Rig(sac, sac_cfg).learner
    assert sac_learner.exploration_epsilon(0, 0) == 0.0  # the policy samples from frame 0
    plain = sac.SACConfig(**{**sac_cfg.__dict__, "warmup_with_policy": False})
    assert Rig(sac, plain).learner.exploration_epsilon(0, 0) == 1.0


def test_no_update_before_learning_starts(dqn):
    rig = Rig(dqn, dqn.DQNConfig(**SMALL_DQN | {"learning_starts": 40}))
    steps = []
    for _ in range(3):
        steps.append(rig.step()["gradient_steps"])
    rig.close()
    assert steps == [0.0, 0.0, 4.0]  # 16, 32 < 40 <= 48 transitions


def test_epsilon_exploration_mixes_uniform_actions():
    env = make_env("CartPole-v1", num_envs=1, seed=0)
    spec = env.action_spec_unbatched
    env.close()

    class AlwaysZero(torch.nn.Module):
        in_keys, out_keys = [keys.OBSERVATION], [keys.ACTION]

        def forward(self, td):
            td.set(keys.ACTION, torch.zeros(td.batch_size, dtype=torch.long))
            return td

    from tensordict import TensorDict

    td = TensorDict({keys.OBSERVATION: torch.zeros(20_000, 4)}, [20_000])
    torch.manual_seed(0)
    for epsilon, share_of_ones in ((0.0, 0.0), (0.5, 0.25), (1.0, 0.5)):
        policy = EpsilonExploration(AlwaysZero(), spec, epsilon=epsilon)
        action = policy(td.clone())[keys.ACTION]
        assert action.dtype == torch.long and action.shape == (20_000,)
        assert action.float().mean().item() == pytest.approx(share_of_ones, abs=0.015)


def test_greedy_policy_takes_the_argmax():
    from tensordict import TensorDict
    from torchrl.modules import ValueOperator

    layer = torch.nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.eye(2))
    q = ValueOperator(layer, in_keys=[keys.OBSERVATION], out_keys=[keys.ACTION_VALUE])
    obs = torch.tensor([[1.0, 2.0], [3.0, -1.0]])
    out = GreedyQPolicy(q)(TensorDict({keys.OBSERVATION: obs}, [2]))
    assert out[keys.ACTION].tolist() == [1, 0]
    one_hot = GreedyQPolicy(q, one_hot=True)(TensorDict({keys.OBSERVATION: obs}, [2]))
    assert one_hot[keys.ACTION].tolist() == [[0, 1], [1, 0]]


def test_reward_standardisation_and_scale_leave_the_buffer_alone(dqn):
    cfg = dqn.DQNConfig(**SMALL_DQN, standardize_reward=True)
    rig = Rig(dqn, cfg)
    rig.step()
    sample = rig.learner.replay.buffer.sample(32)
    rewards = sample[keys.REWARD].clone()
    sample[keys.REWARD] = torch.randn(32, 1) * 3 + 2  # varied rewards (CartPole gives 1s)
    raw = sample[keys.REWARD].clone()
    prepared = rig.learner.prepare(sample.clone())[keys.REWARD]
    torch.testing.assert_close(prepared, (raw - raw.mean()) / (raw.std() + 1e-8))
    stored = rig.learner.replay.buffer.storage.get(sample["index"])[keys.REWARD]
    torch.testing.assert_close(stored, rewards)
    scaled = dqn.DQNConfig(**SMALL_DQN, reward_scale=0.1)
    learner = Rig(dqn, scaled).learner
    torch.testing.assert_close(learner.prepare(sample.clone())[keys.REWARD], raw * 0.1)
    rig.close()


@pytest.mark.parametrize("recipe", ["sac", "dqn"])
def test_reward_scale_applies_after_standardisation(recipe):
    """pyrado's SAC: ``standardize_rew`` then ``rew_scale``, so --reward-scale 5
    --standardize-reward gives minibatch rewards of mean 0 and std 5 (scaling first left
    std 1: the scale was lost). Reference: numpy on the raw rewards."""
    module = load_recipe(recipe)
    config = module.SACConfig if recipe == "sac" else module.DQNConfig
    env = "Pendulum-v1" if recipe == "sac" else "CartPole-v1"
    cfg = config(**SMALL_DQN, env=env, standardize_reward=True, reward_scale=5.0)
    learner = module.build(cfg, make_env(env, num_envs=2, seed=0))
    raw = torch.randn(64, 1, generator=torch.Generator().manual_seed(0)) * 3 + 2
    from tensordict import TensorDict

    prepared = learner.prepare(TensorDict({keys.REWARD: raw.clone()}, [64]))[keys.REWARD]
    r = raw.numpy().astype(np.float64)
    expected = 5.0 * (r - r.mean()) / (r.std(ddof=1) + 1e-8)
    np.testing.assert_allclose(prepared.numpy(), expected, rtol=1e-5, atol=1e-5)
    assert float(prepared.std()) == pytest.approx(5.0, rel=1e-5)
    assert abs(float(prepared.mean())) < 1e-5


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(batch_size=100, buffer_size=50), "--batch-size 100 is larger than --buffer-size"),
        (dict(learning_starts=60, buffer_size=50, batch_size=8), "--learning-starts 60 exceeds"),
        (dict(priority_alpha=0.0), "--priority-alpha must be in"),
        (dict(utd_ratio=0.0), "--utd-ratio must be > 0"),
        (dict(steps_per_batch=0), "--steps-per-batch must be > 0"),
        (dict(hidden=()), "--hidden needs positive layer sizes"),
    ],
)
def test_config_errors_name_the_flag(kwargs, message):
    with pytest.raises(ValueError, match=message):
        OffPolicyConfig(**kwargs)


def test_dqn_config_errors(dqn):
    with pytest.raises(ValueError, match="--epsilon-end must be in"):
        dqn.DQNConfig(epsilon_end=1.5)
    with pytest.raises(ValueError, match="--target-update-period must be >= 1"):
        dqn.DQNConfig(target_update_period=0)


def test_dqn_on_continuous_actions_is_a_clear_error(dqn):
    env = make_env("Pendulum-v1", num_envs=1, seed=0)
    with pytest.raises(ValueError, match="DQN needs a discrete action space.*recipes/sac.py"):
        dqn.build(dqn.DQNConfig(env="Pendulum-v1"), env)
    env.close()


def test_sac_recipe_picks_the_discrete_variant(sac):
    cfg = sac.SACConfig(env="CartPole-v1", hidden=(8,), learning_starts=10, batch_size=8)
    env = make_env("CartPole-v1", num_envs=1, seed=0)
    learner = sac.build(cfg, env)
    env.close()
    assert isinstance(learner.loss, DiscreteSACLoss)
    assert learner.loss.target_entropy == pytest.approx(0.98 * math.log(2))


def test_tanh_actor_policy_matches_the_actor():
    from tensordict import TensorDict
    from torchrl.envs.utils import ExplorationType, set_exploration_type

    from rlkit.modules import make_actor
    from rlkit.modules.policies import TanhActorPolicy

    env = make_env("Pendulum-v1", num_envs=1, seed=0)
    torch.manual_seed(0)
    actor = make_actor(env.observation_spec, env.action_spec, tanh=True, hidden=(16,))
    env.close()
    policy = TanhActorPolicy(actor)
    td = TensorDict({keys.OBSERVATION: torch.randn(64, 3)}, [64])
    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
        ours = policy(td.clone())
        theirs = actor(td.clone())
    torch.testing.assert_close(ours[keys.ACTION], theirs[keys.ACTION])
    torch.testing.assert_close(ours[keys.ACTION], 2.0 * torch.tanh(ours[keys.LOC]))
    with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
        out = policy(td.clone())
    action, loc, scale = out[keys.ACTION], out[keys.LOC], out[keys.SCALE]
    assert action.abs().max() <= 2.0 and not torch.equal(action, 2.0 * torch.tanh(loc))
    u = torch.atanh((action / 2.0).clamp(-1 + 1e-6, 1 - 1e-6))
    by_hand = torch.distributions.Normal(loc, scale).log_prob(u) - torch.log(
        2.0 * (1 - torch.tanh(u) ** 2)
    )
    torch.testing.assert_close(out[keys.ACTION_LOG_PROB], by_hand.sum(-1), atol=2e-3, rtol=1e-3)
    with pytest.raises(TypeError, match="TanhNormal"):
        TanhActorPolicy(make_actor(env.observation_spec, env.action_spec))


# DQN's two-rank run is tests/test_subprocess.py's replay-buffer test, SAC's a shared launch
# (tests/ddp_shared.py: --steps-per-batch 8 --learning-starts 32 --batch-size 32 --hidden 32,
# 256 frames)
@pytest.mark.slow
@pytest.mark.ddp_jobs("sac")
def test_ddp_two_ranks_keep_parameters_identical(ddp_jobs):
    run = ddp_jobs["sac"]
    summary = run.summary()
    assert summary["world_size"] == 2 and summary["frames"] == 256
    assert summary["rank_param_max_diff"] == 0.0
    rows = list(csv.DictReader((run.dir / "metrics.csv").open()))
    assert float(rows[-1]["gradient_steps"]) > 0  # both ranks trained (same step count)


def test_dqn_init_flag_picks_the_initialisation(dqn):
    env = make_env("CartPole-v1", num_envs=1, seed=0)
    layers = {}
    for init in ("torch", "orthogonal"):
        learner = dqn.build(dqn.DQNConfig(init=init, hidden=(64,)), env)
        layers[init] = [
            m for m in learner.loss.q_network.modules() if isinstance(m, torch.nn.Linear)
        ]
    env.close()
    first = layers["torch"][0]  # PyTorch's default: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    assert first.weight.abs().max() <= 1 / math.sqrt(4) and first.bias.abs().sum() > 0
    hidden = layers["orthogonal"][1].weight  # orthogonal rows, zero biases
    torch.testing.assert_close(hidden @ hidden.T, torch.eye(2), atol=1e-5, rtol=0)
    assert all(layer.bias.abs().sum() == 0 for layer in layers["orthogonal"])
