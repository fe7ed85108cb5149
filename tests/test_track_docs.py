"""docs/tracking.md's Python examples run as written, with small budgets; an example that
needs a tracker (a first line ``# needs: <package>``) skips when it is not installed."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[1] / "docs" / "tracking.md"
BLOCKS = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_tracking_page_example_runs(index, tmp_path, monkeypatch):
    block = BLOCKS[index]
    needs = re.match(r"# needs: (\w+)", block)
    if needs and importlib.util.find_spec(needs.group(1)) is None:
        pytest.skip(f"{needs.group(1)} is not installed")
    monkeypatch.setenv("TRACK_FRAMES", "128")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    namespace = {"RUN_ROOT": str(tmp_path), "TRACK_FRAMES": "128"}
    exec(compile(block, f"docs/tracking.md[{index}]", "exec"), namespace)


def test_tracking_page_has_its_examples():
    assert len(BLOCKS) == 2
    assert any("callbacks=" in b for b in BLOCKS) and any("MlflowClient" in b for b in BLOCKS)
