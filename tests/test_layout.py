"""The layout is an API: what a recipe defines is importable from anywhere."""

from __future__ import annotations

import importlib
import json
import sys
import textwrap

import pytest

from rlkit import algorithms


def test_a_research_script_in_its_own_directory_imports_a_recipe(tmp_path, monkeypatch, capsys):
    """docs/tutorial.md used importlib.util.spec_from_file_location on recipes/ppo.py. The
    script runs as ``python my_study.py RUN_DIR`` would (as ``__main__``, from its own
    directory, with recipes/ nowhere on its path), in this process: a process of its own cost
    about 16 s of CPU for its imports."""
    import runpy

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
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(script), str(tmp_path / "run")])
    monkeypatch.setattr(sys, "path", [p for p in sys.path if not p.endswith("recipes")])
    runpy.run_path(str(script), run_name="__main__")
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
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
        "engine",
        "errors",
        "evaluation",
        "learner",
        "optim",
        "population",
        "runlog",
        "schedules",
        "search",
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


# ----------------------------------------------------------------------------- the layers
#: the kit's parts, by path under the repository root (docs: ARCHITECTURE in docs/index.md)
PARTS = {
    "recipes/": "Recipes",
    "rlkit/algorithms/": "Algorithms",
    "rlkit/configs/": "Configs",
    "rlkit/training/": "Engine",
    "rlkit/data/": "Data",
    "rlkit/objectives/": "Objectives",
    "rlkit/value/": "Value",
    "rlkit/modules/": "Modules",
    "rlkit/envs/": "Envs",
    "rlkit/keys.py": "Keys",
}
#: imports that must never be, with the rule each breaks
NEVER = {
    ("Engine", "Algorithms"): "the engine holds no algorithm",
    ("Data", "Engine"): "collectors know no engine or run mode",
    ("Data", "Configs"): "collectors take arguments, not configs",
    ("Objectives", "Configs"): "losses take arguments",
    ("Modules", "Configs"): "builders take plain arguments",
    ("Modules", "Objectives"): "networks below losses",
    ("Value", "Objectives"): "estimators below losses",
    ("Configs", "Algorithms"): "the config layer is torch-free and below the algorithms",
}
#: one config layer: defaults, validation and parsing in rlkit/configs, which the engine reads
#: and which reads nothing that runs (a checkpoint's settings come from the engine's reader)
for _high in ("Engine", "Data", "Objectives", "Value", "Modules"):
    NEVER.setdefault(("Configs", _high), "one config layer: it reads nothing that trains")
#: the parts below the algorithms: none of them imports an algorithm or a recipe
BELOW_ALGORITHMS = ("Configs", "Engine", "Data", "Objectives", "Value", "Modules", "Envs", "Keys")
for _part in BELOW_ALGORITHMS:
    NEVER.setdefault((_part, "Algorithms"), "the algorithms are above every other part")
    NEVER.setdefault((_part, "Recipes"), "recipes are scripts at the top")
for _low in ("Value", "Modules", "Envs", "Keys"):
    for _high in ("Objectives", "Data", "Engine"):
        NEVER.setdefault((_low, _high), "networks, estimators and envs are the ground floor")


def _part_of(path: str) -> str | None:
    return next((part for prefix, part in PARTS.items() if path.startswith(prefix)), None)


def _module_path(module: str, root) -> str | None:
    """The repository path of module ``rlkit.x.y`` (a package's ``__init__.py``)."""
    rel = module.replace(".", "/")
    for candidate in (f"{rel}.py", f"{rel}/__init__.py"):
        if (root / candidate).is_file():
            return candidate
    return None


def imports_of(path, root) -> list[tuple[int, str]]:
    """Every module of the kit that ``path`` imports (at the top, inside functions, or by name
    through ``importlib.import_module`` with a literal or f-string prefix), with its line."""
    import ast

    tree = ast.parse(path.read_text())
    package = path.relative_to(root).with_suffix("").as_posix().split("/")[:-1]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + [base]).strip(".")
            found += [(node.lineno, base)]
            found += [(node.lineno, f"{base}.{a.name}") for a in node.names]
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
            and node.args
        ):
            arg = node.args[0]
            if isinstance(arg, ast.JoinedStr) and arg.values:
                arg = arg.values[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.append((node.lineno, arg.value.rstrip(".")))
    return [(line, name) for line, name in found if name.split(".")[0] == "rlkit"]


def layer_violations(root) -> list[str]:
    out = []
    for path in sorted([*root.glob("rlkit/**/*.py"), *root.glob("recipes/*.py")]):
        rel = path.relative_to(root).as_posix()
        source = _part_of(rel)
        for line, module in imports_of(path, root):
            target_path = _module_path(module, root)
            target = _part_of(target_path) if target_path else None
            rule = NEVER.get((source, target))
            if rule:
                out.append(f"{rel}:{line} imports {module} ({source} -> {target}: {rule})")
    return sorted(set(out))


def test_no_import_runs_against_the_layers():
    """The real import graph (every import statement, top level or inside a function, and
    importlib by name) against the layering: a lower part never imports a higher one."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    assert layer_violations(root) == []


def test_the_layer_check_sees_an_import_inside_a_function(tmp_path):
    """The check itself: a deferred import from a network module into a loss is caught."""
    fake = tmp_path / "rlkit" / "modules"
    fake.mkdir(parents=True)
    (tmp_path / "rlkit" / "objectives").mkdir()
    (tmp_path / "rlkit" / "objectives" / "sac.py").write_text("")
    (tmp_path / "rlkit" / "algorithms").mkdir()
    (tmp_path / "rlkit" / "algorithms" / "__init__.py").write_text("")
    (fake / "bad.py").write_text(
        "def f():\n    from rlkit.objectives.sac import x\n"
        "import importlib\nimportlib.import_module(f'rlkit.algorithms.{1}')\n"
    )
    found = layer_violations(tmp_path)
    assert any("bad.py:2" in v and "Modules -> Objectives" in v for v in found), found
    assert any("bad.py:4" in v and "Modules -> Algorithms" in v for v in found), found
