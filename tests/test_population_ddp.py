"""Populations on several ranks: each rank trains its own block of members.

A 2-process CPU (gloo) population of four PPO members with four settings is compared with the
same population in one process (``recipes/ppo.py`` in-process) and member 3 with its
standalone run: every member's parameters agree within 1e-5, so no rank averaged another's
gradients or statistics into its members. Rank 0 reports all four members; a resume on two
ranks continues as the one-process population's resume does; a resume on another number of
processes and an uneven split are refused with the fix.
"""

from __future__ import annotations

import csv
import json
import shutil

import pytest

from rlkit.algorithms import config_class, ppo
from rlkit.training import checkpoint as ckpt
from rlkit.training import parse_config
from rlkit.training.population import rank_members

SETTINGS = [
    {"lr": 1e-3, "entropy_coef": 0.0},
    {"lr": 1e-3, "entropy_coef": 0.01},
    {"lr": 3e-4, "entropy_coef": 0.0},
    {"lr": 3e-4, "entropy_coef": 0.01},
]
FLAGS = [
    "--num-envs", "4", "--rollout-steps", "32", "--epochs", "4", "--minibatch-size", "64",
    "--eval-every", "128", "--eval-episodes", "2", "--checkpoint-every", "128",
    "--progress", "false",
]  # fmt: skip
SWEEP = ["--sweep", "lr=1e-3,3e-4", "--sweep", "entropy_coef=0.0,0.01"]


def test_ranks_take_contiguous_blocks_and_an_uneven_split_is_refused(tmp_path):
    cfg = parse_config(config_class("ppo"), ["--population", "4"], presets={})
    members = cfg.population_members()
    assert rank_members(cfg) == (0, members)
    assert rank_members(cfg, 0, 2) == (0, members[:2])
    assert rank_members(cfg, 1, 2) == (2, members[2:])
    assert rank_members(cfg, 3, 4) == (3, members[3:])
    odd = parse_config(config_class("ppo"), ["--population", "3"], presets={})
    with pytest.raises(ValueError, match=r"3 members do not split evenly over 2 .*--population 4"):
        rank_members(odd, 0, 2)
    grid = parse_config(config_class("ppo"), ["--sweep", "lr=1e-3,3e-4,1e-4"], presets={})
    with pytest.raises(ValueError, match=r"--population-seeds 4\) or run on 3 process"):
        rank_members(grid, 0, 4)
    # the engine refuses it before any rank starts (no process launched, nothing written)
    ddp = ["--accelerator", "cpu", "--devices", "2", "--strategy", "ddp", "--progress", "false"]
    with pytest.raises(ValueError, match="3 members do not split evenly over 2 processes"):
        ppo.main([*ddp, "--population", "3", "--run-dir", str(tmp_path / "odd")])
    assert not (tmp_path / "odd").exists()


def _members(run_dir, ranks: int, name: str = "last.pt") -> dict[str, dict]:
    """Every member's module states from the run's checkpoint files (rank r's: rank<r>/)."""
    folder = run_dir / "checkpoints"
    files = [folder / name] + [folder / f"rank{r}" / name for r in range(1, ranks)]
    out: dict[str, dict] = {}
    for path in files:
        modules = ckpt.load(path)["modules"]
        out |= {k: v for k, v in modules.items() if k.startswith("member")}
    return out


def _max_diff(a: dict[str, dict], b: dict[str, dict], member: int | None = None) -> float:
    names = [k for k in a if member is None or k.startswith(f"member{member}.")]
    assert names and set(names) <= set(b)
    return max((a[n][k] - b[n][k]).abs().max().item() for n in names for k in a[n])


@pytest.mark.slow
@pytest.mark.ddp_jobs("population", "population-resume")
def test_two_ranks_train_the_one_process_population_and_resume_it(tmp_path, ddp_jobs):
    """The two-rank runs (256 frames, then a resume to 384) are shared launches
    (tests/ddp_shared.py: FLAGS and SWEEP); each prints no warning."""
    one = tmp_path / "one"
    ppo.main([*FLAGS, *SWEEP, "--total-frames", "256", "--run-dir", str(one)])
    first, resumed = ddp_jobs["population"], ddp_jobs["population-resume"]
    first.check(quiet=True)
    two = first.dir
    summary = json.loads((two / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["frames"] == 256  # per member
    assert summary["rank_param_max_diff"] is None  # the ranks hold different members

    # each rank's file holds its own block of members
    folder = two / "checkpoints"
    assert {k.split(".")[0] for k in ckpt.load(folder / "last.pt")["modules"]} >= {
        "member0",
        "member1",
    }
    assert not any(k.startswith("member2") for k in ckpt.load(folder / "last.pt")["modules"])
    assert {k.split(".")[0] for k in ckpt.load(folder / "rank1" / "last.pt")["modules"]} == {
        "member2",
        "member3",
    }
    # independence: every member as in the one-process population (8 optimiser steps per
    # batch, 2 batches), and the members differ from one another
    pop1, pop2 = _members(one, 1), _members(two, 2)
    assert _max_diff(pop1, pop2) < 1e-5
    renamed = {k.replace("member2.", "member0."): v for k, v in pop2.items()}
    assert _max_diff(pop2, renamed, member=0) > 1e-3
    # ... and member 3 (rank 1's second) as its standalone run
    solo = tmp_path / "solo"
    ppo.main([*FLAGS, "--total-frames", "256", "--lr", "3e-4", "--entropy-coef", "0.01",
              "--run-dir", str(solo)])  # fmt: skip
    solo_modules = {f"member3.{k}": v for k, v in ckpt.load(solo / "checkpoints" / "last.pt")[
        "modules"].items() if k in ("actor", "critic")}  # fmt: skip
    assert _max_diff(solo_modules, pop2) < 1e-5
    # a warm start without the members' modules is refused (it used to train from scratch)
    with pytest.raises(ckpt.CheckpointError, match="has no module 'member0.actor'"):
        warm = ["--init-from", str(solo / "checkpoints" / "last.pt")]
        ppo.main([*FLAGS, *SWEEP, *warm, "--run-dir", str(tmp_path / "warm")])

    # rank 0 reports every member
    report = json.loads((two / "population.json").read_text())
    assert [m["settings"] for m in report["members"]] == SETTINGS
    assert len(report["aggregates"]) == 4
    assert report == json.loads((one / "population.json").read_text())
    with (two / "eval.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r["member"]]
    assert sorted({(r["frames"], r["member"]) for r in rows}) == [
        (f, str(m)) for f in ("128", "256") for m in range(4)
    ]
    with (two / "metrics.csv").open() as f:
        assert {r["member"] for r in csv.DictReader(f)} >= {"0", "1", "2", "3"}

    # resume: two ranks continue as the one-process population's resume does
    ppo.main([*FLAGS, *SWEEP, "--total-frames", "384", "--resume", "last", "--run-dir", str(one)])
    resumed.check(quiet=True)
    two = tmp_path / "two"  # a copy: the refusal below must not touch the shared run
    shutil.copytree(resumed.dir, two)
    summary = json.loads((two / "summary.json").read_text())
    assert summary["frames"] == 384
    pop1, pop2 = _members(one, 1), _members(two, 2)
    assert _max_diff(pop1, pop2) < 1e-5
    assert json.loads((two / "population.json").read_text()) == json.loads(
        (one / "population.json").read_text()
    )
    # ... and resuming the two ranks' checkpoint in one process is refused with the fix
    with pytest.raises(ckpt.CheckpointError, match=r"split over 2 process.*--devices 2"):
        ppo.main([*FLAGS, *SWEEP, "--total-frames", "512", "--resume", "last",
                  "--run-dir", str(two)])  # fmt: skip
