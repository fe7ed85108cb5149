"""docs/actions.md runs as written: the masked game's mask reaches the actor and the
collector, no illegal move is made, and PPO trains on it from Python."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_actions_page_runs_as_written(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    text = (ROOT / "docs" / "actions.md").read_text()
    block = re.findall(r"```python\n(.*?)```", text, flags=re.S)[0]  # the masked game's
    namespace: dict = {"__name__": "__main__", "ACTIONS_FRAMES": 1024}
    exec(compile(block, "docs/actions.md", "exec"), namespace)
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "['observation', 'action_mask']"
    assert printed[1] == "True True"
    summary = namespace["summary"]
    assert summary["frames"] >= 1024
    # legal play only: 4 claims of values in [0, 1]; an illegal claim would score -1
    assert 0.0 <= summary["eval_return_mean"] <= 4.0


def test_the_actions_page_is_in_the_nav():
    assert "actions.md" in (ROOT / "mkdocs.yml").read_text()
