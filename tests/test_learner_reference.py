"""Learners against textbook updates written here, on real collected batches.

Each test copies the networks, runs a plain-torch reference of the whole update (estimator
loop, loss, optimiser) on the same batch, and compares parameters afterwards. Wrong wiring
anywhere in a learner (s instead of s' for the bootstrap, an epoch count swapped, the stored
log-prob replaced by a fresh one, the wrong advantage) moves the parameters elsewhere.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from rlkit import keys
from rlkit.data.collector import make_collector
from rlkit.envs import make_env
from rlkit.training.engine import Context, Counters


def _ctx() -> Context:
    fabric = SimpleNamespace(world_size=1, device=torch.device("cpu"))
    return Context(fabric, total_frames=10_000, counters=Counters())


def _time_last(batch, key):
    """``[N, T, ...]`` view of a batch entry whatever the batch's dim order."""
    x = batch.get(key)
    if keys.TIME_DIM_NAME in batch.names and batch.names.index(keys.TIME_DIM_NAME) == 0:
        x = x.transpose(0, 1)
    return x


def _columns(batch):
    """``(obs, next_obs, action, log mu, reward, terminated, done)``, each ``[N, T, ...]``."""
    obs, nxt, action, mu = (
        _time_last(batch, k)
        for k in (keys.OBSERVATION, keys.NEXT_OBSERVATION, keys.ACTION, keys.ACTION_LOG_PROB)
    )
    reward, term, done = (
        _time_last(batch, ("next", k)).squeeze(-1).float() for k in ("reward", "terminated", "done")
    )
    return obs, nxt, action, mu, reward, term, done


def _batch(learner, num_envs: int, steps: int, seed: int = 0, env_id: str = "CartPole-v1"):
    torch.manual_seed(seed)
    env = make_env(env_id, num_envs=num_envs, seed=seed)
    collector = make_collector(env, learner.collect_policy(), frames_per_batch=num_envs * steps)
    it = iter(collector)
    next(it)  # a second batch starts mid-episode: truncation-free but with carried state
    batch = next(it)
    collector.shutdown()
    return env, batch


def _gae_reference(values, next_values, reward, terminated, done, gamma, lmbda):
    """Textbook GAE over ``[N, T]`` (Schulman et al. 2016, eq. 16), done cuts the trace."""
    adv = torch.zeros_like(reward)
    last = torch.zeros(reward.shape[0])
    for t in reversed(range(reward.shape[1])):
        delta = reward[:, t] + gamma * next_values[:, t] * (1 - terminated[:, t]) - values[:, t]
        last = delta + gamma * lmbda * (1 - done[:, t]) * last
        adv[:, t] = last
    return adv, adv + values


def _ppo_reference(actor, critic, batch, *, epochs, lr, clip, gamma, lmbda, vcoef, max_norm):
    obs, nxt, action, old_logp, reward, terminated, done = _columns(batch)
    net_a = actor.module[0].module  # the logits network of a categorical ProbabilisticActor
    net_v = critic.module
    with torch.no_grad():
        v = net_v(obs).squeeze(-1)
        v_next = net_v(nxt).squeeze(-1)
    adv, target = _gae_reference(v, v_next, reward, terminated, done, gamma, lmbda)
    adv, target = adv.reshape(-1), target.reshape(-1)
    obs, action, old_logp = obs.reshape(-1, obs.shape[-1]), action.reshape(-1), old_logp.reshape(-1)
    params = [*net_a.parameters(), *net_v.parameters()]
    opt = torch.optim.Adam(params, lr=lr, eps=1e-5)
    for _ in range(epochs):
        logits = net_a(obs)
        logp = torch.distributions.Categorical(logits=logits).log_prob(action)
        a = (adv - adv.mean()) / (adv.std() + 1e-8)
        ratio = (logp - old_logp).exp()
        pg = -torch.min(ratio * a, ratio.clamp(1 - clip, 1 + clip) * a).mean()
        value = net_v(obs).squeeze(-1)
        vloss = vcoef * 0.5 * (value - target).square().mean()
        opt.zero_grad()
        (pg + vloss).backward()
        torch.nn.utils.clip_grad_norm_(params, max_norm)
        opt.step()
    return net_a, net_v


@pytest.mark.parametrize("epochs", [1, 3])
def test_ppo_learner_equals_a_textbook_ppo_update(epochs):
    from rlkit.algorithms import ppo

    cfg = ppo.PPOConfig(
        num_envs=4,
        rollout_steps=16,
        minibatch_size=64,  # the whole batch: no shuffle to replicate
        epochs=epochs,
        lr=3e-3,
        lr_schedule="constant",
        clip_epsilon_final=None,
        hidden=(16,),
    )
    torch.manual_seed(1)
    env = make_env("CartPole-v1", num_envs=4, seed=0)
    learner = ppo.build(cfg, env)
    _, batch = _batch(learner, 4, 16)
    ref_a, ref_v = _ppo_reference(
        copy.deepcopy(learner.actor),
        copy.deepcopy(learner.critic),
        batch.clone(),
        epochs=epochs,
        lr=cfg.lr,
        clip=cfg.clip_epsilon,
        gamma=cfg.gamma,
        lmbda=cfg.gae_lambda,
        vcoef=cfg.value_coef,
        max_norm=cfg.max_grad_norm,
    )
    learner.update(batch, _ctx())
    got = [*learner.actor.module[0].module.parameters(), *learner.critic.module.parameters()]
    want = [*ref_a.parameters(), *ref_v.parameters()]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)


def _vtrace_reference(v, v_next, reward, terminated, done, rho, *, gamma, rho_bar, c_bar, pg_bar):
    """Espeholt et al. 2018, eq. (1) as a backward loop over ``[N, T]`` (lambda = 1): a done
    step bootstraps from V(s') of its true next observation (times 1 - terminated) and cuts
    the trace; the last step bootstraps from V(s')."""
    n, t_max = reward.shape
    vs = torch.zeros_like(reward)
    acc = torch.zeros(n)  # vs_{t+1} - V(x_{t+1})
    for t in reversed(range(t_max)):
        cont = 1 - done[:, t]
        delta = rho.clamp(max=rho_bar)[:, t] * (
            reward[:, t] + gamma * (1 - terminated[:, t]) * v_next[:, t] - v[:, t]
        )
        acc = delta + gamma * cont * rho.clamp(max=c_bar)[:, t] * acc
        vs[:, t] = v[:, t] + acc
    # v_{s+1} for the policy gradient: the next step's target within a trajectory, else V(s')
    nxt = v_next.clone()
    nxt[:, :-1] = torch.where(done[:, :-1].bool(), v_next[:, :-1], vs[:, 1:])
    pg_adv = rho.clamp(max=pg_bar) * (reward + gamma * (1 - terminated) * nxt - v)
    return vs, pg_adv


def test_impala_learner_equals_a_textbook_vtrace_actor_critic_update():
    from rlkit.algorithms import impala

    cfg = impala.IMPALAConfig(
        num_envs=4, rollout_steps=16, minibatch_size=64, epochs=2, lr=3e-3, hidden=(16,)
    )
    torch.manual_seed(2)
    env = make_env("CartPole-v1", num_envs=4, seed=0)
    learner = impala.build(cfg, env)
    _, batch = _batch(learner, 4, 16, seed=3)
    # an off-policy batch: the behaviour log-probs differ from the learner's policy
    batch.set(keys.ACTION_LOG_PROB, batch.get(keys.ACTION_LOG_PROB) + 0.3 * torch.randn(4, 16))
    net_a = copy.deepcopy(learner.actor.module[0].module)
    net_v = copy.deepcopy(learner.critic.module)
    obs, nxt, action, mu, reward, term, done = _columns(batch)
    params = [*net_a.parameters(), *net_v.parameters()]
    opt = torch.optim.Adam(params, lr=cfg.lr, eps=cfg.adam_eps)
    for _ in range(cfg.epochs):
        dist = torch.distributions.Categorical(logits=net_a(obs))
        logp = dist.log_prob(action)
        v = net_v(obs).squeeze(-1)
        with torch.no_grad():
            v_next = net_v(nxt).squeeze(-1)
            vs, pg_adv = _vtrace_reference(
                v.detach(), v_next, reward, term, done, (logp - mu).exp(),
                gamma=cfg.gamma, rho_bar=cfg.rho_clip, c_bar=cfg.c_clip, pg_bar=cfg.pg_rho_clip,
            )  # fmt: skip
        loss = -(pg_adv * logp).mean() + cfg.value_coef * 0.5 * (v - vs).square().mean()
        loss = loss - cfg.entropy_coef * dist.entropy().mean()  # the default bonus, 0.01
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        opt.step()
    learner.update(batch, _ctx())
    got = [*learner.actor.module[0].module.parameters(), *learner.critic.module.parameters()]
    for g, w in zip(got, params, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)


def test_appo_learner_equals_a_textbook_impact_update():
    """V-trace with the target network's rho, PPO clipping around the target network, then
    the Polyak step of the target (Luo et al. 2020), written out here."""
    from rlkit.algorithms import appo

    cfg = appo.APPOConfig(
        num_envs=4,
        rollout_steps=16,
        minibatch_size=64,
        epochs=2,
        lr=3e-3,
        lr_schedule="constant",
        vtrace_lambda=1.0,
        tau=0.5,
        target_update_freq=1,
        hidden=(16,),
    )
    torch.manual_seed(4)
    env = make_env("CartPole-v1", num_envs=4, seed=0)
    learner = appo.build(cfg, env)
    _, batch = _batch(learner, 4, 16, seed=5)
    batch.set(keys.ACTION_LOG_PROB, batch.get(keys.ACTION_LOG_PROB) + 0.3 * torch.randn(4, 16))
    # the target differs from the actor (as after earlier Polyak steps)
    with torch.no_grad():
        for p in learner.loss.target_actor.module.parameters():
            p.add_(0.05 * torch.randn_like(p))
    net_a = copy.deepcopy(learner.actor.module[0].module)
    net_t = copy.deepcopy(learner.loss.target_actor.module.module[0].module)
    net_v = copy.deepcopy(learner.critic.module)
    obs, nxt, action, mu, reward, term, done = _columns(batch)

    def logp(net):
        return torch.distributions.Categorical(logits=net(obs)).log_prob(action)

    with torch.no_grad():
        target_logp = logp(net_t)
        vs, adv = _vtrace_reference(
            net_v(obs).squeeze(-1), net_v(nxt).squeeze(-1), reward, term, done,
            (target_logp - mu).exp(),
            gamma=cfg.gamma, rho_bar=cfg.rho_clip, c_bar=cfg.c_clip, pg_bar=cfg.pg_rho_clip,
        )  # fmt: skip
    a = ((adv - adv.mean()) / (adv.std() + 1e-8)).reshape(-1)
    params = [*net_a.parameters(), *net_v.parameters()]
    opt = torch.optim.Adam(params, lr=cfg.lr, eps=cfg.adam_eps)
    for _ in range(cfg.epochs):
        ratio = (logp(net_a) - target_logp).exp().reshape(-1)
        eps = cfg.clip_epsilon
        pg = -torch.min(ratio * a, ratio.clamp(1 - eps, 1 + eps) * a).mean()
        vloss = cfg.value_coef * 0.5 * (net_v(obs).squeeze(-1) - vs).square().mean()
        opt.zero_grad()
        (pg + vloss).backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        opt.step()
    with torch.no_grad():  # the target's Polyak step after the batch
        for t, p in zip(net_t.parameters(), net_a.parameters(), strict=True):
            t.mul_(1 - cfg.tau).add_(cfg.tau * p)
    learner.update(batch, _ctx())
    got = [
        *learner.actor.module[0].module.parameters(),
        *learner.critic.module.parameters(),
        *learner.loss.target_actor.module.module[0].module.parameters(),
    ]
    want = [*params, *net_t.parameters()]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)
