"""docs/actions.md's "Dict observations" section runs as written: the networks read the two
entries, rlkit's collector (no fallback) carries them, and PPO trains on the task from Python."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_dict_observation_example_runs_as_written(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    text = (ROOT / "docs" / "actions.md").read_text()
    section = text[text.index("## Dict observations") :]
    (block,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    namespace: dict = {"__name__": "__main__", "DICT_FRAMES": 512}
    exec(compile(block, "docs/actions.md", "exec"), namespace)
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "['image', 'vector'] ['image', 'vector']"
    assert printed[1] == "VectorEnvCollector torch.uint8 torch.Size([4, 16, 4])"
    summary = namespace["summary"]
    assert summary["frames"] >= 512
    assert 0.0 <= summary["eval_return_mean"] <= 8.0
    assert summary["config"]["obs_keys"] == ["image", "vector"]
