"""Callbacks for research code: ``run(cfg, build, algo=..., callbacks=[...])``.

What each hook receives is compared with the run directory's files (``metrics.csv``,
``eval.csv``, ``summary.json``) read as plain CSV and JSON, and the counts with the schedule
worked out by hand."""

from __future__ import annotations

import csv
import json

import pytest

SMALL = dict(
    num_envs=2,
    rollout_steps=16,
    epochs=1,
    minibatch_size=32,
    eval_every=64,
    eval_episodes=2,
    progress=False,
    total_frames=256,
    checkpoint_every=64,
)


class Recorder:
    """Every call of every hook, in order."""

    def __init__(self) -> None:
        self.batches: list[tuple[int, dict]] = []
        self.evals: list[tuple[int, dict]] = []
        self.ends: list[dict] = []

    def on_batch(self, frames, metrics):
        self.batches.append((frames, dict(metrics)))

    def on_eval(self, frames, metrics):
        self.evals.append((frames, dict(metrics)))

    def on_end(self, summary):
        self.ends.append(dict(summary))


def _rows(path):
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_callbacks_see_every_batch_every_evaluation_and_the_summary(tmp_path):
    from rlkit.algorithms import ppo
    from rlkit.training import Callback, run

    class OnlyEvals(Callback):  # a subclass overriding one hook
        def __init__(self) -> None:
            self.frames: list[int] = []

        def on_eval(self, frames, metrics):
            self.frames.append(frames)

    run_dir = tmp_path / "run"
    cfg = ppo.PPOConfig(**SMALL, run_dir=str(run_dir), log_every=2)
    rec, evals = Recorder(), OnlyEvals()
    summary = run(cfg, ppo.build, algo="ppo", callbacks=[rec, evals])
    # 256 frames in batches of 2 envs x 16 steps: 8 batches; an evaluation every 64 frames
    assert [f for f, _ in rec.batches] == [32 * k for k in range(1, 9)]
    assert [f for f, _ in rec.evals] == [64, 128, 192, 256] == evals.frames
    # each evaluation's metrics are eval.csv's row
    for (frames, metrics), row in zip(rec.evals, _rows(run_dir / "eval.csv"), strict=True):
        assert int(row["frames"]) == frames
        assert metrics["return_mean"] == pytest.approx(float(row["return_mean"]), rel=1e-12)
        assert metrics["return_std"] == pytest.approx(float(row["return_std"]), rel=1e-12)
    # every batch, though --log-every 2 writes every other one (and those with episodes)
    logged = {int(r["frames"]): r for r in _rows(run_dir / "metrics.csv")}
    for frames, metrics in rec.batches:
        if frames in logged:
            want = float(logged[frames]["loss_policy"])
            assert metrics["loss_policy"] == pytest.approx(want, rel=1e-5)
    assert {"loss_policy", "fps", "train_seconds"} <= set(rec.batches[0][1])
    # the end: once, with summary.json's content
    assert len(rec.ends) == 1
    on_disk = json.loads((run_dir / "summary.json").read_text())
    assert (
        json.loads(json.dumps(rec.ends[0], default=str))
        == on_disk
        == json.loads(json.dumps(summary, default=str))
    )


def test_a_population_callback_sees_each_members_metrics(tmp_path):
    from rlkit.algorithms import ppo
    from rlkit.training import run

    cfg = ppo.PPOConfig(**{**SMALL, "total_frames": 64}, population=2, run_dir=str(tmp_path / "p"))
    rec = Recorder()
    run(cfg, ppo.build, algo="ppo", callbacks=[rec])
    assert [f for f, _ in rec.batches] == [32, 64]  # a member's frames
    assert {"loss_policy/member0", "loss_policy/member1"} <= set(rec.batches[0][1])
    assert [f for f, _ in rec.evals] == [64]


def test_a_callback_that_raises_stops_the_run_in_one_line_naming_it(tmp_path):
    from rlkit.algorithms import ppo
    from rlkit.training import run
    from rlkit.training.errors import RunFailedError

    class StopAtSecondEval:
        def __init__(self) -> None:
            self.n = 0

        def on_eval(self, frames, metrics):
            self.n += 1
            if self.n == 2:
                raise RuntimeError("return too low")

    run_dir = tmp_path / "run"
    cfg = ppo.PPOConfig(**SMALL, run_dir=str(run_dir))
    with pytest.raises(RunFailedError) as info:
        run(cfg, ppo.build, algo="ppo", callbacks=[StopAtSecondEval()])
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(
        "callback StopAtSecondEval.on_eval raised RuntimeError at 128 frames: return too low"
    )
    assert "--resume last" in message  # the checkpoint at 64 frames is kept
    frames = [int(r["frames"]) for r in _rows(run_dir / "metrics.csv")]
    assert max(frames) == 128  # stopped there: no batch after the failing evaluation
    assert not (run_dir / "summary.json").exists()


def test_callbacks_that_are_not_callbacks_are_refused():
    from rlkit.algorithms import ppo
    from rlkit.training import Engine

    with pytest.raises(TypeError, match="callbacks: int has none of on_batch, on_eval, on_end"):
        Engine(ppo.PPOConfig(), ppo.build, algo="ppo", callbacks=[3])
