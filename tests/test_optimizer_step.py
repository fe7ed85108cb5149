"""One optimiser step for every learner and run mode, through torch's public optimiser API.

* ``optimizer.step()`` is called in one place in ``rlkit/``
  (:meth:`rlkit.training.learner.Context.step_optimizer`), found by walking the syntax tree of
  every module (target networks and learning-rate schedulers have ``step()`` methods too:
  they are named here);
* no module reaches into torch's private optimiser API;
* a population's joint optimiser (:func:`rlkit.training.population.joint_optimizer`) moves
  each member's parameters and optimiser state exactly as the member's own
  ``optimizer.step()`` does, with a swept learning rate, and leaves a member without gradients
  (over its ``target_kl``, or stopped) untouched, step count included. The reference is
  torch's own per-member step on copies.
"""

from __future__ import annotations

import ast
import copy
from pathlib import Path

import pytest
import torch

from rlkit.training.population import joint_optimizer, regroup

RLKIT = Path(__file__).resolve().parents[1] / "rlkit"

#: receivers of ``.step()`` that are not optimisers: target networks, LR schedules
NOT_OPTIMIZERS = {
    "self.target_network",
    "self.target_actor",
    "self.q1_target",
    "self.q2_target",
    "self.exp_lr",
    "self.lr_scheduler",
    "self.lr_schedule",
}


def _step_calls() -> list[tuple[str, int, str]]:
    calls = []
    for path in sorted(RLKIT.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "step"
                and not node.args
                and not node.keywords
            ):
                receiver = ast.unparse(node.func.value)
                calls.append((str(path.relative_to(RLKIT.parent)), node.lineno, receiver))
    return calls


def test_optimizer_step_is_called_in_one_place():
    optimizer_steps = [c for c in _step_calls() if c[2] not in NOT_OPTIMIZERS]
    assert [(path, receiver) for path, _, receiver in optimizer_steps] == [
        ("rlkit/training/learner.py", "optimizer")
    ], optimizer_steps


def test_no_private_torch_optimizer_api():
    private = ("_init_group", "torch.optim._functional", "torch.optim.adam import", "adam.adam(")
    private += ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks")
    found = [
        (str(path.relative_to(RLKIT.parent)), name)
        for path in sorted(RLKIT.rglob("*.py"))
        for name in private
        if name in path.read_text()
    ]
    assert found == []


def _members(lrs, kind=torch.optim.Adam, **kw):
    """One small network and optimiser per learning rate, with gradients."""
    torch.manual_seed(0)
    nets = [torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))]
    nets += [copy.deepcopy(nets[0]) for _ in lrs[1:]]
    for k, net in enumerate(nets):  # members differ
        with torch.no_grad():
            for p in net.parameters():
                p.add_(0.1 * k)
    opts = [kind(net.parameters(), lr=lr, **kw) for net, lr in zip(nets, lrs)]
    return nets, opts


def _grads(nets, step):
    x = torch.linspace(-1, 1, 15).reshape(5, 3) + step
    for k, net in enumerate(nets):
        for p in net.parameters():
            p.grad = None
        (net(x * (k + 1)).pow(2).sum()).backward()


def _assert_same_state(a, b):
    assert a.keys() == b.keys() and a
    for i in a:
        for name, value in a[i].items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(b[i][name]))


@pytest.mark.parametrize(
    "kind, kw",
    [
        (torch.optim.Adam, {"fused": True}),
        (torch.optim.Adam, {"foreach": True, "weight_decay": 0.01}),
        (torch.optim.AdamW, {"fused": True}),
        (torch.optim.RMSprop, {"foreach": True}),
        (torch.optim.SGD, {"momentum": 0.9}),
    ],
)
def test_joint_step_is_each_members_own_step(kind, kw):
    lrs = [1e-2, 1e-3, 1e-2]
    nets, opts = _members(lrs, kind, **kw)
    ref_nets, ref_opts = _members(lrs, kind, **kw)
    joint = joint_optimizer(opts)
    for step in range(4):
        _grads(nets, step)
        _grads(ref_nets, step)
        skipped = 1 if step == 2 else None  # member 1 does not step once (target_kl)
        if skipped is not None:
            for p in nets[skipped].parameters():
                p.grad = None
        if step == 3:  # a schedule changes member 2's rate between updates
            for opt in (opts[2], ref_opts[2]):
                opt.param_groups[0]["lr"] = 5e-3
        regroup(joint, opts)
        joint.step()
        for k, opt in enumerate(ref_opts):
            if k != skipped:
                opt.step()
    for net, ref in zip(nets, ref_nets):
        for p, q in zip(net.parameters(), ref.parameters()):
            assert torch.equal(p, q)
    for opt, ref in zip(opts, ref_opts):  # the state lives in the members' optimisers
        _assert_same_state(opt.state_dict()["state"], ref.state_dict()["state"])
    if kind is not torch.optim.SGD:  # the skipped member took one step fewer
        steps = [float(o.state_dict()["state"][0]["step"]) for o in opts]
        assert steps == [4.0, 3.0, 4.0]
    assert len(joint.param_groups) == 3  # lr 1e-2, 1e-3 and 5e-3 after the change


def test_joint_step_sees_a_loaded_state_dict():
    """A resume loads each member's optimiser state; the joint optimiser steps from it."""
    nets, opts = _members([1e-2, 1e-3])
    joint = joint_optimizer(opts)
    _grads(nets, 0)
    regroup(joint, opts)
    joint.step()
    saved = [copy.deepcopy(o.state_dict()) for o in opts]
    _grads(nets, 1)
    joint.step()
    for opt, state in zip(opts, saved):
        opt.load_state_dict(state)
    assert all(float(o.state_dict()["state"][0]["step"]) == 1.0 for o in opts)
    _grads(nets, 1)
    joint.step()
    assert all(float(o.state_dict()["state"][0]["step"]) == 2.0 for o in opts)


def test_members_of_different_optimizer_kinds_are_refused():
    nets, _ = _members([1e-2, 1e-2])
    opts = [torch.optim.Adam(nets[0].parameters()), torch.optim.SGD(nets[1].parameters())]
    with pytest.raises(ValueError, match="same --optimizer"):
        joint_optimizer(opts)
