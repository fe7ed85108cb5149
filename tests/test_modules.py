"""Tests for rlkit.modules: networks, actors, critics, target networks.

Every numerical check compares against a reference written here: hand-computed log
densities, orthogonality identities, an independent copy of the target schedule.
"""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tensordict import TensorDict
from torch import nn
from torchrl.data import (
    Binary,
    Bounded,
    Categorical,
    Composite,
    MultiCategorical,
    MultiOneHot,
    OneHot,
    Unbounded,
)
from torchrl.envs.utils import ExplorationType, set_exploration_type

from rlkit import keys
from rlkit.modules import (
    ImpalaCNN,
    NatureCNN,
    TargetNetwork,
    categorical_actor,
    gaussian_actor,
    init_orthogonal_,
    make_actor,
    make_q,
    make_value,
    mlp,
    mlp_body,
    q_critic_continuous,
    q_critic_discrete,
    shared_actor_critic,
    value_critic,
)

LOG_2PI = math.log(2.0 * math.pi)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def obs_td(*batch: int, features: int = 4) -> TensorDict:
    return TensorDict({keys.OBSERVATION: torch.randn(*batch, features)}, list(batch))


def linears(module: nn.Module) -> list[nn.Linear]:
    return [m for m in module.modules() if isinstance(m, nn.Linear)]


def assert_orthogonal(weight: torch.Tensor, gain: float) -> None:
    """Rows (if out <= in) or columns are orthogonal with norm ``gain``."""
    w = weight.detach().reshape(weight.shape[0], -1).double()
    gram = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w
    eye = torch.eye(gram.shape[0], dtype=gram.dtype)
    torch.testing.assert_close(gram, gain**2 * eye, atol=1e-5, rtol=0)


# --------------------------------------------------------------------------- networks


def test_mlp_orthogonal_init_gains_and_zero_biases():
    net = mlp(6, 3, hidden=(16, 8), out_gain=0.5)
    layers = linears(net)
    assert [(m.in_features, m.out_features) for m in layers] == [(6, 16), (16, 8), (8, 3)]
    for m, gain in zip(layers, [math.sqrt(2), math.sqrt(2), 0.5], strict=True):
        assert_orthogonal(m.weight, gain)
        assert torch.equal(m.bias, torch.zeros_like(m.bias))


def test_mlp_structure_flags_and_leading_dims():
    plain = mlp(5, 2, hidden=(7,), activation="relu")
    assert [type(m) for m in plain] == [nn.Linear, nn.ReLU, nn.Linear]
    normed = mlp(5, 2, hidden=(7, 7), activation=nn.ELU, layer_norm=True)
    assert [type(m) for m in normed] == [nn.Linear, nn.LayerNorm, nn.ELU] * 2 + [nn.Linear]
    linear = mlp(5, 2, hidden=())
    assert [type(m) for m in linear] == [nn.Linear]
    x = torch.randn(2, 3, 5)
    # Hand-computed forward of the one-hidden-layer net.
    w0, b0, w1, b1 = plain[0].weight, plain[0].bias, plain[2].weight, plain[2].bias
    expected = torch.clamp(x @ w0.T + b0, min=0) @ w1.T + b1
    torch.testing.assert_close(plain(x), expected)
    body = mlp_body(5, hidden=(7, 3))
    assert body(x).shape == (2, 3, 3) and isinstance(body[-1], nn.Tanh)


def test_mlp_bad_arguments():
    with pytest.raises(ValueError, match="unknown activation 'swish'"):
        mlp(3, 1, activation="swish")
    with pytest.raises(TypeError, match="pass the class"):
        mlp(3, 1, activation=nn.ReLU())
    with pytest.raises(TypeError, match=r"sequence of layer widths, e.g. \(64,\)"):
        mlp(3, 1, hidden=64)
    with pytest.raises(ValueError, match="out_features must be a positive int"):
        mlp(3, 0)


def test_init_orthogonal_conv_weight_as_matrix():
    conv = nn.Conv2d(3, 8, 3)  # weight as a [8, 27] matrix: orthogonal rows
    init_orthogonal_(conv, 1.7)
    assert_orthogonal(conv.weight, 1.7)
    assert torch.equal(conv.bias, torch.zeros(8))


@pytest.mark.parametrize("size", [64, 84])
def test_nature_cnn_shapes(size):
    enc = NatureCNN((4, size, size))
    conv_out = {64: 4, 84: 7}[size]  # (((s - 8) // 4 + 1 - 4) // 2 + 1 - 3) + 1
    assert enc.net[-2].in_features == 64 * conv_out * conv_out
    x = torch.randint(0, 256, (1, 2, 4, size, size), dtype=torch.uint8)
    assert enc(x).shape == (1, 2, 512)
    assert enc(x[0, 0]).shape == (512,)
    for m in enc.modules():
        if isinstance(m, nn.Conv2d | nn.Linear):
            assert_orthogonal(m.weight, math.sqrt(2))


@pytest.mark.parametrize(("size", "spatial"), [(64, 8), (84, 11)])
def test_impala_cnn_shapes(size, spatial):
    enc = ImpalaCNN((3, size, size))
    convs = [m for m in enc.modules() if isinstance(m, nn.Conv2d)]
    pools = [m for m in enc.modules() if isinstance(m, nn.MaxPool2d)]
    assert len(convs) == 3 * (1 + 2 * 2) and len(pools) == 3
    assert [c.out_channels for c in convs[::5]] == [16, 32, 32]
    assert linears(enc)[0].in_features == 32 * spatial * spatial
    x = torch.rand(2, 1, 3, size, size)
    assert enc(x).shape == (2, 1, 256)


def test_impala_residual_block_by_hand():
    block = ImpalaCNN((3, 16, 16)).net[0][2]
    x = torch.randn(2, 16, 8, 8)
    h = F.conv2d(F.relu(x), block.conv0.weight, block.conv0.bias, padding=1)
    expected = x + F.conv2d(F.relu(h), block.conv1.weight, block.conv1.bias, padding=1)
    torch.testing.assert_close(block(x), expected)


@pytest.mark.parametrize("cls", [NatureCNN, ImpalaCNN])
def test_cnn_uint8_scaling_and_shape_errors(cls):
    enc = cls((3, 64, 64))
    x = torch.randint(0, 256, (4, 3, 64, 64), dtype=torch.uint8)
    torch.testing.assert_close(enc(x), enc(x.double().div(255).float()))
    with pytest.raises(ValueError, match=r"images \[\*, C, H, W\] = \[\*, 3, 64, 64\]"):
        enc(torch.zeros(4, 64, 64, 3))
    with pytest.raises(ValueError, match=r"in_shape=\(C, H, W\)"):
        cls((64, 64))


# --------------------------------------------------------------------------- actors


def hand_log_softmax(logits: torch.Tensor) -> torch.Tensor:
    return logits - logits.exp().sum(-1, keepdim=True).log()


def test_categorical_actor_log_prob_and_modes():
    actor = categorical_actor(4, 3, hidden=(16,))
    td = actor(obs_td(50))
    action, logits = td[keys.ACTION], td[keys.LOGITS]
    assert action.dtype == torch.int64 and action.shape == (50,)
    assert td[keys.ACTION_LOG_PROB].shape == (50,)
    expected = hand_log_softmax(logits)[torch.arange(50), action]
    torch.testing.assert_close(td[keys.ACTION_LOG_PROB], expected)
    torch.testing.assert_close(actor.get_dist(td).log_prob(action), expected)
    # Output gain 0.01: near-uniform initial policy.
    assert logits.abs().max() < 0.1
    assert_orthogonal(linears(actor)[-1].weight, 0.01)
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        det = actor(td.exclude(keys.ACTION))
    assert torch.equal(det[keys.ACTION], logits.argmax(-1))


def test_categorical_actor_samples_follow_softmax():
    actor = categorical_actor(4, 3, hidden=())
    with torch.no_grad():
        linears(actor)[-1].weight.copy_(torch.tensor([[1.0, 0, 0, 0], [0, 1, 0, 0], [0, 0, 0, 0]]))
    n = 40_000
    td = TensorDict({keys.OBSERVATION: torch.tensor([1.0, -1.0, 0.0, 0.0]).expand(n, 4)}, [n])
    with torch.no_grad():
        freq = torch.bincount(actor(td)[keys.ACTION], minlength=3).double() / n
    probs = torch.tensor([math.e, math.exp(-1), 1.0], dtype=torch.double)
    probs = probs / probs.sum()
    assert (freq - probs).abs().max() < 4 * math.sqrt(0.25 / n)


def test_one_hot_actor():
    actor = categorical_actor(4, 3, one_hot=True)
    td = actor(obs_td(20))
    action = td[keys.ACTION]
    assert action.shape == (20, 3) and torch.equal(
        action.sum(-1), torch.ones(20, dtype=action.dtype)
    )
    index = action.argmax(-1)
    expected = hand_log_softmax(td[keys.LOGITS])[torch.arange(20), index]
    torch.testing.assert_close(td[keys.ACTION_LOG_PROB], expected)
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        det = actor(td.exclude(keys.ACTION))[keys.ACTION]
    assert torch.equal(det.argmax(-1), td[keys.LOGITS].argmax(-1))


def normal_log_density(x, mu, sigma):
    return (-0.5 * ((x - mu) / sigma) ** 2 - sigma.log() - 0.5 * LOG_2PI).sum(-1)


def test_gaussian_actor_normal_log_prob_and_mean():
    actor = gaussian_actor(4, 2, hidden=(8,), init_log_std=-0.5)
    td = actor(obs_td(6, 5))
    a, mu, sigma = td[keys.ACTION], td[keys.LOC], td[keys.SCALE]
    assert a.shape == (6, 5, 2) and td[keys.ACTION_LOG_PROB].shape == (6, 5)
    # State-independent std, initialised at exp(init_log_std).
    torch.testing.assert_close(sigma, torch.full_like(sigma, math.exp(-0.5)))
    expected = normal_log_density(a, mu, sigma)
    torch.testing.assert_close(td[keys.ACTION_LOG_PROB], expected)
    torch.testing.assert_close(actor.get_dist(td).log_prob(a), expected)
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        det = actor(td.exclude(keys.ACTION))
    torch.testing.assert_close(det[keys.ACTION], mu)
    # The log-std vector is a trained parameter.
    actor.get_dist(td).log_prob(a.detach()).sum().backward()
    log_std = dict(actor.named_parameters())["module.0.module.log_std"]
    assert log_std.shape == (2,) and log_std.grad.abs().sum() > 0


def tanh_normal_log_density(a, mu, sigma, low, high):
    """log N(u) - sum log(1 - tanh(u)^2) - sum log((high - low) / 2), u = atanh(rescaled a)."""
    center, half = (high + low) / 2, (high - low) / 2
    u = torch.atanh((a - center) / half)
    jacobian = torch.log(1 - torch.tanh(u) ** 2) + torch.log(half)
    return normal_log_density(u, mu, sigma) - jacobian.sum(-1)


def test_tanh_normal_actor_log_prob_at_stored_action():
    low, high = torch.tensor([-2.0, 0.0]), torch.tensor([2.0, 1.0])
    actor = gaussian_actor(4, 2, hidden=(8,), tanh=True, low=low, high=high)
    td = actor(obs_td(200)).detach()
    a, mu, sigma = td[keys.ACTION], td[keys.LOC], td[keys.SCALE]
    assert a.shape == (200, 2) and ((a >= low) & (a <= high)).all()
    interior = ((a - (high + low) / 2).abs() / ((high - low) / 2) < 0.99).all(-1)
    expected = tanh_normal_log_density(a, mu, sigma, low, high)
    torch.testing.assert_close(
        td[keys.ACTION_LOG_PROB][interior], expected[interior], atol=1e-4, rtol=1e-4
    )
    # A hand-made stored action from a known pre-tanh value u.
    u = torch.tensor([[0.3, -1.2], [1.5, 0.1]])
    stored = (high + low) / 2 + (high - low) / 2 * torch.tanh(u)
    td2 = td[:2].clone().set(keys.ACTION, stored)
    expected2 = normal_log_density(u, mu[:2], sigma[:2]) - (
        torch.log(1 - torch.tanh(u) ** 2) + torch.log((high - low) / 2)
    ).sum(-1)
    got = actor.get_dist(td2).log_prob(stored)
    torch.testing.assert_close(got, expected2, atol=1e-5, rtol=1e-5)
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        det = actor(td.exclude(keys.ACTION))[keys.ACTION]
    torch.testing.assert_close(det, (high + low) / 2 + (high - low) / 2 * torch.tanh(mu))


def test_tanh_actor_state_dependent_std_init_and_bounds():
    actor = gaussian_actor(4, 3, tanh=True, init_log_std=-1.0)  # state dependent by default
    assert not any("log_std" in n for n, _ in actor.named_parameters())
    scale = actor(obs_td(10))[keys.SCALE]
    torch.testing.assert_close(scale, torch.full_like(scale, math.exp(-1.0)), atol=2e-2, rtol=0)
    with torch.no_grad():
        linears(actor)[-1].weight.mul_(1e4)
    scale = actor(obs_td(100, features=4).apply(lambda x: 100 * x))[keys.SCALE]
    assert scale.min() >= math.exp(-5.0) - 1e-6 and scale.max() <= math.exp(2.0) + 1e-5
    assert scale.std() > 0  # varies with the state
    fixed = gaussian_actor(4, 3, tanh=True, state_dependent_std=False)
    assert any(n.endswith("log_std") for n, _ in fixed.named_parameters())


def _mlp_by_hand(actor: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The actor's loc network written out: tanh hidden layers, a linear output."""
    layers = linears(actor)
    for layer in layers[:-1]:
        x = torch.tanh(x @ layer.weight.T + layer.bias)
    return x @ layers[-1].weight.T + layers[-1].bias


def test_bounded_loc_squashes_only_the_mean():
    """bounded_loc: loc = (low + high)/2 + (high - low)/2 tanh(net(s)), inside the bounds
    however large the network's output; the actions are Normal samples around it (not
    squashed) and their log-density is the Normal's."""
    low, high = torch.tensor([-2.0, 0.0]), torch.tensor([2.0, 1.0])
    actor = gaussian_actor(3, 2, bounded_loc=True, low=low, high=high, init_log_std=-0.5)
    with torch.no_grad():
        for layer in linears(actor):
            layer.weight.mul_(300.0)  # outputs far beyond the bounds
    x = 5 * torch.randn(2000, 3)
    td = actor(TensorDict({keys.OBSERVATION: x}, [2000]))
    raw = _mlp_by_hand(actor, x)
    assert raw.abs().max() > 5  # the network's own output is far out
    torch.testing.assert_close(td[keys.LOC], (low + high) / 2 + (high - low) / 2 * torch.tanh(raw))
    assert (td[keys.LOC] >= low).all() and (td[keys.LOC] <= high).all()
    assert (td[keys.ACTION] > high).any() and (td[keys.ACTION] < low).any()  # not squashed
    normal = torch.distributions.Normal(td[keys.LOC], math.exp(-0.5))
    expected = normal.log_prob(td[keys.ACTION]).sum(-1)
    torch.testing.assert_close(td[keys.ACTION_LOG_PROB], expected, atol=1e-5, rtol=1e-5)
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        det = actor(TensorDict({keys.OBSERVATION: x}, [2000]))[keys.ACTION]
    torch.testing.assert_close(det, td[keys.LOC])
    # the bounds are rebuilt from the spec, not saved: the same keys as any Normal actor's
    assert all(k.endswith(("log_std", "weight", "bias")) for k in actor.state_dict())


def test_bounded_loc_through_make_actor_and_its_errors():
    spec = Bounded(low=-2.0, high=2.0, shape=(1,))
    actor = make_actor(obs_spec(), spec, bounded_loc=True)
    with torch.no_grad():
        linears(actor)[-1].bias.fill_(50.0)
    torch.testing.assert_close(actor(obs_td(7))[keys.LOC], torch.full((7, 1), 2.0))
    with pytest.raises(ValueError, match="--bounded-mean.*Unbounded.*drop"):
        make_actor(obs_spec(), Unbounded(shape=(1,)), bounded_loc=True)
    with pytest.raises(ValueError, match="already inside the bounds"):
        gaussian_actor(4, 2, tanh=True, bounded_loc=True)
    with pytest.raises(ValueError, match="bounded_loc=True .--bounded-mean. needs finite"):
        gaussian_actor(4, 1, bounded_loc=True, low=-float("inf"), high=1.0)


def test_gaussian_actor_bad_arguments():
    with pytest.raises(ValueError, match="low/high apply only with tanh=True or bounded_loc=True"):
        gaussian_actor(4, 2, low=-1.0, high=1.0)
    with pytest.raises(ValueError, match="need high > low"):
        gaussian_actor(4, 2, tanh=True, low=1.0, high=-1.0)
    with pytest.raises(ValueError, match="strictly inside log_std_bounds"):
        gaussian_actor(4, 2, tanh=True, init_log_std=3.0)
    with pytest.raises(ValueError, match="action_dim must be a positive int"):
        gaussian_actor(4, 0)


# --------------------------------------------------------------------------- make_actor


def obs_spec(*batch: int, shape=(4,), dtype=torch.float32) -> Composite:
    return Composite(
        {keys.OBSERVATION: Unbounded(shape=(*batch, *shape), dtype=dtype)}, shape=batch
    )


def test_make_actor_categorical_from_batched_specs():
    actor = make_actor(obs_spec(8), Categorical(5, shape=(8,)), hidden=(16,))
    assert linears(actor)[0].in_features == 4 and linears(actor)[-1].out_features == 5
    td = actor(obs_td(8))
    assert td[keys.ACTION].dtype == torch.int64 and td[keys.ACTION].shape == (8,)


def test_make_actor_one_hot_and_continuous():
    td = make_actor(obs_spec(), OneHot(3))(obs_td(7))
    assert td[keys.ACTION].shape == (7, 3)
    bounded = Bounded(low=-3.0, high=3.0, shape=(2,))
    normal = make_actor(obs_spec(), bounded)
    assert normal(obs_td(7))[keys.ACTION_LOG_PROB].shape == (7,)
    squashed = make_actor(obs_spec(), bounded, tanh=True)
    with torch.no_grad():
        linears(squashed)[-1].bias[:2] = 50.0  # loc -> +inf: deterministic action -> high
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        a = squashed(obs_td(7))[keys.ACTION]
    torch.testing.assert_close(a, torch.full_like(a, 3.0))
    unbounded = make_actor(obs_spec(), Unbounded(shape=(2,)))
    assert unbounded(obs_td(3))[keys.ACTION].shape == (3, 2)


def test_make_actor_with_backbone():
    spec = obs_spec(shape=(3, 64, 64), dtype=torch.uint8)
    actor = make_actor(spec, Categorical(4), backbone=ImpalaCNN((3, 64, 64)), hidden=())
    x = torch.randint(0, 256, (2, 5, 3, 64, 64), dtype=torch.uint8)
    td = actor(TensorDict({keys.OBSERVATION: x}, [2, 5]))
    assert td[keys.ACTION].shape == (2, 5)


@pytest.mark.parametrize(
    ("action_spec", "match"),
    [
        (MultiOneHot([2, 3]), r"unsupported action spec MultiOneHot"),
        (Categorical(3, shape=(2,)), r"unsupported action spec Categorical\(shape=\[2\]"),
    ],
)
def test_make_actor_rejects_unsupported_action_specs(action_spec, match):
    with pytest.raises(ValueError, match=match) as info:
        make_actor(obs_spec(), action_spec)
    assert "support Categorical(n) with shape []" in str(info.value)


@pytest.mark.parametrize(
    ("action_spec", "shape"),
    [
        (MultiCategorical([2, 3]), (5, 2)),
        (Binary(n=3), (5, 3)),
        (Composite({keys.ACTION: Composite({"a": Categorical(2)})}), (5,)),
    ],
)
def test_make_actor_builds_a_multi_part_policy_for_structured_specs(action_spec, shape):
    """MultiDiscrete, MultiBinary and Dict actions (issue 47): tests/test_actions.py."""
    td = make_actor(obs_spec(), action_spec)(obs_td(5))
    action = td[keys.ACTION]
    assert (action["a"] if shape == (5,) else action).shape == shape
    assert td[keys.ACTION_LOG_PROB].shape == (5,)


def test_make_actor_rejects_bad_observations_and_options():
    image = obs_spec(shape=(3, 64, 64), dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"shape=\[3, 64, 64\].*not a flat float vector.*backbone"):
        make_actor(image, Categorical(2))
    discrete_obs = Composite({keys.OBSERVATION: Categorical(10)})
    with pytest.raises(ValueError, match="nn.Embedding for discrete"):
        make_actor(discrete_obs, Categorical(2))
    with pytest.raises(ValueError, match="cannot tell the output width of backbone Identity"):
        make_actor(image, Categorical(2), backbone=nn.Identity())
    with pytest.raises(ValueError, match="tanh=True needs a Bounded action spec"):
        make_actor(obs_spec(), Unbounded(shape=(2,)), tanh=True)
    with pytest.raises(KeyError, match="observation spec has no entry 'pixels'"):
        make_actor(obs_spec(), Categorical(2), obs_key="pixels")


# --------------------------------------------------------------------------- shared trunk


def param_ids(module: nn.Module) -> set[int]:
    return {id(p) for p in module.parameters()}


def grads_of(module: nn.Module, ids: set[int]) -> list[torch.Tensor | None]:
    return [p.grad for p in module.parameters() if id(p) in ids]


@pytest.mark.parametrize("kind", ["categorical", "gaussian"])
def test_shared_trunk_gradient_routing(kind):
    kw = {"n_actions": 3} if kind == "categorical" else {"action_dim": 2}
    actor, critic = shared_actor_critic(4, hidden=(16, 16), **kw)
    trunk_ids = param_ids(actor) & param_ids(critic)
    policy_ids, value_ids = param_ids(actor) - trunk_ids, param_ids(critic) - trunk_ids
    assert len(trunk_ids) == 4 and policy_ids and value_ids
    both = nn.ModuleList([actor, critic])
    assert len(list(both.parameters())) == len(trunk_ids | policy_ids | value_ids)

    td = actor(obs_td(12)).detach()
    critic(td)[keys.STATE_VALUE].pow(2).mean().backward()
    assert td[keys.STATE_VALUE].shape == (12, 1)
    assert all(g is not None and g.abs().sum() > 0 for g in grads_of(critic, trunk_ids))
    assert all(g is not None and g.abs().sum() > 0 for g in grads_of(critic, value_ids))
    assert all(g is None for g in grads_of(actor, policy_ids))

    both.zero_grad(set_to_none=True)
    (-actor.get_dist(td).log_prob(td[keys.ACTION]).mean()).backward()
    assert all(g is not None and g.abs().sum() > 0 for g in grads_of(actor, trunk_ids))
    assert all(g is not None and g.abs().sum() > 0 for g in grads_of(actor, policy_ids))
    assert all(g is None for g in grads_of(critic, value_ids))


def test_shared_actor_critic_needs_one_action_size():
    with pytest.raises(ValueError, match="exactly one of n_actions="):
        shared_actor_critic(4)
    with pytest.raises(ValueError, match="exactly one of n_actions="):
        shared_actor_critic(4, n_actions=2, action_dim=2)


# --------------------------------------------------------------------------- critics


def test_value_and_q_critics():
    v = value_critic(4, hidden=(8,))
    assert_orthogonal(linears(v)[-1].weight, 1.0)
    assert v(obs_td(3, 2))[keys.STATE_VALUE].shape == (3, 2, 1)
    q = q_critic_discrete(4, 5)
    assert q(obs_td(3))[keys.ACTION_VALUE].shape == (3, 5)
    qc = q_critic_continuous(4, 2, hidden=(8,))
    td = obs_td(3).set(keys.ACTION, torch.randn(3, 2))
    out = qc(td)[keys.STATE_ACTION_VALUE]
    first, _, last = list(qc.module.head)
    x = torch.cat([td[keys.OBSERVATION], td[keys.ACTION]], -1)
    expected = torch.clamp(x @ first.weight.T + first.bias, min=0) @ last.weight.T + last.bias
    torch.testing.assert_close(out, expected)


def test_make_value_and_make_q_dispatch():
    assert make_value(obs_spec(8))(obs_td(8))[keys.STATE_VALUE].shape == (8, 1)
    q = make_q(obs_spec(8), Categorical(3, shape=(8,)))
    assert q.out_keys == [keys.ACTION_VALUE] and linears(q)[-1].out_features == 3
    qc = make_q(obs_spec(), Bounded(low=-1.0, high=1.0, shape=(2,)))
    assert qc.out_keys == [keys.STATE_ACTION_VALUE] and linears(qc)[0].in_features == 6
    with pytest.raises(
        ValueError, match=r"actions are MultiCategorical.* ppo, a2c, impala, appo and rnd"
    ):
        make_q(obs_spec(), MultiCategorical([2, 2]))


# --------------------------------------------------------------------------- target network


def perturb_(module: nn.Module) -> None:
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p))


def flat(module: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in module.parameters()])


def test_target_hard_update_every_period_steps():
    source = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    target = TargetNetwork(source, mode="hard", period=3)
    reference = flat(source).clone()  # independent record of what the target should hold
    updated = []
    for step in range(1, 11):
        perturb_(source)
        updated.append(target.step())
        if step % 3 == 0:
            reference = flat(source).clone()
        assert torch.equal(flat(target.module), reference)
        assert torch.equal(flat(target.module), flat(source)) == (step % 3 == 0)
    assert updated == [s % 3 == 0 for s in range(1, 11)]
    assert int(target.step_count) == 10


@pytest.mark.parametrize("period", [1, 2])
def test_target_soft_update_matches_polyak(period):
    source = nn.Linear(3, 2)
    tau = 0.1
    target = TargetNetwork(source, mode="soft", tau=tau, period=period)
    reference = {n: p.detach().clone() for n, p in source.named_parameters()}
    for step in range(1, 4 * period):
        perturb_(source)
        target.step()
        if step % period == 0:
            for n, p in source.named_parameters():
                reference[n] = (1 - tau) * reference[n] + tau * p.detach()
        for n, p in target.module.named_parameters():
            torch.testing.assert_close(p, reference[n], rtol=1e-6, atol=1e-6)


def test_target_copies_buffers_and_wraps_tensordict_modules():
    source = value_critic(4, hidden=(8,))
    source.module.register_buffer("stat", torch.zeros(3))
    target = TargetNetwork(source, mode="soft", tau=0.5)
    assert all(not p.requires_grad for p in target.parameters())
    assert param_ids(target).isdisjoint(param_ids(source))
    source.module.stat.fill_(7.0)
    target.step()
    assert torch.equal(target.module.module.stat, torch.full((3,), 7.0))  # copied, not averaged
    td = target(obs_td(5))
    assert td[keys.STATE_VALUE].shape == (5, 1)


def test_target_state_dict_round_trip_keeps_schedule():
    source = nn.Linear(2, 2)
    target = TargetNetwork(source, mode="hard", period=3)
    for _ in range(4):
        perturb_(source)
        target.step()
    state = target.state_dict()
    assert set(state) == {"module.weight", "module.bias", "step_count"}
    resumed = TargetNetwork(source, mode="hard", period=3)
    resumed.load_state_dict(state)
    assert int(resumed.step_count) == 4
    assert torch.equal(flat(resumed.module), flat(target.module))
    assert [resumed.step(), resumed.step(), resumed.step()] == [False, True, False]


def test_target_train_mode_keeps_copy_in_eval():
    target = TargetNetwork(nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5)))
    target.train()
    assert target.training and not target.module.training


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"period": 0}, ValueError, "period must be an int >= 1"),
        ({"period": 1.5}, ValueError, "period must be an int >= 1"),
        ({"tau": 0.0}, ValueError, r"tau must satisfy 0 < tau <= 1"),
        ({"tau": 1.5}, ValueError, r"tau must satisfy 0 < tau <= 1"),
        ({"mode": "polyak"}, ValueError, "mode must be 'hard' or 'soft'"),
    ],
)
def test_target_rejects_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        TargetNetwork(nn.Linear(2, 2), **kwargs)


def test_target_rejects_non_module_source():
    with pytest.raises(TypeError, match="source must be an nn.Module"):
        TargetNetwork(copy.copy)


# --------------------------------------------------------------------------- documentation


def test_docstring_examples_run():
    import doctest

    from rlkit.modules import actors, compat, critics, networks, target

    for mod in (networks, actors, critics, target, compat):
        result = doctest.testmod(mod, extraglobs={"torch": torch, "nn": nn}, verbose=False)
        assert result.failed == 0, f"{mod.__name__}: {result.failed} doctest(s) failed"
        assert result.attempted > 0, mod.__name__


def test_docs_page_examples_run(capsys):
    path = Path(__file__).resolve().parents[1] / "docs" / "modules.md"
    blocks = re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)
    assert len(blocks) >= 5
    for block in blocks:
        exec(compile(block, str(path), "exec"), {})
    out = capsys.readouterr().out
    assert "torch.Size([16, 5, 2])" in out and "is not a flat float vector" in out
