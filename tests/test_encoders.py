"""``--encoder`` / ``--feature-dim``: the encoder registry (rlkit.modules.make_encoder) and
the flags of ppo, a2c, impala, appo and ppg (dqn, sac, daac and rnd: test_encoders_more.py).

References are the papers' layer tables (Mnih et al. 2015; Espeholt et al. 2018; Young &
Tian 2019) and forward passes written here with ``torch.nn.functional``, never the modules'
own code.
"""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from rlkit import algorithms
from rlkit.modules import (
    ENCODERS,
    ChannelsLast,
    ImpalaCNN,
    MinAtarCNN,
    NatureCNN,
    image_layout,
    make_encoder,
)

ATARI = (84, 84, 4)  # four stacked 84x84 grayscale frames, channels-last
MINATAR = (10, 10, 4)  # MinAtar Breakout's 10x10x4 frame
SMALL = (36, 36, 4)  # the smallest frame the Nature CNN takes: quick checks of every encoder
#: the papers' feature widths
PAPER_FEATURES = {"nature": 512, "impala": 256, "minatar": 128}
RECIPES = ("ppo", "a2c", "impala", "appo", "ppg")
#: every recipe with --encoder (dqn, sac, daac, rnd: tests/test_encoders_more.py)
ENCODER_RECIPES = (*RECIPES, "daac", "rnd", "dqn", "sac")


class TinyPixels(gymnasium.Env):
    """Random uint8 frames of ``shape``, 3 actions, reward 1 for action 0, 8 steps long."""

    def __init__(self, shape=(12, 12, 3), continuous: bool = False) -> None:
        self.observation_space = gymnasium.spaces.Box(0, 255, shape=shape, dtype=np.uint8)
        if continuous:
            self.action_space = gymnasium.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        else:
            self.action_space = gymnasium.spaces.Discrete(3)

    def _frame(self) -> np.ndarray:
        return self.np_random.integers(0, 256, self.observation_space.shape, dtype=np.uint8)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._frame(), {}

    def step(self, action):
        reward = float(np.all(np.asarray(action) == 0))
        return self._frame(), reward, False, False, {}


ENV_IDS = {
    "small": ("rlkit-test/TinyPixels-v0", dict(shape=(12, 12, 3))),
    "nature": ("rlkit-test/TinyPixels36-v0", dict(shape=(36, 36, 2))),
    "continuous": ("rlkit-test/TinyPixelsBox-v0", dict(shape=(12, 12, 3), continuous=True)),
}
for _id, _kwargs in ENV_IDS.values():
    if _id not in gymnasium.registry:
        gymnasium.register(_id, entry_point=TinyPixels, max_episode_steps=8, kwargs=_kwargs)


def make_pixels(which: str = "small", num_envs: int = 2):
    from rlkit.envs import make_env

    return make_env(ENV_IDS[which][0], num_envs=num_envs, seed=0)


def frames(shape, n=3, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, *shape), dtype=torch.uint8, generator=g)


# --------------------------------------------------------------------------- the registry


@pytest.mark.parametrize("name", ["nature", "impala", "minatar"])
def test_encoders_on_an_atari_batch_give_the_papers_widths(name):
    enc, width = make_encoder(name, ATARI)
    assert width == PAPER_FEATURES[name]
    out = enc(frames(ATARI, n=6).reshape(2, 3, *ATARI))  # any leading dims
    assert out.shape == (2, 3, PAPER_FEATURES[name]) and out.dtype == torch.float32
    enc, width = make_encoder(name, ATARI, feature_dim=48)
    assert width == 48 and enc(frames(ATARI)).shape == (3, 48)


@pytest.mark.parametrize("name", ["impala", "minatar"])
def test_encoders_on_a_minatar_batch(name):
    enc, width = make_encoder(name, MINATAR)
    assert enc(frames(MINATAR, n=5)).shape == (5, PAPER_FEATURES[name]) == (5, width)


def test_nature_cnn_refuses_minatar_frames_and_names_the_fix():
    with pytest.raises(ValueError, match="at least 36x36.*--encoder impala or minatar"):
        make_encoder("nature", MINATAR)


@pytest.mark.parametrize("name", ["nature", "impala", "minatar"])
@pytest.mark.parametrize("layout", ["HWC", "CHW"])
def test_uint8_pixels_equal_float_pixels_over_255(name, layout):
    shape = SMALL if layout == "HWC" else (SMALL[2], SMALL[0], SMALL[1])
    enc, _ = make_encoder(name, shape)
    x = frames(shape)
    assert x.dtype == torch.uint8
    torch.testing.assert_close(enc(x), enc(x.float() / 255), rtol=0, atol=0)
    assert torch.equal(enc(x), enc(x.float() / 255))


@pytest.mark.parametrize("name", ["nature", "impala", "minatar"])
def test_channels_last_equals_channels_first_on_the_same_weights(name):
    enc, _ = make_encoder(name, SMALL)
    assert isinstance(enc, ChannelsLast)
    x = frames(SMALL)
    assert torch.equal(enc(x), enc.encoder(x.permute(0, 3, 1, 2)))
    with pytest.raises(ValueError, match=r"channels-last images \[\*, H, W, C\]"):
        enc(x.permute(0, 3, 1, 2))


def test_image_layout_follows_gymnasium_unless_the_first_axis_is_smaller():
    assert image_layout((84, 84, 4)) == ((4, 84, 84), True)
    assert image_layout((96, 96, 3)) == ((3, 96, 96), True)  # CarRacing
    assert image_layout((10, 10, 7)) == ((7, 10, 10), True)  # MinAtar Freeway: 7 channels
    assert image_layout((10, 10, 10)) == ((10, 10, 10), True)  # MinAtar Seaquest
    assert image_layout((4, 84, 84)) == ((4, 84, 84), False)
    assert image_layout((10, 10, 10), channels_last=False) == ((10, 10, 10), False)
    enc, _ = make_encoder("minatar", (10, 10, 7))
    assert enc.encoder.net[0].in_channels == 7


def test_nature_cnn_layers_are_the_papers():
    # Mnih et al. 2015, Methods: 32 filters 8x8 stride 4, 64 4x4 stride 2, 64 3x3 stride 1,
    # each followed by a rectifier, then a fully connected layer of 512 rectifier units
    enc = make_encoder("nature", ATARI)[0].encoder
    assert isinstance(enc, NatureCNN)
    convs = [m for m in enc.modules() if isinstance(m, nn.Conv2d)]
    got = [(c.in_channels, c.out_channels, c.kernel_size, c.stride, c.padding) for c in convs]
    assert got == [
        (4, 32, (8, 8), (4, 4), (0, 0)),
        (32, 64, (4, 4), (2, 2), (0, 0)),
        (64, 64, (3, 3), (1, 1), (0, 0)),
    ]
    (fc,) = [m for m in enc.modules() if isinstance(m, nn.Linear)]
    assert (fc.in_features, fc.out_features) == (64 * 7 * 7, 512)  # 84 -> 20 -> 9 -> 7
    x = frames(ATARI).permute(0, 3, 1, 2).float() / 255
    h = F.relu(F.conv2d(x, convs[0].weight, convs[0].bias, stride=4))
    h = F.relu(F.conv2d(h, convs[1].weight, convs[1].bias, stride=2))
    h = F.relu(F.conv2d(h, convs[2].weight, convs[2].bias, stride=1))
    expected = F.relu(F.linear(h.flatten(1), fc.weight, fc.bias))
    torch.testing.assert_close(enc(x), expected)


def test_minatar_network_is_the_papers():
    # Young & Tian 2019 (and MinAtar/examples/dqn.py): one conv of 16 3x3 filters, stride 1,
    # no padding (10x10 -> 8x8), then 128 rectifier units
    enc = make_encoder("minatar", MINATAR)[0].encoder
    assert isinstance(enc, MinAtarCNN)
    (conv,) = [m for m in enc.modules() if isinstance(m, nn.Conv2d)]
    assert (conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride) == (
        4,
        16,
        (3, 3),
        (1, 1),
    )
    assert conv.padding == (0, 0)
    (fc,) = [m for m in enc.modules() if isinstance(m, nn.Linear)]
    assert (fc.in_features, fc.out_features) == (16 * 8 * 8, 128)
    x = frames(MINATAR).permute(0, 3, 1, 2).float() / 255
    h = F.relu(F.conv2d(x, conv.weight, conv.bias))
    expected = F.relu(F.linear(h.flatten(1), fc.weight, fc.bias))
    torch.testing.assert_close(enc(x), expected)


def test_impala_stack_is_the_papers():
    # Espeholt et al. 2018, Fig. 3 (right): three stacks of 16, 32, 32 channels, each a 3x3
    # conv, a 3x3 max pool of stride 2 and two residual blocks; then 256 units
    enc = make_encoder("impala", SMALL)[0].encoder
    assert isinstance(enc, ImpalaCNN)
    stack_convs = [stack[0] for stack in enc.net[:3]]
    assert [c.out_channels for c in stack_convs] == [16, 32, 32]
    assert all(isinstance(stack[1], nn.MaxPool2d) for stack in enc.net[:3])
    assert enc.out_features == 256


def test_registry_errors_name_the_fix():
    with pytest.raises(
        ValueError,
        match=r"--encoder mlp got image observations of shape \(96, 96, 3\): use --encoder "
        r"nature\|impala\|minatar\|flatten",
    ):
        make_encoder("mlp", (96, 96, 3))
    with pytest.raises(ValueError, match=r"--encoder nature needs image observations.*\[8\]"):
        make_encoder("nature", (8,))
    with pytest.raises(ValueError, match="--feature-dim sizes an image encoder"):
        make_encoder("mlp", (8,), feature_dim=64)
    with pytest.raises(ValueError, match="unknown encoder 'resnet'"):
        make_encoder("resnet", ATARI)
    with pytest.raises(ValueError, match="features .* must be a positive int"):
        make_encoder("impala", ATARI, feature_dim=0)
    assert make_encoder("mlp", (8,)) == (None, 8)
    assert list(ENCODERS) == ["mlp", "nature", "impala", "minatar", "flatten"]
    with pytest.raises(ValueError, match="--encoder flatten has no layer to size"):
        make_encoder("flatten", MINATAR, feature_dim=128)


def test_flatten_encoder_is_the_frame_as_one_vector_and_feeds_the_hidden_layers():
    # gymnax-blines' MinAtar PPO network: the 10x10x4 frame flattened (flatten_3d), then
    # separate actor and critic MLPs of two 256-unit ReLU layers
    from rlkit.envs import make_env
    from rlkit.modules import actor_critic_networks

    enc, width = make_encoder("flatten", MINATAR)
    assert width == 400
    x = frames(MINATAR)  # uint8, channels-last
    torch.testing.assert_close(enc(x), x.permute(0, 3, 1, 2).reshape(len(x), -1).float() / 255)
    env = make_env("MinAtar/Breakout-v1", num_envs=2, seed=0)
    actor, critic, _ = actor_critic_networks(
        env, encoder="flatten", hidden=(256, 256), activation="relu"
    )
    td = env.reset()
    flat = td["observation"].permute(0, 3, 1, 2).reshape(2, -1).float() / 255
    for net, key in ((critic, "state_value"), (actor, "logits")):
        linears = [m for m in net.modules() if isinstance(m, nn.Linear)]
        assert [(m.in_features, m.out_features) for m in linears][:2] == [(400, 256), (256, 256)]
        h = flat
        for m in linears[:-1]:
            h = F.relu(F.linear(h, m.weight, m.bias))
        expected = F.linear(h, linears[-1].weight, linears[-1].bias)
        out = net(td.clone())
        torch.testing.assert_close(out[key].reshape(expected.shape), expected)
    env.close()


# --------------------------------------------------------------------------- the flags


@pytest.mark.parametrize("name", algorithms.NAMES)
def test_encoder_flags_are_listed_exactly_where_they_work(name):
    from rlkit.configs.base import build_parser

    parser = build_parser(algorithms.config_class(name))
    flags = {s for a in parser._actions for s in a.option_strings}
    expected = name in ENCODER_RECIPES
    assert ("--encoder" in flags) is expected and ("--feature-dim" in flags) is expected


def _build(name: str, argv: list[str], env):
    from rlkit.training import parse_config

    module = algorithms.load(name)
    extra = {"ppg": ["--n-pi", "2", "--aux-minibatches", "2"]}.get(name, [])
    base = ["--num-envs", "2", "--rollout-steps", "16", "--minibatch-size", "32", *extra]
    cfg = parse_config(algorithms.config_class(name), [*base, *argv])
    return cfg, module.build(cfg, env)


def _encoders(module: nn.Module) -> list[nn.Module]:
    return [m for m in module.modules() if isinstance(m, NatureCNN | ImpalaCNN | MinAtarCNN)]


@pytest.mark.parametrize("name", RECIPES)
@pytest.mark.parametrize("encoder", ["nature", "impala", "minatar"])
def test_encoder_flag_reaches_actor_and_critic(name, encoder):
    env = make_pixels("nature" if encoder == "nature" else "small")
    cfg, learner = _build(name, ["--encoder", encoder, "--feature-dim", "24"], env)
    assert cfg.encoder == encoder and cfg.feature_dim == 24
    (actor_enc,) = _encoders(learner.actor)
    (critic_enc,) = _encoders(learner.critic)
    assert type(actor_enc).__name__.lower().startswith(encoder[:4])
    assert any(isinstance(m, nn.Conv2d) for m in actor_enc.modules())
    assert actor_enc.out_features == critic_enc.out_features == 24
    # one encoder each (ppg's default --arch dual: a policy and a value network)
    actor_params = {id(p) for p in actor_enc.parameters()}
    assert actor_params.isdisjoint(id(p) for p in critic_enc.parameters())
    td = env.rollout(3, learner.collect_policy())  # uint8 frames in, actions out
    assert td["observation"].dtype == torch.uint8
    value = learner.critic(td.clone())
    assert value["state_value"].shape == (2, 3, 1)


def test_ppg_shared_arch_keeps_one_encoder():
    cfg, learner = _build("ppg", ["--encoder", "minatar", "--arch", "shared"], make_pixels())
    assert len({id(m) for m in _encoders(learner.actor) + _encoders(learner.critic)}) == 1
    assert _encoders(learner.actor)[0].out_features == 128


def test_image_encoder_with_a_gaussian_policy():
    cfg, learner = _build(
        "ppo", ["--encoder", "minatar", "--std-init", "0.5"], make_pixels("continuous")
    )
    td = make_pixels("continuous").rollout(2, learner.collect_policy())
    assert td["action"].shape == (2, 2, 2)
    scale = learner.actor.get_dist(td).base_dist.scale
    torch.testing.assert_close(scale, torch.full_like(scale, 0.5))


@pytest.mark.parametrize("name", RECIPES)
def test_mismatched_encoder_and_observations_are_refused(name):
    with pytest.raises(ValueError, match=r"--encoder mlp got image observations of shape"):
        _build(name, [], make_pixels())
    from rlkit.envs import make_env

    with pytest.raises(ValueError, match="--encoder minatar needs image observations"):
        _build(name, ["--encoder", "minatar"], make_env("CartPole-v1", num_envs=2))
    with pytest.raises(ValueError, match="--normalize-obs applies to vector observations"):
        _build(name, ["--encoder", "minatar", "--normalize-obs", "true"], make_pixels())


@pytest.mark.parametrize("name", RECIPES)
def test_feature_dim_without_an_image_encoder_is_refused(name):
    config = algorithms.config_class(name)
    extra = {"n_pi": 2, "aux_minibatches": 2} if name == "ppg" else {}
    base = dict(num_envs=2, rollout_steps=16, minibatch_size=32, **extra)
    with pytest.raises(ValueError, match="--feature-dim sizes an image encoder's output"):
        config(feature_dim=64, **base)
    with pytest.raises(ValueError, match="--feature-dim must be > 0"):
        config(encoder="nature", feature_dim=0, **base)


def test_ppo_trains_on_pixels_in_process(tmp_path):
    module = algorithms.load("ppo")
    summary = module.main(
        [
            "--env",
            ENV_IDS["small"][0],
            "--encoder",
            "minatar",
            "--feature-dim",
            "32",
            "--hidden",
            "32",
            "--num-envs",
            "2",
            "--rollout-steps",
            "16",
            "--minibatch-size",
            "16",
            "--epochs",
            "2",
            "--total-frames",
            "64",
            "--eval-every",
            "0",
            "--eval-episodes",
            "1",
            "--progress",
            "false",
            "--run-dir",
            str(tmp_path / "run"),
        ]
    )
    assert summary["frames"] == 64
    payload = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=True)
    conv_weights = [t for t in payload["modules"]["actor"].values() if t.ndim == 4]
    assert [tuple(t.shape) for t in conv_weights] == [(16, 3, 3, 3)]  # the MinAtar conv
