"""SACLoss and DiscreteSACLoss against hand-computed references."""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import Bounded, Categorical, Composite, Unbounded

from rlkit import keys
from rlkit.modules import make_actor, q_critic_continuous, q_critic_discrete
from rlkit.modules.distributions import tanh_normal_rsample
from rlkit.objectives import DiscreteSACLoss, MissingKeyError, SACLoss
from rlkit.objectives.dqn import PRIORITY_WEIGHT

GAMMA = 0.9
B, OBS, ACT = 6, 3, 2
LOW, HIGH = torch.tensor([-2.0, -1.0]), torch.tensor([2.0, 3.0])


def specs(discrete: bool = False, n: int = 3):
    obs = Composite({keys.OBSERVATION: Unbounded(shape=(OBS,))})
    if discrete:
        return obs, Categorical(n)
    return obs, Bounded(low=LOW, high=HIGH, shape=(ACT,))


def continuous_loss(**kw) -> SACLoss:
    torch.manual_seed(0)
    obs, act = specs()
    actor = make_actor(obs, act, tanh=True, hidden=(16,))
    q1, q2 = (q_critic_continuous(OBS, ACT, hidden=(16,)) for _ in range(2))
    loss = SACLoss(actor, q1, q2, gamma=GAMMA, alpha_init=0.5, **kw)
    # make the online critics differ from their targets
    with torch.no_grad():
        for p in [*q1.parameters(), *q2.parameters()]:
            p.add_(0.1 * torch.randn_like(p))
    return loss


def batch(discrete: bool = False, n: int = 3) -> TensorDict:
    g = torch.Generator().manual_seed(1)
    if discrete:
        action = torch.randint(n, (B,), generator=g)
    else:
        action = LOW + (HIGH - LOW) * torch.rand(B, ACT, generator=g)
    return TensorDict(
        {
            keys.OBSERVATION: torch.randn(B, OBS, generator=g),
            keys.ACTION: action,
            "next": {
                keys.OBSERVATION: torch.randn(B, OBS, generator=g),
                "reward": torch.randn(B, 1, generator=g),
                "terminated": torch.tensor([0, 1, 0, 0, 1, 0], dtype=torch.bool).unsqueeze(-1),
            },
        },
        batch_size=[B],
    )


def q_of(net, obs, action) -> torch.Tensor:
    td = TensorDict({keys.OBSERVATION: obs, keys.ACTION: action}, [obs.shape[0]])
    return net(td)[keys.STATE_ACTION_VALUE].squeeze(-1)


def recording(loss: SACLoss) -> list:
    """Record every (observation, action, log_prob) the loss samples from the actor."""
    calls = []
    original = loss._sample

    def sample(td):
        action, log_prob = original(td)
        calls.append((td.get(keys.OBSERVATION), action, log_prob))
        return action, log_prob

    loss._sample = sample
    return calls


def hand_log_prob(actor, obs, action) -> torch.Tensor:
    """Textbook tanh-Gaussian density: N(u; mu, sigma) / |da/du| with a = m + h tanh u."""
    params = actor.module[0](TensorDict({keys.OBSERVATION: obs}, [obs.shape[0]]))
    loc, scale = params.get(keys.LOC), params.get(keys.SCALE)
    mid, half = (HIGH + LOW) / 2, (HIGH - LOW) / 2
    tanh_u = ((action - mid) / half).clamp(-1 + 1e-6, 1 - 1e-6)
    u = torch.atanh(tanh_u)
    log_normal = torch.distributions.Normal(loc, scale).log_prob(u)
    return (log_normal - torch.log(half * (1 - tanh_u.square()))).sum(-1)


def test_critic_target_and_loss_match_hand_computation():
    loss = continuous_loss()
    calls = recording(loss)
    td = batch()
    loss_q, info = loss.qvalue_loss(td)
    (next_obs, next_action, next_log_prob) = calls[0]
    torch.testing.assert_close(next_obs, td["next", keys.OBSERVATION])
    # the log-probability is the tanh-Gaussian density at the sampled action
    torch.testing.assert_close(
        next_log_prob, hand_log_prob(loss.actor, next_obs, next_action), atol=1e-3, rtol=1e-4
    )
    with torch.no_grad():
        q1_next = q_of(loss.q1_target.module, next_obs, next_action)
        q2_next = q_of(loss.q2_target.module, next_obs, next_action)
        alpha = 0.5
        reward = td["next", "reward"].squeeze(-1)
        not_done = 1.0 - td["next", "terminated"].squeeze(-1).float()
        target = reward + GAMMA * not_done * (torch.min(q1_next, q2_next) - alpha * next_log_prob)
        q1 = q_of(loss.q1, td[keys.OBSERVATION], td[keys.ACTION])
        q2 = q_of(loss.q2, td[keys.OBSERVATION], td[keys.ACTION])
        expected = 0.5 * ((q1 - target).square().mean() + (q2 - target).square().mean())
    assert loss_q.item() == pytest.approx(expected.item(), rel=1e-5)
    torch.testing.assert_close(info["td_error"], 0.5 * ((q1 - target).abs() + (q2 - target).abs()))


def test_actor_loss_matches_hand_computation():
    loss = continuous_loss()
    calls = recording(loss)
    td = batch()
    loss_pi, gap, info = loss.actor_loss(td)
    obs, action, log_prob = calls[0]
    with torch.no_grad():
        q = torch.min(q_of(loss.q1, obs, action), q_of(loss.q2, obs, action))
    expected = (0.5 * log_prob - q).mean()
    assert loss_pi.item() == pytest.approx(expected.item(), rel=1e-5)
    torch.testing.assert_close(gap, -(log_prob.detach() - ACT))  # target entropy -|A| = -2
    assert info["entropy"].item() == pytest.approx(-log_prob.mean().item())


def test_tanh_normal_rsample_matches_the_textbook_density():
    torch.manual_seed(3)
    loc, scale = torch.randn(5, ACT), torch.rand(5, ACT) + 0.2
    noise = torch.randn(5, ACT)
    action, log_prob = tanh_normal_rsample(loc, scale, low=LOW, high=HIGH, noise=noise)
    u = loc + scale * noise
    mid, half = (HIGH + LOW) / 2, (HIGH - LOW) / 2
    torch.testing.assert_close(action, mid + half * torch.tanh(u))
    by_hand = (
        -0.5 * ((u - loc) / scale) ** 2
        - torch.log(scale)
        - 0.5 * math.log(2 * math.pi)
        - torch.log(half * (1 - torch.tanh(u) ** 2))
    ).sum(-1)
    torch.testing.assert_close(log_prob, by_hand, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("target_entropy, sign", [(-10.0, 1.0), (10.0, -1.0)])
def test_alpha_loss_gradient_sign(target_entropy, sign):
    """Entropy above the target: d L / d log alpha > 0, so gradient descent lowers alpha."""
    loss = continuous_loss(target_entropy=target_entropy)
    calls = recording(loss)
    _, gap, _ = loss.actor_loss(batch())
    loss_alpha = loss.alpha_loss(gap)
    loss_alpha.backward()
    log_prob = calls[0][2].detach()
    expected = -(math.log(0.5) * (log_prob + target_entropy)).mean()
    assert loss_alpha.item() == pytest.approx(expected.item(), rel=1e-5)
    assert math.copysign(1.0, loss.log_alpha.grad.item()) == sign


def grads(params) -> list[bool]:
    return [p.grad is not None and bool(p.grad.abs().sum() > 0) for p in params]


def test_gradient_routing():
    loss = continuous_loss()
    td = batch()
    critic, actor = loss.critic_parameters(), list(loss.actor.parameters())
    targets = [*loss.q1_target.parameters(), *loss.q2_target.parameters()]

    loss.qvalue_loss(td)[0].backward()
    assert all(grads(critic)) and not any(grads(actor)) and loss.log_alpha.grad is None
    assert all(p.grad is None for p in targets)
    loss.zero_grad(set_to_none=True)

    loss_pi, gap, _ = loss.actor_loss(td)
    loss_pi.backward()
    assert any(grads(actor)) and not any(grads(critic)) and loss.log_alpha.grad is None
    assert all(p.requires_grad for p in critic)  # unfrozen again
    loss.zero_grad(set_to_none=True)

    loss.alpha_loss(gap).backward()
    assert loss.log_alpha.grad is not None and not any(grads(actor) + grads(critic))


def test_forward_returns_all_parts_and_soft_update_is_polyak():
    loss = continuous_loss(tau=0.25)
    out = loss(batch())
    assert {"loss_qvalue", "loss_actor", "loss_alpha", "alpha", "entropy"} <= set(out.keys())
    before = [p.clone() for p in loss.q1_target.parameters()]
    online = [p.clone() for p in loss.q1.parameters()]
    loss.update_target()
    for b, o, t in zip(before, online, loss.q1_target.parameters()):
        torch.testing.assert_close(t, 0.75 * b + 0.25 * o)


def test_fixed_alpha_has_no_alpha_loss():
    loss = continuous_loss(learn_alpha=False)
    assert not isinstance(loss.log_alpha, torch.nn.Parameter)
    assert loss(batch())["loss_alpha"].item() == 0.0


# --------------------------------------------------------------------------- discrete


def discrete_loss(n: int = 3) -> DiscreteSACLoss:
    torch.manual_seed(0)
    obs, act = specs(discrete=True, n=n)
    actor = make_actor(obs, act, hidden=(16,))
    with torch.no_grad():  # a non-uniform policy
        for p in actor.parameters():
            p.add_(0.5 * torch.randn_like(p))
    q1, q2 = (q_critic_discrete(OBS, n, hidden=(16,)) for _ in range(2))
    loss = DiscreteSACLoss(actor, q1, q2, gamma=GAMMA, alpha_init=0.3)
    with torch.no_grad():
        for p in [*q1.parameters(), *q2.parameters()]:
            p.add_(0.1 * torch.randn_like(p))
    return loss


def probs_of(actor, obs):
    logits = actor.module[0](TensorDict({keys.OBSERVATION: obs}, [obs.shape[0]]))[keys.LOGITS]
    return torch.softmax(logits, -1)


def qs_of(net, obs):
    return net(TensorDict({keys.OBSERVATION: obs}, [obs.shape[0]]))[keys.ACTION_VALUE]


def test_discrete_sac_matches_expectations_by_hand():
    loss = discrete_loss()
    td = batch(discrete=True)
    loss_q, _ = loss.qvalue_loss(td)
    loss_pi, gap, info = loss.actor_loss(td)
    alpha, n = 0.3, 3
    with torch.no_grad():
        nobs, obs = td["next", keys.OBSERVATION], td[keys.OBSERVATION]
        p_next = probs_of(loss.actor, nobs)
        qn1, qn2 = qs_of(loss.q1_target.module, nobs), qs_of(loss.q2_target.module, nobs)
        q1_all, q2_all = qs_of(loss.q1, obs), qs_of(loss.q2, obs)
        p_now = probs_of(loss.actor, obs)
        exp_q, exp_pi, exp_h = 0.0, 0.0, []
        for i in range(B):
            v = sum(
                p_next[i, a] * (min(qn1[i, a], qn2[i, a]) - alpha * math.log(p_next[i, a]))
                for a in range(n)
            )
            done = bool(td["next", "terminated"][i])
            y = td["next", "reward"][i, 0] + (0.0 if done else GAMMA * v)
            a_i = int(td[keys.ACTION][i])
            exp_q += 0.5 * ((q1_all[i, a_i] - y) ** 2 + (q2_all[i, a_i] - y) ** 2) / B
            exp_pi += (
                sum(
                    p_now[i, a] * (alpha * math.log(p_now[i, a]) - min(q1_all[i, a], q2_all[i, a]))
                    for a in range(n)
                )
                / B
            )
            exp_h.append(-sum(p_now[i, a] * math.log(p_now[i, a]) for a in range(n)))
    assert loss_q.item() == pytest.approx(float(exp_q), rel=1e-5)
    assert loss_pi.item() == pytest.approx(float(exp_pi), rel=1e-5)
    target_h = 0.98 * math.log(3)
    torch.testing.assert_close(gap, torch.tensor([float(h) - target_h for h in exp_h]))
    assert info["entropy"].item() == pytest.approx(float(sum(exp_h)) / B, rel=1e-5)


def test_discrete_actor_loss_reaches_only_the_actor():
    loss = discrete_loss()
    loss_pi, _, _ = loss.actor_loss(batch(discrete=True))
    loss_pi.backward()
    assert any(grads(loss.actor.parameters())) and not any(grads(loss.critic_parameters()))


# --------------------------------------------------------------------------- errors


def test_continuous_sac_rejects_a_discrete_actor_and_vice_versa():
    obs, act = specs(discrete=True)
    cat_actor = make_actor(obs, act)
    q1, q2 = (q_critic_continuous(OBS, 1) for _ in range(2))
    with pytest.raises(ValueError, match="continuous actions.*Categorical.*DiscreteSACLoss"):
        SACLoss(cat_actor, q1, q2)
    obs, act = specs()
    tanh_actor = make_actor(obs, act, tanh=True)
    dq1, dq2 = (q_critic_discrete(OBS, 3) for _ in range(2))
    with pytest.raises(ValueError, match="discrete actions.*continuous.*SACLoss"):
        DiscreteSACLoss(tanh_actor, dq1, dq2)


def test_continuous_sac_rejects_integer_actions_in_the_batch():
    loss = continuous_loss()
    td = batch()
    td.set(keys.ACTION, torch.zeros(B, ACT, dtype=torch.long))
    with pytest.raises(TypeError, match="continuous.*DiscreteSACLoss"):
        loss.qvalue_loss(td)


def test_bad_networks_and_keys_are_named():
    obs, act = specs()
    actor = make_actor(obs, act, tanh=True)
    q = q_critic_continuous(OBS, ACT)
    with pytest.raises(ValueError, match="twin"):
        SACLoss(actor, q, q)
    with pytest.raises(TypeError, match="q_critic_continuous"):
        SACLoss(actor, q_critic_discrete(OBS, 2), q)
    with pytest.raises(TypeError, match="ProbabilisticActor"):
        SACLoss(torch.nn.Linear(2, 2), q, q_critic_continuous(OBS, ACT))
    td = batch()
    del td["next", "reward"]
    with pytest.raises(MissingKeyError, match="'reward'"):
        continuous_loss().qvalue_loss(td)


# --------------------------------------------------------------------------- parts


def test_parts_are_the_forward_split_and_declare_their_keys():
    loss = continuous_loss()
    td = batch()
    torch.manual_seed(4)
    whole = loss(td)
    torch.manual_seed(4)
    critic, actor = loss.critic_view(), loss.actor_view()
    parts = critic(td.select(*critic.in_keys))
    parts.update(actor(td.select(*actor.in_keys)))
    assert set(parts.keys()) == set(whole.keys())
    for key, value in whole.items():
        torch.testing.assert_close(parts[key], value)
    assert set(critic.in_keys) == {
        keys.OBSERVATION, ("next", keys.OBSERVATION), keys.ACTION, ("next", "reward"),
        ("next", "terminated"),
    }  # fmt: skip
    assert actor.in_keys == [keys.OBSERVATION]
    assert not any(isinstance(m, SACLoss) for m in critic.modules())  # a view, not an owner
    assert sorted(k for k, _ in parts.items() if k.startswith("loss_")) == [
        "loss_actor", "loss_alpha", "loss_qvalue",
    ]  # fmt: skip


def test_discrete_parts_declare_their_keys():
    loss = discrete_loss()
    critic, actor = loss.critic_view(), loss.actor_view()
    td = batch(discrete=True)
    out = critic(td.select(*critic.in_keys))
    assert {"loss_qvalue", "value_mean", "td_error"} <= set(out.keys())
    assert {"loss_actor", "loss_alpha"} <= set(actor(td.select(*actor.in_keys)).keys())


@pytest.mark.parametrize("norm_by", ["max", "sum"])
def test_priority_weights_weight_the_critic_loss(norm_by):
    loss = continuous_loss(priority_weights=norm_by)
    assert PRIORITY_WEIGHT in loss.critic_view().in_keys
    assert PRIORITY_WEIGHT not in loss.actor_view().in_keys
    calls = recording(loss)
    weights = torch.tensor([0.2, 1.0, 0.5, 0.25, 0.75, 0.1])
    td = batch()
    td.set(PRIORITY_WEIGHT, weights)
    loss_q, _ = loss.qvalue_loss(td)
    (next_obs, next_action, next_log_prob) = calls[0]
    with torch.no_grad():
        q_next = torch.min(
            q_of(loss.q1_target.module, next_obs, next_action),
            q_of(loss.q2_target.module, next_obs, next_action),
        )
        not_done = 1.0 - td["next", "terminated"].squeeze(-1).float()
        target = td["next", "reward"].squeeze(-1) + GAMMA * not_done * (
            q_next - 0.5 * next_log_prob
        )
        total = 0.0
        for q in (loss.q1, loss.q2):
            sq = (q_of(q, td[keys.OBSERVATION], td[keys.ACTION]) - target).square()
            total += (
                (weights * sq).mean() if norm_by == "max" else (weights * sq).sum() / weights.sum()
            )
    assert loss_q.item() == pytest.approx(0.5 * float(total), rel=1e-5)
    del td[PRIORITY_WEIGHT]
    with pytest.raises(MissingKeyError, match="priority_weight"):
        loss.qvalue_loss(td)


def test_sac_weights_a_uniform_loss_would_ignore_are_an_error():
    td = batch()
    td.set(PRIORITY_WEIGHT, torch.ones(B))
    with pytest.raises(ValueError, match="priority_weights=None and would ignore"):
        continuous_loss().qvalue_loss(td)
