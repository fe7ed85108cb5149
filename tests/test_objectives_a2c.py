"""A2CLoss against references written here: hand log-probs and analytic gradients.

For a linear softmax policy ``logits = W x + b`` the REINFORCE-with-baseline gradient is
known in closed form, ``d/dW [-(1/N) sum_i A_i log pi(a_i|x_i)] = -(1/N) sum_i A_i
(onehot(a_i) - p_i) x_i^T``, and for a linear critic ``d/dw [c (1/N) sum_i 1/2 (V_i -
t_i)^2] = c (1/N) sum_i (V_i - t_i) x_i``; the tests compare autograd through the loss with
these formulas.
"""

from __future__ import annotations

import math
import re
import statistics

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torch import nn
from torchrl.modules import IndependentNormal, ProbabilisticActor, TanhNormal

from rlkit import keys
from rlkit.objectives import A2CLoss, MissingKeyError, total_loss

OBS, N_ACTIONS, ACT_DIM = 3, 4, 2
BATCH = (4, 8)


def categorical_actor() -> tuple[ProbabilisticActor, nn.Linear]:
    net = nn.Linear(OBS, N_ACTIONS)
    params = TensorDictModule(net, in_keys=[keys.OBSERVATION], out_keys=[keys.LOGITS])
    actor = ProbabilisticActor(
        params, in_keys=[keys.LOGITS], distribution_class=torch.distributions.Categorical
    )
    return actor, net


def gaussian_actor(distribution_class) -> tuple[ProbabilisticActor, TensorDictModule]:
    net = nn.Sequential(nn.Linear(OBS, 2 * ACT_DIM), NormalParamExtractor())
    params = TensorDictModule(net, in_keys=[keys.OBSERVATION], out_keys=[keys.LOC, keys.SCALE])
    actor = ProbabilisticActor(
        params, in_keys=[keys.LOC, keys.SCALE], distribution_class=distribution_class
    )
    return actor, params


def make_critic() -> tuple[TensorDictModule, nn.Linear]:
    net = nn.Linear(OBS, 1)
    return TensorDictModule(net, in_keys=[keys.OBSERVATION], out_keys=[keys.STATE_VALUE]), net


def collect(actor, *, seed: int = 0) -> TensorDict:
    gen = torch.Generator().manual_seed(seed)
    td = TensorDict({keys.OBSERVATION: torch.randn(*BATCH, OBS, generator=gen)}, batch_size=BATCH)
    torch.manual_seed(seed)
    with torch.no_grad():
        td = actor(td)
    td[keys.ADVANTAGE] = torch.randn(*BATCH, 1, generator=gen) * 2.0 + 0.5
    td[keys.VALUE_TARGET] = torch.randn(*BATCH, 1, generator=gen)
    return td.select(keys.OBSERVATION, keys.ACTION, keys.ADVANTAGE, keys.VALUE_TARGET)


def hand_log_prob(net: nn.Linear, td: TensorDict) -> list[float]:
    """log softmax(W x + b)[a], one sample at a time."""
    weight, bias = net.weight.tolist(), net.bias.tolist()
    out = []
    for x, a in zip(
        td[keys.OBSERVATION].reshape(-1, OBS).tolist(), td[keys.ACTION].flatten(), strict=True
    ):
        logits = [
            sum(w * xi for w, xi in zip(row, x, strict=True)) + b
            for row, b in zip(weight, bias, strict=True)
        ]
        log_norm = math.log(sum(math.exp(z) for z in logits))
        out.append(logits[int(a)] - log_norm)
    return out


def test_policy_loss_equals_minus_mean_log_prob_times_advantage():
    torch.manual_seed(0)
    actor, net = categorical_actor()
    critic, _ = make_critic()
    td = collect(actor)
    out = A2CLoss(actor, critic)(td)
    adv = td[keys.ADVANTAGE].flatten().tolist()
    expected = -statistics.fmean(lp * a for lp, a in zip(hand_log_prob(net, td), adv, strict=True))
    assert out["loss_policy"].item() == pytest.approx(expected, rel=1e-5)


def test_gradients_equal_analytic_reinforce_with_baseline_and_regression():
    torch.manual_seed(1)
    actor, net = categorical_actor()
    critic, vnet = make_critic()
    td = collect(actor)
    out = A2CLoss(actor, critic, value_coef=0.8)(td)
    grad_w, grad_b = torch.autograd.grad(out["loss_policy"], [net.weight, net.bias])
    vgrad_w, vgrad_b = torch.autograd.grad(out["loss_value"], [vnet.weight, vnet.bias])

    x = td[keys.OBSERVATION].reshape(-1, OBS).double()
    a = td[keys.ACTION].flatten()
    adv = td[keys.ADVANTAGE].flatten().double()
    n = x.shape[0]
    expected_w = torch.zeros(N_ACTIONS, OBS, dtype=torch.float64)
    expected_b = torch.zeros(N_ACTIONS, dtype=torch.float64)
    for i in range(n):
        p = torch.softmax(net.weight.detach().double() @ x[i] + net.bias.detach().double(), 0)
        score = -p
        score[a[i]] += 1.0  # d log pi / d logits = onehot(a) - p
        expected_w -= adv[i] * torch.outer(score, x[i]) / n
        expected_b -= adv[i] * score / n
    torch.testing.assert_close(grad_w.double(), expected_w, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad_b.double(), expected_b, rtol=1e-5, atol=1e-6)

    v = vnet(td[keys.OBSERVATION]).detach().reshape(-1).double()
    err = v - td[keys.VALUE_TARGET].flatten().double()
    torch.testing.assert_close(vgrad_w.double().flatten(), 0.8 * (err[:, None] * x).mean(0))
    torch.testing.assert_close(vgrad_b.double(), 0.8 * err.mean().reshape(1))


def test_value_loss_and_value_coef():
    torch.manual_seed(2)
    actor, _ = categorical_actor()
    critic, vnet = make_critic()
    td = collect(actor)
    v = vnet(td[keys.OBSERVATION]).flatten().tolist()
    t = td[keys.VALUE_TARGET].flatten().tolist()
    half_mse = statistics.fmean(0.5 * (a - b) ** 2 for a, b in zip(v, t, strict=True))
    assert A2CLoss(actor, critic)(td)["loss_value"].item() == pytest.approx(0.5 * half_mse)
    assert A2CLoss(actor, critic, value_coef=2.0)(td)["loss_value"].item() == pytest.approx(
        2.0 * half_mse
    )


def test_normalize_advantage_flag_standardises_per_batch():
    torch.manual_seed(3)
    actor, net = categorical_actor()
    critic, _ = make_critic()
    td = collect(actor)
    raw = A2CLoss(actor, critic)(td)["loss_policy"]
    normed = A2CLoss(actor, critic, normalize_advantage=True)(td)["loss_policy"]
    adv = td[keys.ADVANTAGE].flatten().tolist()
    mean, std = statistics.fmean(adv), statistics.stdev(adv)
    expected = -statistics.fmean(
        lp * (a - mean) / (std + 1e-8) for lp, a in zip(hand_log_prob(net, td), adv, strict=True)
    )
    assert normed.item() == pytest.approx(expected, rel=1e-5)
    assert not torch.isclose(raw, normed)


def test_entropy_coef_adds_the_weighted_entropy_bonus():
    torch.manual_seed(4)
    actor, net = categorical_actor()
    critic, _ = make_critic()
    td = collect(actor)
    p = torch.softmax(net(td[keys.OBSERVATION]), -1).detach()
    entropy = -(p * p.log()).sum(-1).mean().item()
    plain = A2CLoss(actor, critic)(td)
    bonus = A2CLoss(actor, critic, entropy_coef=0.1)(td)
    assert plain["loss_entropy"].item() == 0.0
    assert plain["entropy"].item() == pytest.approx(entropy, rel=1e-5)
    assert bonus["loss_entropy"].item() == pytest.approx(-0.1 * entropy, rel=1e-5)
    assert total_loss(bonus).item() == pytest.approx(total_loss(plain).item() - 0.1 * entropy)


def test_huber_value_loss_changes_the_output():
    torch.manual_seed(5)
    actor, _ = categorical_actor()
    critic, vnet = make_critic()
    td = collect(actor)
    td[keys.VALUE_TARGET] = td[keys.VALUE_TARGET] * 4.0
    errors = (vnet(td[keys.OBSERVATION]) - td[keys.VALUE_TARGET]).flatten().tolist()
    expected = statistics.fmean(0.5 * e * e if abs(e) < 1 else abs(e) - 0.5 for e in errors)
    huber = A2CLoss(actor, critic, value_loss="huber", value_coef=1.0)(td)["loss_value"]
    assert huber.item() == pytest.approx(expected, rel=1e-5)
    mse = A2CLoss(actor, critic, value_coef=1.0)(td)["loss_value"]
    assert huber.item() != pytest.approx(mse.item())


def test_gradient_routing_and_detached_diagnostics():
    torch.manual_seed(6)
    actor, _ = categorical_actor()
    critic, _ = make_critic()
    out = A2CLoss(actor, critic, entropy_coef=0.01)(collect(actor))
    actor_params, critic_params = list(actor.parameters()), list(critic.parameters())
    for name, own, other in [
        ("loss_policy", actor_params, critic_params),
        ("loss_entropy", actor_params, critic_params),
        ("loss_value", critic_params, actor_params),
    ]:
        grads = torch.autograd.grad(out[name], own + other, allow_unused=True, retain_graph=True)
        assert all(g is not None for g in grads[: len(own)]), name
        assert all(g is None for g in grads[len(own) :]), name
    assert set(out.keys()) == {
        "loss_policy",
        "loss_value",
        "loss_entropy",
        "entropy",
        "explained_variance",
        "value_mean",
        "advantage_mean",
        "advantage_std",
    }
    diagnostics = [k for k in out.keys() if not k.startswith("loss_")]  # noqa: SIM118
    assert not any(out[k].requires_grad for k in diagnostics)


@pytest.mark.parametrize("distribution_class", [IndependentNormal, TanhNormal])
def test_gaussian_actors_on_bt_batches(distribution_class):
    torch.manual_seed(7)
    actor, params = gaussian_actor(distribution_class)
    critic, _ = make_critic()
    td = collect(actor)
    out = A2CLoss(actor, critic, entropy_coef=0.01)(td)
    head = params(td.select(keys.OBSERVATION))
    loc, scale = head[keys.LOC].detach().double(), head[keys.SCALE].detach().double()
    action = td[keys.ACTION].double()
    if distribution_class is TanhNormal:
        correction = torch.log1p(-action.square()).sum(-1)
        action = torch.atanh(action)
    else:
        correction = 0.0
    per_dim = -((action - loc) ** 2) / (2 * scale**2) - scale.log() - 0.5 * math.log(2 * math.pi)
    log_prob = per_dim.sum(-1) - correction
    expected = -(log_prob * td[keys.ADVANTAGE].squeeze(-1).double()).mean()
    assert out["loss_policy"].item() == pytest.approx(expected.item(), rel=1e-4)
    total_loss(out).backward()
    assert all(torch.isfinite(p.grad).all() for p in actor.parameters())


def test_behaviour_log_prob_is_not_needed():
    actor, _ = categorical_actor()
    critic, _ = make_critic()
    td = collect(actor)
    assert keys.ACTION_LOG_PROB not in td
    assert keys.ACTION_LOG_PROB not in A2CLoss(actor, critic).in_keys
    assert torch.isfinite(A2CLoss(actor, critic)(td)["loss_policy"])


@pytest.mark.parametrize("key", [keys.ADVANTAGE, keys.VALUE_TARGET])
def test_missing_estimator_output_names_the_key_and_the_estimator(key):
    actor, _ = categorical_actor()
    critic, _ = make_critic()
    with pytest.raises(MissingKeyError) as info:
        A2CLoss(actor, critic)(collect(actor).exclude(key))
    message = str(info.value)
    assert "A2CLoss is missing required key(s)" in message
    assert repr(key) in message and "rlkit.value.GAE" in message


def test_wrong_advantage_shape_is_refused():
    actor, _ = categorical_actor()
    critic, _ = make_critic()
    td = collect(actor)
    td[keys.ADVANTAGE] = td[keys.ADVANTAGE].squeeze(-1)
    with pytest.raises(
        ValueError, match=re.escape("'advantage' has shape [4, 8], expected [4, 8, 1]")
    ):
        A2CLoss(actor, critic)(td)


@pytest.mark.parametrize(
    ("kwargs", "error", "fragment"),
    [
        ({"entropy_coef": -1.0}, ValueError, "A2CLoss: entropy_coef must be finite and >= 0"),
        ({"value_coef": -0.5}, ValueError, "A2CLoss: value_coef must be finite and >= 0"),
        ({"value_coef": True}, TypeError, "value_coef must be a number"),
        ({"normalize_advantage": 1}, ValueError, "normalize_advantage must be True"),
        ({"value_loss": "smooth_l1"}, ValueError, "value_loss must be one of"),
        ({"entropy_samples": 1.5}, TypeError, "entropy_samples must be an int"),
    ],
)
def test_invalid_hyperparameters(kwargs, error, fragment):
    actor, _ = categorical_actor()
    critic, _ = make_critic()
    with pytest.raises(error, match=re.escape(fragment)):
        A2CLoss(actor, critic, **kwargs)
