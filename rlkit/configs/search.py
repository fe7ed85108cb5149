"""The search space of ``--search N`` (torch-free, no Optuna): parsed and checked with the
config's own field types and validation, so a bad name or range is refused at parse time in
one line, as a bad flag is.

Each setting is ``NAME=SPEC`` on the command line (``--search-space lr=log:1e-5:1e-2
entropy_coef=0:0.05``) or ``NAME: SPEC`` in a YAML file (``--search-space space.yaml``):

* ``LOW:HIGH``: a float, uniform; ``log:LOW:HIGH``: a float, log-uniform (``LOW > 0``);
* ``int:LOW:HIGH`` / ``int:log:LOW:HIGH``: an int (an int setting);
* ``A|B|C``: one of these values (any setting: floats, ints, bools, choices).

In a YAML file a spec is a quoted string (YAML reads an unquoted ``0:0.05`` as a base-60
number), a list of choices, or a mapping ``{low: 0, high: 0.05, log: false, int: false}``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: the config fields of the search itself (a trial's config has their defaults)
SEARCH_FIELDS = ("search", "search_space", "search_sampler", "search_pruner", "search_batch")

#: settings a search may not vary: the budget, the seed, the population and the launch
_NOT_SEARCHED = frozenset(
    {
        "seed",
        "total_frames",
        "target_return",
        "population",
        "population_seeds",
        "sweep",
        "eval_every",
        "eval_episodes",
        "config",
        "run_dir",
        "resume",
        "overwrite",
        "init_from",
        "eval_only",
    }
    | set(SEARCH_FIELDS)
)


@dataclass(frozen=True)
class Param:
    """One setting of the space: a float or int range (``low``, ``high``, ``log``) or a list
    of ``choices``; ``text`` is the spec as given."""

    name: str
    kind: str  # "float", "int" or "choice"
    low: Any = None
    high: Any = None
    log: bool = False
    choices: tuple[Any, ...] | None = None
    text: str = ""

    @property
    def values(self) -> list[Any]:
        """The values checked against the config: the bounds, or every choice."""
        return list(self.choices) if self.kind == "choice" else [self.low, self.high]

    def describe(self) -> str:
        if self.kind == "choice":
            return "|".join(str(c) for c in self.choices)
        head = ("int:" if self.kind == "int" else "") + ("log:" if self.log else "")
        return f"{head}{self.low}:{self.high}"


def _entry_error(entry: str, why: str) -> ValueError:
    return ValueError(f"--search-space {entry}: {why}")


def _range(entry: str, name: str, spec, parts: list[str], kind: str) -> tuple[Any, Any, bool]:
    from rlkit.configs.base import FieldValueError, value_from_text

    log = bool(parts) and parts[0] == "log"
    if log:
        parts = parts[1:]
    if len(parts) != 2:
        raise _entry_error(
            entry,
            "write LOW:HIGH, log:LOW:HIGH, int:LOW:HIGH or A|B|C (e.g. lr=log:1e-5:1e-2)",
        )
    try:
        low, high = (value_from_text(spec, p.strip()) for p in parts)
    except FieldValueError as err:
        raise _entry_error(entry, f"{name}: {err}") from None
    if low is None or high is None:
        raise _entry_error(entry, f"{name}: a range needs two numbers")
    if kind == "float" and not (math.isfinite(low) and math.isfinite(high)):
        raise _entry_error(entry, f"{name}: the bounds must be finite")
    if not low < high:
        raise _entry_error(entry, f"{name}: LOW must be below HIGH, got {low} and {high}")
    if log and low <= 0:
        raise _entry_error(entry, f"{name}: a log range needs LOW > 0, got {low}")
    return low, high, log


def parse_param(cls: type, name: str, text: str, *, entry: str | None = None) -> Param:
    """Setting ``name`` of config class ``cls`` searched over ``text`` (the spec)."""
    from rlkit.configs.base import FieldValueError, field_specs, value_from_text

    entry = entry or f"{name}={text}"
    name = name.strip().replace("-", "_")
    text = text.strip()
    specs = field_specs(cls)
    if name not in specs:
        raise _entry_error(entry, f"{cls.__name__} has no setting {name!r}")
    if name in _NOT_SEARCHED:
        raise _entry_error(
            entry,
            f"{name} is not searched (the budget, seed, evaluation and launch settings are "
            "the search's own): give it as a flag",
        )
    spec = specs[name]
    if not text:
        raise _entry_error(entry, "write NAME=LOW:HIGH, NAME=log:LOW:HIGH or NAME=A|B|C")
    if "|" in text:
        if spec.kind is tuple:
            raise _entry_error(entry, f"{name} is a list setting, which is not searched")
        try:
            choices = tuple(value_from_text(spec, c.strip()) for c in text.split("|"))
        except FieldValueError as err:
            raise _entry_error(entry, f"{name}: {err}") from None
        if len(set(map(repr, choices))) != len(choices):
            raise _entry_error(entry, f"{name}: a choice is listed twice")
        return Param(name, "choice", choices=choices, text=text)
    parts = text.split(":")
    if spec.kind is float:
        if parts[0] == "int":
            raise _entry_error(entry, f"{name} is a float setting: write LOW:HIGH or log:LOW:HIGH")
        low, high, log = _range(entry, name, spec, parts, "float")
        return Param(name, "float", float(low), float(high), log, text=text)
    if spec.kind is int:
        if parts[0] != "int":
            raise _entry_error(
                entry, f"{name} is an int setting: write int:LOW:HIGH, int:log:LOW:HIGH or A|B|C"
            )
        low, high, log = _range(entry, name, spec, parts[1:], "int")
        return Param(name, "int", int(low), int(high), log, text=text)
    raise _entry_error(
        entry, f"{name} takes {spec.expected}: search it over choices, e.g. {name}=A|B"
    )


def _yaml_params(cls: type, path: str) -> list[Param]:
    import yaml

    file = Path(path)
    try:
        data = yaml.safe_load(file.read_text()) or {}
    except yaml.YAMLError as err:
        raise ValueError(
            f"--search-space {path!r} is not valid YAML ({type(err).__name__})"
        ) from None
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"--search-space {path!r} cannot be read ({err})") from None
    if not isinstance(data, Mapping):
        raise ValueError(f"--search-space {path!r} must hold a mapping of setting names to specs")
    params = []
    for name, spec in data.items():
        entry = f"{path!r}: {name}"
        if isinstance(spec, str):
            text = spec
        elif isinstance(spec, (list, tuple)) and spec:
            text = "|".join(_scalar_text(v) for v in spec)
        elif isinstance(spec, Mapping) and {"low", "high"} <= set(spec):
            unknown = set(spec) - {"low", "high", "log", "int"}
            if unknown:
                raise _entry_error(entry, f"unknown keys {sorted(unknown)} (low, high, log, int)")
            head = ("int:" if spec.get("int") else "") + ("log:" if spec.get("log") else "")
            text = f"{head}{_scalar_text(spec['low'])}:{_scalar_text(spec['high'])}"
        else:
            raise _entry_error(
                entry,
                "write a quoted spec ('log:1e-5:1e-2'), a list of choices or "
                "{low: ..., high: ..., log: true}",
            )
        params.append(parse_param(cls, str(name), text, entry=entry))
    return params


def _scalar_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _is_file(entry: str) -> bool:
    return "=" not in entry and (entry.endswith((".yaml", ".yml")) or Path(entry).is_file())


def parse_space(cfg: Any) -> list[Param]:
    """``cfg.search_space`` as :class:`Param` s, in the order given, each checked against the
    config: the name a setting of ``cfg`` that a search may vary, the values of its type,
    and ``cfg`` with each bound (each choice) valid as a config. Raises a one-line
    ``ValueError`` naming the entry."""
    cls = type(cfg)
    params: list[Param] = []
    for entry in cfg.search_space or ():
        entry = str(entry).strip()
        if _is_file(entry):
            if not Path(entry).is_file():
                raise ValueError(f"--search-space {entry!r}: no such file (a YAML file of specs)")
            params += _yaml_params(cls, entry)
            continue
        name, sep, text = entry.partition("=")
        if not sep:
            raise _entry_error(
                entry, "write NAME=SPEC (e.g. lr=log:1e-5:1e-2) or the path of a YAML file"
            )
        params.append(parse_param(cls, name, text, entry=entry))
    seen: set[str] = set()
    for p in params:
        if p.name in seen:
            raise ValueError(f"--search-space {p.name} is given twice: give one spec per setting")
        seen.add(p.name)
        for value in p.values:  # the config's own validation, as the flag would have it
            try:
                trial_config(cfg, {p.name: value})
            except ValueError as err:
                raise ValueError(f"--search-space {p.name}={p.text}: {err}") from None
    return params


def trial_config(cfg: Any, params: Mapping[str, Any], **changes: Any) -> Any:
    """The config of one trial: ``cfg`` with ``params``, without the search's own settings
    (their defaults), validated as a config."""
    defaults = {f.name: f.default for f in dataclasses.fields(cfg) if f.name in SEARCH_FIELDS}
    return dataclasses.replace(cfg, **defaults, **changes, **dict(params))


def check_search(cfg: Any) -> None:
    """``--search`` and its settings, at parse time."""
    if cfg.search < 0:
        raise ValueError(f"--search must be >= 0 (the number of trials), got {cfg.search}")
    if cfg.search_batch < 1:
        raise ValueError(f"--search-batch must be >= 1, got {cfg.search_batch}")
    if not cfg.search:
        if cfg.search_space:
            raise ValueError("--search-space needs --search N: the number of trials to run")
        return
    if not cfg.search_space:
        raise ValueError(
            "--search N needs --search-space, e.g. --search-space lr=log:1e-5:1e-2 "
            "entropy_coef=0:0.05 (docs/search.md)"
        )
    if cfg.population > 1 or cfg.sweep:
        raise ValueError(
            "--search trains its own populations (--search-batch): drop --population / --sweep"
        )
    if cfg.eval_only or cfg.init_from:
        raise ValueError("--search trains new runs: drop --eval-only / --init-from")
    if cfg.resume not in (None, "last"):
        raise ValueError(
            "--search continues a search with --resume last --run-dir DIR (its study.db), "
            "or by running the same command again"
        )
    if cfg.devices != "1" or cfg.num_nodes != 1:
        raise ValueError("--search runs in one process: drop --devices / --num-nodes")
    parse_space(cfg)


def sweepable(cfg: Any, params: Sequence[Param]) -> str | None:
    """Why ``params`` cannot be members' settings of one population (``None``: they can):
    as ``--sweep``, only float and bool settings that leave the shared env alone."""
    from rlkit.configs.base import _NOT_SWEPT, field_specs, population_env_options

    specs = field_specs(type(cfg))
    shared = population_env_options(cfg)
    for p in params:
        if p.name in _NOT_SWEPT or specs[p.name].kind not in (float, bool):
            return f"{p.name} is not a float or bool setting, which members of one population vary"
        for value in p.values:
            if population_env_options(dataclasses.replace(cfg, **{p.name: value})) != shared:
                return f"{p.name} changes the training env, which the members share"
    return None
