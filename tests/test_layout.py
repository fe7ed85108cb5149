"""The layout is an API: what a recipe defines is importable from anywhere."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap

import pytest

from rlkit import algorithms


def test_a_research_script_in_its_own_directory_imports_a_recipe(tmp_path):
    """docs/tutorial.md used importlib.util.spec_from_file_location on recipes/ppo.py."""
    script = tmp_path / "my_study.py"
    script.write_text(
        textwrap.dedent(
            """
            import json, sys
            from rlkit.algorithms import ppo

            cfg = ppo.PPOConfig(total_frames=512)
            assert ppo.PRESETS["Pendulum-v1"]["gamma"] == 0.9
            summary = ppo.main(["--total-frames", "512", "--eval-episodes", "1",
                                "--progress", "false", "--run-dir", sys.argv[1]])
            print(json.dumps({"frames": summary["frames"], "lr": cfg.lr}))
            """
        )
    )
    out = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "run")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"frames": 512, "lr": 1e-3}


def test_unknown_algorithm_names_the_known_ones():
    with pytest.raises(ValueError, match="ppo"):
        algorithms.load("ppo3")


def test_the_engine_layer_holds_no_algorithm():
    """Each algorithm is found in rlkit/algorithms/<name>.py plus its recipe, not in training/."""
    from pathlib import Path

    import rlkit

    root = Path(rlkit.__file__).parent
    engine = {p.stem for p in (root / "training").glob("*.py")}
    assert engine == {
        "__init__",
        "checkpoint",
        "cli",
        "config",
        "engine",
        "errors",
        "evaluation",
        "learner",
        "population",
        "runlog",
        "schedules",
        "signals",
        "stats",
        "update",
    }
    for name in algorithms.NAMES:
        module = algorithms.load(name)
        assert callable(module.main) and callable(module.build) and isinstance(module.PRESETS, dict)
        assert callable(module.train)
        # the config, presets and --help text: torch-free, in rlkit/configs/<name>.py
        config = importlib.import_module(f"rlkit.configs.{name}")
        assert module.PRESETS is config.PRESETS
        assert algorithms.config_class(name) is config.CONFIG
        assert "Algorithm box:" in config.__doc__
        recipe = (root.parent / "recipes" / f"{name}.py").read_text()
        assert f'recipe("{name}")' in recipe
        assert len(recipe.splitlines()) < 20  # a thin script
