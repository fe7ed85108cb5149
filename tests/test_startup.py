"""Start-up: a recipe parses its flags, and answers ``--help``, without importing torch.

The configs (:mod:`rlkit.configs`), config parsing and the command line
(:mod:`rlkit.training.cli`) are torch-free; torch, TensorDict, TorchRL and Lightning are
imported only once a parsed config is trained. Each check runs in a fresh interpreter and
reads its ``sys.modules`` (``benchmarks/bench_startup.py`` measures the time this saves).
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rlkit import algorithms

ROOT = Path(__file__).resolve().parents[1]

#: what ``--help`` must not import (each takes from 0.1 s to over a second)
HEAVY = ("torch", "tensordict", "torchrl", "lightning")

#: configs whose validation imports torch: the V-trace checks live in rlkit.objectives.impala
VALIDATION_IMPORTS_TORCH = {"impala", "appo"}


def _fresh(script: str) -> dict:
    """Run ``script`` in a new interpreter (repository root as the working directory); it
    prints one JSON line last, returned here."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_config_modules_and_the_command_line_import_no_torch():
    names = list(algorithms.NAMES)
    loaded = _fresh(
        f"""
        import importlib, json, sys

        import rlkit.training
        import rlkit.training.cli
        import rlkit.configs.base
        from rlkit import algorithms
        from rlkit.training import CheckpointError, NonFiniteError, TrainConfig, cli, parse_config

        for name in {names!r}:
            module = importlib.import_module("rlkit.configs." + name)
            assert module.CONFIG is algorithms.config_class(name)
            assert isinstance(module.PRESETS, dict) and "Algorithm box:" in module.__doc__
            if name not in {sorted(VALIDATION_IMPORTS_TORCH)!r}:
                module.CONFIG()  # the defaults, validated
        print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))
        """
    )
    assert loaded == []


def test_every_recipe_answers_help_and_bad_flags_without_torch():
    """``python recipes/<name>.py --help`` (and a refused flag) as the shell runs it: the
    recipe script under ``runpy`` as ``__main__``; the heavy modules checked after each."""
    recipes = sorted(p.stem for p in (ROOT / "recipes").glob("*.py"))
    assert recipes == sorted(algorithms.NAMES)
    results = _fresh(
        f"""
        import contextlib, io, json, runpy, sys

        HEAVY = {HEAVY!r}
        out = {{}}
        for name in {recipes!r}:
            for argv in (["--help"], ["--lr", "-1"], ["--no-such-flag"]):
                sys.argv = ["recipes/" + name + ".py", *argv]
                stdout, stderr = io.StringIO(), io.StringIO()
                code = None
                with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                    try:
                        runpy.run_path(sys.argv[0], run_name="__main__")
                    except SystemExit as stop:
                        code = stop.code
                out[name + " " + argv[0]] = {{
                    "code": code,
                    "stdout": stdout.getvalue(),
                    "stderr": stderr.getvalue(),
                    "heavy": [m for m in HEAVY if m in sys.modules],
                }}
        print(json.dumps(out))
        """
    )
    for key, result in results.items():
        assert result["heavy"] == [], f"{key} imported {result['heavy']}"
        if key.endswith("--help"):
            assert result["code"] == 0, key
            assert "Algorithm box:" in result["stdout"] and "--total-frames" in result["stdout"]
        else:
            assert result["code"] == 2, key
            lines = result["stderr"].splitlines()
            assert len(lines) == 1 and lines[0].startswith("error: "), result["stderr"]


def test_the_command_line_api_keeps_its_names():
    """``rlkit.training.cli`` stays the function even once the module of the same name is
    imported; the error classes are one class each, wherever they are imported from."""
    import rlkit.training
    from rlkit.training import checkpoint, engine, errors

    module = importlib.import_module("rlkit.training.cli")
    assert rlkit.training.cli is module.cli
    assert callable(rlkit.training.cli)
    assert rlkit.training.run is engine.run and rlkit.training.Engine is engine.Engine
    assert checkpoint.CheckpointError is errors.CheckpointError is rlkit.training.CheckpointError
    assert engine.NonFiniteError is errors.NonFiniteError is rlkit.training.NonFiniteError
    assert engine.CheckpointWriteError is errors.CheckpointWriteError
    with pytest.raises(AttributeError):
        _ = rlkit.training.no_such_name


def test_flag_choices_are_the_modules_own():
    """Choices declared with the flags (torch-free) and used by the torch modules agree. Each
    layer keeps its own list (the modules and losses below the config layer never import it,
    tests/test_layout.py), so this is what keeps the two from drifting."""
    from rlkit.configs import daac, encoders, offpolicy, ppg
    from rlkit.modules import networks, ppg_networks
    from rlkit.objectives import daac as daac_loss
    from rlkit.objectives import dqn as dqn_loss

    assert ppg_networks.ARCHS == ppg.ARCHS and ppg_networks.INIT_FNS == ppg.INIT_FNS
    assert tuple(ppg_networks.ENCODERS) == encoders.ENCODERS
    assert tuple(networks.ENCODERS) == encoders.ENCODERS
    assert daac_loss.ADVANTAGE_NORMS == daac.ADVANTAGE_NORMS
    assert daac_loss.ADVANTAGE_TARGETS == daac.ADVANTAGE_TARGETS
    assert dqn_loss.PRIORITY_WEIGHT_NORMS == offpolicy.PRIORITY_WEIGHT_NORMS
    # a population member's collector workers are seeded as its standalone run's
    from rlkit.configs import impala
    from rlkit.data import async_collect

    for seed, worker in [(0, 0), (0, 3), (7, 1), (123, 5)]:
        assert impala.worker_seed(seed, worker) == async_collect.worker_seed(seed, worker)


@pytest.mark.parametrize("name", algorithms.NAMES)
def test_the_algorithm_module_reexports_its_config(name):
    config = importlib.import_module(f"rlkit.configs.{name}")
    module = algorithms.load(name)
    cls = config.CONFIG
    assert getattr(module, cls.__name__) is cls
    assert module.PRESETS is config.PRESETS
