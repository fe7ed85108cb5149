"""APPOLoss: the ratio over the target network, its reduction to PPO, the Polyak schedule."""

from __future__ import annotations

import pytest
import torch

from rlkit import keys
from rlkit.objectives import APPOLoss, PPOLoss
from rlkit.value import VTrace
from tests.test_objectives_impala import N, T, discrete_nets, make_batch, older_policy


def log_softmax_at(actor, td):
    logits = actor.module[0].module(td[keys.OBSERVATION])
    return torch.log_softmax(logits, -1).gather(-1, td[keys.ACTION].unsqueeze(-1)).squeeze(-1)


def sgd_steps(actor, td, n=3):
    """Move the actor away from where it started (as the epochs of one update do)."""
    opt = torch.optim.SGD(actor.parameters(), lr=0.5)
    for _ in range(n):
        opt.zero_grad()
        (-log_softmax_at(actor, td).mean()).backward()
        opt.step()


def test_tau_one_update_every_step_reduces_to_ppo():
    actor, critic = discrete_nets()
    appo = APPOLoss(actor, critic, tau=1.0, target_update_freq=1, normalize_advantage=False)
    td = make_batch(actor)  # on-policy: mu = the actor = the target network
    VTrace(gamma=0.9, actor=actor, target_actor=appo.target_actor.module, value_network=critic)(td)
    torch.testing.assert_close(td[keys.VTRACE_RHO].squeeze(-1), torch.ones(N, T))
    ppo = PPOLoss(actor, critic, normalize_advantage=False)
    flat = td.reshape(-1)
    for _ in range(2):  # two "learner steps"
        sgd_steps(actor, td)  # the update's gradient steps move pi away from mu
        a, p = appo(flat), ppo(flat)
        for k in ("loss_policy", "approx_kl", "clip_fraction", "ratio_mean", "loss_value"):
            torch.testing.assert_close(a[k], p[k])
        assert float(a["clip_fraction"]) > 0  # the clip is active, so the check is sharp
        assert appo.step_target()  # target <- pi, then a fresh on-policy batch
        for t, s in zip(appo.target_actor.module.parameters(), actor.parameters()):
            torch.testing.assert_close(t, s)
        td = make_batch(actor, seed=7)
        vtrace = VTrace(
            gamma=0.9, actor=actor, target_actor=appo.target_actor.module, value_network=critic
        )
        vtrace(td)
        torch.testing.assert_close(td[keys.VTRACE_RHO].squeeze(-1), torch.ones(N, T))
        flat = td.reshape(-1)


def test_ratio_is_current_over_target_and_rho_is_target_over_behaviour():
    actor, critic = discrete_nets()
    mu = older_policy(actor)  # a lagged behaviour policy
    appo = APPOLoss(actor, critic, tau=0.5, clip_epsilon=0.1, normalize_advantage=False)
    td = make_batch(mu)
    sgd_steps(actor, td)  # current pi != target network != mu
    VTrace(gamma=0.9, actor=actor, target_actor=appo.target_actor.module, value_network=critic)(td)
    with torch.no_grad():
        log_mu = log_softmax_at(mu, td)
        log_target = log_softmax_at(appo.target_actor.module, td)
        log_pi = log_softmax_at(actor, td)
    torch.testing.assert_close(td[keys.VTRACE_RHO].squeeze(-1), (log_target - log_mu).exp())
    flat = td.reshape(-1)
    r = (log_pi - log_target).exp().reshape(-1)
    adv = td[keys.ADVANTAGE].reshape(-1)
    expected = -torch.minimum(r * adv, r.clamp(0.9, 1.1) * adv).mean()
    out = appo(flat)
    torch.testing.assert_close(out["loss_policy"], expected)
    torch.testing.assert_close(out["ratio_mean"], r.mean())
    torch.testing.assert_close(out["rho_mean"], td[keys.VTRACE_RHO].mean())
    torch.testing.assert_close(out["clip_fraction"], ((r - 1).abs() > 0.1).float().mean())

    # the target log-prob recorded once for the batch gives the same loss on minibatches
    appo.record_target_log_prob(td)
    torch.testing.assert_close(td[keys.TARGET_LOG_PROB], log_target)
    recorded = appo(td.reshape(-1)[: N * T // 2])
    torch.testing.assert_close(recorded["loss_policy"], appo(flat[: N * T // 2])["loss_policy"])
    td.set(keys.TARGET_LOG_PROB, log_target + 1.0)  # and the loss really reads it
    shifted = appo(td.reshape(-1))
    torch.testing.assert_close(shifted["ratio_mean"], r.mean() * torch.e**-1)


def test_polyak_update_every_k_learner_steps():
    actor, critic = discrete_nets()
    appo = APPOLoss(actor, critic, tau=0.25, target_update_freq=2)
    expected = [p.detach().clone() for p in actor.parameters()]
    for step in range(1, 7):
        with torch.no_grad():
            for p in actor.parameters():
                p.add_(0.1 * step)
        updated = appo.step_target()
        assert updated == (step % 2 == 0)
        if updated:
            expected = [0.75 * e + 0.25 * p.detach() for e, p in zip(expected, actor.parameters())]
        for t, e in zip(appo.target_actor.module.parameters(), expected):
            torch.testing.assert_close(t, e)
    assert int(appo.target_actor.state_dict()["step_count"]) == 6
    # the target is never trained: not among the loss's parameters
    ids = {id(p) for p in appo.parameters()}
    assert not any(id(p) in ids for p in appo.target_actor.parameters())


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(tau=0.0), r"tau must be in \(0, 1\]"),
        (dict(tau=1.5), r"tau must be in \(0, 1\]"),
        (dict(target_update_freq=0), "target_update_freq must be an int >= 1"),
        (dict(clip_epsilon=0.0), "clip_epsilon must be finite and > 0"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    actor, critic = discrete_nets()
    with pytest.raises(ValueError, match=message):
        APPOLoss(actor, critic, **kwargs)
