"""benchmarks/bench_classic.py's cells and benchmarks/bench_suite.py's verdicts, from
hand-written reports (no training)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_classic  # noqa: E402
import bench_suite  # noqa: E402


def _report(runs: list[tuple[int, int, list[tuple[int, float]]]]) -> dict:
    return {"runs": [{"seed": s, "frames": f, "curve": c} for s, f, c in runs]}


def test_cell_counts_seeds_from_their_curves():
    # threshold -200 within 500k; the report's own threshold was looser (-250)
    report = _report(
        [
            (0, 60_000, [(20_000, -900.0), (60_000, -190.0)]),  # reached -200 at 60k
            (1, 500_000, [(100_000, -300.0), (500_000, -210.0)]),  # whole budget, never
            (2, 700_000, [(600_000, -150.0), (700_000, -140.0)]),  # only after the budget
        ]
    )
    cell = bench_classic.cell_from_report(report, -200.0, 500_000, seeds=[0, 1, 2])
    assert cell == {"solved": 1, "of": 3, "latest": 60_000}


def test_cell_unsettled_when_a_seed_stopped_early_below_the_threshold():
    # stopped at 41k when it reached a looser bar (-250): whether it reaches -200 is unknown
    report = _report([(0, 41_000, [(41_000, -240.0)]), (1, 500_000, [(500_000, -100.0)])])
    assert bench_classic.cell_from_report(report, -200.0, 500_000, seeds=[0, 1]) is None
    # and a seed missing from the report leaves the cell open too
    assert bench_classic.cell_from_report(report, -200.0, 500_000, seeds=[0, 1, 2]) is None


def test_reports_with_recipe_flags_are_not_defaults():
    ok = {"command": "python benchmarks/bench_learning.py ppo CartPole-v1 475 1 --seeds 0 --jobs 1"}
    flagged = {"command": "python benchmarks/bench_learning.py ppo CartPole-v1 475 1 --lr 0.1"}
    assert bench_classic.with_defaults(Path("learning_ppo_CartPole-v1.json"), ok)
    assert not bench_classic.with_defaults(Path("learning_ppo_CartPole-v1.json"), flagged)
    assert not bench_classic.with_defaults(Path("learning_rnd_MountainCar-v0.json"), ok)


def test_dqn_cannot_take_box_actions(tmp_path):
    assert bench_classic.cell_text("dqn", "Pendulum-v1", tmp_path).startswith("cannot take")
    assert bench_classic.cell_text("svpg", "Acrobot-v1", tmp_path) == "not measured yet"


def test_suite_verdict_cleanrl_and_zoo_fraction():
    # Hopper: CleanRL 2382.86, zoo 2410.435 -> the median needs >= 2382.86 and >= 1928.348
    row = bench_suite.summary_row("ppo", "Hopper-v5", {"final_median": 2400.0, "sb3": None})
    assert row["bar_met"] is True
    assert row["vs_cleanrl"] == round(2400.0 / 2382.86, 2)
    row = bench_suite.summary_row("ppo", "Hopper-v5", {"final_median": 2300.0})
    assert row["bar_met"] is False
    # HalfCheetah: 0.8 x 5819.099 = 4655.28 is the binding bar, CleanRL's 1442.64 is not
    assert (
        bench_suite.summary_row("ppo", "HalfCheetah-v5", {"final_median": 4000.0})["bar_met"]
        is False
    )
    assert bench_suite.summary_row("ppo", "HalfCheetah-v5", {"final_median": 4700.0})["bar_met"]
    # no published figure: no verdict; a negative figure: no ratio, but a verdict
    assert (
        bench_suite.summary_row("ppo", "HumanoidStandup-v5", {"final_median": 1.0}).get("bar_met")
        is None
    )
    pusher = bench_suite.summary_row("ppo", "Pusher-v5", {"final_median": -35.0})
    assert pusher["vs_cleanrl"] is None and pusher["bar_met"] is True
    # SAC at 300k is judged against SB3 in the same run
    sac = {"final_median": 3000.0, "sb3": {"final_median": 3100.0}}
    assert bench_suite.summary_row("sac", "Hopper-v5", sac)["bar_met"] is False
    assert bench_suite.summary_row("sac", "Hopper-v5", {"final_median": 3000.0})["bar_met"] is None
    assert bench_suite.summary_row("ppo", "Ant-v5", None)["status"] == "not run"
