"""RND-PPO: the bonus, the two-stream GAE, the twin-critic loss, the learner and the recipe.

References are written here: textbook GAE loops, hand-computed arrays, the squared error
recomputed from the two networks' outputs, gradients of a hand-written masked loss.
"""

from __future__ import annotations

import doctest
import shlex

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.modules import ProbabilisticActor

from rlkit import keys
from rlkit.algorithms.rnd import RNDConfig
from rlkit.modules.rnd_networks import twin_value_critic
from rlkit.objectives import MissingKeyError, PPOLoss
from rlkit.objectives import rnd as rnd_module
from rlkit.objectives.rnd import RND, ReturnScaler, RNDPPOLoss
from rlkit.training import checkpoint as ckpt
from rlkit.value import TwinGAE, non_episodic_gae
from tests.test_subprocess import run_ddp

NEXT_INT_VALUE = (keys.NEXT, keys.INTRINSIC_STATE_VALUE)


# --------------------------------------------------------------------------- references
def textbook_gae(reward, value, next_value, done, terminated, gamma, lmbda):
    """GAE over [T] lists, the loop as written in Schulman et al. 2016 (with episode cuts)."""
    steps = len(reward)
    adv, running = [0.0] * steps, 0.0
    for t in reversed(range(steps)):
        bootstrap = 0.0 if terminated[t] else gamma * next_value[t]
        delta = reward[t] + bootstrap - value[t]
        running = delta + (0.0 if (done[t] or terminated[t]) else gamma * lmbda * running)
        adv[t] = running
    return adv


def twin_batch(ext_r, int_r, v_ext, v_int, next_v_ext, next_v_int, done, terminated):
    """A [1, T] TensorDict with both streams' rewards and both heads' values."""

    def col(x, dtype=torch.float32):
        return torch.tensor(x, dtype=dtype).reshape(1, -1, 1)

    td = TensorDict(
        {
            keys.STATE_VALUE: col(v_ext),
            keys.INTRINSIC_STATE_VALUE: col(v_int),
            "next": {
                "reward": col(ext_r),
                "intrinsic_reward": col(int_r),
                "state_value": col(next_v_ext),
                "intrinsic_state_value": col(next_v_int),
                "done": col(done, torch.bool),
                "terminated": col(terminated, torch.bool),
            },
        },
        batch_size=[1, len(ext_r)],
    )
    return td.refine_names(None, keys.TIME_DIM_NAME)


# --------------------------------------------------------------------------- two-stream GAE
def test_intrinsic_gae_ignores_dones_while_extrinsic_cuts_at_termination():
    # termination at t=1: the extrinsic stream stops there, the intrinsic one continues
    # into the next episode, bootstrapping from V_int of the *following* observation
    td = twin_batch(
        ext_r=[1, 1, 1, 1],
        int_r=[1, 2, 0, 4],
        v_ext=[0, 0, 0, 0],
        v_int=[0, 0, 2, 0],
        next_v_ext=[0, 5, 0, 0],  # 5: the terminal state's value, masked
        next_v_int=[0, 8, 0, 6],  # 8: V_int at the final observation, not used
        done=[False, True, False, False],
        terminated=[False, True, False, False],
    )
    TwinGAE(gamma=0.5, gamma_int=0.5, lmbda=1.0)(td)
    # by hand, gamma 0.5, lambda 1:
    # ext: A3 = 1, A2 = 1 + .5 A3 = 1.5, A1 = 1 (cut), A0 = 1 + .5 A1 = 1.5
    assert td[keys.ADVANTAGE].flatten().tolist() == [1.5, 1.0, 1.5, 1.0]
    # int: next values [V1, V2, V3, 6] = [0, 2, 0, 6]; deltas [1, 3, -2, 7]
    # A3 = 7, A2 = -2 + 3.5 = 1.5, A1 = 3 + .75 = 3.75, A0 = 1 + 1.875 = 2.875
    assert td[keys.INTRINSIC_ADVANTAGE].flatten().tolist() == [2.875, 3.75, 1.5, 7.0]
    # lambda = 1: the target is the discounted intrinsic return across the episode end
    assert td[keys.INTRINSIC_VALUE_TARGET].flatten().tolist() == [2.875, 3.75, 3.5, 7.0]
    assert td[keys.VALUE_TARGET].flatten().tolist() == [1.5, 1.0, 1.5, 1.0]


@pytest.mark.parametrize("seed", [0, 1])
def test_twin_gae_against_textbook_loops_random_episodes(seed):
    g = torch.Generator().manual_seed(seed)
    steps = 12
    rand = lambda: torch.randn(steps, generator=g).tolist()  # noqa: E731
    done = (torch.rand(steps, generator=g) < 0.3).tolist()
    terminated = [d and bool(torch.rand(1, generator=g) < 0.5) for d in done]
    ext_r, int_r, v_ext, v_int, nv_ext, nv_int = (rand() for _ in range(6))
    td = twin_batch(ext_r, int_r, v_ext, v_int, nv_ext, nv_int, done, terminated)
    TwinGAE(gamma=0.9, gamma_int=0.8, lmbda=0.7)(td)
    expected_ext = textbook_gae(ext_r, v_ext, nv_ext, done, terminated, 0.9, 0.7)
    following = v_int[1:] + [nv_int[-1]]
    never = [False] * steps
    expected_int = textbook_gae(int_r, v_int, following, never, never, 0.8, 0.7)
    torch.testing.assert_close(td[keys.ADVANTAGE].flatten(), torch.tensor(expected_ext))
    torch.testing.assert_close(td[keys.INTRINSIC_ADVANTAGE].flatten(), torch.tensor(expected_int))
    # the intrinsic result does not depend on done / terminated at all
    flipped = twin_batch(ext_r, int_r, v_ext, v_int, nv_ext, nv_int, never, never)
    TwinGAE(gamma=0.9, gamma_int=0.8, lmbda=0.7)(flipped)
    torch.testing.assert_close(flipped[keys.INTRINSIC_ADVANTAGE], td[keys.INTRINSIC_ADVANTAGE])


def test_non_episodic_gae_with_lambda_zero_is_the_td_error():
    r, v, nv = torch.randn(3, 5, 1), torch.randn(3, 5, 1), torch.randn(3, 5, 1)
    adv, target = non_episodic_gae(r, v, nv, gamma=0.9, lmbda=0.0)
    torch.testing.assert_close(adv, r + 0.9 * nv - v)
    torch.testing.assert_close(target, adv + v)


def test_twin_gae_missing_intrinsic_reward_names_its_writer():
    td = twin_batch([1], [1], [0], [0], [0], [0], [False], [False])
    del td[keys.INTRINSIC_REWARD]
    with pytest.raises(KeyError, match="intrinsic_reward.*RND.intrinsic_reward"):
        TwinGAE(gamma=0.9, gamma_int=0.9, lmbda=0.9)(td)


# --------------------------------------------------------------------------- the loss
def _actor_and_twin_critic(obs_dim=3, n_actions=2):
    torch.manual_seed(0)
    actor = ProbabilisticActor(
        TensorDictModule(nn.Linear(obs_dim, n_actions), [keys.OBSERVATION], [keys.LOGITS]),
        in_keys=[keys.LOGITS],
        distribution_class=torch.distributions.Categorical,
        return_log_prob=True,
        log_prob_key=keys.ACTION_LOG_PROB,
    )
    critic = twin_value_critic(obs_dim, hidden=(8,))
    return actor, critic


def _loss_batch(actor, n=16):
    g = torch.Generator().manual_seed(1)
    td = TensorDict({keys.OBSERVATION: torch.randn(n, 3, generator=g)}, batch_size=[n])
    with torch.no_grad():
        actor(td)
    td[keys.ACTION_LOG_PROB] = td[keys.ACTION_LOG_PROB] - 0.1 * torch.randn(n, generator=g)
    for key in (
        keys.ADVANTAGE,
        keys.VALUE_TARGET,
        keys.INTRINSIC_ADVANTAGE,
        keys.INTRINSIC_VALUE_TARGET,
    ):
        td[key] = torch.randn(n, 1, generator=g)
    return td


def test_combined_advantage_is_the_weighted_sum_and_drives_the_surrogate():
    actor, critic = _actor_and_twin_critic()
    td = _loss_batch(actor)
    loss = RNDPPOLoss(actor, critic, ext_coef=2.0, int_coef=0.5, normalize_advantage=False)
    by_hand = 2.0 * td[keys.ADVANTAGE] + 0.5 * td[keys.INTRINSIC_ADVANTAGE]
    torch.testing.assert_close(loss.combined_advantage(td), by_hand)
    # the surrogate equals plain PPO's on a batch whose advantage is that sum
    ppo_td = td.clone()
    ppo_td[keys.ADVANTAGE] = by_hand
    ppo = PPOLoss(actor, critic, normalize_advantage=False)
    torch.testing.assert_close(loss(td)["loss_policy"], ppo(ppo_td)["loss_policy"])
    # the batch keeps its own (extrinsic) advantage
    assert not torch.equal(td[keys.ADVANTAGE], by_hand)
    # a different weight changes the loss
    other = RNDPPOLoss(actor, critic, ext_coef=2.0, int_coef=3.0, normalize_advantage=False)
    assert not torch.allclose(other(td)["loss_policy"], loss(td)["loss_policy"])


def test_value_loss_is_the_sum_of_both_heads_regressions():
    actor, critic = _actor_and_twin_critic()
    td = _loss_batch(actor)
    out = RNDPPOLoss(actor, critic, value_coef=0.7)(td)
    with torch.no_grad():
        values = critic(td.select(keys.OBSERVATION))
    ext = 0.5 * (values[keys.STATE_VALUE] - td[keys.VALUE_TARGET]).square().mean()
    intr = 0.5 * (values[keys.INTRINSIC_STATE_VALUE] - td[keys.INTRINSIC_VALUE_TARGET]).square()
    torch.testing.assert_close(out["loss_value"], 0.7 * (ext + intr.mean()))
    torch.testing.assert_close(out["value_loss_intrinsic"], intr.mean())
    # gradient routing: the value loss reaches the critic, not the actor
    out["loss_value"].backward()
    assert all(p.grad is None for p in actor.parameters())
    assert all(p.grad is not None for p in critic.parameters())


def test_loss_bad_input_errors():
    actor, critic = _actor_and_twin_critic()
    with pytest.raises(ValueError, match="ext_coef must be finite and >= 0"):
        RNDPPOLoss(actor, critic, ext_coef=-1.0)
    with pytest.raises(ValueError, match="int_coef must be finite and >= 0"):
        RNDPPOLoss(actor, critic, int_coef=-0.5)
    with pytest.raises(ValueError, match="both 0"):
        RNDPPOLoss(actor, critic, ext_coef=0.0, int_coef=0.0)
    single = TensorDictModule(nn.Linear(3, 1), [keys.OBSERVATION], [keys.STATE_VALUE])
    with pytest.raises(TypeError, match="twin critic"):
        RNDPPOLoss(actor, single)(_loss_batch(actor))  # checked on first use
    td = _loss_batch(actor)
    del td[keys.INTRINSIC_ADVANTAGE]
    with pytest.raises(MissingKeyError, match="intrinsic_advantage.*TwinGAE"):
        RNDPPOLoss(actor, critic)(td)


# --------------------------------------------------------------------------- the bonus
def _rnd(num_envs=2, **kw):
    torch.manual_seed(0)
    return RND((2,), num_envs=num_envs, feature_dim=8, target_hidden=(16,), **kw)


def test_intrinsic_reward_is_the_squared_error_over_the_return_std():
    rnd = _rnd(num_envs=2, predictor_hidden=(16, 16), gamma_int=0.9)
    g = torch.Generator().manual_seed(0)
    first = 3.0 + 2.0 * torch.randn(2, 6, 2, generator=g)
    raw_first = rnd.prediction_error(first)  # before the statistics move: recomputed below
    rnd.intrinsic_reward(first)
    # the observation statistics: data mean / variance (up to the 1e-4 prior pseudo-count)
    flat = first.reshape(-1, 2).double()
    torch.testing.assert_close(rnd.obs_stats.mean, flat.mean(0), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(rnd.obs_stats.var, flat.var(0, correction=0), rtol=1e-4, atol=1e-4)
    # the discounted return per env, R_t = 0.9 R_{t-1} + e_t, computed with the new stats
    del raw_first
    x = ((first - flat.mean(0).float()) / flat.var(0, correction=0).float().sqrt()).clamp(-5, 5)
    with torch.no_grad():
        e = (rnd.predictor(x) - rnd.target(x)).square().sum(-1)
    returns, running = [], torch.zeros(2)
    for t in range(6):
        running = 0.9 * running + e[:, t]
        returns.append(running)
    returns = torch.stack(returns, 1)
    torch.testing.assert_close(rnd.running_return.float(), returns[:, -1], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(
        rnd.return_stats.var.float(), returns.var(correction=0), rtol=1e-3, atol=1e-6
    )
    # a second batch scored without updating: e / sqrt(var(R)), by hand
    second = 3.0 + 2.0 * torch.randn(2, 4, 2, generator=g)
    reward = rnd.intrinsic_reward(second, update_stats=False)
    mean, var = rnd.obs_stats.mean.float(), rnd.obs_stats.var.float()
    x2 = ((second - mean) / (var + 1e-8).sqrt()).clamp(-5, 5)
    with torch.no_grad():
        e2 = (rnd.predictor(x2) - rnd.target(x2)).square().sum(-1)
    expected = e2 / (rnd.return_stats.var.float() + 1e-8).sqrt()
    torch.testing.assert_close(reward.squeeze(-1), expected, rtol=1e-5, atol=1e-6)
    assert reward.shape == (2, 4, 1)


def test_return_scaler_episodic_resets_at_done_non_episodic_does_not():
    reward = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    done = torch.tensor([[False, True, False, False]])
    episodic = ReturnScaler(num_envs=1, gamma=0.5, episodic=True)
    # R: 1, 2 + .5 = 2.5 (done: reset), 3, 4 + 1.5 = 5.5
    assert episodic.returns(reward, done).tolist() == [[1.0, 2.5, 3.0, 5.5]]
    continuing = ReturnScaler(num_envs=1, gamma=0.5, episodic=False)
    # R: 1, 2.5, 3 + 1.25 = 4.25, 4 + 2.125 = 6.125
    assert continuing.returns(reward, done).tolist() == [[1.0, 2.5, 4.25, 6.125]]
    # the running value carries over to the next batch
    assert continuing.returns(torch.tensor([[0.0]])).tolist() == [[3.0625]]
    scaler = ReturnScaler(num_envs=1, gamma=0.5, episodic=True)
    scaled = scaler(reward, done)
    returns = torch.tensor([1.0, 2.5, 3.0, 5.5], dtype=torch.float64)
    std = returns.var(correction=0).sqrt()  # the 1e-4 prior pseudo-count aside
    torch.testing.assert_close(scaled.double(), reward.double() / std, rtol=1e-3, atol=0)
    with pytest.raises(ValueError, match="needs done flags"):
        scaler(reward)


def test_observations_are_clipped_to_obs_clip():
    rnd = _rnd(obs_clip=5.0)
    rnd.obs_stats.update(torch.randn(100, 2))
    x = rnd.normalize(torch.tensor([[1e3, -1e3]]))
    assert x.tolist() == [[5.0, -5.0]]


def test_target_gets_no_gradient_predictor_only_on_the_chosen_fraction():
    rnd = _rnd()
    obs = torch.randn(10, 2)
    mask = torch.tensor([True, False, False, True, False, False, False, True, False, False])
    rnd.predictor_loss(obs, mask=mask).backward()
    assert all(p.grad is None and not p.requires_grad for p in rnd.target.parameters())
    grads = [p.grad.clone() for p in rnd.predictor.parameters()]
    # the hand-written loss over the kept samples only: mean over samples and features
    rnd.predictor.zero_grad(set_to_none=True)
    x = rnd.normalize(obs[mask])
    ((rnd.predictor(x) - rnd.target(x)) ** 2).mean().backward()
    for got, want in zip(grads, (p.grad for p in rnd.predictor.parameters())):
        torch.testing.assert_close(got, want)
    # samples outside the mask do not matter
    moved = obs.clone()
    moved[~mask] += 10.0
    rnd.predictor.zero_grad(set_to_none=True)
    rnd.predictor_loss(moved, mask=mask).backward()
    for got, want in zip(grads, (p.grad for p in rnd.predictor.parameters())):
        torch.testing.assert_close(got, want)


def test_random_mask_keeps_update_proportion_of_the_samples():
    rnd = _rnd(update_proportion=0.25)
    mask = rnd.sample_mask((40_000,), generator=torch.Generator().manual_seed(0))
    assert mask.dtype == torch.bool and abs(mask.float().mean().item() - 0.25) < 0.01
    assert _rnd(update_proportion=1.0).sample_mask((100,)).all()
    # without an explicit mask the loss draws one from the generator
    obs = torch.randn(64, 2)
    drawn = rnd.predictor_loss(obs, generator=torch.Generator().manual_seed(3))
    mask = rnd.sample_mask((64,), generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(drawn, rnd.predictor_loss(obs, mask=mask))


def test_bonus_of_a_familiar_state_drops_below_a_novel_one():
    rnd = _rnd(num_envs=1, predictor_hidden=(32, 32), update_proportion=1.0)
    g = torch.Generator().manual_seed(0)
    familiar = torch.tensor([[0.3, -0.2]])
    novel = torch.tensor([[-2.5, 2.0]])
    rnd.obs_stats.update(torch.randn(1000, 2, generator=g))  # a spread of visited states
    before_familiar = float(rnd.prediction_error(familiar).detach())
    before_novel = float(rnd.prediction_error(novel).detach())
    opt = torch.optim.Adam(rnd.predictor.parameters(), lr=1e-3)
    for _ in range(300):
        batch = familiar + 0.05 * torch.randn(64, 2, generator=g)
        opt.zero_grad()
        rnd.predictor_loss(batch, generator=g).backward()
        opt.step()
    after_familiar = float(rnd.prediction_error(familiar).detach())
    after_novel = float(rnd.prediction_error(novel).detach())
    assert after_familiar < 0.05 * before_familiar
    assert after_familiar < 0.05 * after_novel, (after_familiar, after_novel, before_novel)
    # and the scaled reward orders them the same way
    both = torch.cat([familiar, novel]).unsqueeze(0)  # [1 env, 2 steps, 2]
    reward = rnd.intrinsic_reward(both, update_stats=False).flatten()
    assert reward[0] < reward[1]


def test_rnd_state_dict_round_trip_restores_running_statistics():
    rnd = _rnd(num_envs=3)
    for _ in range(3):
        rnd.intrinsic_reward(torch.randn(3, 5, 2))
    state = rnd.state_dict()
    fresh = _rnd(num_envs=3)
    torch.nn.init.normal_(fresh.predictor[0].weight)
    fresh.load_state_dict(state)
    for name in ("obs_stats", "return_stats"):
        for buf in ("mean", "var", "count"):
            a, b = getattr(getattr(rnd, name), buf), getattr(getattr(fresh, name), buf)
            assert torch.equal(a, b), (name, buf)
    assert torch.equal(fresh.running_return, rnd.running_return)
    assert float(fresh.return_stats.count) > 10  # real statistics, not the prior
    nxt = torch.randn(3, 5, 2)
    torch.testing.assert_close(fresh.intrinsic_reward(nxt), rnd.intrinsic_reward(nxt))


def test_rnd_bad_input_errors():
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match=r"update_proportion must be in \(0, 1\]"):
            RND((2,), num_envs=1, update_proportion=bad)
    for bad in (-0.1, 1.01):
        with pytest.raises(ValueError, match=r"gamma_int must be in \[0, 1\]"):
            RND((2,), num_envs=1, gamma_int=bad)
        with pytest.raises(ValueError, match=r"gamma_int must be in \[0, 1\]"):
            TwinGAE(gamma=0.99, gamma_int=bad, lmbda=0.95)
    with pytest.raises(ValueError, match="num_envs = 2"):
        RND((2,), num_envs=2).intrinsic_reward(torch.randn(3, 4, 2))
    with pytest.raises(ValueError, match=r"observations \[\*, 2\]"):
        RND((2,), num_envs=1).prediction_error(torch.randn(4, 3))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"update_proportion": 0.0}, r"--update-proportion must be in \(0, 1\]"),
        ({"update_proportion": 1.2}, r"--update-proportion must be in \(0, 1\]"),
        ({"gamma_int": 1.5}, r"--gamma-int must be in \[0, 1\]"),
        ({"gamma_int": -0.5}, r"--gamma-int must be in \[0, 1\]"),
        ({"int_coef": -1.0}, "--int-coef must be >= 0"),
        ({"ext_coef": -2.0}, "--ext-coef must be >= 0"),
        ({"ext_coef": 0.0, "int_coef": 0.0}, "both 0"),
    ],
)
def test_config_bad_input_names_the_flag(overrides, message):
    with pytest.raises(ValueError, match=message):
        RNDConfig(**overrides)


def test_docstring_examples_run():
    result = doctest.testmod(rnd_module, extraglobs={"torch": torch})
    assert result.attempted >= 2 and result.failed == 0


# --------------------------------------------------------------------------- the recipe
def _recipe_main():
    """What recipes/rnd.py runs (``recipe("rnd")``), from Python: parse, then train."""
    from rlkit.algorithms import rnd

    return rnd.main


def test_checkpoint_holds_and_restores_the_running_statistics(tmp_path):
    main = _recipe_main()
    common = shlex.split(
        "--num-envs 4 --rollout-steps 32 --minibatch-size 64 --epochs 1 --eval-every 0 "
        "--eval-episodes 1 --progress false --checkpoint-every 0"
    ) + ["--run-dir", str(tmp_path / "run")]
    summary = main([*common, "--total-frames", "256"])
    assert summary["frames"] == 256
    payload = ckpt.load(tmp_path / "run" / "checkpoints" / "last.pt")
    state = payload["modules"]["intrinsic"]  # the RND part (rlkit.objectives.intrinsic)
    # every next observation merged once (plus the 1e-4 prior), one return per frame
    assert float(state["rnd.obs_stats.count"]) == pytest.approx(256, abs=1e-3)
    assert float(state["rnd.return_scaler.stats.count"]) == pytest.approx(256, abs=1e-3)
    assert "intrinsic_optimizer" in payload["optimizers"]
    # resuming restores them and keeps counting from there
    resumed = main([*common, "--total-frames", "384", "--resume", "last"])
    assert resumed["frames"] == 384
    state = ckpt.load(tmp_path / "run" / "checkpoints" / "last.pt")["modules"]["intrinsic"]
    assert float(state["rnd.obs_stats.count"]) == pytest.approx(384, abs=1e-3)
    assert float(state["rnd.return_scaler.stats.count"]) == pytest.approx(384, abs=1e-3)


@pytest.mark.slow
def test_ddp_two_processes_keep_parameters_and_statistics_identical(tmp_path):
    run_dir = tmp_path / "ddp"
    flags = "--total-frames 1024 --num-envs 4 --rollout-steps 32 --minibatch-size 64 "
    flags += "--eval-every 0 --eval-episodes 1 --progress false"
    summary = run_ddp("rnd", run_dir, *flags.split())
    assert summary["frames"] == 1024  # 2 ranks x 4 envs x 32 steps x 4 batches
    state = ckpt.load(run_dir / "checkpoints" / "last.pt")["modules"]["intrinsic"]
    state = {k.removeprefix("rnd."): v for k, v in state.items()}
    # both ranks' observations were merged into the statistics
    assert float(state["obs_stats.count"]) == pytest.approx(1024, abs=1e-3)
