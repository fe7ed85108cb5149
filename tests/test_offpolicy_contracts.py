"""Off-policy learners against hand-written references: every loss term optimised, the right
tensors in the right places, prioritized replay as Schaul et al., n-step windows not cut.

Each reference step is written from the networks alone (copies of the modules, the textbook
formulas, ``torch.optim.Adam``), independent of the loss and learner code it checks.
"""

from __future__ import annotations

import copy
import math
import weakref

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from rlkit import keys
from rlkit.algorithms.dqn import DQNLearner, dqn_optimizer, epsilon_schedule
from rlkit.algorithms.offpolicy import OffPolicyConfig, offpolicy_settings, priority_weights
from rlkit.algorithms.sac import SACLearner, sac_optimizers
from rlkit.envs import make_env
from rlkit.modules.target import call_network
from rlkit.objectives import DQNLoss, SACLoss, nstep_transitions
from rlkit.training.update import LossContractError
from tests.test_offpolicy import SMALL_DQN, Rig, context, load_recipe

B = 8


@pytest.fixture(scope="module")
def dqn():
    return load_recipe("dqn")


@pytest.fixture(scope="module")
def sac():
    return load_recipe("sac")


#: the config each test's learner was built from (learners take no config)
CONFIGS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def cfg_of(learner):
    return CONFIGS[learner]


def build(recipe, cfg, env_name: str):
    torch.manual_seed(cfg.seed)
    env = make_env(env_name, num_envs=1, seed=cfg.seed)
    learner = recipe.build(cfg, env)
    env.close()
    CONFIGS[learner] = cfg
    return learner, env


def transitions(obs_dim: int, action, *, seed: int = 1, **extra) -> TensorDict:
    """``B`` transitions with s' unlike s, rewards of both signs, one terminal."""
    g = torch.Generator().manual_seed(seed)
    td = TensorDict(
        {
            keys.OBSERVATION: torch.randn(B, obs_dim, generator=g),
            keys.ACTION: action,
            "next": {
                keys.OBSERVATION: 3.0 * torch.randn(B, obs_dim, generator=g) + 1.0,
                "reward": torch.randn(B, 1, generator=g),
                "terminated": (torch.arange(B) == 2).unsqueeze(-1),
            },
        },
        batch_size=[B],
    )
    for key, value in extra.items():
        td.set(key, value)
    return td


def assert_params_equal(got, expected, what: str) -> None:
    got, expected = list(got), list(expected)
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=lambda m: f"{what}: {m}")


def moved(before, after) -> bool:
    return any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))


# --------------------------------------------------------------------------- DQN


def huber(error: torch.Tensor) -> torch.Tensor:
    return torch.where(error.abs() < 1, 0.5 * error.square(), error.abs() - 0.5)


def dqn_reference_steps(learner, samples, *, weights=None, norm_by="max", extra_coef=0.0):
    """DQN steps by hand: Huber TD loss on copies of the networks, clip, Adam.

    Two or more steps: Adam's first step is blind to a uniform scale of the gradient, so a
    wrong normalisation or clipping shows only from the second step on."""
    cfg = cfg_of(learner)
    assert cfg.target_update_period > len(samples)  # the target network stays put
    online = copy.deepcopy(learner.loss.q_network.module)
    target = copy.deepcopy(learner.loss.target_network.module.module)
    optimizer = torch.optim.Adam(online.parameters(), lr=cfg.lr, eps=cfg.adam_eps)
    for k, sample in enumerate(samples):
        obs, action = sample[keys.OBSERVATION], sample[keys.ACTION].long()
        next_obs = sample["next", keys.OBSERVATION]
        reward = sample["next", "reward"].squeeze(-1)
        not_done = 1.0 - sample["next", "terminated"].squeeze(-1).float()
        with torch.no_grad():
            y = reward + cfg.gamma * not_done * target(next_obs).max(-1).values
        q_all = online(obs)
        q = q_all.gather(-1, action.unsqueeze(-1)).squeeze(-1)
        pointwise = huber(q - y)
        if weights is None:
            loss = pointwise.mean()
        elif norm_by == "max":
            loss = (weights[k] * pointwise).mean()
        else:
            loss = (weights[k] * pointwise).sum() / weights[k].sum()
        loss = loss + extra_coef * (torch.logsumexp(q_all, -1) - q).mean()
        optimizer.zero_grad()
        loss.backward()
        if cfg.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(list(online.parameters()), cfg.max_grad_norm)
        optimizer.step()
    return list(online.parameters())


def train_steps(learner, samples, ctx=None) -> list[dict]:
    ctx = ctx or context()
    return [learner.train_step(sample.clone(), ctx) for sample in samples]


class DQNWithExtra(DQNLoss):
    """A CQL-style regulariser, ``logsumexp_a Q(s, a) - Q(s, a_data)``, as a new term."""

    def forward(self, tensordict):
        out = super().forward(tensordict)
        q_all = call_network(self.q_network, tensordict, keys.ACTION_VALUE)
        action = tensordict.get(keys.ACTION).long().unsqueeze(-1)
        q = q_all.gather(-1, action).squeeze(-1)
        out.set("loss_extra", 2.0 * (torch.logsumexp(q_all, -1) - q).mean())
        return out


def dqn_learner(dqn, loss_class=DQNLoss, **overrides) -> DQNLearner:
    cfg = dqn.DQNConfig(**SMALL_DQN | {"max_grad_norm": 0.2} | overrides)
    learner, env = build(dqn, cfg, "CartPole-v1")
    old = learner.loss
    if loss_class is not DQNLoss:
        loss = loss_class(old.q_network, gamma=cfg.gamma, target_period=cfg.target_update_period)
        learner = DQNLearner(
            loss=loss,
            optimizer=dqn_optimizer(cfg, loss.q_network.parameters()),
            action_spec=env.action_spec_unbatched,
            epsilon=epsilon_schedule(cfg),
            total_frames=cfg.total_frames,
            max_grad_norm=cfg.max_grad_norm,
            priority_weights=priority_weights(cfg),
            **offpolicy_settings(cfg),
        )
        CONFIGS[learner] = cfg
    return learner


def dqn_samples() -> list[TensorDict]:
    return [
        transitions(4, torch.tensor([0, 1, 1, 0, 1, 0, 0, 1]), seed=1),
        transitions(4, torch.tensor([1, 1, 0, 0, 1, 1, 0, 1]), seed=2),
    ]


def test_dqn_steps_match_a_hand_written_reference(dqn):
    learner = dqn_learner(dqn)
    samples = dqn_samples()
    expected = dqn_reference_steps(learner, samples)
    before = [p.clone() for p in learner.loss.q_network.parameters()]
    info = train_steps(learner, samples)
    assert moved(before, learner.loss.q_network.parameters())
    assert_params_equal(learner.loss.q_network.parameters(), expected, "Q network")
    assert {"loss_value", "value_mean", "target_mean", "grad_norm", "td_error"} <= set(info[0])
    assert all(i["grad_norm"] > cfg_of(learner).max_grad_norm for i in info)  # clipping binds


def test_dqn_optimises_a_term_a_subclass_adds(dqn):
    learner = dqn_learner(dqn, DQNWithExtra)
    samples = dqn_samples()
    expected = dqn_reference_steps(learner, samples, extra_coef=2.0)
    without = dqn_reference_steps(learner, samples)
    assert moved(expected, without)  # the extra term changes the steps
    info = train_steps(learner, samples)
    assert_params_equal(learner.loss.q_network.parameters(), expected, "Q network")
    assert "loss_extra" in info[0]


def test_dqn_term_that_trains_nothing_is_refused(dqn):
    class Inert(DQNLoss):
        def forward(self, tensordict):
            out = super().forward(tensordict)
            out.set("loss_inert", torch.ones((), requires_grad=True) * 3.0)
            return out

    learner = dqn_learner(dqn, Inert)
    with pytest.raises(LossContractError, match="loss_inert"):
        learner.train_step(dqn_samples()[0], context())


def test_dqn_loss_weights_must_match_the_replay_flags(dqn):
    cfg = dqn.DQNConfig(**SMALL_DQN, prioritized=True)
    learner, env = build(dqn, cfg, "CartPole-v1")
    assert learner.loss.priority_weights == "max"
    uniform_loss = DQNLoss(learner.loss.q_network)
    with pytest.raises(ValueError, match="priority_weights='max'"):
        DQNLearner(
            loss=uniform_loss,
            optimizer=dqn_optimizer(cfg, uniform_loss.q_network.parameters()),
            action_spec=env.action_spec_unbatched,
            epsilon=epsilon_schedule(cfg),
            total_frames=cfg.total_frames,
            priority_weights=priority_weights(cfg),
            **offpolicy_settings(cfg),
        )


# --------------------------------------------------------------------------- prioritized


def prioritized_samples(learner, ctx, beta: float, count: int = 2):
    """Fill the buffer, give its rows varied priorities, draw ``count`` x ``B`` with ``beta``."""
    replay = learner._replay(ctx)
    g = torch.Generator().manual_seed(3)
    for seed in range(3):
        replay.extend(transitions(4, torch.randint(2, (B,), generator=g), seed=seed))
    n = len(replay)
    priorities = torch.rand(n, generator=g) * 5 + 0.01
    replay.update_priority(torch.arange(n), priorities)
    replay.sampler.beta = beta
    np.random.seed(0)
    torch.manual_seed(0)
    return replay, priorities, [replay.buffer.sample(B) for _ in range(count)]


@pytest.mark.parametrize("norm_by", ["max", "sum"])
def test_prioritized_replay_weights_and_steps_follow_schaul(dqn, norm_by):
    learner = dqn_learner(dqn, prioritized=True, priority_weight_norm=norm_by)
    ctx = context()
    beta, alpha, eps = 0.7, cfg_of(learner).priority_alpha, cfg_of(learner).priority_eps
    replay, priorities, samples = prioritized_samples(learner, ctx, beta)
    # Schaul et al.: P(i) = p_i^a / sum p^a, w_i = (N P(i))^-beta / max_j w_j (over the buffer)
    p = (priorities.double() + eps) ** alpha
    w_all = (len(replay) * p / p.sum()) ** -beta
    weights = [(w_all / w_all.max())[s["index"]].float() for s in samples]
    for sample, w in zip(samples, weights, strict=True):
        torch.testing.assert_close(sample["priority_weight"].float(), w, rtol=1e-5, atol=1e-6)
    sums = sorted(float(w.sum()) for w in weights)
    assert sums[1] / sums[0] > 1.2  # so the max and sum forms differ beyond a uniform scale
    expected = dqn_reference_steps(learner, samples, weights=weights, norm_by=norm_by)
    train_steps(learner, samples, ctx)
    assert_params_equal(learner.loss.q_network.parameters(), expected, "Q network")


def test_prioritized_beta_is_annealed_to_one_over_the_budget(dqn):
    cfg = dqn.DQNConfig(
        **SMALL_DQN | {"total_frames": 160, "learning_starts": 0},
        prioritized=True, priority_beta=0.3,
    )  # fmt: skip
    rig = Rig(dqn, cfg)
    seen = []
    for _ in range(11):  # 16 frames per batch: progress 0, 0.1, ..., 1.0
        rig.step()
        seen.append(rig.learner.replay.sampler.beta)
    rig.close()
    expected = [0.3 + 0.7 * k / 10 for k in range(11)]
    assert seen == pytest.approx(expected)
    assert seen[-1] == pytest.approx(1.0)


# --------------------------------------------------------------------------- n-step


def stream(num: int, steps: int, seed: int) -> TensorDict:
    """A collector-like batch ``[num, steps]`` with done flags (one terminal, one truncation)."""
    g = torch.Generator().manual_seed(seed)
    done = torch.rand(num, steps, 1, generator=g) < 0.15
    terminated = done & (torch.rand(num, steps, 1, generator=g) < 0.5)
    # a continuing stream, as a collector writes it: step t + 1 starts where step t ended,
    # or from a fresh reset observation after a done step
    next_obs = torch.randn(num, steps, 2, generator=g)
    resets = torch.randn(num, steps, 2, generator=g)
    obs = torch.empty_like(next_obs)
    obs[:, 0] = resets[:, 0]
    obs[:, 1:] = torch.where(done[:, :-1], resets[:, 1:], next_obs[:, :-1])
    return TensorDict(
        {
            keys.OBSERVATION: obs,
            keys.ACTION: torch.randint(2, (num, steps), generator=g),
            "next": {
                keys.OBSERVATION: next_obs,
                "reward": torch.randn(num, steps, 1, generator=g),
                "done": done,
                "terminated": terminated,
            },
        },
        batch_size=[num, steps],
    )


@pytest.mark.parametrize("steps_per_batch", [1, 2, 5])
def test_dqn_nstep_windows_are_not_cut_at_batch_ends(dqn, steps_per_batch):
    n, num, batches = 3, 2, 12
    cfg = dqn.DQNConfig(**SMALL_DQN | {"num_envs": num}, n_steps=n, gamma=0.9)
    learner, _ = build(dqn, cfg, "CartPole-v1")
    full = stream(num, steps_per_batch * batches, seed=4)
    emitted = []
    for k in range(batches):
        part = full[:, k * steps_per_batch : (k + 1) * steps_per_batch]
        out = learner.transitions(part)
        emitted.append(out.reshape(num, out.shape[0] // num))
        if k >= n:  # steady state: one transition per collected step
            assert out.shape[0] == num * steps_per_batch
    got = torch.cat(emitted, dim=1)
    # the whole stream at once: windows stop only at done steps (and at the stream's end)
    whole = nstep_transitions(full, n=n, gamma=0.9).reshape(num, -1)[:, : got.shape[1]]
    assert got.shape[1] == full.shape[1] - n + 1
    for key in whole.keys(True, True):
        torch.testing.assert_close(
            got.get(key), whole.get(key), msg=lambda m, key=key: f"{key}: {m}"
        )
    assert (got.get(keys.BOOTSTRAP_DISCOUNT) < 0.9**2 + 1e-6).any()  # real 3-step windows


def test_dqn_nstep_with_one_step_per_batch_trains(dqn):
    """One env step per batch: the first n - 1 batches complete no window (nothing stored),
    then each batch completes one per env; the loss sees real n-step discounts."""
    one_step = {"steps_per_batch": 1, "learning_starts": 8, "batch_size": 4, "utd_ratio": 1.0}
    cfg = dqn.DQNConfig(**SMALL_DQN | one_step, n_steps=3, gamma=0.9)
    rig = Rig(dqn, cfg)
    sizes = [rig.step()["buffer_size"] for _ in range(8)]
    rig.close()
    assert sizes == [0.0, 0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0]
    stored = rig.learner.replay.buffer.storage.get(torch.arange(12))
    discounts = stored.get(keys.BOOTSTRAP_DISCOUNT).squeeze(-1)
    done = stored.get(("next", "done")).squeeze(-1)
    torch.testing.assert_close(discounts[~done], torch.full_like(discounts[~done], 0.9**3))
    assert rig.learner.gradient_steps > 0


def test_dqn_nstep_tail_survives_a_checkpoint(dqn, tmp_path):
    cfg = dqn.DQNConfig(**SMALL_DQN | {"num_envs": 2}, n_steps=3)
    learner, _ = build(dqn, cfg, "CartPole-v1")
    resumed, _ = build(dqn, cfg, "CartPole-v1")
    full = stream(2, 8, seed=5)
    learner._replay(context())
    learner.transitions(full[:, :4])
    torch.save(learner.state_dict(), tmp_path / "state.pt")
    resumed.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    after_resume = resumed.transitions(full[:, 4:])
    uninterrupted = learner.transitions(full[:, 4:])
    assert after_resume.shape[0] == 2 * 4
    for key in uninterrupted.keys(True, True):
        torch.testing.assert_close(after_resume.get(key), uninterrupted.get(key))


def test_dqn_nstep_tail_ends_where_a_resumed_runs_envs_restart(dqn, tmp_path):
    """A resumed run's envs start from a reset: the saved tail's windows end at the tail
    (a truncation, bootstrapped from its last next observation), as a textbook loop over the
    saved stream alone computes them, instead of running on into the new episodes."""
    n, gamma = 3, 0.9
    cfg = dqn.DQNConfig(**SMALL_DQN | {"num_envs": 2}, n_steps=n, gamma=gamma)
    learner, _ = build(dqn, cfg, "CartPole-v1")
    resumed, _ = build(dqn, cfg, "CartPole-v1")
    saved = stream(2, 6, seed=7)
    saved.get(keys.DONE)[:] = False  # no episode ends: every tail window reaches the cut
    saved.get(keys.TERMINATED)[:] = False
    learner.transitions(saved)
    torch.save(learner.state_dict(), tmp_path / "state.pt")
    resumed.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    restarted = stream(2, 4, seed=8)  # another stream: its first observations are resets
    out = resumed.transitions(restarted).reshape(2, -1)
    reward = saved.get(keys.REWARD).squeeze(-1)
    for env in range(2):
        for j, t in enumerate(range(6 - (n - 1), 6)):  # the tail's steps, first in the output
            m = 6 - t  # steps left in the saved stream
            row = out[env, j]
            expected = sum(gamma**k * reward[env, t + k] for k in range(m))
            torch.testing.assert_close(row.get(keys.REWARD).squeeze(), expected)
            torch.testing.assert_close(
                row.get(keys.BOOTSTRAP_DISCOUNT).squeeze(), torch.tensor(gamma**m)
            )
            assert torch.equal(
                row.get(keys.NEXT_OBSERVATION), saved.get(keys.NEXT_OBSERVATION)[env, -1]
            )
            assert torch.equal(row.get(keys.OBSERVATION), saved.get(keys.OBSERVATION)[env, t])
            assert bool(row.get(keys.DONE)) and not bool(row.get(keys.TERMINATED))
    # the new stream's own windows start at its first step
    assert torch.equal(out[:, n - 1].get(keys.OBSERVATION), restarted.get(keys.OBSERVATION)[:, 0])


# --------------------------------------------------------------------------- SAC


def tanh_gaussian(params, obs, noise, low=-2.0, high=2.0):
    """Textbook tanh-Gaussian draw and density: N(u; mu, sigma) / |da/du|, a = m + h tanh u."""
    loc, scale = params(obs)
    u = loc + scale * noise
    half, mid = (high - low) / 2, (high + low) / 2
    action = mid + half * torch.tanh(u)
    log_prob = torch.distributions.Normal(loc, scale).log_prob(u)
    log_prob = log_prob - torch.log(half * (1 - torch.tanh(u).square()))
    return action, log_prob.sum(-1)


def sac_reference_steps(learner, samples, *, seed: int, extra_coef: float = 0.0, weights=None):
    """Per step: critic step, Polyak step, then actor + temperature against the updated critics.

    Noise: ``torch.manual_seed(seed)``, then per step one ``randn`` draw for a' ~ pi(s')
    (critic target) and one for a ~ pi(s) (actor)."""
    cfg, loss = cfg_of(learner), learner.loss
    params = copy.deepcopy(loss.actor.module[0].module)
    q1, q2 = (copy.deepcopy(q.module) for q in (loss.q1, loss.q2))
    t1, t2 = (copy.deepcopy(t.module.module) for t in (loss.q1_target, loss.q2_target))
    log_alpha = loss.log_alpha.detach().clone().requires_grad_(True)
    critic_params = [*q1.parameters(), *q2.parameters()]
    critic_opt = torch.optim.Adam(critic_params, lr=cfg.lr, eps=cfg.adam_eps)
    actor_opt = torch.optim.Adam(
        [
            {"params": list(params.parameters()), "lr": cfg.actor_lr or cfg.lr},
            {"params": [log_alpha], "lr": cfg.alpha_lr or cfg.lr},
        ],
        eps=cfg.adam_eps,
    )
    torch.manual_seed(seed)
    for sample in samples:
        obs, action = sample[keys.OBSERVATION], sample[keys.ACTION]
        next_obs = sample["next", keys.OBSERVATION]
        reward = sample["next", "reward"].squeeze(-1)
        not_done = 1.0 - sample["next", "terminated"].squeeze(-1).float()
        noise_next, noise_now = torch.randn(B, 1), torch.randn(B, 1)
        alpha = log_alpha.detach().exp()
        # critics
        with torch.no_grad():
            a_next, logp_next = tanh_gaussian(params, next_obs, noise_next)
            q_next = torch.minimum(t1(next_obs, a_next), t2(next_obs, a_next)).squeeze(-1)
            y = reward + cfg.gamma * not_done * (q_next - alpha * logp_next)
        qa1, qa2 = q1(obs, action).squeeze(-1), q2(obs, action).squeeze(-1)
        w = torch.ones(B) if weights is None else weights
        loss_q = 0.5 * ((w * (qa1 - y).square()).mean() + (w * (qa2 - y).square()).mean())
        loss_q = loss_q + extra_coef * (qa1 + qa2).mean()
        critic_opt.zero_grad()
        loss_q.backward()
        critic_opt.step()
        # Polyak
        with torch.no_grad():
            for target, online in ((t1, q1), (t2, q2)):
                for pt, po in zip(target.parameters(), online.parameters(), strict=True):
                    pt.mul_(1 - cfg.tau).add_(cfg.tau * po)
        # actor and temperature against the updated critics
        for p in critic_params:
            p.requires_grad_(False)
        a_now, logp_now = tanh_gaussian(params, obs, noise_now)
        q_now = torch.minimum(q1(obs, a_now), q2(obs, a_now)).squeeze(-1)
        for p in critic_params:
            p.requires_grad_(True)
        loss_pi = (alpha * logp_now - q_now).mean()
        loss_alpha = -(log_alpha * (logp_now.detach() + loss.target_entropy)).mean()
        actor_opt.zero_grad()
        (loss_pi + loss_alpha).backward()
        actor_opt.step()
    return {
        "actor": list(params.parameters()),
        "critic": critic_params,
        "target": [*t1.parameters(), *t2.parameters()],
        "log_alpha": [log_alpha],
    }


def sac_learner_params(loss) -> dict[str, list]:
    return {
        "actor": list(loss.actor.parameters()),
        "critic": loss.critic_parameters(),
        "target": [*loss.q1_target.parameters(), *loss.q2_target.parameters()],
        "log_alpha": [loss.log_alpha],
    }


SMALL_SAC = dict(hidden=(16,), batch_size=B, learning_starts=0, alpha_lr=3e-3, actor_lr=2e-3)


class SACWithExtra(SACLoss):
    """A CQL-style critic regulariser (pushes Q(s, a_data) down) as a new critic term."""

    def critic_terms(self, tensordict):
        out = super().critic_terms(tensordict)
        q1 = self._q(self.q1, tensordict, tensordict.get(keys.ACTION))
        q2 = self._q(self.q2, tensordict, tensordict.get(keys.ACTION))
        out.set("loss_extra", 0.5 * (q1 + q2).mean())
        return out


def sac_learner(sac, loss_class=SACLoss, **overrides) -> SACLearner:
    cfg = sac.SACConfig(**SMALL_SAC | overrides)
    learner, env = build(sac, cfg, "Pendulum-v1")
    if loss_class is not SACLoss:
        old = learner.loss
        loss = loss_class(old.actor, old.q1, old.q2, gamma=cfg.gamma, tau=cfg.tau)
        critic_optimizer, actor_optimizer = sac_optimizers(
            loss, lr=cfg.lr, eps=cfg.adam_eps, actor_lr=cfg.actor_lr, alpha_lr=cfg.alpha_lr
        )
        learner = SACLearner(
            loss=loss,
            critic_optimizer=critic_optimizer,
            actor_optimizer=actor_optimizer,
            action_spec=env.action_spec_unbatched,
            max_grad_norm=cfg.max_grad_norm,
            priority_weights=priority_weights(cfg),
            **offpolicy_settings(cfg),
        )
        CONFIGS[learner] = cfg
    return learner


def sac_samples() -> list[TensorDict]:
    g = torch.Generator().manual_seed(7)
    return [transitions(3, 4 * torch.rand(B, 1, generator=g) - 2, seed=k) for k in (1, 2)]


def run_sac_steps(learner, samples, seed: int) -> list[dict]:
    torch.manual_seed(seed)
    ctx, info = context(), []
    for sample in samples:
        info.append(learner.train_step(sample.clone(), ctx))
        learner.gradient_steps += 1  # as OffPolicyLearner.update counts them
    return info


def test_sac_steps_match_a_hand_written_reference(sac):
    learner = sac_learner(sac)
    samples = sac_samples()
    expected = sac_reference_steps(learner, samples, seed=11)
    info = run_sac_steps(learner, samples, seed=11)
    got = sac_learner_params(learner.loss)
    for part in ("critic", "target", "actor", "log_alpha"):
        assert_params_equal(got[part], expected[part], part)
    assert {"loss_qvalue", "loss_actor", "loss_alpha", "entropy", "alpha"} <= set(info[0])


def test_sac_optimises_a_critic_term_a_subclass_adds(sac):
    learner = sac_learner(sac, SACWithExtra)
    samples = sac_samples()
    expected = sac_reference_steps(learner, samples, seed=11, extra_coef=0.5)
    without = sac_reference_steps(learner, samples, seed=11)
    assert moved(expected["critic"], without["critic"])
    info = run_sac_steps(learner, samples, seed=11)
    got = sac_learner_params(learner.loss)
    for part in ("critic", "target", "actor", "log_alpha"):
        assert_params_equal(got[part], expected[part], part)
    assert "loss_extra" in info[0]


def test_sac_loss_that_overrides_forward_is_refused(sac):
    class ForwardExtra(SACLoss):
        def forward(self, tensordict):
            out = super().forward(tensordict)
            out.set("loss_extra", self.log_alpha * 0.0)
            return out

    with pytest.raises(TypeError, match="overrides forward.*critic_terms or actor_terms"):
        sac_learner(sac, ForwardExtra)


def test_sac_policy_delay_steps_the_actor_every_k_critic_steps(sac):
    learner = sac_learner(sac, policy_delay=2)
    sample = sac_samples()[0]
    actor_moved, critic_moved = [], []
    for step in range(4):
        actor = [p.clone() for p in learner.loss.actor.parameters()]
        critic = [p.clone() for p in learner.loss.critic_parameters()]
        run_sac_steps(learner, [sample], seed=step)
        actor_moved.append(moved(actor, learner.loss.actor.parameters()))
        critic_moved.append(moved(critic, learner.loss.critic_parameters()))
    assert critic_moved == [True] * 4
    assert actor_moved == [True, False, True, False]


def test_sac_refuses_nstep_targets(sac):
    with pytest.raises(ValueError, match="--n-steps 3: SAC.*use --n-steps 1"):
        sac.SACConfig(n_steps=3)
    learner = sac_learner(sac)
    old = learner.loss
    loss = SACLoss(old.actor, old.q1, old.q2, n_steps=2)
    env = make_env("Pendulum-v1", num_envs=1, seed=0)
    with pytest.raises(ValueError, match="--n-steps 2"):
        cfg = OffPolicyConfig()
        critic_optimizer, actor_optimizer = sac_optimizers(loss, lr=cfg.lr, eps=cfg.adam_eps)
        SACLearner(
            loss=loss,
            critic_optimizer=critic_optimizer,
            actor_optimizer=actor_optimizer,
            action_spec=env.action_spec_unbatched,
            **offpolicy_settings(cfg),
        )
    env.close()


def test_sac_cli_refuses_nstep_in_one_line(sac, capsys):
    with pytest.raises((SystemExit, ValueError)) as err:
        sac.main(["--n-steps", "4", "--progress", "false"])
    text = str(err.value) + capsys.readouterr().err
    assert "--n-steps 4" in text and "use --n-steps 1" in text


def test_sac_prioritized_critic_weights_follow_the_flag(sac):
    learner = sac_learner(sac, prioritized=True)
    assert learner.loss.priority_weights == "max"
    assert keys.PRIORITY_WEIGHT in learner.critic_group.loss.in_keys
    weights = torch.linspace(0.2, 1.0, B)
    samples = sac_samples()
    for sample in samples:
        sample.set(keys.PRIORITY_WEIGHT, weights)
    expected = sac_reference_steps(learner, samples, seed=5, weights=weights)
    run_sac_steps(learner, samples, seed=5)
    assert_params_equal(learner.loss.critic_parameters(), expected["critic"], "critic")
    assert math.isclose(float(weights.max()), 1.0)
