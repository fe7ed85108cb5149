"""docs/seeds.md: every item of the five seed pages with rlkit's flag or API.

The tables are read as written: every ``recipe.py --flag`` cell must name a flag of that
recipe's parser (built in process, as ``--help`` prints it), every ``rlkit.module.Name``
cell must import, and ``Name(arg=)`` must name a parameter of ``Name``'s signature. Every
row has one of the allowed statuses, and the summary at the top matches the tables.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import re
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "seeds.md"
HEADER = ["seed item", "rlkit", "status", "notes"]
STATUSES = ("same", "differs", "not copied", "missing")

FLAG = re.compile(r"^(?P<recipe>[a-z0-9_]+)\.py(?P<rest>(?: .*)?)$")
API = re.compile(r"^(?P<path>rlkit(?:\.[A-Za-z_]\w*)+)(?:\((?P<arg>[A-Za-z_]\w*)=\))?$")


@dataclasses.dataclass(frozen=True)
class Row:
    section: str
    line: int
    item: str
    rlkit: str
    status: str
    notes: str


def _cells(line: str) -> list[str]:
    # a cell may hold a literal | as \| (escaped for the Markdown table)
    parts = re.split(r"(?<!\\)\|", line.strip().strip("|"))
    return [p.strip().replace("\\|", "|") for p in parts]


def parse(text: str) -> tuple[list[Row], dict[str, int]]:
    """The seed tables' rows, and the summary's counts by status."""
    rows: list[Row] = []
    summary: dict[str, int] = {}
    section, table = "", None
    for number, line in enumerate(text.splitlines(), start=1):
        if line.startswith("## "):
            section, table = line[3:].strip(), None
            continue
        if not line.startswith("|"):
            table = None
            continue
        cells = _cells(line)
        if table is None:  # a table's header row
            table = "seed" if [c.lower() for c in cells] == HEADER else cells[0].lower()
            continue
        if set(line.replace("|", "").strip()) <= set("-: "):  # separator row
            continue
        if table == "seed":
            assert len(cells) == 4, f"docs/seeds.md:{number}: {len(cells)} cells, not 4"
            rows.append(Row(section, number, *cells))
        elif table == "status" and cells[0].strip("`*") in STATUSES:
            summary[cells[0].strip("`*")] = int(cells[1].strip("*"))
    return rows, summary


@functools.cache
def rows_and_summary() -> tuple[list[Row], dict[str, int]]:
    return parse(DOC.read_text())


def per_section(rows: list[Row]) -> str:
    counts = Counter(r.section.split(" (")[0] for r in rows)
    return "; ".join(f"{s}: {n} rows" for s, n in counts.items()) + f"; total {len(rows)}"


def references(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


@functools.cache
def recipe_flags(recipe: str) -> frozenset[str]:
    """The ``--flags`` of ``recipes/<recipe>.py``: its config's parser, built in process."""
    from rlkit import algorithms
    from rlkit.configs.base import build_parser

    parser = build_parser(algorithms.config_class(recipe))
    return frozenset(s for a in parser._actions for s in a.option_strings if s.startswith("--"))


def resolve(path: str):
    """``rlkit.a.b.Name.attr``: import the longest module prefix, then the attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)  # AttributeError: the API does not exist
        return obj
    raise ModuleNotFoundError(path)


def _flag_problems(ref: str, recipe: str, rest: str) -> list[str]:
    from rlkit import algorithms

    if recipe not in algorithms.NAMES:
        return [f"no recipe {recipe}.py"]
    flags = re.findall(r"(?<!\S)(--[a-z][a-z0-9-]*)", rest)
    if not flags:
        return [f"`{ref}` names no --flag"]
    return [f"{recipe}.py has no {flag}" for flag in flags if flag not in recipe_flags(recipe)]


def _api_problems(path: str, arg: str | None) -> list[str]:
    try:
        obj = resolve(path)
    except (ImportError, AttributeError) as err:
        return [f"{path} does not import ({err})"]
    if arg:
        try:
            params = inspect.signature(obj).parameters
        except (TypeError, ValueError):
            params = {}
        if arg not in params:
            return [f"{path} has no parameter {arg!r}"]
    return []


def problems(rows: list[Row]) -> list[str]:
    """Every reference of the rlkit column that does not resolve, one line each."""
    out = []
    for row in rows:
        where = f"docs/seeds.md:{row.line} ({row.item})"
        for ref in references(row.rlkit):
            if m := FLAG.match(ref):
                found = _flag_problems(ref, m["recipe"], m["rest"])
            elif m := API.match(ref):
                found = _api_problems(m["path"], m["arg"])
            else:
                found = [f"`{ref}` is neither `recipe.py --flag` nor `rlkit.module.Name`"]
            out += [f"{where}: {problem}" for problem in found]
    return out


def test_every_row_has_an_allowed_status_and_every_section_rows():
    rows, _ = rows_and_summary()
    counts = per_section(rows)
    bad = [f"docs/seeds.md:{r.line}: {r.status!r}" for r in rows if r.status not in STATUSES]
    assert not bad, f"statuses must be one of {STATUSES}: {bad} ({counts})"
    sections = Counter(r.section for r in rows)
    assert len(sections) == 5 and all(n >= 10 for n in sections.values()), counts
    assert len(rows) >= 170, counts
    empty = [
        f"docs/seeds.md:{r.line}"
        for r in rows
        if not r.item or (r.status in ("differs", "not copied", "missing") and not r.notes)
    ]
    assert not empty, (
        f"rows without a seed item, or without the notes their status needs: {empty} ({counts})"
    )
    unnamed = [
        f"docs/seeds.md:{r.line} ({r.item})"
        for r in rows
        if r.status in ("same", "differs") and not references(r.rlkit)
    ]
    assert not unnamed, f"same / differs rows must name a flag or an API: {unnamed} ({counts})"


def test_summary_matches_the_tables():
    rows, summary = rows_and_summary()
    counted = {s: sum(r.status == s for r in rows) for s in STATUSES}
    assert summary == counted, f"summary {summary} != tables {counted} ({per_section(rows)})"


def test_every_named_flag_and_api_exists():
    rows, _ = rows_and_summary()
    found = problems(rows)
    assert not found, "\n".join(found) + f"\n({per_section(rows)})"


@pytest.mark.parametrize(
    "cell",
    [
        "`ppo.py --no-such-flag`",
        "`dqn.py --gae-lambda`",
        "`rlkit.value.NoSuchEstimator`",
        "`rlkit.value.vtrace(no_such_arg=)`",
        "`rlkit.no_such_module.X`",
        "`nosuch.py --lr`",
        "`--lr`",
    ],
)
def test_a_missing_flag_or_api_fails(cell):
    """The check itself: a bogus reference is reported."""
    row = Row("test", 0, "bogus", cell, "same", "bogus")
    assert problems([row])


def test_real_references_pass():
    row = Row(
        "test",
        0,
        "real",
        "`ppo.py --lr-schedule kl --kl-target`, `rlkit.value.vtrace(adv_mode=)`, "
        "`rlkit.algorithms.ppg.PPGLearner`",
        "same",
        "real",
    )
    assert problems([row]) == []
