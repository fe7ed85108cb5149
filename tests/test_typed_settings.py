"""Nothing typed is ignored: a setting given as a flag or in a ``--config`` file that changes
the config and that nothing in the run reads (the build, the recipe, the engine, the first
update) is refused in one line before the run directory is written.

References are hand-written: the settings each test types, the value it prints, and, for
every recipe, the settings its default run leaves unread (each one a setting that applies only
together with another, checked to be read once that other one is set)."""

from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect
import pickle
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from rlkit.algorithms import NAMES
from rlkit.configs import base as config_module
from rlkit.configs import ppo as ppo_config
from rlkit.configs.base import to_dict, track_reads, typed_settings
from rlkit.configs.ppo import PPOConfig
from rlkit.training import engine, parse_config

ROOT = Path(__file__).resolve().parents[1]
#: one small batch (2 envs x 16 steps), one epoch, one evaluation episode
SMALL = ["--num-envs", "2", "--rollout-steps", "16", "--minibatch-size", "32", "--epochs", "1"]
SMALL += ["--total-frames", "64", "--eval-episodes", "1", "--progress", "false"]


@pytest.fixture(autouse=True)
def _no_reads_before():
    """Reads recorded by earlier tests of this process (a config made starts recording
    until an engine's first update ends it) would count here."""
    config_module.stop_tracking()
    yield
    config_module.stop_tracking()


def _parse(argv, presets=None):
    return parse_config(PPOConfig, argv, presets=presets)


# --------------------------------------------------------------------------- what is typed


def test_typed_settings_are_those_typed_that_change_the_config(tmp_path):
    # Pendulum's preset sets gamma 0.9 and total_frames 300k: a preset is not typed, and
    # typing the preset's own value (gamma 0.9) or the default (epochs 20: PPO's) changes
    # nothing
    cfg = _parse(
        ["--env", "Pendulum-v1", "--value-lr", "5e-4", "--gamma", "0.9", "--epochs", "10"],
        presets=ppo_config.PRESETS,
    )
    assert cfg.epochs == 10 and cfg.total_frames == 300_000
    assert set(typed_settings(cfg)) == {"env", "value_lr"}  # Pendulum's preset: epochs 10
    cfg = _parse(["--epochs", "20", "--lr", "1e-3", "--value-lr", "none"])
    assert typed_settings(cfg) == []
    # a --config file's keys are typed alike; the flags after it win
    file = tmp_path / "flags.yaml"
    file.write_text(yaml.safe_dump({"value_lr": 5e-4, "epochs": 20, "seed": 3}))
    cfg = _parse(["--config", str(file), "--seed", "0"])
    assert set(typed_settings(cfg)) == {"config", "value_lr"}


def test_a_config_made_in_python_has_typed_what_differs_from_the_defaults():
    assert typed_settings(PPOConfig(value_lr=5e-4, epochs=20, seed=0)) == ["value_lr"]
    assert typed_settings(PPOConfig()) == []


def test_reads_are_recorded_and_copies_comparisons_and_validation_are_not():
    cfg, other = PPOConfig(), PPOConfig(seed=1)
    with track_reads() as reads:
        PPOConfig(lr=3e-4)  # its validation reads every setting it checks
        _ = cfg.lr
        getattr(cfg, "gamma", None)
        to_dict(cfg)
        dataclasses.replace(cfg, seed=2)
        dataclasses.asdict(cfg)
        assert cfg != other and hash(cfg) != hash(other)
        repr(cfg)
        pickle.loads(pickle.dumps(cfg))
        copy.deepcopy(cfg)
    fields = {f.name for f in dataclasses.fields(PPOConfig)}
    assert reads & fields == {"lr", "gamma"}


def test_the_typed_record_survives_pickling_for_spawned_ranks():
    cfg = _parse(["--value-lr", "5e-4"])
    assert typed_settings(pickle.loads(pickle.dumps(cfg))) == ["value_lr"]


# --------------------------------------------------------------------------- the engine


def _tutorial_build(cfg, env):
    """The tutorial's former pattern: PPO's networks, a learner built directly, no value
    optimiser of its own (so ``--value-lr`` reaches nothing)."""
    from rlkit.algorithms.onpolicy import (
        PolicyGradientLearner,
        build_actor_critic,
        policy_gradient_settings,
        policy_optimizer,
    )
    from rlkit.objectives import PPOLoss
    from rlkit.value import GAE

    actor, critic, obs_norm = build_actor_critic(cfg, env)
    estimator = GAE(gamma=cfg.gamma, lmbda=cfg.gae_lambda, value_network=critic)
    loss = PPOLoss(actor, critic, clip_epsilon=cfg.clip_epsilon, value_coef=cfg.value_coef)
    return PolicyGradientLearner(
        algo="ppo-custom",
        actor=actor,
        critic=critic,
        estimator=estimator,
        loss=loss,
        optimizer=policy_optimizer(cfg, actor, critic, obs_norm),
        obs_norm=obs_norm,
        **policy_gradient_settings(cfg),
    )


REFUSAL = "--value-lr 0.0005 was set but nothing in this run reads it (the build given to run(), "
NEVER_READ = "_tutorial_build, and the first update never read cfg.value_lr"


def _refused(cfg, run_dir: Path) -> str:
    with pytest.raises(ValueError) as info:
        engine.run(cfg, _tutorial_build, algo="ppo-custom")
    message = str(info.value)
    assert "\n" not in message
    assert not run_dir.exists(), "the run directory was written before the refusal"
    return message


def test_a_custom_build_that_ignores_a_flag_is_refused_before_the_run_directory(tmp_path):
    run_dir = tmp_path / "run"
    cfg = _parse([*SMALL, "--value-lr", "5e-4", "--run-dir", str(run_dir)])
    message = _refused(cfg, run_dir)
    assert message.startswith(REFUSAL) and NEVER_READ in message, message
    assert message.endswith("drop it, or read it in your build")


def test_a_config_made_in_python_is_checked_alike(tmp_path):
    run_dir = tmp_path / "run"
    cfg = PPOConfig(
        num_envs=2,
        rollout_steps=16,
        minibatch_size=32,
        epochs=1,
        total_frames=64,
        progress=False,
        value_lr=5e-4,
        entropy_coef=0.05,
        run_dir=str(run_dir),
    )
    message = _refused(cfg, run_dir)
    # the first in field order, then the others
    assert message.startswith("--entropy-coef 0.05 was set but nothing"), message
    assert message.endswith("; also unread: --value-lr"), message


def test_a_config_file_key_is_refused_alike(tmp_path):
    run_dir = tmp_path / "run"
    file = tmp_path / "flags.yaml"
    file.write_text("value_lr: 0.0005\n")
    cfg = _parse([*SMALL, "--config", str(file), "--run-dir", str(run_dir)])
    message = _refused(cfg, run_dir)
    assert message.startswith(REFUSAL) and NEVER_READ in message, message


def test_a_setting_typed_at_its_default_is_not_refused_and_config_yaml_records_the_run(
    tmp_path,
):
    run_dir = tmp_path / "run"
    argv = [*SMALL, "--value-lr", "none", "--entropy-coef", "0", "--run-dir", str(run_dir)]
    cfg = _parse(argv)
    summary = engine.run(cfg, _tutorial_build, algo="ppo-custom")
    assert summary["frames"] == 64
    assert yaml.safe_load((run_dir / "config.yaml").read_text()) == to_dict(cfg)


def test_a_default_recipe_run_is_not_refused(tmp_path):
    from rlkit.training.cli import parse

    run_dir = tmp_path / "run"
    cfg = parse("ppo", [*SMALL, "--run-dir", str(run_dir), "--value-lr", "5e-4"])
    summary = importlib.import_module("rlkit.algorithms.ppo").train(cfg)
    assert summary["frames"] == 64
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["value_lr"] == 5e-4


def test_a_swept_setting_that_no_member_reads_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    # the tutorial's former build gives its loss no entropy coefficient
    cfg = _parse([*SMALL, "--sweep", "entropy_coef=0.0,0.01", "--run-dir", str(run_dir)])
    message = _refused(cfg, run_dir)
    assert message.startswith("--sweep entropy_coef=0.0,0.01 was set but nothing in this run")
    assert "never read cfg.entropy_coef;" in message, message


def test_a_research_script_exits_2_with_one_line_and_writes_nothing(tmp_path, monkeypatch):
    """The script runs as ``python my_ppo.py FLAGS`` would run it (as ``__main__``, from its
    own directory, through ``cli``'s error handling), in this process: a process of its own
    cost about 16 s of CPU for its imports; tests/test_subprocess.py runs recipes' refusals
    in processes."""
    import contextlib
    import io
    import runpy

    script = tmp_path / "my_ppo.py"
    script.write_text(
        "from rlkit.configs.ppo import PPOConfig\n"
        "from rlkit.training import cli, parse_config, run\n\n\n"
        + inspect.getsource(_tutorial_build)
        + textwrap.dedent(
            """

            def main(argv=None):
                cfg = parse_config(PPOConfig, argv)
                return run(cfg, _tutorial_build, algo="ppo-custom")


            if __name__ == "__main__":
                cli(main)
            """
        )
    )
    run_dir = tmp_path / "run"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(script), *SMALL, "--value-lr", "5e-4",
                                      "--run-dir", str(run_dir)])  # fmt: skip
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(script), run_name="__main__")
    assert exit_.value.code == 2, err.getvalue()[-2000:]
    lines = err.getvalue().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {REFUSAL}__main__.{NEVER_READ}"), lines
    assert not run_dir.exists()


# --------------------------------------------------------------------------- every recipe

#: Settings each recipe's default run leaves unread: each applies only together with
#: another setting (its switch, :data:`SWITCHES`), so typed without it, it is refused.
#: ``lr_gamma`` and ``lr_decay_frames`` typed without their schedule are refused when the
#: flags are parsed already.
_KL = {"kl_target", "kl_factor", "kl_lr_factor", "kl_lr_min", "kl_lr_max"}
_INTRINSIC = {"int_coef", "ext_coef", "pretraining", "intrinsic_lr", "gamma_int"}
_MEMORY = {"recurrent_size", "recurrent_layers", "sequence_length"}
UNREAD_BY_DEFAULT = {
    "a2c": {"lr_final", "lr_gamma", "lr_decay_frames", *_KL, *_INTRINSIC, *_MEMORY},
    "appo": {"lr_gamma", *_KL, *_MEMORY},
    "daac": {"lr_gamma", *_KL, *_INTRINSIC, *_MEMORY},
    "dqn": {"priority_weight_norm", "lr_final", "lr_decay_frames"},
    "impala": {"lr_final", "lr_gamma", "lr_decay_frames", *_KL, *_MEMORY},
    "ppg": {"lr_gamma", *_KL, *_INTRINSIC, *_MEMORY},
    "ppo": {"lr_gamma", *_KL, *_INTRINSIC, *_MEMORY},
    "rnd": {"lr_final", "lr_gamma", "lr_decay_frames", *_KL, *_MEMORY},
    "sac": {"priority_weight_norm", "lr_final", "lr_decay_frames"},
    "svpg": {"clip_epsilon", "lr_final"},
}

#: Settings of a recipe that no switch makes read: the recipe refuses their switch. Typed,
#: the engine refuses them (they were ignored before).
NEVER_APPLY = {
    # A2C refuses --lr-schedule kl (its loss measures no KL), yet declares the KL settings
    "a2c": _KL,
    # PPG and DAAC refuse --recurrent (their networks have no place for it)
    "ppg": _MEMORY,
    "daac": _MEMORY,
}

#: (the switch, the settings it makes read)
SWITCHES = [
    ({"lr_schedule": "kl"}, _KL),
    ({"lr_schedule": "linear"}, {"lr_final"}),
    ({"lr_schedule": "linear", "lr_decay_frames": 50_000}, {"lr_decay_frames"}),
    ({"lr_schedule": "exponential", "lr_gamma": 0.99}, {"lr_gamma"}),
    ({"intrinsic": "rnd"}, _INTRINSIC),
    ({"prioritized": True}, {"priority_weight_norm"}),
    ({"particle": "ppo"}, {"clip_epsilon"}),
    ({"recurrent": "gru"}, _MEMORY),
]


class _Checked(Exception):
    pass


def _reads(name: str, tmp_path: Path, monkeypatch, **settings) -> set[str]:
    """The settings a run of recipe ``name`` reads up to the check (its config's defaults
    and ``settings``), every one of them typed."""
    seen: set[str] = set()

    def capture(self, fabric, reads):
        seen.update(reads)
        raise _Checked

    monkeypatch.setattr(engine.Engine, "_check_typed", capture)
    config = importlib.import_module(f"rlkit.configs.{name}")
    cfg = config.CONFIG(run_dir=str(tmp_path / "run"), progress=False, **settings)
    every = frozenset(f.name for f in dataclasses.fields(cfg))
    object.__setattr__(cfg, config_module._TYPED, every)
    assert typed_settings(cfg) == [f.name for f in dataclasses.fields(cfg)]
    with pytest.raises(_Checked):
        importlib.import_module(f"rlkit.algorithms.{name}").train(cfg)
    assert not (tmp_path / "run").exists()
    return seen


@pytest.mark.parametrize("name", NAMES)
def test_every_setting_of_a_recipe_is_read_or_applies_only_with_another(
    name, tmp_path, monkeypatch
):
    fields = [
        f.name for f in dataclasses.fields(importlib.import_module(f"rlkit.configs.{name}").CONFIG)
    ]
    reads = _reads(name, tmp_path, monkeypatch)
    unread = {n for n in fields if n not in reads}
    assert unread == UNREAD_BY_DEFAULT[name]


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_a_setting_that_applies_with_another_is_read_with_it(name, tmp_path, monkeypatch):
    config = importlib.import_module(f"rlkit.configs.{name}").CONFIG
    fields = {f.name for f in dataclasses.fields(config)}
    left = set(UNREAD_BY_DEFAULT[name]) - NEVER_APPLY.get(name, set())
    for k, (switch, makes_read) in enumerate(SWITCHES):
        if not (makes_read & left) or not set(switch) <= fields:
            continue
        try:
            reads = _reads(name, tmp_path / str(k), monkeypatch, **switch)
        except ValueError:  # the recipe refuses the switch (NEVER_APPLY)
            continue
        assert makes_read & left <= reads, (switch, (makes_read & left) - reads)
        left -= makes_read
    assert not left, f"no switch makes {name} read {sorted(left)}"
