"""RND-PPO: the bonus, the two-stream GAE, the twin-critic loss, the learner and the recipe.

References are written here: textbook GAE loops, hand-computed arrays, the squared error
recomputed from the two networks' outputs, gradients of a hand-written masked loss.
"""

from __future__ import annotations

import doctest
import shlex

import pytest
import torch

from rlkit.algorithms.rnd import RNDConfig
from rlkit.objectives import rnd as rnd_module
from rlkit.objectives.rnd import RND, ReturnScaler
from rlkit.training import checkpoint as ckpt
from rlkit.value import non_episodic_gae
from rlkit.value.functional import continuing_next_value


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


# --------------------------------------------------------------------------- intrinsic GAE
def _intrinsic_gae(int_r, v_int, last_next_v_int, gamma, lmbda):
    """The intrinsic stream as PolicyGradientLearner.intrinsic_advantage computes it: the
    next value of step t is V_int of step t + 1 (across episode ends), the last step's the
    value of its next observation; no done or terminated is read."""
    col = lambda x: torch.tensor(x, dtype=torch.float32).reshape(1, -1, 1)  # noqa: E731
    value = col(v_int)
    next_value = continuing_next_value(value, col([last_next_v_int]))
    return non_episodic_gae(col(int_r), value, next_value, gamma=gamma, lmbda=lmbda)


def test_intrinsic_gae_runs_across_episode_ends_by_hand():
    # an episode ends at t=1: the intrinsic stream continues into the next episode,
    # bootstrapping from V_int of the *following* observation (8, V_int at the final
    # observation, is never used)
    adv, target = _intrinsic_gae([1, 2, 0, 4], [0, 0, 2, 0], 6, gamma=0.5, lmbda=1.0)
    # next values [V1, V2, V3, 6] = [0, 2, 0, 6]; deltas [1, 3, -2, 7]
    # A3 = 7, A2 = -2 + 3.5 = 1.5, A1 = 3 + .75 = 3.75, A0 = 1 + 1.875 = 2.875
    assert adv.flatten().tolist() == [2.875, 3.75, 1.5, 7.0]
    # lambda = 1: the target is the discounted intrinsic return across the episode end
    assert target.flatten().tolist() == [2.875, 3.75, 3.5, 7.0]


@pytest.mark.parametrize("seed", [0, 1])
def test_intrinsic_gae_against_the_textbook_loop_without_episode_ends(seed):
    g = torch.Generator().manual_seed(seed)
    steps = 12
    int_r, v_int = (torch.randn(steps, generator=g).tolist() for _ in range(2))
    last = float(torch.randn(1, generator=g))
    adv, _ = _intrinsic_gae(int_r, v_int, last, gamma=0.8, lmbda=0.7)
    never = [False] * steps
    expected = textbook_gae(int_r, v_int, v_int[1:] + [last], never, never, 0.8, 0.7)
    torch.testing.assert_close(adv.flatten(), torch.tensor(expected))


def test_non_episodic_gae_with_lambda_zero_is_the_td_error():
    r, v, nv = torch.randn(3, 5, 1), torch.randn(3, 5, 1), torch.randn(3, 5, 1)
    adv, target = non_episodic_gae(r, v, nv, gamma=0.9, lmbda=0.0)
    torch.testing.assert_close(adv, r + 0.9 * nv - v)
    torch.testing.assert_close(target, adv + v)


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
@pytest.mark.ddp_jobs("rnd")  # a shared launch: tests/ddp_shared.py (its flags)
def test_ddp_two_processes_keep_parameters_and_statistics_identical(ddp_jobs):
    run = ddp_jobs["rnd"]
    summary = run.summary()
    assert summary["frames"] == 1024  # 2 ranks x 4 envs x 32 steps x 4 batches
    state = ckpt.load(run.dir / "checkpoints" / "last.pt")["modules"]["intrinsic"]
    state = {k.removeprefix("rnd."): v for k, v in state.items()}
    # both ranks' observations were merged into the statistics
    assert float(state["obs_stats.count"]) == pytest.approx(1024, abs=1e-3)
