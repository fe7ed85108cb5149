"""Pixel suites (docs/pixels.md): MinAtar and ALE ids through ``make_env`` and every on-policy
recipe, the Atari protocol against gymnasium's own wrappers, ``uint8`` frames end to end."""

from __future__ import annotations

import sys

import gymnasium
import numpy as np
import pytest
import torch

from rlkit import algorithms
from rlkit.configs.suites import preset_for
from rlkit.envs import make_env
from rlkit.envs.suites import EpisodicLife
from rlkit.training import parse_config

ON_POLICY = ("ppo", "a2c", "ppg", "impala", "appo")
TINY = {
    "ppo": ["--rollout-steps", "16", "--minibatch-size", "32", "--epochs", "1"],
    "a2c": ["--rollout-steps", "16"],
    "ppg": [
        "--rollout-steps",
        "16",
        "--minibatch-size",
        "32",
        "--n-pi",
        "2",
        "--aux-minibatches",
        "2",
    ],
    "impala": ["--rollout-steps", "16", "--minibatch-size", "32"],
    "appo": ["--rollout-steps", "16", "--minibatch-size", "32"],
}


def _needs(module: str) -> None:
    pytest.importorskip(module)


def _train(name: str, env_id: str, run_dir, *extra: str) -> dict:
    return algorithms.load(name).main(
        [
            "--env",
            env_id,
            "--num-envs",
            "2",
            *TINY[name],
            "--total-frames",
            "64",
            "--eval-every",
            "0",
            "--eval-episodes",
            "1",
            "--progress",
            "false",
            "--run-dir",
            str(run_dir),
            *extra,
        ]
    )


# 1. ids, registration, errors --------------------------------------------------------------
@pytest.mark.parametrize("name", ON_POLICY)
def test_minatar_ids_train_in_every_on_policy_recipe(name, tmp_path):
    _needs("minatar")
    summary = _train(name, "MinAtar/Breakout-v1", tmp_path / name)
    assert summary["frames"] >= 64


def test_ale_id_trains_in_ppo(tmp_path):
    _needs("ale_py")
    summary = _train("ppo", "ALE/Pong-v5", tmp_path / "pong", "--eval-max-steps", "20")
    assert summary["frames"] == 64


def test_unknown_minatar_game_names_the_games():
    _needs("minatar")
    with pytest.raises(ValueError, match=r"unknown environment id 'MinAtar/Pacman-v1'.*MinAtar/"):
        make_env("MinAtar/Pacman-v1")


@pytest.mark.parametrize(
    ("env_id", "module", "extra"),
    [("MinAtar/Breakout-v1", "minatar", "minatar"), ("ALE/Pong-v5", "ale_py", "atari")],
)
def test_missing_suite_package_names_the_extra(monkeypatch, env_id, module, extra):
    monkeypatch.setitem(sys.modules, module, None)  # import fails as if not installed
    monkeypatch.delitem(gymnasium.registry, env_id, raising=False)
    with pytest.raises(ModuleNotFoundError, match=rf'--env {env_id} needs .*"\.\[{extra}\]"'):
        make_env(env_id)


def test_suite_presets_apply_to_every_id_of_the_suite():
    from rlkit.configs import a2c, ppo

    for game in ("Breakout", "SpaceInvaders"):
        cfg = parse_config(ppo.CONFIG, ["--env", f"MinAtar/{game}-v1"], presets=ppo.PRESETS)
        assert (cfg.encoder, cfg.hidden, cfg.num_envs, cfg.rollout_steps) == (
            "flatten",
            (256, 256),
            64,
            128,
        )
    cfg = parse_config(ppo.CONFIG, ["--env", "ALE/Pong-v5", "--lr", "1e-4"], presets=ppo.PRESETS)
    assert (cfg.encoder, cfg.num_envs, cfg.epochs, cfg.clip_epsilon, cfg.value_clip) == (
        "nature",
        8,
        4,
        0.1,
        0.1,
    )
    assert cfg.lr == 1e-4  # flags still win
    cfg = parse_config(a2c.CONFIG, ["--env", "ALE/Breakout-v5"], presets=a2c.PRESETS)
    assert (cfg.encoder, cfg.hidden) == ("nature", ())
    assert preset_for(ppo.PRESETS, "CartPole-v1", ppo.CONFIG) == {}


# 2. the Atari protocol against gymnasium's own wrappers -------------------------------------
class _ReferenceFireReset(gymnasium.Wrapper):
    """CleanRL's / SB3's FireResetEnv, written out here as the reference."""

    def reset(self, **kwargs):
        self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self.env.step(1)
        if terminated or truncated:
            self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self.env.step(2)
        if terminated or truncated:
            obs, info = self.env.reset(**kwargs)
        return obs, info


class _ReferenceEpisodicLife(gymnasium.Wrapper):
    """SB3's EpisodicLifeEnv (CleanRL's ppo_atari.py), written out here as the reference:
    a lost life ends the episode, the next reset plays on in the same game (one no-op step),
    and only a game over really resets."""

    def __init__(self, env):
        super().__init__(env)
        self.lives, self.was_real_done = 0, True

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.was_real_done = terminated or truncated
        lives = self.env.unwrapped.ale.lives()
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs):
        if self.was_real_done:
            obs, info = self.env.reset(**kwargs)
        else:
            obs, _, _, _, info = self.env.step(0)
        self.lives = self.env.unwrapped.ale.lives()
        return obs, info


def _reference_chain(env_id: str, *, life_loss: bool) -> gymnasium.Env:
    env = gymnasium.make(env_id, frameskip=1, repeat_action_probability=0.25)
    env = gymnasium.wrappers.AtariPreprocessing(
        env, noop_max=30, frame_skip=4, screen_size=84, terminal_on_life_loss=False
    )
    if life_loss:
        env = _ReferenceEpisodicLife(env)
    env = _ReferenceFireReset(env)
    return gymnasium.wrappers.FrameStackObservation(env, 4)


@pytest.mark.parametrize("evaluation", [False, True])
def test_atari_env_equals_a_hand_assembled_gymnasium_chain(evaluation):
    _needs("ale_py")
    env_id, seed, steps = "ALE/Breakout-v5", 3, 200
    env = make_env(env_id, num_envs=1, seed=seed, evaluation=evaluation)
    ref = _reference_chain(env_id, life_loss=not evaluation)
    actions = np.random.default_rng(0).integers(0, 4, size=steps)
    ref.reset(seed=seed)  # make_env seeds with one reset; TorchRL's env.reset() is a second
    ref_obs, _ = ref.reset()
    td = env.reset()
    assert td["observation"].dtype == torch.uint8
    np.testing.assert_array_equal(td["observation"][0].numpy(), ref_obs)
    ref_return, ends, rewarded, lives_after = 0.0, 0, 0, []
    for a in actions:
        td["action"] = torch.tensor([int(a)])
        td, td_next = env.step_and_maybe_reset(td)
        obs, reward, terminated, truncated, _ = ref.step(int(a))
        ref_return += reward
        nxt = td["next"]
        np.testing.assert_array_equal(nxt["observation"][0].numpy(), obs)
        expected = reward if evaluation else float(np.sign(reward))
        assert float(nxt["reward"]) == expected
        assert float(nxt["episode_reward"]) == ref_return  # raw score, never clipped
        assert bool(nxt["terminated"]) == terminated and bool(nxt["truncated"]) == truncated
        rewarded += reward != 0
        if terminated or truncated:
            ends += 1
            ref_obs, _ = ref.reset()
            ref_return = 0.0
            np.testing.assert_array_equal(td_next["observation"][0].numpy(), ref_obs)
            lives_after.append(ref.unwrapped.ale.lives())
        td = td_next
    assert rewarded > 0
    if not evaluation:
        # life losses end training episodes within 200 steps, and the game plays on (a new
        # game would have all 5 lives again): the same frames as the reference's
        assert ends > 0 and all(lives < 5 for lives in lives_after), lives_after
    env.close()
    ref.close()


def _rollout(env, actions) -> list[torch.Tensor]:
    td = env.reset()
    frames = []
    for a in actions:
        td["action"] = torch.tensor([int(a)])
        td, td_next = env.step_and_maybe_reset(td)
        frames.append(td["next", "observation"][0, -1].clone())
        td = td_next
    return frames


def test_a_reseeded_atari_training_env_plays_the_game_its_seed_gives():
    """A resumed run reseeds its envs (rlkit.envs.reseed): a training env in the middle of a
    game must start the new seed's game, not play on in the old one (EpisodicLife plays on
    after a lost life only)."""
    _needs("ale_py")
    from rlkit.envs import reseed

    actions = np.random.default_rng(1).integers(0, 4, size=60)
    used = make_env("ALE/Breakout-v5", num_envs=1, seed=0)
    _rollout(used, actions[:30])  # mid-game
    reseed(used, 5000)
    fresh = make_env("ALE/Breakout-v5", num_envs=1, seed=5000)
    other = make_env("ALE/Breakout-v5", num_envs=1, seed=0)
    got, want, old = (_rollout(e, actions) for e in (used, fresh, other))
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(got, old, strict=True))
    for e in (used, fresh, other):
        e.close()


def test_atari_protocol_settings():
    _needs("ale_py")
    env = make_env("ALE/Pong-v5", num_envs=1, seed=0)
    inner = env.base_env._env.envs[0]
    chain = []
    while isinstance(inner, gymnasium.Wrapper):
        chain.append(inner)
        inner = inner.env
    pre = next(w for w in chain if isinstance(w, gymnasium.wrappers.AtariPreprocessing))
    # a life loss ends a training episode through EpisodicLife, which plays on in the game;
    # AtariPreprocessing's own flag would start a new game at the next reset
    assert (pre.noop_max, pre.frame_skip, pre.screen_size, pre.terminal_on_life_loss) == (
        30,
        4,
        (84, 84),
        False,
    )
    assert any(isinstance(w, EpisodicLife) for w in chain)
    assert inner.unwrapped._frameskip == 1
    assert inner.unwrapped.ale.getFloat("repeat_action_probability") == pytest.approx(0.25)
    env.close()


# 3. uint8 end to end -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("env_id", "module", "obs_shape"),
    [("ALE/Pong-v5", "ale_py", (4, 84, 84)), ("MinAtar/Breakout-v1", "minatar", (10, 10, 4))],
)
def test_collector_batches_keep_uint8_frames(env_id, module, obs_shape):
    _needs(module)
    from rlkit.data.collector import make_collector
    from rlkit.modules import actor_critic_networks

    env = make_env(env_id, num_envs=2, seed=0)
    assert env.observation_spec["observation"].dtype == torch.uint8
    encoder = "nature" if module == "ale_py" else "minatar"
    actor, _, _ = actor_critic_networks(env, encoder=encoder, hidden=())
    collector = make_collector(env, actor, frames_per_batch=32)
    batch = next(iter(collector))
    collector.shutdown()
    for key in ("observation", ("next", "observation")):
        assert batch[key].dtype == torch.uint8
        assert tuple(batch[key].shape) == (2, 16, *obs_shape)
    if module == "minatar":  # boolean planes as {0, 255}: the encoders' /255 gives {0, 1}
        assert set(batch["observation"].unique().tolist()) <= {0, 255}


def test_fast_collector_equals_torchrl_collector_on_atari():
    """Sign-clipped rewards, life-loss episodes and fire resets: VectorEnvCollector's
    batches equal TorchRL's Collector's, key for key."""
    _needs("ale_py")
    from torchrl.collectors import Collector

    from rlkit.data.collector import VectorEnvCollector, make_collector
    from rlkit.modules import actor_critic_networks

    def batches(cls):
        env = make_env("ALE/Breakout-v5", num_envs=2, seed=1)
        torch.manual_seed(0)
        actor, _, _ = actor_critic_networks(env, encoder="nature", hidden=())
        kw = {"auto_register_policy_transforms": False} if cls is Collector else {}
        torch.manual_seed(1)
        collector = cls(env, actor, frames_per_batch=128, total_frames=-1, **kw)
        it = iter(collector)
        out = [next(it) for _ in range(3)]
        collector.shutdown()
        return out, env, actor

    ours, env, actor = batches(VectorEnvCollector)
    ref, _, _ = batches(Collector)
    assert isinstance(make_collector(env, actor, frames_per_batch=256), VectorEnvCollector)
    done = torch.cat([b["next", "done"] for b in ref])
    assert done.any()  # life losses inside the data
    for a, b in zip(ours, ref):
        for key in b.keys(True, True):
            assert a.get(key).dtype == b.get(key).dtype, key
            assert torch.equal(a.get(key), b.get(key)), key


# 4. learning and end to end ------------------------------------------------------------------
def random_breakout_return(episodes: int = 200, seed: int = 0) -> float:
    """Mean return of uniform random play on MinAtar/Breakout-v1 (about 0.3 here)."""
    from rlkit.envs.suites import register_suite

    register_suite("MinAtar/Breakout-v1")
    env = gymnasium.make("MinAtar/Breakout-v1")
    rng = np.random.default_rng(seed)
    env.reset(seed=seed)
    total = 0.0
    for _ in range(episodes):
        env.reset()
        done = False
        while not done:
            _, reward, terminated, truncated, _ = env.step(int(rng.integers(env.action_space.n)))
            total += reward
            done = terminated or truncated
    env.close()
    return total / episodes


def learn_breakout(seed: int, run_dir) -> float:
    """PPO on MinAtar/Breakout-v1 with a budget that trains in about 35 s on 2 CPU cores: the
    suite preset's network and update, 8 envs x 128 steps, 50k frames; final evaluation mean
    over 10 episodes."""
    summary = algorithms.load("ppo").main(
        [
            "--env",
            "MinAtar/Breakout-v1",
            "--seed",
            str(seed),
            "--num-envs",
            "8",
            "--minibatch-size",
            "256",
            "--total-frames",
            "50000",
            "--eval-every",
            "0",
            "--eval-episodes",
            "10",
            "--progress",
            "false",
            "--run-dir",
            str(run_dir),
        ]
    )
    return summary["eval_return_mean"]


@pytest.mark.slow
def test_ppo_learns_minatar_breakout(tmp_path):
    _needs("minatar")
    random_mean = random_breakout_return()
    assert 0.1 < random_mean < 0.6  # the "about 0.3"
    final = learn_breakout(0, tmp_path)
    assert final >= max(3 * random_mean, 2.0), (final, random_mean)


@pytest.mark.slow
def test_ppo_runs_pong_end_to_end_with_raw_scores(tmp_path):
    """ALE/Pong-v5, every wrapper on, 2,048 frames on one env: whole Pong games end in the
    training log with raw scores (-21..21) and the evaluation is written. One epoch per
    batch: what is checked is the env's wrappers and the log, not the update."""
    _needs("ale_py")
    summary = algorithms.load("ppo").main(
        [
            "--env",
            "ALE/Pong-v5",
            "--num-envs",
            "1",
            "--minibatch-size",
            "32",
            "--epochs",
            "1",
            "--total-frames",
            "2048",
            "--eval-every",
            "0",
            "--eval-episodes",
            "1",
            "--eval-max-steps",
            "100",
            "--progress",
            "false",
            "--run-dir",
            str(tmp_path),
        ]
    )
    assert summary["frames"] == 2048
    import csv

    with (tmp_path / "metrics.csv").open() as f:
        returns = [float(r["episode_return"]) for r in csv.DictReader(f) if r["episode_return"]]
    assert returns, "no Pong game ended in 2,048 frames"
    assert all(-21 <= r <= 21 and r == int(r) for r in returns)
    assert (tmp_path / "eval.csv").read_text().count("\n") == 2


def test_a_minatar_episode_is_a_function_of_its_reset_seed_and_actions():
    """minatar's reset keeps the last action, which its sticky actions (0.1) may repeat on
    the next episode's first step; rlkit's suite wrappers start every episode fresh."""
    from rlkit.envs.suites import register_suite, suite_wrappers

    register_suite("MinAtar/SpaceInvaders-v1")

    def replays_that_differ(wrappers) -> int:
        env = gymnasium.make("MinAtar/SpaceInvaders-v1")
        for wrap in wrappers:
            env = wrap(env)
        differ = 0
        for seed in range(40):
            episodes = []
            for leave in (0, 2):  # the previous episode's last action: no-op, then right
                env.reset(seed=1000 + seed)
                env.step(leave)
                obs, _ = env.reset(seed=seed)
                frames = [obs.copy()]
                for action in (0, 0, 1, 0):
                    obs, *_ = env.step(action)
                    frames.append(obs.copy())
                episodes.append(np.stack(frames))
            differ += not np.array_equal(*episodes)
        return differ

    assert replays_that_differ([]) > 0  # minatar's own env: the first step may stick
    assert replays_that_differ(suite_wrappers("MinAtar/SpaceInvaders-v1", training=True)) == 0
