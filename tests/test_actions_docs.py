"""docs/actions.md's structured-action examples run as written: the MultiDiscrete game's
masked picks never happen and PPO trains on it, the hybrid task's Dict actions reach the env
and PPO trains on it (with fewer frames than the page)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _blocks() -> list[str]:
    text = (ROOT / "docs" / "actions.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def _run(block: str, frames: int) -> dict:
    namespace: dict = {"__name__": "__main__", "ACTIONS_FRAMES": frames}
    exec(compile(block, "docs/actions.md", "exec"), namespace)
    return namespace


@pytest.mark.slow
def test_the_multidiscrete_example_runs_as_written(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    block = next(b for b in _blocks() if "rlkit/MultiPick-v0" in b)
    namespace = _run(block, 1024)
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "torch.Size([4, 100, 3]) torch.int64"
    assert printed[1] == "True"
    summary = namespace["summary"]
    assert summary["frames"] >= 1024
    # valid picks only (3 slots, values in [0, 1], 10 steps); a masked pick would score -1
    assert 0.0 <= summary["eval_return_mean"] <= 30.0


@pytest.mark.slow
def test_the_hybrid_example_runs_as_written(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    block = next(b for b in _blocks() if "class Shot" in b)
    namespace = _run(block, 1024)
    out = capsys.readouterr().out
    assert "kind: Tensor(shape=torch.Size([4, 3]), device=cpu, dtype=torch.int64" in out
    assert "aim: Tensor(shape=torch.Size([4, 3, 2]), device=cpu, dtype=torch.float32" in out
    summary = namespace["summary"]
    assert summary["frames"] >= 1024
    assert summary["eval_return_mean"] <= 7.5 + 1e-6  # the best play's mean is 7.5
