"""Wiring contracts of the DAAC and RND learners: each test fails when the learner feeds a
loss the wrong tensor or runs a group the wrong number of times.

* RND's bonus and its predictor read s' (the observation the step returned), never s: both
  are checked against references written here from the networks and the textbook formulas
  (running moments with the 1e-4 prior, the discounted intrinsic return, one Adam step).
* DAAC's policy and value groups each step their own optimiser exactly their own epoch
  count (swapping ``--epochs`` and ``--value-epochs`` is caught), and the value group runs
  only every ``--value-freq`` batches, leaving the value network bit-identical otherwise.
* RND's predictor group steps in lockstep with the PPO group, ``--epochs`` x minibatches.
"""

from __future__ import annotations

import copy
import weakref
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rlkit import keys
from rlkit.data.collector import make_collector
from rlkit.envs import make_env
from rlkit.objectives.rnd import RNDPredictorLoss
from rlkit.training.engine import Context, Counters
from rlkit.training.update import update_loop

ROOT = Path(__file__).resolve().parents[1]
SEED = 5
#: the config each RND learner was built from (learners take no config)
CONFIGS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def load_recipe(name: str):
    from rlkit import algorithms

    return algorithms.load(name)


def context() -> Context:
    fabric = SimpleNamespace(world_size=1, device=torch.device("cpu"))
    ctx = Context(fabric, total_frames=10_000, counters=Counters())
    ctx.generator.manual_seed(SEED)
    return ctx


def collect(learner, env, n_batches: int, frames: int) -> list:
    collector = make_collector(env, learner.collect_policy(), frames_per_batch=frames)
    out = []
    for b in collector:
        out.append(b.clone())
        if len(out) == n_batches:
            break
    collector.shutdown()
    return out


def count_steps(optimizer: torch.optim.Optimizer) -> list[int]:
    counter = [0]

    def hook(*_):
        counter[0] += 1

    optimizer.register_step_post_hook(hook)
    return counter


def snapshot(module: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def unchanged(before: list[torch.Tensor], module: torch.nn.Module) -> bool:
    return all(torch.equal(a, b) for a, b in zip(before, module.parameters()))


# --------------------------------------------------------------------------- DAAC
@pytest.fixture(scope="module")
def daac():
    recipe = load_recipe("daac")
    env = make_env("CartPole-v1", num_envs=4, seed=0)

    def learner(*flags: str):
        tiny = ["--num-envs", "4", "--rollout-steps", "16", "--minibatch-size", "32"]
        cfg = recipe.parse_config(recipe.DAACConfig, [*tiny, *flags])
        torch.manual_seed(0)
        return recipe.build(cfg, env)

    batches = collect(learner(), env, 4, 64)
    yield learner, batches
    env.close()


@pytest.mark.parametrize(
    ("freq", "value_batches"), [(1, [1, 1, 1, 1]), (2, [1, 0, 1, 0]), (3, [1, 0, 0, 1])]
)
def test_daac_each_group_steps_its_own_epochs_and_the_value_group_every_value_freq(
    daac, freq, value_batches
):
    # batch 64, minibatch 32: 2 steps per epoch; policy 2 epochs, value 3 epochs
    make, batches = daac
    learner = make("--epochs", "2", "--value-epochs", "3", "--value-freq", str(freq))
    policy_steps = count_steps(learner.optimizer)
    value_steps = count_steps(learner.value_optimizer)
    ctx = context()
    for b, runs_value in zip(batches, value_batches):
        before_policy, before_value = policy_steps[0], value_steps[0]
        critic = snapshot(learner.critic)
        learner.update(b.clone(), ctx)
        assert policy_steps[0] - before_policy == 2 * 2
        assert value_steps[0] - before_value == (3 * 2 if runs_value else 0)
        assert unchanged(critic, learner.critic) == (not runs_value)


def test_daac_groups_carry_the_configured_epochs_and_optimisers(daac):
    make, _ = daac
    learner = make("--epochs", "2", "--value-epochs", "5")
    policy, value = learner.loss_groups()
    assert (policy.loss, policy.optimizer, policy.epochs) == (learner.loss, learner.optimizer, 2)
    assert (value.loss, value.optimizer, value.epochs) == (
        learner.value_loss,
        learner.value_optimizer,
        5,
    )


# --------------------------------------------------------------------------- RND
@pytest.fixture(scope="module")
def rnd():
    recipe = load_recipe("rnd")
    env = make_env("rlkit/MountainCarSparse-v0", num_envs=4, seed=0)

    def learner(*flags: str):
        tiny = ["--num-envs", "4", "--rollout-steps", "16", "--minibatch-size", "64"]
        cfg = recipe.parse_config(recipe.RNDConfig, [*tiny, *flags])
        torch.manual_seed(0)
        built = recipe.build(cfg, env)
        CONFIGS[built] = cfg
        return built

    batches = collect(learner(), env, 2, 64)
    # s and s' differ (beyond one step's drift) so that reading the wrong one is visible
    b = batches[0]
    assert not torch.allclose(b[keys.OBSERVATION], b[keys.NEXT_OBSERVATION], rtol=1e-2)
    yield learner, batches
    env.close()


def merged_moments(x: torch.Tensor, prior: float = 1e-4) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and population variance of ``x`` [n, *] merged with a prior of ``prior``
    pseudo-samples of mean 0 and variance 1 (Chan et al.'s parallel formula)."""
    n = x.shape[0]
    mean_b, var_b = x.mean(0), x.var(0, correction=0)
    total = n + prior
    mean = n * mean_b / total
    var = (prior * 1.0 + n * var_b + mean_b.square() * prior * n / total) / total
    return mean, var


def reference_inputs(next_obs: torch.Tensor, clip: float) -> torch.Tensor:
    """RND's network input for ``next_obs`` [N, T, O], statistics from that batch."""
    x = next_obs.double().reshape(-1, next_obs.shape[-1])
    mean, var = merged_moments(x)
    return ((next_obs.double() - mean) / (var + 1e-8).sqrt()).clamp(-clip, clip).float()


def test_rnd_bonus_scores_next_observations_against_a_reference(rnd):
    make, batches = rnd
    learner = make("--epochs", "1")
    target, predictor = learner.intrinsic.rnd.target, copy.deepcopy(learner.intrinsic.rnd.predictor)
    gamma_int = CONFIGS[learner].gamma_int
    batch = batches[0].clone()
    next_obs = batch[keys.NEXT_OBSERVATION]  # [N envs, T, 2]
    x = reference_inputs(next_obs, CONFIGS[learner].rnd_obs_clip)
    with torch.no_grad():
        e = (predictor(x) - target(x)).square().sum(-1).double()  # [N, T]
    assert e.shape == (4, 16)
    running, returns = torch.zeros(4, dtype=torch.float64), []
    for t in range(e.shape[1]):
        running = gamma_int * running + e[:, t]
        returns.append(running)
    _, var_r = merged_moments(torch.stack(returns, 1).reshape(-1))
    expected = (e / (var_r + 1e-8).sqrt()).float()

    learner.update(batch, context())
    got = batch[keys.INTRINSIC_REWARD].squeeze(-1)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-7)


def test_rnd_predictor_trains_on_next_observations_against_a_reference(rnd):
    # one minibatch (the batch) x 2 epochs: two Adam steps of the masked distillation loss
    # on s', masks drawn from the run's generator (no clipping: the intrinsic group's norm
    # also holds the intrinsic critic's gradient; Adam treats each parameter alone)
    make, batches = rnd
    learner = make("--epochs", "2", "--max-grad-norm", "0")
    cfg = CONFIGS[learner]
    target, predictor = learner.intrinsic.rnd.target, copy.deepcopy(learner.intrinsic.rnd.predictor)
    batch = batches[0].clone()
    x = reference_inputs(batch[keys.NEXT_OBSERVATION], cfg.rnd_obs_clip).reshape(64, -1)
    optimizer = torch.optim.Adam(predictor.parameters(), lr=cfg.lr, eps=cfg.adam_eps)
    generator = torch.Generator().manual_seed(SEED)
    for _ in range(cfg.epochs):
        mask = (torch.rand(64, generator=generator) < cfg.update_proportion).float()
        with torch.no_grad():
            goal = target(x)
        error = (predictor(x) - goal).square().mean(-1)
        optimizer.zero_grad()
        ((error * mask).sum() / mask.sum()).backward()
        optimizer.step()

    before = snapshot(learner.intrinsic.rnd.predictor)
    learner.update(batch, context())
    assert not unchanged(before, learner.intrinsic.rnd.predictor)
    for got, want in zip(learner.intrinsic.rnd.predictor.parameters(), predictor.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_rnd_predictor_loss_declares_and_reads_only_the_next_observation(rnd):
    make, batches = rnd
    learner = make()
    loss = learner.intrinsic.bonus_loss
    assert isinstance(loss, RNDPredictorLoss)
    assert loss.in_keys == [keys.NEXT_OBSERVATION]
    flat = batches[0].reshape(-1)
    mask = torch.rand(64, generator=torch.Generator().manual_seed(1)) < 0.25
    loss.generator = torch.Generator().manual_seed(1)
    got = loss(flat.select(keys.NEXT_OBSERVATION))["loss_predictor"]
    want = learner.intrinsic.rnd.predictor_loss(flat[keys.NEXT_OBSERVATION], mask=mask)
    torch.testing.assert_close(got, want)
    wrong = learner.intrinsic.rnd.predictor_loss(flat[keys.OBSERVATION], mask=mask)
    assert not torch.allclose(got, wrong)


def test_rnd_predictor_group_steps_in_lockstep_with_the_policy_group(rnd):
    # minibatch 32 of 64: 2 steps per epoch, 3 epochs, both optimisers
    make, batches = rnd
    learner = make("--epochs", "3", "--minibatch-size", "32")
    policy_steps = count_steps(learner.optimizer)
    predictor_steps = count_steps(learner.intrinsic_optimizer)
    metrics = learner.update(batches[0].clone(), context())
    assert (policy_steps[0], predictor_steps[0]) == (6, 6)
    assert "loss_predictor" in metrics and "intrinsic_grad_norm" in metrics
    assert "loss_intrinsic_value" in metrics  # the intrinsic critic trains in the same group
    groups = learner.first_phase()
    assert [g.name for g in groups] == ["policy", "intrinsic"]
    assert [g.epochs for g in groups] == [3, 3]


def test_rnd_predictor_group_without_its_key_is_refused(rnd):
    from rlkit.objectives import MissingKeyError

    make, batches = rnd
    learner = make()
    flat = batches[0].reshape(-1).exclude(keys.NEXT_OBSERVATION)
    group = learner.first_phase()[1]
    with pytest.raises(MissingKeyError, match="IntrinsicLoss.*next"):
        update_loop([group], flat, context())
