"""Populations (rlkit.training.population): members are independent runs.

Member i of a population is compared with a standalone run of the same seed and settings
built and collected here the way the engine does it (seed, env, build, collector, one
update per batch): parameters agree within 1e-5 after several updates. A member driven to
NaN is stopped while the others carry on exactly as before. The IQM and its bootstrap
interval are checked against hand-computed values.
"""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch

from rlkit.algorithms import config_class, load
from rlkit.data.collector import make_collector
from rlkit.envs import make_env
from rlkit.training.config import parse_config
from rlkit.training.engine import Context, Counters
from rlkit.training.population import PopulationLearner, bootstrap_ci, iqm

N_ENVS, STEPS = 4, 16
SETTINGS = [
    dict(seed=0),
    dict(seed=1, lr=3e-4),
    dict(seed=2, clip_epsilon=0.1),
    dict(seed=3, entropy_coef=0.01),
]


def _ctx(seed: int) -> Context:
    ctx = Context(SimpleNamespace(world_size=1, device=torch.device("cpu")), 20_000, Counters())
    ctx.generator.manual_seed(seed)
    return ctx


def _base(algo: str):
    argv = ["--num-envs", str(N_ENVS), "--rollout-steps", str(STEPS)]
    if algo == "ppo":
        argv += ["--minibatch-size", "32", "--epochs", "3"]
    return parse_config(config_class(algo), argv, presets={})


def _standalone(algo: str, setting: dict, batches: int):
    cfg = dataclasses.replace(_base(algo), **setting)
    torch.manual_seed(cfg.seed)
    env = make_env("CartPole-v1", num_envs=N_ENVS, seed=cfg.seed)
    learner = load(algo).build(cfg, env)
    ctx = _ctx(cfg.seed)
    collector = make_collector(env, learner.collect_policy(), frames_per_batch=N_ENVS * STEPS)
    for batch, _ in zip(collector, range(batches)):
        ctx.counters.frames += batch.numel()
        learner.update(batch, ctx)
    collector.shutdown()
    env.close()
    return learner


def _population(algo: str, settings: list[dict], batches: int, poison: int | None = None):
    seeds = [s["seed"] for s in settings]
    env = make_env("CartPole-v1", num_envs=N_ENVS * len(settings), seed=None)
    env.base_env._seed_calls_reset = True
    env.base_env.reset(seed=[s + k for s in seeds for k in range(N_ENVS)])
    members, states = [], []
    for setting in settings:
        cfg = dataclasses.replace(_base(algo), **setting)
        torch.manual_seed(cfg.seed)
        members.append(load(algo).build(cfg, env))
        states.append(torch.get_rng_state())
    if poison is not None:  # a critic that returns inf: non-finite advantages and gradients
        with torch.no_grad():
            list(members[poison].critic.parameters())[-1].fill_(math.inf)
    pop = PopulationLearner(members, states, num_envs=N_ENVS, seeds=seeds, settings=settings)
    ctx = _ctx(0)
    collector = make_collector(env, pop.collect_policy(), frames_per_batch=pop.frames_per_batch)
    metrics = []
    for batch, _ in zip(collector, range(batches)):
        ctx.counters.frames += batch.numel() // len(settings)  # each member's own progress
        metrics.append(pop.update(batch, ctx))
    collector.shutdown()
    env.close()
    return pop, metrics


def _max_diff(a, b) -> float:
    return max(
        (x - y).abs().max().item()
        for x, y in zip(a.nets.parameters(), b.nets.parameters(), strict=True)
    )


@pytest.mark.parametrize("algo", ["ppo", "a2c"])
def test_members_match_standalone_runs(algo):
    # 3 batches = 18 PPO optimiser steps; the vmapped backward differs from a single
    # member's in the last bits (batched matmuls), which Adam amplifies slowly: 2e-5 after 4
    batches = 3
    settings = (
        SETTINGS if algo == "ppo" else [*SETTINGS[:2], dict(seed=2, value_coef=0.25), SETTINGS[3]]
    )
    pop, metrics = _population(algo, settings, batches)
    for i, setting in enumerate(settings):
        solo = _standalone(algo, setting, batches)
        assert _max_diff(pop.members[i], solo) < 1e-5, (i, setting)
    first = pop.members[0]
    start = load(algo).build(
        dataclasses.replace(_base(algo), seed=0), make_env("CartPole-v1", num_envs=N_ENVS)
    )
    assert _max_diff(first, start) > 1e-3  # and they did train
    assert metrics[-1]["members_active"] == len(settings)
    assert {f"loss_policy/member{i}" for i in range(len(settings))} <= set(metrics[-1])


def test_a_diverged_member_is_stopped_and_the_others_go_on():
    batches = 3
    pop, metrics = _population("ppo", SETTINGS[:3], batches, poison=1)
    assert set(pop.stopped) == {1}
    assert "non-finite" in pop.stopped[1]
    assert metrics[-1]["members_active"] == 2
    for i in (0, 2):
        assert _max_diff(pop.members[i], _standalone("ppo", SETTINGS[i], batches)) < 1e-5


def test_state_dict_round_trip_keeps_streams_and_stops():
    pop, _ = _population("ppo", SETTINGS[:2], 1, poison=0)
    state = pop.state_dict()
    twin, _ = _population("ppo", SETTINGS[:2], 0)
    twin.load_state_dict(state)
    assert twin.stopped == pop.stopped
    for a, b in zip(twin.rngs, pop.rngs):
        assert torch.equal(a.state, b.state)
    for a, b in zip(twin.generators, pop.generators):
        assert torch.equal(a.get_state(), b.get_state())


def test_iqm_by_hand():
    assert iqm([1, 2, 3, 4]) == 2.5  # the middle two
    assert iqm([8, 1, 7, 2, 6, 3, 5, 4]) == 4.5  # 3, 4, 5, 6
    # n = 5: quartiles at 1.25 and 3.75 -> 0.75 * 2 + 3 + 0.75 * 4 over 2.5
    assert iqm([1, 2, 3, 4, 100]) == pytest.approx(3.0)
    with pytest.raises(ValueError):
        iqm([])


def test_bootstrap_ci_brackets_the_iqm_and_collapses_for_equal_runs():
    assert bootstrap_ci([5.0] * 8) == (5.0, 5.0)
    values = [float(v) for v in range(16)]
    low, high = bootstrap_ci(values, reps=500)
    assert low < iqm(values) < high
    assert low >= 0 and high <= 15
