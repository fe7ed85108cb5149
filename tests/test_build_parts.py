"""A recipe's loss and estimator are replaceable through ``build(cfg, env, *, loss_cls=...,
estimator_cls=...)``: the class given gets the recipe's own arguments, so every flag and the
env's preset still act, and a class that cannot stand in is refused in one line."""

from __future__ import annotations

import csv
import functools
import importlib
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

from rlkit.envs import make_env
from rlkit.objectives import A2CLoss, PPOLoss
from rlkit.training import run
from rlkit.training.cli import parse

QUIET = ["--eval-every", "0", "--eval-episodes", "2", "--progress", "false"]


# the acceptance case: a PPOLoss subclass with an extra term, through ppo.build ----------------
class LogProbPenaltyPPOLoss(PPOLoss):
    """PPO plus a small penalty on the squared log-probability of the stored actions."""

    extra_loss_terms = ("loss_logp_penalty",)

    def __init__(self, actor, critic, *, penalty: float = 1e-3, **kwargs):
        super().__init__(actor, critic, **kwargs)
        self.penalty = penalty

    def _policy_terms(self, log_prob, advantage, td):
        out = super()._policy_terms(log_prob, advantage, td)
        out["loss_logp_penalty"] = self.penalty * log_prob.square().mean()
        return out


def _metrics(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_a_ppo_loss_subclass_trains_with_the_recipes_flags_and_preset(tmp_path):
    from rlkit.algorithms import ppo

    argv = ["--env", "Pendulum-v1", "--entropy-coef", "0.05", "--value-lr", "5e-4"]
    # kept short: two batches of 4 envs (the preset's) x 256 steps, one epoch over each
    argv += ["--total-frames", "2048", "--rollout-steps", "256", "--epochs", "1"]
    argv += ["--run-dir", str(tmp_path), *QUIET]
    cfg = parse("ppo", argv)
    built = []

    def build(cfg, env):
        learner = ppo.build(cfg, env, loss_cls=LogProbPenaltyPPOLoss)
        built.append(learner)
        return learner

    summary = run(cfg, build, algo="ppo")
    assert summary["frames"] == 2048
    (learner,) = built
    # the loss given, with the flags typed and the recipe's settings
    assert type(learner.loss) is LogProbPenaltyPPOLoss
    assert learner.loss.entropy_coef == 0.05
    # Pendulum-v1's preset (rlkit.configs.ppo.PRESETS): gamma 0.9 (default 0.98), running
    # observation normalisation (default off), lr 1e-3 constant
    assert learner.estimator.gamma == 0.9
    assert learner.obs_norm is not None
    # --value-lr: the critic trains as a group of its own, at 5e-4 (constant schedule)
    optimizers = learner.optimizers()
    assert set(optimizers) >= {"optimizer", "value_optimizer"}
    assert optimizers["value_optimizer"].param_groups[0]["lr"] == pytest.approx(5e-4)
    assert optimizers["optimizer"].param_groups[0]["lr"] == pytest.approx(1e-3)
    critic = {id(p) for p in learner.critic.parameters()}
    assert all(
        id(p) in critic for g in optimizers["value_optimizer"].param_groups for p in g["params"]
    )

    rows = _metrics(tmp_path)
    assert len(rows) == 2
    for row in rows:
        assert float(row["loss_entropy"]) != 0.0  # -0.05 x the policy's entropy
        assert float(row["loss_logp_penalty"]) > 0.0  # the extra term, optimised and logged
    assert "value_lr" in rows[0] and float(rows[-1]["value_lr"]) == pytest.approx(5e-4)

    recorded = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert recorded["env"] == "Pendulum-v1"
    assert recorded["entropy_coef"] == 0.05
    assert recorded["value_lr"] == 0.0005
    assert recorded["gamma"] == 0.9 and recorded["normalize_obs"] is True
    assert recorded["num_envs"] == 4  # the preset's (default 8)
    assert recorded["rollout_steps"] == 256 and recorded["epochs"] == 1  # typed: they win


def test_train_passes_the_loss_class_through(tmp_path):
    from rlkit.algorithms import ppo

    made = []

    class Counted(PPOLoss):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    argv = ["--total-frames", "256", "--entropy-coef", "0.02", "--run-dir", str(tmp_path)]
    ppo.train(parse("ppo", [*argv, *QUIET]), loss_cls=Counted)
    (loss,) = made
    assert loss.entropy_coef == 0.02
    assert float(_metrics(tmp_path)[0]["loss_entropy"]) != 0.0


def test_intrinsic_and_empirical_returns_act_with_a_loss_of_ones_own():
    """The flags a copied build used to drop: the bonus is attached, the estimator regresses
    on the empirical return."""
    from rlkit.algorithms import ppo

    cfg = parse("ppo", ["--intrinsic", "rnd", "--empirical-returns", "true"])
    env = make_env(cfg.env, num_envs=cfg.num_envs, seed=0)
    learner = ppo.build(cfg, env, loss_cls=LogProbPenaltyPPOLoss)
    assert type(learner.loss) is LogProbPenaltyPPOLoss
    assert learner.intrinsic is not None and "intrinsic_optimizer" in learner.optimizers()
    assert learner.estimator.empirical_returns is True


# every algorithm: the class given receives the arguments of the recipe's own ----------------
# (algorithm, flags, the loss class's name in the module, the estimator's or None, a flag's
# value each of them must receive: {keyword: value})
# fmt: off
CASES = [
    ("ppo", ["--entropy-coef", "0.05", "--empirical-returns", "true"], "PPOLoss", "GAE",
     {"entropy_coef": 0.05}, {"empirical_returns": True}),
    ("ppo", ["--value-lr", "5e-4", "--value-clip", "0.3"], "PPOLoss", "GAE",
     {"value_clip_epsilon": 0.3}, {"gamma": 0.98}),
    ("a2c", ["--entropy-coef", "0.03", "--gae-lambda", "0.9"], "A2CLoss", "GAE",
     {"entropy_coef": 0.03}, {"lmbda": 0.9}),
    ("ppg", ["--clip-epsilon", "0.15", "--gamma", "0.97"], "PPOLoss", "GAE",
     {"clip_epsilon": 0.15}, {"gamma": 0.97}),
    ("impala", ["--rho-clip", "0.9", "--entropy-coef", "0.02"], "IMPALALoss", None,
     {"rho_clip": 0.9, "entropy_coef": 0.02}, {}),
    ("appo", ["--tau", "0.5", "--rho-clip", "0.9"], "APPOLoss", "VTrace",
     {"tau": 0.5}, {"rho_clip": 0.9}),
    ("daac", ["--adv-coef", "0.3", "--gae-lambda", "0.9"], "DAACLoss", "GAE",
     {"adv_coef": 0.3}, {"lmbda": 0.9}),
    ("rnd", ["--env", "CartPole-v1", "--entropy-coef", "0.02"], "PPOLoss", "GAE",
     {"entropy_coef": 0.02}, {"gamma": 0.999}),
    ("svpg", ["--particles", "2", "--num-envs", "4", "--entropy-coef", "0.02"], "A2CLoss",
     "GAE", {"entropy_coef": 0.02}, {"gamma": 0.99}),
    ("svpg", ["--particles", "2", "--num-envs", "4", "--particle", "ppo"], "PPOLoss", "GAE",
     {"normalize_advantage": False}, {"lmbda": 1.0}),
    ("dqn", ["--gamma", "0.95", "--double-dqn", "true"], "DQNLoss", None,
     {"gamma": 0.95, "double_dqn": True}, {}),
    ("sac", ["--tau", "0.01"], "SACLoss", None, {"tau": 0.01}, {}),
    ("sac", ["--env", "CartPole-v1", "--tau", "0.01"], "DiscreteSACLoss", None,
     {"tau": 0.01}, {}),
]
# fmt: on


def _recording(base: type, calls: list) -> type:
    """A subclass of ``base`` that records the arguments it is built with."""

    class Recording(base):
        def __init__(self, *args, **kwargs):
            calls.append((args, kwargs))
            super().__init__(*args, **kwargs)

    Recording.__name__ = Recording.__qualname__ = f"Recording{base.__name__}"
    return Recording


def _same(a, b) -> bool:
    """Equal arguments: modules of one type with equal parameters and buffers, else ``==``."""
    if isinstance(a, nn.Module):
        sa, sb = a.state_dict(), b.state_dict()
        return (
            type(a) is type(b)
            and sa.keys() == sb.keys()
            and all(torch.equal(sa[k], sb[k]) for k in sa)
        )
    return a == b


def _assert_same_call(default_call, given_call) -> None:
    (dargs, dkwargs), (gargs, gkwargs) = default_call, given_call
    assert len(dargs) == len(gargs) and all(map(_same, dargs, gargs))
    assert dkwargs.keys() == gkwargs.keys()
    for key in dkwargs:
        assert _same(dkwargs[key], gkwargs[key]), key


def _build(module, cfg, **parts):
    env = make_env(cfg.env, num_envs=cfg.num_envs, seed=0)
    torch.manual_seed(0)
    return module.build(cfg, env, **parts)


@pytest.mark.parametrize(
    ("algo", "argv", "loss_name", "estimator_name", "loss_expect", "estimator_expect"), CASES
)
def test_the_class_given_receives_the_recipes_arguments(
    monkeypatch, algo, argv, loss_name, estimator_name, loss_expect, estimator_expect
):
    module = importlib.import_module(f"rlkit.algorithms.{algo}")
    cfg = parse(algo, argv)
    loss_base = getattr(module, loss_name)
    estimator_base = getattr(module, estimator_name) if estimator_name else None

    # the recipe's own classes, recorded where the module looks them up
    default_loss, default_estimator = [], []
    with monkeypatch.context() as patch:
        patch.setattr(module, loss_name, _recording(loss_base, default_loss))
        if estimator_base is not None:
            patch.setattr(module, estimator_name, _recording(estimator_base, default_estimator))
        _build(module, cfg)

    given_loss, given_estimator = [], []
    parts = {"loss_cls": _recording(loss_base, given_loss)}
    if estimator_base is not None:
        parts["estimator_cls"] = _recording(estimator_base, given_estimator)
    learner = _build(module, cfg, **parts)

    assert len(default_loss) == len(given_loss) == 1
    _assert_same_call(default_loss[0], given_loss[0])
    assert type(learner.loss) is parts["loss_cls"]
    for key, value in loss_expect.items():  # the flag typed reached the class given
        assert given_loss[0][1][key] == value, key
    if estimator_base is None:
        assert "estimator_cls" not in module.build.__kwdefaults__
        return
    assert len(default_estimator) == len(given_estimator) == 1
    _assert_same_call(default_estimator[0], given_estimator[0])
    assert type(learner.estimator) is parts["estimator_cls"]
    for key, value in estimator_expect.items():
        assert given_estimator[0][1][key] == value, key


def test_build_and_train_take_the_parts_that_apply():
    from rlkit.algorithms import NAMES, load

    no_estimator = {"impala", "dqn", "sac"}  # V-trace inside the loss; off-policy targets
    for name in NAMES:
        module = load(name)
        expected = {"loss_cls": None} | ({} if name in no_estimator else {"estimator_cls": None})
        assert module.build.__kwdefaults__ == expected, name
        parts = {k: v for k, v in module.train.__kwdefaults__.items() if k.endswith("_cls")}
        assert parts == expected, name  # (train also takes env=)
        if name in no_estimator:
            assert "There is no ``estimator_cls``" in " ".join(module.build.__doc__.split())


# a class that cannot stand in: one line naming it, the recipe's arguments and the fix --------
@pytest.fixture(scope="module")
def small():
    from rlkit.algorithms import ppo

    cfg = parse("ppo", ["--num-envs", "2", "--minibatch-size", "32", "--hidden", "8"])
    return ppo, cfg, make_env("CartPole-v1", num_envs=2, seed=0)


class NeedsBeta(PPOLoss):
    def __init__(self, actor, critic, *, beta, **kwargs):
        super().__init__(actor, critic, **kwargs)
        self.beta = beta


class TakesTooLittle(PPOLoss):
    def __init__(self, actor, critic, *, clip_epsilon=0.2):
        super().__init__(actor, critic, clip_epsilon=clip_epsilon)


def _refusal(small, **parts) -> str:
    ppo, cfg, env = small
    with pytest.raises(TypeError) as err:
        ppo.build(cfg, env, **parts)
    message = str(err.value)
    assert "\n" not in message
    return message


def test_a_missing_argument_is_refused_with_the_partial_fix(small):
    message = _refusal(small, loss_cls=NeedsBeta)
    assert message.startswith("loss_cls=NeedsBeta rejects the arguments ppo.build passes")
    assert "'beta'" in message
    assert "PPOLoss(actor, critic, clip_epsilon=0.2, entropy_coef=0.0" in message
    assert "functools.partial(NeedsBeta, name=value)" in message


def test_a_class_that_drops_the_recipes_arguments_is_refused(small):
    message = _refusal(small, loss_cls=TakesTooLittle)
    assert message.startswith("loss_cls=TakesTooLittle rejects the arguments")
    assert "'entropy_coef'" in message and "**kwargs" in message


def test_a_partial_binds_the_extra_argument(small):
    ppo, cfg, env = small
    learner = ppo.build(cfg, env, loss_cls=functools.partial(NeedsBeta, beta=0.5))
    assert type(learner.loss) is NeedsBeta and learner.loss.beta == 0.5
    assert learner.loss.clip_epsilon == cfg.clip_epsilon


def test_a_class_of_another_kind_is_refused(small):
    message = _refusal(small, loss_cls=A2CLoss)
    assert message.startswith("loss_cls=A2CLoss is not a subclass of PPOLoss")
    message = _refusal(small, estimator_cls=PPOLoss)
    assert message.startswith("estimator_cls=PPOLoss is not a subclass of GAE")
    assert "GAE(gamma=0.98, lmbda=0.8, value_network=<" in message


def test_a_value_that_is_not_callable_is_refused(small):
    message = _refusal(small, loss_cls="PPOLoss")
    assert message.startswith("loss_cls='PPOLoss' is not callable: ppo.build calls PPOLoss(")


def test_a_factory_must_return_the_recipes_kind(small):
    def factory(actor, critic, **kwargs):
        return A2CLoss(actor, critic)

    message = _refusal(small, loss_cls=factory)
    assert "returned an A2CLoss, not a PPOLoss" in message


def test_the_cli_prints_the_refusal_as_one_line(tmp_path, capsys):
    from rlkit.algorithms import ppo
    from rlkit.training.cli import cli

    def main(argv):
        cfg = parse("ppo", ["--total-frames", "64", "--run-dir", str(tmp_path), *QUIET])
        return ppo.train(cfg, loss_cls=NeedsBeta)

    with pytest.raises(SystemExit) as exit_info:
        cli(main)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: loss_cls=NeedsBeta rejects")
