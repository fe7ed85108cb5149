"""benchmarks/compare_runs.py: medians at equal frames over the runs that reached them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run_dir(path: Path, seed: int, curve: list[tuple[int, float]], final: float | None) -> Path:
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(f"seed: {seed}\nenv: X-v0\n")
    rows = ["frames,return_mean,return_std,train_seconds"]
    rows += [f"{f},{r},0.0,1.0" for f, r in curve]
    (path / "eval.csv").write_text("\n".join(rows) + "\n")
    if final is not None:
        (path / "summary.json").write_text(json.dumps({"eval_return_mean": final}))
    return path


def test_medians_at_equal_frames_and_unfinished_runs(tmp_path):
    # evaluations land a batch past their nominal frame count, as in real runs
    a = _run_dir(tmp_path / "a0", 0, [(1_008, 1.0), (2_016, 4.0), (3_024, 9.0)], 9.5)
    b = _run_dir(tmp_path / "a1", 1, [(1_008, 3.0), (2_016, 2.0), (3_024, 5.0)], 5.0)
    c = _run_dir(tmp_path / "a2", 2, [(1_008, 2.0), (2_016, 6.0), (3_024, 7.0)], 7.0)
    d = _run_dir(tmp_path / "b0", 0, [(1_008, 10.0), (2_016, 11.0)], None)  # still training
    out = tmp_path / "cmp"
    proc = subprocess.run(
        [sys.executable, "benchmarks/compare_runs.py", "X-v0", "--runs", "A", str(a), str(b)]
        + [str(c), "--runs", "B", str(d), "--at", "1000", "2000", "3000", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    md = out.with_suffix(".md").read_text()
    # A: medians of (1, 3, 2), (4, 2, 6), (9, 5, 7); B: one run, not at 3000 frames
    assert "| A | 3 | 2.0 (3) | 4.0 (3) | 7.0 (3) |" in md
    assert "| B | 1 | 10.0 (1) | 11.0 (1) | — |" in md
    # a finished run's final is its summary's; an unfinished one's its last evaluation
    assert "| A | 0 | 3,024 | yes | 9.5 | 9 | 1 | 4 | 9 |" in md
    assert "| B | 0 | 2,016 | no | 11 | 11 | 10 | 11 | — |" in md
    assert out.with_suffix(".png").stat().st_size > 0
    payload = json.loads(out.with_suffix(".json").read_text())
    assert [r["seed"] for r in payload["groups"]["A"]] == [0, 1, 2]


def test_an_earlier_reports_runs_are_read_back_by_label(tmp_path):
    """A .json in place of a run directory: the runs stored in an earlier report under the
    same label, joined with new run directories; an unknown label is named."""
    a = _run_dir(tmp_path / "a0", 0, [(1_008, 1.0), (2_016, 4.0)], 4.5)
    first = tmp_path / "first"
    cmd = [sys.executable, "benchmarks/compare_runs.py", "X-v0", "--at", "1000", "2000"]
    proc = subprocess.run(
        [*cmd, "--runs", "A", str(a), "--out", str(first)], cwd=ROOT, capture_output=True
    )
    assert proc.returncode == 0, proc.stderr
    b = _run_dir(tmp_path / "a1", 1, [(1_008, 3.0), (2_016, 8.0)], 8.0)
    out = tmp_path / "second"
    report = str(first.with_suffix(".json"))
    proc = subprocess.run(
        [*cmd, "--runs", "A", report, str(b), "--out", str(out)], cwd=ROOT, capture_output=True
    )
    assert proc.returncode == 0, proc.stderr
    md = out.with_suffix(".md").read_text()
    assert "| A | 2 | 2.0 (2) | 6.0 (2) |" in md  # medians of (1, 3) and (4, 8)
    assert "| A | 0 | 2,016 | yes | 4.5 | 4 | 1 | 4 |" in md  # the stored run, as it was
    proc = subprocess.run(
        [*cmd, "--runs", "B", report, "--out", str(out)], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode != 0 and "no runs labelled 'B'" in proc.stderr
    proc = subprocess.run(  # the report already holds run a0
        [*cmd, "--runs", "A", report, str(a), "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0 and "runs given twice" in proc.stderr
