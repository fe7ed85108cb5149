"""IMPALALoss against a textbook V-trace written here (sum form of the paper's eq. 1)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torchrl.modules import ProbabilisticActor

from rlkit import keys
from rlkit.objectives import IMPALALoss, total_loss

N, T, OBS = 3, 6, 4


def reference_vtrace(log_mu, log_pi, r, v, v_next, done, term, *, gamma, lmbda, rho_bar, c_bar, pg):
    """Per-row textbook loops over python floats: v_s by the explicit sum, A_s by its rule."""
    rows, steps = len(r), len(r[0])
    vs = [[0.0] * steps for _ in range(rows)]
    adv = [[0.0] * steps for _ in range(rows)]
    for n in range(rows):
        rho = [math.exp(log_pi[n][t] - log_mu[n][t]) for t in range(steps)]
        delta = [
            min(rho_bar, rho[t])
            * (r[n][t] + gamma * (0.0 if term[n][t] else v_next[n][t]) - v[n][t])
            for t in range(steps)
        ]
        for s in range(steps):
            total, coef = 0.0, 1.0
            for t in range(s, steps):
                total += gamma ** (t - s) * coef * delta[t]
                if done[n][t]:
                    break
                coef *= lmbda * min(c_bar, rho[t])
            vs[n][s] = v[n][s] + total
        for s in range(steps):
            nxt = v_next[n][s] if (done[n][s] or s == steps - 1) else vs[n][s + 1]
            nxt = 0.0 if term[n][s] else nxt
            adv[n][s] = min(pg, rho[s]) * (r[n][s] + gamma * nxt - v[n][s])
    return vs, adv


def discrete_nets(seed=0):
    torch.manual_seed(seed)
    actor = ProbabilisticActor(
        TensorDictModule(torch.nn.Linear(OBS, 2), [keys.OBSERVATION], [keys.LOGITS]),
        in_keys=[keys.LOGITS],
        distribution_class=torch.distributions.Categorical,
        return_log_prob=True,
        log_prob_key=keys.ACTION_LOG_PROB,
    )
    critic = TensorDictModule(torch.nn.Linear(OBS, 1), [keys.OBSERVATION], [keys.STATE_VALUE])
    return actor, critic


def make_batch(behaviour, *, continuous=False, seed=1):
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(N, T, OBS, generator=g)
    td = TensorDict({keys.OBSERVATION: obs}, batch_size=[N, T])
    with torch.no_grad():
        behaviour(td)
    done = torch.zeros(N, T, 1, dtype=torch.bool)
    term = torch.zeros_like(done)
    done[0, 2] = term[0, 2] = True  # termination
    done[1, 3] = True  # truncation: bootstrap from V(next obs)
    # a real trajectory: next observation = the following observation, except at a done step
    nxt = torch.cat([obs[:, 1:], torch.randn(N, 1, OBS, generator=g)], dim=1)
    nxt = torch.where(done, torch.randn(N, T, OBS, generator=g), nxt)
    td.set(keys.NEXT_OBSERVATION, nxt)
    td.set(keys.REWARD, torch.randn(N, T, 1, generator=g))
    td.set(keys.DONE, done)
    td.set(keys.TERMINATED, term)
    return td


def older_policy(actor, scale=0.3):
    """A copy of ``actor`` with perturbed weights: the behaviour policy of a lagged batch."""
    old = copy.deepcopy(actor)
    with torch.no_grad():
        for p in old.parameters():
            p.add_(scale * torch.randn_like(p))
    return old


def by_hand(actor, mu, critic, td):
    """log pi(a), log mu(a) at the stored actions (the two networks' softmax), V(x), V(x')."""
    action = td[keys.ACTION]
    with torch.no_grad():
        logp_pi = torch.log_softmax(actor.module[0].module(td[keys.OBSERVATION]), -1)
        logp_mu = torch.log_softmax(mu.module[0].module(td[keys.OBSERVATION]), -1)
        logp_pi = logp_pi.gather(-1, action.unsqueeze(-1)).squeeze(-1)
        logp_mu = logp_mu.gather(-1, action.unsqueeze(-1)).squeeze(-1)
        v = critic.module(td[keys.OBSERVATION]).squeeze(-1)
        v_next = critic.module(td[keys.NEXT_OBSERVATION]).squeeze(-1)
    return logp_pi, logp_mu, v, v_next


def as_lists(x):
    return x.reshape(N, T).tolist()


@pytest.mark.parametrize("lmbda,rho_bar,c_bar,pg", [(1.0, 1.0, 1.0, 1.0), (0.9, 2.0, 0.5, 1.5)])
def test_rho_and_losses_match_textbook_on_a_lagged_batch(lmbda, rho_bar, c_bar, pg):
    actor, critic = discrete_nets()
    mu = older_policy(actor)
    td = make_batch(mu)
    loss = IMPALALoss(
        actor,
        critic,
        gamma=0.9,
        vtrace_lambda=lmbda,
        rho_clip=rho_bar,
        c_clip=c_bar,
        pg_rho_clip=pg,
        entropy_coef=0.01,
        value_coef=0.5,
    )
    logp_pi, logp_mu, v, v_next = by_hand(actor, mu, critic, td)
    torch.testing.assert_close(td[keys.ACTION_LOG_PROB], logp_mu)  # stored log mu
    vt = loss.vtrace(td)
    torch.testing.assert_close(vt["rho"], (logp_pi - logp_mu).exp())
    assert (vt["rho"] - 1).abs().max() > 0.05  # the lag matters here

    vs, adv = reference_vtrace(
        as_lists(logp_mu),
        as_lists(logp_pi),
        as_lists(td[keys.REWARD]),
        as_lists(v),
        as_lists(v_next),
        as_lists(td[keys.DONE]),
        as_lists(td[keys.TERMINATED]),
        gamma=0.9,
        lmbda=lmbda,
        rho_bar=rho_bar,
        c_bar=c_bar,
        pg=pg,
    )
    vs, adv = torch.tensor(vs), torch.tensor(adv)
    torch.testing.assert_close(vt["value_target"], vs)
    torch.testing.assert_close(vt["advantage"], adv)

    out = loss(td)
    entropy = torch.distributions.Categorical(
        logits=actor.module[0].module(td[keys.OBSERVATION])
    ).entropy()
    torch.testing.assert_close(out["loss_policy"], -(adv * logp_pi).mean())
    torch.testing.assert_close(out["loss_value"], 0.5 * (0.5 * (v - vs) ** 2).mean())
    torch.testing.assert_close(out["loss_entropy"], -0.01 * entropy.mean())
    torch.testing.assert_close(out["rho_mean"], vt["rho"].mean())
    # KL(mu || pi) at the stored actions, Schulman's k3 written out: E_mu[(r - 1) - log r]
    ratio = [
        math.exp(p - m) for p, m in zip(logp_pi.flatten().tolist(), logp_mu.flatten().tolist())
    ]
    k3 = sum((r - 1) - math.log(r) for r in ratio) / len(ratio)
    assert float(out["approx_kl"]) == pytest.approx(k3, rel=1e-5) and k3 > 1e-3


def test_on_policy_batch_has_zero_kl():
    """--lr-schedule kl reads this: no drift before the first gradient step."""
    actor, critic = discrete_nets()
    out = IMPALALoss(actor, critic, gamma=0.9)(make_batch(actor))
    assert float(out["approx_kl"]) == pytest.approx(0.0, abs=1e-7)


def test_on_policy_rho_is_one_and_value_target_is_the_lambda_one_return():
    actor, critic = discrete_nets()
    td = make_batch(actor)
    vt = IMPALALoss(actor, critic, gamma=0.9).vtrace(td)
    torch.testing.assert_close(vt["rho"], torch.ones(N, T))
    # on-policy, rho = c = 1: v_s = sum of discounted rewards to the cut + bootstrap
    r, d, term = td[keys.REWARD].squeeze(-1), td[keys.DONE].squeeze(-1), td[keys.TERMINATED]
    with torch.no_grad():
        v_next = critic.module(td[keys.NEXT_OBSERVATION]).squeeze(-1)
    expected = torch.zeros(N, T)
    for n in range(N):
        g = 0.0
        for t in reversed(range(T)):
            if d[n, t] or t == T - 1:
                g = 0.0 if term[n, t] else float(v_next[n, t])
            g = float(r[n, t]) + 0.9 * g
            expected[n, t] = g
    torch.testing.assert_close(vt["value_target"], expected)


def test_continuous_actions_and_sum_reduction():
    torch.manual_seed(0)
    from rlkit.envs import make_env
    from rlkit.modules import make_actor, make_value

    env = make_env("Pendulum-v1", num_envs=1, seed=0)
    actor = make_actor(env.observation_spec, env.action_spec, hidden=(8,))
    critic = make_value(env.observation_spec, hidden=(8,))
    env.close()
    g = torch.Generator().manual_seed(3)
    td = TensorDict({keys.OBSERVATION: torch.randn(N, T, 3, generator=g)}, batch_size=[N, T])
    mu = older_policy(actor, scale=0.1)
    with torch.no_grad():
        mu(td)
    td.set(keys.NEXT_OBSERVATION, torch.randn(N, T, 3, generator=g))
    td.set(keys.REWARD, torch.randn(N, T, 1, generator=g))
    td.set(keys.DONE, torch.zeros(N, T, 1, dtype=torch.bool))
    td.set(keys.TERMINATED, torch.zeros(N, T, 1, dtype=torch.bool))
    mean_loss = IMPALALoss(actor, critic, entropy_coef=0.0)
    sum_loss = IMPALALoss(actor, critic, entropy_coef=0.0, reduction="sum")
    vt = mean_loss.vtrace(td)
    with torch.no_grad():
        expected_rho = (
            actor.get_dist(td).log_prob(td[keys.ACTION]) - td[keys.ACTION_LOG_PROB]
        ).exp()
    torch.testing.assert_close(vt["rho"], expected_rho.reshape(N, T))
    a, b = mean_loss(td), sum_loss(td)
    for k in ("loss_policy", "loss_value"):
        torch.testing.assert_close(b[k], a[k] * N * T)
    total_loss(a).backward()


def test_gradient_routing():
    actor, critic = discrete_nets()
    td = make_batch(older_policy(actor))
    out = IMPALALoss(actor, critic, entropy_coef=0.01)(td)
    out["loss_value"].backward(retain_graph=True)
    assert all(p.grad is None for p in actor.parameters())
    assert all(p.grad is not None for p in critic.parameters())
    critic.zero_grad()
    (out["loss_policy"] + out["loss_entropy"]).backward()
    assert all(p.grad is not None for p in actor.parameters())
    assert all(p.grad is None or p.grad.abs().sum() == 0 for p in critic.parameters())


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(rho_clip=0.0), "rho_clip must be a number > 0"),
        (dict(c_clip=-1.0), "c_clip must be a number > 0"),
        (dict(pg_rho_clip=0), "pg_rho_clip must be a number > 0"),
        (dict(vtrace_lambda=1.5), r"vtrace lambda must be in \[0, 1\]"),
        (dict(vtrace_lambda=-0.1), r"vtrace lambda must be in \[0, 1\]"),
        (dict(reduction="max"), "reduction must be 'mean' or 'sum'"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    actor, critic = discrete_nets()
    with pytest.raises(ValueError, match=message):
        IMPALALoss(actor, critic, **kwargs)


def test_flattened_batch_and_missing_keys_are_named():
    actor, critic = discrete_nets()
    td = make_batch(actor)
    loss = IMPALALoss(actor, critic)
    with pytest.raises(ValueError, match=r"needs a \[N, T\] batch of trajectories"):
        loss(td.reshape(-1))
    with pytest.raises(KeyError, match="action_log_prob"):
        loss(td.exclude(keys.ACTION_LOG_PROB))


def acme_advantage(vs, rho, r, v, v_next, done, term, *, gamma, lmbda, pg):
    """evorl's / Acme's pg advantage by a loop: inside an episode step s bootstraps from
    lmbda vs[s+1] + (1 - lmbda) V(x_{s+1}), V(x_{s+1}) the critic at the next row's
    observation; at a done step and the last step from V(final obs); terminated: 0."""
    rows, steps = len(r), len(r[0])
    adv = [[0.0] * steps for _ in range(rows)]
    for n in range(rows):
        for s in range(steps):
            if done[n][s] or s == steps - 1:
                boot = v_next[n][s]
            else:
                boot = lmbda * vs[n][s + 1] + (1 - lmbda) * v[n][s + 1]
            boot = 0.0 if term[n][s] else boot
            adv[n][s] = min(pg, rho[n][s]) * (r[n][s] + gamma * boot - v[n][s])
    return adv


def test_acme_adv_mode_matches_textbook_in_the_loss_and_the_estimator():
    from rlkit.value import VTrace

    actor, critic = discrete_nets()
    mu = older_policy(actor)
    td = make_batch(mu)
    kw = dict(gamma=0.9, vtrace_lambda=0.7, rho_clip=1.5, c_clip=0.9, pg_rho_clip=1.2)
    loss = IMPALALoss(actor, critic, **kw, adv_mode="acme")
    official = IMPALALoss(actor, critic, **kw)
    action = td[keys.ACTION]
    with torch.no_grad():
        logp_pi = torch.log_softmax(actor.module[0].module(td[keys.OBSERVATION]), -1)
        logp_pi = logp_pi.gather(-1, action.unsqueeze(-1)).squeeze(-1)
        v = critic.module(td[keys.OBSERVATION]).squeeze(-1)
        v_next = critic.module(td[keys.NEXT_OBSERVATION]).squeeze(-1)
    logp_mu = td[keys.ACTION_LOG_PROB]
    columns = [as_lists(x) for x in (td[keys.REWARD], v, v_next, td[keys.DONE])]
    vs, _ = reference_vtrace(
        as_lists(logp_mu), as_lists(logp_pi), *columns, as_lists(td[keys.TERMINATED]),
        gamma=0.9, lmbda=0.7, rho_bar=1.5, c_bar=0.9, pg=1.2,
    )  # fmt: skip
    rho = as_lists((logp_pi - logp_mu).exp())
    adv = acme_advantage(
        vs, rho, *columns, as_lists(td[keys.TERMINATED]), gamma=0.9, lmbda=0.7, pg=1.2
    )
    adv = torch.tensor(adv)
    vt = loss.vtrace(td)
    torch.testing.assert_close(vt["value_target"], torch.tensor(vs))
    torch.testing.assert_close(vt["advantage"], adv)
    assert (official.vtrace(td)["advantage"] - adv).abs().max() > 1e-3
    torch.testing.assert_close(loss(td)["loss_policy"], -(adv * logp_pi).mean())

    estimator = VTrace(
        gamma=0.9, actor=actor, lmbda=0.7, rho_clip=1.5, c_clip=0.9, pg_rho_clip=1.2,
        adv_mode="acme", value_network=critic,
    )  # fmt: skip
    out = estimator(td.clone())
    torch.testing.assert_close(out[keys.ADVANTAGE].squeeze(-1), adv)


@pytest.mark.parametrize("owner", ["IMPALALoss", "VTrace"])
def test_unknown_adv_mode_is_named(owner):
    from rlkit.value import VTrace

    actor, critic = discrete_nets()
    with pytest.raises(ValueError, match=rf"^{owner}: adv_mode must be 'official' .*'acme'"):
        if owner == "IMPALALoss":
            IMPALALoss(actor, critic, adv_mode="Acme")
        else:
            VTrace(gamma=0.9, actor=actor, adv_mode="Acme")


def test_normalize_advantage_standardises_the_textbook_advantage_in_the_policy_term():
    """normalize_advantage=True: the policy term uses (A - mean A) / (sample std A + 1e-8)
    of the textbook V-trace advantage; the value term and advantage_mean are unchanged."""
    actor, critic = discrete_nets()
    mu = older_policy(actor)
    td = make_batch(mu)
    kw = dict(gamma=0.9, vtrace_lambda=0.95, value_coef=0.5)
    plain, normed = (
        IMPALALoss(actor, critic, **kw),
        IMPALALoss(actor, critic, normalize_advantage=True, **kw),
    )
    logp_pi, logp_mu, v, v_next = by_hand(actor, mu, critic, td)
    _, adv = reference_vtrace(
        *(as_lists(x) for x in (logp_mu, logp_pi, td[keys.REWARD], v, v_next)),
        as_lists(td[keys.DONE]),
        as_lists(td[keys.TERMINATED]),
        gamma=0.9,
        lmbda=0.95,
        rho_bar=1.0,
        c_bar=1.0,
        pg=1.0,
    )
    flat = [a for row in adv for a in row]
    mean = sum(flat) / len(flat)
    std = math.sqrt(sum((a - mean) ** 2 for a in flat) / (len(flat) - 1))
    standard = (torch.tensor(adv) - mean) / (std + 1e-8)
    out, ref = normed(td), plain(td)
    torch.testing.assert_close(out["loss_policy"], -(standard * logp_pi).mean())
    assert not torch.allclose(out["loss_policy"], ref["loss_policy"])
    torch.testing.assert_close(out["loss_value"], ref["loss_value"])
    torch.testing.assert_close(out["advantage_mean"], torch.tensor(mean))


def test_the_impala_recipe_passes_normalize_advantage_to_its_loss():
    """--normalize-advantage reaches IMPALALoss (before, the flag was accepted and ignored);
    the default stays the paper's unnormalised advantage."""
    from rlkit.algorithms.impala import IMPALAConfig, build
    from rlkit.envs import make_env

    env = make_env("CartPole-v1", num_envs=2)
    assert build(IMPALAConfig(), env).loss.normalize_advantage is False
    assert build(IMPALAConfig(normalize_advantage=True), env).loss.normalize_advantage is True
    env.close()
