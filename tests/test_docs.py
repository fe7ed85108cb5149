"""Executed documentation: README and docs code blocks run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


def test_readme_example_runs(capsys):
    (block,) = python_blocks(ROOT / "README.md")
    exec(compile(block, "README.md", "exec"), {})
    printed = capsys.readouterr().out
    assert "tensor(" in printed


def test_tutorial_swaps_a_custom_loss_into_the_ppo_recipe(monkeypatch):
    monkeypatch.chdir(ROOT)
    namespace: dict = {"TUTORIAL_FRAMES": "512"}
    for i, block in enumerate(python_blocks(ROOT / "docs" / "tutorial.md")):
        exec(compile(block, f"docs/tutorial.md[{i}]", "exec"), namespace)
    summary = namespace["summary"]
    assert summary["algo"] == "ppo"
    assert summary["frames"] == 512
    header = (Path(summary["run_dir"]) / "metrics.csv").read_text().splitlines()[0]
    assert "approx_kl" in header and "loss_policy" in header
    assert "clip_fraction" not in header  # the variant's own diagnostics
    # the page's build: the recipe's learner around the page's loss, with the flags parsed
    from rlkit.envs import make_env

    cfg = namespace["cfg"]
    learner = namespace["build"](cfg, make_env(cfg.env, num_envs=cfg.num_envs, seed=0))
    assert type(learner.loss) is namespace["KLPenaltyPPOLoss"]
    assert learner.loss.beta == 1.0 and learner.loss.normalize_advantage is True


def recipe_help(recipe: str) -> str:
    """``recipes/<recipe>.py --help`` as the recipe prints it (its own ``main``, in-process)."""
    import contextlib
    import io

    from tests.test_engine import load_recipe

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_info:
        load_recipe(recipe).main(["--help"])
    assert exit_info.value.code == 0
    return out.getvalue()


RECIPES = sorted(p.stem for p in (ROOT / "recipes").glob("*.py"))


@pytest.mark.parametrize(
    "page",
    [
        "training.md",
        "recipes/ppo.md",
        "recipes/a2c.md",
        "recipes/ppg.md",
        "recipes/impala.md",
        "recipes/appo.md",
        "recipes/dqn.md",
        "recipes/sac.md",
        "recipes/daac.md",
        "recipes/svpg.md",
        "recipes/rnd.md",
        "intrinsic.md",
        "pixels.md",
    ],
)
def test_recipe_pages_name_only_real_flags(page):
    """Every --flag a page mentions exists in the recipe it documents; the training engine
    page, which all recipes share, may name a flag of any recipe."""
    text = (ROOT / "docs" / page).read_text()
    recipes = [Path(page).stem] if page.startswith("recipes/") else RECIPES
    helptext = "\n".join(recipe_help(recipe) for recipe in recipes)
    ignore = {
        "--nnodes",
        "--nproc-per-node",
        "--rdzv-backend",
        "--rdzv-endpoint",
        "--nodes",
        "--ntasks-per-node",
        "--gpus-per-node",
        # flags of benchmarks/bench_learning.py and bench_vs_sb3.py, quoted in the results
        "--algo",
        "--phases",
        "--jobs",
        "--required",
        "--seeds",
        "--full-budget",
        "--out",
        "--sb3-python",
        "--sb3-from",
        "--anchor",
        "--from-runs",
        "--note",
        "--pretrain-frames",  # bench_pretraining.py
        "--repeats",  # bench_async.py
        "--batches",
    }
    for flag in set(re.findall(r"(--[a-z][a-z0-9-]+)", text)) - ignore:
        assert flag in helptext, f"{page} mentions {flag}, which no recipe of {recipes} has"


def test_update_loop_page_optimises_a_subclass_term(capsys):
    loop, recipe = python_blocks(ROOT / "docs" / "update.md")
    exec(compile(loop, "docs/update.md[0]", "exec"), {})
    printed = capsys.readouterr().out
    assert printed.startswith("1.818 ")  # 2 / 1.1: the added loss_prior was optimised
    assert "loss_prior" in printed
    exec(compile(recipe, "docs/update.md[1]", "exec"), {})
    groups, optimizers = capsys.readouterr().out.splitlines()
    assert groups == "[('policy', None), ('value', ('loss_value',))]"  # as the page says
    assert optimizers == "['optimizer', 'value_optimizer']"


def test_training_page_imports_an_algorithm_as_research_code_does():
    blocks = python_blocks(ROOT / "docs" / "training.md")
    assert blocks
    for i, block in enumerate(blocks):
        exec(compile(block, f"docs/training.md[{i}]", "exec"), {})


def test_intrinsic_page_computes_a_bonus_and_its_losses(capsys):
    (block,) = python_blocks(ROOT / "docs" / "intrinsic.md")
    exec(compile(block, "docs/intrinsic.md", "exec"), {})
    printed = capsys.readouterr().out
    assert printed.strip() == "(2, 8, 1) ['loss_icm_forward', 'loss_icm_inverse']"


def test_pixels_page_encodes_uint8_frames(capsys):
    (block,) = python_blocks(ROOT / "docs" / "pixels.md")
    exec(compile(block, "docs/pixels.md", "exec"), {})
    assert capsys.readouterr().out.strip() == "512 torch.Size([2, 512])"
