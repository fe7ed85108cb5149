"""DAAC: the losses against hand computations, the advantage head's action conditioning,
gradient routing between the two networks, the learner's epochs and optimisers, bad input,
learning on CartPole, and DDP in two processes."""

from __future__ import annotations

import doctest
import math
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.modules import ProbabilisticActor

from rlkit import keys
from rlkit.algorithms.daac import DAACConfig
from rlkit.data.collector import make_collector
from rlkit.envs import make_env
from rlkit.modules.daac_networks import advantage_head
from rlkit.objectives import MissingKeyError, total_loss
from rlkit.objectives import daac as daac_module
from rlkit.objectives.daac import DAACLoss, DAACValueLoss
from rlkit.training import checkpoint as ckpt
from rlkit.training.engine import Context, Counters

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
OBS, N_ACTIONS = 3, 4
N = 6
QUIET = ["--progress", "false", "--eval-episodes", "2", "--eval-every", "0"]
TINY = ["--num-envs", "4", "--rollout-steps", "16", "--minibatch-size", "32"]


# ---------------------------------------------------------------------------------------
# Tiny networks and a batch
# ---------------------------------------------------------------------------------------
class GatherHead(nn.Module):
    """A(s, .) = W s + b, one output per action, gathered at the action."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(OBS, N_ACTIONS)

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.net(obs).gather(-1, action.unsqueeze(-1))


def tiny_policy(seed: int = 0):
    torch.manual_seed(seed)
    logits = nn.Linear(OBS, N_ACTIONS)
    actor = ProbabilisticActor(
        TensorDictModule(logits, [keys.OBSERVATION], [keys.LOGITS]),
        in_keys=[keys.LOGITS],
        distribution_class=torch.distributions.Categorical,
        return_log_prob=True,
        log_prob_key=keys.ACTION_LOG_PROB,
    )
    head = GatherHead()
    module = TensorDictModule(head, [keys.OBSERVATION, keys.ACTION], [keys.ADVANTAGE_PRED])
    return actor, logits, module, head.net


def batch(actor, *, seed: int = 0, off_policy: bool = True) -> TensorDict:
    gen = torch.Generator().manual_seed(seed)
    td = TensorDict({keys.OBSERVATION: torch.randn(N, OBS, generator=gen)}, batch_size=[N])
    torch.manual_seed(seed)
    with torch.no_grad():
        td = actor(td)
    if off_policy:  # a behaviour policy that differs, so some ratios leave the clip range
        td[keys.ACTION_LOG_PROB] = td[keys.ACTION_LOG_PROB] + 0.4 * torch.randn(N, generator=gen)
    td[keys.ADVANTAGE] = 3.0 * torch.randn(N, 1, generator=gen) + 1.0
    td[keys.VALUE_TARGET] = torch.randn(N, 1, generator=gen)
    td[keys.STATE_VALUE] = torch.randn(N, 1, generator=gen)
    return td.select(
        keys.OBSERVATION,
        keys.ACTION,
        keys.ACTION_LOG_PROB,
        keys.ADVANTAGE,
        keys.VALUE_TARGET,
        keys.STATE_VALUE,
    )


def val(t: torch.Tensor) -> float:
    return float(t.detach())


def rows(td: TensorDict, key) -> list:
    return td[key].reshape(N, -1).tolist()


def hand_standardize(xs: list[float]) -> list[float]:
    mean = sum(xs) / len(xs)
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))
    return [(x - mean) / (std + 1e-8) for x in xs]


def hand_linear(linear: nn.Linear, x: list[float]) -> list[float]:
    w, b = linear.weight.tolist(), linear.bias.tolist()
    return [sum(wi * xi for wi, xi in zip(row, x)) + bj for row, bj in zip(w, b)]


# ---------------------------------------------------------------------------------------
# DAACLoss against hand computations
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("normalize", "target"), [(True, "normalized"), (True, "raw"), (False, "normalized")]
)
def test_advantage_loss_matches_a_hand_computation(normalize, target):
    actor, _, head, head_net = tiny_policy()
    td = batch(actor)
    loss = DAACLoss(
        actor, head, adv_coef=0.3, normalize_advantage=normalize, advantage_target=target
    )
    out = loss(td)
    adv = [r[0] for r in rows(td, keys.ADVANTAGE)]
    used = hand_standardize(adv) if normalize else adv
    targets = used if target == "normalized" else adv
    obs, actions = rows(td, keys.OBSERVATION), td[keys.ACTION].tolist()
    errors = [(hand_linear(head_net, o)[a] - y) ** 2 for o, a, y in zip(obs, actions, targets)]
    expected = 0.3 * sum(errors) / N
    assert val(out["loss_advantage"]) == pytest.approx(expected, rel=1e-5)


def _minibatch_terms_by_hand(td, rows_, head_net, logits_net, used):
    """loss_advantage (coef 0.3, target = used) and loss_policy (clip 0.2) on ``rows_``."""
    adv_err, surrogate = 0.0, 0.0
    for i in rows_:
        o, a = td[keys.OBSERVATION][i].tolist(), int(td[keys.ACTION][i])
        adv_err += (hand_linear(head_net, o)[a] - used[i]) ** 2
        z = hand_linear(logits_net, o)
        log_p = z[a] - math.log(sum(math.exp(v) for v in z))
        ratio = math.exp(log_p - float(td[keys.ACTION_LOG_PROB][i]))
        surrogate += min(ratio * used[i], min(max(ratio, 0.8), 1.2) * used[i])
    return 0.3 * adv_err / len(rows_), -surrogate / len(rows_)


def test_advantage_is_standardised_once_per_batch_by_default_as_the_authors_code():
    # rraileanu/idaac ppo_daac_idaac/algo/daac.py: advantages standardised over the whole
    # batch before minibatching; adv_targ (surrogate and advantage-head target) is a slice
    actor, logits_net, head, head_net = tiny_policy()
    td = batch(actor)
    loss = DAACLoss(actor, head, adv_coef=0.3)
    assert loss.advantage_norm == "batch"
    assert daac_module.NORMALIZED_ADVANTAGE in loss.in_keys
    loss.standardize_batch(td)
    whole = hand_standardize([r[0] for r in rows(td, keys.ADVANTAGE)])
    assert [r[0] for r in rows(td, daac_module.NORMALIZED_ADVANTAGE)] == pytest.approx(whole)
    half = [0, 2, 3]
    out = loss(td[torch.tensor(half)])
    adv_expected, policy_expected = _minibatch_terms_by_hand(td, half, head_net, logits_net, whole)
    assert val(out["loss_advantage"]) == pytest.approx(adv_expected, rel=1e-5)
    assert val(out["loss_policy"]) == pytest.approx(policy_expected, rel=1e-5)
    # per minibatch (the option): standardised over the three rows instead
    per_mb = DAACLoss(actor, head, adv_coef=0.3, advantage_norm="minibatch")
    assert daac_module.NORMALIZED_ADVANTAGE not in per_mb.in_keys
    out_mb = per_mb(td[torch.tensor(half)])
    local = dict(zip(half, hand_standardize([whole_raw(td, i) for i in half])))
    adv_mb, _ = _minibatch_terms_by_hand(td, half, head_net, logits_net, local)
    assert val(out_mb["loss_advantage"]) == pytest.approx(adv_mb, rel=1e-5)
    assert val(out_mb["loss_advantage"]) != pytest.approx(adv_expected, rel=1e-3)
    # the raw target ignores the standardisation; the surrogate still uses the batch's
    raw = DAACLoss(actor, head, adv_coef=0.3, advantage_target="raw")(td[torch.tensor(half)])
    raw_adv = [whole_raw(td, i) for i in range(N)]
    adv_raw, _ = _minibatch_terms_by_hand(td, half, head_net, logits_net, raw_adv)
    assert val(raw["loss_advantage"]) == pytest.approx(adv_raw, rel=1e-5)
    assert val(raw["loss_policy"]) == pytest.approx(policy_expected, rel=1e-5)
    with pytest.raises(ValueError, match=r"advantage_norm must be one of"):
        DAACLoss(actor, head, advantage_norm="episode")


def whole_raw(td, i: int) -> float:
    return float(td[keys.ADVANTAGE][i, 0])


def test_policy_and_entropy_terms_match_a_hand_computation():
    actor, logits_net, head, _ = tiny_policy()
    td = batch(actor)
    out = DAACLoss(actor, head, clip_epsilon=0.1, entropy_coef=0.05)(td)
    adv = hand_standardize([r[0] for r in rows(td, keys.ADVANTAGE)])
    surrogate, entropy, clipped = 0.0, 0.0, 0
    for o, a, mu, A in zip(
        rows(td, keys.OBSERVATION), td[keys.ACTION].tolist(), td[keys.ACTION_LOG_PROB].tolist(), adv
    ):
        z = hand_linear(logits_net, o)
        log_norm = math.log(sum(math.exp(v) for v in z))
        log_p = [v - log_norm for v in z]
        ratio = math.exp(log_p[a] - mu)
        surrogate += min(ratio * A, min(max(ratio, 0.9), 1.1) * A)
        entropy -= sum(math.exp(lp) * lp for lp in log_p)
        clipped += abs(ratio - 1) > 0.1
    assert 0 < clipped < N  # the batch exercises both sides of the clip
    assert val(out["loss_policy"]) == pytest.approx(-surrogate / N, rel=1e-5)
    assert val(out["loss_entropy"]) == pytest.approx(-0.05 * entropy / N, rel=1e-5)
    assert val(out["clip_fraction"]) == pytest.approx(clipped / N)


def test_value_loss_matches_a_hand_computation_plain_and_clipped():
    torch.manual_seed(1)
    net = nn.Linear(OBS, 1)
    critic = TensorDictModule(net, [keys.OBSERVATION], [keys.STATE_VALUE])
    actor, *_ = tiny_policy()
    td = batch(actor)
    v = [hand_linear(net, o)[0] for o in rows(td, keys.OBSERVATION)]
    tgt = [r[0] for r in rows(td, keys.VALUE_TARGET)]
    old = [r[0] for r in rows(td, keys.STATE_VALUE)]
    plain = DAACValueLoss(critic, value_coef=0.7)(td)
    expected = 0.7 * sum(0.5 * (vi - ti) ** 2 for vi, ti in zip(v, tgt)) / N
    assert val(plain["loss_value"]) == pytest.approx(expected, rel=1e-5)
    clipped = DAACValueLoss(critic, value_clip_epsilon=0.2)(td)
    terms = []
    for vi, ti, oi in zip(v, tgt, old):
        vc = oi + min(max(vi - oi, -0.2), 0.2)
        terms.append(0.5 * max((vi - ti) ** 2, (vc - ti) ** 2))
    assert val(clipped["loss_value"]) == pytest.approx(sum(terms) / N, rel=1e-5)
    assert val(clipped["loss_value"]) != pytest.approx(val(plain["loss_value"]) / 0.7)


def test_on_policy_the_ratio_is_one_and_nothing_is_written_into_the_batch():
    actor, _, head, _ = tiny_policy()
    td = batch(actor, off_policy=False)
    before = td.clone()
    out = DAACLoss(actor, head)(td)
    assert val(out["approx_kl"]) == pytest.approx(0.0, abs=1e-7)
    assert val(out["clip_fraction"]) == 0.0
    assert set(td.keys()) == set(before.keys())
    assert (td == before).all()


def test_adv_coef_zero_removes_the_advantage_gradient_only():
    actor, _, head, head_net = tiny_policy()
    td = batch(actor)
    out = DAACLoss(actor, head, adv_coef=0.0)(td)
    assert val(out["loss_advantage"]) == 0.0
    total_loss(out).backward()
    assert all(p.grad is None or float(p.grad.abs().max()) == 0.0 for p in head_net.parameters())


# ---------------------------------------------------------------------------------------
# The advantage head is conditioned on the action
# ---------------------------------------------------------------------------------------
def test_discrete_head_gathers_the_stored_action():
    trunk = nn.Sequential(nn.Linear(OBS, 5), nn.Tanh())
    module = advantage_head(trunk, 5, kind="categorical", size=N_ACTIONS)
    obs = torch.randn(N, OBS)
    actions = torch.tensor([0, 1, 2, 3, 3, 1])
    pred = module(TensorDict({keys.OBSERVATION: obs, keys.ACTION: actions}, [N]))
    lin, out_layer = trunk[0], module.module.head[-1]
    for i in range(N):
        features = [math.tanh(v) for v in hand_linear(lin, obs[i].tolist())]
        per_action = hand_linear(out_layer, features)
        assert val(pred[keys.ADVANTAGE_PRED][i, 0]) == pytest.approx(
            per_action[int(actions[i])], rel=1e-5, abs=1e-6
        )
    assert pred[keys.ADVANTAGE_PRED].shape == (N, 1)
    # a one-hot action selects the same entry
    one_hot = nn.functional.one_hot(actions, N_ACTIONS)
    oh_module = TensorDictModule(
        daac_module_head(trunk, out_layer, "one_hot"),
        [keys.OBSERVATION, keys.ACTION],
        [keys.ADVANTAGE_PRED],
    )
    oh = oh_module(TensorDict({keys.OBSERVATION: obs, keys.ACTION: one_hot}, [N]))
    torch.testing.assert_close(oh[keys.ADVANTAGE_PRED], pred[keys.ADVANTAGE_PRED])


def daac_module_head(trunk, head, kind):
    from rlkit.modules.daac_networks import ActionAdvantage

    return ActionAdvantage(trunk, nn.Sequential(head), kind=kind)


def test_continuous_head_reads_features_concatenated_with_the_action():
    trunk = nn.Sequential(nn.Linear(OBS, 5), nn.Tanh())
    module = advantage_head(trunk, 5, kind="continuous", size=2)
    obs, action = torch.randn(N, OBS), torch.randn(N, 2)
    pred = module(TensorDict({keys.OBSERVATION: obs, keys.ACTION: action}, [N]))
    out_layer = module.module.head[-1]
    for i in range(N):
        features = [math.tanh(v) for v in hand_linear(trunk[0], obs[i].tolist())]
        expected = hand_linear(out_layer, features + action[i].tolist())[0]
        assert val(pred[keys.ADVANTAGE_PRED][i, 0]) == pytest.approx(expected, rel=1e-5)


# ---------------------------------------------------------------------------------------
# The recipe's networks: gradient routing, optimisers, epochs
# ---------------------------------------------------------------------------------------
def load_recipe():
    from rlkit.algorithms import daac

    return daac


@pytest.fixture(scope="module")
def recipe():
    return load_recipe()


@pytest.fixture(scope="module")
def env():
    e = make_env("CartPole-v1", num_envs=4, seed=0)
    yield e
    e.close()


def make_learner(recipe, env, *flags: str):
    cfg = recipe.parse_config(recipe.DAACConfig, [*TINY, *flags])
    torch.manual_seed(0)
    return recipe.build(cfg, env)


@pytest.fixture(scope="module")
def batches(recipe, env):
    learner = make_learner(recipe, env)
    collector = make_collector(env, learner.collect_policy(), frames_per_batch=64)
    out = []
    for b in collector:
        out.append(b.clone())
        if len(out) == 3:
            break
    collector.shutdown()
    return out


def context(seed: int = 5) -> Context:
    fabric = SimpleNamespace(world_size=1, device=torch.device("cpu"))
    ctx = Context(fabric, total_frames=10_000, counters=Counters())
    ctx.generator.manual_seed(seed)
    return ctx


def grads_reached(module: nn.Module) -> list[bool]:
    return [p.grad is not None and float(p.grad.abs().max()) > 0 for p in module.parameters()]


def test_policy_loss_reaches_only_the_policy_network_and_value_loss_only_the_value_network(
    recipe, env, batches
):
    learner = make_learner(recipe, env)
    td = batches[0].clone()
    learner.estimator(td)
    flat = td.reshape(-1)
    total_loss(learner.loss(flat)).backward()
    assert all(grads_reached(learner.actor)) and all(grads_reached(learner.advantage_head))
    assert all(p.grad is None for p in learner.critic.parameters())
    for p in learner.nets.parameters():
        p.grad = None
    learner.value_loss(flat)["loss_value"].backward()
    assert all(grads_reached(learner.critic))
    policy = {id(p) for m in (learner.actor, learner.advantage_head) for p in m.parameters()}
    assert all(p.grad is None for p in learner.nets.parameters() if id(p) in policy)


def test_advantage_loss_trains_the_trunk_and_head_but_not_the_policy_head(recipe, env, batches):
    learner = make_learner(recipe, env)
    td = batches[0].clone()
    learner.estimator(td)
    learner.loss(td.reshape(-1))["loss_advantage"].backward()
    trunk = {id(p) for p in learner.advantage_head.module.trunk.parameters()}
    assert trunk and all(grads_reached(learner.advantage_head))
    policy_only = [p for p in learner.actor.parameters() if id(p) not in trunk]
    assert policy_only and all(p.grad is None for p in policy_only)


def test_two_optimisers_over_disjoint_parameter_sets(recipe, env):
    learner = make_learner(recipe, env)
    opts = learner.optimizers()
    assert set(opts) == {"optimizer", "value_optimizer"}
    held = [{id(p) for g in o.param_groups for p in g["params"]} for o in opts.values()]
    assert not held[0] & held[1]
    assert held[0] | held[1] == {id(p) for p in learner.nets.parameters()}
    assert held[1] == {id(p) for p in learner.critic.parameters()}


def _snapshot(module: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def _moved(before, module) -> bool:
    return any(not torch.equal(a, b) for a, b in zip(before, module.parameters()))


def test_value_epochs_and_value_freq_schedule_the_value_updates(recipe, env, batches):
    # batch 64, minibatch 32: 2 steps per epoch; policy 2 epochs, value 3 every 2nd batch
    learner = make_learner(recipe, env, "--epochs", "2", "--value-epochs", "3", "--value-freq", "2")
    ctx = context()
    steps, value_moved = [], []
    for b in batches:
        before, critic = ctx.counters.updates, _snapshot(learner.critic)
        metrics = learner.update(b.clone(), ctx)
        steps.append(ctx.counters.updates - before)
        value_moved.append(_moved(critic, learner.critic))
        assert ("loss_value" in metrics) == value_moved[-1]
    assert steps == [2 * 2 + 3 * 2, 2 * 2, 2 * 2 + 3 * 2]
    assert value_moved == [True, False, True]
    assert learner.state_dict()["batches_seen"] == 3


def test_learner_standardises_the_advantage_over_the_whole_batch(recipe, env, batches):
    # batch 64, minibatch 32: every minibatch's advantage-head target and surrogate use the
    # mean and std of all 64 advantages (the authors' code), not of its own 32
    learner = make_learner(recipe, env, "--epochs", "1", "--adv-coef", "0.3")
    reference = batches[0].clone()
    with torch.no_grad():
        learner.estimator(reference)
    raw = reference[keys.ADVANTAGE].reshape(-1)
    mean, std = raw.mean(), raw.std()  # unbiased, as torch's default in the authors' code
    seen = []
    forward = learner.loss.forward

    def spy(td):
        with torch.no_grad():
            pred = learner.loss.advantage_prediction(td)
        out = forward(td)
        seen.append((td[keys.ADVANTAGE].reshape(-1), pred, out["loss_advantage"].detach()))
        return out

    learner.loss.forward = spy
    learner.update(batches[0].clone(), context())
    assert len(seen) == 2
    for adv, pred, got in seen:
        assert adv.shape == (32,)
        target = (adv - mean) / (std + 1e-8)
        torch.testing.assert_close(got, 0.3 * (pred - target).square().mean())
        own = (adv - adv.mean()) / (adv.std() + 1e-8)  # the per-minibatch form differs
        assert not torch.allclose(got, 0.3 * (pred - own).square().mean(), rtol=1e-3)


@pytest.mark.parametrize(
    "flags",
    [
        ("--adv-coef", "0"),
        ("--advantage-norm", "minibatch"),
        ("--advantage-target", "raw"),
        ("--value-clip", "0.01"),
        ("--value-lr", "1e-4"),
        ("--adv-hidden", "8"),
    ],
)
def test_each_flag_changes_the_trained_networks(recipe, env, batches, flags):
    def trained(*extra):
        learner = make_learner(recipe, env, "--epochs", "2", "--value-epochs", "2", *extra)
        learner.update(batches[0].clone(), context())
        td = batches[1].clone().reshape(-1)
        with torch.no_grad():
            logits = learner.actor.get_dist_params(td.clone()).get(keys.LOGITS)
            value = learner.critic(td.clone()).get(keys.STATE_VALUE)
        return torch.cat([logits, value], -1)

    assert not torch.allclose(trained(), trained(*flags))


def test_state_dict_round_trip_keeps_the_value_cycle(recipe, env, batches):
    learner = make_learner(recipe, env, "--value-freq", "3", "--epochs", "1", "--value-epochs", "1")
    learner.update(batches[0].clone(), context())
    other = make_learner(recipe, env, "--value-freq", "3")
    other.load_state_dict(learner.state_dict())
    assert other.batches_seen == 1


# ---------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------
def test_negative_adv_coef_is_refused_by_the_loss_and_the_config():
    actor, _, head, _ = tiny_policy()
    with pytest.raises(ValueError, match=r"adv_coef must be finite and >= 0, got -0\.1"):
        DAACLoss(actor, head, adv_coef=-0.1)
    loss = DAACLoss(actor, head)
    with pytest.raises(ValueError, match="adv_coef"):
        loss.adv_coef = -1.0
    with pytest.raises(ValueError, match=r"--adv-coef must be >= 0, got -1"):
        DAACConfig(adv_coef=-1.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(value_epochs=0), r"--value-epochs must be > 0, got 0"),
        (dict(value_freq=0), r"--value-freq must be > 0, got 0"),
        (dict(value_lr=-1e-3), r"--value-lr must be > 0"),
        (dict(adv_hidden=(0,)), r"--adv-hidden needs positive layer sizes"),
    ],
)
def test_config_errors_name_the_flag(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DAACConfig(**kwargs)


def test_loss_input_errors_name_the_problem():
    actor, _, head, _ = tiny_policy()
    td = batch(actor)
    with pytest.raises(MissingKeyError, match=r"'advantage'.*value estimator"):
        DAACLoss(actor, head)(td.exclude(keys.ADVANTAGE))
    with pytest.raises(ValueError, match=r"advantage_target must be one of"):
        DAACLoss(actor, head, advantage_target="scaled")
    critic = TensorDictModule(nn.Linear(OBS, 1), [keys.OBSERVATION], [keys.STATE_VALUE])
    with pytest.raises(TypeError, match=r"advantage_head must be a TensorDict module"):
        DAACLoss(actor, critic)
    wide = TensorDictModule(
        lambda o, a: o[..., :2], [keys.OBSERVATION, keys.ACTION], [keys.ADVANTAGE_PRED]
    )
    with pytest.raises(ValueError, match=r"advantage head wrote .* expected \[6, 1\]"):
        DAACLoss(actor, wide)(td)
    with pytest.raises(MissingKeyError, match=r"'state_value'.*value clipping"):
        DAACValueLoss(critic, value_clip_epsilon=0.2)(td.exclude(keys.STATE_VALUE))


def test_shared_parameters_between_the_networks_are_refused(recipe, env):
    from rlkit.algorithms.daac import DAACLearner

    learner = make_learner(recipe, env)
    nets = SimpleNamespace(
        actor=learner.actor,
        advantage_head=learner.advantage_head,
        critic=learner.advantage_head,  # shares the trunk: not decoupled
        obs_norm=None,
    )
    with pytest.raises(ValueError, match="must not share parameters"):
        DAACLearner(
            nets=nets,
            estimator=learner.estimator,
            loss=learner.loss,
            value_loss=learner.value_loss,
            optimizer=learner.optimizer,
            value_optimizer=learner.value_optimizer,
            value_epochs=1,
            frames_per_batch=learner.frames_per_batch,
            epochs=1,
        )


# ---------------------------------------------------------------------------------------
# Documentation
# ---------------------------------------------------------------------------------------
def test_docstring_examples_run():
    result = doctest.testmod(daac_module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_docs_page_names_only_real_flags(recipe):
    from rlkit.configs.base import build_parser

    text = (ROOT / "docs" / "recipes" / "daac.md").read_text()
    helptext = build_parser(recipe.DAACConfig).format_help()
    ignore = {"--jobs", "--seeds", "--required"}
    for flag in set(re.findall(r"(--[a-z][a-z0-9-]+)", text)) - ignore:
        assert flag in helptext, f"daac.md mentions {flag}, which recipes/daac.py does not have"


# ---------------------------------------------------------------------------------------
# Learning, resume, pendulum and DDP (end to end)
# ---------------------------------------------------------------------------------------
@pytest.mark.slow
def test_daac_learns_cartpole(recipe, tmp_path):
    summary = recipe.main(
        [
            "--progress",
            "false",
            "--eval-episodes",
            "5",
            "--seed",
            "11",
            "--target-return",
            "400",
            "--total-frames",
            "30000",
            "--eval-every",
            "5000",
            "--run-dir",
            str(tmp_path),
        ]
    )
    assert summary["solved"], summary["eval_return_mean"]
    assert summary["eval_return_mean"] >= 400  # a random policy scores about 20


def test_continuous_actions_and_resume_with_both_optimisers(recipe, tmp_path):
    args = [
        *QUIET,
        "--env",
        "Pendulum-v1",
        "--num-envs",
        "2",
        "--rollout-steps",
        "64",
        "--minibatch-size",
        "64",
        "--run-dir",
        str(tmp_path),
    ]
    first = recipe.main([*args, "--total-frames", "256"])
    assert first["frames"] == 256
    payload = ckpt.load(tmp_path / "checkpoints" / "last.pt")
    assert set(payload["optimizers"]) == {"optimizer", "value_optimizer"}
    assert payload["learner"]["batches_seen"] == 2
    assert "advantage_head" in payload["modules"] and "obs_norm" in payload["modules"]
    resumed = recipe.main([*args, "--total-frames", "512", "--resume", "last"])
    assert resumed["frames"] == 512
    assert ckpt.load(tmp_path / "checkpoints" / "last.pt")["learner"]["batches_seen"] == 4


@pytest.mark.slow
@pytest.mark.ddp_jobs("daac")  # a shared launch: tests/ddp_shared.py (--value-freq 2, QUIET)
def test_ddp_two_processes_keep_parameters_identical(ddp_jobs):
    run = ddp_jobs["daac"]
    summary = run.summary()
    assert summary["frames"] == 2048  # 2 ranks x 8 envs x 32 steps x 4 batches
    payload = ckpt.load(run.dir / "checkpoints" / "last.pt")
    assert payload["learner"]["batches_seen"] == 4
