"""DQNLoss and n-step transitions against hand-computed references."""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict
from torch import nn
from torchrl.modules import ValueOperator

from rlkit import keys
from rlkit.modules import q_critic_discrete
from rlkit.objectives import DQNLoss, MissingKeyError, nstep_transitions
from rlkit.objectives.dqn import BOOTSTRAP_DISCOUNT, PRIORITY_WEIGHT, dqn_td_target

GAMMA = 0.9


def linear_q(weight: list[list[float]]) -> ValueOperator:
    """Q(s) = W s: a Q network whose values we know by hand."""
    layer = nn.Linear(len(weight[0]), len(weight), bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor(weight))
    return ValueOperator(layer, in_keys=[keys.OBSERVATION], out_keys=[keys.ACTION_VALUE])


IDENTITY = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
# a permutation: the online network prefers another action than the target network
PERMUTE = [[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]

OBS = [[1.0, 2.0, 3.0], [0.5, -1.0, 4.0], [2.0, 2.5, -3.0], [0.0, 0.1, 0.2]]
NEXT_OBS = [[3.0, 1.0, 2.0], [-1.0, 5.0, 0.0], [0.3, 0.2, 0.1], [9.0, 8.0, 7.0]]
ACTIONS = [2, 0, 1, 1]
REWARDS = [1.0, -0.5, 2.0, 0.0]
TERMINATED = [False, True, False, False]


def transitions(**extra) -> TensorDict:
    td = TensorDict(
        {
            keys.OBSERVATION: torch.tensor(OBS),
            keys.ACTION: torch.tensor(ACTIONS),
            "next": {
                keys.OBSERVATION: torch.tensor(NEXT_OBS),
                "reward": torch.tensor(REWARDS).unsqueeze(-1),
                "terminated": torch.tensor(TERMINATED).unsqueeze(-1),
            },
        },
        batch_size=[4],
    )
    for key, value in extra.items():
        td.set(key, value)
    return td


def reference_targets(online_w, target_w, *, double: bool, discounts=None) -> list[float]:
    """Textbook DQN / double-DQN targets, one sample at a time."""

    def matvec(w, s):
        return [sum(w[r][c] * s[c] for c in range(len(s))) for r in range(len(w))]

    out = []
    for i, s_next in enumerate(NEXT_OBS):
        q_target = matvec(target_w, s_next)
        if double:
            q_online = matvec(online_w, s_next)
            best = max(range(len(q_online)), key=lambda a: q_online[a])
        else:
            best = max(range(len(q_target)), key=lambda a: q_target[a])
        discount = GAMMA if discounts is None else discounts[i]
        bootstrap = 0.0 if TERMINATED[i] else discount * q_target[best]
        out.append(REWARDS[i] + bootstrap)
    return out


def reference_loss(
    q_values: list[float], targets: list[float], kind: str, weights=None, norm_by="max"
) -> float:
    """Mean loss; with weights: mean of w * loss ("max", Schaul et al.) or sum(w loss) / sum(w)."""
    total, norm = 0.0, 0.0
    for i, (q, y) in enumerate(zip(q_values, targets)):
        e = q - y
        huber = 0.5 * e * e if abs(e) < 1 else abs(e) - 0.5
        value = 0.5 * e * e if kind == "mse" else huber
        w = 1.0 if weights is None else weights[i]
        total += w * value
        norm += w if norm_by == "sum" else 1.0
    return total / norm


def online_q_taken(weight) -> list[float]:
    return [sum(weight[a][c] * s[c] for c in range(3)) for s, a in zip(OBS, ACTIONS, strict=True)]


def make_loss(online_w, **kw) -> DQNLoss:
    """Target network built from the identity, then the online net set to ``online_w``."""
    q = linear_q(IDENTITY)
    loss = DQNLoss(q, gamma=GAMMA, **kw)
    with torch.no_grad():
        q.module.weight.copy_(torch.tensor(online_w))
    return loss


@pytest.mark.parametrize("double", [False, True])
@pytest.mark.parametrize("kind", ["huber", "mse"])
def test_td_target_and_loss_match_hand_computation(double, kind):
    loss = make_loss(PERMUTE, double_dqn=double, loss_type=kind)
    out = loss(transitions())
    targets = reference_targets(PERMUTE, IDENTITY, double=double)
    q_taken = online_q_taken(PERMUTE)
    assert out["target_mean"].item() == pytest.approx(sum(targets) / 4, abs=1e-6)
    assert out["loss_value"].item() == pytest.approx(reference_loss(q_taken, targets, kind))
    errors = [abs(q - y) for q, y in zip(q_taken, targets)]
    torch.testing.assert_close(out["td_error"], torch.tensor(errors))


def test_double_dqn_changes_the_target_when_networks_disagree():
    plain = reference_targets(PERMUTE, IDENTITY, double=False)
    double = reference_targets(PERMUTE, IDENTITY, double=True)
    assert plain != double  # the fixture really exercises the argmax swap
    out_plain = make_loss(PERMUTE)(transitions())["target_mean"]
    out_double = make_loss(PERMUTE, double_dqn=True)(transitions())["target_mean"]
    assert out_plain.item() != pytest.approx(out_double.item())


@pytest.mark.parametrize("norm_by", ["max", "sum"])
def test_priority_weights_weight_the_mean(norm_by):
    weights = [0.5, 1.0, 0.25, 0.125]  # as the sampler writes them: w / max w
    loss = make_loss(PERMUTE, loss_type="mse", priority_weights=norm_by)
    assert PRIORITY_WEIGHT in loss.in_keys  # a declared input: the update loop passes it
    out = loss(transitions(**{PRIORITY_WEIGHT: torch.tensor(weights)}))
    targets = reference_targets(PERMUTE, IDENTITY, double=False)
    expected = reference_loss(online_q_taken(PERMUTE), targets, "mse", weights, norm_by)
    assert out["loss_value"].item() == pytest.approx(expected)
    unweighted = reference_loss(online_q_taken(PERMUTE), targets, "mse")
    assert expected != pytest.approx(unweighted)  # the fixture tells the forms apart
    with pytest.raises(MissingKeyError, match="priority_weight"):
        loss(transitions())


def test_weights_a_uniform_loss_would_ignore_are_an_error():
    loss = make_loss(PERMUTE)
    assert PRIORITY_WEIGHT not in loss.in_keys
    with pytest.raises(ValueError, match="priority_weights=None and would ignore"):
        loss(transitions(**{PRIORITY_WEIGHT: torch.ones(4)}))
    with pytest.raises(ValueError, match="priority_weights must be None"):
        make_loss(PERMUTE, priority_weights="mean")


def test_one_hot_actions_equal_indices():
    loss = make_loss(PERMUTE)
    one_hot = nn.functional.one_hot(torch.tensor(ACTIONS), 3)
    by_index = loss(transitions())["loss_value"]
    by_one_hot = loss(transitions(action=one_hot))["loss_value"]
    torch.testing.assert_close(by_index, by_one_hot)


def test_td_target_function_uses_per_sample_discount():
    reward = torch.tensor([1.0, 2.0])
    next_q = torch.tensor([[1.0, 3.0], [5.0, 4.0]])
    terminated = torch.tensor([False, False])
    y = dqn_td_target(reward, next_q, terminated, discount=torch.tensor([0.5, 0.25]))
    torch.testing.assert_close(y, torch.tensor([1.0 + 0.5 * 3.0, 2.0 + 0.25 * 5.0]))


def test_gradients_reach_only_the_online_network():
    loss = make_loss(PERMUTE)
    loss(transitions())["loss_value"].backward()
    assert loss.q_network.module.weight.grad is not None
    assert all(p.grad is None for p in loss.target_network.parameters())
    assert all(not p.requires_grad for p in loss.target_network.parameters())


def test_update_target_hard_every_period():
    q = linear_q(IDENTITY)
    loss = DQNLoss(q, target_period=3)
    updates = []
    for step in range(1, 8):
        with torch.no_grad():
            q.module.weight.add_(1.0)  # an "optimiser step"
        updated = loss.update_target()
        updates.append(updated)
        target_w = loss.target_network.module.module.weight
        if step % 3 == 0:
            torch.testing.assert_close(target_w, q.module.weight)
        else:
            assert not torch.equal(target_w, q.module.weight)
    assert updates == [False, False, True, False, False, True, False]


# --------------------------------------------------------------------------- n-step


def nstep_reference(rewards, dones, terminated, n, gamma):
    """Textbook n-step returns of one env's trajectory inside a batch of T steps."""
    T = len(rewards)
    out = []
    for t in range(T):
        total, last = 0.0, t
        for k in range(n):
            if t + k >= T:
                break
            total += gamma**k * rewards[t + k]
            last = t + k
            if dones[t + k]:
                break
        out.append((total, last, gamma ** (last - t + 1), terminated[last]))
    return out


def collector_like_batch():
    # env 0: terminal at t=2, truncation at t=5; env 1: no done
    rewards = [[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0], [0.5, -1.0, 0.25, 2.0, 1.0, -3.0, 0.0]]
    terminated = [[0, 0, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0]]
    truncated = [[0, 0, 0, 0, 0, 1, 0], [0, 0, 0, 0, 0, 0, 0]]
    done = [[a or b for a, b in zip(x, y)] for x, y in zip(terminated, truncated)]
    n_env, steps = 2, 7
    obs = torch.arange(n_env * steps, dtype=torch.float32).reshape(n_env, steps, 1)
    batch = TensorDict(
        {
            keys.OBSERVATION: obs,
            keys.ACTION: torch.zeros(n_env, steps, dtype=torch.long),
            "next": {
                keys.OBSERVATION: obs + 100.0,
                "reward": torch.tensor(rewards).unsqueeze(-1),
                "terminated": torch.tensor(terminated, dtype=torch.bool).unsqueeze(-1),
                "truncated": torch.tensor(truncated, dtype=torch.bool).unsqueeze(-1),
                "done": torch.tensor(done, dtype=torch.bool).unsqueeze(-1),
            },
        },
        batch_size=[n_env, steps],
    )
    return batch, rewards, done, terminated


@pytest.mark.parametrize("n", [1, 3, 10])
def test_nstep_transitions_match_textbook_loop(n):
    batch, rewards, done, terminated = collector_like_batch()
    out = nstep_transitions(batch, n=n, gamma=GAMMA)
    assert out.batch_size == torch.Size([14])
    for env in range(2):
        ref = nstep_reference(rewards[env], done[env], terminated[env], n, GAMMA)
        for t, (ret, last, discount, term) in enumerate(ref):
            row = out[env * 7 + t]
            assert row["next", "reward"].item() == pytest.approx(ret, abs=1e-5)
            assert row[BOOTSTRAP_DISCOUNT].item() == pytest.approx(discount, abs=1e-6)
            assert row["next", keys.OBSERVATION].item() == 100.0 + env * 7 + last
            assert bool(row["next", "terminated"]) == bool(term)
            assert row[keys.OBSERVATION].item() == env * 7 + t


def test_nstep_loss_uses_the_per_sample_discount():
    discounts = [GAMMA**3, GAMMA**2, GAMMA, GAMMA**3]
    loss = make_loss(PERMUTE, n_steps=3)
    td = transitions(**{BOOTSTRAP_DISCOUNT: torch.tensor(discounts).unsqueeze(-1)})
    out = loss(td)
    targets = reference_targets(PERMUTE, IDENTITY, double=False, discounts=discounts)
    assert out["target_mean"].item() == pytest.approx(sum(targets) / 4, abs=1e-6)


# --------------------------------------------------------------------------- errors


def test_continuous_actions_are_rejected_with_a_pointer_to_sac():
    loss = make_loss(PERMUTE)
    td = transitions(action=torch.zeros(4, 1))
    with pytest.raises(TypeError, match="discrete actions.*SACLoss"):
        loss(td)


def test_missing_keys_are_named():
    loss = make_loss(PERMUTE)
    td = transitions()
    del td["next", "terminated"]
    with pytest.raises(MissingKeyError, match="'terminated'"):
        loss(td)
    with pytest.raises(MissingKeyError, match="nstep_transitions"):
        make_loss(PERMUTE, n_steps=2)(transitions())


def test_bad_arguments():
    q = q_critic_discrete(3, 2)
    with pytest.raises(ValueError, match="loss_type"):
        DQNLoss(q, loss_type="l1")
    with pytest.raises(ValueError, match="gamma"):
        DQNLoss(q, gamma=1.5)
    with pytest.raises(ValueError, match="n_steps"):
        DQNLoss(q, n_steps=0)
    v = ValueOperator(nn.Linear(3, 1), in_keys=[keys.OBSERVATION], out_keys=[keys.STATE_VALUE])
    with pytest.raises(TypeError, match="q_critic_discrete"):
        DQNLoss(v)
    with pytest.raises(ValueError, match="n must be"):
        nstep_transitions(collector_like_batch()[0], n=0, gamma=0.9)


def test_real_q_network_runs_and_is_finite():
    q = q_critic_discrete(3, 3)
    out = DQNLoss(q, double_dqn=True)(transitions())
    assert math.isfinite(out["loss_value"].item())
