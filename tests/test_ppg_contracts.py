"""PPG's learner contracts (issue 13): every ``loss_*`` term of the policy-phase loss is
optimised, each network trains exactly its own epoch count (the idle one bit-identical),
and the auxiliary phase's gradient accumulation is one backward of the minibatch.

The loss-term, epoch-count, optimiser-naming and schedule tests failed on the learner
before the update loop (one Adam over actor and critic, terms summed by name); the
accumulation tests pin what the hand-written accumulation did, now done by the loop."""

from __future__ import annotations

import pytest
import torch

from rlkit import keys
from rlkit.objectives import PPOLoss
from rlkit.training.update import LossContractError
from tests.test_ppg import batches, context, env, make_learner, recipe  # noqa: F401

MINIBATCHES = 2  # TINY: 4 envs x 16 steps = 64 samples, minibatches of 32


def _params(module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _own_params(learner) -> dict[str, list[torch.nn.Parameter]]:
    """Actor (trunk + policy head), the critic's own parameters (in the shared layout only
    the value head: the trunk is the actor's) and the auxiliary value head."""
    actor = list(learner.actor.parameters())
    ids = {id(p) for p in actor}
    critic = [p for p in learner.critic.parameters() if id(p) not in ids]
    aux = [p for p in learner.aux_critic.parameters() if id(p) not in ids]
    return {"actor": actor, "critic": critic, "aux": aux}


# --------------------------------------------------------------------------- (a) loss_kl
class KLPenaltyPPOLoss(PPOLoss):
    """PPO plus ``loss_kl = kl_coef * KL(mu || pi)`` (k3 estimator) to the behaviour policy:
    a term the learner never heard of."""

    kl_coef = 1e6

    def _policy_terms(self, log_prob, advantage, tensordict):
        out = super()._policy_terms(log_prob, advantage, tensordict)
        behaviour = tensordict.get(self.tensor_keys.action_log_prob).detach().reshape_as(log_prob)
        log_ratio = log_prob - behaviour
        out["loss_kl"] = self.kl_coef * (log_ratio.exp() - 1 - log_ratio).mean()
        return out


def _kl_to_start(recipe, env, batches, monkeypatch, loss_cls) -> float:  # noqa: F811
    monkeypatch.setattr(recipe, "PPOLoss", loss_cls)
    learner = make_learner(recipe, env, "--epochs", "4")
    assert type(learner.loss) is loss_cls
    obs = batches[0].reshape(-1).select(keys.OBSERVATION)
    with torch.no_grad():
        start = learner.actor.get_dist_params(obs.clone()).get(keys.LOGITS)
    learner.update(batches[0].clone(), context())
    with torch.no_grad():
        end = learner.actor.get_dist_params(obs.clone()).get(keys.LOGITS)
    p = start.softmax(-1)
    return float((p * (start.log_softmax(-1) - end.log_softmax(-1))).sum(-1).mean())


def test_a_custom_loss_term_is_optimised(recipe, env, batches, monkeypatch):  # noqa: F811
    free = _kl_to_start(recipe, env, batches, monkeypatch, PPOLoss)
    held = _kl_to_start(recipe, env, batches, monkeypatch, KLPenaltyPPOLoss)
    assert free > 1e-4  # the plain update does move the policy
    assert held < 1e-2 * free, (held, free)


def test_a_custom_term_that_reaches_no_network_of_its_group_is_refused(
    recipe,  # noqa: F811
    env,  # noqa: F811
    batches,  # noqa: F811
    monkeypatch,
):
    class CriticOnlyExtra(PPOLoss):  # a critic term under a name the policy group claims
        def forward(self, td):
            out = super().forward(td)
            value = self.critic(td.select(*self.critic.in_keys)).get(keys.STATE_VALUE)
            out.set("loss_value_l1", value.abs().mean())
            return out

    monkeypatch.setattr(recipe, "PPOLoss", CriticOnlyExtra)
    learner = make_learner(recipe, env)
    with pytest.raises(LossContractError, match="loss_value_l1"):
        learner.update(batches[0].clone(), context())


# --------------------------------------------------------------------------- (b, c) epochs
def _trace_policy_phase(learner, batch):
    """Snapshots of each network before every loss call and after the update, and the
    optimiser steps taken over each network's parameters."""
    own = _own_params(learner)
    snaps: list[dict[str, list[torch.Tensor]]] = []
    original = learner.loss.forward

    def forward(td):
        snaps.append({k: [p.detach().clone() for p in v] for k, v in own.items()})
        return original(td)

    learner.loss.forward = forward
    steps = {name: 0 for name in own}
    for opt in learner.optimizers().values():
        held = {id(p) for g in opt.param_groups for p in g["params"]}
        for name, params in own.items():
            if params and {id(p) for p in params} <= held:

                def count(*_, name=name):
                    steps[name] += 1

                opt.register_step_post_hook(count)
    learner.update(batch.clone(), context())
    learner.loss.forward = original
    snaps.append({k: [p.detach().clone() for p in v] for k, v in own.items()})
    return snaps, steps


def _moves(snaps, name: str) -> list[bool]:
    """Per optimiser step (between consecutive loss calls): did ``name`` change?"""
    return [not _same(a[name], b[name]) for a, b in zip(snaps, snaps[1:])]


@pytest.mark.parametrize("arch", ["dual", "shared"])
@pytest.mark.parametrize("aux_opt", ["separate", "shared"])
def test_b_the_idle_network_is_bit_identical_in_the_other_networks_extra_epochs(
    recipe,  # noqa: F811
    env,  # noqa: F811
    batches,  # noqa: F811
    arch,
    aux_opt,
):
    flags = ["--arch", arch, "--aux-optimizer", aux_opt]
    # value-only epochs: 2 steps of both, then 6 value steps with the actor idle
    learner = make_learner(recipe, env, "--epochs", "1", "--value-epochs", "4", *flags)
    snaps, _ = _trace_policy_phase(learner, batches[0])
    assert len(snaps) == 4 * MINIBATCHES + 1
    assert _moves(snaps, "actor") == [True] * 2 + [False] * 6
    assert _moves(snaps, "critic") == [True] * 8
    assert not any(_moves(snaps, "aux"))  # the aux head trains in the aux phase only
    # policy-only epochs: the critic is the idle one
    learner = make_learner(recipe, env, "--epochs", "4", "--value-epochs", "1", *flags)
    snaps, _ = _trace_policy_phase(learner, batches[0])
    assert _moves(snaps, "actor") == [True] * 8
    assert _moves(snaps, "critic") == [True] * 2 + [False] * 6
    assert not any(_moves(snaps, "aux"))


@pytest.mark.parametrize("arch", ["dual", "shared"])
@pytest.mark.parametrize(("epochs", "value_epochs"), [(1, 3), (3, 1), (2, 2)])
def test_c_each_network_takes_its_own_epoch_count_of_optimiser_steps(
    recipe,  # noqa: F811
    env,  # noqa: F811
    batches,  # noqa: F811
    arch,
    epochs,
    value_epochs,
):
    flags = ["--epochs", str(epochs), "--value-epochs", str(value_epochs), "--arch", arch]
    learner = make_learner(recipe, env, *flags)
    snaps, steps = _trace_policy_phase(learner, batches[0])
    assert steps["actor"] == epochs * MINIBATCHES
    assert steps["critic"] == value_epochs * MINIBATCHES
    assert steps["aux"] == 0
    assert sum(_moves(snaps, "actor")) == epochs * MINIBATCHES
    assert sum(_moves(snaps, "critic")) == value_epochs * MINIBATCHES


def test_c_value_epochs_default_to_the_policy_epochs(recipe, env, batches):  # noqa: F811
    learner = make_learner(recipe, env, "--epochs", "3")
    _, steps = _trace_policy_phase(learner, batches[0])
    assert steps["actor"] == steps["critic"] == 3 * MINIBATCHES


def test_optimisers_are_named_per_network(recipe, env):  # noqa: F811
    learner = make_learner(recipe, env)
    opts = learner.optimizers()
    assert set(opts) == {"optimizer", "value_optimizer", "aux_optimizer"}
    held = lambda opt: {id(p) for g in opt.param_groups for p in g["params"]}  # noqa: E731
    own = _own_params(learner)
    assert held(opts["optimizer"]) == {id(p) for p in own["actor"]}
    assert held(opts["value_optimizer"]) == {id(p) for p in own["critic"]}
    every = {id(p) for p in learner.nets.parameters()}
    assert held(opts["aux_optimizer"]) == every
    # --aux-optimizer shared: the aux phase steps the policy-phase optimisers (the policy's
    # then also holds the aux head, which gets no gradient in the policy phase)
    learner = make_learner(recipe, env, "--aux-optimizer", "shared", "--arch", "shared")
    opts = learner.optimizers()
    own = _own_params(learner)
    assert set(opts) == {"optimizer", "value_optimizer"}
    assert held(opts["optimizer"]) == {id(p) for p in own["actor"] + own["aux"]}
    assert held(opts["value_optimizer"]) == {id(p) for p in own["critic"]}


@pytest.mark.parametrize("aux_opt", ["separate", "shared"])
def test_every_optimiser_follows_the_learning_rate_schedule(recipe, env, batches, aux_opt):  # noqa: F811
    learner = make_learner(recipe, env, "--aux-optimizer", aux_opt, "--aux-lr", "3e-3")
    lr = lambda opt: opt.param_groups[0]["lr"]  # noqa: E731
    ctx = context()
    ctx.counters.frames = ctx.total_frames // 2  # linear schedule, half way: lr / 2
    seen = []
    original = learner.aux_phase
    learner.aux_phase = lambda c, *, lr: seen.append(lr) or original(c, lr=lr)
    for b in batches[:2]:  # the second batch ends the phase (n_pi 2)
        metrics = learner.update(b.clone(), ctx)
        assert metrics["lr"] == pytest.approx(learner.lr_schedule.lr / 2)
        for opt in learner.optimizers().values():
            if opt is not learner.aux_optimizer:  # after the aux phase: back to the schedule
                assert lr(opt) == pytest.approx(learner.lr_schedule.lr / 2)
    assert seen == [pytest.approx(3e-3 / 2)] and metrics["aux/lr"] == pytest.approx(3e-3 / 2)
    if learner.aux_optimizer is not None:
        assert lr(learner.aux_optimizer) == pytest.approx(3e-3 / 2)


# --------------------------------------------------------------------------- (d) grad accum
def _after_one_aux_phase(recipe, env, batches, *flags):  # noqa: F811
    learner = make_learner(
        recipe, env, "--n-pi", "3", "--aux-epochs", "1", "--aux-minibatches", "2", *flags
    )
    for b in batches[:2]:
        learner.update(b.clone(), context())
    start = _params(learner.nets)
    calls: list[int] = []
    original = learner.aux_loss.forward
    learner.aux_loss.forward = lambda td: calls.append(td.shape[0]) or original(td)
    result = learner.aux_phase(context(), lr=learner.lr_schedule.lr)
    assert not _same(start, _params(learner.nets))  # the phase did train
    return learner, calls, result


@pytest.mark.parametrize("aux_opt", ["separate", "shared"])
@pytest.mark.parametrize("k", [2, 3, 4])
def test_d_aux_gradient_accumulation_equals_one_backward(
    recipe,  # noqa: F811
    env,  # noqa: F811
    batches,  # noqa: F811
    k,
    aux_opt,
):
    # 2 batches x 4 envs = 8 rollouts, 2 minibatches of 4: k = 3 splits them 2 + 1 + 1
    one, calls1, res1 = _after_one_aux_phase(recipe, env, batches, "--aux-optimizer", aux_opt)
    acc, calls, res = _after_one_aux_phase(
        recipe, env, batches, "--aux-optimizer", aux_opt, "--aux-grad-accum", str(k)
    )
    assert calls1 == [4, 4]
    assert len(calls) == 2 * k and max(calls) == -(-4 // k)  # chunks of whole rollouts
    moved = max(
        float((p - q).detach().abs().max())
        for p, q in zip(one.nets.parameters(), acc.nets.parameters())
    )
    assert moved < 1e-6
    for name in ("aux/loss_distill", "aux/loss_value", "aux/grad_norm", "aux/policy_kl_after"):
        assert abs(res[name] - res1[name]) < 1e-5, name
    assert res["aux/kl_max"] == pytest.approx(res1["aux/kl_max"], abs=1e-6)
