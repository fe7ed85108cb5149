"""SVPG: the Stein update against hand-computed numbers and a textbook loop, the vmapped
particle ensemble against the particles' own modules, the learner's gradient transform
end to end, routing of envs and evaluation episodes, bad input, and the recipe under DDP."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rlkit import keys
from rlkit.algorithms.svpg import SVPGLearner
from rlkit.modules.particles import (
    ParticlePolicy,
    StackedNetworks,
    particle_ensemble,
    particle_index,
)
from rlkit.objectives.a2c import A2CLoss
from rlkit.objectives.svpg import median_bandwidth, rbf_kernel, stein_update
from rlkit.training.engine import Context, Counters
from rlkit.value import GAE
from tests.test_engine import load_recipe

ROOT = Path(__file__).resolve().parents[1]
E1 = math.exp(-1.0)
E2 = math.exp(-2.0)
LN3 = math.log(3.0)


# --------------------------------------------------------------------------- references
def reference_bandwidth(theta: torch.Tensor) -> float:
    """pyrado / Liu & Wang's svgd.py: numpy median of the full squared-distance matrix."""
    x = theta.double().numpy()
    sq = ((x[:, None, :] - x[None, :, :]) ** 2).sum(-1)
    return float(np.median(sq) / np.log(x.shape[0] + 1))


def reference_phi(theta, grads, *, temperature, h):
    """The SVPG formula as a double loop; grad_{theta_j} k(theta_j, theta_i) by autograd."""
    theta, grads = theta.double(), grads.double()
    p = theta.shape[0]
    phi = torch.zeros_like(theta)
    for i in range(p):
        for j in range(p):
            tj = theta[j].clone().requires_grad_(True)
            k = torch.exp(-((tj - theta[i]) ** 2).sum() / h)
            (dk,) = torch.autograd.grad(k, tj)
            phi[i] += k.detach() * grads[j] / temperature + dk
    return phi / p


# --------------------------------------------------------------------------- the maths
def test_rbf_kernel_two_particles_fixed_bandwidth_by_hand():
    # theta_0 = (0, 0), theta_1 = (1, 2): squared distance 5; h = 2.5 -> k = e^-2
    theta = torch.tensor([[0.0, 0.0], [1.0, 2.0]], dtype=torch.float64)
    kernel, grad_kernel = rbf_kernel(theta, bandwidth=2.5)
    torch.testing.assert_close(kernel, torch.tensor([[1.0, E2], [E2, 1.0]], dtype=torch.float64))
    # sum_j grad_{theta_j} k(theta_j, theta_i) = (2/h) k (theta_i - theta_j) = 0.8 e^-2 (+-1, +-2)
    expected = torch.tensor([[-0.8 * E2, -1.6 * E2], [0.8 * E2, 1.6 * E2]], dtype=torch.float64)
    torch.testing.assert_close(grad_kernel, expected)


def test_median_bandwidth_two_particles_by_hand():
    # squared distances [[0, 5], [5, 0]]: numpy median 2.5 -> h = 2.5 / ln 3, k = 1/9
    theta = torch.tensor([[0.0, 0.0], [1.0, 2.0]], dtype=torch.float64)
    assert float(median_bandwidth(theta)) == pytest.approx(2.5 / LN3, rel=1e-12)
    kernel, grad_kernel = rbf_kernel(theta)
    assert float(kernel[0, 1]) == pytest.approx(1 / 9, rel=1e-12)
    # (2/h) k = (0.8 ln 3) / 9
    c = 0.8 * LN3 / 9
    expected = torch.tensor([[-c, -2 * c], [c, 2 * c]], dtype=torch.float64)
    torch.testing.assert_close(grad_kernel, expected)


def test_stein_update_two_particles_by_hand_fixed_bandwidth():
    # theta = 0 and 1, policy gradients 1 and 3, temperature 2, h = 1: k = e^-1
    theta = torch.tensor([[0.0], [1.0]], dtype=torch.float64)
    grads = torch.tensor([[1.0], [3.0]], dtype=torch.float64)
    phi = stein_update(theta, grads, temperature=2.0, bandwidth=1.0)
    # phi_0 = 1/2 [ (1 * 1 + e^-1 * 3) / 2 + 2 e^-1 (0 - 1) ]
    # phi_1 = 1/2 [ (e^-1 * 1 + 1 * 3) / 2 + 2 e^-1 (1 - 0) ]
    phi0 = 0.5 * ((1 + 3 * E1) / 2 - 2 * E1)
    phi1 = 0.5 * ((E1 + 3) / 2 + 2 * E1)
    assert phi.flatten().tolist() == pytest.approx([phi0, phi1], rel=1e-12)
    assert phi0 == pytest.approx(0.1580, abs=1e-4) and phi1 == pytest.approx(1.2099, abs=1e-4)


def test_stein_update_two_particles_by_hand_median_heuristic():
    # same particles: median of [0, 1, 1, 0] is 1/2 -> h = 1 / (2 ln 3), k = 1/9, 2/h = 4 ln 3
    theta = torch.tensor([[0.0], [1.0]], dtype=torch.float64)
    grads = torch.tensor([[1.0], [3.0]], dtype=torch.float64)
    phi = stein_update(theta, grads, temperature=2.0)
    phi0 = 0.5 * ((1 + 3 / 9) / 2 - 4 * LN3 / 9)
    phi1 = 0.5 * ((1 / 9 + 3) / 2 + 4 * LN3 / 9)
    assert phi.flatten().tolist() == pytest.approx([phi0, phi1], rel=1e-12)


@pytest.mark.parametrize("bandwidth", [None, 0.7])
def test_stein_update_matches_a_textbook_loop(bandwidth):
    gen = torch.Generator().manual_seed(0)
    theta = torch.randn(5, 7, generator=gen, dtype=torch.float64)
    grads = torch.randn(5, 7, generator=gen, dtype=torch.float64)
    h = reference_bandwidth(theta) if bandwidth is None else bandwidth
    expected = reference_phi(theta, grads, temperature=0.3, h=h)
    torch.testing.assert_close(
        stein_update(theta, grads, temperature=0.3, bandwidth=bandwidth), expected
    )
    assert float(median_bandwidth(theta)) == pytest.approx(reference_bandwidth(theta), rel=1e-12)


def test_median_is_numpy_median_for_an_even_count():
    # 4 particles on a line: 16 entries, the two middle ones differ; torch.median would take
    # the lower, numpy (and the reference code) averages them
    theta = torch.tensor([[0.0], [1.0], [3.0], [7.0]], dtype=torch.float64)
    assert float(median_bandwidth(theta)) == pytest.approx(reference_bandwidth(theta), rel=1e-12)
    assert reference_bandwidth(theta) == pytest.approx(((4 + 9) / 2) / math.log(5))


def test_high_temperature_leaves_only_the_kernel_repulsion():
    theta = torch.tensor([[0.0], [1.0]], dtype=torch.float64)
    grads = torch.tensor([[1.0], [3.0]], dtype=torch.float64)
    # the repulsion term alone, by hand (h = 1): 1/2 * 2 e^-1 * (-1, +1)
    limit = torch.tensor([[-E1], [E1]], dtype=torch.float64)
    for temperature in (1e2, 1e4, 1e6):
        phi = stein_update(theta, grads, temperature=temperature, bandwidth=1.0)
        gap = (phi - limit).abs().max()
        # what is left is the driving term, largest for particle 1: (e^-1 * 1 + 3) / 2 / T
        assert float(gap) == pytest.approx((E1 + 3) / 2 / temperature, rel=1e-8)
    assert float(gap) < 2e-6


@pytest.mark.parametrize("bandwidth", [None, 3.0])
def test_single_particle_is_the_policy_gradient_over_the_temperature(bandwidth):
    grads = torch.tensor([[0.5, -2.0, 4.0]], dtype=torch.float64)
    theta = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    for temperature in (0.1, 1.0, 7.0):
        phi = stein_update(theta, grads, temperature=temperature, bandwidth=bandwidth)
        torch.testing.assert_close(phi, grads / temperature, rtol=0, atol=0)


def test_coincident_particles_feel_no_repulsion():
    theta = torch.ones(3, 4)
    kernel, grad_kernel = rbf_kernel(theta)
    assert torch.equal(kernel, torch.ones(3, 3))
    assert torch.equal(grad_kernel, torch.zeros(3, 4))


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(temperature=0.0), ValueError, "temperature must be finite and > 0"),
        (dict(temperature=-1.0), ValueError, "temperature must be finite and > 0"),
        (dict(temperature=math.nan), ValueError, "temperature must be finite and > 0"),
        (dict(temperature="hot"), TypeError, "temperature must be a number"),
        (dict(temperature=1.0, bandwidth=0.0), ValueError, "bandwidth must be finite and > 0"),
        (dict(theta=torch.zeros(3)), ValueError, "must be 2-D"),
        (dict(theta=torch.zeros(0, 3), grads=torch.zeros(0, 3)), ValueError, "at least 1 particle"),
        (dict(grads=torch.zeros(2, 4)), ValueError, "grads has shape"),
        (dict(theta=[[0.0]]), TypeError, "must be a torch.Tensor"),
    ],
)
def test_bad_input_to_the_stein_update(kwargs, error, message):
    args = dict(theta=torch.zeros(2, 3), grads=torch.zeros(2, 3), temperature=1.0) | kwargs
    with pytest.raises(error, match=message):
        stein_update(args.pop("theta"), args.pop("grads"), **args)


def test_bad_particle_counts():
    with pytest.raises(ValueError, match="at least 1 particle"):
        particle_index(4, 0)
    with pytest.raises(ValueError, match="at least 1 particle"):
        StackedNetworks([])
    with pytest.raises(ValueError, match="share one architecture"):
        StackedNetworks([torch.nn.Linear(2, 3), torch.nn.Linear(2, 4)])


# --------------------------------------------------------------------------- the ensemble
@pytest.fixture(scope="module")
def env():
    from rlkit.envs import make_env

    env = make_env("CartPole-v1", num_envs=4, seed=0)
    yield env
    env.close()


def members(env, count: int, *, seed: int = 0):
    from rlkit.modules import make_actor, make_value

    torch.manual_seed(seed)
    actors = [make_actor(env.observation_spec, env.action_spec) for _ in range(count)]
    critics = [make_value(env.observation_spec) for _ in range(count)]
    return actors, critics


def test_particle_index_routes_equal_blocks():
    assert particle_index(8, 4).tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert particle_index(20, 4).tolist() == [i // 5 for i in range(20)]
    assert particle_index(3, 1).tolist() == [0, 0, 0]


@pytest.mark.parametrize("rows", [6, 4, 1])  # P divides rows; uneven rows; a 1-row video
def test_vmapped_forward_equals_each_particles_own_module(env, rows):
    from tensordict import TensorDict

    actors, critics = members(env, 3)
    actor, critic = particle_ensemble(actors), particle_ensemble(critics)
    obs = torch.randn(rows, 5, 4)  # [rows, T, F]: rows are envs
    td = TensorDict({keys.OBSERVATION: obs}, batch_size=[rows, 5])
    logits = actor.get_dist(td.clone()).logits
    values = critic(td.clone()).get(keys.STATE_VALUE)
    owner = [min(r * 3 // rows, 2) for r in range(rows)]
    for r, p in enumerate(owner):
        own = TensorDict({keys.OBSERVATION: obs[r]}, batch_size=[5])
        torch.testing.assert_close(logits[r], actors[p].get_dist(own.clone()).logits)
        torch.testing.assert_close(values[r], critics[p](own.clone()).get(keys.STATE_VALUE))


def test_stacked_parameters_receive_each_particles_own_gradient(env):
    from tensordict import TensorDict

    actors, _ = members(env, 2)
    actor = particle_ensemble(actors)
    obs = torch.randn(4, 4)
    td = TensorDict({keys.OBSERVATION: obs}, batch_size=[4])
    actor.get_dist(td).logits.square().sum().backward()
    stacked = [p for p in actor.parameters()]
    for p in range(2):
        own = TensorDict({keys.OBSERVATION: obs[2 * p : 2 * p + 2]}, batch_size=[2])
        actors[p].get_dist(own).logits.square().sum().backward()
        for s, (_, m) in zip(stacked, actors[p].named_parameters()):
            torch.testing.assert_close(s.grad[p], m.grad)


def test_gaussian_actor_ensemble_matches_its_members():
    from tensordict import TensorDict

    from rlkit.envs import make_env
    from rlkit.modules import make_actor

    pendulum = make_env("Pendulum-v1", num_envs=2, seed=0)
    actors = [make_actor(pendulum.observation_spec, pendulum.action_spec) for _ in range(2)]
    pendulum.close()
    with torch.no_grad():  # distinct log-stds so the tuple output is checked per particle
        actors[1].module[0].module.log_std.fill_(-0.5)
    ensemble = particle_ensemble(actors)
    obs = torch.randn(4, 3)
    dist = ensemble.get_dist(TensorDict({keys.OBSERVATION: obs}, batch_size=[4]))
    for p in range(2):
        own = actors[p].get_dist(TensorDict({keys.OBSERVATION: obs[2 * p : 2 * p + 2]}, [2]))
        torch.testing.assert_close(dist.mean[2 * p : 2 * p + 2], own.mean)
        torch.testing.assert_close(dist.stddev[2 * p : 2 * p + 2], own.stddev)


def test_evaluation_episode_e_runs_particle_e_over_block(env):
    from rlkit.training.evaluation import Evaluator

    actors, _ = members(env, 2, seed=3)
    policy = ParticlePolicy(particle_ensemble(actors))
    evaluator = Evaluator("CartPole-v1", episodes=4)
    together = evaluator.returns(policy)
    alone = [evaluator.returns(a) for a in actors]
    assert together.tolist() == [*alone[0][:2].tolist(), *alone[1][2:].tolist()]


# --------------------------------------------------------------------------- the learner
def context() -> Context:
    fabric = SimpleNamespace(world_size=1, device=torch.device("cpu"))
    return Context(fabric, total_frames=10_000, counters=Counters())


def make_learner(actors, critics, *, temperature, max_grad_norm, lr=1.0):
    actor, critic = particle_ensemble(actors), particle_ensemble(critics)
    optimizer = torch.optim.SGD([*actor.parameters(), *critic.parameters()], lr=lr)
    return SVPGLearner(
        actor=actor,
        critic=critic,
        estimator=GAE(gamma=0.99, lmbda=0.95, value_network=critic),
        loss=A2CLoss(actor, critic),
        optimizer=optimizer,
        frames_per_batch=32,
        temperature=temperature,
        max_grad_norm=max_grad_norm,
    )


def collect(env, policy, frames: int = 32):
    from rlkit.data.collector import VectorEnvCollector

    collector = VectorEnvCollector(env, policy, frames_per_batch=frames)
    batch = next(iter(collector))
    collector.shutdown(close_env=False)
    return batch


def flat(params) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in params])


def own_a2c_grads(actor, critic, block, max_grad_norm):
    """One particle as a plain A2C learner on its own envs: clipped gradients."""
    block = block.clone()
    GAE(gamma=0.99, lmbda=0.95, value_network=critic)(block)
    out = A2CLoss(actor, critic)(block)
    params = [*actor.parameters(), *critic.parameters()]
    for p in params:
        p.grad = None
    sum(v for k, v in out.items() if k.startswith("loss_")).backward()
    torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    return flat(p.grad for p in actor.parameters()), flat(p.grad for p in critic.parameters())


@pytest.mark.parametrize("max_grad_norm", [0.5, 0.0])
def test_update_steps_actors_along_phi_and_critics_along_their_own_a2c_gradient(env, max_grad_norm):
    actors, critics = members(env, 2, seed=1)
    learner = make_learner(actors, critics, temperature=0.5, max_grad_norm=max_grad_norm)
    batch = collect(env, learner.collect_policy())
    assert batch[keys.PARTICLE].tolist() == [[0] * 8, [0] * 8, [1] * 8, [1] * 8]
    actor_nets, critic_nets = learner.actor_nets, learner.critic_nets
    theta0, critic0 = actor_nets.flat_parameters(), critic_nets.flat_parameters()

    learner.update(batch.clone(), context())  # SGD with lr 1: theta <- theta - grad

    clip = max_grad_norm or math.inf
    own = [own_a2c_grads(actors[p], critics[p], batch[2 * p : 2 * p + 2], clip) for p in (0, 1)]
    theta = torch.stack([flat(a.parameters()) for a in actors])
    torch.testing.assert_close(theta, theta0)
    policy_grads = -torch.stack([g for g, _ in own])
    phi = reference_phi(theta, policy_grads, temperature=0.5, h=reference_bandwidth(theta))
    # the actors' .grad after the transform was -phi
    torch.testing.assert_close(
        actor_nets.flat_parameters() - theta0, phi.float(), atol=1e-6, rtol=1e-4
    )
    # critics: their own clipped A2C gradient, not Stein-mixed
    critic_step = torch.stack([-c for _, c in own])
    torch.testing.assert_close(
        critic_nets.flat_parameters() - critic0, critic_step, atol=1e-6, rtol=1e-4
    )


def test_transform_writes_minus_phi_into_the_actor_grads(env):
    actors, critics = members(env, 3, seed=2)
    learner = make_learner(actors, critics, temperature=2.0, max_grad_norm=None)
    nets = learner.actor_nets
    gen = torch.Generator().manual_seed(1)
    for t in [*nets.stacked, *learner.critic_nets.stacked]:
        t.grad = torch.randn(t.shape, generator=gen)
    loss_grads, critic_grads = nets.flat_grads(), learner.critic_nets.flat_grads()
    theta = nets.flat_parameters()
    learner.transform_grads()
    phi = reference_phi(theta, -loss_grads, temperature=2.0, h=reference_bandwidth(theta))
    torch.testing.assert_close(nets.flat_grads(), -phi.float(), atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(learner.critic_nets.flat_grads(), critic_grads, rtol=0, atol=0)
    assert learner.last_transform["kernel_bandwidth"] == pytest.approx(
        reference_bandwidth(theta), rel=1e-5
    )


def test_learner_rejects_bad_settings(env):
    actors, critics = members(env, 2)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        make_learner(actors, critics, temperature=0.0, max_grad_norm=0.5)
    with pytest.raises(ValueError, match="the critic has 1"):
        SVPGLearner(
            actor=particle_ensemble(actors),
            critic=particle_ensemble(critics[:1]),
            estimator=None,
            loss=None,
            optimizer=None,
            frames_per_batch=32,
            temperature=1.0,
        )
    learner = make_learner(actors, critics, temperature=1.0, max_grad_norm=0.5)
    batch = collect(env, learner.collect_policy())
    with pytest.raises(KeyError, match="collect it with learner.collect_policy"):
        learner.update(batch.exclude(keys.PARTICLE), context())


# --------------------------------------------------------------------------- the recipe
@pytest.fixture(scope="module")
def recipe():
    return load_recipe("svpg")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(particles=0), "--particles must be > 0"),
        (dict(temperature=0.0), "--temperature must be > 0"),
        (dict(temperature=-2.0), "--temperature must be > 0"),
        (dict(bandwidth=0.0), "--bandwidth must be > 0"),
        (dict(num_envs=30), "--num-envs 30 is not a multiple of --particles 4: .* use 28"),
        (dict(eval_episodes=10), "--eval-episodes 10 is not a multiple of --particles 4"),
    ],
)
def test_config_rejects_bad_values(recipe, kwargs, message):
    with pytest.raises(ValueError, match=message):
        recipe.SVPGConfig(**kwargs)


def test_short_run_logs_the_stein_diagnostics(recipe, tmp_path):
    summary = recipe.main(
        [
            "--total-frames",
            "640",
            "--eval-every",
            "0",
            "--eval-episodes",
            "4",
            "--progress",
            "false",
            "--run-dir",
            str(tmp_path),
        ]
    )
    assert summary["frames"] == 640 and summary["algo"] == "svpg"
    header = (tmp_path / "metrics.csv").read_text().splitlines()[0].split(",")
    for name in ("kernel_bandwidth", "kernel_offdiag_mean", "drive_norm", "repulsion_norm"):
        assert name in header
    rows = (tmp_path / "metrics.csv").read_text().splitlines()[1:]
    off = [float(r.split(",")[header.index("kernel_offdiag_mean")]) for r in rows]
    # the median heuristic puts the median pair at k = 1 / (P + 1)-ish: strictly inside (0, 1)
    assert all(0.0 < k < 1.0 for k in off)


@pytest.mark.slow
@pytest.mark.ddp_jobs("svpg")  # a shared launch: tests/ddp_shared.py (its flags)
def test_ddp_two_processes_keep_particles_identical_across_ranks(ddp_jobs):
    summary = ddp_jobs["svpg"].summary()
    assert summary["frames"] == 1280  # 2 ranks x 32 envs x 5 steps per batch


@pytest.mark.slow
def test_svpg_learns_cartpole(recipe, tmp_path):
    """Seed 1 of the benchmark: the particles' mean evaluation return reaches 450 (5
    episodes per particle); measured at 80k frames (20k per particle)."""
    summary = recipe.main(
        [
            "--seed",
            "1",
            "--target-return",
            "450",
            "--total-frames",
            "120000",
            "--eval-every",
            "40000",
            "--progress",
            "false",
            "--run-dir",
            str(tmp_path),
        ]
    )
    assert summary["solved"], summary["eval_return_mean"]
    assert summary["eval_return_mean"] >= 450


def test_per_particle_returns_and_load_particle(recipe, tmp_path):
    """eval.csv carries each particle's mean return (episode e of E ran particle
    e // (E / P)), and load_particle(checkpoint, p) gives particle p as a stand-alone actor
    whose evaluation reproduces that particle's column exactly."""
    import csv

    from rlkit.algorithms.svpg import load_particle
    from rlkit.training.evaluation import Evaluator

    recipe.main(
        ["--total-frames", "1280", "--eval-every", "0", "--eval-episodes", "8",
         "--progress", "false", "--run-dir", str(tmp_path)]
    )  # fmt: skip
    with (tmp_path / "eval.csv").open() as f:
        final = list(csv.DictReader(f))[-1]
    columns = [float(final[f"return_particle{p}"]) for p in range(4)]
    assert sum(columns) / 4 == pytest.approx(float(final["return_mean"]))
    checkpoint = tmp_path / "checkpoints" / "last.pt"
    evaluator = Evaluator("CartPole-v1", episodes=8)
    returns = evaluator.returns(load_particle(checkpoint, 2))
    assert float(returns[4:6].mean()) == pytest.approx(columns[2])  # its own two episodes
    actor = load_particle(checkpoint, 0)
    assert type(actor).__name__ == "ProbabilisticActor"
    assert not any("Router" in type(m).__name__ for m in actor.modules())
    with pytest.raises(IndexError, match="0 to 3"):
        load_particle(checkpoint, 4)


# --------------------------------------------------------------------------- PPO particles
def make_ppo_learner(actors, critics, *, temperature, epochs=1, minibatch_size=None, **kw):
    from rlkit.objectives.ppo import PPOLoss

    actor, critic = particle_ensemble(actors), particle_ensemble(critics)
    optimizer = torch.optim.SGD([*actor.parameters(), *critic.parameters()], lr=kw.pop("lr"))
    return SVPGLearner(
        actor=actor,
        critic=critic,
        estimator=GAE(gamma=0.99, lmbda=0.95, value_network=critic),
        loss=PPOLoss(actor, critic, clip_epsilon=0.1, normalize_advantage=False),
        optimizer=optimizer,
        frames_per_batch=32,
        temperature=temperature,
        epochs=epochs,
        minibatch_size=minibatch_size,
        **kw,
    )


def off_policy(batch, seed: int = 0):
    """The batch with its behaviour log-probs moved by up to +-0.3, so that the ratios start
    away from 1 and the clip range (0.1) cuts some of them."""
    batch = batch.clone()
    gen = torch.Generator().manual_seed(seed)
    shift = (torch.rand(batch.shape, generator=gen) - 0.5) * 0.6
    batch[keys.ACTION_LOG_PROB] = batch[keys.ACTION_LOG_PROB] + shift
    return batch


def reference_ppo_loss(actor, critic, block, *, clip=0.1, normalize=False):
    """PPO's clipped surrogate and value regression written out in plain torch on one
    particle's own samples (block: [envs, T], advantages already written)."""
    obs, action = block[keys.OBSERVATION], block[keys.ACTION]
    logits = actor.module[0].module(obs)  # the particle's own network: [envs, T, A]
    log_prob = torch.log_softmax(logits, dim=-1).gather(-1, action.unsqueeze(-1)).squeeze(-1)
    adv = block[keys.ADVANTAGE].squeeze(-1)
    if normalize:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    ratio = torch.exp(log_prob - block[keys.ACTION_LOG_PROB])
    surrogate = torch.min(ratio * adv, torch.clamp(ratio, 1 - clip, 1 + clip) * adv)
    value = critic.module(obs).squeeze(-1)
    target = block[keys.VALUE_TARGET].squeeze(-1)
    return -surrogate.mean() + 0.5 * (0.5 * (value - target) ** 2).mean(), ratio


def with_advantages(actor, critic, block):
    block = block.clone()
    GAE(gamma=0.99, lmbda=0.95, value_network=critic)(block)
    return block


@pytest.mark.parametrize("normalize", [False, True])
def test_one_ppo_particle_at_temperature_1_is_a_plain_ppo_step(env, normalize):
    """One particle: the kernel is 1 and its gradient 0, so phi = grad J / alpha, and with
    alpha = 1 SVPG is its particle algorithm. Two epochs of the clipped surrogate by hand."""
    actors, critics = members(env, 1, seed=4)
    learner = make_ppo_learner(
        actors, critics, temperature=1.0, epochs=2, minibatch_size=32, lr=0.5,
        max_grad_norm=None, normalize_advantage=normalize,
    )  # fmt: skip
    batch = off_policy(collect(env, learner.collect_policy()))
    block = with_advantages(actors[0], critics[0], batch)  # GAE before the first step
    ratios = []
    for _ in range(2):  # the reference: two SGD steps (lr 0.5) on the whole batch
        params = [*actors[0].parameters(), *critics[0].parameters()]
        loss, ratio = reference_ppo_loss(actors[0], critics[0], block, normalize=normalize)
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p -= 0.5 * g
        ratios.append(ratio.detach())
    clipped = ((ratios[0] - 1).abs() > 0.1).float().mean()
    assert 0.2 < float(clipped) < 0.9  # the clip range is doing something

    learner.update(batch.clone(), context())

    torch.testing.assert_close(
        learner.actor_nets.flat_parameters()[0], flat(actors[0].parameters()),
        atol=1e-6, rtol=1e-5,
    )  # fmt: skip
    torch.testing.assert_close(
        learner.critic_nets.flat_parameters()[0], flat(critics[0].parameters()),
        atol=1e-6, rtol=1e-5,
    )  # fmt: skip


def test_stein_step_with_ppo_particles_is_the_kernel_formula_on_their_ppo_gradients(env):
    """Two PPO particles, one step: each actor moves by phi_i = 1/2 sum_j [k_ji grad J_j /
    alpha + grad_j k_ji] (the double loop above) of the hand-written clipped-surrogate
    gradients, each critic by its own value gradient."""
    actors, critics = members(env, 2, seed=5)
    learner = make_ppo_learner(
        actors, critics, temperature=0.5, minibatch_size=16, lr=1.0, max_grad_norm=None
    )
    batch = off_policy(collect(env, learner.collect_policy()), seed=1)
    theta0, critic0 = learner.actor_nets.flat_parameters(), learner.critic_nets.flat_parameters()

    learner.update(batch.clone(), context())

    actor_grads, critic_grads = [], []
    for p in (0, 1):
        block = with_advantages(actors[p], critics[p], batch[2 * p : 2 * p + 2])
        loss, _ = reference_ppo_loss(actors[p], critics[p], block)
        grads = torch.autograd.grad(loss, [*actors[p].parameters(), *critics[p].parameters()])
        n = len(list(actors[p].parameters()))
        actor_grads.append(flat(grads[:n]))
        critic_grads.append(flat(grads[n:]))
    theta = torch.stack([flat(a.parameters()) for a in actors])
    torch.testing.assert_close(theta, theta0)
    phi = reference_phi(
        theta, -torch.stack(actor_grads), temperature=0.5, h=reference_bandwidth(theta)
    )
    torch.testing.assert_close(
        learner.actor_nets.flat_parameters() - theta0, phi.float(), atol=1e-6, rtol=1e-4
    )
    torch.testing.assert_close(
        learner.critic_nets.flat_parameters() - critic0, -torch.stack(critic_grads),
        atol=1e-6, rtol=1e-4,
    )  # fmt: skip


def test_particle_minibatches_take_equal_shares_of_each_particles_own_samples(env):
    from tensordict import TensorDict

    actors, critics = members(env, 2)
    learner = make_ppo_learner(actors, critics, temperature=1.0, minibatch_size=3, lr=1.0)
    rows = torch.arange(4 * 5).reshape(4, 5)  # 4 envs x 5 steps: envs 0-1 are particle 0
    data = TensorDict({"row": rows}, batch_size=[4, 5])
    chunks = list(learner.particle_minibatches(data, torch.Generator().manual_seed(0)))
    assert [c.shape[0] for c in chunks] == [6, 6, 6, 2]  # 3 + 3 per step, last 1 + 1
    seen = {0: [], 1: []}
    for c in chunks:
        half = c.shape[0] // 2
        for p, block in enumerate((c["row"][:half], c["row"][half:])):
            assert all(int(r) // 10 == p for r in block)  # particle p's own rows only
            seen[p] += block.tolist()
    assert sorted(seen[0]) == list(range(10)) and sorted(seen[1]) == list(range(10, 20))
    again = list(learner.particle_minibatches(data, torch.Generator().manual_seed(0)))
    assert all(torch.equal(a["row"], b["row"]) for a, b in zip(chunks, again))


# --------------------------------------------------------------------------- particle files
@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory):
    """A short run with PPO particles, a periodic checkpoint and the best snapshot."""
    from rlkit.algorithms.svpg import main

    run_dir = tmp_path_factory.mktemp("svpg-ppo")
    main(
        ["--particle", "ppo", "--epochs", "2", "--minibatch-size", "20", "--total-frames",
         "640", "--checkpoint-every", "320", "--snapshot-best", "true", "--eval-every", "320",
         "--eval-episodes", "4", "--progress", "false", "--run-dir", str(run_dir)]
    )  # fmt: skip
    return run_dir


def test_one_file_per_particle_with_each_checkpoint(ppo_run):
    from rlkit.algorithms.svpg import PARTICLE_FORMAT, particle_file

    assert particle_file("last", 2) == "particles/particle_2.pt"
    for checkpoint in ("last", "best", "frames_000000000320", "frames_000000000640"):
        assert (ppo_run / "checkpoints" / f"{checkpoint}.pt").is_file()
        for p in range(4):
            path = ppo_run / particle_file(checkpoint, p)
            payload = torch.load(path, weights_only=True)  # tensors and plain containers only
            assert payload["format"] == PARTICLE_FORMAT and payload["index"] == p
            assert payload["config"]["particle"] == "ppo"
    assert not list((ppo_run / "particles").rglob("*.tmp"))  # written through atomic_save


def test_each_particle_file_reproduces_its_particle_of_the_ensemble(ppo_run):
    from tensordict import TensorDict

    from rlkit.algorithms.svpg import build, load_particle
    from rlkit.configs.base import stored_fields
    from rlkit.configs.svpg import SVPGConfig
    from rlkit.envs import make_env
    from rlkit.training import checkpoint as ckpt

    payload = ckpt.load(ppo_run / "checkpoints" / "last.pt")
    cfg = SVPGConfig(**stored_fields(payload["config"], SVPGConfig))
    cartpole = make_env("CartPole-v1", num_envs=4)
    learner = build(cfg, cartpole)
    cartpole.close()
    for name, module in learner.modules().items():
        module.load_state_dict(payload["modules"][name])
    obs = torch.randn(8, 4)  # rows 2p, 2p + 1 are particle p's
    torch.manual_seed(0)
    ensemble = learner.collect_policy()(TensorDict({keys.OBSERVATION: obs}, batch_size=[8]))
    for p in range(4):
        actor = load_particle(ppo_run / "particles" / f"particle_{p}.pt")
        rows = slice(2 * p, 2 * p + 2)
        own = TensorDict({keys.OBSERVATION: obs[rows]}, batch_size=[2])
        dist = actor.get_dist(own)
        torch.testing.assert_close(
            dist.log_prob(ensemble[keys.ACTION][rows]), ensemble[keys.ACTION_LOG_PROB][rows],
            rtol=0, atol=1e-6,
        )  # fmt: skip
        greedy = learner.actor.get_dist(TensorDict({keys.OBSERVATION: obs}, [8])).logits
        assert torch.equal(dist.logits.argmax(-1), greedy[rows].argmax(-1))
        assert type(actor).__name__ == "ProbabilisticActor"
    with pytest.raises(ValueError, match="holds particle 1, not 3"):
        load_particle(ppo_run / "particles" / "particle_1.pt", 3)


def test_a_corrupt_or_foreign_particle_file_gives_a_clear_error(ppo_run, tmp_path):
    import pickle

    from rlkit.algorithms.svpg import load_particle
    from rlkit.training.errors import CheckpointError

    good = (ppo_run / "particles" / "particle_0.pt").read_bytes()
    truncated = tmp_path / "particle_0.pt"
    truncated.write_bytes(good[: len(good) // 2])
    with pytest.raises(CheckpointError, match="corrupt or not a safe rlkit SVPG file"):
        load_particle(truncated)
    unsafe = tmp_path / "unsafe.pt"  # a pickled object: refused by weights_only, never run
    unsafe.write_bytes(pickle.dumps(SimpleNamespace(actor=1), protocol=2))
    with pytest.raises(CheckpointError, match="corrupt or not a safe rlkit SVPG file"):
        load_particle(unsafe)
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(3)}, foreign)
    with pytest.raises(CheckpointError, match="neither an SVPG particle file"):
        load_particle(foreign)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_particle(tmp_path / "missing.pt")
    with pytest.raises(TypeError, match="name the particle"):
        load_particle(ppo_run / "checkpoints" / "last.pt")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(clip_epsilon=0.1), "--clip-epsilon belongs to PPO particles.* --particle ppo"),
        (dict(minibatch_size=16), "--minibatch-size belongs to PPO particles"),
        (dict(particle="ppo", minibatch_size=41), "larger than a particle's batch .* = 40"),
        (dict(particle="ppo", clip_epsilon=0.0), "--clip-epsilon must be > 0"),
        # the choices of every field are checked first (rlkit.configs.base.check_field_types)
        (dict(particle="trpo"), "--particle must be one of a2c, ppo, got 'trpo'"),
    ],
)
def test_config_refuses_ppo_flags_without_ppo_particles(recipe, kwargs, message):
    with pytest.raises(ValueError, match=message):
        recipe.SVPGConfig(**kwargs)


def test_particle_flags_pick_the_loss(recipe):
    from rlkit.algorithms.svpg import particle_loss
    from rlkit.objectives.ppo import PPOLoss

    actors, critics = members(make_env_for_specs(), 2)
    actor, critic = particle_ensemble(actors), particle_ensemble(critics)
    a2c = particle_loss(recipe.SVPGConfig(), actor, critic)
    assert type(a2c) is A2CLoss
    ppo = particle_loss(recipe.SVPGConfig(particle="ppo"), actor, critic)
    assert type(ppo) is PPOLoss and ppo.clip_epsilon == 0.2 and not ppo.normalize_advantage
    narrow = particle_loss(recipe.SVPGConfig(particle="ppo", clip_epsilon=0.05), actor, critic)
    assert narrow.clip_epsilon == 0.05


def make_env_for_specs():
    from rlkit.envs import make_env

    cartpole = make_env("CartPole-v1", num_envs=1)
    cartpole.close()
    return cartpole
