"""Intrinsic rewards as a part (``--intrinsic rnd|icm`` on PPO, A2C, PPG and DAAC):

* ICM's bonus and loss against the paper's formulas written out here, and which networks
  each loss term trains;
* the learner learns from ``ext_coef * r_ext + int_coef * r_int`` (``--pretraining``: the
  intrinsic part alone) while the logged returns stay extrinsic, and the bonus trains with an
  optimiser of its own;
* a pretraining checkpoint warm-starts a run without the bonus (``--init-from``);
* refusals in one line.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from tensordict import TensorDict

from rlkit import algorithms, keys
from rlkit.keys import MissingKeyError
from rlkit.objectives.intrinsic import ICM, RNDReward, make_intrinsic
from rlkit.training import checkpoint as ckpt
from rlkit.training import parse_config
from tests.test_flags_property import config_class


def _icm(discrete=True, **kw) -> ICM:
    torch.manual_seed(0)
    return ICM((3,), num_envs=2, action_dim=4 if discrete else 2, discrete=discrete,
               feature_dim=5, hidden=(8,), **kw)  # fmt: skip


def _linear_relu_linear(net, x):
    """The two-layer MLP ``net`` (Linear, ReLU, Linear) written out."""
    first, last = net[0], net[2]
    return torch.relu(x @ first.weight.T + first.bias) @ last.weight.T + last.bias


def test_icm_bonus_is_the_forward_error_over_the_return_std_by_hand():
    icm = _icm(gamma_int=0.9)
    g = torch.Generator().manual_seed(1)
    obs = 2.0 + 3.0 * torch.randn(2, 5, 3, generator=g)
    nxt = obs + torch.randn(2, 5, 3, generator=g)
    action = torch.randint(0, 4, (2, 5), generator=g)
    reward = icm.intrinsic_reward(obs, action, nxt)
    # observation statistics from the next observations (up to the 1e-4 prior pseudo-count)
    flat = nxt.reshape(-1, 3).double()
    mean, var = flat.mean(0).float(), flat.var(0, correction=0).float()
    torch.testing.assert_close(icm.obs_stats.mean.float(), mean, rtol=1e-4, atol=1e-4)

    def phi(s):
        return _linear_relu_linear(icm.encoder, ((s - mean) / var.sqrt()).clamp(-5, 5))

    with torch.no_grad():
        inputs = torch.cat([phi(obs), F.one_hot(action, 4).float()], -1)
        e = 0.5 * (_linear_relu_linear(icm.forward_model, inputs) - phi(nxt)).square().sum(-1)
    returns, running = [], torch.zeros(2)
    for t in range(5):  # R_t = 0.9 R_{t-1} + e_t, never reset
        running = 0.9 * running + e[:, t]
        returns.append(running)
    returns = torch.stack(returns, 1)
    expected = e / (returns.var(correction=0) + 1e-8).sqrt()
    torch.testing.assert_close(reward.squeeze(-1), expected, rtol=2e-3, atol=1e-5)
    assert reward.shape == (2, 5, 1)


@pytest.mark.parametrize("discrete", [True, False])
def test_icm_loss_is_the_papers_weighted_sum_and_trains_the_right_networks(discrete):
    icm = _icm(discrete=discrete, beta=0.25)
    g = torch.Generator().manual_seed(2)
    icm.obs_stats.update(torch.randn(50, 3, generator=g))
    obs, nxt = torch.randn(7, 3, generator=g), torch.randn(7, 3, generator=g)
    action = torch.randint(0, 4, (7,), generator=g) if discrete else torch.randn(7, 2, generator=g)
    td = TensorDict({keys.OBSERVATION: obs, keys.ACTION: action, keys.NEXT_OBSERVATION: nxt}, [7])
    out = icm.bonus_loss(td)
    with torch.no_grad():
        m, s = icm.obs_stats.mean.float(), (icm.obs_stats.var.float() + 1e-8).sqrt()
        phi = _linear_relu_linear(icm.encoder, ((obs - m) / s).clamp(-5, 5))
        phi2 = _linear_relu_linear(icm.encoder, ((nxt - m) / s).clamp(-5, 5))
        pred_a = _linear_relu_linear(icm.inverse, torch.cat([phi, phi2], -1))
        a_in = F.one_hot(action, 4).float() if discrete else action
        if discrete:
            logp = pred_a - pred_a.logsumexp(-1, keepdim=True)
            inverse = -logp[torch.arange(7), action].mean()
        else:
            inverse = (pred_a - action).square().sum(-1).mean()
        fwd = _linear_relu_linear(icm.forward_model, torch.cat([phi, a_in], -1))
        forward = (0.5 * (fwd - phi2).square().sum(-1)).mean()
    torch.testing.assert_close(out["loss_icm_inverse"], 0.75 * inverse, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out["loss_icm_forward"], 0.25 * forward, rtol=1e-5, atol=1e-6)
    # the forward term trains the forward model only; the inverse term the encoder and the
    # inverse model (the encoder learns the features the inverse model needs)
    for term, trained, untouched in [
        ("loss_icm_forward", ["forward_model"], ["encoder", "inverse"]),
        ("loss_icm_inverse", ["encoder", "inverse"], ["forward_model"]),
    ]:
        icm.zero_grad(set_to_none=True)
        icm.bonus_loss(td)[term].backward()
        for name in trained:
            assert all(p.grad is not None for p in getattr(icm, name).parameters()), term
        for name in untouched:
            assert all(p.grad is None for p in getattr(icm, name).parameters()), term


def test_icm_bonus_of_a_learned_transition_drops_below_an_unseen_one():
    icm = _icm()
    g = torch.Generator().manual_seed(3)
    icm.obs_stats.update(torch.randn(500, 3, generator=g))
    seen = torch.tensor([[0.5, -0.5, 0.2]])
    opt = torch.optim.Adam(icm.parameters(), lr=3e-3)
    for _ in range(300):  # action 1 always moves the state by +0.3 in every coordinate
        obs = seen + 0.05 * torch.randn(64, 3, generator=g)
        td = TensorDict(
            {keys.OBSERVATION: obs, keys.ACTION: torch.ones(64, dtype=torch.long),
             keys.NEXT_OBSERVATION: obs + 0.3}, [64])  # fmt: skip
        opt.zero_grad()
        out = icm.bonus_loss(td)
        (out["loss_icm_inverse"] + out["loss_icm_forward"]).backward()
        opt.step()
    phi = icm.features(torch.cat([seen, seen]))
    with torch.no_grad():
        learned = icm.forward_error(phi[:1], torch.tensor([1]), icm.features(seen + 0.3))
        surprising = icm.forward_error(phi[1:], torch.tensor([1]), icm.features(seen - 2.0))
    assert float(learned) < 0.1 * float(surprising)


@pytest.mark.parametrize("kind", ["icm", "rnd"])
def test_the_intrinsic_loss_adds_the_critics_regression_which_trains_only_the_critic(kind):
    torch.manual_seed(0)
    if kind == "icm":
        bonus = _icm(value_coef=0.7)
    else:
        bonus = RNDReward((3,), num_envs=2, value_coef=0.7, feature_dim=4, target_hidden=(8,),
                          predictor_hidden=(8,), update_proportion=1.0)  # fmt: skip
    g = torch.Generator().manual_seed(5)
    obs, nxt = torch.randn(9, 3, generator=g), torch.randn(9, 3, generator=g)
    target = torch.randn(9, 1, generator=g)
    entries = {keys.OBSERVATION: obs, keys.ACTION: torch.randint(0, 4, (9,)),
               keys.NEXT_OBSERVATION: nxt, keys.INTRINSIC_VALUE_TARGET: target}  # fmt: skip
    td = TensorDict(entries, [9])
    out = bonus.loss(td)
    assert set(out.keys()) == {*bonus.bonus_loss.out_keys, "loss_intrinsic_value"}
    with torch.no_grad():
        value = bonus.critic(bonus.normalize(obs))
    expected = 0.7 * 0.5 * (value - target).square().mean()
    torch.testing.assert_close(out["loss_intrinsic_value"], expected)
    bonus.zero_grad(set_to_none=True)
    out["loss_intrinsic_value"].backward()
    grads = {n for n, p in bonus.named_parameters() if p.grad is not None}
    assert grads and all(n.startswith("critic.") for n in grads), grads
    del td[keys.INTRINSIC_VALUE_TARGET]
    with pytest.raises(MissingKeyError, match="intrinsic_value_target"):
        bonus.loss(td)


def test_make_intrinsic_sizes_from_the_env_and_refuses_pixels():
    from rlkit.envs import make_env

    env = make_env("CartPole-v1", num_envs=3)
    icm = make_intrinsic("icm", env)
    assert (icm.action_dim, icm.discrete, icm.num_envs) == (2, True, 3)
    rnd = make_intrinsic("rnd", env)
    assert isinstance(rnd, RNDReward) and rnd.rnd.update_proportion == 0.25
    env.close()
    cont = make_env("Pendulum-v1", num_envs=1)
    icm = make_intrinsic("icm", cont)
    assert (icm.action_dim, icm.discrete) == (1, False)
    cont.close()
    with pytest.raises(ValueError, match="unknown intrinsic reward 'e3b'"):
        make_intrinsic("e3b", make_env("CartPole-v1", num_envs=1))


# --------------------------------------------------------------------------- in a learner
def _config(algo: str, argv: list[str]):
    module = algorithms.load(algo)
    return parse_config(config_class(module), argv, presets=module.PRESETS)


def _learner_and_batch(algo: str, argv: list[str]):
    """A learner built by the recipe's ``build`` and one batch collected by its policy."""
    from rlkit.data.collector import make_collector
    from rlkit.envs import make_env
    from rlkit.training.learner import Context, Counters

    module = algorithms.load(algo)
    cfg = parse_config(config_class(module), argv, presets=module.PRESETS)
    torch.manual_seed(0)
    env = make_env(cfg.env, num_envs=cfg.num_envs, seed=0)
    learner = module.build(cfg, env)
    collector = make_collector(
        env, learner.collect_policy(), frames_per_batch=cfg.batch_size, total_frames=-1
    )
    batch = next(iter(collector))
    fabric = SimpleNamespace(world_size=1, device=torch.device("cpu"))
    ctx = Context(fabric, total_frames=10_000, counters=Counters())
    ctx.generator.manual_seed(0)
    return learner, batch, ctx, collector


SMALL = ["--env", "CartPole-v1", "--num-envs", "2", "--rollout-steps", "16", "--hidden", "16",
         "--minibatch-size", "16", "--epochs", "2"]  # fmt: skip


def _textbook_non_episodic_gae(reward, value, last_next_value, gamma, lmbda):
    """GAE over [N, T] rows ignoring episode ends; V(s_{t+1}) is the next row entry."""
    n, t_max = reward.shape
    adv = torch.zeros(n, t_max)
    for i in range(n):
        running = 0.0
        for t in reversed(range(t_max)):
            nxt = value[i, t + 1] if t + 1 < t_max else last_next_value[i]
            delta = reward[i, t] + gamma * nxt - value[i, t]
            running = delta + gamma * lmbda * running
            adv[i, t] = running
    return adv, adv + value


@pytest.mark.parametrize(
    ("algo", "extra", "ext", "intr"),
    [
        ("ppo", ["--intrinsic", "icm", "--int-coef", "0.3", "--ext-coef", "2"], 2.0, 0.3),
        ("a2c", ["--intrinsic", "rnd", "--gamma-int", "0.9"], 1.0, 0.5),
        ("daac", ["--intrinsic", "icm", "--int-coef", "1"], 1.0, 1.0),
        ("ppg", ["--intrinsic", "rnd", "--pretraining", "true"], 0.0, 0.5),
    ],
)
def test_the_policy_learns_from_both_streams_advantages(algo, extra, ext, intr):
    """A = ext_coef A_ext + int_coef A_int: A_ext from the recipe's own estimator on the
    extrinsic reward, A_int a non-episodic GAE of the bonus's reward and critic."""
    learner, batch, ctx, collector = _learner_and_batch(algo, [*SMALL, *extra])
    bonus, cfg = learner.intrinsic, _config(algo, [*SMALL, *extra])
    reward_before = batch.get(keys.REWARD).clone()
    returns_before = batch.get(keys.EPISODE_RETURN).clone()
    seen = {}
    estimator_forward, bonus_reward = learner.estimator.forward, bonus.intrinsic_reward

    def spy_estimator(td, *args, **kw):
        out = estimator_forward(td, *args, **kw)
        seen["reward"] = td.get(keys.REWARD).clone()  # what the estimator read
        seen["advantage"] = td.get(keys.ADVANTAGE).clone()
        return out

    def spy_bonus(obs, action, next_obs, **kw):
        reward = bonus_reward(obs, action, next_obs, **kw)  # statistics updated
        with torch.no_grad():  # the critic as the learner scores it
            seen["value"] = bonus.value(obs).squeeze(-1)
            seen["last"] = bonus.value(next_obs[:, -1]).squeeze(-1)
        seen["intrinsic"] = reward.squeeze(-1)
        return reward

    learner.estimator.forward, bonus.intrinsic_reward = spy_estimator, spy_bonus
    bonus_before = [p.detach().clone() for p in bonus.parameters() if p.requires_grad]
    others = [o for o in learner.optimizers().values() if o is not learner.intrinsic_optimizer]
    policy_params = {id(p) for o in others for g in o.param_groups for p in g["params"]}
    metrics = learner.update(batch, ctx)
    collector.shutdown()
    r_int = seen["intrinsic"]
    assert bool((r_int >= 0).all()) and float(r_int.sum()) > 0
    torch.testing.assert_close(seen["reward"], reward_before)  # the estimator: extrinsic only
    a_int, target = _textbook_non_episodic_gae(
        r_int, seen["value"], seen["last"], cfg.gamma_int, cfg.gae_lambda
    )
    shape = seen["advantage"].shape
    torch.testing.assert_close(batch.get(keys.INTRINSIC_ADVANTAGE).reshape(2, -1), a_int)
    torch.testing.assert_close(batch.get(keys.INTRINSIC_VALUE_TARGET).reshape(2, -1), target)
    expected = ext * seen["advantage"] + intr * a_int.reshape(shape)
    torch.testing.assert_close(batch.get(keys.ADVANTAGE), expected)
    torch.testing.assert_close(batch.get(keys.EPISODE_RETURN), returns_before)  # still extrinsic
    assert metrics["intrinsic_reward_mean"] == pytest.approx(float(r_int.mean()), rel=1e-5)
    # the bonus and its critic trained, with their own optimiser
    after = [p for p in bonus.parameters() if p.requires_grad]
    assert any(not torch.equal(a, b) for a, b in zip(after, bonus_before, strict=True))
    assert not policy_params & {id(p) for p in after}
    assert "intrinsic" in learner.modules() and "intrinsic_optimizer" in learner.optimizers()


def test_a_pretraining_checkpoint_warm_starts_a_run_without_the_bonus(tmp_path):
    from rlkit.algorithms import ppo
    from rlkit.training.engine import _warm_start

    run = tmp_path / "pre"
    ppo.main([*SMALL, "--total-frames", "64", "--eval-every", "0", "--progress", "false",
              "--intrinsic", "rnd", "--pretraining", "true", "--run-dir", str(run)])  # fmt: skip
    payload = ckpt.load(run / "checkpoints" / "last.pt")
    assert "intrinsic" in payload["modules"] and "intrinsic_optimizer" in payload["optimizers"]
    learner, _, _, collector = _learner_and_batch("ppo", SMALL)
    collector.shutdown()
    _warm_start(run / "checkpoints" / "last.pt", learner)
    for name, value in learner.actor.state_dict().items():
        torch.testing.assert_close(value, payload["modules"]["actor"][name])
    assert learner.intrinsic is None


@pytest.mark.parametrize(
    ("algo", "argv", "message"),
    [
        ("ppo", ["--pretraining", "true"], "add --intrinsic rnd or --intrinsic icm"),
        ("a2c", ["--intrinsic", "icm", "--int-coef", "0"], "set --int-coef > 0"),
        ("ppg", ["--intrinsic", "rnd", "--ext-coef", "0"], "say so with --pretraining"),
        ("daac", ["--intrinsic", "rnd", "--int-coef", "nan"], "--int-coef must be a number"),
        ("ppo", ["--intrinsic", "e3b"], "invalid choice: 'e3b'"),
        ("impala", ["--intrinsic", "rnd"], "unrecognized arguments: --intrinsic"),
    ],
)
def test_bad_intrinsic_flags_are_refused_in_one_line(algo, argv, message, capsys):
    module = algorithms.load(algo)
    with pytest.raises(SystemExit) as exit_info:
        parse_config(config_class(module), argv, presets=module.PRESETS)
    assert exit_info.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and message in err[0], err


@pytest.mark.parametrize("name", ["rnd", "icm"])
def test_a_bonus_resized_to_a_members_rows_is_the_bonus_built_for_them(name):
    """A population member's bonus is built on the env of every member's rows (6 here) and
    resized to its own (2): then it scores a batch of 2 rows as a bonus built for 2 envs
    from the same seed does (same weights, per-env returns from zero)."""
    kwargs = dict(action_dim=2, discrete=True) if name == "icm" else {}
    make = RNDReward if name == "rnd" else ICM
    torch.manual_seed(0)
    resized = make((3,), num_envs=6, **kwargs)
    resized.resize(2)
    torch.manual_seed(0)
    built = make((3,), num_envs=2, **kwargs)
    assert resized.num_envs == 2 and torch.equal(
        resized.return_scaler.running_return, torch.zeros(2, dtype=torch.float64)
    )
    g = torch.Generator().manual_seed(1)
    obs, nxt = torch.randn(2, 5, 3, generator=g), torch.randn(2, 5, 3, generator=g)
    action = torch.randint(0, 2, (2, 5), generator=g)
    for _ in range(2):  # the second batch reads the running returns the first left
        torch.testing.assert_close(
            resized.intrinsic_reward(obs, action, nxt),
            built.intrinsic_reward(obs, action, nxt),
            rtol=0,
            atol=0,
        )
    with pytest.raises(ValueError, match="num_envs must be an int >= 1"):
        resized.resize(0)


def test_rnd_reward_matches_rnd_alone():
    """RNDReward is RND's bonus: the same numbers from the same weights and data."""
    from rlkit.objectives.rnd import RND

    torch.manual_seed(0)
    part = RNDReward((2,), num_envs=2, feature_dim=8, target_hidden=(16,), predictor_hidden=(16,))
    torch.manual_seed(0)
    alone = RND((2,), num_envs=2, feature_dim=8, target_hidden=(16,), predictor_hidden=(16,))
    g = torch.Generator().manual_seed(4)
    nxt = torch.randn(2, 6, 2, generator=g)
    a = part.intrinsic_reward(torch.zeros(2, 6, 2), torch.zeros(2, 6), nxt)
    b = alone.intrinsic_reward(nxt)
    torch.testing.assert_close(a, b)
    assert math.isfinite(float(part.return_scaler.stats.std))
