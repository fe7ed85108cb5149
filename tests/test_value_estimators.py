"""rlkit.value estimators (TensorDict modules): keys, time dim, critic calls, V-trace's rho.

References are written here: a textbook GAE loop, and importance ratios computed by hand
from the networks' outputs with the density formulas.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributions as D
from tensordict import TensorDict
from tensordict.nn import InteractionType, TensorDictModule, set_interaction_type
from torch import nn
from torchrl.modules import NormalParamExtractor, ProbabilisticActor, TanhNormal

from rlkit import keys
from rlkit.value import GAE, VTRACE_RHO, TDLambda, VTrace

N, T, OBS, N_ACTIONS, ACT_DIM = 3, 7, 4, 5, 2

# --------------------------------------------------------------------------- helpers


def gae_loop(r, v, nv, done, term, gamma, lmbda):
    """Textbook backward GAE loop over [N, T, 1] tensors, one env and step at a time."""
    adv = torch.zeros_like(r)
    for i in range(r.shape[0]):
        running = 0.0
        for t in reversed(range(r.shape[1])):
            if done[i, t] or term[i, t]:
                running = 0.0
            delta = r[i, t] + gamma * (0.0 if term[i, t] else nv[i, t]) - v[i, t]
            running = delta + gamma * lmbda * running
            adv[i, t] = running
    return adv, adv + v


def make_td(n=N, steps=T, seed=0, values=True) -> TensorDict:
    """A collector-like [n, steps] batch with a termination and a truncation."""
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(n, steps + 1, OBS, generator=g)
    done = torch.rand(n, steps, 1, generator=g) < 0.2
    term = done & (torch.rand(n, steps, 1, generator=g) < 0.5)
    done[0, 2], term[0, 2] = True, True
    done[1, 4], term[1, 4] = True, False
    td = TensorDict(
        {
            keys.OBSERVATION: obs[:, :-1],
            keys.NEXT: {
                "observation": obs[:, 1:],
                "reward": torch.randn(n, steps, 1, generator=g),
                "done": done,
                "terminated": term,
            },
        },
        batch_size=[n, steps],
    )
    if values:
        td.set(keys.STATE_VALUE, torch.randn(n, steps, 1, generator=g))
        td.set(keys.NEXT_STATE_VALUE, torch.randn(n, steps, 1, generator=g))
    return td


def unpack(td):
    return (
        td[keys.REWARD],
        td[keys.STATE_VALUE],
        td[keys.NEXT_STATE_VALUE],
        td[keys.DONE],
        td[keys.TERMINATED],
    )


def value_network(seed=0) -> TensorDictModule:
    torch.manual_seed(seed)
    return TensorDictModule(
        nn.Linear(OBS, 1), in_keys=[keys.OBSERVATION], out_keys=[keys.STATE_VALUE]
    )


def make_actor(kind: str, seed: int, gain: float = 1.0) -> ProbabilisticActor:
    """A tiny ProbabilisticActor: 'categorical', 'normal' or 'tanh_normal'."""
    torch.manual_seed(seed)
    common = dict(return_log_prob=True, log_prob_key=keys.ACTION_LOG_PROB)
    if kind == "categorical":
        net = TensorDictModule(
            nn.Linear(OBS, N_ACTIONS), in_keys=[keys.OBSERVATION], out_keys=[keys.LOGITS]
        )
        return ProbabilisticActor(
            net, in_keys=[keys.LOGITS], out_keys=[keys.ACTION], distribution_class=D.Categorical,
            **common,
        )  # fmt: skip
    linear = nn.Linear(OBS, 2 * ACT_DIM)
    with torch.no_grad():
        linear.weight.mul_(gain)
        linear.bias.mul_(gain)
    net = TensorDictModule(
        nn.Sequential(linear, NormalParamExtractor()),
        in_keys=[keys.OBSERVATION],
        out_keys=[keys.LOC, keys.SCALE],
    )
    dist = D.Normal if kind == "normal" else TanhNormal
    return ProbabilisticActor(
        net, in_keys=[keys.LOC, keys.SCALE], out_keys=[keys.ACTION], distribution_class=dist,
        **common,
    )  # fmt: skip


def rollout(actor, seed=0, per_step=False) -> TensorDict:
    """Act on random observations: step by step (batch [N], stacked) or on [N, T] at once.

    Per-step collection differs from the learner's [N, T] forward pass by GEMM rounding
    (1e-7 on the logits here), so rho can be exactly 1 only for the batched rollout.
    """
    td = make_td(seed=seed)
    with set_interaction_type(InteractionType.RANDOM), torch.no_grad():
        if per_step:
            obs = td[keys.OBSERVATION]
            acted = torch.stack(
                [actor(TensorDict({keys.OBSERVATION: obs[:, t]}, [N])) for t in range(T)], 1
            )
        else:
            acted = actor(td.select(keys.OBSERVATION))
    for key in acted.keys() - {keys.OBSERVATION}:
        td.set(key, acted[key])
    return td


def log_prob_by_hand(kind, actor, obs, action) -> torch.Tensor:
    """log pi(a|x) from the actor's network outputs and the density formula, float64."""
    out = actor.module[0].module(obs)  # the network inside the first stage
    if kind == "categorical":
        logits = out.double()
        return logits.log_softmax(-1).gather(-1, action.unsqueeze(-1)).squeeze(-1)
    loc, scale = (x.double() for x in out)  # NormalParamExtractor's (loc, scale)
    a = action.double()
    x = torch.atanh(a) if kind == "tanh_normal" else a
    log_normal = -0.5 * ((x - loc) / scale) ** 2 - scale.log() - 0.5 * math.log(2 * math.pi)
    jacobian = torch.log1p(-(a**2)) if kind == "tanh_normal" else torch.zeros_like(a)
    return (log_normal - jacobian).sum(-1)


# --------------------------------------------------------------------------- GAE / TD(lambda)


def test_gae_module_matches_textbook_loop():
    td = make_td(seed=1)
    GAE(gamma=0.95, lmbda=0.9)(td)
    adv, target = gae_loop(*unpack(td), 0.95, 0.9)
    torch.testing.assert_close(td[keys.ADVANTAGE], adv)
    torch.testing.assert_close(td[keys.VALUE_TARGET], target)
    assert td[keys.ADVANTAGE].shape == (N, T, 1)


def test_value_network_fills_missing_values_without_grad():
    td = make_td(seed=2, values=False)
    critic = value_network()
    GAE(gamma=0.9, lmbda=0.8, value_network=critic)(td)
    with torch.no_grad():
        v = critic.module(td[keys.OBSERVATION])
        nv = critic.module(td[keys.NEXT_OBSERVATION])
    torch.testing.assert_close(td[keys.STATE_VALUE], v)
    torch.testing.assert_close(td[keys.NEXT_STATE_VALUE], nv)
    adv, _ = gae_loop(td[keys.REWARD], v, nv, td[keys.DONE], td[keys.TERMINATED], 0.9, 0.8)
    torch.testing.assert_close(td[keys.ADVANTAGE], adv)
    assert not any(td[k].requires_grad for k in (keys.ADVANTAGE, keys.STATE_VALUE))


def test_present_values_are_used_unless_recompute_values():
    td = make_td(seed=3)
    stored = td[keys.STATE_VALUE].clone()
    GAE(gamma=0.9, lmbda=0.8, value_network=value_network())(td)
    torch.testing.assert_close(td[keys.STATE_VALUE], stored)
    GAE(gamma=0.9, lmbda=0.8, value_network=value_network(), recompute_values=True)(td)
    assert not torch.allclose(td[keys.STATE_VALUE], stored)


def test_td_lambda_module_writes_only_the_target_and_needs_no_state_value():
    td = make_td(seed=4)
    del td[keys.STATE_VALUE]
    TDLambda(gamma=0.9, lmbda=1.0)(td)
    assert keys.ADVANTAGE not in td
    # lambda = 1 from the definition: discounted rewards to the episode's end + bootstrap
    r, nv, done, term = (
        td[keys.REWARD],
        td[keys.NEXT_STATE_VALUE],
        td[keys.DONE],
        td[keys.TERMINATED],
    )
    expected = torch.zeros_like(r)
    for i in range(N):
        for t in range(T):
            g, k = 0.0, t
            while True:
                g += 0.9 ** (k - t) * r[i, k]
                if done[i, k] or term[i, k] or k == T - 1:
                    g += 0.9 ** (k - t + 1) * (0.0 if term[i, k] else nv[i, k])
                    break
                k += 1
            expected[i, t] = g
    torch.testing.assert_close(td[keys.VALUE_TARGET], expected)


# --------------------------------------------------------------------------- time dim


def test_named_and_explicit_time_dims_agree():
    base = make_td(seed=5)
    GAE(gamma=0.9, lmbda=0.7)(base)  # [N, T], time last by default
    time_first = make_td(seed=5).transpose(0, 1).contiguous()  # [T, N], unnamed

    named = time_first.clone()
    named.refine_names(keys.TIME_DIM_NAME, None)
    GAE(gamma=0.9, lmbda=0.7)(named)
    explicit = GAE(gamma=0.9, lmbda=0.7)(time_first.clone(), time_dim=0)
    from_ctor = GAE(gamma=0.9, lmbda=0.7, time_dim=0)(time_first.clone())
    for out in (named, explicit, from_ctor):
        torch.testing.assert_close(out[keys.ADVANTAGE], base[keys.ADVANTAGE].transpose(0, 1))
    # unnamed [T, N] with no time_dim: read with N as time, as documented
    wrong = GAE(gamma=0.9, lmbda=0.7)(time_first.clone())
    assert not torch.allclose(wrong[keys.ADVANTAGE], explicit[keys.ADVANTAGE])


def test_named_time_dim_wins_over_the_default_and_conflicts_raise():
    td = make_td(seed=6).transpose(0, 1).contiguous()
    td.refine_names(keys.TIME_DIM_NAME, None)
    with pytest.raises(ValueError, match=r"time_dim=1 contradicts the TensorDict's names"):
        GAE(gamma=0.9, lmbda=0.7)(td, time_dim=1)
    with pytest.raises(ValueError, match=r"time_dim=2 is out of range for a TensorDict"):
        GAE(gamma=0.9, lmbda=0.7)(make_td(), time_dim=2)


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "key,match",
    [
        (keys.REWARD, r"\('next', 'reward'\) is missing: the environment/collector writes it"),
        (keys.DONE, r"\('next', 'done'\) is missing: the environment/collector writes it"),
        (keys.TERMINATED, r"\('next', 'terminated'\) is missing"),
        (
            keys.STATE_VALUE,
            r"'state_value' missing and no value_network given: pass value_network=\.\.\. "
            r"or write 'state_value' first",
        ),
        (keys.NEXT_STATE_VALUE, r"\('next', 'state_value'\) missing and no value_network"),
    ],
)
def test_missing_keys_name_the_key_and_its_writer(key, match):
    td = make_td()
    del td[key]
    with pytest.raises(KeyError, match=match):
        GAE(gamma=0.9, lmbda=0.9)(td)


def test_value_network_inputs_and_vtrace_keys_are_checked():
    td = make_td(values=False)
    del td[keys.NEXT_OBSERVATION]
    with pytest.raises(KeyError, match=r"\('next', 'observation'\) is missing: .*value_network"):
        GAE(gamma=0.9, lmbda=0.9, value_network=value_network())(td)
    td = rollout(make_actor("categorical", 0))
    del td[keys.ACTION_LOG_PROB]
    with pytest.raises(KeyError, match=r"'action_log_prob' is missing: .*return_log_prob=True"):
        VTrace(gamma=0.9, actor=make_actor("categorical", 0))(td)


def test_bad_shapes_and_arguments_raise():
    td = make_td()
    td.set(keys.REWARD, td[keys.REWARD].squeeze(-1))
    with pytest.raises(ValueError, match=r"\('next', 'reward'\) has shape \(3, 7\); expected"):
        GAE(gamma=0.9, lmbda=0.9)(td)
    with pytest.raises(ValueError, match=r"gamma must be in \[0, 1\]"):
        GAE(gamma=1.1, lmbda=0.9)
    with pytest.raises(ValueError, match=r"c_clip must be >= 0"):
        VTrace(gamma=0.9, actor=make_actor("categorical", 0), c_clip=-1.0)
    with pytest.raises(TypeError, match=r"actor must have a \.get_dist\(td\) method"):
        VTrace(gamma=0.9, actor=nn.Linear(2, 2))


# --------------------------------------------------------------------------- V-trace rho


def test_on_policy_categorical_rho_is_exactly_one():
    actor = make_actor("categorical", seed=0)
    td = rollout(actor)
    VTrace(gamma=0.9, actor=actor)(td)
    assert td[VTRACE_RHO].shape == (N, T, 1)
    assert torch.equal(td[VTRACE_RHO], torch.ones(N, T, 1))
    # and then V-trace is the lambda = 1 return: GAE(lambda=1)'s target
    _, target = gae_loop(*unpack(td), 0.9, 1.0)
    torch.testing.assert_close(td[keys.VALUE_TARGET], target)


@pytest.mark.parametrize(
    "kind,gain,per_step",
    [
        ("categorical", 1.0, True),
        ("normal", 1.0, False),
        ("normal", 1.0, True),
        ("tanh_normal", 0.3, False),
        ("tanh_normal", 0.3, True),
    ],
)
def test_on_policy_rho_is_one_within_float_rounding(kind, gain, per_step):
    actor = make_actor(kind, seed=0, gain=gain)
    td = rollout(actor, per_step=per_step)
    VTrace(gamma=0.9, actor=actor)(td)
    torch.testing.assert_close(td[VTRACE_RHO], torch.ones(N, T, 1), rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", ["categorical", "normal", "tanh_normal"])
def test_off_policy_rho_is_pi_over_mu_at_the_stored_action(kind):
    behaviour, learner = make_actor(kind, seed=0, gain=0.5), make_actor(kind, seed=1, gain=0.5)
    td = rollout(behaviour, seed=7)
    stored = {
        k: td[k].clone() for k in (keys.ACTION, *((keys.LOC,) if kind != "categorical" else ()))
    }
    VTrace(gamma=0.9, actor=learner)(td)
    obs, action = td[keys.OBSERVATION], td[keys.ACTION]
    with torch.no_grad():
        log_pi = log_prob_by_hand(kind, learner, obs, action)
        log_mu = log_prob_by_hand(kind, behaviour, obs, action)
    expected = (log_pi - log_mu).exp().unsqueeze(-1)
    assert not torch.allclose(expected, torch.ones_like(expected), atol=1e-2)  # off-policy
    torch.testing.assert_close(td[VTRACE_RHO].double(), expected, rtol=1e-4, atol=1e-6)
    for key, value in stored.items():  # the stored action and behaviour params are untouched
        assert torch.equal(td[key], value)


def test_target_actor_is_the_policy_in_rho():
    behaviour, learner = make_actor("categorical", 0), make_actor("categorical", 1)
    td = rollout(behaviour)
    out = VTrace(gamma=0.9, actor=learner, target_actor=behaviour)(td.clone())
    assert torch.equal(out[VTRACE_RHO], torch.ones(N, T, 1))
    out = VTrace(gamma=0.9, actor=learner)(td.clone())
    assert not torch.allclose(out[VTRACE_RHO], torch.ones(N, T, 1))


def test_tanh_normal_scores_actions_at_the_bounds():
    """Stored actions of exactly +-1 (an env-side clamp) still give a finite rho."""
    actor = make_actor("tanh_normal", seed=0, gain=0.3)
    td = rollout(actor)
    td.set(keys.ACTION, td[keys.ACTION].sign())
    VTrace(gamma=0.9, actor=actor)(td)
    assert torch.isfinite(td[VTRACE_RHO]).all() and torch.isfinite(td[keys.ADVANTAGE]).all()


def test_vtrace_module_matches_the_paper_recursion_off_policy():
    """Clipped-rho targets against a textbook loop driven by the rho the module wrote."""
    behaviour, learner = make_actor("categorical", 0), make_actor("categorical", 1)
    td = VTrace(gamma=0.9, actor=learner, lmbda=0.8, c_clip=0.9)(rollout(behaviour, seed=8))
    r, v, nv, done, term = unpack(td)
    rho = td[VTRACE_RHO]
    vs = v.clone()
    for i in range(N):
        acc = 0.0
        for t in reversed(range(T)):
            cut = bool(done[i, t] or term[i, t])
            delta = min(1.0, rho[i, t]) * (
                r[i, t] + 0.9 * (0 if term[i, t] else nv[i, t]) - v[i, t]
            )
            acc = delta + (0.0 if cut else 0.9 * 0.8 * min(0.9, rho[i, t]) * acc)
            vs[i, t] = v[i, t] + acc
    torch.testing.assert_close(td[keys.VALUE_TARGET], vs)
