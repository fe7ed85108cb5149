"""``--init``: the actor and critic initialisation schemes (rlkit.modules.networks.reinit_).

References: the distributions each scheme names (flax's LeCun-normal, the variance 1 /
fan-in of a normal truncated at two standard deviations; gymnax-blines' biases uniform in
[0, 0.05)), and PyTorch's own constructor drawing from the same seed.
"""

from __future__ import annotations

import math
import shlex

import pytest
import torch
from torch import nn

from rlkit.algorithms import load
from rlkit.configs.ppo import PPOConfig
from rlkit.envs import make_env
from rlkit.modules import actor_critic_networks
from rlkit.modules.networks import reinit_


def _layers(module):
    return [m for m in module.modules() if isinstance(m, nn.Linear)]


def test_gymnax_weights_are_lecun_normal_and_biases_uniform_in_0_to_005():
    torch.manual_seed(0)
    net = reinit_(nn.Sequential(nn.Linear(400, 512), nn.ReLU(), nn.Linear(512, 300)), "gymnax")
    for layer in _layers(net):
        fan_in = layer.in_features
        w = layer.weight.detach()
        # variance exactly 1 / fan-in (flax divides the truncated normal by its own std)
        assert w.var().item() == pytest.approx(1.0 / fan_in, rel=0.03)
        assert w.mean().item() == pytest.approx(0.0, abs=3 * math.sqrt(1.0 / fan_in / w.numel()))
        # truncated at two of the underlying normal's standard deviations
        bound = 2.0 * math.sqrt(1.0 / fan_in) / 0.87962566103423978
        assert w.abs().max().item() <= bound + 1e-6
        assert w.abs().max().item() > 0.95 * bound  # and the tails reach it
        b = layer.bias.detach()
        assert b.min().item() >= 0.0 and b.max().item() < 0.05
        assert b.mean().item() == pytest.approx(0.025, abs=0.005)


def test_torch_is_pytorchs_default_from_the_same_seed():
    torch.manual_seed(3)
    net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    nn.init.zeros_(net[0].weight)
    torch.manual_seed(7)
    reinit_(net, "torch")
    torch.manual_seed(7)
    fresh = [nn.Linear(4, 8), nn.Linear(8, 2)]  # the constructor draws weight, then bias
    for got, want in zip(_layers(net), fresh, strict=True):
        torch.testing.assert_close(got.weight, want.weight)
        torch.testing.assert_close(got.bias, want.bias)


def test_orthogonal_leaves_the_builders_weights_and_unknown_names_are_refused():
    from rlkit.configs.onpolicy import NETWORK_INITS
    from rlkit.modules.networks import INITS

    assert NETWORK_INITS == INITS  # the torch-free flag's choices are the schemes
    net = nn.Linear(3, 3)
    before = net.weight.detach().clone()
    assert reinit_(net, "orthogonal") is net
    torch.testing.assert_close(net.weight, before)
    with pytest.raises(ValueError, match="use one of orthogonal, torch, gymnax"):
        reinit_(net, "lecun")
    env = make_env("CartPole-v1", num_envs=1)
    with pytest.raises(ValueError, match="unknown initialisation 'xavier'"):
        actor_critic_networks(env, init="xavier")


def test_actor_critic_networks_reinitialise_both_networks_but_not_the_log_std():
    env = make_env("Pendulum-v1", num_envs=1)
    torch.manual_seed(0)
    actor, critic, _ = actor_critic_networks(env, hidden=(64, 64), init="gymnax")
    for net in (actor, critic):
        layers = _layers(net)
        assert len(layers) == 3
        for layer in layers:
            assert layer.bias.min().item() >= 0.0 and layer.bias.max().item() < 0.05
            assert layer.bias.abs().sum().item() > 0
    # the policy head: LeCun-normal (std 1/8 for 64 inputs), not the orthogonal 0.01 gain
    head = _layers(actor)[-1]
    assert head.weight.std().item() > 0.06
    log_std = [p for n, p in actor.named_parameters() if "log_std" in n or "scale" in n]
    assert log_std and all(torch.equal(p, torch.zeros_like(p)) for p in log_std)
    # the default keeps the orthogonal policy head (gain 0.01: every singular value 0.01)
    actor, _, _ = actor_critic_networks(env, hidden=(64, 64))
    sv = torch.linalg.svdvals(_layers(actor)[-1].weight.detach())
    torch.testing.assert_close(sv, torch.full_like(sv, 0.01))


def test_the_flag_reaches_the_recipes_networks_and_bad_values_are_refused(tmp_path):
    with pytest.raises(
        ValueError, match="--init must be one of orthogonal, torch, gymnax, got 'lecun'"
    ):
        PPOConfig(init="lecun")
    args = shlex.split(
        "--num-envs 2 --rollout-steps 16 --minibatch-size 32 --epochs 1 --total-frames 32 "
        "--eval-every 0 --eval-episodes 1 --progress false --checkpoint-every 0 --init gymnax"
    )
    for algo in ("ppo", "a2c", "impala", "appo", "rnd"):
        run = tmp_path / algo
        extra = ["--minibatch-size", "32"] if algo != "a2c" else []
        load(algo).main([*args, *extra, "--run-dir", str(run)])
        state = torch.load(run / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)
        biases = [
            v
            for k, v in _flat(state).items()
            if k.endswith(".bias") and ("actor" in k or "critic" in k) and v.ndim == 1
        ]
        assert biases, f"{algo}: no actor/critic biases in the checkpoint"
        # one epoch of tiny steps moves no bias far from gymnax's [0, 0.05)
        assert all(b.min().item() > -0.02 and b.max().item() < 0.07 for b in biases), algo
        assert any(b.abs().sum().item() > 0 for b in biases), algo


def _flat(state, prefix=""):
    out = {}
    for k, v in state.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        elif isinstance(v, torch.Tensor):
            out[f"{prefix}{k}"] = v
    return out
