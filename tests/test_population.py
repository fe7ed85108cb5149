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
from rlkit.training import parse_config
from rlkit.training.engine import Context, Counters
from rlkit.training.population import PopulationLearner
from rlkit.training.stats import bootstrap_ci, iqm

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


def _base(algo: str, extra: tuple[str, ...] = ()):
    argv = ["--num-envs", str(N_ENVS), "--rollout-steps", str(STEPS), *extra]
    if algo in ("ppo", "daac"):
        argv += ["--minibatch-size", "32", "--epochs", "3"]
    if algo == "daac":  # a value phase every other batch
        argv += ["--value-epochs", "2", "--value-freq", "2"]
    if algo == "ppg":  # an auxiliary phase every other batch
        argv += ["--minibatch-size", "32", "--epochs", "2", "--n-pi", "2", "--aux-epochs", "2"]
        argv += ["--aux-minibatches", "2"]
    return parse_config(config_class(algo), argv, presets={})


def _standalone(algo: str, setting: dict, batches: int, extra: tuple[str, ...] = ()):
    cfg = dataclasses.replace(_base(algo, extra), **setting)
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


def _population(
    algo: str,
    settings: list[dict],
    batches: int,
    poison: int | None = None,
    extra: tuple[str, ...] = (),
):
    seeds = [s["seed"] for s in settings]
    env = make_env("CartPole-v1", num_envs=N_ENVS * len(settings), seed=None)
    env.base_env._seed_calls_reset = True
    env.base_env.reset(seed=[s + k for s in seeds for k in range(N_ENVS)])
    members, states = [], []
    for setting in settings:
        cfg = dataclasses.replace(_base(algo, extra), **setting)
        torch.manual_seed(cfg.seed)
        members.append(load(algo).build(cfg, env))
        members[-1].use_rows(N_ENVS)  # built on every member's rows, as build_population
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


@pytest.mark.parametrize("algo", ["ppo", "a2c", "daac", "ppg"])
def test_members_match_standalone_runs(algo):
    # 3 batches = 18 PPO optimiser steps; the vmapped backward differs from a single
    # member's in the last bits (batched matmuls), which Adam amplifies slowly: 2e-5 after 4.
    # PPG's members run their own updates (policy phase, then after 2 batches an auxiliary
    # phase over their own buffers)
    batches = 3
    settings = {
        "ppo": SETTINGS,
        "ppg": [*SETTINGS[:3], dict(seed=3, beta_clone=2.0)],
    }.get(algo, [*SETTINGS[:2], dict(seed=2, value_coef=0.25), SETTINGS[3]])
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
    if algo == "ppg":  # the auxiliary phase ran after the second batch, for every member
        assert {f"aux/loss_distill/member{i}" for i in range(len(settings))} <= set(metrics[1])


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
    # n = 5, 7: rliable's trim (scipy.stats.trim_mean(x, 0.25)) drops int(n / 4) = 1 a side
    assert iqm([10, 1, 3, 7, 2]) == pytest.approx(4.0)  # 2, 3, 7
    assert iqm([5, 1, 9, 2, 8, 3, 100]) == pytest.approx(27 / 5)  # 2, 3, 5, 8, 9
    with pytest.raises(ValueError):
        iqm([])
    import numpy as np

    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    for n in range(1, 21):  # rliable's aggregate_iqm is this trim_mean
        x = rng.normal(size=n) * 100
        assert iqm(x) == pytest.approx(stats.trim_mean(x, 0.25), abs=1e-9), n


def test_bootstrap_ci_brackets_the_iqm_and_collapses_for_equal_runs():
    assert bootstrap_ci([5.0] * 8) == (5.0, 5.0)
    values = [float(v) for v in range(16)]
    low, high = bootstrap_ci(values, reps=500)
    assert low < iqm(values) < high
    assert low >= 0 and high <= 15


# --------------------------------------------------------------------------- the engine
FLAGS = [
    "--total-frames", "512", "--num-envs", "4", "--rollout-steps", "32", "--epochs", "4",
    "--minibatch-size", "64", "--eval-every", "256", "--eval-episodes", "3",
    "--progress", "false",
]  # fmt: skip


def _modules(run_dir) -> dict:
    from rlkit.training import checkpoint as ckpt

    return ckpt.load(run_dir / "checkpoints" / "last.pt")["modules"]


def test_recipe_population_writes_member_rows_and_matches_standalone_runs(tmp_path):
    import csv
    import json

    from rlkit.algorithms import ppo

    summary = ppo.main([*FLAGS, "--sweep", "lr=1e-3,3e-4", "--run-dir", str(tmp_path / "pop")])
    report = json.loads((tmp_path / "pop" / "population.json").read_text())
    assert [m["settings"] for m in report["members"]] == [{"lr": 1e-3}, {"lr": 3e-4}]
    assert [a["settings"] for a in report["aggregates"]] == ["lr=0.001", "lr=0.0003"]
    assert summary["population"] == report["aggregates"]
    assert (tmp_path / "pop" / "population.png").is_file()
    with (tmp_path / "pop" / "eval.csv").open() as f:
        rows = list(csv.DictReader(f))
    members = [r for r in rows if r["member"]]
    assert sorted({(r["frames"], r["member"]) for r in members}) == [
        (f, m) for f in ("256", "512") for m in ("0", "1")
    ]
    finals = {r["member"]: float(r["return_mean"]) for r in members if r["frames"] == "512"}
    assert [m["eval_return_mean"] for m in report["members"]] == [finals["0"], finals["1"]]
    with (tmp_path / "pop" / "metrics.csv").open() as f:
        assert {r["member"] for r in csv.DictReader(f)} >= {"0", "1"}
    pop = _modules(tmp_path / "pop")
    for i, lr in enumerate(("1e-3", "3e-4")):
        ppo.main([*FLAGS, "--lr", lr, "--run-dir", str(tmp_path / f"solo{i}")])
        solo = _modules(tmp_path / f"solo{i}")
        diff = max(
            (pop[f"member{i}.{name}"][k] - v).abs().max().item()
            for name, state in solo.items()
            for k, v in state.items()
        )
        assert diff < 1e-5, (i, diff)


def test_population_checkpoint_round_trip_is_exact(tmp_path):
    """A population saved through the engine's checkpoint payload and loaded into a fresh one
    (as a resume does) continues bit for bit: same update on the same batch, same
    parameters, optimiser moments, random streams and minibatch generators."""
    from rlkit.training import checkpoint as ckpt
    from rlkit.training.engine import _apply, _payload

    settings = [SETTINGS[0], SETTINGS[2]]
    cfg = _base("ppo")
    pop, _ = _population("ppo", settings, 2)
    env = make_env("CartPole-v1", num_envs=N_ENVS * len(settings), seed=7)
    collector = make_collector(env, pop.collect_policy(), frames_per_batch=pop.frames_per_batch)
    batch = next(iter(collector))
    collector.shutdown()
    path = tmp_path / "pop.pt"
    ckpt.atomic_save(_payload(cfg, pop, Counters()), path)
    fresh, _ = _population("ppo", settings, 0)
    _apply(ckpt.load(path), path, fresh, Counters(), {})
    for p in (pop, fresh):
        ctx = _ctx(0)
        ctx.counters.frames = 3 * N_ENVS * STEPS
        p.update(batch.clone(), ctx)
    for name, module in pop.modules().items():
        for k, v in module.state_dict().items():
            assert torch.equal(v, fresh.modules()[name].state_dict()[k]), (name, k)
    for name, opt in pop.optimizers().items():
        a, b = opt.state_dict()["state"], fresh.optimizers()[name].state_dict()["state"]
        assert all(torch.equal(a[i][k], b[i][k]) for i in a for k in a[i])
    for a, b in zip(pop.rngs, fresh.rngs):
        assert torch.equal(a.state, b.state)
    for a, b in zip(pop.generators, fresh.generators):
        assert torch.equal(a.get_state(), b.get_state())


def test_ppg_recipe_population_matches_standalone_runs(tmp_path):
    """``recipes/ppg.py --sweep``: 3 batches, an auxiliary phase after the second; member 1
    (``beta_clone`` 2, which only the auxiliary phase reads) ends where its standalone run
    ends, and apart from member 0."""
    import json

    from rlkit.algorithms import ppg

    flags = [
        "--num-envs", "4", "--rollout-steps", "16", "--minibatch-size", "32", "--epochs", "2",
        "--n-pi", "2", "--aux-epochs", "2", "--aux-minibatches", "2", "--total-frames", "192",
        "--eval-every", "0", "--eval-episodes", "2", "--progress", "false",
    ]  # fmt: skip
    ppg.main([*flags, "--sweep", "beta_clone=1.0,2.0", "--run-dir", str(tmp_path / "pop")])
    ppg.main([*flags, "--beta-clone", "2.0", "--run-dir", str(tmp_path / "solo")])
    pop, solo = _modules(tmp_path / "pop"), _modules(tmp_path / "solo")
    assert set(solo) == {"actor", "critic", "aux_critic"}

    def diff(a: str, b: dict) -> float:
        return max((pop[f"{a}.{n}"][k] - v).abs().max().item() for n in b for k, v in b[n].items())

    assert diff("member1", solo) < 1e-5
    assert diff("member1", {n: pop[f"member0.{n}"] for n in solo}) > 1e-6
    report = json.loads((tmp_path / "pop" / "population.json").read_text())
    assert [m["settings"] for m in report["members"]] == [{"beta_clone": 1.0}, {"beta_clone": 2.0}]
    assert "aux/loss_distill" in (tmp_path / "pop" / "metrics.csv").read_text().splitlines()[0]


SYNC = [
    "--num-envs", "4", "--workers", "2", "--sync-collect", "true", "--rollout-steps", "16",
    "--minibatch-size", "32", "--eval-every", "0", "--eval-episodes", "2",
    "--checkpoint-every", "64", "--progress", "false",
]  # fmt: skip
SYNC_SWEEP = ["--sweep", "lr=1e-3,3e-4", "--sweep", "entropy_coef=0.0,0.02"]


# ten runs that start two worker processes each; the fast lane keeps a synchronous IMPALA
# population with two workers per member in test_bounded_mean_and_target_kl_members_match...
@pytest.mark.slow
@pytest.mark.parametrize("algo", ["impala", "appo"])
def test_sync_vtrace_members_match_standalone_runs_and_resume_as_they_do(tmp_path, algo):
    """``--sync-collect true`` IMPALA and APPO: four members with four settings (learning rate
    x entropy bonus) end where four standalone runs end, each collecting in two worker
    processes (a member's rows are split into its workers' blocks, seeded and sampled as
    theirs). Then every run is resumed for one more batch: the members again end where
    the resumed standalone runs end (new workers, fresh streams, as a standalone resume)."""
    import json

    main = load(algo).main
    run = tmp_path / "pop"
    main([*SYNC, *SYNC_SWEEP, "--total-frames", "128", "--run-dir", str(run)])
    settings = [(lr, ent) for lr in ("1e-3", "3e-4") for ent in ("0.0", "0.02")]
    solos = [tmp_path / f"solo{i}" for i in range(4)]
    for solo, (lr, ent) in zip(solos, settings):
        main([*SYNC, "--lr", lr, "--entropy-coef", ent, "--total-frames", "128",
              "--run-dir", str(solo)])  # fmt: skip

    def diffs() -> list[float]:
        pop = _modules(run)
        out = []
        for i, solo in enumerate(solos):
            state = _modules(solo)
            assert {f"member{i}.{n}" for n in state} <= set(pop)
            out.append(max(
                (pop[f"member{i}.{n}"][k].double() - v.double()).abs().max().item()
                for n in state for k, v in state[n].items()
            ))  # fmt: skip
        return out

    assert max(diffs()) < 1e-5, diffs()
    pop = _modules(run)
    apart = max((pop["member0.actor"][k] - v).abs().max().item()
                for k, v in pop["member3.actor"].items())  # fmt: skip
    assert apart > 1e-4  # the settings made different runs
    resume = ["--resume", "last", "--total-frames", "192"]
    main([*SYNC, *SYNC_SWEEP, *resume, "--run-dir", str(run)])
    finals = []
    for solo, (lr, ent) in zip(solos, settings):
        summary = main([*SYNC, "--lr", lr, "--entropy-coef", ent, *resume, "--run-dir", str(solo)])
        finals.append(summary["eval_return_mean"])
    assert max(diffs()) < 1e-5, diffs()
    # each member is evaluated on its own (deterministic) episodes as its standalone run is
    report = json.loads((run / "population.json").read_text())
    assert [m["eval_return_mean"] for m in report["members"]] == pytest.approx(finals)


@pytest.mark.parametrize("algo", ["ppo", "impala"])
def test_bounded_mean_and_target_kl_members_match_standalone_runs(tmp_path, algo):
    """--bounded-mean (a Normal policy whose mean is squashed into the action bounds by a
    module with buffers) and --target-kl (each member stops its own epochs) in a population:
    two members sweeping the learning rate on Pendulum-v1 end where two standalone runs end,
    and stop their updates at the same steps (the higher rate stops earlier). PPO's members
    step together (vectorised); IMPALA's run their own updates in turn."""
    main = load(algo).main
    if algo == "ppo":
        flags = [*FLAGS[:-6], "--eval-every", "0", "--eval-episodes", "2", "--progress", "false"]
        flags += ["--total-frames", "256", "--target-kl", "0.001"]
    else:
        flags = [*SYNC, "--total-frames", "128", "--target-kl", "0.002", "--epochs", "4"]
    flags += ["--env", "Pendulum-v1", "--bounded-mean", "true"]
    main([*flags, "--sweep", "lr=1e-2,1e-3", "--run-dir", str(tmp_path / "pop")])
    pop = _modules(tmp_path / "pop")
    steps = []
    for i, lr in enumerate(("1e-2", "1e-3")):
        main([*flags, "--lr", lr, "--run-dir", str(tmp_path / f"solo{i}")])
        solo = _modules(tmp_path / f"solo{i}")
        assert any(".net." in k for k in solo["actor"])  # the bounded actor
        steps.append(_grad_steps(tmp_path / f"solo{i}"))
        for name, state in solo.items():
            for k, v in state.items():
                got = pop[f"member{i}.{name}"][k]
                assert (got.double() - v.double()).abs().max().item() < 1e-5, (i, name, k)
    assert steps[0] != steps[1], steps  # the target stopped the two runs at different steps
    assert all(n < 8 for n in steps[0]), steps  # and it did stop them (of 4 x 2)
    assert [_grad_steps(tmp_path / "pop", member=str(i)) for i in range(2)] == steps
    for i in range(2):  # the last epoch run's KL, logged as the standalone run logs it
        assert _column(tmp_path / "pop", "approx_kl", str(i)) == pytest.approx(
            _column(tmp_path / f"solo{i}", "approx_kl"), rel=1e-4, abs=1e-7
        )


def _grad_steps(run_dir, member: str = "") -> list[float]:
    """The logged ``grad_steps`` of each batch (a population's rows of one member)."""
    return _column(run_dir, "grad_steps", member)


def _column(run_dir, name: str, member: str = "") -> list[float]:
    """A logged metric of each batch (a population's rows of one member)."""
    import csv

    with open(run_dir / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("member", "") == member]
    return [float(r[name]) for r in rows if r[name]]


@pytest.mark.parametrize("algo", ["impala", "appo"])
def test_vtrace_population_needs_synchronous_collection(capsys, algo):
    with pytest.raises(SystemExit):  # refused before anything starts (appo's default is sync)
        load(algo).main(["--population", "2", "--sync-collect", "false", "--progress", "false"])
    assert "--population / --sweep needs --sync-collect true" in capsys.readouterr().err


@pytest.mark.parametrize(
    "algo, sweep",
    [
        ("ppo", "bootstrap_truncated=true,false"),
        ("ppo", "normalize_reward=true,false"),  # ppo's reward normaliser is in the env
        ("a2c", "bootstrap_truncated=false,true"),
    ],
)
def test_sweep_of_a_shared_env_setting_is_refused(capsys, algo, sweep):
    """The members share one training env built with one value of these settings: a sweep
    over them would train every member with the base value under different labels."""
    name = sweep.split("=")[0]
    with pytest.raises(SystemExit):
        load(algo).main(["--sweep", "lr=1e-3,3e-4", "--sweep", sweep, "--progress", "false"])
    err = capsys.readouterr().err
    assert f"--sweep {name}: the members share one training env" in err
    assert "--" + name.replace("_", "-") in err


def test_sweeps_the_members_apply_themselves_are_accepted():
    """gamma (each member's reward normaliser has its own) and IMPALA's reward
    normalisation (applied by each member's learner, not the env) may be swept."""
    from rlkit.configs.impala import IMPALAConfig
    from rlkit.configs.ppo import PPOConfig

    cfg = PPOConfig(sweep=("gamma=0.9,0.99",), normalize_reward=True)
    assert cfg.population_members()[1][1] == {"gamma": 0.99}
    cfg = IMPALAConfig(sweep=("normalize_reward=true,false",), sync_collect=True)
    assert [s for _, s in cfg.population_members()] == [
        {"normalize_reward": True},
        {"normalize_reward": False},
    ]


NORMS = [
    "--normalize-obs", "true", "--normalize-reward", "true",
    "--running-advantage-norm", "true", "--normalize-advantage", "false",
]  # fmt: skip


@pytest.mark.parametrize("algo", ["ppo", "a2c"])
def test_members_keep_their_own_normalisers(tmp_path, algo):
    """Observation, reward and running-advantage statistics are per member: a population
    sweeping gamma (which sets each member's reward scale) ends where standalone runs end,
    normaliser statistics included; one RewardNorm over all rows would have mixed the
    members' returns (checked: the members' reward statistics differ)."""
    from rlkit.algorithms import load

    main = load(algo).main
    flags = [*FLAGS, *NORMS] if algo == "ppo" else [*FLAGS[:6], *FLAGS[8:], *NORMS]
    main([*flags, "--sweep", "gamma=0.99,0.9", "--run-dir", str(tmp_path / "pop")])
    pop = _modules(tmp_path / "pop")
    stats = [pop["reward_norm"][f"members.{i}.stats.var"] for i in range(2)]
    assert not torch.equal(*stats)  # the two members' returns have different spreads
    for i, gamma in enumerate(("0.99", "0.9")):
        main([*flags, "--gamma", gamma, "--run-dir", str(tmp_path / f"solo{i}")])
        solo = _modules(tmp_path / f"solo{i}")
        for name, state in solo.items():
            if name == "reward_norm":  # the population's: one RewardNorm per member
                mine = {k.split(f"members.{i}.", 1)[1]: v for k, v in pop[name].items()
                        if k.startswith(f"members.{i}.")}  # fmt: skip
            else:
                mine = {k: v for k, v in pop[f"member{i}.{name}"].items()}
            assert mine.keys() == state.keys(), (name, mine.keys(), state.keys())
            for k, v in state.items():
                assert (mine[k].double() - v.double()).abs().max().item() < 1e-5, (i, name, k)


def test_population_reward_norm_scales_each_members_rows_as_its_own_reward_norm():
    from rlkit.modules import PopulationRewardNorm, RewardNorm

    gen = torch.Generator().manual_seed(0)
    pop = PopulationRewardNorm([0.99, 0.5], num_envs=3)
    solo = [RewardNorm(gamma=0.99), RewardNorm(gamma=0.5)]
    for step in range(20):
        reward = torch.randn(6, 1, generator=gen) * torch.tensor([[1.0]] * 3 + [[50.0]] * 3)
        done = torch.rand(6, 1, generator=gen) < 0.2
        out = pop.observe(reward, done)
        ref = torch.cat(
            [solo[0].observe(reward[:3], done[:3]), solo[1].observe(reward[3:], done[3:])]
        )
        assert torch.equal(out, ref), step
    # hand-computed: the second member's variance is its own discounted returns' spread
    assert pop.members[1].stats.var.item() > 100 * pop.members[0].stats.var.item()
    with pytest.raises(ValueError, match="2 members x 3 envs = 6 rows"):
        pop.observe(torch.zeros(4, 1), torch.zeros(4, 1, dtype=torch.bool))


def test_population_refusals():
    from rlkit.algorithms import dqn

    with pytest.raises(ValueError, match="updates its own way"):
        dqn.main(["--total-frames", "1000", "--population", "2", "--progress", "false"])


@pytest.mark.parametrize("max_steps", [None, 40])
def test_members_are_evaluated_at_once_as_one_by_one(max_steps):
    """Deterministic evaluation of all members in one env (P blocks of the same episodes)
    gives each member exactly the returns of its own evaluation."""
    from rlkit.training.evaluation import Evaluator
    from rlkit.training.population import PopulationReport

    pop, _ = _population("ppo", SETTINGS, 2)
    evaluator = Evaluator("CartPole-v1", episodes=5, max_steps=max_steps)
    one_by_one = [evaluator(m.eval_policy()) for m in pop.members]
    report = PopulationReport(pop, target=None)
    assert report._evaluate_members(evaluator) == one_by_one
    assert report._evaluator is not None  # the vectorised path was taken
    assert len({mean for mean, _ in one_by_one}) > 1  # the members differ


def test_gymnax_init_and_terminal_time_limits_members_match_standalone_runs(tmp_path):
    """--init gymnax (each member's networks drawn from its own seed) and
    --bootstrap-truncated false with a 20-step limit (every member's envs report terminals at
    the limit) in a population of two seeds: each member ends where its standalone run ends,
    and the two differ from each other and from the orthogonal, bootstrapping run."""
    from rlkit.algorithms import ppo

    flags = [*FLAGS, "--eval-every", "0", "--max-episode-steps", "20"]
    flags += ["--init", "gymnax", "--bootstrap-truncated", "false"]
    ppo.main([*flags, "--population", "2", "--run-dir", str(tmp_path / "pop")])
    pop = _modules(tmp_path / "pop")
    for i in range(2):
        ppo.main([*flags, "--seed", str(i), "--run-dir", str(tmp_path / f"solo{i}")])
        solo = _modules(tmp_path / f"solo{i}")
        for name, state in solo.items():
            for k, v in state.items():
                got = pop[f"member{i}.{name}"][k]
                assert (got.double() - v.double()).abs().max().item() < 1e-5, (i, name, k)
    ppo.main(
        [
            *FLAGS,
            "--eval-every",
            "0",
            "--max-episode-steps",
            "20",
            "--run-dir",
            str(tmp_path / "plain"),
        ]
    )
    plain, solo1 = _modules(tmp_path / "plain"), _modules(tmp_path / "solo1")
    solo0 = _modules(tmp_path / "solo0")
    for other in (plain, solo1):
        assert any(not torch.equal(solo0["actor"][k], other["actor"][k]) for k in solo0["actor"])


def test_members_step_through_the_update_loops_key_contract(monkeypatch):
    """The update loop passes a loss only the keys it declares (select_inputs): a member
    loss that does not declare ``advantage`` does not get it, as in a standalone run (the
    members' losses run inside the loop; a population that passed its members the whole
    batch trained such a loss silently)."""
    from rlkit import keys
    from rlkit.objectives import MissingKeyError, PPOLoss

    declared = PPOLoss.in_keys.fget
    monkeypatch.setattr(
        PPOLoss,
        "in_keys",
        property(lambda self: [k for k in declared(self) if k != keys.ADVANTAGE]),
    )
    with pytest.raises(MissingKeyError, match=r"(?s)missing required key.*'advantage'"):
        _population("ppo", SETTINGS[:2], 1)


@pytest.mark.parametrize(("algo", "warned"), [("ppg", True), ("ppo", False)])
def test_a_population_that_updates_member_by_member_says_so_once(algo, warned, caplog):
    """A slower path is never silent: PPG's members update one after another (no vmapped
    form), which costs about P times one member's update; one warning line says so when the
    population is built. PPO's vmapped update says nothing."""
    settings = SETTINGS[:2]
    env = make_env("CartPole-v1", num_envs=N_ENVS * len(settings), seed=0)
    members = [load(algo).build(dataclasses.replace(_base(algo), **s), env) for s in settings]
    states = [torch.get_rng_state()] * len(settings)
    with caplog.at_level("WARNING", logger="rlkit.training.population"):
        PopulationLearner(
            members, states, num_envs=N_ENVS, seeds=[s["seed"] for s in settings], settings=settings
        )
    env.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "rlkit.training.population"]
    if warned:
        assert len(lines) == 1 and "one after another" in lines[0] and "2x" in lines[0], lines
    else:
        assert lines == []


# --------------------------------------------------------------------------- memory
#: a GRU / LSTM of 8 on every network (docs/memory.md); IMPALA and APPO train on whole rows
MEMORY = {
    "ppo": ("--recurrent", "gru", "--recurrent-size", "8", "--minibatch-size", "32",
            "--epochs", "2", "--sequence-length", "8"),
    "a2c": ("--recurrent", "lstm", "--recurrent-size", "8"),
    "rnd": ("--recurrent", "lstm", "--recurrent-size", "8", "--minibatch-size", "32"),
    "impala": ("--recurrent", "lstm", "--recurrent-size", "8", "--minibatch-size", "32"),
    "appo": ("--recurrent", "gru", "--recurrent-size", "8", "--minibatch-size", "32"),
}  # fmt: skip
MEMORY_SETTINGS = {
    "ppo": [SETTINGS[0], SETTINGS[1], dict(seed=2, clip_epsilon=0.1)],
    "a2c": [SETTINGS[0], SETTINGS[1], dict(seed=2, value_coef=0.25)],
    "rnd": [SETTINGS[0], SETTINGS[1], dict(seed=2, int_coef=0.5)],
    "impala": [SETTINGS[0], SETTINGS[1], dict(seed=2, entropy_coef=0.02)],
    "appo": [SETTINGS[0], SETTINGS[1], dict(seed=2, entropy_coef=0.02)],
}


def _equal(a, b) -> bool:
    """Every module's parameters and buffers (an intrinsic reward's too) equal, bit for bit."""
    one, two = a.modules(), b.modules()
    assert one.keys() == two.keys()
    return all(
        torch.equal(v, two[name].state_dict()[k])
        for name, module in one.items()
        for k, v in module.state_dict().items()
    )


@pytest.mark.parametrize(
    "algo", ["ppo", "a2c", "rnd", "impala", pytest.param("appo", marks=pytest.mark.slow)]
)
def test_members_with_memory_match_their_standalone_recurrent_runs(algo, caplog):
    """``--recurrent`` members (torch.vmap has no rule for nn.GRU / nn.LSTM) update one after
    another, each in its own random stream with its own minibatch generator, and collect
    with their own carried state on their own rows: three members with three settings end,
    after three batches, bit for bit where three standalone recurrent runs end (RND: its
    predictor, intrinsic critic and statistics too, each member's over its own rows)."""
    settings = MEMORY_SETTINGS[algo]
    with caplog.at_level("WARNING", logger="rlkit.training.population"):
        pop, metrics = _population(algo, settings, 3, extra=MEMORY[algo])
    assert pop.sequential and pop.members[0].memory.on
    lines = [r.getMessage() for r in caplog.records if r.name == "rlkit.training.population"]
    assert len(lines) == 1 and "one after another" in lines[0], lines
    for i, setting in enumerate(settings):
        assert _equal(pop.members[i], _standalone(algo, setting, 3, MEMORY[algo])), (i, setting)
    start = load(algo).build(
        dataclasses.replace(_base(algo, MEMORY[algo]), seed=0),
        make_env("CartPole-v1", num_envs=N_ENVS),
    )
    assert _max_diff(pop.members[0], start) > 1e-3  # and they did train
    assert not _equal(pop.members[0], pop.members[1])  # different runs
    assert metrics[-1]["members_active"] == len(settings)


def test_a_diverged_member_with_memory_is_stopped_and_the_others_go_on():
    extra = MEMORY["ppo"]
    pop, metrics = _population("ppo", MEMORY_SETTINGS["ppo"], 3, poison=1, extra=extra)
    assert set(pop.stopped) == {1} and "non-finite" in pop.stopped[1], pop.stopped
    assert metrics[-1]["members_active"] == 2
    for i in (0, 2):
        assert _equal(pop.members[i], _standalone("ppo", MEMORY_SETTINGS["ppo"][i], 3, extra))


def test_a_population_with_memory_resumes_exactly(tmp_path):
    """A recurrent population saved through the engine's checkpoint payload and loaded into a
    fresh one (as a resume does) continues bit for bit: the same update on the same batch
    (collected with the carried state) gives the same parameters, optimiser moments, random
    streams and minibatch generators. (The carried state itself restarts from zero at a
    resume, with the envs' episodes, in a population as in a standalone run.)"""
    from rlkit.training import checkpoint as ckpt
    from rlkit.training.engine import _apply, _payload

    extra = MEMORY["ppo"]
    settings = [MEMORY_SETTINGS["ppo"][0], MEMORY_SETTINGS["ppo"][2]]
    cfg = _base("ppo", extra)
    pop, _ = _population("ppo", settings, 1, extra=extra)
    env = make_env("CartPole-v1", num_envs=N_ENVS * len(settings), seed=7)
    collector = make_collector(env, pop.collect_policy(), frames_per_batch=pop.frames_per_batch)
    batch = next(iter(collector))
    collector.shutdown()
    assert batch["policy_state_h"].abs().sum() > 0  # the batch carries a state
    path = tmp_path / "pop.pt"
    ckpt.atomic_save(_payload(cfg, pop, Counters()), path)
    fresh, _ = _population("ppo", settings, 0, extra=extra)
    assert not _equal(fresh.members[0], pop.members[0])
    _apply(ckpt.load(path), path, fresh, Counters(), {})
    for p in (pop, fresh):
        ctx = _ctx(0)
        ctx.counters.frames = 3 * N_ENVS * STEPS
        p.update(batch.clone(), ctx)
    for name, module in pop.modules().items():
        for k, v in module.state_dict().items():
            assert torch.equal(v, fresh.modules()[name].state_dict()[k]), (name, k)
    for name, opt in pop.optimizers().items():
        a, b = opt.state_dict()["state"], fresh.optimizers()[name].state_dict()["state"]
        assert a and all(torch.equal(a[i][k], b[i][k]) for i in a for k in a[i])
    for a, b in zip(pop.rngs, fresh.rngs):
        assert torch.equal(a.state, b.state)
    for a, b in zip(pop.generators, fresh.generators):
        assert torch.equal(a.get_state(), b.get_state())


@pytest.mark.slow  # three recipe runs with ICM: about 20 s
def test_members_with_an_intrinsic_reward_match_their_standalone_runs(tmp_path):
    """``recipes/ppo.py --intrinsic icm --sweep`` (no memory): the policy and the bonus
    train in lockstep, so the members update one after another; each member's bonus is
    built on the shared env, then sized to its own rows, and keeps its own statistics and
    per-env returns: both members end bit for bit where their standalone runs end."""
    from rlkit.algorithms import ppo

    flags = [
        "--num-envs", "4", "--rollout-steps", "16", "--epochs", "2", "--minibatch-size", "32",
        "--intrinsic", "icm", "--total-frames", "128", "--eval-every", "0",
        "--eval-episodes", "2", "--progress", "false",
    ]  # fmt: skip
    ppo.main([*flags, "--sweep", "lr=1e-3,3e-4", "--run-dir", str(tmp_path / "pop")])
    pop = _modules(tmp_path / "pop")
    for i, lr in enumerate(("1e-3", "3e-4")):
        ppo.main([*flags, "--lr", lr, "--run-dir", str(tmp_path / f"solo{i}")])
        solo = _modules(tmp_path / f"solo{i}")
        assert "intrinsic" in solo
        for name, state in solo.items():
            for k, v in state.items():
                assert torch.equal(pop[f"member{i}.{name}"][k], v), (i, name, k)


@pytest.mark.slow  # six recipe runs: about 20 s
def test_a_resumed_population_with_memory_matches_its_resumed_standalone_runs(tmp_path):
    """``recipes/ppo.py --recurrent gru --sweep``: two members trained for two batches, then
    resumed for one more, end bit for bit where two standalone recurrent runs, stopped and
    resumed the same way, end (the envs restart their episodes, so the carried state
    restarts from zero in both). Before the members' streams were restored after the
    collector's probe, each resumed member was one draw ahead (9e-4 apart after a batch)."""
    from rlkit.algorithms import ppo

    flags = [
        "--num-envs", "4", "--rollout-steps", "16", "--epochs", "2", "--minibatch-size", "32",
        "--recurrent", "gru", "--recurrent-size", "8", "--eval-every", "0",
        "--eval-episodes", "2", "--checkpoint-every", "64", "--progress", "false",
    ]  # fmt: skip
    runs = [(tmp_path / "pop", ["--sweep", "lr=1e-3,3e-4"])]
    runs += [(tmp_path / f"solo{i}", ["--lr", lr]) for i, lr in enumerate(("1e-3", "3e-4"))]
    for run_dir, own in runs:
        ppo.main([*flags, *own, "--total-frames", "128", "--run-dir", str(run_dir)])
    for run_dir, own in runs:
        ppo.main([*flags, *own, "--total-frames", "192", "--resume", "last",
                  "--run-dir", str(run_dir)])  # fmt: skip
    pop = _modules(tmp_path / "pop")
    for i in range(2):
        solo = _modules(tmp_path / f"solo{i}")
        for name, state in solo.items():
            for k, v in state.items():
                assert torch.equal(pop[f"member{i}.{name}"][k], v), (i, name, k)
