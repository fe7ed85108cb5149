"""Your own environment: gymnasium's ``module:Env-vN``, env factories (gymnasium and TorchRL)
through the engine, resume, several ranks, and the one-line warning of the slower collector.

The corridor: start in cell 0 of 5, step left (0) or right (1), +1 on reaching cell 4 and
-0.01 for every other step; the best return is 4 steps right: 3 x -0.01 + 1 = 0.97.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import Bounded, Categorical, Composite, Unbounded
from torchrl.envs import EnvBase

ROOT = Path(__file__).resolve().parents[1]
BEST_RETURN = 3 * -0.01 + 1.0  # four steps right
FALLBACK = "warning: collecting with TorchRL's Collector"

CORRIDOR_MODULE = textwrap.dedent(
    """
    import gymnasium
    import numpy as np


    class Corridor(gymnasium.Env):
        def __init__(self, length=5):
            self.length = length
            self.observation_space = gymnasium.spaces.Box(0.0, 1.0, (1,), np.float32)
            self.action_space = gymnasium.spaces.Discrete(2)
            self.position = 0

        def _obs(self):
            return np.array([self.position / (self.length - 1)], dtype=np.float32)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.position = 0
            return self._obs(), {}

        def step(self, action):
            self.position = max(0, self.position + (1 if int(action) == 1 else -1))
            reached = self.position == self.length - 1
            return self._obs(), 1.0 if reached else -0.01, reached, False, {}


    gymnasium.register("Corridor-v0", entry_point=Corridor, max_episode_steps=50)
    """
)


class TorchCorridor(EnvBase):
    """The corridor as an unbatched TorchRL env."""

    seeds: list[int] = []  # every set_seed call, in order (class-wide, for the tests)

    def __init__(self, length: int = 5):
        super().__init__()
        self.length, self.position = length, 0
        self.observation_spec = Composite(observation=Bounded(0.0, 1.0, (1,), dtype=torch.float32))
        self.action_spec = Categorical(2)
        self.reward_spec = Unbounded((1,))

    def _observation(self):
        return torch.tensor([self.position / (self.length - 1)])

    def _reset(self, tensordict):
        self.position = 0
        flag = torch.zeros(1, dtype=torch.bool)
        return TensorDict(observation=self._observation(), done=flag, terminated=flag.clone())

    def _step(self, tensordict):
        self.position = max(0, self.position + (1 if int(tensordict["action"]) == 1 else -1))
        reached = torch.tensor([self.position == self.length - 1])
        reward = torch.tensor([1.0 if reached else -0.01])
        return TensorDict(
            observation=self._observation(), reward=reward, done=reached, terminated=reached.clone()
        )

    def _set_seed(self, seed):
        TorchCorridor.seeds.append(seed)


def small(run_dir: Path, frames: int = 512, **kw):
    from rlkit.configs.ppo import PPOConfig

    settings = dict(
        total_frames=frames,
        num_envs=4,
        rollout_steps=64,
        minibatch_size=64,
        eval_every=256,
        eval_episodes=2,
        max_episode_steps=50,
        progress=False,
        run_dir=str(run_dir),
    )
    return PPOConfig(**(settings | kw))


def corridor_package(tmp_path: Path) -> Path:
    """``mypkg.envs`` registering ``Corridor-v0``, in a folder of its own (not yet on the
    path of this process)."""
    folder = tmp_path / "site"
    (folder / "mypkg").mkdir(parents=True)
    (folder / "mypkg" / "__init__.py").write_text("")
    (folder / "mypkg" / "envs.py").write_text(CORRIDOR_MODULE)
    return folder


@pytest.fixture
def on_path(tmp_path, monkeypatch):
    """``mypkg.envs`` importable in this process; afterwards its modules and the ids it
    (or the docs page's ``corridor``) registered are gone again."""
    import gymnasium

    monkeypatch.syspath_prepend(str(corridor_package(tmp_path)))
    yield
    gymnasium.registry.pop("Corridor-v0", None)
    for name in ("mypkg", "mypkg.envs", "corridor"):
        sys.modules.pop(name, None)


def subprocess_env(*paths: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*(str(p) for p in paths), str(ROOT)])
    return env


# --------------------------------------------------------------------------- --env module:id


@pytest.mark.slow  # a recipe process
def test_recipe_trains_an_env_registered_by_a_module_on_the_path(tmp_path):
    site = corridor_package(tmp_path)
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, str(ROOT / "recipes" / "ppo.py"), "--env", "mypkg.envs:Corridor-v0"]
        + ["--total-frames", "2048", "--num-envs", "4", "--rollout-steps", "64"]
        + ["--eval-every", "0", "--eval-episodes", "2", "--progress", "false"]
        + ["--run-dir", str(run_dir)],
        capture_output=True,
        text=True,
        env=subprocess_env(site),
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env"] == "mypkg.envs:Corridor-v0"
    assert summary["frames"] == 2048
    assert summary["eval_return_mean"] <= BEST_RETURN + 1e-6
    assert FALLBACK not in result.stderr  # a gymnasium env: rlkit's own collector


def test_an_unimportable_module_is_refused_in_one_line_at_parse_time(capsys):
    from rlkit.training.cli import parse

    with pytest.raises(SystemExit) as exit_info:
        parse("ppo", ["--env", "no_such_pkg_xyz.envs:Corridor-v0"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert "cannot import module 'no_such_pkg_xyz.envs'" in err and "PYTHONPATH" in err


def test_a_name_the_module_neither_registers_nor_defines_is_refused(on_path):
    from rlkit.envs.ids import resolve_env

    with pytest.raises(ValueError, match=r"registered no gymnasium id 'Nope-v0'"):
        resolve_env("mypkg.envs:Nope-v0")
    assert resolve_env("mypkg.envs:Corridor-v0") == "Corridor-v0"


def test_parsing_a_module_id_imports_no_torch(tmp_path):
    site = corridor_package(tmp_path)
    code = (
        "import sys; from rlkit.training.cli import parse; "
        "cfg = parse('ppo', ['--env', 'mypkg.envs:Corridor-v0']); "
        "print(cfg.env, 'torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=subprocess_env(site),
        timeout=300,
        check=True,
    ).stdout.split()
    assert out == ["mypkg.envs:Corridor-v0", "False"]


@pytest.mark.parametrize(
    ("env", "label"),
    [
        ("CartPole-v1", "CartPole-v1"),
        ("rlkit/MountainCarSparse-v0", "rlkit-MountainCarSparse-v0"),
        ("mypkg.envs:Corridor-v0", "Corridor-v0"),
        ("mypkg.envs:make_corridor", "make_corridor"),
        ("tests.test_own_env:test_x.<locals>.<lambda>", "lambda"),
        ("__main__:<lambda>", "lambda"),
    ],
)
def test_run_directory_names_carry_no_colon_or_slash(env, label):
    from types import SimpleNamespace

    from rlkit.training.engine import resolve_run_dir

    cfg = SimpleNamespace(env=env, run_dir=None, resume=None, seed=0)  # what it reads
    name = resolve_run_dir(cfg, "ppo").name
    assert name.startswith(f"ppo-{label}-s0-")
    assert ":" not in name and "/" not in name and "<" not in name


# --------------------------------------------------------------------------- factories


def test_a_factory_with_a_seed_parameter_gets_each_sub_envs_seed():
    from rlkit.envs import make_env

    calls = []

    def factory(seed, length=5):
        calls.append((seed, length))
        return TorchCorridor(length)

    TorchCorridor.seeds.clear()
    env = make_env(factory, num_envs=3, seed=7, env_kwargs={"length": 6})
    # sub-env i built with seed 7 + i (TorchRL's SerialEnv builds its envs twice: for their
    # specs, then to step them) and the --env-kwargs; then seeded 7 + i
    assert calls[-3:] == [(7, 6), (8, 6), (9, 6)]
    assert set(calls) == {(7, 6), (8, 6), (9, 6)}
    assert TorchCorridor.seeds[-3:] == [7, 8, 9]
    assert env.batch_size == torch.Size([3])
    env.close()


def test_a_gymnasium_factory_is_stepped_by_rlkits_collector_and_evaluates_exactly(on_path):
    """Independent reference: a policy that always steps right scores 0.97 per episode."""
    from tensordict.nn import TensorDictModule

    from rlkit.data.collector import VectorEnvCollector
    from rlkit.envs import make_env
    from rlkit.training.evaluation import Evaluator

    env = make_env("mypkg.envs:Corridor-v0", num_envs=2, seed=0)
    right = TensorDictModule(
        lambda obs: torch.ones(obs.shape[:-1], dtype=torch.int64),
        in_keys=["observation"],
        out_keys=["action"],
    )
    VectorEnvCollector(env, right, frames_per_batch=8).shutdown()  # no UnsupportedEnvError
    for source in ("mypkg.envs:Corridor-v0", TorchCorridor):
        returns = Evaluator(source, episodes=3, max_episode_steps=50).returns(right)
        assert torch.allclose(returns, torch.full((3,), BEST_RETURN, dtype=torch.float64))


def test_a_torchrl_env_trains_evaluates_and_resumes_from_its_import_path(tmp_path, caplog):
    from rlkit.algorithms import ppo
    from rlkit.training.cli import parse

    run_dir = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="rlkit.data.collector"):
        summary = ppo.train(small(run_dir), env=TorchCorridor)
    warned = [r.getMessage() for r in caplog.records if FALLBACK in r.getMessage()]
    assert len(warned) == 1, warned  # once per run, not once per batch (2 batches here)
    assert "SerialEnv" in warned[0] and "fewer frames/s" in warned[0]
    assert summary["env"] == "tests.test_own_env:TorchCorridor"
    assert summary["frames"] == 512
    assert len((run_dir / "eval.csv").read_text().splitlines()) == 3  # header, 256, 512
    assert "env: tests.test_own_env:TorchCorridor" in (run_dir / "config.yaml").read_text()
    # --resume without the factory: rebuilt from the stored import path
    cfg = parse(
        "ppo",
        ["--resume", str(run_dir / "checkpoints" / "last.pt")]
        + ["--total-frames", "1024", "--run-dir", str(run_dir)],
    )
    resumed = ppo.train(cfg)
    assert resumed["frames"] == 1024 and resumed["env"] == summary["env"]


def test_resuming_a_lambdas_run_without_it_is_refused_in_one_line(tmp_path):
    from rlkit.algorithms import ppo
    from rlkit.training.cli import parse

    run_dir = tmp_path / "run"
    summary = ppo.train(small(run_dir, frames=256, eval_every=0), env=lambda: TorchCorridor(5))
    assert "<lambda>" in summary["env"]
    argv = ["--resume", str(run_dir / "checkpoints" / "last.pt"), "--total-frames", "512"]
    cfg = parse("ppo", argv + ["--run-dir", str(run_dir)])
    with pytest.raises(ValueError) as refusal:
        ppo.train(cfg)
    message = str(refusal.value)
    assert "\n" not in message and "pass the factory again" in message
    # passed again, it resumes
    assert ppo.train(cfg, env=lambda: TorchCorridor(5))["frames"] == 512


def test_a_population_builds_its_members_envs_from_the_factory(tmp_path):
    from rlkit.algorithms import ppo

    summary = ppo.train(small(tmp_path / "run", frames=256, population=2), env=TorchCorridor)
    assert summary["frames"] == 256 and len(summary["population"]) > 0


def train_corridor(argv: list[str]) -> None:
    """What a research script runs on every rank: ``ppo.train(parse("ppo", argv),
    env=TorchCorridor)`` (tests/ddp_shared.py's job "own-env")."""
    from rlkit.algorithms import ppo
    from rlkit.training.cli import parse

    ppo.train(parse("ppo", argv), env=TorchCorridor)


@pytest.mark.slow
@pytest.mark.ddp_jobs("own-env")  # a shared launch: tests/ddp_shared.py (--devices 2 ... ddp)
def test_a_torchrl_env_trains_on_two_ddp_ranks(ddp_jobs):
    run = ddp_jobs["own-env"]
    summary = run.summary()
    assert summary["world_size"] == 2 and summary["rank_param_max_diff"] == 0.0
    assert summary["env"] == "tests.test_own_env:TorchCorridor"
    # one line per process that collects (rank 0 and rank 1), none per batch
    assert len(re.findall(re.escape(FALLBACK), run.output)) == 2, run.output


# --------------------------------------------------------------------------- the docs page


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


def test_the_own_env_page_runs_as_written(tmp_path, monkeypatch, on_path):
    blocks = python_blocks(ROOT / "docs" / "own_env.md")
    module, rest = blocks[0], blocks[1:]
    (tmp_path / "corridor.py").write_text(module)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__main__", "OWN_ENV_FRAMES": 512}
    for i, block in enumerate(rest, start=1):
        exec(compile(block, f"docs/own_env.md[{i}]", "exec"), namespace)
    summary = namespace["summary"]
    assert summary["frames"] == 512
    assert summary["env"] == "__main__:<TorchCorridor>"  # defined in a script: not importable


@pytest.mark.parametrize("env_id", ["__main__:<lambda>", "__main__:make_env"])
def test_worker_processes_refuse_a_factory_they_cannot_import_in_one_line(env_id):
    """IMPALA's and APPO's workers build their envs by name in processes of their own: a
    lambda or a script's function would fail there (a traceback per worker); refused first."""
    from rlkit.data.async_collect import WorkerCollector

    with pytest.raises(ValueError, match=r"^--env .*cannot be imported there.*mypkg\.envs"):
        WorkerCollector(env_id=env_id, policy=None, num_envs=2, frames_per_batch=8)
