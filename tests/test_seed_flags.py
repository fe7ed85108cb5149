"""Flags of the seed libraries' arguments (issue 21): each has the seed's meaning, refuses
a bad value in one line naming the flag, and keeps every recipe's default behaviour."""

from __future__ import annotations

import dataclasses

import pytest

from rlkit import algorithms
from rlkit.training import parse_config
from tests.test_flags_property import config_class


def _parse(algo: str, argv: list[str]):
    module = algorithms.load(algo)
    return parse_config(config_class(module), argv, presets=module.PRESETS)


def _refused(algo: str, argv: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        _parse(algo, argv)
    assert exit_info.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


def _fields(algo: str) -> set[str]:
    return {f.name for f in dataclasses.fields(config_class(algorithms.load(algo)))}


# --------------------------------------------------------------------------- --gae-lambda


@pytest.mark.parametrize("algo", ["impala", "appo"])
def test_vtrace_recipes_have_vtrace_lambda_and_no_gae_lambda(algo, capsys):
    """IMPALA and APPO compute V-trace, never GAE: --gae-lambda was listed and unused."""
    assert "vtrace_lambda" in _fields(algo) and "gae_lambda" not in _fields(algo)
    _refused(algo, ["--gae-lambda", "0.9"], "--gae-lambda", capsys)


@pytest.mark.parametrize("algo", ["ppo", "a2c", "ppg", "daac", "rnd", "svpg"])
def test_gae_recipes_keep_gae_lambda(algo, capsys):
    assert _parse(algo, ["--gae-lambda", "0.9"]).gae_lambda == 0.9
    _refused(algo, ["--gae-lambda", "1.5"], "--gae-lambda must be in [0, 1]", capsys)


# --------------------------------------------------------------------------- adaptive-KL lr


def _kl_reference(lr, target, kls, *, kl_factor, lr_factor, lr_min, lr_max):
    """rsl_rl / unilab's adaptive schedule, written out: the lr after each update phase."""
    out = []
    for kl in kls:
        if kl > target * kl_factor:
            lr = max(lr_min, lr / lr_factor)
        elif kl < target / kl_factor:
            lr = min(lr_max, lr * lr_factor)
        out.append(lr)
    return out


KLS = [0.02, 0.013, 0.011, 0.005, 0.009] + [0.0] * 8 + [0.05] * 12


def _learner(algo: str, argv: list[str]):
    from rlkit.envs import make_env

    cfg = _parse(algo, argv)
    module = algorithms.load(algo)
    return module.build(cfg, make_env(cfg.env, num_envs=cfg.num_envs, seed=cfg.seed))


def test_kl_adaptive_lr_factors_and_bounds_are_flags():
    """unilab's adaptive_kl_factor / adaptive_lr_factor (and the lr bounds) as flags, checked
    against the rule written out, on PPO's learner."""
    flags = ["--kl-factor", "1.2", "--kl-lr-factor", "1.1", "--kl-lr-min", "8e-4"]
    flags += ["--kl-lr-max", "1.5e-3"]
    learner = _learner("ppo", ["--lr-schedule", "kl", "--lr", "1e-3", *flags])
    got = [learner.lr_schedule.kl.update(kl) for kl in KLS]
    ref = _kl_reference(1e-3, 0.01, KLS, kl_factor=1.2, lr_factor=1.1, lr_min=8e-4, lr_max=1.5e-3)
    assert got == pytest.approx(ref, rel=1e-12)
    assert max(got) == pytest.approx(1.5e-3) and min(got) == pytest.approx(8e-4)
    assert learner.apply_schedules(0.5)["lr"] == got[-1]


def test_kl_adaptive_lr_defaults_are_the_former_constants():
    learner = _learner("appo", ["--lr-schedule", "kl", "--lr", "3e-4"])
    kl = learner.lr_schedule.kl
    assert (kl.factor_kl, kl.factor_lr, kl.lr_min, kl.lr_max) == (2.0, 1.5, 1e-6, 1e-2)
    got = [kl.update(x) for x in KLS]
    ref = _kl_reference(3e-4, 0.01, KLS, kl_factor=2.0, lr_factor=1.5, lr_min=1e-6, lr_max=1e-2)
    assert got == pytest.approx(ref, rel=1e-12)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--kl-factor", "0.5"], "--kl-factor must be >= 1"),
        (["--kl-lr-factor", "0.9"], "--kl-lr-factor must be >= 1"),
        (["--kl-lr-min", "0"], "--kl-lr-min must be > 0"),
        (["--kl-lr-max", "-1"], "--kl-lr-max must be > 0"),
        (["--lr-schedule", "kl", "--lr", "1e-3", "--kl-lr-max", "1e-4"], "raise --kl-lr-max"),
        (["--lr-schedule", "kl", "--lr", "1e-5", "--kl-lr-min", "1e-4"], "lower --kl-lr-min"),
    ],
)
def test_kl_adaptive_flags_refuse_bad_values(argv, message, capsys):
    _refused("ppo", argv, message, capsys)


# --------------------------------------------------------------------------- off-policy lr


def _at(frames: int, total: int):
    from types import SimpleNamespace

    import torch

    from rlkit.training.engine import Context, Counters

    fabric = SimpleNamespace(device=torch.device("cpu"), world_size=1)
    return Context(fabric, total, Counters(frames=frames))


def test_sac_linear_lr_schedule_scales_every_rate_from_the_frame_counter():
    """pyrado's lr_scheduler for SAC: critic lr from --lr to --lr-final over the budget,
    the actor's and the temperature's rates in the same ratio."""
    argv = ["--total-frames", "1000", "--lr", "1e-3", "--actor-lr", "5e-4"]
    argv += ["--alpha-lr", "2e-3", "--lr-schedule", "linear", "--lr-final", "1e-4"]
    learner = _learner("sac", argv)
    for frames in (0, 250, 600, 1000, 1200):
        p = min(frames / 1000, 1.0)
        lr = 1e-3 + (1e-4 - 1e-3) * p
        assert learner.apply_lr_schedule(_at(frames, 1000).progress) == pytest.approx(lr)
        ratio = lr / 1e-3
        assert learner.critic_optimizer.param_groups[0]["lr"] == pytest.approx(lr)
        actor, alpha = learner.actor_optimizer.param_groups
        assert actor["lr"] == pytest.approx(5e-4 * ratio)
        assert alpha["lr"] == pytest.approx(2e-3 * ratio)


def test_dqn_linear_lr_schedule_in_the_update_and_on_resume():
    """The schedule is applied in the update from the engine's frame counter: a fresh
    learner (a resumed run) at the same counter steps at the same rate."""
    from tests.test_offpolicy import SMALL_DQN, Rig

    dqn = algorithms.load("dqn")
    cfg = dqn.DQNConfig(**SMALL_DQN, lr_schedule="linear", lr_final=1e-4)
    rig = Rig(dqn, cfg)
    metrics = {}
    while "lr" not in metrics:
        frames = rig.ctx.counters.frames
        metrics = rig.step()
    expected = cfg.lr + (1e-4 - cfg.lr) * frames / cfg.total_frames
    assert metrics["lr"] == pytest.approx(expected)
    assert rig.learner.optimizer.param_groups[0]["lr"] == pytest.approx(expected)
    rig.close()
    resumed = Rig(dqn, cfg)
    resumed.ctx.counters.frames = 500
    metrics = {}
    while "lr" not in metrics:
        frames = resumed.ctx.counters.frames
        metrics = resumed.step()
    assert metrics["lr"] == pytest.approx(cfg.lr + (1e-4 - cfg.lr) * frames / 1000)
    resumed.close()


def test_offpolicy_constant_schedule_leaves_the_rates_alone():
    learner = _learner("sac", ["--actor-lr", "5e-4"])
    learner.apply_lr_schedule(0.7)
    assert [g["lr"] for g in learner.actor_optimizer.param_groups] == [5e-4, 1e-3]


@pytest.mark.parametrize("algo", ["sac", "dqn"])
def test_offpolicy_lr_schedule_flags_refuse_bad_values(algo, capsys):
    _refused(algo, ["--lr-final", "-1e-3"], "--lr-final must be >= 0", capsys)
    _refused(algo, ["--lr-schedule", "kl"], "--lr-schedule", capsys)


# --------------------------------------------------------------------------- --lr-decay-frames


@pytest.mark.parametrize(("algo", "decay"), [("ppo", 4000), ("daac", 4000), ("ppo", 15000)])
def test_onpolicy_linear_lr_decays_over_lr_decay_frames_then_holds(algo, decay):
    """RLlib's decay_steps: the linear decay spans --lr-decay-frames, then the final rate
    holds; reference: numpy's piecewise-linear interpolation."""
    import numpy as np

    argv = ["--total-frames", "10000", "--lr", "1e-3", "--lr-final", "1e-4"]
    argv += ["--lr-schedule", "linear", "--lr-decay-frames", str(decay)]
    learner = _learner(algo, argv)
    for frames in (0, 1000, 3999, 4000, 7000, 10000):
        expected = float(np.interp(frames, [0, decay], [1e-3, 1e-4]))
        out = learner.apply_schedules(_at(frames, 10_000).progress)
        assert out["lr"] == pytest.approx(expected, rel=1e-9)
        assert learner.optimizer.param_groups[0]["lr"] == pytest.approx(expected, rel=1e-9)
        if algo == "daac":  # the value network's rate follows in proportion
            assert out["value_lr"] == pytest.approx(expected, rel=1e-9)


def test_sac_linear_lr_decays_over_lr_decay_frames_then_holds():
    import numpy as np

    argv = ["--total-frames", "10000", "--lr", "1e-3", "--lr-final", "1e-4"]
    argv += ["--lr-schedule", "linear", "--lr-decay-frames", "2500"]
    learner = _learner("sac", argv)
    for frames in (0, 1000, 2500, 9000):
        expected = float(np.interp(frames, [0, 2500], [1e-3, 1e-4]))
        assert learner.apply_lr_schedule(_at(frames, 10_000).progress) == pytest.approx(expected)
        assert learner.critic_optimizer.param_groups[0]["lr"] == pytest.approx(expected)


@pytest.mark.parametrize(
    ("algo", "argv", "message"),
    [
        ("ppo", ["--lr-decay-frames", "0"], "--lr-decay-frames must be > 0"),
        ("a2c", ["--lr-decay-frames", "1000"], "add --lr-schedule linear"),
        ("dqn", ["--lr-decay-frames", "1000"], "add --lr-schedule linear"),
        ("sac", ["--lr-schedule", "linear", "--lr-decay-frames", "-5"], "must be > 0"),
    ],
)
def test_lr_decay_frames_refuses_bad_values(algo, argv, message, capsys):
    _refused(algo, argv, message, capsys)


# --------------------------------------------------------------------------- --std-init

GAUSSIAN_RECIPES = ["ppo", "a2c", "impala", "appo", "ppg", "daac", "rnd"]


def _scale(actor):
    import torch
    from tensordict import TensorDict

    td = TensorDict({"observation": torch.randn(5, 3)}, [5])
    return actor(td)["scale"]


@pytest.mark.parametrize("algo", GAUSSIAN_RECIPES)
def test_std_init_sets_the_initial_action_std(algo):
    """pyrado's std_init: the Gaussian policy's initial standard deviation (rlkit learns
    its log); the actor's scale at any observation equals it."""
    import torch

    learner = _learner(algo, ["--env", "Pendulum-v1", "--std-init", "0.3"])
    torch.testing.assert_close(_scale(learner.actor), torch.full((5, 1), 0.3))
    default = _learner(algo, ["--env", "Pendulum-v1"])
    torch.testing.assert_close(_scale(default.actor), torch.ones(5, 1))


def test_std_init_refuses_bad_values_and_discrete_actions(capsys):
    _refused("ppo", ["--std-init", "0"], "--std-init must be > 0", capsys)
    _refused("ppg", ["--std-init", "-1"], "--std-init must be > 0", capsys)
    with pytest.raises(ValueError, match="--std-init"):
        _learner("ppo", ["--env", "CartPole-v1", "--std-init", "0.5"])


@pytest.mark.parametrize("algo", GAUSSIAN_RECIPES)
def test_bounded_mean_keeps_the_policy_mean_inside_the_action_bounds(algo):
    """--bounded-mean: Pendulum's torque is in [-2, 2]; with the policy's last layer pushed
    far out, the mean is clamped smoothly at +-2 (2 tanh of the output), where the default
    policy's mean follows the output past the bounds."""
    import torch

    obs = torch.randn(64, 3)

    def loc(flags):
        from tensordict import TensorDict

        learner = _learner(algo, ["--env", "Pendulum-v1", *flags])
        last = [m for m in learner.actor.modules() if isinstance(m, torch.nn.Linear)][-1]
        with torch.no_grad():
            last.bias.fill_(30.0)
        return learner.actor(TensorDict({"observation": obs}, [64]))["loc"]

    bounded = loc(["--bounded-mean", "true"])
    assert bounded.max() <= 2.0 and bounded.min() > 1.99  # 2 tanh(30 + small) = 2
    assert loc([]).min() > 20  # unbounded: the output itself


def test_bounded_mean_refuses_discrete_actions():
    with pytest.raises(ValueError, match="--bounded-mean.*discrete.*drop it"):
        _learner("impala", ["--env", "CartPole-v1", "--bounded-mean", "true"])


# --------------------------------------------------------------------------- actor/critic sizes


def _linear_shapes(module) -> list[tuple[int, int]]:
    from torch import nn

    return [(m.in_features, m.out_features) for m in module.modules() if isinstance(m, nn.Linear)]


@pytest.mark.parametrize("algo", GAUSSIAN_RECIPES)
def test_actor_and_critic_hidden_size_each_network(algo):
    """evorl's separate policy and value MLP sizes: --actor-hidden / --critic-hidden, each
    defaulting to --hidden. CartPole: 4 observations, 2 actions."""
    cartpole = ["--env", "CartPole-v1"]
    learner = _learner(algo, [*cartpole, "--actor-hidden", "32", "--critic-hidden", "16", "8"])
    actor, critic = _linear_shapes(learner.actor), _linear_shapes(learner.critic)
    assert actor == [(4, 32), (32, 2)]
    assert critic[:2] == [(4, 16), (16, 8)] and critic[-1][0] == 8 and len(critic) == 3
    default = _learner(algo, [*cartpole, "--hidden", "24"])
    assert _linear_shapes(default.actor) == [(4, 24), (24, 2)]
    assert _linear_shapes(default.critic)[0] == (4, 24)


def test_actor_and_critic_hidden_refuse_bad_values(capsys):
    _refused("ppo", ["--actor-hidden", "0"], "--actor-hidden needs positive layer sizes", capsys)
    _refused("a2c", ["--critic-hidden", "64", "-1"], "--critic-hidden needs positive", capsys)
    _refused("ppg", ["--arch", "shared", "--critic-hidden", "32"], "use --arch dual", capsys)


# --------------------------------------------------------------------------- --optimizer

OPTIMIZER_CLASSES = {"adam": "Adam", "adamw": "AdamW", "rmsprop": "RMSprop", "sgd": "SGD"}


@pytest.mark.parametrize("algo", ["ppo", "a2c", "ppg", "daac", "impala"])
@pytest.mark.parametrize("name", sorted(OPTIMIZER_CLASSES))
def test_optimizer_flag_builds_the_chosen_class(algo, name):
    """RLlib's optim / evorl's optimizer: every optimiser of the learner is the chosen class,
    at --lr, with --adam-eps (all but SGD) and --weight-decay."""
    argv = ["--optimizer", name, "--lr", "2e-3", "--adam-eps", "1e-7", "--weight-decay", "0.05"]
    learner = _learner(algo, argv)
    for opt in learner.optimizers().values():
        assert type(opt).__name__ == OPTIMIZER_CLASSES[name]
        group = opt.param_groups[0]
        assert group["weight_decay"] == 0.05
        if name != "sgd":
            assert group["eps"] == 1e-7
        if name == "rmsprop":
            assert group["alpha"] == 0.99


def test_optimizer_defaults_are_unchanged():
    ppo, a2c = _learner("ppo", []).optimizer, _learner("a2c", []).optimizer
    assert type(ppo).__name__ == "Adam" and ppo.param_groups[0]["weight_decay"] == 0
    assert type(a2c).__name__ == "RMSprop" and a2c.param_groups[0]["alpha"] == 0.99
    assert a2c.param_groups[0]["eps"] == 1e-5
    adamw = _learner("ppo", ["--optimizer", "adamw"]).optimizer
    assert adamw.param_groups[0]["weight_decay"] == 0.01  # AdamW's own default


def test_sgd_step_is_plain_gradient_descent():
    """One step of --optimizer sgd (with weight decay) against p - lr (g + wd p)."""
    import torch

    from rlkit.training.optim import make_optimizer

    p = torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0]))
    opt = make_optimizer("sgd", [p], lr=0.1, eps=None, weight_decay=0.5)
    p.grad = torch.tensor([0.5, 0.25, -1.0])
    expected = p.detach() - 0.1 * (p.grad + 0.5 * p.detach())
    opt.step()
    torch.testing.assert_close(p.detach(), expected)


def test_optimizer_flags_refuse_bad_values(capsys):
    _refused("ppo", ["--optimizer", "lamb"], "--optimizer", capsys)
    _refused("ppo", ["--weight-decay", "-0.1"], "--weight-decay must be >= 0", capsys)


# --------------------------------------------------------------------------- --init-fn


@pytest.mark.parametrize("name", ["xavier_uniform", "xavier_normal"])
def test_xavier_init_fn_is_rllte_s_conv_only_xavier(name):
    """rllte's _xavier_*: Xavier on convolutions, orthogonal (gain 1) Linear layers, zero
    biases. Checked: W W^T = I for the Linear, the Xavier bound / std for the conv."""
    import math

    import torch
    from torch import nn

    from rlkit.modules.ppg_networks import init_weights_

    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 64, 3), nn.ReLU(), nn.Flatten(), nn.Linear(64, 16))
    init_weights_(net, name)
    conv_w, conv_b = net[0].weight.detach(), net[0].bias.detach()
    w, b = net[3].weight.detach(), net[3].bias.detach()
    torch.testing.assert_close(w @ w.T, torch.eye(16), atol=1e-5, rtol=0)
    fan_in, fan_out = 3 * 9, 64 * 9
    if name == "xavier_uniform":
        bound = math.sqrt(6.0 / (fan_in + fan_out))
        assert float(conv_w.abs().max()) <= bound
        assert float(conv_w.abs().max()) > 0.9 * bound
    else:
        std = math.sqrt(2.0 / (fan_in + fan_out))
        assert float(conv_w.std()) == pytest.approx(std, rel=0.1)
    assert float(conv_b.abs().max()) == 0 and float(b.abs().max()) == 0


def test_default_init_fn_keeps_pytorch_s_initialisation():
    """rllte's identity init_fn: --init-fn default re-draws every layer as PyTorch builds it
    (reference: the same layers constructed by PyTorch from the same seed)."""
    import torch
    from torch import nn

    from rlkit.modules.networks import mlp
    from rlkit.modules.ppg_networks import init_weights_

    net = mlp(4, 2, hidden=(8, 8))  # orthogonal, zero biases
    torch.manual_seed(3)
    init_weights_(net, "default")
    torch.manual_seed(3)
    ref = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))
    for got, want in zip(net.state_dict().values(), ref.state_dict().values(), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    learner = _learner("ppg", ["--init-fn", "default"])
    head = [m for m in learner.actor.modules() if isinstance(m, nn.Linear)][-1]
    assert float(head.bias.detach().abs().max()) > 0  # not orthogonal, not scaled
    assert float(head.weight.detach().abs().max()) > 0.05
