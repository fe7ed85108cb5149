"""docs/torchrl.md runs as written: each composition trains CartPole-v1 to the bar (three
deterministic episodes all >= 450) within 100k frames on its fixed seed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[1] / "docs" / "torchrl.md"
BLOCKS = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)


@pytest.fixture
def one_thread():
    """The measured figures on the page are for one torch thread (and tiny networks run
    faster on one); restored afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def run_blocks(*indices: int) -> dict:
    namespace: dict = {}
    for i in (0, *indices):  # block 0: the shared set-up
        exec(compile(BLOCKS[i], f"docs/torchrl.md[{i}]", "exec"), namespace)
    return namespace


def test_the_page_has_the_set_up_a_check_and_four_compositions():
    assert len(BLOCKS) == 6


def test_the_check_refuses_an_index_actor_on_a_default_gym_env(capsys):
    run_blocks(1)
    printed = capsys.readouterr().out
    assert "index actions" in printed and "OneHot(n=2)" in printed and "make_actor" in printed


@pytest.mark.slow  # learning runs: each trains CartPole to the bar
@pytest.mark.parametrize(
    ("block", "name"),
    [
        (2, "TorchRL collector"),
        (3, "TorchRL GAE and ClipPPOLoss"),
        (4, "TorchRL replay buffer"),
        (5, "PPO + KL term"),
    ],
)
def test_each_composition_solves_cartpole_within_100k_frames(block, name, one_thread):
    namespace = run_blocks(block)
    frames = namespace["solved_at"].get(name)
    assert frames is not None, f"{name}: no deterministic return >= 450 within the budget"
    assert frames <= 100_000
    print(f"{name}: solved at {frames} frames")
