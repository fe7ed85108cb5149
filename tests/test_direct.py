"""rlkit.modules.direct: the direct network calls give the TensorDict path's numbers exactly.

Each case computes a distribution (or a module output) both ways from one copy of the
networks and compares log-probabilities, entropies and parameter gradients with
``torch.equal``; then the cases where the direct path must step aside (hooks, subclasses,
changed keys, missing inputs) are checked to behave like the module itself. Last, whole
learner updates with and without the direct path end at the same parameters.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torchrl.modules import ProbabilisticActor, ValueOperator

from rlkit import keys
from rlkit.envs import make_env
from rlkit.modules import categorical_actor, direct, gaussian_actor, value_critic
from rlkit.modules.target import TargetNetwork, call_network


def _td(n: int = 16, features: int = 3, seed: int = 0) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    return TensorDict({keys.OBSERVATION: torch.randn(n, features, generator=g)}, [n])


def _grads(module: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in module.parameters() if p.grad is not None]


ACTORS = {
    "categorical": lambda: categorical_actor(3, 4),
    "one_hot": lambda: categorical_actor(3, 4, one_hot=True),
    "normal": lambda: gaussian_actor(3, 2, init_log_std=-0.5),
    "normal_state_std": lambda: gaussian_actor(3, 2, state_dependent_std=True),
    "tanh_normal": lambda: gaussian_actor(
        3, 2, tanh=True, low=torch.tensor([-2.0, -1.0]), high=torch.tensor([2.0, 3.0])
    ),
}


@pytest.mark.parametrize("kind", sorted(ACTORS))
def test_actor_dist_matches_get_dist(kind):
    torch.manual_seed(0)
    actor = ACTORS[kind]()
    reference = copy.deepcopy(actor)
    td = _td()
    with torch.no_grad():
        sampled = reference(td.clone())
    action = sampled.get(keys.ACTION)

    fast = direct.actor_dist(actor, td)
    slow = reference.get_dist(td.select(*reference.in_keys))
    assert type(fast) is type(slow)
    lp_fast, lp_slow = fast.log_prob(action), slow.log_prob(action)
    assert torch.equal(lp_fast, lp_slow)
    if kind != "tanh_normal":  # no closed-form entropy for TanhNormal
        assert torch.equal(fast.entropy(), slow.entropy())
    lp_fast.sum().backward()
    lp_slow.sum().backward()
    g_fast, g_slow = _grads(actor), _grads(reference)
    assert len(g_fast) == len(g_slow) > 0
    assert all(torch.equal(a, b) for a, b in zip(g_fast, g_slow))
    assert direct.cached_plan(actor) not in (None, direct._UNSET)  # the direct path was taken


def test_actor_dist_takes_the_module_path_when_a_hook_is_registered():
    torch.manual_seed(0)
    actor = categorical_actor(3, 2)
    td = _td()
    direct.actor_dist(actor, td)
    seen = []
    handle = actor.module[0].register_forward_hook(lambda m, i, o: seen.append(1))
    try:
        direct.actor_dist(actor, td)
    finally:
        handle.remove()
    assert seen == [1]  # the wrapper ran, so its hook did


def test_actor_subclass_is_not_bypassed():
    class Tempered(ProbabilisticActor):
        def get_dist(self, tensordict):
            dist = super().get_dist(tensordict)
            return torch.distributions.Categorical(logits=dist.logits / 2)

    torch.manual_seed(0)
    base = categorical_actor(3, 2)
    actor = Tempered(
        base.module[0],
        in_keys=[keys.LOGITS],
        out_keys=[keys.ACTION],
        distribution_class=torch.distributions.Categorical,
    )
    td = _td()
    expected = actor.get_dist(td.select(*actor.in_keys)).logits
    assert torch.equal(direct.actor_dist(actor, td).logits, expected)


def test_plan_follows_changed_wiring():
    torch.manual_seed(0)
    critic = value_critic(3)
    td = _td()
    td.set("other", td.get(keys.OBSERVATION) * 2)
    before = direct.module_output(critic, td, keys.STATE_VALUE)
    critic.in_keys = ["other"]
    after = direct.module_output(critic, td, keys.STATE_VALUE)
    assert torch.equal(after, critic(td.select("other")).get(keys.STATE_VALUE))
    assert not torch.equal(before, after)


def test_missing_input_raises_the_modules_own_error():
    critic = value_critic(3)
    td = TensorDict({"unrelated": torch.zeros(4, 3)}, [4])
    with pytest.raises(KeyError):
        direct.module_output(critic, td, keys.STATE_VALUE)


def test_module_output_with_overrides_and_target_network():
    torch.manual_seed(0)
    net = torch.nn.Linear(5, 1)
    q = TensorDictModule(
        lambda obs, act: net(torch.cat([obs, act], -1)),
        in_keys=[keys.OBSERVATION, keys.ACTION],
        out_keys=[keys.ACTION_VALUE],
    )
    td = _td()
    td.set(keys.ACTION, torch.randn(16, 2))
    other = torch.randn(16, 2)
    expected = net(torch.cat([td.get(keys.OBSERVATION), other], -1))
    got = direct.module_output(q, td, keys.ACTION_VALUE, {keys.ACTION: other})
    assert torch.equal(got, expected)
    assert torch.equal(td.get(keys.ACTION), td.get(keys.ACTION))  # input left alone
    assert keys.ACTION_VALUE not in td.keys()  # noqa: SIM118

    critic = value_critic(3)
    target = TargetNetwork(critic)
    expected = target(td.select(keys.OBSERVATION)).get(keys.STATE_VALUE)
    assert torch.equal(call_network(target, td, keys.STATE_VALUE), expected)


def test_value_operator_output_and_gradient_match():
    torch.manual_seed(0)
    critic = value_critic(3)
    reference = copy.deepcopy(critic)
    assert type(critic) is ValueOperator
    td = _td()
    fast = direct.module_output(critic, td, keys.STATE_VALUE)
    slow = reference(td.select(*reference.in_keys)).get(keys.STATE_VALUE)
    assert torch.equal(fast, slow)
    fast.square().sum().backward()
    slow.square().sum().backward()
    assert all(torch.equal(a, b) for a, b in zip(_grads(critic), _grads(reference)))


def _ctx():
    from rlkit.training.engine import Context, Counters

    fabric = SimpleNamespace(world_size=1, device=torch.device("cpu"))
    return Context(fabric, total_frames=10_000, counters=Counters())


@pytest.mark.parametrize("algo", ["ppo", "a2c", "daac", "impala", "ppg"])
def test_learner_updates_equal_with_and_without_the_direct_path(algo):
    """K updates through the direct path and through the plain TensorDict path from the
    same state and batch end at bit-identical parameters."""
    from rlkit.algorithms import config_class, load
    from rlkit.data.collector import make_collector
    from rlkit.training import parse_config

    module = load(algo)
    extra = {"ppo": ["--minibatch-size", "32", "--epochs", "2"], "daac": ["--minibatch-size", "32"]}
    extra["impala"] = extra["ppg"] = ["--minibatch-size", "32"]
    argv = ["--num-envs", "4", "--rollout-steps", "16", *extra.get(algo, [])]
    cfg = parse_config(config_class(algo), argv, presets={})
    env = make_env("CartPole-v1", num_envs=4, seed=0)
    torch.manual_seed(0)
    learner = module.build(cfg, env)
    collector = make_collector(env, learner.collect_policy(), frames_per_batch=64)
    batches = [b.clone() for b, _ in zip(collector, range(2))]
    collector.shutdown()
    twin = copy.deepcopy(learner)
    ctx_a, ctx_b = _ctx(), _ctx()
    for batch in batches:
        learner.update(batch.clone(), ctx_a)
        with direct.disabled():
            twin.update(batch.clone(), ctx_b)
    env.close()
    a = [t for m in learner.modules().values() for t in m.state_dict().values()]
    b = [t for m in twin.modules().values() for t in m.state_dict().values()]
    assert len(a) == len(b) > 0
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    torch.manual_seed(0)  # the updates changed something: compare with a fresh build
    fresh = module.build(cfg, make_env("CartPole-v1", num_envs=4, seed=0))
    start = [t for m in fresh.modules().values() for t in m.state_dict().values()]
    assert any(not torch.equal(x, y) for x, y in zip(a, start))


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_collector_batches_equal_with_and_without_the_direct_path(env_id):
    """The collector's direct sampling draws the same random numbers as the actor itself:
    two collectors from the same seeds give identical batches, and the same global RNG state
    afterwards."""
    from rlkit.data.collector import make_collector
    from rlkit.modules import make_actor

    def collect(use_direct: bool):
        torch.manual_seed(1)
        env = make_env(env_id, num_envs=3, seed=1)
        actor = make_actor(env, tanh=env_id == "Pendulum-v1")
        collector = make_collector(env, actor, frames_per_batch=48)
        assert collector._direct  # the plain actors take the direct path
        if use_direct:
            batches = [b for b, _ in zip(collector, range(3))]
        else:
            with direct.disabled():
                batches = [b for b, _ in zip(collector, range(3))]
        collector.shutdown()
        return batches, torch.random.get_rng_state()

    fast, rng_fast = collect(True)
    slow, rng_slow = collect(False)
    assert torch.equal(rng_fast, rng_slow)
    for a, b in zip(fast, slow):
        assert set(a.keys(True, True)) == set(b.keys(True, True))
        for k in a.keys(True, True):
            assert torch.equal(a.get(k), b.get(k)), k


def test_actor_sample_steps_aside_for_deterministic_interaction_and_safe_actors():
    from tensordict.nn import InteractionType, set_interaction_type
    from torchrl.data import Categorical

    torch.manual_seed(0)
    actor = categorical_actor(3, 2)
    td = _td()
    assert direct.actor_sample(actor, td) is not None
    with set_interaction_type(InteractionType.DETERMINISTIC):
        assert direct.actor_sample(actor, td) is None
    safe = ProbabilisticActor(
        actor.module[0],
        in_keys=[keys.LOGITS],
        out_keys=[keys.ACTION],
        spec=Categorical(2),
        safe=True,
        distribution_class=torch.distributions.Categorical,
        return_log_prob=True,
    )
    assert direct.actor_sample(safe, td) is None  # the spec check is a forward hook
