"""PPGAuxLoss against references written here: KL by hand, value losses by hand, gradient
routing for both network layouts, every option changing the output."""

from __future__ import annotations

import doctest
import math

import pytest
import torch
from tensordict import TensorDict
from torch import nn

from rlkit import keys
from rlkit.algorithms.ppg import PPGConfig, build_ppg_networks, record_pre_aux
from rlkit.envs import make_env
from rlkit.modules import categorical_actor, gaussian_actor, value_critic
from rlkit.objectives import MissingKeyError, PPGAuxLoss, total_loss
from rlkit.objectives import ppg as ppg_module
from rlkit.objectives.ppg import AUX_STATE_VALUE, PRE_AUX, policy_kl

OBS = 3


def aux_head(in_features: int = OBS):
    from torchrl.modules import ValueOperator

    return ValueOperator(
        nn.Linear(in_features, 1), in_keys=[keys.OBSERVATION], out_keys=[AUX_STATE_VALUE]
    )


def batch(n: int = 16, seed: int = 0) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    return TensorDict(
        {
            keys.OBSERVATION: torch.randn(n, OBS, generator=g),
            keys.VALUE_TARGET: torch.randn(n, 1, generator=g),
        },
        [n],
    )


def nets(kind: str = "categorical"):
    torch.manual_seed(0)
    actor = categorical_actor(OBS, 4) if kind == "categorical" else gaussian_actor(OBS, 2)
    return actor, value_critic(OBS), aux_head()


def perturb(module: nn.Module, scale: float = 0.3) -> None:
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn_like(p))


@pytest.mark.parametrize("kind", ["categorical", "gaussian"])
def test_kl_is_zero_right_after_recording(kind):
    actor, critic, aux = nets(kind)
    td = record_pre_aux(actor, critic, batch())
    out = PPGAuxLoss(actor, critic, aux)(td)
    assert float(out["loss_distill"].detach()) == 0.0
    assert float(out["unscaled_loss_distill"]) == 0.0
    assert float(out["kl_max"]) == 0.0


def test_categorical_kl_matches_a_hand_sum():
    actor, critic, aux = nets()
    td = record_pre_aux(actor, critic, batch())
    old_logits = td.get((PRE_AUX, keys.LOGITS)).clone()
    perturb(actor)
    out = PPGAuxLoss(actor, critic, aux, beta_clone=0.5)(td)
    new_logits = actor.get_dist_params(td.select(keys.OBSERVATION)).get(keys.LOGITS).detach()
    total = 0.0
    for lo, ln in zip(old_logits.tolist(), new_logits.tolist()):
        zo = math.log(sum(math.exp(x) for x in lo))
        zn = math.log(sum(math.exp(x) for x in ln))
        total += sum(math.exp(a - zo) * ((a - zo) - (b - zn)) for a, b in zip(lo, ln))
    expected = total / len(old_logits)
    assert math.isclose(float(out["unscaled_loss_distill"]), expected, rel_tol=1e-5)
    assert math.isclose(float(out["loss_distill"].detach()), 0.5 * expected, rel_tol=1e-5)


def test_gaussian_kl_matches_the_closed_form_by_hand():
    old = torch.distributions.Independent(
        torch.distributions.Normal(torch.tensor([[0.0, 1.0]]), torch.tensor([[1.0, 2.0]])), 1
    )
    new = torch.distributions.Independent(
        torch.distributions.Normal(torch.tensor([[0.5, 0.0]]), torch.tensor([[2.0, 1.0]])), 1
    )
    # KL(N(m1,s1)||N(m2,s2)) = log(s2/s1) + (s1^2 + (m1-m2)^2) / (2 s2^2) - 1/2, summed
    hand = (math.log(2) + (1 + 0.25) / 8 - 0.5) + (math.log(0.5) + (4 + 1) / 2 - 0.5)
    assert math.isclose(float(policy_kl(old, new)), hand, rel_tol=1e-6)


def test_monte_carlo_kl_without_closed_form_is_unbiased():
    from torchrl.modules import TanhNormal

    torch.manual_seed(0)
    old = TanhNormal(torch.zeros(1, 1), torch.ones(1, 1))
    new = TanhNormal(torch.full((1, 1), 0.5), torch.ones(1, 1))
    # tanh is a bijection: the KL equals the Gaussians' KL, 0.5 * 0.5^2 = 0.125
    est = float(policy_kl(old, new, num_samples=20000))
    assert abs(est - 0.125) < 0.01


def test_value_terms_match_hand_losses_and_are_logged_scaled_and_unscaled():
    actor, critic, aux = nets()
    td = record_pre_aux(actor, critic, batch())
    loss = PPGAuxLoss(actor, critic, aux, aux_value_coef=2.0, value_coef=3.0)
    out = loss(td)
    target = td.get(keys.VALUE_TARGET).squeeze(-1).tolist()
    v = critic(td.select(keys.OBSERVATION)).get(keys.STATE_VALUE).squeeze(-1).tolist()
    a = aux(td.select(keys.OBSERVATION)).get(AUX_STATE_VALUE).squeeze(-1).tolist()
    hand_v = sum(0.5 * (x - t) ** 2 for x, t in zip(v, target)) / len(v)
    hand_a = sum(0.5 * (x - t) ** 2 for x, t in zip(a, target)) / len(a)
    assert math.isclose(float(out["unscaled_loss_value"]), hand_v, rel_tol=1e-5)
    assert math.isclose(float(out["unscaled_loss_aux_value"]), hand_a, rel_tol=1e-5)
    assert math.isclose(float(out["loss_value"].detach()), 3 * hand_v, rel_tol=1e-5)
    assert math.isclose(float(out["loss_aux_value"].detach()), 2 * hand_a, rel_tol=1e-5)
    assert math.isclose(float(total_loss(out).detach()), 3 * hand_v + 2 * hand_a, rel_tol=1e-5)


def test_value_clipping_follows_the_ppo2_rule_around_the_recorded_value():
    actor, critic, aux = nets()
    td = record_pre_aux(actor, critic, batch())
    old = td.get((PRE_AUX, keys.STATE_VALUE)).squeeze(-1).tolist()
    perturb(critic, 1.0)
    out = PPGAuxLoss(actor, critic, aux, value_clip_epsilon=0.1)(td)
    v = critic(td.select(keys.OBSERVATION)).get(keys.STATE_VALUE).squeeze(-1).tolist()
    target = td.get(keys.VALUE_TARGET).squeeze(-1).tolist()
    hand = 0.0
    for x, o, t in zip(v, old, target):
        clipped = o + max(-0.1, min(0.1, x - o))
        hand += max(0.5 * (x - t) ** 2, 0.5 * (clipped - t) ** 2)
    assert math.isclose(float(out["loss_value"].detach()), hand / len(v), rel_tol=1e-5)


@pytest.mark.parametrize(
    "option",
    [
        {"beta_clone": 3.0},
        {"aux_value_coef": 0.1},
        {"value_coef": 0.2},
        {"value_clip_epsilon": 0.05},
        {"value_loss": "huber"},
    ],
)
def test_every_option_changes_the_output(option):
    actor, critic, aux = nets()
    td = record_pre_aux(actor, critic, batch())
    td.set(keys.VALUE_TARGET, td.get(keys.VALUE_TARGET) * 5)  # errors > 1 for huber
    perturb(actor)
    perturb(critic, 1.0)
    base = float(total_loss(PPGAuxLoss(actor, critic, aux)(td)).detach())
    changed = float(total_loss(PPGAuxLoss(actor, critic, aux, **option)(td)).detach())
    assert not math.isclose(base, changed, rel_tol=1e-4)


# ---------------------------------------------------------------------------------------
# gradient routing, on the recipe's networks in both layouts
# ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def env():
    e = make_env("CartPole-v1", num_envs=2, seed=0)
    yield e
    e.close()


def groups(arch: str, n):
    """name -> parameters, disjoint, covering every parameter."""
    policy_head = list(n.actor.module[0].module[-1].parameters())
    aux_head = list(n.aux_critic.module[-1].parameters())
    value_head = list(n.critic.module[-1].parameters())
    trunk = list(n.trunk.parameters())
    out = {"trunk": trunk, "policy_head": policy_head, "aux_head": aux_head}
    if arch == "dual":
        out["critic"] = list(n.critic.parameters())
    else:
        out["value_head"] = value_head
    seen = {id(p) for ps in out.values() for p in ps}
    every = {id(p) for m in (n.actor, n.critic, n.aux_critic) for p in m.parameters()}
    assert seen == every and sum(len(ps) for ps in out.values()) == len(every)
    return out


ROUTES = {
    "dual": {
        "loss_aux_value": {"trunk", "aux_head"},
        "loss_distill": {"trunk", "policy_head"},
        "loss_value": {"critic"},
    },
    "shared": {
        "loss_aux_value": {"trunk", "aux_head"},
        "loss_distill": {"trunk", "policy_head"},
        "loss_value": {"value_head"},
    },
}


@pytest.mark.parametrize("arch", ["dual", "shared"])
def test_each_loss_reaches_only_its_parameters(arch, env):
    torch.manual_seed(0)
    n = build_ppg_networks(PPGConfig(arch=arch, num_envs=2, n_pi=2, minibatch_size=32), env)
    g = groups(arch, n)
    td = TensorDict(
        {keys.OBSERVATION: torch.randn(16, 4), keys.VALUE_TARGET: torch.randn(16, 1)}, [16]
    )
    td = record_pre_aux(n.actor, n.critic, td)
    perturb(n.actor)  # a non-zero KL gradient
    loss = PPGAuxLoss(n.actor, n.critic, n.aux_critic)
    for term, expected in ROUTES[arch].items():
        for ps in g.values():
            for p in ps:
                p.grad = None
        loss(td)[term].backward()
        reached = {
            name
            for name, ps in g.items()
            if any(p.grad is not None and p.grad.abs().sum() > 0 for p in ps)
        }
        assert reached == expected, (term, reached)


@pytest.mark.parametrize("arch", ["dual", "shared"])
def test_policy_phase_value_loss_reaches_only_the_value_parameters(arch, env):
    from rlkit.objectives import PPOLoss

    torch.manual_seed(0)
    n = build_ppg_networks(PPGConfig(arch=arch, num_envs=2, n_pi=2, minibatch_size=32), env)
    g = groups(arch, n)
    td = n.actor(TensorDict({keys.OBSERVATION: torch.randn(16, 4)}, [16]))
    td.set(keys.ADVANTAGE, torch.randn(16, 1))
    td.set(keys.VALUE_TARGET, torch.randn(16, 1))
    out = PPOLoss(n.actor, n.critic)(td)
    out["loss_value"].backward()
    reached = {n_ for n_, ps in g.items() if any(p.grad is not None for p in ps)}
    assert reached == ({"critic"} if arch == "dual" else {"value_head"})
    for ps in g.values():
        for p in ps:
            p.grad = None
    out = PPOLoss(n.actor, n.critic)(td)
    out["loss_policy"].backward()
    reached = {n_ for n_, ps in g.items() if any(p.grad is not None for p in ps)}
    assert reached == {"trunk", "policy_head"}


# ---------------------------------------------------------------------------------------
# errors and docs
# ---------------------------------------------------------------------------------------
def test_missing_recording_is_named_with_the_fix():
    actor, critic, aux = nets()
    with pytest.raises(MissingKeyError, match=r"pre_aux.*record_pre_aux"):
        PPGAuxLoss(actor, critic, aux)(batch())


def test_aux_critic_must_write_the_aux_key():
    actor, critic, _ = nets()
    with pytest.raises(TypeError, match="AUX_STATE_VALUE|aux_state_value"):
        PPGAuxLoss(actor, critic, value_critic(OBS))


def test_bad_hyperparameters_are_named():
    actor, critic, aux = nets()
    with pytest.raises(ValueError, match="beta_clone"):
        PPGAuxLoss(actor, critic, aux, beta_clone=-1.0)
    with pytest.raises(ValueError, match="value_loss"):
        PPGAuxLoss(actor, critic, aux, value_loss="l1")


def test_docstring_example_runs():
    result = doctest.testmod(ppg_module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0


@pytest.mark.parametrize("kind", ["categorical", "gaussian"])
@pytest.mark.parametrize("clip", [None, 0.2])
def test_in_keys_declare_everything_the_loss_reads(kind, clip):
    # the update loop hands a loss only its in_keys and reads strictly: a key read but not
    # declared (the recorded distribution, the recorded V under value clipping) would raise
    from types import SimpleNamespace

    from rlkit.training.engine import Context, Counters
    from rlkit.training.update import LossGroup, update_loop

    actor, critic, aux = nets(kind)
    td = record_pre_aux(actor, critic, batch())
    td.set("unrelated", torch.zeros(16, 2))
    loss = PPGAuxLoss(actor, critic, aux, value_clip_epsilon=clip)
    assert ((PRE_AUX, keys.STATE_VALUE) in loss.in_keys) == (clip is not None)
    params = {id(p): p for m in (actor, critic, aux) for p in m.parameters()}.values()
    group = LossGroup("aux", loss, torch.optim.SGD(list(params), lr=0.1))
    ctx = Context(SimpleNamespace(world_size=1, device=torch.device("cpu")), 10, Counters())
    out = update_loop([group], td, ctx, grad_accum=2)
    assert out["unscaled_loss_distill"] == 0.0 and "grad_norm" in out
