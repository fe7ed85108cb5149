"""The one update loop (rlkit.training.update) and the contracts it makes loud.

Each test states the wrong wiring it catches. References are written here: a hand-made SGD step,
plain autograd on the whole minibatch, counts of optimiser steps.
"""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from tensordict import TensorDict
from torch import nn

from rlkit.algorithms.onpolicy import check_schedules
from rlkit.objectives import A2CLoss, MissingKeyError, PPOLoss
from rlkit.training.engine import Context, Counters
from rlkit.training.update import LossContractError, LossGroup, update_loop


def _ctx() -> Context:
    fabric = SimpleNamespace(world_size=1, device=torch.device("cpu"))
    return Context(fabric, total_frames=10_000, counters=Counters())


class _Quadratic(nn.Module):
    """loss_a = sum((w_a - 1)^2 * x), loss_b = sum((w_b + 2)^2 * x) over a minibatch mean;
    optional extra terms to probe the contracts."""

    def __init__(self, extra: dict | None = None, reads: tuple = ()) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.zeros(3))
        self.b = nn.Parameter(torch.zeros(3))
        self.extra = extra or {}
        self.reads = reads
        self.in_keys = ["x"]

    def forward(self, td):
        x = td.get("x").mean()
        out = {
            "loss_a": ((self.a - 1) ** 2).sum() * x,
            "loss_b": ((self.b + 2) ** 2).sum() * x,
            "diag": x.detach(),
        }
        for key in self.reads:
            out["diag_read"] = td.get(key).float().mean()
        for name, fn in self.extra.items():
            out[name] = fn(self)
        return TensorDict(out, batch_size=[])


def _data(n: int = 8) -> TensorDict:
    return TensorDict(
        {"x": torch.linspace(0.5, 1.5, n), "other": torch.ones(n), ("next", "r"): torch.ones(n)},
        [n],
    )


def _sgd(params, lr: float = 0.1) -> torch.optim.SGD:
    return torch.optim.SGD(list(params), lr=lr)


def test_every_term_is_optimised_by_its_group_as_a_hand_step_says():
    """Two groups over one loss: each parameter moves by -lr * d(its group's terms)."""
    loss = _Quadratic()
    data = _data()
    groups = [
        LossGroup("a", loss, _sgd([loss.a]), terms=("loss_a",)),
        LossGroup("b", loss, _sgd([loss.b])),  # the rest: loss_b
    ]
    update_loop(groups, data, _ctx())
    x = data.get("x").mean()
    # reference: w <- w - lr * 2 (w - c) x, from w = 0
    torch.testing.assert_close(loss.a.detach(), torch.full((3,), 0.1 * 2 * x.item()))
    torch.testing.assert_close(loss.b.detach(), torch.full((3,), -0.1 * 2 * 2 * x.item()))


def test_an_extra_term_of_a_subclass_is_optimised_not_dropped():
    """A loss_kl a user adds lands in the group with terms=None (it was dropped by name)."""
    loss = _Quadratic(extra={"loss_kl": lambda m: 10.0 * (m.a**2).sum()})
    groups = [
        LossGroup("a", loss, _sgd([loss.a], lr=0.01)),
        LossGroup("b", loss, _sgd([loss.b]), terms=("loss_b",)),
    ]
    update_loop(groups, _data(), _ctx())
    x = _data().get("x").mean().item()
    # d/da [(a-1)^2 x + 10 a^2] at a = 0: -2x; the step is +0.01 * 2x (the kl gradient is 0
    # at a = 0, so take a second step from there to see it)
    first = loss.a.detach().clone()
    torch.testing.assert_close(first, torch.full((3,), 0.01 * 2 * x))
    update_loop(groups, _data(), _ctx())
    a = first
    expected = a - 0.01 * (2 * (a - 1) * x + 20 * a)
    torch.testing.assert_close(loss.a.detach(), expected)


def test_a_term_no_group_claims_raises():
    loss = _Quadratic(extra={"loss_extra": lambda m: (m.a**2).sum()})
    groups = [
        LossGroup("a", loss, _sgd([loss.a]), terms=("loss_a",)),
        LossGroup("b", loss, _sgd([loss.b]), terms=("loss_b",)),
    ]
    with pytest.raises(LossContractError, match="loss_extra"):
        update_loop(groups, _data(), _ctx())


def test_a_claimed_term_the_loss_does_not_return_raises():
    loss = _Quadratic()
    groups = [LossGroup("a", loss, _sgd([loss.a, loss.b]), terms=("loss_a", "loss_typo"))]
    with pytest.raises(LossContractError, match="loss_typo"):
        update_loop(groups, _data(), _ctx())


def test_a_term_that_reaches_none_of_its_groups_parameters_raises():
    loss = _Quadratic()
    groups = [
        LossGroup("a", loss, _sgd([loss.a]), terms=("loss_b",)),  # wrong wiring: b's term
        LossGroup("b", loss, _sgd([loss.b]), terms=("loss_a",)),
    ]
    with pytest.raises(LossContractError, match="reaches none"):
        update_loop(groups, _data(), _ctx())


@pytest.mark.parametrize(
    "term",
    [
        lambda m: torch.tensor(3.0),  # a constant (not 0: a switched-off term)
        lambda m: ((m.a - 1) ** 2).sum().detach(),  # from the networks, then detached
    ],
    ids=["constant", "detached"],
)
def test_a_term_without_a_graph_is_refused_not_skipped(term):
    """A claimed loss_* term with no gradient reaches none of the group's parameters by
    construction: refused like a term wired to the wrong group (it was skipped silently)."""
    loss = _Quadratic(extra={"loss_const": term})
    groups = [LossGroup("ab", loss, _sgd([loss.a, loss.b]))]
    with pytest.raises(LossContractError, match="'loss_const'.*no gradient"):
        update_loop(groups, _data(), _ctx())


def test_a_nan_term_without_a_graph_stops_the_update_naming_the_term():
    """A NaN loss_* term adds nothing to the gradient (its gradient is 0), so a check of the
    gradient alone lets it through every step; the loss value is checked too. The term here
    has a graph that does not depend on the parameters' values (0 * a + nan), so the claim
    check passes and the finiteness check is the one that must fire."""
    from rlkit.training.errors import NonFiniteError

    loss = _Quadratic(extra={"loss_nan": lambda m: 0.0 * m.a.sum() + float("nan")})
    before = loss.a.detach().clone()
    groups = [LossGroup("ab", loss, _sgd([loss.a, loss.b]))]
    with pytest.raises(NonFiniteError, match=r"loss_nan=nan"):
        update_loop(groups, _data(), _ctx())
    assert torch.equal(loss.a.detach(), before)  # nothing stepped


def _ppo_with(term):
    class PPOWithTerm(PPOLoss):
        def forward(self, td):
            out = super().forward(td)
            out.set("loss_extra", term(out))
            return out

    return PPOWithTerm


@pytest.mark.parametrize(
    ("term", "status", "message"),
    [
        # torch's Categorical.mean is NaN: a real mistake, a NaN term without a graph
        (
            lambda out: torch.distributions.Categorical(probs=torch.ones(2)).mean,
            3,
            "loss_extra=nan: training stopped; no checkpoint had been written yet. loss_extra "
            "has no graph",
        ),
        (lambda out: torch.tensor(0.5), 2, "'loss_extra' of PPOWithTerm has no gradient"),
    ],
    ids=["nan", "constant"],
)
def test_a_recipe_stops_on_a_term_without_a_graph_in_one_line(
    term, status, message, monkeypatch, capsys, tmp_path
):
    """Through a recipe: a NaN term without a graph exits 3 (it ran to the end with exit 0 and
    nan in every metrics row), a constant term is refused (exit 2), each in one line."""
    from rlkit.algorithms import ppo
    from rlkit.training.cli import cli, parse

    monkeypatch.setattr(ppo, "PPOLoss", _ppo_with(term))
    argv = ["--total-frames", "512", "--eval-every", "0", "--progress", "false"]
    argv += ["--run-dir", str(tmp_path / "run")]
    with pytest.raises(SystemExit) as stop:
        cli(lambda _: ppo.train(parse("ppo", argv)))
    assert stop.value.code == status
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0] == err[-1] and message in err[-1], err


def test_two_groups_may_not_step_one_parameter():
    loss = _Quadratic()
    groups = [
        LossGroup("a", loss, _sgd([loss.a, loss.b]), terms=("loss_a",)),
        LossGroup("b", loss, _sgd([loss.b]), terms=("loss_b",)),
    ]
    with pytest.raises(LossContractError, match="same parameter"):
        update_loop(groups, _data(), _ctx())


def test_an_idle_group_keeps_its_parameters_bit_identical_and_counts_its_own_epochs():
    """Adam's momentum would keep moving an idle network that got a zero-weighted loss."""
    loss = _Quadratic()
    opt_a = torch.optim.Adam([loss.a], lr=0.1)
    opt_b = torch.optim.Adam([loss.b], lr=0.1)
    groups = [
        LossGroup("a", loss, opt_a, epochs=1, terms=("loss_a",)),
        LossGroup("b", loss, opt_b, epochs=4, terms=("loss_b",)),
    ]
    steps = {"a": 0, "b": 0}
    for name, opt in (("a", opt_a), ("b", opt_b)):
        opt.register_step_post_hook(lambda *_, n=name: steps.__setitem__(n, steps[n] + 1))
    snapshots = []

    def minibatches(data, generator):
        snapshots.append(loss.a.detach().clone())
        return (data[:4], data[4:])

    update_loop(groups, _data(), _ctx(), minibatches=minibatches)
    assert steps == {"a": 2, "b": 8}  # 1 epoch x 2 minibatches, 4 epochs x 2 minibatches
    for later in snapshots[2:]:  # epochs 2-4: a is idle
        assert torch.equal(later, snapshots[1]) or torch.equal(later, loss.a.detach())
    assert torch.equal(snapshots[-1], loss.a.detach())


def test_gradient_accumulation_equals_one_backward_of_the_whole_minibatch():
    torch.manual_seed(0)
    net = nn.Linear(4, 1)
    ref = nn.Linear(4, 1)
    ref.load_state_dict(net.state_dict())

    class _Reg(nn.Module):
        in_keys = ["x", "y"]

        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, td):
            err = self.model(td.get("x")).squeeze(-1) - td.get("y")
            return TensorDict({"loss_mse": err.square().mean()}, batch_size=[])

    data = TensorDict({"x": torch.randn(10, 4), "y": torch.randn(10)}, [10])
    update_loop([LossGroup("m", _Reg(net), _sgd(net.parameters()))], data, _ctx(), grad_accum=3)
    err = ref(data.get("x")).squeeze(-1) - data.get("y")
    err.square().mean().backward()
    with torch.no_grad():
        for p in ref.parameters():
            p -= 0.1 * p.grad
    for p, q in zip(net.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q)


class _Drift(nn.Module):
    """loss_w = (w - 5)^2 (summed), and an approx_kl that is the squared distance the
    parameter has moved since the update began (a stand-in for KL from the acting policy)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))
        self.start = torch.zeros(1)
        self.in_keys = ["x"]
        self.out_keys = ["loss_w", "approx_kl"]

    def forward(self, td):
        return TensorDict(
            {
                "loss_w": ((self.w - 5) ** 2).sum() * td.get("x").mean(),
                "approx_kl": ((self.w - self.start) ** 2).sum().detach(),
            },
            batch_size=[],
        )


def _chunks(size: int):
    def minibatches(data, generator):
        return [data[i : i + size] for i in range(0, data.shape[0], size)]

    return minibatches


def test_target_kl_stops_the_epochs_at_the_first_minibatch_over_1_5_target():
    """SB3's rule written out: before each step, if approx_kl > 1.5 target_kl, stop the
    group's epochs (that minibatch does not step). A second group without a target runs all
    its epochs. SGD on (w - 5)^2 x with x = 1: w <- w - lr 2 (w - 5)."""
    drift = _Drift()
    other = _Quadratic()
    data = TensorDict({"x": torch.ones(8)}, [8])
    target, lr = 0.5, 0.1
    groups = [
        LossGroup("policy", drift, _sgd([drift.w], lr), epochs=5, target_kl=target),
        LossGroup("other", other, _sgd([other.a, other.b], lr), epochs=5),
    ]
    out = update_loop(groups, data, _ctx(), minibatches=_chunks(2))  # 4 minibatches x 5 epochs
    w, steps = 0.0, 0  # the reference loop
    for _ in range(5 * 4):
        if (w - 0.0) ** 2 > 1.5 * target:
            break
        w, steps = w - lr * 2 * (w - 5), steps + 1
    assert steps == 1  # 0 -> 1.0 (kl 1.0 > 0.75): one step, then stop
    torch.testing.assert_close(drift.w.detach(), torch.tensor([w]))
    assert out["grad_steps"] == steps
    assert out["approx_kl"] == pytest.approx(0.5)  # the epoch's KLs before its steps: 0, 1
    # the other group took all 20 steps: a_k = 1 - 0.8^k for SGD on (a - 1)^2
    torch.testing.assert_close(other.a.detach(), torch.full((3,), 1 - 0.8**20))
    # a looser target lets more steps through, counted the same way
    drift2 = _Drift()
    group = LossGroup("policy", drift2, _sgd([drift2.w], 0.02), epochs=5, target_kl=2.0)
    out = update_loop([group], data, _ctx(), minibatches=_chunks(2))
    w, steps, kls = 0.0, 0, []
    for step in range(20):
        if step % 4 == 0:  # a new epoch: its own KLs (SB3 logs the last epoch's mean)
            kls = []
        kls.append(w**2)
        if w**2 > 3.0:
            break
        w, steps = w - 0.02 * 2 * (w - 5), steps + 1
    assert 4 < steps < 20 and out["grad_steps"] == steps  # stopped after its first epoch
    torch.testing.assert_close(drift2.w.detach(), torch.tensor([w]))
    assert out["approx_kl"] == pytest.approx(sum(kls) / len(kls), rel=1e-5)


def test_a_batch_without_a_step_warns_once(monkeypatch):
    """A KL already over 1.5 x target at the first minibatch (APPO's target lag, say): no
    step, grad_steps 0, and one RuntimeWarning naming the group and the limit; the next such
    batch is quiet, a batch that steps does not warn."""
    import warnings

    from rlkit.training import update as update_mod

    monkeypatch.setattr(update_mod, "_NO_STEP_WARNED", set())
    data = TensorDict({"x": torch.ones(4)}, [4])
    drift = _Drift()
    drift.start = torch.full((1,), -1.0)  # w = 0 is already 1.0 from where the KL is measured
    group = LossGroup("policy", drift, _sgd([drift.w]), epochs=3, target_kl=0.5)
    with pytest.warns(RuntimeWarning, match=r"'policy' took no gradient step.*\(0\.75\)"):
        out = update_loop([group], data, _ctx(), minibatches=_chunks(2))
    assert out["grad_steps"] == 0 and drift.w.item() == 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = update_loop([group], data, _ctx(), minibatches=_chunks(2))  # warned already
        assert out["grad_steps"] == 0
        fresh = _Drift()  # KL 0 at the first minibatch: steps, no warning
        ok = LossGroup("value", fresh, _sgd([fresh.w]), epochs=1, target_kl=0.5)
        assert update_loop([ok], data, _ctx(), minibatches=_chunks(2))["grad_steps"] >= 1


def test_a_nan_kl_is_not_a_quiet_stop_but_the_non_finite_error():
    """A NaN approx_kl is not "within" the target: the group steps and the optimiser's
    finiteness check raises, as it does without --target-kl (a population member with a NaN
    KL is stopped the same way), rather than the update stopping quietly every batch."""
    from rlkit.training.errors import NonFiniteError

    drift = _Drift()
    drift.w.data.fill_(float("nan"))
    group = LossGroup("policy", drift, _sgd([drift.w]), epochs=2, target_kl=0.5)
    with pytest.raises(NonFiniteError):
        update_loop([group], TensorDict({"x": torch.ones(4)}, [4]), _ctx())


def test_target_kl_needs_a_loss_that_reports_approx_kl_and_a_positive_target():
    loss = _Quadratic()
    group = LossGroup("a", loss, _sgd([loss.a, loss.b]), target_kl=0.01)
    with pytest.raises(LossContractError, match="approx_kl.*--target-kl"):
        update_loop([group], _data(), _ctx())
    with pytest.raises(ValueError, match="target_kl must be > 0"):
        LossGroup("a", loss, _sgd([loss.a]), target_kl=0.0)


def test_target_kl_flag_stops_ppo_early_and_a2c_refuses_it(capsys):
    """--target-kl on PPO's learner: a tiny target stops each batch's update after a step or
    two of its 4 x 4 (approx_kl is 0 before the first step, so at least one is taken); the
    default runs all 16."""
    from rlkit.data.collector import make_collector

    flags = ["--num-envs", "4", "--rollout-steps", "32", "--epochs", "4", "--minibatch-size", "32"]
    for extra, check in [(["--target-kl", "1e-6"], lambda n: 1 <= n < 16), ([], lambda n: n == 16)]:
        cfg, env, learner = _recipe_learner("ppo", [*flags, *extra])
        steps: list[int] = []
        learner.optimizer.register_step_post_hook(lambda *_, steps=steps: steps.append(1))
        collector = make_collector(env, learner.collect_policy(), frames_per_batch=cfg.batch_size)
        out = learner.update(next(iter(collector)), _ctx())
        collector.shutdown()
        assert check(len(steps)), (extra, len(steps))
        assert out.get("grad_steps", 16.0) == len(steps)
    with pytest.raises(SystemExit):
        _parse("a2c", ["--target-kl", "0.01"])
    assert "--target-kl" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _parse("ppo", ["--target-kl", "0"])
    assert "--target-kl must be > 0" in capsys.readouterr().err


def test_a_declared_key_missing_from_the_batch_is_named():
    loss = _Quadratic()
    loss.in_keys = ["x", "advantage"]
    with pytest.raises(MissingKeyError, match="advantage.*_Quadratic|_Quadratic.*advantage"):
        update_loop([LossGroup("all", loss, _sgd(loss.parameters()))], _data(), _ctx())


def test_a_key_read_without_declaring_it_is_a_missing_key_error_naming_it():
    """The batch is pre-selected to the declared keys; an undeclared read used to get None."""
    loss = _Quadratic(reads=(("next", "r"),))
    with pytest.raises(MissingKeyError, match=r"\('next', 'r'\)|next.*r.*not among"):
        update_loop([LossGroup("all", loss, _sgd(loss.parameters()))], _data(), _ctx())
    loss.in_keys = ["x", ("next", "r")]  # declared: fine
    update_loop([LossGroup("all", loss, _sgd(loss.parameters()))], _data(), _ctx())


def _actor_critic():
    from rlkit.modules import categorical_actor, value_critic

    return categorical_actor(4, 2, hidden=(8,)), value_critic(4, hidden=(8,))


@pytest.mark.parametrize("name", ["clip_epsilon", "kl_cof"])
def test_a_schedule_that_nothing_reads_raises(name):
    actor, critic = _actor_critic()
    with pytest.raises(ValueError, match=name):
        check_schedules(A2CLoss(actor, critic), {name: (0.2, 0.0)})
    check_schedules(PPOLoss(actor, critic), {"clip_epsilon": (0.2, 0.0)})  # a real one


def test_a_learner_refuses_an_unknown_schedule_name():
    from rlkit.algorithms.onpolicy import PolicyGradientLearner
    from rlkit.training.optim import make_optimizer, unique_parameters
    from rlkit.value import GAE

    actor, critic = _actor_critic()
    with pytest.raises(ValueError, match="kl_cof"):
        PolicyGradientLearner(
            algo="a2c",
            actor=actor,
            critic=critic,
            estimator=GAE(gamma=0.99, lmbda=0.95, value_network=critic),
            loss=A2CLoss(actor, critic),
            optimizer=make_optimizer("adam", unique_parameters(actor, critic), lr=1e-3, eps=1e-5),
            frames_per_batch=64,
            epochs=1,
            loss_schedules={"kl_cof": (0.1, 0.0)},
        )


_CONFIGS = {"a2c": "A2CConfig", "impala": "IMPALAConfig", "ppo": "PPOConfig"}


def _parse(algo: str, argv: list[str]):
    from rlkit.training import parse_config
    from tests.test_engine import load_recipe

    recipe = load_recipe(algo)
    return recipe, parse_config(getattr(recipe, _CONFIGS[algo]), argv, presets=recipe.PRESETS)


def _recipe_learner(algo: str, argv: list[str]):
    from rlkit.envs import make_env

    recipe, cfg = _parse(algo, argv)
    env = make_env(cfg.env, num_envs=cfg.num_envs, seed=0)
    return cfg, env, recipe.build(cfg, env)


@pytest.mark.parametrize("num_envs", [8, 16, 3])
def test_a2c_makes_exactly_one_gradient_step_per_batch_at_any_env_count(num_envs):
    """A2C's minibatch was 40 = 8 x 5 samples: 16 envs made two shuffled steps per batch."""
    from rlkit.data.collector import make_collector

    cfg, env, learner = _recipe_learner("a2c", ["--num-envs", str(num_envs)])
    steps = []
    learner.optimizer.register_step_post_hook(lambda *_: steps.append(1))
    collector = make_collector(env, learner.collect_policy(), frames_per_batch=cfg.batch_size)
    batch = next(iter(collector))
    learner.update(batch, _ctx())
    assert len(steps) == 1
    collector.shutdown()


def test_a2c_without_a_kl_measure_refuses_the_kl_schedule_before_training(capsys):
    """A2C accepted it and failed at the first update, after the run had started."""
    with pytest.raises(SystemExit):
        _parse("a2c", ["--lr-schedule", "kl"])
    assert "--lr-schedule kl" in capsys.readouterr().err


def test_the_kl_schedule_needs_a_loss_that_reports_approx_kl():
    """The learner's own guard, for a loss that reports no approx_kl (A2C's learner given a
    kl schedule in research code: its config refuses --lr-schedule kl)."""
    from rlkit.data.collector import make_collector
    from rlkit.envs import make_env
    from rlkit.training.schedules import KLAdaptiveLR, LRSchedule

    recipe, cfg = _parse("a2c", [])
    env = make_env(cfg.env, num_envs=cfg.num_envs, seed=0)
    learner = recipe.build(cfg, env)
    learner.lr_schedule = LRSchedule("kl", cfg.lr, kl=KLAdaptiveLR(lr=cfg.lr, target=0.01))
    collector = make_collector(env, learner.collect_policy(), frames_per_batch=cfg.batch_size)
    with pytest.raises(LossContractError, match="approx_kl"):
        learner.update(next(iter(collector)), _ctx())
    collector.shutdown()


@pytest.mark.slow  # a fresh interpreter
def test_importing_rlkit_leaves_tensordict_and_the_warning_filters_alone():
    """rlkit patched tensordict.base.importlib and installed warning filters on import."""
    code = (
        "import warnings, importlib\n"
        "import torch, tensordict, tensordict.base, torchrl, lightning, gymnasium\n"
        "import torchrl.collectors, torchrl.envs, torchrl.objectives, torchrl.data\n"
        "before = list(warnings.filters)\n"
        "import rlkit, rlkit.training, rlkit.objectives, rlkit.modules, rlkit.value\n"
        "import rlkit.envs, rlkit.data.collector\n"
        "import tensordict.base as b\n"
        "assert b.importlib is importlib, 'tensordict.base.importlib was replaced'\n"
        "added = [f for f in warnings.filters if f not in before]\n"
        "assert not added, added\n"
        "print('untouched')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "untouched" in out.stdout


def test_a_run_restores_tensordict_after_patching_it_for_speed():
    import importlib

    import tensordict.base as b

    from rlkit import _speedups

    with _speedups.patched():
        assert b.importlib is not importlib
    assert b.importlib is importlib


def test_a_learner_names_an_undeclared_key_a_custom_loss_reads():
    """A PPOLoss subclass reading ('next', 'reward') died with AttributeError on None."""
    from rlkit.algorithms.onpolicy import (
        PolicyGradientLearner,
        build_actor_critic,
        policy_gradient_settings,
        policy_optimizer,
    )
    from rlkit.configs.onpolicy import ClipConfig
    from rlkit.data.collector import make_collector
    from rlkit.value import GAE

    class _RewardPPO(PPOLoss):
        def _policy_terms(self, log_prob, advantage, tensordict):
            out = super()._policy_terms(log_prob, advantage, tensordict)
            reward = tensordict.get(("next", "reward"))
            out["reward_seen"] = reward.float().mean()
            return out

    from rlkit.envs import make_env

    cfg = ClipConfig(num_envs=2, rollout_steps=8, minibatch_size=16, epochs=1)
    env = make_env("CartPole-v1", num_envs=2, seed=0)
    actor, critic, _ = build_actor_critic(cfg, env)
    learner = PolicyGradientLearner(
        algo="ppo",
        actor=actor,
        critic=critic,
        estimator=GAE(gamma=0.99, lmbda=0.95, value_network=critic),
        loss=_RewardPPO(actor, critic),
        optimizer=policy_optimizer(cfg, actor, critic),
        **policy_gradient_settings(cfg),
    )
    collector = make_collector(env, actor, frames_per_batch=16)
    with pytest.raises(MissingKeyError, match=r"_RewardPPO reads \('next', 'reward'\)"):
        learner.update(next(iter(collector)), _ctx())
    collector.shutdown()
