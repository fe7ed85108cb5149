"""Structured actions (issue 47, "Action spaces" and "No silent mismatch"): MultiDiscrete,
MultiBinary and Dict / Tuple (hybrid) actions from the env to the loss, and loud failures where
an actor's actions do not fit its env.

References are written here: log-softmax, Normal and Bernoulli densities and entropies by hand,
the envs' rewards recomputed from the stored observations and actions."""

from __future__ import annotations

import math
import warnings

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium import spaces
from tensordict import TensorDict
from tensordict.nn import InteractionType
from torchrl.envs import GymEnv
from torchrl.envs.utils import ExplorationType, set_exploration_type

import rlkit.envs  # noqa: F401  (registers rlkit/MultiPick-v0, rlkit/HybridReach-v0)
from rlkit import keys
from rlkit.data.collector import VectorEnvCollector, make_collector
from rlkit.envs import make_env
from rlkit.modules import ActionSpecMismatchError, categorical_actor, make_actor, value_critic
from rlkit.modules.compat import check_env_compat
from rlkit.modules.composite import ActionLayout, ActionPart, MultiPartDistribution
from rlkit.objectives import A2CLoss, IMPALALoss, PPOLoss

HYBRID = ActionLayout(
    (
        ActionPart("kind", "discrete", (3,)),
        ActionPart("params", "normal", (2,)),
        ActionPart("bits", "binary", (2,)),
    ),
    named=True,
)


def _log_softmax(z: torch.Tensor) -> torch.Tensor:
    """By hand: z - log sum exp z, row by row."""
    return (
        z
        - torch.log(torch.exp(z - z.max(-1, keepdim=True).values).sum(-1, keepdim=True))
        - (z.max(-1, keepdim=True).values)
    )


def _hybrid_params(rows: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, HYBRID.width, generator=g)  # 3 logits, 2 locs, 2 log-stds, 2 bits


# ------------------------------------------------------------------ the distribution's maths
def test_the_joint_log_prob_is_the_sum_of_hand_computed_parts():
    params = _hybrid_params(64)
    dist = MultiPartDistribution(params, HYBRID)
    action = dist.sample()
    kind, point, bits = action["kind"], action["params"], action["bits"].double()
    p = params.double()
    # categorical: log softmax at the index
    lp_kind = _log_softmax(p[:, :3]).gather(-1, kind[:, None]).squeeze(-1)
    # Normal: sum over d of -(a - mu)^2 / (2 s^2) - log s - log sqrt(2 pi)
    loc, log_std = p[:, 3:5], p[:, 5:7]
    z = (point.double() - loc) / log_std.exp()
    lp_params = (-0.5 * z**2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
    # Bernoulli: b log sigma(x) + (1 - b) log(1 - sigma(x))
    q = 1 / (1 + torch.exp(-p[:, 7:9]))
    lp_bits = (bits * torch.log(q) + (1 - bits) * torch.log(1 - q)).sum(-1)
    parts = dist.log_prob_parts(action)
    for name, ref in (("kind", lp_kind), ("params", lp_params), ("bits", lp_bits)):
        torch.testing.assert_close(parts[name].double(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        dist.log_prob(action).double(), lp_kind + lp_params + lp_bits, rtol=1e-5, atol=1e-5
    )


def test_the_entropy_is_the_sum_of_hand_computed_parts():
    params = _hybrid_params(32, seed=1)
    dist = MultiPartDistribution(params, HYBRID)
    p = params.double()
    probs = torch.softmax(p[:, :3], -1)
    h_kind = -(probs * probs.log()).sum(-1)
    h_params = (0.5 * math.log(2 * math.pi * math.e) + p[:, 5:7]).sum(-1)
    q = torch.sigmoid(p[:, 7:9])
    h_bits = -(q * q.log() + (1 - q) * (1 - q).log()).sum(-1)
    parts = dist.entropy_parts()
    for name, ref in (("kind", h_kind), ("params", h_params), ("bits", h_bits)):
        torch.testing.assert_close(parts[name].double(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dist.entropy().double(), h_kind + h_params + h_bits)


def test_multidiscrete_log_prob_sums_one_categorical_per_entry():
    layout = ActionLayout((ActionPart("", "multi_discrete", (3, 2, 4)),), named=False)
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(16, 9, generator=g)
    dist = MultiPartDistribution(logits, layout)
    action = dist.sample()
    assert action.shape == (16, 3) and action.dtype == torch.int64
    assert (action < torch.tensor([3, 2, 4])).all()
    ref = 0
    for i, (lo, hi) in enumerate([(0, 3), (3, 5), (5, 9)]):
        ref = ref + _log_softmax(logits[:, lo:hi]).gather(-1, action[:, i : i + 1]).squeeze(-1)
    torch.testing.assert_close(dist.log_prob(action), ref)
    assert sorted(dist.entropy_parts()) == ["0", "1", "2"]


def test_the_mode_of_every_part():
    params = _hybrid_params(8, seed=3)
    mode = MultiPartDistribution(params, HYBRID).deterministic_sample
    assert torch.equal(mode["kind"], params[:, :3].argmax(-1))
    assert torch.equal(mode["params"], params[:, 3:5])
    assert torch.equal(mode["bits"], (params[:, 7:9] > 0).to(torch.int8))


# ------------------------------------------------------------------ MultiDiscrete masks
def test_masked_entries_are_never_sampled_and_get_no_gradient():
    env = make_env("rlkit/MultiPick-v0", num_envs=4, seed=0)
    actor = make_actor(env)
    assert actor.in_keys == [keys.OBSERVATION, keys.ACTION_MASK]
    rows = 12_000
    g = torch.Generator().manual_seed(0)
    mask = torch.zeros(rows, 3, 4, dtype=torch.int8)
    order = torch.rand(rows, 3, 4, generator=g).argsort(-1)[..., :2]  # 2 of 4 per slot
    mask.scatter_(-1, order, 1)
    td = TensorDict(
        {
            keys.OBSERVATION: torch.rand(rows, 12, generator=g),
            keys.ACTION_MASK: mask.reshape(rows, 12),
        },
        [rows],
    )
    with torch.no_grad():
        out = actor(td.clone())
    picked = mask.gather(-1, out[keys.ACTION].unsqueeze(-1))
    assert bool((picked == 1).all())  # 36,000 sampled entries, none masked
    with set_exploration_type(ExplorationType.DETERMINISTIC), torch.no_grad():
        greedy = actor(td.clone())[keys.ACTION]
    assert bool((mask.gather(-1, greedy.unsqueeze(-1)) == 1).all())
    # no gradient reaches a masked logit (the network's raw output); the valid ones get some
    small = td[:64].clone()
    head = actor.module[0].module
    captured = []

    def keep(module, inputs, output):
        output.retain_grad()
        captured.append(output)

    hook = head.net.register_forward_hook(keep)
    dist = actor.get_dist(small)
    hook.remove()
    (dist.log_prob(out[keys.ACTION][:64]).sum() + dist.entropy().sum()).backward()
    masked = small[keys.ACTION_MASK] == 0
    assert bool((captured[0].grad[masked] == 0).all())
    assert bool((captured[0].grad[~masked] != 0).any())
    # the actor's own head applies the same fill: stored params are lowest where masked
    assert bool(
        (out[keys.ACTION_PARAMS][td[keys.ACTION_MASK] == 0] == torch.finfo(torch.float32).min).all()
    )


def test_a_multidiscrete_mask_of_the_wrong_width_is_refused():
    class WrongMask(gymnasium.ObservationWrapper):
        def __init__(self, env):
            super().__init__(env)
            space = env.observation_space
            self.observation_space = spaces.Dict(
                {
                    "observation": space["observation"],
                    "action_mask": spaces.Box(0, 1, (4,), np.int8),
                }
            )

        def observation(self, obs):
            return {"observation": obs["observation"], "action_mask": obs["action_mask"][:4]}

    with pytest.raises(ValueError, match=r"per choice of every entry: Box\(0, 1, \(12,\)"):
        make_env("rlkit/MultiPick-v0", wrappers=[WrongMask])


# ------------------------------------------------------------------ envs and the collector
class _Record(gymnasium.Env):
    """Records every action it receives."""

    def __init__(self, space=None):
        self.action_space = space
        self.observation_space = spaces.Box(-1, 1, (3,), np.float32)
        self.seen = []

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.seen.append(action)
        return np.zeros(3, np.float32), 0.0, False, len(self.seen) % 5 == 0, {}


@pytest.mark.parametrize(
    "space",
    [
        spaces.MultiDiscrete([3, 2]),
        spaces.MultiBinary(3),
        spaces.Dict(kind=spaces.Discrete(3), params=spaces.Box(-1, 1, (2,), np.float32)),
        spaces.Tuple((spaces.Discrete(3), spaces.Box(-1, 1, (2,), np.float32))),
    ],
    ids=["multidiscrete", "multibinary", "dict", "tuple"],
)
def test_the_collector_sends_the_stored_actions_to_the_env(space):
    env = make_env(lambda: _Record(space), num_envs=2, seed=0)
    actor = make_actor(env)
    collector = make_collector(env, actor, frames_per_batch=8)
    assert isinstance(collector, VectorEnvCollector)  # rlkit's own, no fallback to TorchRL's
    batch = next(iter(collector))
    subs = env.base_env._env.envs
    for i, sub in enumerate(subs):
        # the probe before the run calls the actor, not the env: 4 steps each, in order
        assert len(sub.seen) == 4
        for t, got in enumerate(sub.seen):
            stored = batch[keys.ACTION][i, t]
            if isinstance(space, spaces.Dict):
                assert int(got["kind"]) == int(stored["kind"])
                np.testing.assert_array_equal(got["params"], stored["params"].numpy())
            elif isinstance(space, spaces.Tuple):
                assert int(got[0]) == int(stored["0"])
                np.testing.assert_array_equal(got[1], stored["1"].numpy())
            else:
                np.testing.assert_array_equal(np.asarray(got), stored.numpy())
    collector.shutdown()


def test_hybrid_rewards_match_the_stored_actions():
    """HybridReach's reward recomputed by hand from the batch's observation and action."""
    env = make_env("rlkit/HybridReach-v0", num_envs=4, seed=3)
    actor = make_actor(env)
    collector = VectorEnvCollector(env, actor, frames_per_batch=40)
    batch = next(iter(collector))
    collector.shutdown()
    obs = batch[keys.OBSERVATION]
    kind, point = batch[keys.ACTION, "kind"], batch[keys.ACTION, "params"].clamp(-1, 1)
    value = obs[..., :3].gather(-1, kind[..., None]).squeeze(-1)
    ref = value - (point - obs[..., 3:]).square().sum(-1)
    torch.testing.assert_close(batch[keys.REWARD].squeeze(-1), ref)
    # the stored log-probability is the actor's joint one at the stored action
    dist = actor.get_dist(batch.reshape(-1))
    torch.testing.assert_close(
        dist.log_prob(batch[keys.ACTION].reshape(-1)), batch[keys.ACTION_LOG_PROB].reshape(-1)
    )


def test_torchrl_rollout_and_evaluation_take_dict_actions():
    env = make_env("rlkit/HybridReach-v0", num_envs=2, seed=0)
    td = env.rollout(12, make_actor(env), break_when_any_done=False)
    assert td[keys.ACTION, "params"].shape == (2, 12, 2)
    assert td["next", "done"].sum() == 2  # the 10-step time limit, once per env


def test_a_bad_dict_action_space_is_refused_in_one_line():
    space = spaces.Dict(a=spaces.Discrete(2), b=spaces.Box(-1, 1, (2, 2), np.float32))
    with pytest.raises(ValueError, match="Dict / Tuple actions of Discrete, MultiBinary") as err:
        make_env(lambda: _Record(space), num_envs=2)
    assert "\n" not in str(err.value)


# ------------------------------------------------------------------ losses
@pytest.mark.parametrize("loss_cls", [PPOLoss, A2CLoss, IMPALALoss])
def test_losses_log_per_part_entropies_and_log_probs(loss_cls):
    env = make_env("rlkit/HybridReach-v0", num_envs=2, seed=0)
    actor = make_actor(env)
    critic = value_critic(5)
    collector = VectorEnvCollector(env, actor, frames_per_batch=16)
    batch = next(iter(collector))
    collector.shutdown()
    batch["advantage"] = torch.randn(*batch.shape, 1)
    batch["value_target"] = torch.randn(*batch.shape, 1)
    loss = loss_cls(actor, critic, entropy_coef=0.01)
    out = loss(batch)
    dist = actor.get_dist(batch)
    parts = dist.entropy_parts()
    for name in ("kind", "params"):
        torch.testing.assert_close(out[f"entropy_{name}"], parts[name].mean())
        lp = dist.log_prob_parts(batch[keys.ACTION])[name].mean()
        torch.testing.assert_close(out[f"log_prob_{name}"], lp)
    torch.testing.assert_close(out["entropy"], parts["kind"].mean() + parts["params"].mean())
    (out["loss_policy"] + out["loss_entropy"]).backward()
    head = actor.module[0].module
    assert head.log_std["p1"].grad is not None  # the Normal part's log-std trains


# ------------------------------------------------------------------ refusals
@pytest.mark.parametrize("recipe", ["dqn", "sac", "svpg", "ppg", "daac"])
def test_recipes_that_cannot_take_a_space_refuse_it_naming_those_that_can(tmp_path, recipe):
    from tests.test_engine import load_recipe

    run_dir = tmp_path / "run"
    flags = ["--env", "rlkit/HybridReach-v0", "--total-frames", "1000", "--run-dir", str(run_dir)]
    with pytest.raises(ValueError) as err:
        load_recipe(recipe).main([*flags, "--progress", "false"])
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("this env's actions are Dict(kind=Discrete(3), params=Box(2))")
    assert "ppo, a2c, impala, appo and rnd" in message
    assert not run_dir.exists()


# ------------------------------------------------------------------ no silent mismatch
def test_torchrl_collector_refuses_an_index_actor_on_a_one_hot_env():
    """Issue 47: categorical_actor(4, 2) under TorchRL's own Collector on a default
    GymEnv("CartPole-v1") (one-hot actions) ran with every action read as 0."""
    from torchrl.collectors import Collector

    env = GymEnv("CartPole-v1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ActionSpecMismatchError) as err:
            Collector(
                env,
                categorical_actor(4, 2),
                frames_per_batch=8,
                total_frames=16,
                auto_register_policy_transforms=False,
            )
    message = str(err.value)
    assert "index actions (int64, shape [*])" in message
    assert "OneHot(n=2) (one-hot actions, shape [*, 2])" in message
    # the matching encoding collects, and acts: both actions appear
    env = GymEnv("CartPole-v1", categorical_action_encoding=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        collector = Collector(
            env,
            categorical_actor(4, 2),
            frames_per_batch=64,
            total_frames=64,
            auto_register_policy_transforms=False,
        )
        batch = next(iter(collector))
    assert set(batch[keys.ACTION].tolist()) == {0, 1}


def test_structured_mismatches_fail_naming_both_sides():
    multi = make_env("rlkit/MultiPick-v0", num_envs=2)
    with pytest.raises(
        ActionSpecMismatchError, match=r"index actions .* MultiDiscrete\(\[4, 4, 4\]\)"
    ):
        check_env_compat(categorical_actor(12, 4), multi)
    other = make_env(lambda: MultiPickLike([4, 4]), num_envs=2)
    with pytest.raises(
        ActionSpecMismatchError,
        match=r"MultiDiscrete\(\[4, 4\]\) actions but the env's action spec is "
        r"MultiDiscrete\(\[4, 4, 4\]\)",
    ):
        check_env_compat(make_actor(other), multi)
    hybrid = make_env("rlkit/HybridReach-v0", num_envs=2)
    with pytest.raises(
        ActionSpecMismatchError, match=r"Dict\(kind=Discrete\(3\), params=Box\(2\)\)"
    ):
        check_env_compat(categorical_actor(5, 3), hybrid)


class MultiPickLike(gymnasium.Env):
    def __init__(self, nvec):
        self.action_space = spaces.MultiDiscrete(nvec)
        self.observation_space = spaces.Box(0, 1, (12,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(12, np.float32), {}

    def step(self, action):
        return np.zeros(12, np.float32), 0.0, False, False, {}


def test_interaction_modes_write_dict_actions():
    env = make_env("rlkit/HybridReach-v0", num_envs=3, seed=0)
    actor = make_actor(env)
    td = env.reset()
    for mode in (InteractionType.RANDOM, InteractionType.DETERMINISTIC):
        from tensordict.nn import set_interaction_type

        with set_interaction_type(mode), torch.no_grad():
            out = actor(td.clone())
        assert out[keys.ACTION, "kind"].shape == (3,)
        assert out[keys.ACTION_LOG_PROB].shape == (3,)


@pytest.mark.slow
def test_population_members_act_with_dict_actions(tmp_path):
    """A sweep's members (one policy over the members' blocks of envs) collect Dict actions
    and are evaluated (finite returns for every member)."""
    import json

    from tests.test_engine import load_recipe

    flags = ["--env", "rlkit/HybridReach-v0", "--num-envs", "2", "--rollout-steps", "64"]
    flags += ["--minibatch-size", "64"]
    flags += ["--total-frames", "256", "--eval-every", "256", "--eval-episodes", "4"]
    flags += ["--sweep", "lr=0.001,0.003", "--progress", "false", "--run-dir", str(tmp_path / "r")]
    load_recipe("ppo").main(flags)
    members = json.loads((tmp_path / "r" / "population.json").read_text())["members"]
    assert len(members) == 2
    assert all(math.isfinite(m["eval_return_mean"]) for m in members), members


def test_copybits_pays_the_fraction_of_bits_copied():
    """rlkit/CopyBits-v0 (the MultiBinary learning task): by hand, the observed bits copied
    pay 1 a step, their complement 0, one bit wrong 5/6."""
    import gymnasium

    env = gymnasium.make("rlkit/CopyBits-v0")
    obs, _ = env.reset(seed=4)
    bits = (obs > 0).astype(np.int8)
    obs2, reward, *_ = env.step(bits)
    assert reward == 1.0
    assert env.step(1 - (obs2 > 0).astype(np.int8))[1] == 0.0
    obs4 = env.step(bits)[0]
    one_off = (obs4 > 0).astype(np.int8)
    one_off[0] ^= 1
    assert abs(env.step(one_off)[1] - 5 / 6) < 1e-12
