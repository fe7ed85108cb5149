"""Flags of the seed libraries' arguments (issue 21): each has the seed's meaning, refuses
a bad value in one line naming the flag, and keeps every recipe's default behaviour."""

from __future__ import annotations

import dataclasses

import pytest

from rlkit import algorithms
from rlkit.training import parse_config
from tests.test_flags_property import config_class


def _parse(algo: str, argv: list[str]):
    module = algorithms.load(algo)
    return parse_config(config_class(module), argv, presets=module.PRESETS)


def _refused(algo: str, argv: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        _parse(algo, argv)
    assert exit_info.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


def _fields(algo: str) -> set[str]:
    return {f.name for f in dataclasses.fields(config_class(algorithms.load(algo)))}


# --------------------------------------------------------------------------- --gae-lambda


@pytest.mark.parametrize("algo", ["impala", "appo"])
def test_vtrace_recipes_have_vtrace_lambda_and_no_gae_lambda(algo, capsys):
    """IMPALA and APPO compute V-trace, never GAE: --gae-lambda was listed and unused."""
    assert "vtrace_lambda" in _fields(algo) and "gae_lambda" not in _fields(algo)
    _refused(algo, ["--gae-lambda", "0.9"], "--gae-lambda", capsys)


@pytest.mark.parametrize("algo", ["ppo", "a2c", "ppg", "daac", "rnd", "svpg"])
def test_gae_recipes_keep_gae_lambda(algo, capsys):
    assert _parse(algo, ["--gae-lambda", "0.9"]).gae_lambda == 0.9
    _refused(algo, ["--gae-lambda", "1.5"], "--gae-lambda must be in [0, 1]", capsys)
