"""pyrado's GAE critic settings on PPO and A2C (issue 21): ``--value-lr``, ``--value-epochs``,
``--value-minibatch-size``, ``--value-max-grad-norm`` and ``--empirical-returns``.

References are written here: a reward-to-go loop with truncation bootstraps, hand-computed
returns, step counts from ``ceil``, gradient norms from the gradients themselves."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from rlkit import keys
from rlkit.algorithms import a2c, ppo
from rlkit.algorithms.critic import CriticGroupLearner
from rlkit.algorithms.onpolicy import PolicyGradientLearner
from rlkit.data.collector import make_collector
from rlkit.envs import make_env
from rlkit.training import parse_config
from rlkit.training.engine import Context, Counters
from rlkit.value import GAE, discounted_return
from tests.test_seed_flags import _refused

RECIPES = {"ppo": ppo, "a2c": a2c}
#: 4 envs x 16 steps = 64 samples per batch; the policy's minibatches of 32
TINY = ["--num-envs", "4", "--rollout-steps", "16", "--minibatch-size", "32"]


# --------------------------------------------------------------------------- the return
def reward_to_go(reward, next_value, done, terminated, gamma):
    """Textbook loop over one trajectory of python floats: discounted sum of rewards to the
    episode's end; a truncated step and the last step bootstrap from V(next observation)."""
    out = [0.0] * len(reward)
    following = None
    for t in reversed(range(len(reward))):
        if terminated[t]:
            g = reward[t]
        elif done[t] or following is None:
            g = reward[t] + gamma * next_value[t]
        else:
            g = reward[t] + gamma * following
        out[t] = g
        following = g
    return out


def test_discounted_return_hand_computed_with_termination_and_truncation():
    # steps: r = 1, 2, 3 | 4, 5 (terminated at 1, truncated at 3, the batch ends at 4)
    r = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]).reshape(1, 5, 1)
    v_next = torch.tensor([7.0, 8.0, 9.0, 10.0, 20.0]).reshape(1, 5, 1)
    terminated = torch.tensor([False, True, False, False, False]).reshape(1, 5, 1)
    truncated = torch.tensor([False, False, False, True, False]).reshape(1, 5, 1)
    g = discounted_return(r, v_next, terminated | truncated, terminated, gamma=0.5)
    # t=4: 5 + 0.5*20 = 15 (end of batch); t=3: 4 + 0.5*10 = 9 (truncated: bootstrap, not t=4)
    # t=2: 3 + 0.5*9 = 7.5; t=1: 2 (terminated); t=0: 1 + 0.5*2 = 2
    assert g.flatten().tolist() == [2.0, 2.0, 7.5, 9.0, 15.0]


def test_discounted_return_matches_the_reward_to_go_loop():
    gen = torch.Generator().manual_seed(3)
    n, t, gamma = 5, 40, 0.97
    r = torch.randn(n, t, 1, generator=gen, dtype=torch.float64)
    v_next = torch.randn(n, t, 1, generator=gen, dtype=torch.float64)
    terminated = torch.rand(n, t, 1, generator=gen) < 0.08
    truncated = (torch.rand(n, t, 1, generator=gen) < 0.08) & ~terminated
    done = terminated | truncated
    got = discounted_return(r, v_next, done, terminated, gamma=gamma)
    for i in range(n):
        want = reward_to_go(
            r[i, :, 0].tolist(),
            v_next[i, :, 0].tolist(),
            done[i, :, 0].tolist(),
            terminated[i, :, 0].tolist(),
            gamma,
        )
        torch.testing.assert_close(got[i, :, 0], torch.tensor(want, dtype=torch.float64))


def test_gae_empirical_returns_writes_the_return_and_keeps_the_gae_advantage():
    from tensordict import TensorDict

    gen = torch.Generator().manual_seed(0)
    n, t = 3, 12
    terminated = torch.rand(n, t, 1, generator=gen) < 0.15
    done = terminated | (torch.rand(n, t, 1, generator=gen) < 0.15)
    td = TensorDict(
        {
            keys.STATE_VALUE: torch.randn(n, t, 1, generator=gen),
            "next": {
                "reward": torch.randn(n, t, 1, generator=gen),
                "state_value": torch.randn(n, t, 1, generator=gen),
                "done": done,
                "terminated": terminated,
            },
        },
        batch_size=[n, t],
    )
    plain = GAE(gamma=0.9, lmbda=0.7)(td.clone())
    empirical = GAE(gamma=0.9, lmbda=0.7, empirical_returns=True)(td.clone())
    assert torch.equal(plain[keys.ADVANTAGE], empirical[keys.ADVANTAGE])
    for i in range(n):
        want = reward_to_go(
            td["next", "reward"][i, :, 0].tolist(),
            td["next", "state_value"][i, :, 0].tolist(),
            done[i, :, 0].tolist(),
            terminated[i, :, 0].tolist(),
            0.9,
        )
        torch.testing.assert_close(empirical[keys.VALUE_TARGET][i, :, 0], torch.tensor(want))
    assert not torch.allclose(plain[keys.VALUE_TARGET], empirical[keys.VALUE_TARGET])


# --------------------------------------------------------------------------- learners
@pytest.fixture(scope="module")
def env():
    e = make_env("CartPole-v1", num_envs=4, seed=0)
    yield e
    e.close()


def config(algo: str, *flags: str):
    module = RECIPES[algo]
    return parse_config(module.PPOConfig if algo == "ppo" else module.A2CConfig, [*TINY, *flags])


def build(algo: str, env, *flags: str):
    cfg = config(algo, *flags)
    torch.manual_seed(0)
    return RECIPES[algo].build(cfg, env)


@pytest.fixture(scope="module")
def batches(env):
    learner = build("ppo", env)
    collector = make_collector(env, learner.collect_policy(), frames_per_batch=64)
    out = []
    for b in collector:
        out.append(b.clone())
        if len(out) == 2:
            break
    collector.shutdown()
    return out


def context(seed: int = 5) -> Context:
    fabric = SimpleNamespace(world_size=1, device=torch.device("cpu"))
    ctx = Context(fabric, total_frames=10_000, counters=Counters())
    ctx.generator.manual_seed(seed)
    return ctx


def count_steps(optimizer: torch.optim.Optimizer) -> list[int]:
    steps = [0]
    step = optimizer.step

    def counted(*args, **kwargs):
        steps[0] += 1
        return step(*args, **kwargs)

    optimizer.step = counted
    return steps


@pytest.mark.parametrize("algo", ["ppo", "a2c"])
def test_defaults_keep_the_shared_learner_and_estimator(algo, env):
    learner = build(algo, env)
    assert type(learner) is PolicyGradientLearner
    assert learner.estimator.empirical_returns is False
    assert set(learner.optimizers()) == {"optimizer"}
    critic = {id(p) for p in learner.critic.parameters()}
    assert critic <= {id(p) for g in learner.optimizer.param_groups for p in g["params"]}


@pytest.mark.parametrize("algo", ["ppo", "a2c"])
def test_value_lr_gives_the_critic_its_own_optimizer_on_the_policy_schedule(algo, env, batches):
    learner = build(algo, env, "--lr", "1e-3", "--value-lr", "2e-4", "--lr-schedule", "linear")
    assert isinstance(learner, CriticGroupLearner)
    policy = {id(p) for g in learner.optimizer.param_groups for p in g["params"]}
    value = {id(p) for g in learner.value_optimizer.param_groups for p in g["params"]}
    assert value == {id(p) for p in learner.critic.parameters()}
    assert policy == {id(p) for p in learner.actor.parameters()}
    ctx = context()
    ctx.counters.frames = 2_500  # a quarter of total_frames=10_000: the rates at 0.75
    learner.update(batches[0].clone(), ctx)
    assert learner.value_optimizer.param_groups[0]["lr"] == pytest.approx(2e-4 * 0.75)
    assert learner.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3 * 0.75)


@pytest.mark.parametrize(
    ("algo", "flags", "policy_steps", "value_steps"),
    [
        # lockstep on the policy's minibatches: epochs x ceil(64 / 32)
        ("ppo", ["--epochs", "2", "--value-epochs", "3"], 2 * 2, 3 * 2),
        # own minibatches: value_epochs x ceil(64 / 24) = 3 x 3
        ("ppo", ["--epochs", "2", "--value-epochs", "3", "--value-minibatch-size", "24"], 4, 9),
        ("ppo", ["--epochs", "2", "--value-minibatch-size", "64"], 4, 2 * 1),
        # A2C: one policy step on the whole batch; the critic 4 x ceil(64 / 10) = 4 x 7
        (
            "a2c",
            ["--minibatch-size", "none", "--value-epochs", "4", "--value-minibatch-size", "10"],
            1,
            28,
        ),
        ("a2c", ["--minibatch-size", "none", "--value-epochs", "5"], 1, 5),
    ],
)
def test_critic_steps_per_batch_are_value_epochs_times_its_minibatches(
    algo, flags, policy_steps, value_steps, env, batches
):
    learner = build(algo, env, *flags)
    cfg = config(algo, *flags)
    assert value_steps == cfg.critic_epochs * math.ceil(64 / cfg.critic_minibatch)
    policy, value = count_steps(learner.optimizer), count_steps(learner.value_optimizer)
    metrics = learner.update(batches[0].clone(), context())
    assert (policy[0], value[0]) == (policy_steps, value_steps)
    assert "value_grad_norm" in metrics and "value_lr" in metrics


def test_critic_gradient_is_clipped_at_its_own_norm_and_the_actor_s_is_not(env, batches):
    clip = 1e-3
    flags = ["--epochs", "10", "--max-grad-norm", "0", "--value-max-grad-norm", str(clip)]
    learner = build("ppo", env, *flags)
    norms: dict[str, list[float]] = {"policy": [], "value": []}

    def spy(name, optimizer):
        step = optimizer.step

        def recorded(*args, **kwargs):
            grads = [p.grad for g in optimizer.param_groups for p in g["params"]]
            norms[name].append(
                float(torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads])))
            )
            return step(*args, **kwargs)

        optimizer.step = recorded

    spy("policy", learner.optimizer)
    spy("value", learner.value_optimizer)
    metrics = learner.update(batches[0].clone(), context())
    assert len(norms["value"]) == len(norms["policy"]) == 20  # 10 epochs x 2 minibatches
    assert all(n <= clip * (1 + 1e-5) for n in norms["value"])
    assert metrics["value_grad_norm"] > 10 * clip  # the norm before clipping, logged
    assert max(norms["policy"]) > 10 * clip  # the actor's gradient is not clipped
    assert metrics["grad_norm"] == pytest.approx(sum(norms["policy"]) / 20, rel=1e-5)


def trained_state(learner, batch) -> dict[str, torch.Tensor]:
    learner.update(batch.clone(), context())
    return {k: v.clone() for k, v in learner.nets.state_dict().items()}


@pytest.mark.parametrize("algo", ["ppo", "a2c"])
def test_critic_group_with_the_policy_s_settings_reproduces_the_shared_update(algo, env, batches):
    """Adam acts elementwise, so with one clip off the split into two optimisers of the same lr
    steps every parameter exactly as the shared optimiser does (the defaults' path)."""
    flags = ["--max-grad-norm", "0", "--optimizer", "adam"]
    shared = build(algo, env, *flags)
    split = build(algo, env, *flags, "--value-lr", str(config(algo, *flags).lr))
    assert type(shared) is PolicyGradientLearner and isinstance(split, CriticGroupLearner)
    a, b = trained_state(shared, batches[0]), trained_state(split, batches[0])
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    ("algo", "flags"),
    [
        ("ppo", ("--value-lr", "1e-4")),
        ("ppo", ("--value-epochs", "3")),
        ("ppo", ("--value-minibatch-size", "16")),
        ("ppo", ("--value-max-grad-norm", "0.01")),
        ("ppo", ("--empirical-returns", "true")),
        ("a2c", ("--value-lr", "1e-4")),
        ("a2c", ("--value-epochs", "3")),
        ("a2c", ("--value-minibatch-size", "16")),
        ("a2c", ("--value-max-grad-norm", "0.01")),
        ("a2c", ("--empirical-returns", "true", "--gae-lambda", "0.5")),
    ],
)
def test_each_flag_changes_the_trained_critic(algo, flags, env, batches):
    base = ["--epochs", "2"]
    a = trained_state(build(algo, env, *base), batches[0])
    b = trained_state(build(algo, env, *base, *flags), batches[0])
    critic = [k for k in a if k.startswith("critic.")]
    assert critic and any(not torch.allclose(a[k], b[k]) for k in critic)


@pytest.mark.parametrize("algo", ["ppo", "a2c"])
def test_empirical_returns_target_the_reward_to_go_and_keep_the_gae_advantage(algo, env, batches):
    plain = build(algo, env, "--gae-lambda", "0.8")
    empirical = build(algo, env, "--gae-lambda", "0.8", "--empirical-returns", "true")
    flat_plain, _ = plain.prepare(batches[0].clone(), context())
    flat, _ = empirical.prepare(batches[0].clone(), context())
    assert torch.equal(flat[keys.ADVANTAGE], flat_plain[keys.ADVANTAGE])
    td = flat.reshape(4, 16)  # the collector's [envs, time]
    gamma = config(algo, "--gae-lambda", "0.8", "--empirical-returns", "true").gamma
    for i in range(4):
        want = reward_to_go(
            td["next", "reward"][i, :, 0].tolist(),
            td["next", "state_value"][i, :, 0].tolist(),
            td["next", "done"][i, :, 0].tolist(),
            td["next", "terminated"][i, :, 0].tolist(),
            gamma,
        )
        torch.testing.assert_close(td[keys.VALUE_TARGET][i, :, 0], torch.tensor(want))


@pytest.mark.parametrize("algo", ["ppo", "a2c"])
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--value-epochs", "0"], "--value-epochs must be > 0"),
        (["--value-lr", "-1e-3"], "--value-lr must be > 0"),
        (["--value-lr", "0"], "--value-lr must be > 0"),
        (["--value-minibatch-size", "0"], "--value-minibatch-size must be > 0"),
        (["--value-minibatch-size", "65"], "--value-minibatch-size 65 is larger than the batch"),
        (["--value-max-grad-norm", "-1"], "--value-max-grad-norm must be >= 0"),
    ],
)
def test_critic_flags_refuse_bad_values(algo, argv, message, capsys):
    _refused(algo, [*TINY, *argv], message, capsys)


@pytest.mark.parametrize(
    "argv",
    [
        ["--population", "2", "--value-lr", "1e-4"],
        ["--sweep", "lr=1e-3,3e-4", "--value-epochs", "2"],
        ["--sweep", "value_lr=1e-3,3e-4"],
    ],
)
def test_critic_group_is_refused_with_a_population(argv, capsys):
    _refused("ppo", [*TINY, *argv], "cannot vectorise", capsys)


def test_empirical_returns_is_accepted_with_a_population():
    cfg = parse_config(ppo.PPOConfig, [*TINY, "--population", "2", "--empirical-returns", "true"])
    assert cfg.empirical_returns and not cfg.critic_group
