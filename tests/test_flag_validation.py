"""Flag values the algorithm configs refuse before anything is built (found by
tests/test_flags_property.py). Each one ran before: into a traceback, a cryptic message after
the run had started, a diverged run, or a silent fallback."""

from __future__ import annotations

import pytest

from rlkit import algorithms
from rlkit.training import parse_config
from tests.test_flags_property import config_class


def _parse(algo: str, argv: list[str]):
    module = algorithms.load(algo)
    return parse_config(config_class(module), argv, presets=module.PRESETS)


@pytest.mark.parametrize(
    ("algo", "argv", "message"),
    [
        # NaN passed the "> 0" / ">= 0" checks; infinities were accepted
        ("a2c", ["--lr=inf"], "--lr must be finite"),  # RuntimeError traceback in sampling
        ("a2c", ["--lr=1e300"], "--lr must be finite"),  # overflow in RMSprop: traceback
        ("a2c", ["--max-grad-norm=nan"], "--max-grad-norm must be a number"),  # same
        ("ppo", ["--lr-final=nan"], "--lr-final must be a number"),  # diverged (exit 3)
        ("ppo", ["--lr-schedule=kl", "--kl-target=nan"], "--kl-target must be a number"),
        ("ppo", ["--adam-eps=inf"], "--adam-eps must be finite"),
        ("ppg", ["--aux-lr=nan"], "--aux-lr must be a number"),  # diverged (exit 3)
        ("daac", ["--value-lr=inf"], "--value-lr must be finite"),
        # a clip level may be inf, not a finite value beyond float32 (overflow in V-trace)
        ("appo", ["--pg-rho-clip=1e300"], "--pg-rho-clip must be within float32's"),
        ("rnd", ["--rnd-obs-clip=nan"], "--rnd-obs-clip must be a number"),
        ("svpg", ["--lr-final=inf"], "--lr-final must be finite"),
        ("svpg", ["--temperature=nan"], "--temperature must be a number"),
        ("dqn", ["--utd-ratio=inf"], "--utd-ratio must be finite"),  # OverflowError traceback
        ("dqn", ["--utd-ratio=nan"], "--utd-ratio must be a number"),  # "cannot convert..."
        ("dqn", ["--reward-scale=inf"], "--reward-scale must be finite"),
        ("dqn", ["--priority-eps=nan"], "--priority-eps must be a number"),
        ("sac", ["--target-entropy=nan"], "--target-entropy must be a number"),  # exit 3
        ("sac", ["--alpha-init=nan"], "--alpha-init must be a number"),
        # schedule ends were not checked: refused by the loss at the first update
        ("ppo", ["--entropy-coef-final=-1"], "--entropy-coef-final must be >= 0"),
        ("impala", ["--entropy-coef-final=nan"], "--entropy-coef-final must be a number"),
        ("ppo", ["--clip-epsilon-final=nan"], "--clip-epsilon-final must be a number"),
        ("ppg", ["--clip-epsilon-final=-1"], "--clip-epsilon-final must be >= 0"),
        # SAC's own learning rates: a negative one diverged, 0 silently meant --lr
        ("sac", ["--alpha-lr=-1"], "--alpha-lr must be > 0"),
        ("sac", ["--actor-lr=0"], "--actor-lr must be > 0"),
    ],
)
def test_bad_values_are_refused_in_one_line_naming_the_flag(algo, argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _parse(algo, argv)
    assert exit_info.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


@pytest.mark.parametrize(
    ("algo", "argv"),
    [
        ("ppo", ["--max-grad-norm=inf"]),  # no clipping
        ("impala", ["--rho-clip=inf", "--c-clip=inf", "--pg-rho-clip=inf"]),  # no truncation
        ("rnd", ["--rnd-obs-clip=inf"]),
        ("sac", ["--actor-lr=none", "--alpha-lr=none", "--target-entropy=-2"]),
    ],
)
def test_unbounded_clips_and_unset_options_are_accepted(algo, argv):
    _parse(algo, argv)
