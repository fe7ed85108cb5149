"""Discrete action masks (issue 47, "Masks"): a masked action is never sampled or chosen, the
maths runs over the valid actions, the mask reaches every part that acts or scores.

References are written here: softmax over the valid logits, the max over the valid Q values,
the expectation over the valid actions."""

from __future__ import annotations

import math

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium import spaces
from tensordict import TensorDict
from tensordict.nn import InteractionType
from torchrl.collectors import Collector
from torchrl.data import Categorical, Composite, Unbounded
from torchrl.envs import EnvBase

import rlkit.envs  # noqa: F401  (registers rlkit/MaskedPick-v0)
from rlkit import keys
from rlkit.data.collector import VectorEnvCollector, make_collector
from rlkit.envs import make_env
from rlkit.envs.masked import MaskedPickEnv
from rlkit.modules import categorical_actor, make_actor, q_critic_discrete, value_critic
from rlkit.modules.masks import MaskedHead, random_valid_action
from rlkit.modules.policies import EpsilonExploration, GreedyQPolicy
from rlkit.objectives import DiscreteSACLoss, DQNLoss, PPOLoss
from rlkit.objectives.dqn import nstep_transitions

MASK = keys.ACTION_MASK


def random_masks(rows: int, n: int, generator=None) -> torch.Tensor:
    """Random masks ``[rows, n]`` bool, each row with at least one valid action."""
    mask = torch.rand(rows, n, generator=generator) < torch.rand(rows, 1, generator=generator)
    one = torch.randint(0, n, (rows,), generator=generator)
    mask[torch.arange(rows), one] = True
    return mask


def reference_log_softmax(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Softmax over the valid logits only, written from scratch: -inf where masked."""
    out = torch.full_like(logits, -math.inf)
    for i in range(logits.shape[0]):
        valid = mask[i].nonzero().squeeze(-1)
        z = logits[i, valid].double()
        out[i, valid] = (z - torch.log(torch.exp(z - z.max()).sum()) - z.max()).float()
    return out


def masked_env(num_envs=8, seed=0, **kw):
    """MaskedPick with a random number of valid actions at every step (1 to n)."""
    return make_env(
        "rlkit/MaskedPick-v0",
        num_envs=num_envs,
        seed=seed,
        env_kwargs={"n_valid": None, **kw},
    )


# ------------------------------------------------------------------ the distribution
def test_log_prob_entropy_and_gradients_match_a_masked_reference():
    torch.manual_seed(0)
    rows, n = 64, 10
    mask = random_masks(rows, n)
    actor = categorical_actor(5, n, mask_key=MASK)
    obs = torch.randn(rows, 5)
    td = TensorDict({keys.OBSERVATION: obs, MASK: mask.to(torch.int8)}, [rows])
    dist = actor.get_dist(td)
    logits = actor.module[0].module.net(obs)  # the network's raw logits
    ref = reference_log_softmax(logits.detach(), mask)
    action = random_valid_action(mask)
    torch.testing.assert_close(dist.log_prob(action), ref.gather(-1, action[:, None]).squeeze(-1))
    p = ref.exp()
    ref_entropy = -torch.where(mask, p * ref, torch.zeros(())).sum(-1)
    torch.testing.assert_close(dist.entropy(), ref_entropy)
    # gradients reach no masked logit: d(log-prob + entropy) / d(logit) is exactly 0 there
    raw = logits.detach().requires_grad_()
    masked = MaskedHead(torch.nn.Identity())(raw, mask)
    d = torch.distributions.Categorical(logits=masked)
    (d.log_prob(action).sum() + d.entropy().sum()).backward()
    assert (raw.grad[~mask] == 0).all()
    assert raw.grad[mask].abs().sum() > 0


def test_one_valid_action_among_1000_in_float32_is_finite():
    n = 1000
    mask = torch.zeros(3, n, dtype=torch.bool)
    mask[:, 7] = True
    raw = (torch.randn(3, n) * 30).requires_grad_()
    d = torch.distributions.Categorical(logits=MaskedHead(torch.nn.Identity())(raw, mask))
    action = torch.full((3,), 7)
    lp, ent = d.log_prob(action), d.entropy()
    assert torch.equal(lp, torch.zeros(3)) and torch.equal(ent.abs(), torch.zeros(3))
    assert torch.equal(d.sample((100,)), torch.full((100, 3), 7))
    assert torch.equal(d.mode, action)
    kl = torch.distributions.kl_divergence(d, d)
    (lp.sum() + ent.sum() + kl.sum()).backward()
    assert torch.isfinite(raw.grad).all() and (raw.grad == 0).all()


def test_kl_runs_over_the_valid_actions():
    """PPG's pre-auxiliary KL rebuilds distributions from stored (masked) logits."""
    torch.manual_seed(1)
    mask = random_masks(32, 6)
    head = MaskedHead(torch.nn.Identity())
    a, b = torch.randn(32, 6), torch.randn(32, 6)
    kl = torch.distributions.kl_divergence(
        torch.distributions.Categorical(logits=head(a, mask)),
        torch.distributions.Categorical(logits=head(b, mask)),
    )
    la, lb = reference_log_softmax(a, mask), reference_log_softmax(b, mask)
    ref = torch.where(mask, la.exp() * (la - lb), torch.zeros(())).sum(-1)
    torch.testing.assert_close(kl, ref)


def test_ppo_loss_scores_the_stored_action_over_the_valid_actions():
    torch.manual_seed(2)
    rows, n = 16, 5
    mask = random_masks(rows, n)
    actor = categorical_actor(3, n, mask_key=MASK)
    critic = value_critic(3)
    td = TensorDict({keys.OBSERVATION: torch.randn(rows, 3), MASK: mask}, [rows])
    td = actor(td)
    assert mask.gather(-1, td[keys.ACTION][:, None]).all()
    td.set(keys.ADVANTAGE, torch.randn(rows, 1))
    td.set(keys.VALUE_TARGET, torch.randn(rows, 1))
    out = PPOLoss(actor, critic, entropy_coef=0.01)(td)
    # on-policy: ratio 1 at the stored action (the behaviour log-prob is the masked one)
    assert out["ratio_mean"].item() == pytest.approx(1.0)
    assert all(torch.isfinite(v).all() for v in out.values())


# ------------------------------------------------------------------ never an invalid action
def _count_invalid(batch) -> tuple[int, int]:
    mask, action = batch.get(MASK), batch.get(keys.ACTION)
    if action.dim() == mask.dim():  # one-hot
        action = action.argmax(-1)
    invalid = int((mask.gather(-1, action.unsqueeze(-1)) == 0).sum())
    ended_invalid = int((batch.get(keys.REWARD) < 0).sum())  # the env's own verdict
    return invalid, ended_invalid


def _collect(env, policy, frames, exploration=InteractionType.RANDOM):
    collector = VectorEnvCollector(
        env, policy, frames_per_batch=frames, exploration_type=exploration
    )
    batch = next(iter(collector))
    collector.shutdown()
    return batch


#: env frames per check: 100k in the slow lane, 10k in the fast one
FRAMES = [pytest.param(100_000, marks=pytest.mark.slow), 10_000]


@pytest.mark.parametrize("frames", FRAMES)
def test_100k_sampled_and_greedy_policy_gradient_actions_are_all_valid(frames):
    torch.manual_seed(3)
    env = masked_env(num_envs=100, seed=3)
    actor = make_actor(env)
    assert MASK in actor.in_keys
    with torch.no_grad():  # sharp logits: sampling would pick masked actions if it could
        actor.module[0].module.net[-1].weight.mul_(2000)
    sampled = _collect(env, actor, frames)
    assert sampled.numel() == frames
    assert _count_invalid(sampled) == (0, 0)
    env = masked_env(num_envs=100, seed=4)
    greedy = _collect(env, actor, frames, InteractionType.DETERMINISTIC)
    assert _count_invalid(greedy) == (0, 0)


@pytest.mark.parametrize("frames", FRAMES)
def test_100k_greedy_and_epsilon_greedy_dqn_actions_are_all_valid(frames):
    torch.manual_seed(4)
    env = masked_env(num_envs=100, seed=5)
    n = 8
    q = q_critic_discrete(n, n, mask_key=MASK)
    spec = env.action_spec_unbatched
    explore = EpsilonExploration(GreedyQPolicy(q), spec, epsilon=0.5)
    assert _count_invalid(_collect(env, explore, frames)) == (0, 0)
    explore.epsilon = 1.0  # the warm-up's uniform actions: over the valid ones
    env = masked_env(num_envs=100, seed=6)
    batch = _collect(env, explore, 10_000)
    assert _count_invalid(batch) == (0, 0)
    # uniform over the valid actions: each valid action of a 2-valid state about half
    mask = batch.get(MASK)
    two = mask.sum(-1) == 2
    first = mask.int().argmax(-1)
    share = (batch.get(keys.ACTION)[two] == first[two]).float().mean().item()
    assert 0.45 < share < 0.55
    env = masked_env(num_envs=100, seed=7)
    greedy = _collect(env, GreedyQPolicy(q), frames)
    assert _count_invalid(greedy) == (0, 0)


def test_100k_rows_of_sampled_greedy_and_random_actions_are_valid():
    """The same at the tensor level, in one go: 100k random masks (1 to 50 valid of 50),
    sharp random logits."""
    g = torch.Generator().manual_seed(8)
    mask = random_masks(100_000, 50, g)
    logits = torch.randn(100_000, 50, generator=g) * 50
    dist = torch.distributions.Categorical(logits=MaskedHead(torch.nn.Identity())(logits, mask))
    for action in (dist.sample(), dist.mode, random_valid_action(mask)):
        assert mask.gather(-1, action[:, None]).all()
    q = MaskedHead(torch.nn.Identity())(logits, mask)
    assert mask.gather(-1, q.argmax(-1, keepdim=True)).all()


# ------------------------------------------------------------------ collection
def test_the_collector_carries_the_mask_as_torchrl_collector_does():
    """rlkit's collector (no fallback) gives TorchRL's Collector's batches bit for bit,
    masks at the root (the one the policy read) and under "next" (the one reached)."""

    def run(kind):
        env = make_env("rlkit/MaskedPick-v0", num_envs=4, seed=3)
        torch.manual_seed(2)
        actor = make_actor(env)
        torch.manual_seed(1)
        if kind == "torchrl":
            collector = Collector(
                env,
                actor,
                frames_per_batch=200,
                total_frames=-1,
                auto_register_policy_transforms=False,
            )
        else:
            collector = make_collector(env, actor, frames_per_batch=200)
            assert isinstance(collector, VectorEnvCollector)
        it = iter(collector)
        batches = [next(it) for _ in range(3)]
        collector.shutdown()
        return batches

    for ours, theirs in zip(run("rlkit"), run("torchrl"), strict=True):
        assert ours[keys.DONE].any()
        assert set(ours.keys(True, True)) == set(theirs.keys(True, True))
        for key in ours.keys(True, True):
            assert torch.equal(ours[key], theirs[key]), key
        assert ours[MASK].dtype == torch.int8
        # the logits the policy wrote used the stored mask
        lowest = ours[keys.LOGITS] == torch.finfo(torch.float32).min
        assert torch.equal(lowest, ours[MASK] == 0)


def test_a_mask_entry_as_multibinary_and_obs_normalisation():
    class MultiBinaryMask(gymnasium.ObservationWrapper):
        def __init__(self, env):
            super().__init__(env)
            space = env.observation_space
            self.observation_space = spaces.Dict(
                {"observation": space["observation"], MASK: spaces.MultiBinary(8)}
            )

        def observation(self, obs):
            return obs

    env = make_env(
        "rlkit/MaskedPick-v0", num_envs=2, seed=0, wrappers=[MultiBinaryMask], normalize_obs=True
    )
    batch = _collect(env, make_actor(env), 400)
    assert _count_invalid(batch) == (0, 0)


def test_a_mask_of_the_wrong_size_is_refused():
    class WrongMask(gymnasium.ObservationWrapper):
        def __init__(self, env):
            super().__init__(env)
            space = env.observation_space
            self.observation_space = spaces.Dict(
                {"observation": space["observation"], MASK: spaces.Box(0, 1, (5,), np.int8)}
            )

        def observation(self, obs):
            return {"observation": obs["observation"], MASK: obs[MASK][:5]}

    with pytest.raises(ValueError, match="one integer or bool flag per action"):
        make_env("rlkit/MaskedPick-v0", wrappers=[WrongMask])


# ------------------------------------------------------------------ DQN and SAC targets
def _masked_transitions(rows=64, n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    mask, next_mask = random_masks(rows, n, g), random_masks(rows, n, g)
    action = random_valid_action(mask)
    return TensorDict(
        {
            keys.OBSERVATION: torch.randn(rows, 3, generator=g),
            MASK: mask,
            keys.ACTION: action,
            "next": {
                keys.OBSERVATION: torch.randn(rows, 3, generator=g),
                MASK: next_mask,
                "reward": torch.randn(rows, 1, generator=g),
                "terminated": torch.rand(rows, 1, generator=g) < 0.2,
            },
        },
        [rows],
    )


@pytest.mark.parametrize("double_dqn", [False, True])
def test_the_dqn_target_never_maxes_over_a_masked_action(double_dqn):
    torch.manual_seed(5)
    td = _masked_transitions()
    q = q_critic_discrete(3, 6, mask_key=MASK)
    loss = DQNLoss(q, gamma=0.9, double_dqn=double_dqn)
    out = loss(td)
    raw = q.module.net(td["next", keys.OBSERVATION]).detach()  # unmasked Q(s', .)
    valid = td["next", MASK]
    assert (raw.argmax(-1) != raw.masked_fill(~valid, -math.inf).argmax(-1)).any()  # it matters
    best = torch.stack([raw[i, valid[i]].max() for i in range(raw.shape[0])])
    alive = (~td["next", "terminated"]).squeeze(-1).float()
    target = td["next", "reward"].squeeze(-1) + 0.9 * alive * best
    assert out["target_mean"].item() == pytest.approx(target.mean().item(), rel=1e-5)


def test_a_terminal_state_with_no_valid_action_gives_a_finite_target():
    td = _masked_transitions(rows=4)
    td["next", MASK] = torch.zeros(4, 6, dtype=torch.bool)
    td["next", "terminated"] = torch.ones(4, 1, dtype=torch.bool)
    out = DQNLoss(q_critic_discrete(3, 6, mask_key=MASK))(td)
    assert out["target_mean"].item() == pytest.approx(td["next", "reward"].mean().item())


def test_nstep_transitions_carry_the_mask_of_the_state_they_bootstrap_from():
    n_envs, steps, n = 2, 5, 4
    mask = random_masks(n_envs * steps, n).reshape(n_envs, steps, n)
    next_mask = random_masks(n_envs * steps, n).reshape(n_envs, steps, n)
    done = torch.zeros(n_envs, steps, 1, dtype=torch.bool)
    done[0, 1] = True
    batch = TensorDict(
        {
            keys.OBSERVATION: torch.randn(n_envs, steps, 3),
            keys.ACTION: torch.zeros(n_envs, steps, dtype=torch.long),
            MASK: mask,
            "next": {
                keys.OBSERVATION: torch.randn(n_envs, steps, 3),
                MASK: next_mask,
                "reward": torch.ones(n_envs, steps, 1),
                "done": done,
                "terminated": done.clone(),
            },
        },
        [n_envs, steps],
    )
    out = nstep_transitions(batch, n=3, gamma=0.5).reshape(n_envs, steps)
    assert torch.equal(out[MASK], mask)
    assert torch.equal(out["next", MASK][0, 0], next_mask[0, 1])  # cut at the done step
    assert torch.equal(out["next", MASK][1, 0], next_mask[1, 2])  # three steps later
    assert torch.equal(out["next", MASK][1, 4], next_mask[1, 4])  # the batch's end


def test_discrete_sac_expectations_run_over_the_valid_actions():
    torch.manual_seed(6)
    td = _masked_transitions(n=6)
    actor = categorical_actor(3, 6, mask_key=MASK, spec=Categorical(6))
    q1, q2 = q_critic_discrete(3, 6), q_critic_discrete(3, 6)
    # alpha 1e3: alpha times the lowest float32 would overflow to -inf (0 * -inf is NaN)
    loss = DiscreteSACLoss(actor, q1, q2, gamma=0.9, alpha_init=1e3)
    out = loss(td)
    assert all(torch.isfinite(v).all() for v in out.values())
    nxt, action = td["next"], td[keys.ACTION][:, None]
    with torch.no_grad():
        logp = reference_log_softmax(actor.module[0].module.net(nxt[keys.OBSERVATION]), nxt[MASK])
        qmin = torch.minimum(q1.module(nxt[keys.OBSERVATION]), q2.module(nxt[keys.OBSERVATION]))
        p = logp.exp()
        soft = torch.where(nxt[MASK], p * (qmin - 1e3 * logp), torch.zeros(())).sum(-1)
        alive = (~nxt["terminated"]).squeeze(-1).float()
        target = nxt["reward"].squeeze(-1) + 0.9 * alive * soft
        q1a = q1.module(td[keys.OBSERVATION]).gather(-1, action).squeeze(-1)
        q2a = q2.module(td[keys.OBSERVATION]).gather(-1, action).squeeze(-1)
        ref = 0.5 * ((q1a - target).square().mean() + (q2a - target).square().mean())
    torch.testing.assert_close(out["loss_qvalue"], ref, rtol=1e-5, atol=1e-5)
    # per-state target entropy: 0.98 log n_valid(s), over the valid actions
    logp_now = reference_log_softmax(actor.module[0].module.net(td[keys.OBSERVATION]), td[MASK])
    entropy = -torch.where(td[MASK], logp_now.exp() * logp_now, torch.zeros(())).sum(-1)
    gap = loss.actor_loss(td)[1]
    torch.testing.assert_close(gap, (entropy - 0.98 * td[MASK].sum(-1).float().log()).detach())


# ------------------------------------------------------------------ refusals
class _ContinuousMasked(gymnasium.Env):
    observation_space = spaces.Dict(
        {"observation": spaces.Box(-1, 1, (2,), np.float32), MASK: spaces.MultiBinary(2)}
    )
    action_space = spaces.Box(-1, 1, (2,), np.float32)

    def reset(self, *, seed=None, options=None):
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}


def test_a_continuous_policy_refuses_a_mask_in_one_line_naming_the_recipes():
    env = make_env(_ContinuousMasked, num_envs=2)
    with pytest.raises(ValueError) as err:
        make_actor(env)
    message = str(err.value)
    assert "\n" not in message
    assert "ppo, a2c, ppg, impala, appo, daac, rnd, dqn and sac (discrete actions)" in message


def test_make_actor_action_mask_false_ignores_the_entry():
    env = make_env("rlkit/MaskedPick-v0", num_envs=2)
    assert MASK not in make_actor(env, action_mask=False).in_keys
    with pytest.raises(ValueError, match="no 'action_mask' entry"):
        make_actor(make_env("CartPole-v1"), action_mask=True)


# ------------------------------------------------------------------ a TorchRL env's mask
class _TorchRLMaskedPick(EnvBase):
    """MaskedPick as a TorchRL env: an ``ActionMask``-style ``"action_mask"`` key (bool)."""

    def __init__(self, n: int = 6):
        super().__init__(batch_size=[])
        self.n = n
        self.observation_spec = Composite(
            observation=Unbounded((n,)), action_mask=Categorical(2, (n,), dtype=torch.bool)
        )
        self.action_spec = Categorical(n)
        self.reward_spec = Unbounded((1,))
        self._gen = torch.Generator()

    def _state(self):
        self._values = torch.rand(self.n, generator=self._gen)
        self._mask = torch.rand(self.n, generator=self._gen) < 0.5
        self._mask[torch.randint(0, self.n, (), generator=self._gen)] = True
        return {"observation": self._values.clone(), MASK: self._mask.clone()}

    def _reset(self, td):
        return TensorDict(self._state(), [])

    def _step(self, td):
        a = int(td["action"])
        valid = bool(self._mask[a])
        reward = self._values[a] if valid else torch.tensor(-1.0)
        out = self._state()
        out.update(reward=reward.view(1), done=torch.tensor([not valid]))
        out["terminated"] = out["done"].clone()
        return TensorDict(out, [])

    def _set_seed(self, seed):
        self._gen.manual_seed(int(seed or 0))


def test_a_torchrl_env_with_an_action_mask_key_is_read_too():
    env = make_env(_TorchRLMaskedPick, num_envs=3, seed=0, max_episode_steps=20)
    actor = make_actor(env)
    assert MASK in actor.in_keys
    collector = make_collector(env, actor, frames_per_batch=600)  # TorchRL's, with a warning
    batch = next(iter(collector))
    collector.shutdown()
    assert _count_invalid(batch) == (0, 0)


def test_pick_env_rewards_and_ends_as_documented():
    env = MaskedPickEnv(n_actions=8, n_valid=4)
    obs, _ = env.reset(seed=0)
    assert obs[MASK].sum() == 4
    values, mask = obs["observation"], obs[MASK]
    _, r, term, _, _ = env.step(int(np.flatnonzero(mask)[0]))
    assert r == pytest.approx(values[np.flatnonzero(mask)[0]]) and not term
    obs, _ = env.reset(seed=1)
    _, r, term, _, _ = env.step(int(np.flatnonzero(obs[MASK] == 0)[0]))
    assert r == -1.0 and term


@pytest.mark.parametrize(
    ("recipe", "env"),
    [
        ("ppo", "tests.test_masks:_ContinuousMasked"),
        ("sac", "tests.test_masks:_ContinuousMasked"),
        ("svpg", "rlkit/MaskedPick-v0"),
    ],
)
def test_recipes_that_cannot_honour_a_mask_refuse_it_before_the_run_directory(
    tmp_path, recipe, env
):
    from tests.test_engine import load_recipe

    run_dir = tmp_path / "run"
    flags = ["--env", env, "--total-frames", "1000", "--run-dir", str(run_dir)]
    with pytest.raises(ValueError, match=r"^this env writes an action mask .* the recipes that"):
        load_recipe(recipe).main([*flags, "--max-episode-steps", "10", "--progress", "false"])
    assert not run_dir.exists()
