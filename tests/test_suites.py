"""Presets by suite: every task of a suite gets its suite's settings, an unknown id gets the
settings of its kind, and the run's opening line names what applied (rlkit.configs.suites)."""

from __future__ import annotations

import dataclasses
import importlib

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces

from rlkit.configs import suites
from rlkit.configs.base import applied_preset, parse_config

#: the recipes that take continuous actions, and those that take discrete ones only
CONTINUOUS = ("ppo", "a2c", "appo", "impala", "sac", "ppg", "daac", "rnd")
DISCRETE_ONLY = ("dqn",)


def _registered(prefix: str) -> list[str]:
    return sorted(
        env_id
        for env_id, spec in gymnasium.registry.items()
        if isinstance(spec.entry_point, str) and spec.entry_point.startswith(prefix)
    )


MUJOCO_IDS = _registered("gymnasium.envs.mujoco")
BOX2D_IDS = _registered("gymnasium.envs.box2d")


class _Line(gymnasium.Env):
    """A task rlkit knows nothing of: move a point on a line towards 0 (Box actions)."""

    def __init__(self, discrete: bool = False):
        self.observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = spaces.Discrete(3) if discrete else spaces.Box(-1.0, 1.0, (1,))
        self._x = 0.0
        self._t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._x, self._t = float(self.np_random.uniform(-1, 1)), 0
        return np.array([self._x, 0.0], np.float32), {}

    def step(self, action):
        push = float(np.asarray(action).reshape(-1)[0])
        push = push - 1.0 if self.action_space.shape == () else push
        self._x = float(np.clip(self._x + 0.1 * push, -1, 1))
        self._t += 1
        obs = np.array([self._x, self._t / 50], np.float32)
        return obs, -abs(self._x), False, self._t >= 50, {}


gymnasium.register("rlkit-test/Line-v0", entry_point=_Line)
gymnasium.register("rlkit-test/LineDiscrete-v0", entry_point=_Line, kwargs={"discrete": True})


def _config(recipe: str):
    return importlib.import_module(f"rlkit.configs.{recipe}")


def test_mujoco_has_ids_beyond_the_three_an_issue_named():
    v5 = {i for i in MUJOCO_IDS if i.endswith("-v5")}
    assert len(v5) >= 11 and {"Ant-v5", "Humanoid-v5", "Swimmer-v5", "Pusher-v5"} <= v5


@pytest.mark.parametrize("recipe", CONTINUOUS)
def test_every_mujoco_id_resolves_to_the_suite_preset(recipe):
    config = _config(recipe)
    assert "MuJoCo/*" in config.PRESETS
    for env_id in MUJOCO_IDS:
        # the suite needs no env to be made (mujoco may be missing): its kind is known
        assert suites.env_suite(env_id) == "MuJoCo"
        assert suites.preset_key(config.PRESETS, env_id) == "MuJoCo/*", (recipe, env_id)
    cfg = parse_config(config.CONFIG, ["--env", "Swimmer-v5"], presets=config.PRESETS)
    for name, value in config.PRESETS["MuJoCo/*"].items():
        assert getattr(cfg, name) == value, (recipe, name)
    assert applied_preset(cfg) == "preset MuJoCo/*"


def test_continuous_presets_are_not_cartpoles():
    """Each recipe's continuous-control preset changes the settings a continuous task would
    otherwise get from the CartPole defaults (the failure this suite layer exists for)."""
    for recipe in CONTINUOUS:
        config = _config(recipe)
        preset = config.PRESETS["*:continuous"]
        defaults = {f.name: f.default for f in dataclasses.fields(config.CONFIG)}
        changed = {k for k, v in preset.items() if defaults.get(k) != v}
        assert len(changed) >= 3, (recipe, changed)


@pytest.mark.parametrize("env_id", BOX2D_IDS)
def test_every_box2d_id_resolves_to_its_kind(env_id):
    kind = suites.action_kind(env_id)
    assert suites.env_suite(env_id) == "Box2D"
    assert kind in {"continuous", "discrete", "pixels"}
    for recipe in CONTINUOUS + DISCRETE_ONLY:
        key = suites.preset_key(_config(recipe).PRESETS, env_id)
        if kind == "continuous" and recipe in CONTINUOUS:
            assert key in {env_id, "Box2D/*:continuous", "Box2D/*", "*:continuous"}, recipe
        elif key is not None:  # a per-task preset, or the suite's
            assert key in {env_id, f"Box2D/*:{kind}", "Box2D/*", f"*:{kind}"}, (recipe, key)


def test_an_unknown_continuous_id_gets_continuous_control_settings():
    assert suites.env_suite("rlkit-test/Line-v0") is None
    assert suites.action_kind("rlkit-test/Line-v0") == "continuous"
    assert suites.action_kind("rlkit-test/LineDiscrete-v0") == "discrete"
    for recipe in CONTINUOUS:
        config = _config(recipe)
        assert suites.preset_key(config.PRESETS, "rlkit-test/Line-v0") == "*:continuous"
        # an unknown discrete id keeps the recipe's defaults (its discrete-control settings)
        assert suites.preset_key(config.PRESETS, "rlkit-test/LineDiscrete-v0") is None
    ppo = _config("ppo")
    cfg = parse_config(ppo.CONFIG, ["--env", "rlkit-test/Line-v0"], presets=ppo.PRESETS)
    assert (cfg.num_envs, cfg.rollout_steps, cfg.normalize_reward) == (1, 2048, True)
    typed = parse_config(
        ppo.CONFIG, ["--env", "rlkit-test/Line-v0", "--num-envs", "4"], presets=ppo.PRESETS
    )
    assert typed.num_envs == 4 and typed.rollout_steps == 2048  # a flag still wins


def test_the_id_beats_the_suite_and_the_suite_beats_the_kind():
    presets = {
        "Hopper-v5": {"lr": 1.0},
        "MuJoCo/*:continuous": {"lr": 2.0},
        "MuJoCo/*": {"lr": 3.0},
        "*:continuous": {"lr": 4.0},
    }
    assert suites.preset_key(presets, "Hopper-v5") == "Hopper-v5"
    assert suites.preset_key(presets, "Ant-v5") == "MuJoCo/*:continuous"
    del presets["MuJoCo/*:continuous"]
    assert suites.preset_key(presets, "Ant-v5") == "MuJoCo/*"
    assert suites.preset_key(presets, "Pendulum-v1") == "*:continuous"
    assert suites.preset_key(presets, "CartPole-v1") is None
    assert suites.preset_key(presets, "NoSuchTask-v0") is None  # cannot be made: defaults


def test_named_tasks_keep_their_presets():
    """The tasks with measured figures keep the settings they were measured with."""
    assert suites.preset_key(_config("ppo").PRESETS, "Pendulum-v1") == "Pendulum-v1"
    assert suites.preset_key(_config("ppo").PRESETS, "LunarLander-v3") == "LunarLander-v3"
    assert suites.preset_key(_config("appo").PRESETS, "Pendulum-v1") == "Pendulum-v1"
    mcc = suites.preset_key(_config("impala").PRESETS, "MountainCarContinuous-v0")
    assert mcc == "MountainCarContinuous-v0"
    for recipe in ("sac", "a2c", "ppg", "rnd"):  # measured / documented with their defaults
        assert _config(recipe).PRESETS["Pendulum-v1"] == {}
    assert suites.preset_key(_config("ppo").PRESETS, "CartPole-v1") is None


def test_the_opening_line_names_the_preset(tmp_path, capsys):
    from rlkit.algorithms import ppo

    argv = [
        "--env", "rlkit-test/Line-v0", "--rollout-steps", "64", "--minibatch-size", "32",
        "--epochs", "1", "--total-frames", "64", "--eval-episodes", "1", "--eval-max-steps",
        "10", "--progress", "false", "--run-dir", str(tmp_path / "run"),
    ]  # fmt: skip
    ppo.main(argv)
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith("ppo on rlkit-test/Line-v0 (preset *:continuous): "), first
    cartpole = parse_config(_config("ppo").CONFIG, [], presets=_config("ppo").PRESETS)
    assert applied_preset(cartpole) == "defaults"


def test_a_suite_whose_package_is_missing_is_one_line_naming_the_extra():
    try:
        import mujoco  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("mujoco is installed here")
    from rlkit.envs import make_env

    with pytest.raises(
        ValueError, match=r'Swimmer-v5 needs a package .*pip install -e "\.\[mujoco\]"'
    ):
        make_env("Swimmer-v5")
