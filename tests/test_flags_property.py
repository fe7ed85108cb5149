"""Property: any flag combination within each field's declared type ends in a clean run or a
one-line error (issue 14).

For every recipe, a few fields of its config dataclass are drawn at a time (1 to 4), each
from a small set of values of the field's declared type that holds valid values and invalid
edge values (negative, zero, NaN, infinities, a float beyond float32, an undeclared choice,
an empty tuple, ``none`` where the field is optional); half of the numbers come from a
plausible subset, so that about half of the examples pass validation and train. The recipe
then runs in process through :func:`rlkit.training.cli`, exactly as
``python recipes/<name>.py FLAGS`` would, on a tiny budget in a fresh run directory. The
outcome must be one of:

* a clean run: ``cli`` returns and ``summary.json`` is written;
* exit status 2 (bad input) with exactly one non-empty stderr line, ``error: ...``: no
  usage block, and no line of a run that has started (a bad value is refused before the
  run prints its first line, not at its first update);
* exit status 3 (the run diverged) whose stderr ends in its one ``error: ...`` line.

Anything else (an exception escaping ``cli``, a traceback, a usage dump, another exit code)
fails the property. Launch fields (where and how a process runs) and ``--env`` are never
drawn. Examples are derandomised, so CI draws the same combinations every time: 12 per
recipe (each is a whole run; the fast lane draws them for PPO and DQN, the slow lane
for the other recipes); ``RLKIT_PROPERTY_EXAMPLES=200`` draws more per recipe for a long
local search.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import os
import sys
import tempfile
import types
import typing
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlkit import algorithms
from rlkit.configs.base import field_metadata
from rlkit.training import cli

EXAMPLES = int(os.environ.get("RLKIT_PROPERTY_EXAMPLES", "12"))
#: one on-policy and one off-policy recipe in the fast lane; SAC's examples (about 11 s for
#: 12 here) run in the slow lane with the other recipes'
FAST = ("ppo", "dqn")

#: where and how a process runs, and the env: never drawn
NOT_DRAWN = frozenset(
    {
        "env",
        "run_dir",
        "resume",
        "init_from",
        "eval_only",
        "export",  # --eval-only's: tests/test_export.py
        "export_path",
        "config",
        "accelerator",
        "devices",
        "strategy",
        "num_nodes",
        "threads",
        "video",
        "video_every",  # renders GIFs: slow, and covered by tests/test_run_dir.py
        "progress",
        "overwrite",
    }
)

#: per-type value sets: valid values and the edges a user may type by mistake (1e300: finite
#: in Python, beyond float32)
INTS = (-1, 0, 1, 2, 3, 5, 16)
FLOATS = (-1.0, 0.0, 1e-3, 0.5, 0.99, 1.0, 3.0, 1e300, math.nan, math.inf, -math.inf)
#: fields that multiply the work of a batch (passes, phases, processes): kept small so an
#: example runs in about a second; their invalid edges are the same
MULTIPLIERS = frozenset(
    {"epochs", "value_epochs", "aux_epochs", "n_pi", "workers", "aux_grad_accum"}
)
SMALL_INTS = (-1, 0, 1, 2, 3)
#: half of the draws of a number come from these, so that about half of the examples pass
#: validation and train (the combinations of valid values are the ones that reach the loop)
PLAUSIBLE = {int: (1, 2, 3, 5, 16), "small": (1, 2, 3), float: (1e-3, 0.5, 0.99)}
#: plain string fields without declared choices: a known id, an unknown one, another space
STRINGS = {"eval_env": ("CartPole-v1", "Pendulum-v1", "NoSuchEnv-v0")}

#: tiny sizes for every recipe (drawn flags come after these and win)
BASE = {
    "a2c": "--num-envs 2 --rollout-steps 8",
    "appo": "--num-envs 2 --rollout-steps 16 --minibatch-size 16 --epochs 1",
    "daac": "--num-envs 2 --rollout-steps 16 --minibatch-size 16 --epochs 1 --value-epochs 1",
    "dqn": "--steps-per-batch 16 --learning-starts 16 --batch-size 8 --buffer-size 256 "
    "--hidden 32 32",
    "impala": "--num-envs 2 --rollout-steps 16 --minibatch-size 16 --epochs 1",
    "ppg": "--num-envs 2 --rollout-steps 16 --minibatch-size 16 --epochs 1 --n-pi 2 "
    "--aux-epochs 1 --aux-minibatches 2",
    "ppo": "--num-envs 2 --rollout-steps 16 --minibatch-size 16 --epochs 2",
    "rnd": "--num-envs 2 --rollout-steps 16 --minibatch-size 16 --epochs 1",
    "sac": "--steps-per-batch 8 --learning-starts 16 --batch-size 8 --buffer-size 256 "
    "--hidden 32 32",
    "svpg": "--particles 2 --num-envs 2 --rollout-steps 8",
}
#: evaluation episodes are cut off after 10 steps (the drawn --eval-max-steps wins): a full
#: episode of MountainCar or Pendulum cost more than the run it scores
BUDGET = ["--total-frames", "64", "--eval-episodes", "2", "--eval-max-steps", "10"]
BUDGET += ["--progress", "false"]


def config_class(module) -> type:
    """The config dataclass ``main`` parses (:func:`rlkit.algorithms.config_class`)."""
    return algorithms.config_class(module.__name__.rsplit(".", 1)[-1])


def value_strategy(cls: type, name: str, annotation: Any) -> st.SearchStrategy:
    """Values of field ``name`` (of type ``annotation``) as typed on a command line."""
    optional = False
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        annotation, optional = args[0], True
    choices = field_metadata(cls, name).get("choices")
    if choices:
        base = st.sampled_from((*choices, "no-such-choice"))
    elif annotation is bool:
        base = st.booleans()
    elif annotation is int:
        small = name in MULTIPLIERS
        base = st.one_of(
            st.sampled_from(PLAUSIBLE["small" if small else int]),
            st.sampled_from(SMALL_INTS if small else INTS),
        )
    elif annotation is float:
        base = st.one_of(st.sampled_from(PLAUSIBLE[float]), st.sampled_from(FLOATS))
    elif typing.get_origin(annotation) is tuple:
        base = st.lists(st.sampled_from((-1, 0, 1, 3, 16)), max_size=3).map(tuple)
    elif annotation is str:
        base = st.sampled_from(STRINGS.get(name, ("no-such-value",)))
    else:  # a new field type: extend this test
        raise AssertionError(f"{cls.__name__}.{name}: no strategy for {annotation!r}")
    return st.one_of(st.none(), base) if optional else base


def drawable_fields(cls: type) -> dict[str, st.SearchStrategy]:
    hints = typing.get_type_hints(cls)
    return {
        f.name: value_strategy(cls, f.name, hints[f.name])
        for f in dataclasses.fields(cls)
        if f.name not in NOT_DRAWN
    }


def as_argv(values: dict[str, Any]) -> list[str]:
    """Flags as typed: ``--lr=-inf`` (a separate ``-inf`` would read as a flag name),
    ``--hidden 64 64``, ``--hidden ''`` for an empty tuple, ``none`` for None."""
    argv: list[str] = []
    for name, value in values.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, tuple):
            argv += [flag, *([str(v) for v in value] or [""])]
        elif value is None:
            argv.append(f"{flag}=none")
        elif isinstance(value, bool):
            argv.append(f"{flag}={str(value).lower()}")
        else:
            argv.append(f"{flag}={value}")
    return argv


def run_cli(module, argv: list[str]) -> tuple[int, str]:
    """``python recipes/<name>.py *argv`` in process: (exit status, stderr)."""
    err = io.StringIO()
    saved_argv = sys.argv
    sys.argv = [f"recipes/{module.__name__.rsplit('.', 1)[-1]}.py", *argv]
    code: Any = 0
    try:
        with (
            contextlib.redirect_stderr(err),
            contextlib.redirect_stdout(io.StringIO()),
            warnings.catch_warnings(),
        ):
            # Python's default filters, as a user's shell has them (not pytest's "error")
            warnings.resetwarnings()
            warnings.simplefilter("default")
            for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning):
                warnings.simplefilter("ignore", category)
            warnings.simplefilter("ignore", ResourceWarning)
            try:
                cli(module.main)
            except SystemExit as exc:
                code = exc.code
    finally:
        sys.argv = saved_argv
    return code, err.getvalue()


def check_outcome(code: Any, stderr: str, run_dir: Path) -> None:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr, stderr
    if code in (0, None):
        assert (run_dir / "summary.json").is_file(), f"clean exit without a summary\n{stderr}"
        return
    assert code in (2, 3), f"exit status {code!r}\n{stderr}"
    if code == 2:
        assert len(lines) == 1, f"exit 2 needs one stderr line, got {len(lines)}:\n{stderr}"
    assert lines and lines[-1].startswith("error: "), stderr
    assert sum(line.startswith("error:") for line in lines) == 1, stderr


@pytest.mark.parametrize(
    "name", [n if n in FAST else pytest.param(n, marks=pytest.mark.slow) for n in algorithms.NAMES]
)
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_any_flag_combination_runs_cleanly_or_fails_in_one_line(name, data):
    module = algorithms.load(name)
    fields = drawable_fields(config_class(module))
    chosen = data.draw(
        st.lists(st.sampled_from(sorted(fields)), min_size=1, max_size=4, unique=True),
        label="fields",
    )
    values = {f: data.draw(fields[f], label=f) for f in chosen}
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        argv = [*BASE[name].split(), *BUDGET, "--run-dir", str(run_dir), *as_argv(values)]
        saved = os.environ.pop("RLKIT_TRACEBACK", None)
        try:
            code, stderr = run_cli(module, argv)
        finally:
            if saved is not None:
                os.environ["RLKIT_TRACEBACK"] = saved
        check_outcome(code, stderr, run_dir)


def test_the_strategies_cover_every_field_of_every_recipe():
    """A field of a new type makes the property fail loudly, not skip it."""
    for name in algorithms.NAMES:
        cls = config_class(algorithms.load(name))
        fields = drawable_fields(cls)
        assert set(fields) == {f.name for f in dataclasses.fields(cls)} - NOT_DRAWN
        assert BASE[name]
