"""Property: a setting is read the same way whatever its source (issue 51).

For every field of every recipe's config (launch settings aside: they are never read from a
file or a checkpoint), a value a YAML file can hold (a number, NaN and the infinities, a
bool, a string, null, a list, and a few YAML 1.1 spellings: ``1e-3`` is a string there,
``yes`` a bool, ``0x10`` an int, ``2024-01-01`` a date) is given to the parser in process
(:func:`rlkit.configs.base.parse_config`) from each source:

* the flag typed with that value (``--lr=true``, ``--hidden 64 32``, ``--eval-env=none``);
* a ``--config`` YAML file setting it;
* the stored settings of a checkpoint being resumed (``--resume``), the reader faked;
* a one-value ``--sweep`` (float and bool fields a sweep may vary).

The outcome must be the same from every source: accepted with the same value (NaN equal to
NaN, same type), or refused with exit status 2 and exactly one stderr line ``error: ...``
that names the field. Where a command line has no spelling for the value (null for a
setting that is not optional, a list for a single-valued one) the file and the checkpoint
refuse it, naming the field.

Examples are derandomised (CI draws the same values every run): each example draws a value
for every field of one recipe and parses it from every source, ~400 parses per example.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from rlkit.configs import NAMES
from rlkit.configs.base import (
    _NOT_SWEPT,
    LAUNCH_FIELDS,
    field_specs,
    parse_config,
    to_dict,
)

EXAMPLES = int(os.environ.get("RLKIT_PROPERTY_EXAMPLES", "2"))

INTS = (-1, 0, 1, 2, 3, 16)
FLOATS = (-1.0, 0.0, 1e-3, 0.5, 1.5, 2.0, 1e300, math.nan, math.inf, -math.inf)
STRINGS = ("fast", "1e-3", "3", "2.5", "true", "maybe", "none", "", "64 64", "64,32", "a=1")
STRINGS += ("lr=1e-3,1e-2", "no-such-choice")
#: YAML text whose value is not what it looks like: (text, what YAML reads)
RAW_YAML = ("1e-3", "yes", "off", "~", "0x10", "1_000", ".NaN", "-.inf", "2024-01-01", "{a: 1}")


#: per field kind (its choices): the YAML values drawn, built once (a strategy is costly to
#: build, cheap to draw from)
_STRATEGIES: dict[Any, st.SearchStrategy] = {}
#: the raw spellings with what YAML reads them as
_RAW = {text: yaml.safe_load(f"x: {text}")["x"] for text in RAW_YAML}


def yaml_values(spec) -> st.SearchStrategy:
    """``(raw yaml text or None, value)``: a value YAML dumps, or a raw YAML spelling."""
    key = spec.choices
    if key not in _STRATEGIES:
        scalars = st.one_of(
            st.none(),
            st.booleans(),
            st.sampled_from(INTS),
            st.sampled_from(FLOATS),
            st.sampled_from(STRINGS + (spec.choices or ())),
        )
        item = st.sampled_from((1, 3, 16, -1, 0.5, "64", "a=1", "x", None, True))
        lists = st.one_of(st.lists(item, max_size=3), st.just([[1, 2]]))
        dumped = st.one_of(scalars, scalars, scalars, lists).map(lambda v: (None, v))
        raw = st.sampled_from(sorted(_RAW.items()))
        _STRATEGIES[key] = st.one_of(dumped, dumped, dumped, raw)
    return _STRATEGIES[key]


def flag_text(value: Any) -> str:
    """A scalar as typed on a command line."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "none"
    if isinstance(value, float):
        return repr(value)
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)


def flag_argv(spec, value: Any) -> list[str] | None:
    """The command line that types ``value`` for ``spec``; None where it has no spelling."""
    if isinstance(value, list):
        if spec.kind is not tuple or (spec.whole and not value):
            return None
        if any(isinstance(v, list) for v in value):
            return None
        return [spec.flag, *([flag_text(v) for v in value] or [""])]
    if isinstance(value, dict) or (value is None and not spec.optional):
        return None
    return [f"{spec.flag}={flag_text(value)}"]


def parse(module, argv: list[str], stored: dict[str, Any] | None = None):
    """``("ok", cfg)`` or ``("refused", the one stderr line)``; anything else fails."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            cfg = parse_config(
                module.CONFIG, argv, presets=module.PRESETS, read_checkpoint=lambda p: stored
            )
    except SystemExit as exc:
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        assert exc.code == 2, (argv, exc.code, err.getvalue())
        assert len(lines) == 1 and lines[0].startswith("error: "), (argv, err.getvalue())
        return "refused", lines[0]
    assert not err.getvalue().strip(), err.getvalue()
    return "ok", cfg


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def check(name: str, spec, outcomes: dict[str, tuple[str, Any]], value_of) -> None:
    """Every source's outcome is the same; a refusal names the field."""
    for source, (kind, result) in outcomes.items():
        if kind == "refused":
            assert spec.name in result or spec.flag in result, (source, result)
    kinds = {source: kind for source, (kind, _) in outcomes.items()}
    assert len(set(kinds.values())) == 1, (name, spec.name, outcomes)
    if next(iter(kinds.values())) == "ok":
        values = {source: value_of(source, cfg) for source, (_, cfg) in outcomes.items()}
        first = next(iter(values.values()))
        assert all(same(first, v) for v in values.values()), (name, spec.name, values)


#: what a one-value sweep needs besides the sweep (asynchronous collectors run no population)
SWEEP_ARGV = {"appo": ["--sync-collect", "true"], "impala": ["--sync-collect", "true"]}
#: a sweep's own rules (what the members of one population may differ in): a value the flag
#: takes may be refused in a sweep with one of these
SWEEP_RULES = (
    "the members share one training env",  # a setting that shapes the shared env
    "does not apply to --population / --sweep",  # --compile
    "--population / --sweep needs",  # asynchronous collection
    "a --population / --sweep run cannot",  # batches of varying length
    "which --population / --sweep cannot",  # a critic with a loss group of its own
)


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    """Per recipe: its config module, the settings a default run's checkpoint stores, and a
    scratch directory."""
    import importlib

    out = {}
    for name in NAMES:
        module = importlib.import_module(f"rlkit.configs.{name}")
        default = parse_config(module.CONFIG, [], presets=module.PRESETS)
        out[name] = (module, to_dict(default), tmp_path_factory.mktemp(name))
    return out


def drawn_fields(module) -> dict[str, Any]:
    return {n: s for n, s in field_specs(module.CONFIG).items() if n not in LAUNCH_FIELDS}


def sweep_argv(name: str, field: str, value: Any) -> list[str]:
    return [*SWEEP_ARGV.get(name, []), "--sweep", f"{field}={flag_text(value)}"]


@pytest.mark.parametrize("name", NAMES)
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],  # a shrink re-parses every field: minutes
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_every_source_reads_a_value_as_its_flag_does(name, data, bases):
    module, stored_base, tmp = bases[name]
    config_file = Path(tmp) / "config.yaml"
    for field, spec in drawn_fields(module).items():
        raw, value = data.draw(yaml_values(spec), label=field)
        text = f"{field}: {raw}\n" if raw else yaml.safe_dump({field: value})
        config_file.write_text(text)
        outcomes = {
            "config": parse(module, ["--config", str(config_file)]),
            "checkpoint": parse(module, ["--resume", "run.pt"], {**stored_base, field: value}),
        }
        argv = flag_argv(spec, value)
        if argv is None:  # no command line types it: a file and a checkpoint refuse it
            assert outcomes["config"][0] == "refused", (field, value, outcomes)
            check(name, spec, outcomes, lambda s, cfg, field=field: getattr(cfg, field))
            continue
        outcomes["flag"] = parse(module, argv)
        swept = spec.kind in (float, bool) and field not in _NOT_SWEPT
        if swept and not isinstance(value, list) and "," not in flag_text(value):
            outcome = parse(module, sweep_argv(name, field, value))
            if outcome[0] == "ok" or outcomes["flag"][0] == "refused":
                outcomes["sweep"] = outcome
            else:  # refused where the flag is not: only by a sweep's own rule
                assert any(rule in outcome[1] for rule in SWEEP_RULES), (field, outcome)

        def value_of(source, cfg, field=field):
            if source == "sweep":
                ((_, setting),) = cfg.population_members()
                return setting[field]
            return getattr(cfg, field)

        check(name, spec, outcomes, value_of)


def test_the_issue_values_are_refused_naming_the_field(tmp_path, capsys):
    """The values of issue 51, from a config file: each refused in one line naming it."""
    from rlkit.configs import ppo

    cases = {
        "lr: true": "lr",
        "lr: fast": "lr",
        "lr_schedule: sometimes": "lr_schedule",
        "normalize_obs: maybe": "normalize_obs",
        "seed: 1.5": "seed",
        "seed: null": "seed",
        "hidden: [64, [64]]": "hidden",
        "lr: [0.001]": "lr",
    }
    for text, field in cases.items():
        (tmp_path / "c.yaml").write_text(text + "\n")
        with pytest.raises(SystemExit) as exit_info:
            parse_config(ppo.CONFIG, ["--config", str(tmp_path / "c.yaml")], presets=ppo.PRESETS)
        err = capsys.readouterr().err.strip()
        assert exit_info.value.code == 2 and "\n" not in err, (text, err)
        assert err.startswith(f"error: --config {str(tmp_path / 'c.yaml')!r} sets {field}:"), err
    # and what YAML reads as a string is the number the flag would give
    (tmp_path / "c.yaml").write_text("lr: 1e-3\nhidden: 32,32\n")
    cfg = parse_config(ppo.CONFIG, ["--config", str(tmp_path / "c.yaml")], presets=ppo.PRESETS)
    assert cfg.lr == 1e-3 and cfg.hidden == (32, 32)


def test_a_config_built_in_python_gets_the_same_type_checks():
    from rlkit.configs.ppo import PPOConfig

    for kwargs, flag in [
        ({"lr": True}, "--lr"),
        ({"seed": None}, "--seed"),
        ({"lr_schedule": "sometimes"}, "--lr-schedule"),
        ({"hidden": [64, 64]}, "--hidden"),
    ]:
        with pytest.raises(ValueError, match=f"^{flag} must be"):
            PPOConfig(**kwargs)
    assert PPOConfig(lr=1).lr == 1  # an int is a float's value


def test_the_strategies_cover_every_field_type():
    kinds = {spec.kind for n in NAMES for spec in drawn_fields(_module(n)).values()}
    assert kinds <= {bool, int, float, str, tuple}, kinds


def _module(name):
    import importlib

    return importlib.import_module(f"rlkit.configs.{name}")


def test_sources_agree_on_one_hand_written_case(tmp_path):
    """The comparison itself: ``--normalize-obs=yes`` and ``normalize_obs: yes`` (YAML's
    bool) both give True."""
    from rlkit.configs import ppo

    (tmp_path / "c.yaml").write_text("normalize_obs: yes\n")
    a = parse(ppo, ["--normalize-obs=yes"])
    b = parse(ppo, ["--config", str(tmp_path / "c.yaml")])
    assert a[0] == b[0] == "ok" and a[1].normalize_obs is b[1].normalize_obs is True
    assert dataclasses.replace(a[1]) == a[1]
