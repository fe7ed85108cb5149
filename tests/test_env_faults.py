"""An env that fails stops the run with one line naming the env and what it did (exit 3),
after a checkpoint at the last complete batch that resumes (issue 51).

The env below fails once, at a chosen step or reset counted over every copy of it (two
sub-envs: 16 steps per batch of 8 steps per env)."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest

from rlkit.training import checkpoint as ckpt
from rlkit.training.cli import cli
from rlkit.training.evaluation import EVAL_SEED

#: the fault to raise: kind (None: none) and the step or reset it comes at (1-based, global)
FAULT: dict = {"kind": None, "at": 0}
COUNT = {"step": 0, "reset": 0}


class Faulty(gymnasium.Env):
    """Episodes of 8 steps; ``FAULT`` picks the step (or reset) that goes wrong, and how; or,
    in another process (a collector worker), ``fault`` at this copy's own step ``at`` (only
    the copy first reset with ``seed``: one sub-env of the run)."""

    def __init__(self, box: bool = False, fault=None, at=0, seed=None):
        self.observation_space = gymnasium.spaces.Box(-1.0, 1.0, (3,), np.float32)
        self.action_space = (
            gymnasium.spaces.Box(-1.0, 1.0, (1,), np.float32)
            if box
            else gymnasium.spaces.Discrete(2)
        )
        self.t = 0
        self.own = {"fault": fault, "at": at, "seed": seed, "steps": 0, "armed": seed is None}

    def _obs(self):
        return np.full(3, self.t / 10, np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None and seed == self.own["seed"]:
            self.own["armed"] = True
        COUNT["reset"] += 1
        if FAULT["kind"] == "reset" and COUNT["reset"] == FAULT["at"]:
            raise RuntimeError("the simulator lost its licence")
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        COUNT["step"] += 1
        self.own["steps"] += 1
        self.t += 1
        obs, reward = self._obs(), 1.0
        kind = FAULT["kind"] if COUNT["step"] == FAULT["at"] else None
        if self.own["fault"] and self.own["armed"] and self.own["steps"] == self.own["at"]:
            kind = self.own["fault"]
        if kind == "step":
            raise RuntimeError("the simulator crashed\nat its 40th step")
        if kind == "nan_obs":
            obs[1] = np.nan
        elif kind == "inf_reward":
            reward = float("inf")
        elif kind == "nan_reward":
            reward = float("nan")
        elif kind == "shape":
            obs = np.zeros(5, np.float32)
        return obs, reward, self.t >= 8, False, {}


def make_faulty(fault=None, at=0, fault_seed=None):
    """``--env tests.test_env_faults:make_faulty`` (worker processes import it): the copy
    first reset with ``fault_seed`` returns ``fault`` at its own step ``at``."""
    return Faulty(fault=fault, at=at, seed=fault_seed)


def make_faulty_eval():
    """An evaluation env whose first copy returns a NaN observation at its third step."""
    return Faulty(fault="nan_obs", at=3, seed=EVAL_SEED)


gymnasium.register("FaultyEnv-v0", entry_point=Faulty)
gymnasium.register("FaultyBoxEnv-v0", entry_point=Faulty, kwargs={"box": True})

ARGS = ["--num-envs", "2", "--rollout-steps", "8", "--minibatch-size", "16", "--epochs", "1",
        "--eval-every", "0", "--eval-episodes", "1", "--progress", "false", "--threads", "1",
        "--checkpoint-every", "10000"]  # fmt: skip


def _run(capsys, argv: list[str], kind=None, at=0) -> tuple[int, list[str]]:
    """``recipes/ppo.py argv`` in this process: exit status and the lines on stderr."""
    from rlkit.algorithms import ppo

    FAULT.update(kind=kind, at=at)
    COUNT.update(step=0, reset=0)
    capsys.readouterr()
    try:
        cli(lambda _: ppo.main(argv))
        code = 0
    except SystemExit as err:
        code = int(err.code)
    finally:
        FAULT.update(kind=None, at=0)
    return code, capsys.readouterr().err.strip().splitlines()


# (env, fault, step or reset it comes at, what the line says); the initial reset is resets
# 1-2, the end of each batch two more (episodes of 8 steps), so reset 11 ends the third
# batch, as step 40 is in it
CASES = {
    "raise-in-step": (
        "FaultyEnv-v0",
        "step",
        40,
        "env 'FaultyEnv-v0' raised in step(): RuntimeError: the simulator crashed at its 40th step",
    ),
    "raise-in-reset": (
        "FaultyEnv-v0",
        "reset",
        11,
        "env 'FaultyEnv-v0' raised in reset(): RuntimeError: the simulator lost its licence",
    ),
    # a discrete policy (the multinomial's traceback before) and a continuous one
    "nan-observation": (
        "FaultyEnv-v0",
        "nan_obs",
        40,
        "env 'FaultyEnv-v0' (sub-env 1) returned a non-finite 'observation' (nan) from step()",
    ),
    "nan-reward": (
        "FaultyBoxEnv-v0",
        "nan_reward",
        40,
        "env 'FaultyBoxEnv-v0' (sub-env 1) returned a non-finite 'reward' (nan) from step()",
    ),
    "wrong-shape": (
        "FaultyEnv-v0",
        "shape",
        40,
        "env 'FaultyEnv-v0' (sub-env 1) returned an observation of shape (5,) from step(), but "
        "its observation spec is Box(-1.0, 1.0, (3,), float32) (shape (3,))",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_an_env_fault_is_one_line_exit_3_and_the_last_batch_is_checkpointed(case, tmp_path, capsys):
    env, kind, at, said = CASES[case]
    run_dir = tmp_path / "run"
    argv = ["--env", env, *ARGS, "--run-dir", str(run_dir)]
    code, lines = _run(capsys, [*argv, "--total-frames", "64"], kind, at)
    assert code == 3
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], lines
    assert not any("Traceback" in line or "learning rate" in line for line in lines), lines
    last = run_dir / "checkpoints" / "last.pt"
    assert errors[0].startswith(f"error: {said}")
    assert errors[0].endswith(
        f"training stopped: checkpoint {str(last)!r} at the last complete batch (32 frames); "
        f"fix the env and continue with --resume last --run-dir {run_dir}"
    )
    assert ckpt.load(last)["counters"]["frames"] == 32  # the batch before the fault's
    code, lines = _run(capsys, [*argv, "--total-frames", "64", "--resume", "last"])
    assert code == 0, lines
    assert ckpt.load(last)["counters"]["frames"] == 64


def test_an_env_fault_in_the_first_batch_says_no_checkpoint_was_written(tmp_path, capsys):
    run_dir = tmp_path / "run"
    argv = ["--env", "FaultyEnv-v0", *ARGS, "--run-dir", str(run_dir), "--total-frames", "32"]
    code, lines = _run(capsys, argv, "inf_reward", 5)
    assert code == 3
    assert lines[-1] == (
        "error: env 'FaultyEnv-v0' (sub-env 0) returned a non-finite 'reward' (inf) from "
        "step(): the env produced it, not the learner; fix the env or wrap it to clip or "
        "replace such values; training stopped in its first batch, no checkpoint had been "
        "written yet"
    )
    assert not (run_dir / "checkpoints").exists()


# --------------------------------------------------------------------------- other paths
def _one_error(lines: list[str]) -> str:
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], lines
    assert not any("Traceback" in line or "learning rate" in line for line in lines), lines
    return errors[0]


def test_an_env_that_raises_in_its_first_reset_is_one_line_exit_3(tmp_path, capsys):
    """make_env's seeded reset at construction (a gymnasium traceback before)."""
    argv = ["--env", "FaultyEnv-v0", *ARGS, "--run-dir", str(tmp_path / "run")]
    code, lines = _run(capsys, [*argv, "--total-frames", "32"], "reset", 1)
    assert code == 3
    assert _one_error(lines) == (
        "error: env 'FaultyEnv-v0' raised in reset() (its first, seeded at construction): "
        "RuntimeError: the simulator lost its licence; training stopped before its first "
        "batch, no checkpoint had been written yet"
    )


def test_an_evaluation_env_fault_is_one_line_and_the_last_batch_is_checkpointed(tmp_path, capsys):
    run_dir = tmp_path / "run"
    argv = ["--env", "FaultyEnv-v0", *ARGS, "--run-dir", str(run_dir), "--total-frames", "64"]
    argv += ["--eval-every", "32", "--eval-env", "tests.test_env_faults:make_faulty_eval"]
    code, lines = _run(capsys, argv)
    assert code == 3
    last = run_dir / "checkpoints" / "last.pt"
    assert _one_error(lines) == (
        "error: env Faulty (sub-env 0) returned a non-finite 'observation' (nan) from step() "
        "during evaluation: the env produced it, not the learner; fix the env or wrap it to "
        f"clip or replace such values; training stopped: checkpoint {str(last)!r} at the last "
        f"complete batch (32 frames); fix the env and continue with --resume last --run-dir "
        f"{run_dir}"
    )
    assert ckpt.load(last)["counters"]["frames"] == 32


@pytest.mark.slow  # an APPO run with two worker processes
def test_an_env_fault_in_a_collector_worker_is_one_line_exit_3(tmp_path, capsys):
    """Worker 1 of 2 (its one env seeded 0 + 100 * 1) returns a NaN observation at its 12th
    step, in the second batch: the line names the rank's sub-env 1 and the worker."""
    from rlkit.algorithms import appo

    run_dir = tmp_path / "run"
    argv = ["--env", "tests.test_env_faults:make_faulty", "--env-kwargs",
            "fault=nan_obs", "at=12", "fault_seed=100", "--workers", "2",
            "--sync-collect", "true", *ARGS, "--run-dir", str(run_dir),
            "--total-frames", "64"]  # fmt: skip
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        cli(lambda _: appo.main(argv))
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 3
    last = run_dir / "checkpoints" / "last.pt"
    assert _one_error(lines) == (
        "error: env Faulty (sub-env 1) returned a non-finite 'observation' (nan) from step(): "
        "the env produced it, not the learner; fix the env or wrap it to clip or replace "
        f"such values (collector worker 1); training stopped: checkpoint {str(last)!r} at the "
        f"last complete batch (16 frames); fix the env and continue with --resume last "
        f"--run-dir {run_dir}"
    )
    assert ckpt.load(last)["counters"]["frames"] == 16


@pytest.mark.parametrize("case", list(CASES))
def test_torchrls_collector_fallback_names_the_env_fault(case):
    """An env make_collector hands to TorchRL's Collector (a transform rlkit's collector does
    not copy): the same line as rlkit's collector gives, before the policy reads the value."""
    from torchrl.collectors import Collector
    from torchrl.envs import RewardScaling

    from rlkit.data.collector import make_collector
    from rlkit.data.errors import EnvFault
    from rlkit.envs import make_env
    from rlkit.modules.actors import make_actor

    env_id, kind, at, said = CASES[case]
    env = make_env(env_id, num_envs=2, seed=0)
    env.append_transform(RewardScaling(loc=0.0, scale=2.0))
    actor = make_actor(env.observation_spec, env.action_spec)
    collector = make_collector(env, actor, frames_per_batch=16)
    assert isinstance(collector, Collector)
    FAULT.update(kind=kind, at=at)
    COUNT.update(step=0, reset=0)
    try:
        with pytest.raises(EnvFault) as err:
            for _ in zip(range(8), collector, strict=False):
                pass
    finally:
        FAULT.update(kind=None, at=0)
        collector.shutdown()
    assert str(err.value).startswith(said)
