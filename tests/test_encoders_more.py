"""``--encoder`` on dqn, sac (discrete actions), daac and rnd (and ppo ``--intrinsic rnd``),
and the suite presets of those recipes.

References are the papers' layer tables (Mnih et al. 2015; Young & Tian 2019, MinAtar's
``examples/dqn.py``), forward passes written here with ``torch.nn.functional``, and the
settings of the sources each preset names, typed in here from those sources.
"""

from __future__ import annotations

import gymnasium
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from rlkit import algorithms
from rlkit.modules import ImpalaCNN, MinAtarCNN, NatureCNN
from tests.test_encoders import ENV_IDS, TinyPixels, frames, make_pixels

IMAGE = (NatureCNN, ImpalaCNN, MinAtarCNN)
MORE = ("dqn", "sac", "daac", "rnd")
ATARI_ID = "rlkit-test/TinyPixels84-v0"  # ALE's [4, 84, 84] channels-first stack
if ATARI_ID not in gymnasium.registry:
    gymnasium.register(
        ATARI_ID, entry_point=TinyPixels, max_episode_steps=8, kwargs=dict(shape=(4, 84, 84))
    )


def _encoders(module: nn.Module) -> list[nn.Module]:
    return [m for m in module.modules() if isinstance(m, IMAGE)]


def _build(name: str, argv: list[str], env, presets: bool = False):
    from rlkit.training import parse_config

    module = algorithms.load(name)
    if name in ("dqn", "sac"):
        base = ["--batch-size", "8", "--buffer-size", "64", "--learning-starts", "8"]
    else:
        base = ["--num-envs", "2", "--rollout-steps", "16", "--minibatch-size", "32"]
    cfg = parse_config(
        algorithms.config_class(name),
        [*base, *argv],
        presets=getattr(module, "PRESETS", None) if presets else None,
    )
    return cfg, module.build(cfg, env)


def _distinct(*modules: nn.Module) -> bool:
    ids = [{id(p) for p in m.parameters()} for m in modules]
    return all(a.isdisjoint(b) for i, a in enumerate(ids) for b in ids[i + 1 :])


# --------------------------------------------------------------------------- every network


@pytest.mark.parametrize("encoder", ["nature", "impala", "minatar"])
def test_dqn_q_and_target_networks_use_the_encoder(encoder):
    env = make_pixels("nature" if encoder == "nature" else "small")
    cfg, learner = _build("dqn", ["--encoder", encoder, "--feature-dim", "24"], env)
    (q_enc,) = _encoders(learner.loss.q_network)
    (target_enc,) = _encoders(learner.loss.target_network)
    assert type(q_enc) is type(target_enc) and q_enc.out_features == 24
    assert _distinct(q_enc, target_enc)  # the target is a copy, not the same module
    for p, t in zip(q_enc.parameters(), target_enc.parameters(), strict=True):
        assert torch.equal(p, t) and not t.requires_grad
    td = env.rollout(3)  # uint8 frames, random actions
    assert td["observation"].dtype == torch.uint8
    assert learner.loss.q_network(td.clone())["action_value"].shape == (2, 3, 3)
    assert learner.loss.target_network(td.clone())["action_value"].shape == (2, 3, 3)


@pytest.mark.parametrize("encoder", ["nature", "minatar"])
def test_discrete_sac_actor_and_twin_critics_each_have_their_own_encoder(encoder):
    env = make_pixels("nature" if encoder == "nature" else "small")
    cfg, learner = _build("sac", ["--encoder", encoder, "--hidden", "16"], env)
    loss = learner.loss
    nets = [loss.actor, loss.q1, loss.q2, loss.q1_target, loss.q2_target]
    encs = [_encoders(n) for n in nets]
    assert [len(e) for e in encs] == [1] * 5
    assert _distinct(*(e[0] for e in encs))
    td = env.rollout(3)
    assert td["observation"].dtype == torch.uint8
    assert loss.actor(td.clone())["action"].shape == (2, 3)
    for q in (loss.q1, loss.q2, loss.q1_target, loss.q2_target):
        assert q(td.clone())["action_value"].shape == (2, 3, 3)


@pytest.mark.parametrize("encoder", ["impala", "minatar"])
def test_daac_policy_trunk_and_value_network_use_the_encoder(encoder):
    env = make_pixels()
    cfg, learner = _build("daac", ["--encoder", encoder, "--feature-dim", "24"], env)
    nets = learner.nets
    (trunk_enc,) = _encoders(nets["actor"])
    (critic_enc,) = _encoders(nets["critic"])
    # the policy head and the advantage head share the trunk (the paper's policy network);
    # the value network shares nothing with it
    assert _encoders(nets["advantage_head"]) == [trunk_enc]
    assert _distinct(trunk_enc, critic_enc) and critic_enc.out_features == 24
    td = env.rollout(3, learner.collect_policy())
    assert nets["advantage_head"](td.clone())["advantage_pred"].shape == (2, 3, 1)
    assert nets["critic"](td.clone())["state_value"].shape == (2, 3, 1)


@pytest.mark.parametrize(("name", "extra"), [("rnd", []), ("ppo", ["--intrinsic", "rnd"])])
def test_rnd_target_predictor_and_intrinsic_critic_use_the_encoder(name, extra):
    env = make_pixels()
    argv = ["--encoder", "minatar", "--feature-dim", "24", *extra]
    if name == "rnd":
        argv += ["--normalize-obs", "false"]
    cfg, learner = _build(name, argv, env)
    bonus = learner.intrinsic
    target, predictor, critic = bonus.rnd.target, bonus.rnd.predictor, bonus.critic
    encs = [_encoders(n) for n in (target, predictor, critic)]
    assert [len(e) for e in encs] == [1, 1, 1]
    assert all(e[0].out_features == 24 for e in encs)
    assert _distinct(*(e[0] for e in encs))
    assert not any(p.requires_grad for p in target.parameters())
    # the bonus reads the standardised frames [N, T, H, W, C] and is positive
    obs = frames((12, 12, 3), n=6).reshape(2, 3, 12, 12, 3)
    error = bonus.rnd.prediction_error(obs)
    assert error.shape == (2, 3) and bool((error > 0).all())
    assert bonus.value(obs).shape == (2, 3, 1)


def test_icm_refuses_an_image_encoder_and_names_the_fix():
    with pytest.raises(ValueError, match=r"'icm' builds MLPs.*use --intrinsic rnd"):
        _build("ppo", ["--encoder", "minatar", "--intrinsic", "icm"], make_pixels())


def test_rnd_on_images_without_an_encoder_names_the_fix():
    from rlkit.objectives.intrinsic import make_intrinsic

    with pytest.raises(ValueError, match=r"for images use rnd with an image encoder"):
        make_intrinsic("rnd", make_pixels())


# --------------------------------------------------------------------------- layer tables


def test_dqn_on_minatar_is_the_reference_network():
    """MinAtar's examples/dqn.py QNetwork: conv(in, 16, 3x3, s1) -> ReLU -> Linear(1024, 128)
    -> ReLU -> Linear(128, actions), PyTorch's default init; the forward pass is redone here
    with torch.nn.functional on the network's own weights."""
    from rlkit.envs import make_env

    env = make_env("MinAtar/Breakout-v1", num_envs=1, seed=0)
    cfg, learner = _build("dqn", ["--env", "MinAtar/Breakout-v1"], env, presets=True)
    n = int(env.action_spec.space.n)
    q = learner.loss.q_network
    shapes = [tuple(p.shape) for p in q.parameters()]
    assert shapes == [(16, 4, 3, 3), (16,), (128, 1024), (128,), (n, 128), (n,)]
    w0, b0, w1, b1, w2, b2 = q.parameters()
    x = frames((10, 10, 4), n=5)
    chw = x.permute(0, 3, 1, 2).float() / 255.0
    h = F.relu(F.conv2d(chw, w0, b0, stride=1)).flatten(1)
    ref = F.linear(F.relu(F.linear(h, w1, b1)), w2, b2)
    from tensordict import TensorDict

    out = q(TensorDict({"observation": x}, [5]))["action_value"]
    torch.testing.assert_close(out, ref)
    # uint8 frames equal the same frames as floats / 255
    out_f = q(TensorDict({"observation": x.float() / 255.0}, [5]))["action_value"]
    torch.testing.assert_close(out_f, out)
    # --init torch (the preset: PyTorch's default init, as the reference): the conv is not
    # orthogonal (an orthogonal one with gain sqrt 2 has W W^T = 2 I)
    w = w0.detach().reshape(16, -1)
    assert not torch.allclose(w @ w.T, 2 * torch.eye(16), atol=1e-3)


def test_dqn_nature_network_is_the_papers_on_atari_frames():
    """Mnih et al. 2015 on [4, 84, 84] frames: 32 8x8 s4, 64 4x4 s2, 64 3x3 s1, 512 units."""
    from rlkit.envs import make_env

    env = make_env(ATARI_ID, num_envs=1, seed=0)
    cfg, learner = _build("dqn", ["--encoder", "nature"], env)
    q = learner.loss.q_network
    convs = [m for m in q.modules() if isinstance(m, nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size, c.stride) for c in convs] == [
        (32, (8, 8), (4, 4)),
        (64, (4, 4), (2, 2)),
        (64, (3, 3), (1, 1)),
    ]
    linears = [(m.in_features, m.out_features) for m in q.modules() if isinstance(m, nn.Linear)]
    # the encoder's 512 units, then the --hidden layers (256 256 by default), then 3 actions
    assert linears == [(3136, 512), (512, 256), (256, 256), (256, 3)]


@pytest.mark.parametrize("name", ["sac", "daac"])
def test_uint8_frames_equal_float_frames_over_255(name):
    from tensordict import TensorDict

    cfg, learner = _build(name, ["--encoder", "minatar"], make_pixels())
    critic = learner.loss.q1 if name == "sac" else learner.nets["critic"]
    x = frames((12, 12, 3), n=4)
    a = critic(TensorDict({"observation": x}, [4]))
    b = critic(TensorDict({"observation": x.float() / 255.0}, [4]))
    key = "action_value" if name == "sac" else "state_value"
    torch.testing.assert_close(a[key], b[key])


# --------------------------------------------------------------------------- errors


def test_sac_refuses_an_image_encoder_on_continuous_actions():
    with pytest.raises(ValueError, match=r"discrete actions only.*--encoder mlp"):
        _build("sac", ["--encoder", "minatar"], make_pixels("continuous"))


@pytest.mark.parametrize("name", MORE)
def test_mismatched_encoder_and_observations_are_refused(name):
    from rlkit.envs import make_env

    off = name in ("dqn", "sac")
    with pytest.raises(ValueError, match=r"--encoder mlp got image observations of shape"):
        _build(name, [] if off else ["--normalize-obs", "false"], make_pixels())
    with pytest.raises(ValueError, match="--encoder minatar needs image observations"):
        argv = ["--encoder", "minatar"] + ([] if off else ["--normalize-obs", "false"])
        _build(name, argv, make_env("CartPole-v1", num_envs=2))
    if not off:
        with pytest.raises(ValueError, match="--normalize-obs applies to vector observations"):
            _build(name, ["--encoder", "minatar", "--normalize-obs", "true"], make_pixels())


@pytest.mark.parametrize("name", MORE)
def test_feature_dim_without_an_image_encoder_is_refused(name):
    config = algorithms.config_class(name)
    with pytest.raises(ValueError, match="--feature-dim sizes an image encoder's output"):
        config(feature_dim=64)
    with pytest.raises(ValueError, match="--feature-dim must be > 0"):
        config(encoder="nature", feature_dim=0)


@pytest.mark.parametrize("name", ["dqn", "sac"])
def test_off_policy_empty_hidden_only_after_an_image_encoder(name):
    config = algorithms.config_class(name)
    assert config(encoder="minatar", hidden=()).hidden == ()
    with pytest.raises(ValueError, match="--hidden needs positive layer sizes"):
        config(hidden=())


def test_dqn_optimizer_flag():
    env = make_pixels()
    _, adam = _build("dqn", ["--encoder", "minatar"], env)
    _, rms = _build(
        "dqn", ["--encoder", "minatar", "--optimizer", "rmsprop", "--lr", "2.5e-4"], env
    )
    assert type(adam.optimizer) is torch.optim.Adam
    assert type(rms.optimizer) is torch.optim.RMSprop
    group = rms.optimizer.param_groups[0]
    # Mnih et al. 2015 / MinAtar's dqn.py: squared-gradient momentum 0.95, gradient momentum
    # 0.95, min squared gradient 0.01, centered
    assert (group["lr"], group["alpha"], group["momentum"], group["eps"]) == (
        2.5e-4,
        0.95,
        0.95,
        0.01,
    )
    assert group["centered"] is True


# --------------------------------------------------------------------------- presets


def _preset(name: str, env: str, argv: list[str] | None = None):
    from rlkit.training import parse_config

    module = algorithms.load(name)
    return parse_config(
        algorithms.config_class(name), ["--env", env, *(argv or [])], presets=module.PRESETS
    )


@pytest.mark.parametrize("name", (*MORE, "ppo"))
def test_a_suite_id_alone_picks_the_suites_network(name):
    minatar = _preset(name, "MinAtar/Breakout-v1")
    atari = _preset(name, "ALE/Breakout-v5")
    # PPO's MinAtar preset (and DAAC's and RND's, built on it) is gymnax-blines' MLP
    network = ("flatten", (256, 256)) if name in ("ppo", "daac", "rnd") else ("minatar", ())
    assert (minatar.encoder, minatar.hidden) == network
    assert (atari.encoder, atari.hidden) == ("nature", ())
    assert _preset(name, "MinAtar/Breakout-v1", ["--encoder", "impala"]).encoder == "impala"
    assert _preset(name, "CartPole-v1").encoder == "mlp"


def test_ppo_minatar_preset_is_gymnax_blines():
    # gymnax-blines agents/Breakout-MinAtar/ppo.yaml (and SpaceInvaders'): num_train_envs 64,
    # n_steps 128, n_minibatch 8, epoch_ppo 4, lr 5e-4 (begin = end), gamma 0.999,
    # gae_lambda 0.95, clip_eps 0.2 (ratio and value, utils/ppo.py), entropy_coeff 0.01,
    # critic_coeff 0.5, max_grad_norm 0.5, Adam eps 1e-5, 10M steps; Categorical-MLP of two
    # 256-unit ReLU layers per network on the flattened frame; evaluation samples actions
    for game in ("Breakout", "SpaceInvaders"):
        cfg = _preset("ppo", f"MinAtar/{game}-v1")
        assert (cfg.num_envs, cfg.rollout_steps, cfg.epochs) == (64, 128, 4)
        assert cfg.num_envs * cfg.rollout_steps // cfg.minibatch_size == 8
        assert (cfg.lr, cfg.lr_schedule, cfg.adam_eps) == (5e-4, "constant", 1e-5)
        assert (cfg.gamma, cfg.gae_lambda, cfg.clip_epsilon, cfg.value_clip) == (
            0.999, 0.95, 0.2, 0.2
        )  # fmt: skip
        assert (cfg.entropy_coef, cfg.value_coef, cfg.max_grad_norm) == (0.01, 0.5, 0.5)
        assert (cfg.encoder, cfg.hidden, cfg.activation) == ("flatten", (256, 256), "relu")
        assert (cfg.total_frames, cfg.normalize_advantage) == (10_000_000, True)
        assert cfg.eval_deterministic is False


def test_ppg_minatar_preset_is_ppos_with_the_ppg_papers_phases():
    # Cobbe et al. 2021, Table 1: E_pi 1, E_V 1, N_pi 32, E_aux 6, beta_clone 1, auxiliary
    # minibatches of 1,024 frames (16 N_pi per epoch of 64 x 256-step rollouts); everything
    # else as PPO's MinAtar preset, so the comparison isolates PPG
    ppo, ppg = _preset("ppo", "MinAtar/Breakout-v1"), _preset("ppg", "MinAtar/Breakout-v1")
    assert (ppg.epochs, ppg.value_epochs, ppg.n_pi, ppg.aux_epochs) == (1, 1, 32, 6)
    assert ppg.beta_clone == 1.0
    rollouts = ppg.n_pi * ppg.num_envs  # the auxiliary buffer, in rollouts
    assert rollouts // ppg.aux_minibatches * ppg.rollout_steps == 1024
    shared = [
        "num_envs",
        "rollout_steps",
        "minibatch_size",
        "lr",
        "lr_schedule",
        "adam_eps",
        "gamma",
        "gae_lambda",
        "clip_epsilon",
        "value_clip",
        "entropy_coef",
        "value_coef",
        "max_grad_norm",
        "encoder",
        "hidden",
        "activation",
        "total_frames",
        "eval_deterministic",
        "eval_every",
    ]
    assert {k: getattr(ppg, k) for k in shared} == {k: getattr(ppo, k) for k in shared}


def test_impala_minatar_preset_is_the_impala_papers_learner():
    # Espeholt et al. 2018, Table G.1 (Atari): unroll 20, batch 32 unrolls, RMSProp eps 0.01,
    # lr 0.0006, entropy 0.01, baseline cost 0.5, gradient clipping 40, discount 0.99; each
    # unroll used once; PPO's MinAtar network and evaluation
    cfg = _preset("impala", "MinAtar/SpaceInvaders-v1")
    assert cfg.rollout_steps == 20 and cfg.minibatch_size == 32 * 20 and cfg.epochs == 1
    # TensorFlow's epsilon 0.01 inside the square root is torch's 0.1 outside it
    assert (cfg.optimizer, cfg.adam_eps**2, cfg.lr) == ("rmsprop", pytest.approx(0.01), 6e-4)
    assert cfg.reduction == "sum"  # the paper's losses are sums; its RMSProp assumes them
    assert (cfg.entropy_coef, cfg.value_coef, cfg.max_grad_norm, cfg.gamma) == (
        0.01, 0.5, 40.0, 0.99
    )  # fmt: skip
    assert (cfg.encoder, cfg.hidden, cfg.activation) == ("flatten", (256, 256), "relu")
    assert (cfg.total_frames, cfg.eval_deterministic) == (10_000_000, False)


def test_dqn_minatar_preset_is_the_minatar_papers():
    # MinAtar/examples/dqn.py: BATCH_SIZE 32, REPLAY_BUFFER_SIZE 100000,
    # TARGET_NETWORK_UPDATE_FREQ 1000, TRAINING_FREQ 1, NUM_FRAMES 5000000, FIRST_N_FRAMES
    # 100000, REPLAY_START_SIZE 5000, END_EPSILON 0.1, STEP_SIZE 0.00025, GAMMA 0.99,
    # centered RMSprop, Huber loss
    cfg = _preset("dqn", "MinAtar/Asterix-v1")
    assert (cfg.batch_size, cfg.buffer_size, cfg.target_update_period) == (32, 100_000, 1000)
    assert (cfg.total_frames, cfg.learning_starts, cfg.utd_ratio) == (5_000_000, 5000, 1.0)
    assert cfg.num_envs * cfg.steps_per_batch * cfg.utd_ratio == 1  # a step per frame
    assert (cfg.lr, cfg.optimizer, cfg.loss, cfg.gamma) == (2.5e-4, "rmsprop", "huber", 0.99)
    assert (cfg.epsilon_start, cfg.epsilon_end, cfg.target_update) == (1.0, 0.1, "hard")
    # epsilon reaches 0.1 at frame 105k (5k random + 100k decay)
    assert cfg.exploration_fraction * cfg.total_frames == pytest.approx(105_000)
    assert (cfg.init, cfg.double_dqn, cfg.n_steps) == ("torch", False, 1)


def test_dqn_atari_preset_is_cleanrls():
    # CleanRL dqn_atari.py: lr 1e-4 (Adam), buffer 1M, batch 32, learning_starts 80000,
    # train_frequency 4, target_network_frequency 1000, start_e 1, end_e 0.01,
    # exploration_fraction 0.1, 10M steps, gamma 0.99, MSE loss
    cfg = _preset("dqn", "ALE/Pong-v5")
    assert (cfg.lr, cfg.optimizer, cfg.loss) == (1e-4, "adam", "mse")
    assert (cfg.buffer_size, cfg.batch_size, cfg.learning_starts) == (1_000_000, 32, 80_000)
    frames_per_step = cfg.num_envs * cfg.steps_per_batch / (cfg.utd_ratio * cfg.steps_per_batch)
    assert frames_per_step == 4
    assert cfg.target_update_period * frames_per_step == 1000
    assert (cfg.epsilon_start, cfg.epsilon_end, cfg.exploration_fraction) == (1.0, 0.01, 0.1)
    assert (cfg.total_frames, cfg.gamma) == (10_000_000, 0.99)


def test_flags_win_over_the_suite_preset():
    cfg = _preset("dqn", "MinAtar/Breakout-v1", ["--lr", "1e-3", "--optimizer", "adam"])
    assert (cfg.lr, cfg.optimizer, cfg.buffer_size) == (1e-3, "adam", 100_000)


# --------------------------------------------------------------------------- end to end


@pytest.mark.parametrize("name", ["dqn", "sac"])
def test_off_policy_recipes_train_on_pixels_in_process(name, tmp_path):
    module = algorithms.load(name)
    argv = [
        "--env",
        ENV_IDS["small"][0],
        "--encoder",
        "minatar",
        "--feature-dim",
        "16",
        "--hidden",
        "16",
        "--num-envs",
        "2",
        "--steps-per-batch",
        "8",
        "--batch-size",
        "8",
        "--buffer-size",
        "64",
        "--learning-starts",
        "16",
        "--total-frames",
        "48",
        "--eval-every",
        "0",
        "--eval-episodes",
        "1",
        "--progress",
        "false",
        "--run-dir",
        str(tmp_path / "run"),
    ]
    summary = module.main(argv)
    assert summary["frames"] == 48
    payload = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=True)
    convs = [k for k, t in payload["modules"][name].items() if t.ndim == 4]
    assert len(convs) == (2 if name == "dqn" else 5)  # Q and target; actor, Qs and targets
