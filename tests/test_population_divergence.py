"""A population contains a member's divergence wherever it shows (issue 51).

Before, ``ppo.py --sweep lr=1e-3,1e38 --population-seeds 2`` ended after its first batch in a
traceback from the shared sampling step (``probability tensor contains either inf, nan or
element < 0``): the lr 1e38 members' first step left infinite parameters, their loss stopped
them, but they still acted. Now a member stops with one line, wherever its divergence shows
(collection, estimator, loss, update), the others go on exactly as they would without it,
and ``population.json`` and the checkpoint are written.

References: the same sweep without the diverging setting (same seeds), and populations
built here without the poisoned member; compared bit for bit (the members of a population
are vmapped per set of equal loss settings, so the surviving members run the same calls).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
import math
from types import SimpleNamespace

import pytest
import torch

from rlkit.algorithms import config_class, load
from rlkit.data.collector import make_collector
from rlkit.envs import make_env
from rlkit.training import checkpoint as ckpt
from rlkit.training import parse_config
from rlkit.training.engine import Context, Counters
from rlkit.training.errors import NonFiniteError
from rlkit.training.population import PopulationLearner

TINY = ["--num-envs", "2", "--rollout-steps", "32", "--minibatch-size", "32", "--epochs", "2"]
TINY += ["--eval-every", "128", "--eval-episodes", "2", "--eval-max-steps", "50"]
TINY += ["--progress", "false"]


def _sweep(tmp_path, name: str, lrs: str) -> tuple[dict, str]:
    """``ppo.py --sweep lr=LRS --population-seeds 2`` on 128 frames, in process: its
    ``population.json`` and stderr."""
    err = io.StringIO()
    run_dir = tmp_path / name
    argv = [*TINY, "--total-frames", "128", "--sweep", f"lr={lrs}", "--population-seeds", "2"]
    handler = logging.StreamHandler(err)  # the population's warnings (stderr otherwise)
    logging.getLogger("rlkit.training.population").addHandler(handler)
    try:
        with contextlib.redirect_stderr(err):
            load("ppo").main([*argv, "--run-dir", str(run_dir)])
    finally:
        logging.getLogger("rlkit.training.population").removeHandler(handler)
    report = json.loads((run_dir / "population.json").read_text())
    report["checkpoint"] = ckpt.load(run_dir / "checkpoints" / "last.pt")
    return report, err.getvalue()


def test_the_issue_sweep_stops_the_diverging_members_and_the_others_match(tmp_path):
    mixed, err = _sweep(tmp_path, "mixed", "1e-3,1e38")
    alone, _ = _sweep(tmp_path, "alone", "1e-3")
    stops = [line for line in err.splitlines() if "stopped:" in line]
    assert len(stops) == 2, err  # one line per diverging member
    assert all("lr=1e+38" in line and "the other members go on" in line for line in stops)
    members = mixed["members"]
    assert [m["stopped"] is None for m in members] == [True, True, False, False]
    assert all("non-finite" in m["stopped"] for m in members[2:])
    # the lr 1e-3 members: the same returns and the same final weights as without the others
    assert [m["eval_return_mean"] for m in members[:2]] == [
        m["eval_return_mean"] for m in alone["members"]
    ]
    stored, reference = mixed["checkpoint"]["modules"], alone["checkpoint"]["modules"]
    assert set(reference) <= set(stored)
    for name, state in reference.items():
        for key, tensor in state.items():
            assert torch.equal(stored[name][key], tensor), (name, key)
    # the stopped members keep finite parameters (their last good ones): a checkpoint holds them
    tensors = [t for state in stored.values() for t in state.values() if t.is_floating_point()]
    assert all(t.isfinite().all() for t in tensors)


# --------------------------------------------------------------------------- direct populations
N_ENVS, STEPS = 2, 16


def _cfg(algo: str, **setting):
    argv = ["--num-envs", str(N_ENVS), "--rollout-steps", str(STEPS)]
    argv += ["--minibatch-size", "16", "--epochs", "2"]
    return dataclasses.replace(parse_config(config_class(algo), argv, presets={}), **setting)


def _population(env_id: str, settings: list[dict], batches: int, poison=None):
    """A PPO population over ``settings`` built and collected as the engine does;
    ``poison(member_index, learner)`` breaks a member after its build."""
    seeds = [s["seed"] for s in settings]
    env = make_env(env_id, num_envs=N_ENVS * len(settings), seed=None)
    env.base_env._seed_calls_reset = True
    env.base_env.reset(seed=[s + k for s in seeds for k in range(N_ENVS)])
    members, states = [], []
    for i, setting in enumerate(settings):
        cfg = _cfg("ppo", **setting)
        torch.manual_seed(cfg.seed)
        members.append(load("ppo").build(cfg, env))
        states.append(torch.get_rng_state())
        if poison is not None:
            poison(i, members[-1])
    pop = PopulationLearner(members, states, num_envs=N_ENVS, seeds=seeds, settings=settings)
    ctx = Context(SimpleNamespace(world_size=1, device=torch.device("cpu")), 20_000, Counters())
    ctx.generator.manual_seed(0)
    collector = make_collector(env, pop.collect_policy(), frames_per_batch=pop.frames_per_batch)
    try:
        for batch, _ in zip(collector, range(batches)):
            ctx.counters.frames += batch.numel() // len(settings)
            pop.update(batch, ctx)
    finally:
        collector.shutdown()
        env.close()
    return pop


def _last_layer(module: torch.nn.Module) -> torch.nn.Linear:
    return [m for m in module.modules() if isinstance(m, torch.nn.Linear)][-1]


def _poison_actor(target: int):
    def poison(i, learner):
        if i == target:
            with torch.no_grad():
                _last_layer(learner.actor).weight.fill_(math.inf)

    return poison


def _equal(a, b) -> bool:
    pa, pb = list(a.nets.parameters()), list(b.nets.parameters())
    return len(pa) == len(pb) and all(torch.equal(x, y) for x, y in zip(pa, pb))


SEEDS = [dict(seed=0), dict(seed=1), dict(seed=2)]


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_a_member_whose_policy_diverges_while_collecting_is_stopped(env_id, caplog):
    """Categorical members sample in one distribution, Gaussian ones one by one: a member
    with infinite logits (or means) is stopped in the step, the others act as without it."""
    with caplog.at_level(logging.WARNING, logger="rlkit.training.population"):
        pop = _population(env_id, SEEDS, 2, poison=_poison_actor(1))
    assert set(pop.stopped) == {1} and pop.unplayable == {1}
    assert "of its policy while collecting, after 0 frames" in pop.stopped[1], pop.stopped
    assert len([r for r in caplog.records if "stopped" in r.getMessage()]) == 1
    reference = _population(env_id, [SEEDS[0], SEEDS[2]], 2)
    assert _equal(pop.members[0], reference.members[0])
    assert _equal(pop.members[2], reference.members[1])


def test_a_member_whose_estimator_diverges_is_stopped():
    def poison(i, learner):
        if i == 1:  # an infinite value: non-finite advantages and targets
            with torch.no_grad():
                _last_layer(learner.critic).bias.fill_(math.inf)

    pop = _population("CartPole-v1", SEEDS, 2, poison=poison)
    assert set(pop.stopped) == {1} and "from its estimator" in pop.stopped[1], pop.stopped
    reference = _population("CartPole-v1", [SEEDS[0], SEEDS[2]], 2)
    assert _equal(pop.members[0], reference.members[0])
    assert _equal(pop.members[2], reference.members[1])


def test_a_member_whose_update_overflows_keeps_its_last_good_parameters():
    """lr 1e38: Adam's first step overflows to inf; the member stops (its next loss is NaN)
    with the parameters it had before that update, so a checkpoint of the run holds only
    finite ones."""
    settings = [SEEDS[0], dict(seed=1, lr=1e38), SEEDS[2]]
    before = _population("CartPole-v1", settings, 0)
    pop = _population("CartPole-v1", settings, 2)
    assert set(pop.stopped) == {1}
    assert _equal(pop.members[1], before.members[1])  # its parameters before the update
    assert ckpt.all_finite(pop.modules())
    reference = _population("CartPole-v1", [SEEDS[0], SEEDS[2]], 2)
    assert _equal(pop.members[0], reference.members[0])
    assert _equal(pop.members[2], reference.members[1])


def test_a_population_whose_every_member_diverged_stops():
    def poison(i, learner):
        with torch.no_grad():
            _last_layer(learner.actor).weight.fill_(math.nan)

    with pytest.raises(NonFiniteError, match="every member of the population diverged"):
        _population("CartPole-v1", SEEDS[:2], 1, poison=poison)
