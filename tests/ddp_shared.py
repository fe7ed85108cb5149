"""Two-rank DDP runs on CPU, many in one launch.

Each test that trained on two ranks used to launch its own pair of processes, and a rank's
start (Python, torch, TorchRL, Lightning: about 10-15 s of CPU here) cost more than its
run. The runs below share one launch instead: ``python -m tests.ddp_shared SPEC`` runs the
jobs SPEC names one after another. Its first job launches the second rank as a recipe does
(Lightning's launcher re-runs this module with ``LOCAL_RANK=1``), and both ranks then run
every job: each job is a whole run of its own (``rlkit.algorithms.recipe``, exactly what
``recipes/<name>.py`` runs, or a function), with its own process group on its own port
(set up and torn down by the engine), its own run directory and its own log (both ranks'
stdout and stderr). Python's warning registries are cleared between jobs, so a warning
that a fresh process would print is printed again.

The tests ask for their jobs with ``@pytest.mark.ddp_jobs("name", ...)`` and the
``ddp_jobs`` fixture (tests/conftest.py); the jobs of every selected test run in one launch,
once per session (the first xdist worker that needs them runs them, the other waits for the
result).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the ports of the jobs' process groups, chosen by the launching process (rank 0)
PORTS = "RLKIT_TEST_DDP_PORTS"


@dataclasses.dataclass(frozen=True)
class Job:
    """One run on two ranks. ``--run-dir <root>/<run>`` is added to ``argv``."""

    name: str
    argv: tuple[str, ...]
    #: ``recipes/<recipe>.py`` as a user runs it (its error handling and exit status)
    recipe: str | None = None
    #: or ``module:function``, called with ``argv`` on both ranks
    call: str | None = None
    #: the run directory (default: the job's name); a later job may resume an earlier one's
    run: str = ""
    #: after the job, rank 0 copies the run directory to ``<run>@<name>`` (what it held then)
    keep: bool = False
    #: the exit status both ranks must end the job with (another one stops the launch)
    expect: int = 0

    @property
    def run_dir(self) -> str:
        return self.run or self.name

    @property
    def launches(self) -> bool:
        """Whether the run starts its ranks through Lightning (``--devices 2``; a run that
        is to fail may stop before)."""
        return self.expect == 0 and (self.recipe is not None or "--devices" in self.argv)


def _flags(line: str) -> tuple[str, ...]:
    return tuple(line.split())


_PPO_RANK_STATE = _flags(
    "--normalize-reward true --eval-every 0 --eval-episodes 2 --progress false "
    "--checkpoint-every 1024 --normalize-obs true --total-frames 2048"
)
_DQN_BUFFERS = _flags(
    "--save-buffer true --learning-starts 64 --eval-every 0 --eval-episodes 2 --progress false "
    "--total-frames 512 --steps-per-batch 64 --utd-ratio 0.25 --hidden 32"
)
_POPULATION = _flags(
    "--num-envs 4 --rollout-steps 32 --epochs 4 --minibatch-size 64 --eval-every 128 "
    "--eval-episodes 2 --checkpoint-every 128 --progress false "
    "--sweep lr=1e-3,3e-4 --sweep entropy_coef=0.0,0.01"
)
_RESUME = ("--resume", "last")
_DDP_FLAGS = ("--accelerator", "cpu", "--devices", "2", "--strategy", "ddp")

#: every shared run, in the order they run (the first one's output is checked for warnings:
#: it runs in fresh processes)
JOBS = [
    # tests/test_subprocess.py::test_ddp_resume_gives_each_rank_its_own_per_rank_state
    Job("ppo-rank-state", _PPO_RANK_STATE, recipe="ppo", keep=True),
    Job("ppo-rank-state-resume", (*_PPO_RANK_STATE, *_RESUME), "ppo", run="ppo-rank-state"),
    # ... and two resumes from rank files that do not pair (rank 0 prepares the files)
    Job(
        "ppo-stale-rank",
        (*_DDP_FLAGS, *_PPO_RANK_STATE, *_RESUME),
        call="tests.test_subprocess:resume_after_a_stale_rank_file",
        keep=True,
    ),
    Job(
        "ppo-mixed-pair",
        (*_DDP_FLAGS, *_PPO_RANK_STATE, *_RESUME),
        call="tests.test_subprocess:resume_after_a_one_process_resume",
        run="ppo-stale-rank",
    ),
    # tests/test_subprocess.py::test_ddp_resume_gives_each_rank_its_own_replay_buffer
    Job("dqn-buffers", _DQN_BUFFERS, recipe="dqn", keep=True),
    Job("dqn-buffers-resume", (*_DQN_BUFFERS, *_RESUME), "dqn", run="dqn-buffers"),
    # tests/test_population_ddp.py
    Job("population", (*_POPULATION, "--total-frames", "256"), recipe="ppo", keep=True),
    Job(
        "population-resume",
        (*_POPULATION, "--total-frames", "384", *_RESUME),
        recipe="ppo",
        run="population",
    ),
    # tests/test_impala_appo.py
    Job(
        "appo",
        _flags("--total-frames 2048 --eval-every 0 --eval-episodes 2 --progress false"),
        recipe="appo",
    ),
    # tests/test_memory.py: memory on two ranks (each rank carries its own envs' state)
    Job(
        "ppo-gru",
        _flags(
            "--total-frames 512 --num-envs 4 --rollout-steps 16 --minibatch-size 32 "
            "--epochs 2 --recurrent gru --recurrent-size 8 --eval-every 0 --eval-episodes 2 "
            "--progress false"
        ),
        recipe="ppo",
    ),
    Job(
        "ppo-target-kl",
        _flags(
            "--total-frames 2048 --eval-every 0 --num-envs 4 --rollout-steps 64 --epochs 4 "
            "--minibatch-size 64 --target-kl 1e-4 --eval-episodes 2 --progress false"
        ),
        recipe="ppo",
    ),
    # tests/test_offpolicy.py
    Job(
        "sac",
        _flags(
            "--steps-per-batch 8 --learning-starts 32 --batch-size 32 --log-every 1 --hidden 32 "
            "--total-frames 256 --eval-every 0 --eval-episodes 2 --progress false"
        ),
        recipe="sac",
    ),
    # tests/test_daac.py
    Job(
        "daac",
        _flags(
            "--total-frames 2048 --value-freq 2 --progress false --eval-episodes 2 --eval-every 0"
        ),
        recipe="daac",
    ),
    # tests/test_rnd.py
    Job(
        "rnd",
        _flags(
            "--total-frames 1024 --num-envs 4 --rollout-steps 32 --minibatch-size 64 "
            "--eval-every 0 --eval-episodes 1 --progress false"
        ),
        recipe="rnd",
    ),
    # tests/test_ppg.py (its TINY and QUIET)
    Job(
        "ppg",
        _flags(
            "--num-envs 4 --rollout-steps 16 --minibatch-size 32 --epochs 2 --n-pi 2 "
            "--aux-epochs 2 --aux-minibatches 2 --progress false --eval-episodes 2 "
            "--total-frames 512 --eval-every 0"
        ),
        recipe="ppg",
    ),
    # tests/test_svpg.py
    Job(
        "svpg",
        _flags("--total-frames 1280 --eval-every 0 --eval-episodes 4 --progress false"),
        recipe="svpg",
    ),
    # tests/test_subprocess.py: a resume from a checkpoint that is missing or corrupt fails on
    # both ranks with exit status 2 (bad.pt: written by launch)
    Job("resume-missing", _flags("--progress false --resume {root}/missing.pt"), "ppo", expect=2),
    Job("resume-corrupt", _flags("--progress false --resume {root}/bad.pt"), "ppo", expect=2),
    # tests/test_own_env.py: a research script's ppo.train(cfg, env=TorchCorridor)
    Job(
        "own-env",
        _flags(
            "--devices 2 --strategy ddp --accelerator cpu --total-frames 1024 --num-envs 4 "
            "--rollout-steps 64 --minibatch-size 64 --eval-every 0 --eval-episodes 2 "
            "--max-episode-steps 50 --progress false"
        ),
        call="tests.test_own_env:train_corridor",
    ),
    # tests/test_track.py: --logger mlflow on two ranks (rank 0 logs; refused in one line on
    # both ranks where mlflow is not installed, and the test skips)
    Job(
        "ppo-mlflow",
        _flags(
            "--total-frames 512 --num-envs 2 --rollout-steps 32 --minibatch-size 32 --epochs 1 "
            "--eval-every 256 --eval-episodes 2 --progress false --logger csv,mlflow"
        ),
        recipe="ppo",
        expect=0 if importlib.util.find_spec("mlflow") else 2,
    ),
    # tests/test_normalization.py: RunningMeanStd.all_reduce_ in a gloo group of its own
    Job("all-reduce", (), call="tests.test_normalization:all_reduce_on_this_rank"),
]
BY_NAME = {job.name: job for job in JOBS}
DDP = _DDP_FLAGS


def with_earlier(names) -> list[Job]:
    """The jobs named and those they continue (same run directory, earlier), in run order."""
    wanted = set(names)
    last: dict[str, int] = {}
    for i, job in enumerate(JOBS):
        if job.name in wanted:
            last[job.run_dir] = i
    return [
        job for i, job in enumerate(JOBS) if job.name in wanted or i < last.get(job.run_dir, -1)
    ]


# --------------------------------------------------------------------------- the ranks


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _launch_second_rank() -> None:
    """What Lightning's launcher does for ``--strategy ddp`` (when the first job is not a
    recipe): this module again, as rank 1."""
    os.environ.update(MASTER_ADDR="127.0.0.1", NODE_RANK="0", LOCAL_RANK="0", WORLD_SIZE="2")
    subprocess.Popen([sys.executable, "-m", "tests.ddp_shared", *sys.argv[1:]],
                     env={**os.environ, "LOCAL_RANK": "1"})  # fmt: skip


def _fresh_warnings() -> None:
    """Warnings shown once per place are shown again (as in a fresh process)."""
    warnings.onceregistry.clear()
    for module in list(sys.modules.values()):
        registry = getattr(module, "__warningregistry__", None)
        if isinstance(registry, dict):
            registry.clear()


def _run(job: Job, argv: list[str]) -> int:
    try:
        if job.recipe:
            from rlkit.algorithms import recipe

            recipe(job.recipe, argv)
        else:
            module, function = job.call.split(":")
            getattr(importlib.import_module(module), function)(argv)
        return 0
    except SystemExit as exit_:
        code = exit_.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except BaseException:
        traceback.print_exc()
        return 1


def main(spec_file: str) -> None:
    spec = json.loads(Path(spec_file).read_text())
    root = Path(spec["root"])
    jobs = [BY_NAME[name] for name in spec["jobs"]]
    if PORTS not in os.environ:  # the launching process (rank 0)
        os.environ[PORTS] = ",".join(map(str, _free_ports(len(jobs))))
        if not jobs[0].launches:
            _launch_second_rank()
    ports = os.environ[PORTS].split(",")
    for job, port in zip(jobs, ports):
        os.environ["MASTER_PORT"] = port
        rank = int(os.environ.get("LOCAL_RANK", "0"))  # rank 0 before its first launch: 0
        sys.stdout.flush()
        sys.stderr.flush()
        log = os.open(root / f"{job.name}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        _fresh_warnings()
        argv = [a.replace("{root}", str(root)) for a in (*(DDP if job.recipe else ()), *job.argv)]
        code = _run(job, [*argv, "--run-dir", str(root / job.run_dir)])
        sys.stdout.flush()
        sys.stderr.flush()
        (root / f"{job.name}.rank{rank}").write_text(str(code))
        if code != job.expect:  # the other rank would wait for this one: stop both
            os.killpg(os.getpgrp(), signal.SIGKILL)
        if job.keep and rank == 0:
            shutil.copytree(root / job.run_dir, root / f"{job.run_dir}@{job.name}")


# --------------------------------------------------------------------------- the tests' side


@dataclasses.dataclass
class Result:
    """A job's outcome: its run directory (and the copy taken after it), both ranks' exit
    statuses and output."""

    job: Job
    root: Path

    @property
    def dir(self) -> Path:
        """The run directory as this job left it: a copy taken after it (``keep``), else
        the run directory itself (where a later job would continue)."""
        job = self.job
        return self.root / (f"{job.run_dir}@{job.name}" if job.keep else job.run_dir)

    @property
    def output(self) -> str:
        log = self.root / f"{self.job.name}.log"
        return log.read_text() if log.is_file() else ""

    def codes(self) -> list[str | None]:
        files = [self.root / f"{self.job.name}.rank{r}" for r in (0, 1)]
        return [f.read_text() if f.is_file() else None for f in files]

    def check(self, *, quiet: bool = False) -> None:
        """Both ranks ran the job to the end with its exit status (``quiet``: and printed no
        warning)."""
        codes = self.codes()
        if codes != [str(self.job.expect)] * 2:
            names = json.loads((self.root / "spec.json").read_text())["jobs"]
            statuses = {n: Result(BY_NAME[n], self.root).codes() for n in names}
            failed = [n for n, c in statuses.items() if set(c) - {None, str(BY_NAME[n].expect)}]
            launch = (self.root / "launch.txt").read_text()[-2000:]
            raise AssertionError(
                f"{self.job.name}: exit status per rank {codes}; the launch stopped at "
                f"{failed or 'a timeout'} (logs in {self.root})\n{self.output[-3000:]}{launch}"
            )
        if quiet:
            output = self.output
            assert "Warning" not in output and "deprecated" not in output, output[-3000:]

    def summary(self, *, quiet: bool = False) -> dict:
        """The run's summary, after :meth:`check` and the two-rank contract: two ranks that
        end with identical parameters."""
        self.check(quiet=quiet)
        summary = json.loads((self.dir / "summary.json").read_text())
        assert summary["world_size"] == 2
        assert summary["rank_param_max_diff"] == 0.0
        return summary


def _group_gone(pgid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def launch(root: Path, names, timeout: float = 1200, stall: float = 300) -> dict[str, Result]:
    """Run the jobs named (and those they continue) in one launch under ``root``; it is
    stopped after ``timeout`` seconds, or ``stall`` seconds without a job ending."""
    jobs = with_earlier(names)
    root.mkdir(parents=True, exist_ok=True)
    spec = root / "spec.json"
    spec.write_text(json.dumps({"root": str(root), "jobs": [j.name for j in jobs]}))
    (root / "bad.pt").write_bytes(b"not a checkpoint")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop(PORTS, None)
    for name in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_PORT", "MASTER_ADDR"):
        env.pop(name, None)
    with (root / "launch.txt").open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.ddp_shared", str(spec)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=out,
            start_new_session=True,  # both ranks in one group: nothing outlives the launch
        )
        start = last = time.monotonic()
        done = 0
        while proc.poll() is None:
            time.sleep(1)
            now, statuses = time.monotonic(), len(list(root.glob("*.rank[01]")))
            if statuses > done:
                done, last = statuses, now
            if now - last > stall or now - start > timeout:  # a rank waiting for ever
                out.write(f"\nstopped: {statuses} job statuses after {now - start:.0f} s\n")
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if not _group_gone(proc.pid, 30):  # rank 1 ends right after rank 0
            os.killpg(proc.pid, signal.SIGKILL)
    return {job.name: Result(job, root) for job in jobs}


if __name__ == "__main__":
    main(sys.argv[1])
