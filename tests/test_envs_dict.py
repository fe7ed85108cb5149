"""Dict observation spaces (evorl's policy_obs_key / value_obs_key): make_env writes each
entry under its own key, and an actor and a critic built with different ``obs_key`` read
different entries, through the collector, the estimator and a loss."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlkit import keys
from rlkit.data.collector import make_collector
from rlkit.envs import check_same_spaces, make_env, make_eval_env
from rlkit.modules import make_actor, make_value
from rlkit.objectives import PPOLoss
from rlkit.value import GAE


class SplitCartPole(gymnasium.ObservationWrapper):
    """CartPole's observation as {"position": (x, theta), "velocity": (x_dot, theta_dot)}."""

    def __init__(self, env):
        super().__init__(env)
        low, high = env.observation_space.low, env.observation_space.high
        self.observation_space = spaces.Dict(
            {
                "position": spaces.Box(low[[0, 2]], high[[0, 2]], dtype=np.float32),
                "velocity": spaces.Box(low[[1, 3]], high[[1, 3]], dtype=np.float32),
            }
        )

    def observation(self, obs):
        return {"position": obs[[0, 2]], "velocity": obs[[1, 3]]}


def dict_env(num_envs=2, seed=0):
    return make_env("CartPole-v1", num_envs=num_envs, seed=seed, wrappers=[SplitCartPole])


def replay(actions):
    """A policy writing the given actions, one column per step."""
    steps = iter(range(actions.shape[1]))

    def policy(td):
        return td.set(keys.ACTION, actions[:, next(steps)])

    return policy


def test_entries_match_the_plain_env_step_for_step():
    """Same seeds and actions (episodes end and reset within the 40 steps): the entries are
    the flat observation's columns, at the root and under "next"."""
    torch.manual_seed(0)
    actions = torch.randint(0, 2, (2, 40))
    kw = dict(break_when_any_done=False)
    a = dict_env().rollout(40, replay(actions), **kw)
    b = make_env("CartPole-v1", num_envs=2, seed=0).rollout(40, replay(actions), **kw)
    assert b[keys.DONE].any()
    for root in ((), (keys.NEXT,)):
        flat = b[(*root, keys.OBSERVATION)]
        assert torch.equal(a[(*root, "position")], flat[..., [0, 2]])
        assert torch.equal(a[(*root, "velocity")], flat[..., [1, 3]])
    for key in (keys.REWARD, keys.DONE, keys.TERMINATED):
        assert torch.equal(a[key], b[key])


def test_actor_and_critic_read_different_entries():
    env = dict_env(num_envs=4)
    spec = env.observation_spec
    torch.manual_seed(0)
    actor = make_actor(spec, env.action_spec, obs_key="position", hidden=(16,))
    critic = make_value(spec, obs_key="velocity", hidden=(16,))
    assert list(actor.in_keys) == ["position"] and list(critic.in_keys) == ["velocity"]

    collector = make_collector(env, actor, frames_per_batch=64)
    batch = next(iter(collector))
    assert batch.batch_size == (4, 16) and keys.OBSERVATION not in batch

    # the actor's logits come from the positions only, the critic's values from the velocities
    logits_net = actor.module[0].module
    value_net = critic.module
    with torch.no_grad():
        dist = actor.get_dist(batch.select("position"))
        torch.testing.assert_close(
            dist.logits, torch.log_softmax(logits_net(batch["position"]), -1)
        )
        GAE(gamma=0.99, lmbda=0.95, value_network=critic)(batch)
        torch.testing.assert_close(batch[keys.STATE_VALUE], value_net(batch["velocity"]))
        torch.testing.assert_close(
            batch["next", keys.STATE_VALUE], value_net(batch["next", "velocity"])
        )
        # changing the velocities changes no action probability; the positions, no value
        shuffled = batch.clone()
        shuffled["velocity"] = torch.randn_like(batch["velocity"])
        assert torch.equal(actor.get_dist(shuffled.select("position")).logits, dist.logits)

    loss = PPOLoss(actor, critic)
    assert set(loss.in_keys) >= {"position", "velocity"}
    out = loss(batch.reshape(-1))
    out["loss_policy"].backward()
    out["loss_value"].backward()
    critic_grads = [p.grad for p in critic.parameters()]
    assert all(g is not None and g.abs().sum() > 0 for g in critic_grads)
    collector.shutdown()
    env.close()


def test_eval_env_spaces_are_compared_per_entry():
    train, same = dict_env(), make_eval_env("CartPole-v1", seed=1, wrappers=[SplitCartPole])
    check_same_spaces(train, same, train_id="split", eval_id="split")
    plain = make_eval_env("CartPole-v1", seed=1)
    with pytest.raises(ValueError, match=r"observation keys \['position', 'velocity'\] vs"):
        check_same_spaces(train, plain, train_id="split", eval_id="CartPole-v1")


def test_the_envs_page_dict_example_runs(capsys):
    import re
    from pathlib import Path

    page = Path(__file__).resolve().parents[1] / "docs" / "envs.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
    (block,) = [b for b in blocks if "SplitCartPole" in b]
    exec(compile(block, "docs/envs.md", "exec"), {})
    assert capsys.readouterr().out.splitlines() == [
        "['position'] ['velocity'] torch.Size([4, 16, 2]) torch.Size([4, 16, 1])"
    ]


def vtrace_by_hand(mu, logp, reward, value, next_value, done, terminated, *, gamma):
    """Textbook V-trace (Espeholt et al. 2018, eq. 1; rho-bar = c-bar = 1) and the policy
    gradient advantage rho_s (r_s + gamma v_{s+1} - V(x_s)), one row at a time; V(x_{s+1})
    bootstraps at a time-out and at the row's end, nothing at a termination."""
    rho = torch.exp(logp - mu)
    clipped = torch.clamp(rho, max=1.0)
    n, steps = reward.shape
    vs, adv = torch.zeros(n, steps), torch.zeros(n, steps)
    for i in range(n):
        correction = 0.0  # v_{s+1} - V(x_{s+1}) of the step after
        for s in reversed(range(steps)):
            keep = 1.0 - float(terminated[i, s])
            delta = clipped[i, s] * (reward[i, s] + gamma * keep * next_value[i, s] - value[i, s])
            if done[i, s]:
                correction = 0.0
            correction = delta + gamma * clipped[i, s] * correction
            vs[i, s] = value[i, s] + correction
        for s in range(steps):
            last = s == steps - 1 or bool(done[i, s])
            v_next = next_value[i, s] if last else vs[i, s + 1]
            keep = 1.0 - float(terminated[i, s])
            adv[i, s] = clipped[i, s] * (reward[i, s] + gamma * keep * v_next - value[i, s])
    return vs, adv


def test_impala_loss_with_actor_and_critic_on_different_entries():
    """evorl's policy_obs_key / value_obs_key for IMPALA: the actor reads the positions, the
    critic the velocities (and the next velocities to bootstrap); the loss's terms equal a
    textbook V-trace over those networks, and each term reaches only its own network."""
    from rlkit.objectives import IMPALALoss

    env = dict_env(num_envs=3)
    spec = env.observation_spec
    torch.manual_seed(0)
    actor = make_actor(spec, env.action_spec, obs_key="position", hidden=(16,))
    critic = make_value(spec, obs_key="velocity", hidden=(16,))
    collector = make_collector(env, actor, frames_per_batch=3 * 40)
    batch = next(iter(collector))
    collector.shutdown()
    env.close()
    assert batch[keys.DONE].any()  # an episode ends inside the rows (CartPole, 40 steps)
    # an off-policy behaviour: log mu moved away from log pi, so rho varies and gets clipped
    mu = batch[keys.ACTION_LOG_PROB] + 0.5 * torch.randn(batch.shape)
    batch[keys.ACTION_LOG_PROB] = mu

    gamma, entropy_coef = 0.9, 0.01
    loss = IMPALALoss(actor, critic, gamma=gamma, entropy_coef=entropy_coef)
    assert {"position", "velocity", ("next", "velocity")} <= set(loss.in_keys)
    assert keys.OBSERVATION not in loss.in_keys
    out = loss(batch)

    logits_net, value_net = actor.module[0].module, critic.module
    with torch.no_grad():
        log_pi = torch.log_softmax(logits_net(batch["position"]), -1)
        logp = log_pi.gather(-1, batch[keys.ACTION].unsqueeze(-1)).squeeze(-1)
        value = value_net(batch["velocity"]).squeeze(-1)
        next_value = value_net(batch["next", "velocity"]).squeeze(-1)
    vs, adv = vtrace_by_hand(
        mu, logp, batch[keys.REWARD].squeeze(-1), value, next_value,
        batch[keys.DONE].squeeze(-1), batch[keys.TERMINATED].squeeze(-1), gamma=gamma,
    )  # fmt: skip
    assert (torch.exp(logp - mu) > 1).any() and (torch.exp(logp - mu) < 1).any()
    entropy = -(log_pi.exp() * log_pi).sum(-1)
    torch.testing.assert_close(out["loss_policy"], -(adv * logp).mean())
    torch.testing.assert_close(out["loss_value"], 0.5 * (0.5 * (value - vs) ** 2).mean())
    torch.testing.assert_close(out["loss_entropy"], -entropy_coef * entropy.mean())

    # gradient routing: the value term trains the critic only, the policy term the actor only
    actor_params, critic_params = list(actor.parameters()), list(critic.parameters())
    value_grads = torch.autograd.grad(
        out["loss_value"], actor_params + critic_params, retain_graph=True, allow_unused=True
    )
    assert all(g is None for g in value_grads[: len(actor_params)])
    assert all(g is not None and g.abs().sum() > 0 for g in value_grads[len(actor_params) :])
    policy_grads = torch.autograd.grad(
        out["loss_policy"], actor_params + critic_params, allow_unused=True
    )
    assert all(g is None for g in policy_grads[len(actor_params) :])
    assert all(g is not None and g.abs().sum() > 0 for g in policy_grads[: len(actor_params)])
