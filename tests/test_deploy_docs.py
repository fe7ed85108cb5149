"""docs/deploy.md's Python examples run as written, in order (the second loads the first's
run), with a small budget; an example that needs a package (a first line ``# needs: <package>``)
skips when it is not installed."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[1] / "docs" / "deploy.md"
BLOCKS = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)


@pytest.mark.slow
def test_deploy_page_examples_run(tmp_path, capsys):
    namespace = {"RUN_ROOT": str(tmp_path)}
    for index, block in enumerate(BLOCKS):
        needs = re.match(r"# needs: (\w+)", block)
        if needs and importlib.util.find_spec(needs.group(1)) is None:
            pytest.skip(f"{needs.group(1)} is not installed")
        exec(compile(block, f"docs/deploy.md[{index}]", "exec"), namespace)
    out = capsys.readouterr().out
    assert "return " in out and "'algo': 'ppo'" in out
    assert (tmp_path / "cartpole.onnx").is_file()


def test_deploy_page_has_its_examples():
    assert len(BLOCKS) == 2
    assert "rlkit.load(" in BLOCKS[0] and 'rlkit.export(policy, "onnx"' in BLOCKS[1]
