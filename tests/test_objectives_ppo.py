"""PPOLoss and the shared objective helpers, against references written here.

References are textbook loops over samples with Python floats, log-probabilities and
entropies computed by hand from the networks' raw outputs, and analytic identities.
"""

from __future__ import annotations

import doctest
import math
import re
import statistics
import warnings
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torch import nn
from torchrl.modules import IndependentNormal, ProbabilisticActor, TanhNormal

from rlkit import keys
from rlkit.objectives import MissingKeyError, PPOLoss, functional, standardize, total_loss
from rlkit.objectives import a2c as a2c_module
from rlkit.objectives import common as common_module
from rlkit.objectives import functional as functional_module
from rlkit.objectives import ppo as ppo_module
from rlkit.objectives.common import distribution_entropy

OBS, N_ACTIONS, ACT_DIM = 3, 4, 2
BATCH = (4, 8)
DOCS = Path(__file__).resolve().parents[1] / "docs" / "objectives.md"


# ---------------------------------------------------------------------------------------
# Tiny networks built directly with torchrl, and batches
# ---------------------------------------------------------------------------------------
def categorical_actor() -> tuple[ProbabilisticActor, nn.Linear]:
    net = nn.Linear(OBS, N_ACTIONS)
    params = TensorDictModule(net, in_keys=[keys.OBSERVATION], out_keys=[keys.LOGITS])
    actor = ProbabilisticActor(
        params,
        in_keys=[keys.LOGITS],
        distribution_class=torch.distributions.Categorical,
        return_log_prob=True,
        log_prob_key=keys.ACTION_LOG_PROB,
    )
    return actor, net


def gaussian_actor(distribution_class) -> tuple[ProbabilisticActor, TensorDictModule]:
    net = nn.Sequential(nn.Linear(OBS, 2 * ACT_DIM), NormalParamExtractor())
    params = TensorDictModule(net, in_keys=[keys.OBSERVATION], out_keys=[keys.LOC, keys.SCALE])
    actor = ProbabilisticActor(
        params,
        in_keys=[keys.LOC, keys.SCALE],
        distribution_class=distribution_class,
        return_log_prob=True,
        log_prob_key=keys.ACTION_LOG_PROB,
    )
    return actor, params


def make_critic() -> tuple[TensorDictModule, nn.Linear]:
    net = nn.Linear(OBS, 1)
    return TensorDictModule(net, in_keys=[keys.OBSERVATION], out_keys=[keys.STATE_VALUE]), net


def collect(actor, *, seed: int = 0, batch=BATCH) -> TensorDict:
    """A batch as a collector plus value estimator would leave it."""
    gen = torch.Generator().manual_seed(seed)
    td = TensorDict({keys.OBSERVATION: torch.randn(*batch, OBS, generator=gen)}, batch_size=batch)
    torch.manual_seed(seed)
    with torch.no_grad():
        td = actor(td)
    td[keys.ADVANTAGE] = torch.randn(*batch, 1, generator=gen) * 2.0 + 0.5
    td[keys.VALUE_TARGET] = torch.randn(*batch, 1, generator=gen)
    td[keys.STATE_VALUE] = torch.randn(*batch, 1, generator=gen)
    return td.select(
        keys.OBSERVATION,
        keys.ACTION,
        keys.ACTION_LOG_PROB,
        keys.ADVANTAGE,
        keys.VALUE_TARGET,
        keys.STATE_VALUE,
    )


def categorical_log_prob(net: nn.Linear, td: TensorDict) -> torch.Tensor:
    logits = net(td[keys.OBSERVATION])
    return torch.log_softmax(logits, -1).gather(-1, td[keys.ACTION].unsqueeze(-1)).squeeze(-1)


def normal_log_prob(loc, scale, action) -> torch.Tensor:
    var = scale**2
    per_dim = -((action - loc) ** 2) / (2 * var) - scale.log() - 0.5 * math.log(2 * math.pi)
    return per_dim.sum(-1)


def textbook_ppo_policy_loss(log_prob, old_log_prob, advantage, eps) -> tuple[float, float]:
    """-mean(min(r A, clip(r, 1-eps, 1+eps) A)) and the clipped share, one sample at a time."""
    total, clipped, n = 0.0, 0, 0
    for lp, old, adv in zip(
        log_prob.tolist(), old_log_prob.tolist(), advantage.tolist(), strict=True
    ):
        r = math.exp(lp - old)
        total += min(r * adv, min(max(r, 1 - eps), 1 + eps) * adv)
        clipped += abs(r - 1) > eps
        n += 1
    return -total / n, clipped / n


def off_policy(td: TensorDict, *, scale: float = 0.4, seed: int = 1) -> TensorDict:
    """Shift the stored behaviour log-probs so ratios spread around 1 (some clipped)."""
    gen = torch.Generator().manual_seed(seed)
    td = td.clone()
    td[keys.ACTION_LOG_PROB] = td[keys.ACTION_LOG_PROB] + scale * torch.randn(
        td.batch_size, generator=gen
    )
    return td


# ---------------------------------------------------------------------------------------
# Policy term
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("eps", [0.1, 0.2])
def test_policy_loss_and_clip_fraction_match_textbook(eps):
    torch.manual_seed(0)
    actor, net = categorical_actor()
    critic, _ = make_critic()
    td = off_policy(collect(actor))
    loss = PPOLoss(actor, critic, clip_epsilon=eps, normalize_advantage=False)
    out = loss(td)

    log_prob = categorical_log_prob(net, td).detach().flatten()
    old = td[keys.ACTION_LOG_PROB].flatten()
    expected, clip_fraction = textbook_ppo_policy_loss(
        log_prob, old, td[keys.ADVANTAGE].flatten(), eps
    )
    assert 0.1 < clip_fraction < 0.9  # the batch exercises both branches
    assert out["loss_policy"].item() == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert out["clip_fraction"].item() == pytest.approx(clip_fraction)
    ratios = [math.exp(a - b) for a, b in zip(log_prob.tolist(), old.tolist(), strict=True)]
    k3 = statistics.fmean(r - 1 - math.log(r) for r in ratios)
    assert out["approx_kl"].item() == pytest.approx(k3, rel=1e-4)
    assert out["ratio_mean"].item() == pytest.approx(statistics.fmean(ratios), rel=1e-5)


def test_on_policy_gradient_equals_vanilla_policy_gradient():
    torch.manual_seed(1)
    actor, net = categorical_actor()
    critic, _ = make_critic()
    td = collect(actor)
    out = PPOLoss(actor, critic, normalize_advantage=False)(td)
    assert out["approx_kl"].item() == 0.0
    assert out["clip_fraction"].item() == 0.0
    assert out["ratio_mean"].item() == pytest.approx(1.0)

    grads = torch.autograd.grad(out["loss_policy"], list(net.parameters()))
    advantage = td[keys.ADVANTAGE].squeeze(-1)
    vanilla = -(advantage * categorical_log_prob(net, td)).mean()
    expected = torch.autograd.grad(vanilla, list(net.parameters()))
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want)


def test_advantage_normalisation_uses_minibatch_statistics():
    torch.manual_seed(2)
    actor, net = categorical_actor()
    critic, _ = make_critic()
    td = off_policy(collect(actor))
    raw = PPOLoss(actor, critic, normalize_advantage=False)(td)["loss_policy"]
    normed = PPOLoss(actor, critic, normalize_advantage=True)(td)["loss_policy"]
    assert not torch.isclose(raw, normed)

    adv = td[keys.ADVANTAGE].flatten().tolist()
    mean, std = statistics.fmean(adv), statistics.stdev(adv)
    hand = torch.tensor([(a - mean) / (std + 1e-8) for a in adv])
    log_prob = categorical_log_prob(net, td).detach().flatten()
    expected, _ = textbook_ppo_policy_loss(log_prob, td[keys.ACTION_LOG_PROB].flatten(), hand, 0.2)
    assert normed.item() == pytest.approx(expected, rel=1e-5)


def test_standardize_matches_hand_statistics_and_skips_single_elements():
    x = torch.tensor([[1.0], [4.0], [-2.0], [7.5]])
    values = x.flatten().tolist()
    mean, std = statistics.fmean(values), statistics.stdev(values)
    expected = torch.tensor([[(v - mean) / (std + 1e-8)] for v in values])
    torch.testing.assert_close(standardize(x), expected)
    one = torch.tensor([3.0])
    assert standardize(one) is one


# ---------------------------------------------------------------------------------------
# Value term
# ---------------------------------------------------------------------------------------
def test_unclipped_value_loss_matches_hand_formula():
    torch.manual_seed(3)
    actor, _ = categorical_actor()
    critic, vnet = make_critic()
    td = collect(actor)
    out = PPOLoss(actor, critic, value_coef=0.7)(td)
    v = vnet(td[keys.OBSERVATION]).flatten().tolist()
    t = td[keys.VALUE_TARGET].flatten().tolist()
    expected = 0.7 * statistics.fmean(0.5 * (a - b) ** 2 for a, b in zip(v, t, strict=True))
    assert out["loss_value"].item() == pytest.approx(expected, rel=1e-5)
    assert out["value_mean"].item() == pytest.approx(statistics.fmean(v), rel=1e-5, abs=1e-6)
    residual = [b - a for a, b in zip(v, t, strict=True)]
    ev = 1 - statistics.pvariance(residual) / statistics.pvariance(t)
    assert out["explained_variance"].item() == pytest.approx(ev, rel=1e-4)


def hand_clipped_value_loss(v, v_old, t, eps) -> float:
    terms = []
    for a, old, b in zip(v, v_old, t, strict=True):
        clipped = old + min(max(a - old, -eps), eps)
        terms.append(0.5 * max((a - b) ** 2, (clipped - b) ** 2))
    return statistics.fmean(terms)


def test_clipped_value_loss_uses_stored_collection_time_value():
    torch.manual_seed(4)
    actor, _ = categorical_actor()
    critic, vnet = make_critic()
    td = collect(actor)
    v = vnet(td[keys.OBSERVATION]).detach()
    td[keys.STATE_VALUE] = v + 0.3 * torch.randn_like(v)  # some updates exceed eps
    loss = PPOLoss(actor, critic, value_clip_epsilon=0.1, value_coef=1.0)
    stored = td[keys.STATE_VALUE].clone()

    out = loss(td)
    flat = {k: td[k].flatten().tolist() for k in (keys.STATE_VALUE, keys.VALUE_TARGET)}
    expected = hand_clipped_value_loss(
        v.flatten().tolist(), flat[keys.STATE_VALUE], flat[keys.VALUE_TARGET], 0.1
    )
    assert out["loss_value"].item() == pytest.approx(expected, rel=1e-5)
    torch.testing.assert_close(td[keys.STATE_VALUE], stored, rtol=0, atol=0)  # not overwritten

    unclipped = PPOLoss(actor, critic, value_coef=1.0)(td)["loss_value"]
    assert not torch.isclose(out["loss_value"], unclipped)

    td[keys.STATE_VALUE] = stored - 1.0  # a different collection-time value
    moved = loss(td)["loss_value"]
    expected_moved = hand_clipped_value_loss(
        v.flatten().tolist(), (stored - 1.0).flatten().tolist(), flat[keys.VALUE_TARGET], 0.1
    )
    assert moved.item() == pytest.approx(expected_moved, rel=1e-5)
    assert not torch.isclose(moved, out["loss_value"])


def test_loss_does_not_write_into_its_input():
    torch.manual_seed(5)
    actor, _ = categorical_actor()
    critic, _ = make_critic()
    td = collect(actor)
    before = td.clone()
    PPOLoss(actor, critic, value_clip_epsilon=0.2, entropy_coef=0.01)(td)
    assert set(td.keys(True, True)) == set(before.keys(True, True))
    assert (td == before).all()


def test_huber_value_loss_matches_hand_formula_and_differs_from_mse():
    torch.manual_seed(6)
    actor, _ = categorical_actor()
    critic, vnet = make_critic()
    td = collect(actor)
    td[keys.VALUE_TARGET] = td[keys.VALUE_TARGET] * 3.0  # errors on both sides of 1
    out = PPOLoss(actor, critic, value_loss="huber", value_coef=1.0)(td)
    errors = (vnet(td[keys.OBSERVATION]) - td[keys.VALUE_TARGET]).flatten().tolist()
    assert any(abs(e) < 1 for e in errors) and any(abs(e) > 1 for e in errors)
    expected = statistics.fmean(0.5 * e * e if abs(e) < 1 else abs(e) - 0.5 for e in errors)
    assert out["loss_value"].item() == pytest.approx(expected, rel=1e-5)
    mse = PPOLoss(actor, critic, value_coef=1.0)(td)["loss_value"]
    assert not torch.isclose(mse, out["loss_value"])


# ---------------------------------------------------------------------------------------
# Entropy term
# ---------------------------------------------------------------------------------------
def test_entropy_term_and_coefficient():
    torch.manual_seed(7)
    actor, net = categorical_actor()
    critic, _ = make_critic()
    td = collect(actor)
    zero = PPOLoss(actor, critic)(td)
    with_bonus = PPOLoss(actor, critic, entropy_coef=0.05)(td)

    p = torch.softmax(net(td[keys.OBSERVATION]), -1).detach()
    hand_entropy = -(p * p.log()).sum(-1).mean().item()
    assert zero["entropy"].item() == pytest.approx(hand_entropy, rel=1e-5)
    assert zero["loss_entropy"].item() == 0.0 and not zero["loss_entropy"].requires_grad
    assert with_bonus["loss_entropy"].item() == pytest.approx(-0.05 * hand_entropy, rel=1e-5)
    assert total_loss(with_bonus).item() != pytest.approx(total_loss(zero).item())


def tanh_normal_entropy_by_quadrature(loc: float, scale: float) -> float:
    """H[tanh(X)] = H[X] + E[log(1 - tanh(X)^2)], X ~ N(loc, scale^2), by the trapezoid rule."""
    x = torch.linspace(loc - 10 * scale, loc + 10 * scale, 200_001, dtype=torch.float64)
    density = torch.exp(-0.5 * ((x - loc) / scale) ** 2) / (scale * math.sqrt(2 * math.pi))
    log_jacobian = math.log(4.0) - 2 * torch.logaddexp(x, -x)  # log(1 - tanh(x)^2), stable
    expectation = torch.trapezoid(density * log_jacobian, x).item()
    return 0.5 * math.log(2 * math.pi * math.e * scale**2) + expectation


def test_monte_carlo_entropy_for_tanh_normal_matches_quadrature():
    torch.manual_seed(8)
    loc = torch.tensor([[0.3, -1.2]])
    scale = torch.tensor([[0.5, 1.5]])
    dist = TanhNormal(loc, scale)
    with pytest.raises(NotImplementedError):
        dist.entropy()
    estimate = distribution_entropy(dist, num_samples=40_000)
    expected = sum(
        tanh_normal_entropy_by_quadrature(a, b)
        for a, b in zip(loc[0].tolist(), scale[0].tolist(), strict=True)
    )
    assert estimate.shape == (1,)
    assert estimate.item() == pytest.approx(expected, abs=0.02)


class _NoClosedFormCategorical(torch.distributions.Categorical):
    """A distribution with neither entropy() nor rsample: exercises the score-function path."""

    def entropy(self):
        raise NotImplementedError


def test_score_function_entropy_estimate_has_the_right_value_and_gradient():
    torch.manual_seed(9)
    logits = torch.tensor([0.5, -1.0, 2.0], requires_grad=True)
    estimate = distribution_entropy(_NoClosedFormCategorical(logits=logits), num_samples=200_000)
    p = torch.softmax(logits, -1)
    exact = -(p * p.log()).sum()
    (grad_estimate,) = torch.autograd.grad(estimate, logits)
    # d H / d logit_k = -p_k (log p_k + H), the analytic gradient of the softmax entropy
    analytic = -p.detach() * (p.detach().log() + exact.detach())
    assert estimate.item() == pytest.approx(exact.item(), abs=0.01)
    torch.testing.assert_close(grad_estimate, analytic, atol=0.01, rtol=0)


# ---------------------------------------------------------------------------------------
# Gradient routing
# ---------------------------------------------------------------------------------------
def test_gradients_reach_only_their_own_network():
    torch.manual_seed(10)
    actor, _ = categorical_actor()
    critic, _ = make_critic()
    td = off_policy(collect(actor))
    out = PPOLoss(actor, critic, entropy_coef=0.01, value_clip_epsilon=0.2)(td)
    actor_params, critic_params = list(actor.parameters()), list(critic.parameters())
    for name, owner, other in [
        ("loss_policy", actor_params, critic_params),
        ("loss_entropy", actor_params, critic_params),
        ("loss_value", critic_params, actor_params),
    ]:
        grads = torch.autograd.grad(out[name], owner + other, allow_unused=True, retain_graph=True)
        own, foreign = grads[: len(owner)], grads[len(owner) :]
        assert all(g is not None and g.abs().sum() > 0 for g in own), name
        assert all(g is None for g in foreign), name
    for key in out.keys():  # noqa: SIM118 (iterating a TensorDict walks its batch dim)
        if not key.startswith("loss_"):
            assert not out[key].requires_grad, key


# ---------------------------------------------------------------------------------------
# Continuous actors, [B, T] batches
# ---------------------------------------------------------------------------------------
def test_independent_normal_actor_policy_loss_on_bt_batch():
    torch.manual_seed(11)
    actor, params = gaussian_actor(IndependentNormal)
    critic, _ = make_critic()
    td = off_policy(collect(actor), scale=0.3)
    out = PPOLoss(actor, critic, normalize_advantage=False, entropy_coef=0.01)(td)

    head = params(td.select(keys.OBSERVATION))
    loc, scale = head[keys.LOC].detach(), head[keys.SCALE].detach()
    log_prob = normal_log_prob(loc, scale, td[keys.ACTION])
    expected, _ = textbook_ppo_policy_loss(
        log_prob.flatten(), td[keys.ACTION_LOG_PROB].flatten(), td[keys.ADVANTAGE].flatten(), 0.2
    )
    assert out["loss_policy"].item() == pytest.approx(expected, rel=1e-5)
    hand_entropy = (0.5 * math.log(2 * math.pi * math.e) + scale.log()).sum(-1).mean()
    assert out["entropy"].item() == pytest.approx(hand_entropy.item(), rel=1e-5)


def test_tanh_normal_actor_policy_loss_on_bt_batch():
    torch.manual_seed(12)
    actor, params = gaussian_actor(TanhNormal)
    critic, _ = make_critic()
    td = off_policy(collect(actor), scale=0.3)
    loss = PPOLoss(actor, critic, normalize_advantage=False, entropy_coef=0.01)
    out = loss(td)

    head = params(td.select(keys.OBSERVATION))
    loc, scale = head[keys.LOC].detach().double(), head[keys.SCALE].detach().double()
    action = td[keys.ACTION].double()
    pre_tanh = torch.atanh(action)
    log_prob = normal_log_prob(loc, scale, pre_tanh) - torch.log1p(-action.square()).sum(-1)
    expected, _ = textbook_ppo_policy_loss(
        log_prob.flatten(), td[keys.ACTION_LOG_PROB].flatten(), td[keys.ADVANTAGE].flatten(), 0.2
    )
    assert out["loss_policy"].item() == pytest.approx(expected, rel=1e-4)
    assert torch.isfinite(out["entropy"])
    total_loss(out).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in actor.parameters())


def test_behaviour_log_prob_with_trailing_singleton_is_accepted():
    torch.manual_seed(13)
    actor, _ = categorical_actor()
    critic, _ = make_critic()
    td = off_policy(collect(actor))
    loss = PPOLoss(actor, critic)
    flat = loss(td)["loss_policy"]
    td[keys.ACTION_LOG_PROB] = td[keys.ACTION_LOG_PROB].unsqueeze(-1)
    assert loss(td)["loss_policy"].item() == pytest.approx(flat.item())


# ---------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("key", "clip", "fragment"),
    [
        (keys.ADVANTAGE, None, "rlkit.value.GAE"),
        (keys.VALUE_TARGET, None, "never computes advantages or value targets"),
        (keys.ACTION_LOG_PROB, None, "return_log_prob=True"),
        (keys.STATE_VALUE, 0.2, "value_clip_epsilon=None"),
        (keys.ACTION, None, "collecting actor"),
        (keys.OBSERVATION, None, "environment writes it"),
    ],
)
def test_missing_key_names_the_key_and_its_writer(key, clip, fragment):
    actor, _ = categorical_actor()
    critic, _ = make_critic()
    td = collect(actor).exclude(key)
    with pytest.raises(MissingKeyError) as info:
        PPOLoss(actor, critic, value_clip_epsilon=clip)(td)
    assert isinstance(info.value, KeyError)
    message = str(info.value)
    assert "PPOLoss is missing required key(s)" in message
    assert repr(key) in message and fragment in message


def test_state_value_is_only_required_for_value_clipping():
    actor, _ = categorical_actor()
    critic, _ = make_critic()
    td = collect(actor).exclude(keys.STATE_VALUE)
    assert torch.isfinite(PPOLoss(actor, critic)(td)["loss_value"])


@pytest.mark.parametrize(
    ("key", "shape"),
    [
        (keys.ADVANTAGE, (*BATCH,)),
        (keys.VALUE_TARGET, (BATCH[0], BATCH[1], 2)),
        (keys.ACTION_LOG_PROB, (BATCH[0], BATCH[1], 3)),
        (keys.STATE_VALUE, (*BATCH,)),
    ],
)
def test_wrong_shapes_raise_clear_errors(key, shape):
    actor, _ = categorical_actor()
    critic, _ = make_critic()
    td = collect(actor)
    td[key] = torch.zeros(shape)
    with pytest.raises(ValueError, match=re.escape(f"{key!r} has shape {list(shape)}, expected")):
        PPOLoss(actor, critic, value_clip_epsilon=0.2)(td)


def test_functional_core_refuses_broadcasting_shapes():
    with pytest.raises(ValueError, match=r"shape mismatch: log_ratio \[5\], advantage \[5, 1\]"):
        functional.clipped_surrogate(torch.zeros(5), torch.zeros(5, 1), clip_epsilon=0.2)
    with pytest.raises(ValueError, match="loss_type must be one of"):
        functional.value_loss(torch.zeros(3), torch.zeros(3), loss_type="l1")


def test_factorised_distribution_without_event_sum_is_refused():
    net = nn.Sequential(nn.Linear(OBS, 2 * ACT_DIM), NormalParamExtractor())
    params = TensorDictModule(net, in_keys=[keys.OBSERVATION], out_keys=[keys.LOC, keys.SCALE])
    actor = ProbabilisticActor(
        params,
        in_keys=[keys.LOC, keys.SCALE],
        distribution_class=torch.distributions.Normal,
        return_log_prob=True,
        log_prob_key=keys.ACTION_LOG_PROB,
    )
    critic, _ = make_critic()
    td = collect(actor)
    with pytest.raises(ValueError, match="one log-probability per sample"):
        PPOLoss(actor, critic)(td)


@pytest.mark.parametrize(
    ("kwargs", "error", "fragment"),
    [
        ({"clip_epsilon": 0.0}, ValueError, "clip_epsilon must be finite and > 0, got 0.0"),
        ({"clip_epsilon": -0.1}, ValueError, "clip_epsilon must be finite and > 0"),
        ({"clip_epsilon": "0.2"}, TypeError, "clip_epsilon must be a number"),
        ({"entropy_coef": -0.01}, ValueError, "entropy_coef must be finite and >= 0"),
        ({"value_coef": -1}, ValueError, "value_coef must be finite and >= 0"),
        ({"value_coef": float("nan")}, ValueError, "value_coef must be finite"),
        ({"value_clip_epsilon": 0}, ValueError, "value_clip_epsilon must be finite and > 0"),
        ({"normalize_advantage": "batch"}, ValueError, "rlkit.objectives.standardize"),
        ({"value_loss": "l1"}, ValueError, "value_loss must be one of ('mse', 'huber')"),
        ({"entropy_samples": 0}, ValueError, "entropy_samples must be >= 1"),
    ],
)
def test_invalid_hyperparameters_are_refused_at_construction(kwargs, error, fragment):
    actor, _ = categorical_actor()
    critic, _ = make_critic()
    with pytest.raises(error, match=re.escape(fragment)):
        PPOLoss(actor, critic, **kwargs)


def test_scheduled_assignment_is_validated_and_takes_effect():
    torch.manual_seed(14)
    actor, _ = categorical_actor()
    critic, _ = make_critic()
    td = off_policy(collect(actor))
    loss = PPOLoss(actor, critic)
    wide = loss(td)["clip_fraction"]
    loss.clip_epsilon = 0.05
    assert loss(td)["clip_fraction"] > wide
    with pytest.raises(ValueError, match="clip_epsilon must be finite and > 0"):
        loss.clip_epsilon = -1.0
    assert loss.clip_epsilon == 0.05


def test_networks_are_checked_at_construction_and_the_value_key_on_first_use():
    actor, _ = categorical_actor()
    critic, _ = make_critic()
    with pytest.raises(TypeError, match="actor must be an nn.Module with get_dist"):
        PPOLoss(nn.Linear(3, 2), critic)
    wrong = TensorDictModule(nn.Linear(OBS, 1), in_keys=[keys.OBSERVATION], out_keys=["v"])
    loss = PPOLoss(actor, wrong)  # a TorchRL user renames after construction: set_keys(value=)
    td = collect(actor)
    with pytest.raises(TypeError, match=r"critic writes \['v'\].*out_keys=\[keys.STATE_VALUE\]"):
        loss(td)
    loss.set_keys(value="v")
    assert torch.isfinite(loss(td)["loss_value"])


def test_set_keys_renames_inputs_and_value_estimation_is_refused():
    torch.manual_seed(15)
    actor, _ = categorical_actor()
    critic, _ = make_critic()
    td = off_policy(collect(actor))
    loss = PPOLoss(actor, critic)
    reference = loss(td)["loss_policy"]
    renamed = td.rename_key_(keys.ADVANTAGE, "gae_advantage")
    loss.set_keys(advantage="gae_advantage")
    assert loss(renamed)["loss_policy"].item() == pytest.approx(reference.item())
    assert "gae_advantage" in loss.in_keys
    with pytest.raises(NotImplementedError, match="run a value estimator from rlkit.value"):
        loss.make_value_estimator()


# ---------------------------------------------------------------------------------------
# Helpers, hygiene, documentation
# ---------------------------------------------------------------------------------------
def test_explained_variance_identities():
    target = torch.tensor([1.0, -2.0, 3.0, 0.5])
    assert functional.explained_variance(target, target).item() == pytest.approx(1.0)
    mean = torch.full_like(target, target.mean().item())
    assert functional.explained_variance(mean, target).item() == pytest.approx(0.0, abs=1e-6)
    assert math.isnan(functional.explained_variance(target, torch.ones(4)).item())


def test_total_loss_sums_only_loss_terms():
    out = {"loss_a": torch.tensor(1.5), "loss_b": torch.tensor(-0.5), "entropy": torch.tensor(9.0)}
    assert total_loss(out).item() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="no 'loss_\\*' entries"):
        total_loss({"entropy": torch.tensor(1.0)})


def test_no_warnings_from_construction_and_forward():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        actor, _ = gaussian_actor(TanhNormal)
        critic, _ = make_critic()
        td = collect(actor)
        out = PPOLoss(actor, critic, value_clip_epsilon=0.2, entropy_coef=0.01)(td)
        total_loss(out).backward()


@pytest.mark.parametrize(
    "module", [ppo_module, a2c_module, common_module, functional_module], ids=lambda m: m.__name__
)
def test_docstring_examples_run(module):
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


def test_documentation_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", DOCS.read_text(), flags=re.S)
    assert blocks, "docs/objectives.md has no python examples"
    namespace: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for block in blocks:
            exec(compile(block, str(DOCS), "exec"), namespace)  # noqa: S102


@pytest.mark.parametrize("entropy_coef", [0.0, 0.05])
def test_diagnostics_switch_keeps_the_loss_terms_and_their_gradients(entropy_coef):
    torch.manual_seed(3)
    actor, net = categorical_actor()
    critic, _ = make_critic()
    td = off_policy(collect(actor))
    loss = PPOLoss(actor, critic, entropy_coef=entropy_coef)
    full = loss(td)
    grad_full = torch.autograd.grad(total_loss(full), net.weight)[0]
    loss.diagnostics = False
    lean = loss(td)
    grad_lean = torch.autograd.grad(total_loss(lean), net.weight)[0]
    assert sorted(lean.keys()) == ["loss_entropy", "loss_policy", "loss_value"]
    for key in ["loss_entropy", "loss_policy", "loss_value"]:
        assert lean[key].item() == pytest.approx(full[key].item(), rel=1e-6, abs=1e-8)
    assert torch.allclose(grad_lean, grad_full)
