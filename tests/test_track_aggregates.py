"""A sweep reports per setting: ``done:`` line, ``curve.png``, ``summary.json`` and
``population.json``; an interval only with at least 3 runs of a setting, else the members'
returns. The members' final returns are read back from ``eval.csv`` as plain CSV."""

from __future__ import annotations

import csv
import json

import pytest

FLAGS = [
    "--num-envs", "2", "--rollout-steps", "16", "--epochs", "1", "--minibatch-size", "32",
    "--total-frames", "64", "--eval-every", "32", "--eval-episodes", "2", "--progress", "false",
    "--checkpoint-every", "0", "--sweep", "lr=3e-4,1e-3",
]  # fmt: skip


def hand_iqm(values):
    """rliable's IQM (scipy.stats.trim_mean(values, 0.25)), written out."""
    x = sorted(values)
    cut = len(x) // 4
    kept = x[cut : len(x) - cut]
    return sum(kept) / len(kept)


def final_returns(run_dir):
    """Each member's last evaluation return, from eval.csv's member rows."""
    with (run_dir / "eval.csv").open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["member"]]
    last = max(int(r["frames"]) for r in rows)
    return {int(r["member"]): float(r["return_mean"]) for r in rows if int(r["frames"]) == last}


def sweep(tmp_path, capsys, monkeypatch, seeds):
    from rlkit.algorithms import ppo
    from rlkit.training import population, runlog

    drawn = []
    plot = runlog.plot_settings

    def record(run_dir, groups, **kw):
        drawn.append((kw["name"], {k: list(v) for k, v in groups.items()}))
        return plot(run_dir, groups, **kw)

    monkeypatch.setattr(runlog, "plot_settings", record)  # curve.png
    monkeypatch.setattr(population, "plot_settings", record)  # population.png
    run_dir = tmp_path / "sweep"
    argv = [*FLAGS, "--population-seeds", str(seeds), "--run-dir", str(run_dir)]
    summary = ppo.main(argv)
    err = capsys.readouterr().err.splitlines()
    done = [line for line in err if line.startswith("done:")]
    evals = [line for line in err if line.startswith("eval @")]
    report = json.loads((run_dir / "population.json").read_text())
    return run_dir, summary, report, done[0], drawn, evals


def test_three_seeds_per_setting_report_each_settings_iqm_and_interval(
    tmp_path, capsys, monkeypatch
):
    run_dir, summary, report, done, drawn, _ = sweep(tmp_path, capsys, monkeypatch, seeds=3)
    finals = final_returns(run_dir)
    groups = {"lr=0.0003": [0, 1, 2], "lr=0.001": [3, 4, 5]}  # the grid, then the seeds
    assert [a["settings"] for a in report["aggregates"]] == list(groups)
    for agg in report["aggregates"]:
        members = groups[agg["settings"]]
        values = [finals[i] for i in members]
        assert agg["members"] == members and agg["seeds"] == [0, 1, 2]
        assert agg["final_returns"] == values
        assert agg["final_return_iqm"] == pytest.approx(hand_iqm(values), rel=1e-12)
        low, high = agg["final_return_ci95"]
        assert min(values) <= low <= agg["final_return_iqm"] <= high <= max(values)
        text = (
            f"{agg['settings']}: IQM {agg['final_return_iqm']:.1f}, 95% CI [{low:.1f}, "
            f"{high:.1f}] over 3 seeds"
        )
        assert text in done
    assert summary["population"] == report["aggregates"]
    assert "+-" not in done  # no spread over all six members across both settings
    # curve.png and population.png: one curve per setting, never one over all members
    assert sorted(name for name, _ in drawn) == ["curve.png", "population.png"]
    assert all(g == groups for _, g in drawn)
    assert (run_dir / "curve.png").is_file()


def test_two_seeds_per_setting_report_no_interval_but_the_members_returns(
    tmp_path, capsys, monkeypatch
):
    run_dir, summary, report, done, drawn, evals = sweep(tmp_path, capsys, monkeypatch, seeds=2)
    finals = final_returns(run_dir)
    # every evaluation's progress line per setting: each setting's IQM over its 2 members
    last = evals[-1]
    for label, members in (("lr=0.0003", [0, 1]), ("lr=0.001", [2, 3])):
        value = sum(finals[i] for i in members) / 2  # the IQM of two values is their mean
        assert f"{label} {value:.1f} (2/2 seeds)" in last, last
    assert all("+-" not in line for line in evals), evals
    assert "CI" not in done and "interval" in done
    for agg, members in zip(report["aggregates"], ([0, 1], [2, 3]), strict=True):
        values = [finals[i] for i in members]
        assert agg["final_return_ci95"] is None
        assert agg["final_returns"] == values
        listed = ", ".join(f"{v:.1f}" for v in values)
        assert f"{agg['settings']}: {listed} (2 seeds, no interval)" in done
    assert "at least 3 runs" in report["ci"]
    assert all(g == {"lr=0.0003": [0, 1], "lr=0.001": [2, 3]} for _, g in drawn)
