"""Resume is exact: everything a learner owns comes back bit for bit in a fresh process.

For each algorithm, with settings small enough to run in seconds but rich enough that every
piece of state is non-trivial (optimiser moments, learning-rate / clip / entropy / epsilon
schedules, observation and reward normalisers, target networks, PPG's phase buffer
mid-cycle, replay buffers saved with ``--save-buffer``, n-step tails, prioritized replay,
fractional update-to-data credit), this test:

1. in the test process: seeds as the engine does, builds env, learner and collector from the
   recipe's argv, collects and updates a few batches (the engine's loop: update, publish the
   weights, count the frames);
2. at a batch boundary, collects the next batch and writes it (plain tensors, loadable with
   ``weights_only=True``) together with the engine's checkpoint payload
   (:func:`rlkit.training.engine._payload`, with the update's ``Context.generator``) through
   :func:`rlkit.training.checkpoint.atomic_save`; then runs the update on that batch and
   records every module's state (targets and normalisers included), every optimiser's
   state, the learner's own state, the counters, the random streams and the metrics;
3. in a fresh Python process: builds env, learner and collector from the same argv, restores
   the checkpoint as a resume does (``_apply`` with the reward normaliser as an extra module,
   then the random streams and the generator, last), loads the batch, runs the same update
   and records the same things. One interpreter is started for all cases (per xdist
   worker); it imports torch and the recipes once and forks a process per case from that
   state, the state of a fresh interpreter (starting one per case cost more than the cases).

Every tensor must be bit-identical (``torch.equal``, same dtype) and every other value equal.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from tensordict import TensorDict

from rlkit import _quiet, _speedups
from rlkit.algorithms import load
from rlkit.training import checkpoint as ckpt
from rlkit.training import parse_config
from rlkit.training.engine import Context, Counters, _apply, _payload, default_collector

ROOT = Path(__file__).resolve().parents[1]

CONFIGS = {
    "ppo": "PPOConfig",
    "ppg": "PPGConfig",
    "dqn": "DQNConfig",
    "sac": "SACConfig",
    "appo": "APPOConfig",
}

#: case -> (algorithm, flags, batches collected and trained on before the saved one)
CASES: dict[str, tuple[str, str, int]] = {
    # normalised observations and rewards, linear learning rate, clip range and entropy
    # coefficient annealed, several shuffled minibatches per epoch (Context.generator)
    "ppo": (
        "ppo",
        "--env CartPole-v1 --total-frames 2000 --num-envs 4 --rollout-steps 16 --epochs 2 "
        "--minibatch-size 16 --lr-schedule linear --normalize-obs true "
        "--normalize-reward true --entropy-coef 0.01 --entropy-coef-final 0.001 "
        "--hidden 32 32",
        3,
    ),
    # running advantage standardisation (pyrado's RunningStandardizer): its statistics of
    # three batches' advantages come back and standardise the saved batch identically
    "ppo-running-adv": (
        "ppo",
        "--env CartPole-v1 --total-frames 2000 --num-envs 4 --rollout-steps 16 --epochs 2 "
        "--minibatch-size 16 --running-advantage-norm true --normalize-advantage false "
        "--hidden 32 32",
        3,
    ),
    # memory: the stored recurrent states of the saved batch train identically (LSTM, chunks)
    "ppo-lstm": (
        "ppo",
        "--env CartPole-v1 --total-frames 2000 --num-envs 4 --rollout-steps 16 --epochs 2 "
        "--minibatch-size 16 --recurrent lstm --recurrent-size 8 --sequence-length 4 "
        "--normalize-obs true --hidden 16",
        3,
    ),
    # an intrinsic reward (ICM): its networks, input and return statistics and its own
    # optimiser come back, and the saved batch's mixed reward is the same
    "ppo-icm": (
        "ppo",
        "--env CartPole-v1 --total-frames 2000 --num-envs 4 --rollout-steps 16 --epochs 2 "
        "--minibatch-size 16 --intrinsic icm --int-coef 0.5 --hidden 32 32",
        3,
    ),
    # RND pretraining on PPG: the predictor's Bernoulli masks from the run's generator
    "ppg-rnd-pretraining": (
        "ppg",
        "--env CartPole-v1 --total-frames 2000 --num-envs 4 --rollout-steps 8 --epochs 2 "
        "--minibatch-size 16 --n-pi 4 --aux-epochs 2 --aux-minibatches 4 "
        "--intrinsic rnd --pretraining true --hidden 32 32",
        7,
    ),
    # saved at phase iteration 3 of 4 (three batches in the auxiliary buffer, one auxiliary
    # phase behind it): the update on the saved batch runs the next auxiliary phase on the
    # restored buffer, with its own optimiser and minibatches of rollouts
    "ppg": (
        "ppg",
        "--env CartPole-v1 --total-frames 2000 --num-envs 4 --rollout-steps 8 --epochs 2 "
        "--minibatch-size 16 --n-pi 4 --aux-epochs 2 --aux-minibatches 4 "
        "--normalize-obs true --hidden 32 32",
        7,
    ),
    # epsilon half-way down its linear schedule, a replay buffer that has wrapped around,
    # 3-step windows across batch ends, a hard target every 3 gradient steps, double DQN,
    # a fractional update-to-data ratio
    "dqn": (
        "dqn",
        "--env CartPole-v1 --total-frames 640 --num-envs 2 --steps-per-batch 16 "
        "--batch-size 16 --buffer-size 100 --learning-starts 32 --utd-ratio 0.3 "
        "--exploration-fraction 0.5 --target-update-period 3 --n-steps 3 --double-dqn true "
        "--save-buffer true --hidden 32 32",
        6,
    ),
    # prioritized replay: raw priorities, their running maximum and the annealed beta
    "dqn-prioritized": (
        "dqn",
        "--env CartPole-v1 --total-frames 640 --num-envs 2 --steps-per-batch 16 "
        "--batch-size 16 --buffer-size 100 --learning-starts 32 --utd-ratio 0.5 "
        "--exploration-fraction 0.5 --target-update-period 3 --prioritized true "
        "--save-buffer true --hidden 32 32",
        6,
    ),
    # Polyak targets, learned temperature, actor every second gradient step (the parity of
    # the restored step count decides), a wrapped buffer, fractional update-to-data credit,
    # reward scaling
    "sac": (
        "sac",
        "--env Pendulum-v1 --total-frames 640 --num-envs 2 --steps-per-batch 8 "
        "--batch-size 16 --buffer-size 64 --learning-starts 32 --utd-ratio 0.7 "
        "--policy-delay 2 --tau 0.05 --reward-scale 0.5 --save-buffer true "
        "--hidden 32 32",
        6,
    ),
    # the target network (Polyak, every second batch: saved between two of its steps),
    # KL-adaptive learning rate, observation normalisation copied into the target
    "appo": (
        "appo",
        "--env CartPole-v1 --total-frames 2000 --num-envs 4 --rollout-steps 16 --epochs 2 "
        "--minibatch-size 16 --lr-schedule kl --kl-target 0.001 --tau 0.5 "
        "--target-update-freq 2 --normalize-obs true --sync-collect true "
        "--hidden 32 32",
        3,
    ),
}


# --------------------------------------------------------------------------- one run


class Rig:
    """What the engine builds for one rank (fabric-free): env, learner, collector, context."""

    def __init__(self, case: str) -> None:
        from rlkit.envs import get_reward_norm, make_env

        algo, flags, _ = CASES[case]
        module = load(algo)
        config = getattr(module, CONFIGS[algo])
        self.cfg = cfg = parse_config(config, flags.split(), presets=module.PRESETS)
        torch.set_num_threads(cfg.threads)
        ckpt.set_rng_state(_seeded(cfg.seed))  # fabric.seed_everything(cfg.seed)
        self.env = make_env(cfg.env, num_envs=cfg.num_envs, seed=cfg.seed, **cfg.env_options())
        reward_norm = get_reward_norm(self.env)
        self.extra_modules = {"reward_norm": reward_norm} if reward_norm is not None else {}
        self.learner = module.build(cfg, self.env)
        for optimizer in self.learner.optimizers().values():
            _speedups.skip_cpu_graph_capture_check(optimizer)
        self.counters = Counters()
        fabric = SimpleNamespace(device=torch.device("cpu"), world_size=1, global_rank=0)
        self.ctx = Context(fabric, cfg.total_frames, self.counters)
        self._make_collector = getattr(module, "make_collector", default_collector)
        self.collector = None

    def start(self) -> None:
        """The collector, then a new run's update stream (rank 0); a resume sets the
        streams after this, as the engine does."""
        self.collector = self._make_collector(self.env, self.learner, torch.device("cpu"))
        self.ctx.generator.manual_seed(self.cfg.seed)

    def update(self, batch) -> dict[str, float]:
        """One iteration of the engine's loop after the collection."""
        metrics = self.learner.update(batch, self.ctx)
        self.collector.update_policy_weights_()
        self.counters.frames += batch.numel()
        self.counters.batches += 1
        return metrics

    def snapshot(self, metrics: Mapping[str, float]) -> dict[str, Any]:
        """Everything the learner owns after an update, as plain tensors and containers."""
        modules = dict(self.learner.modules()) | self.extra_modules
        counters = self.counters.state_dict()
        counters.pop("train_seconds")  # wall-clock time, not state an update reads
        rng = ckpt.rng_state()
        rng["generator"] = self.ctx.generator.get_state()
        return {
            "modules": {k: m.state_dict() for k, m in modules.items()},
            "optimizers": {k: o.state_dict() for k, o in self.learner.optimizers().items()},
            "learner": self.learner.state_dict(),
            "counters": counters,
            "rng": rng,
            "metrics": dict(metrics),
        }

    def close(self) -> None:
        if self.collector is not None:
            self.collector.shutdown()
        self.env.close()


def _seeded(seed: int) -> dict[str, Any]:
    """The random streams ``fabric.seed_everything(seed)`` leaves (python, numpy, torch)."""
    import random

    import numpy as np

    state = ckpt.rng_state()
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    seeded = ckpt.rng_state()
    ckpt.set_rng_state(state)
    return seeded


def _save_batch(batch, path: Path) -> None:
    torch.save({"batch_size": list(batch.batch_size), "data": batch.to_dict()}, path)


def _load_batch(path: Path) -> TensorDict:
    saved = torch.load(path, weights_only=True)
    return TensorDict(saved["data"], batch_size=saved["batch_size"])


@contextlib.contextmanager
def _engine_process_state() -> Iterator[None]:
    """What ``rlkit.training.run`` wraps a run in; the test process's random streams and
    thread count come back afterwards."""
    rng, threads = ckpt.rng_state(), torch.get_num_threads()
    try:
        with _quiet.quiet(), _speedups.patched():
            yield
    finally:
        ckpt.set_rng_state(rng)
        torch.set_num_threads(threads)


def parent(case: str, folder: Path) -> dict[str, Any]:
    """Train, save at a batch boundary (checkpoint and the next batch), update, record."""
    with _engine_process_state():
        rig = Rig(case)
        try:
            rig.start()
            batches = iter(rig.collector)
            for _ in range(CASES[case][2]):
                rig.update(next(batches))
            batch = next(batches)
            _save_batch(batch, folder / "batch.pt")
            payload = _payload(
                rig.cfg,
                rig.learner,
                rig.counters,
                extra_modules=rig.extra_modules,
                generator=rig.ctx.generator,
            )
            ckpt.atomic_save(payload, folder / "last.pt")
            snapshot = rig.snapshot(rig.update(batch))
        finally:
            rig.close()
    torch.save(snapshot, folder / "parent.pt")
    return torch.load(folder / "parent.pt", weights_only=True)


def child(case: str, folder: str) -> None:
    """In a fresh process: build from the same argv, resume from the checkpoint as the
    engine does, run the update on the saved batch, record."""
    folder = Path(folder)
    with _quiet.quiet(), _speedups.patched():
        rig = Rig(case)
        try:
            path = folder / "last.pt"
            payload = ckpt.load(path)
            _apply(payload, path, rig.learner, rig.counters, rig.extra_modules)
            rig.start()
            # the engine restores the random streams last, after everything is built
            ckpt.set_rng_state(payload["rng"])
            rig.ctx.generator.set_state(payload["rng"]["generator"])
            snapshot = rig.snapshot(rig.update(_load_batch(folder / "batch.pt")))
        finally:
            rig.close()
    torch.save(snapshot, folder / "child.pt")


# --------------------------------------------------------------------------- comparison


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Where ``a`` and ``b`` differ: tensors bit for bit (and dtype), containers by key."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return [f"{path}: {type(a).__name__} vs {type(b).__name__}"]
        if a.dtype != b.dtype or a.shape != b.shape:
            return [f"{path}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"]
        if not torch.equal(a, b):
            diff = (a.double() - b.double()).abs().max() if a.is_floating_point() else "-"
            return [f"{path}: values differ (max |diff| {diff})"]
        return []
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        out = [f"{path}/{k}: only in the parent" for k in a.keys() - b.keys()]
        out += [f"{path}/{k}: only in the resumed process" for k in b.keys() - a.keys()]
        for k in a:  # the parent's order: modules first
            if k in b:
                out += differences(a[k], b[k], f"{path}/{k}")
        return out
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        if len(a) != len(b):
            return [f"{path}: length {len(a)} vs {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]


def _check_coverage(case: str, saved: Mapping[str, Any], after: Mapping[str, Any]) -> None:
    algo, state = CASES[case][0], saved["learner"]
    assert saved["counters"]["updates"] > 0 and all(
        o["state"] for o in saved["optimizers"].values()
    )
    if case in ("ppo", "ppg", "appo"):
        assert "obs_norm" in saved["modules"]
    if case == "ppo":
        assert "reward_norm" in saved["modules"]
    if case in ("ppo-icm", "ppg-rnd-pretraining"):  # the bonus and its optimiser
        assert "intrinsic" in saved["modules"] and "intrinsic_optimizer" in saved["optimizers"]
    if case == "ppo-running-adv":  # three batches of 64 advantages
        assert saved["modules"]["adv_norm"]["stats.count"] == 192
    if algo == "ppg":  # saved mid-cycle; the update ran the auxiliary phase
        assert state["phase_iteration"] == 3 and "aux/lr" in after["metrics"]
    if algo == "appo":
        assert "target_actor" in saved["modules"] and state["kl_lr"]["lr"] != 1e-3
    if algo in ("dqn", "sac"):  # a full, wrapped buffer and gradient steps behind it
        buffer = state["buffer"]
        assert buffer["writer"]["_write_count"] > buffer["size"] and state["gradient_steps"] > 0
    if algo == "dqn":  # half-way down the epsilon schedule
        assert 0.04 < after["metrics"]["epsilon"] < 1.0
    if case == "dqn":
        assert "nstep_tail" in state and 0 < state["credit"] < 1
    if case == "dqn-prioritized":
        assert buffer["priorities"] is not None
    if algo == "sac":
        assert 0 < state["credit"] < 1


def serve() -> None:
    """The fresh side of the test: for each line ``<case> <folder>`` read from stdin, run
    :func:`child` in a process forked from this one, its output in ``<folder>/child.log``,
    and answer with its exit status. The fork has the state of a fresh interpreter with the
    imports done: nothing of another case has run in it."""
    import traceback

    for line in sys.stdin:
        case, folder = line.rstrip("\n").split(" ", 1)
        load(CASES[case][0])  # the recipe's modules, imported once
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                log = os.open(Path(folder) / "child.log", os.O_WRONLY | os.O_CREAT, 0o644)
                os.dup2(log, 1)
                os.dup2(log, 2)
                child(case, folder)
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), flush=True)


@pytest.fixture(scope="module")
def fresh_process(tmp_path_factory):
    """Runs a case's resumed side in a fresh process (:func:`serve`); returns its exit
    status, or why there is none."""
    import select

    errors = tmp_path_factory.mktemp("serve") / "stderr.txt"
    with errors.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", "from tests.test_resume_exact import serve; serve()"],
            cwd=ROOT,
            env={
                **os.environ,
                "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            },
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )

    def run(case: str, folder: Path) -> str:
        proc.stdin.write(f"{case} {folder}\n")
        proc.stdin.flush()
        # the first case waits for the imports too
        if not select.select([proc.stdout], [], [], 240)[0]:
            return "none: no answer within 240 s"
        return proc.stdout.readline().strip() or f"none: {errors.read_text()[-3000:]}"

    yield run
    proc.stdin.close()
    proc.wait(timeout=60)


@pytest.mark.parametrize("case", list(CASES))
def test_resumed_update_is_bit_identical(case, tmp_path, fresh_process):
    expected = parent(case, tmp_path)
    code = fresh_process(case, tmp_path)
    log = tmp_path / "child.log"
    assert code == "0", log.read_text()[-3000:] if log.is_file() else code
    resumed = torch.load(tmp_path / "child.pt", weights_only=True)

    # what each case claims to cover is there (and the update moved the parameters)
    saved = ckpt.load(tmp_path / "last.pt")
    _check_coverage(case, saved, expected)
    assert differences(saved["modules"], expected["modules"])

    diffs = differences(expected, resumed)
    assert not diffs, f"{case}: the resumed update differs:\n" + "\n".join(diffs[:40])
