"""The recipes' command line, without torch until the flags are parsed.

:func:`parse` parses a command line against an algorithm's torch-free config module
(:mod:`rlkit.configs.<name>`: config class, presets, the algorithm box shown by ``--help``),
so ``--help`` and a bad flag answer before torch, TensorDict, TorchRL or Lightning are
imported. :func:`cli` runs any ``main(argv)`` under the error handling below (a research
script's own recipe). :func:`rlkit.algorithms.recipe` is the two together, what
``recipes/<name>.py`` calls: the engine layer names no algorithm, it is handed one.

Errors: a bad input or a run file that could not be written ends the process with one line
``error: ...`` and exit status 2, a run that failed while training (NaN, an env fault, a lost
rank: :class:`~rlkit.training.errors.RunFailedError`) with status 3; ``RLKIT_TRACEBACK=1``
shows the traceback instead. A run stopped by SIGINT or SIGTERM (Ctrl-C, ``kill``) writes a
checkpoint, says how to resume and exits with ``128 + signal`` (130, 143;
:mod:`rlkit.training.signals`).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rlkit import _quiet
from rlkit.configs import base as _config
from rlkit.training.errors import (
    CheckpointError,
    CheckpointWriteError,
    RunFailedError,
    RunInterrupted,
)


def stored_settings(path: Path, *, cls: type | None = None) -> Mapping[str, Any] | None:
    """The run settings a checkpoint stores (its ``config``), or None when the file cannot be
    read (the engine names the problem with the file later, after the flags are checked).
    With ``cls``, settings that are not valid values of ``cls``'s fields in a checkpoint of
    another algorithm than ``cls``'s are refused as that (its algorithm, not a setting, is
    the problem). Imports torch: only a resume or ``--eval-only --init-from`` reads a
    checkpoint here."""
    from rlkit.training import checkpoint as ckpt

    try:
        payload = ckpt.load(path)
    except ckpt.CheckpointError:
        return None
    stored = payload.get("config")
    if cls is not None and isinstance(stored, Mapping):
        try:
            _config.stored_fields(stored, cls)
        except ValueError:  # parse_config refuses the setting, unless the algorithm differs
            algo = _algorithm_of(cls)
            if algo is not None:
                ckpt.check_compatible(payload, algo=algo, path=path)
    return stored


def _algorithm_of(cls: type) -> str | None:
    """The algorithm whose config ``cls`` is or extends (the nearest in its MRO of the
    ``CONFIG`` of :mod:`rlkit.configs.<name>`); None for a config of none."""
    from rlkit.configs import NAMES

    found: tuple[int, str] | None = None
    for name in NAMES:
        config = importlib.import_module(f"rlkit.configs.{name}").CONFIG
        if config in cls.__mro__:
            depth = cls.__mro__.index(config)
            if found is None or depth < found[0]:
                found = (depth, name)
    return found[1] if found else None


def parse_config(
    cls: type,
    argv: Sequence[str] | None = None,
    *,
    presets: Mapping[str, Mapping[str, Any]] | None = None,
    description: str | None = None,
):
    """:func:`rlkit.configs.base.parse_config` (defaults, presets, ``--config`` YAML, flags,
    validation) with the engine's checkpoint reader, so ``--resume`` continues the stored run's
    settings: what recipes and research scripts call."""

    def read(path: Path) -> Mapping[str, Any] | None:
        return stored_settings(path, cls=cls)

    return _config.parse_config(
        cls, argv, presets=presets, description=description, read_checkpoint=read
    )


#: Errors that mean "the user asked for something impossible": the CLI prints them as one line.
USER_ERRORS = (
    ValueError,
    TypeError,
    KeyError,
    FileNotFoundError,
    CheckpointError,
    CheckpointWriteError,
)


def cli(main: Callable[[list[str] | None], Any]) -> None:
    """Run a recipe's ``main`` from the command line.

    A bad input (unknown env id, wrong action space, corrupt checkpoint, ...) ends the process
    with a one-line ``error: ...`` and exit status 2 instead of a traceback; a run that
    failed while training (NaN, an env fault, a lost rank) exits with status 3; a run
    stopped by SIGINT or SIGTERM exits with 128 + the signal's number after its checkpoint.
    Set ``RLKIT_TRACEBACK=1`` to see the full traceback.
    """
    _quiet.install()
    try:
        main(None)
    except RunInterrupted as err:  # checkpointed; the engine has said how to resume
        if os.environ.get("RLKIT_TRACEBACK"):
            raise
        raise SystemExit(128 + err.signum) from None
    except KeyboardInterrupt as err:  # before the training loop, or a second signal
        if os.environ.get("RLKIT_TRACEBACK"):
            raise
        detail = str(err) or "the last checkpoint written, if any, is kept"
        print(f"interrupted: {detail}", file=sys.stderr)
        raise SystemExit(130) from None
    except RunFailedError as err:  # NaN, an env fault, a lost rank
        if os.environ.get("RLKIT_TRACEBACK"):
            raise
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(3) from None
    except USER_ERRORS as err:
        if os.environ.get("RLKIT_TRACEBACK"):
            raise
        message = str(err.args[0] if isinstance(err, KeyError) and err.args else err)
        print(f"error: {_one_line(message)}", file=sys.stderr)
        raise SystemExit(2) from None


def _one_line(message: str) -> str:
    """A multi-line message (the last line is the one that matters, e.g. a missing key and
    its fix) as one line: the last line first, the context after it."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    if len(lines) <= 1:
        return message.strip()
    return f"{lines[-1]} ({'; '.join(lines[:-1])})"


def parse(name: str, argv: Sequence[str] | None = None):
    """Algorithm ``name``'s config from ``argv`` (default: the command line), as
    ``recipes/<name>.py`` parses it: :func:`parse_config` with the
    config class, presets and description of :mod:`rlkit.configs.<name>`. Imports no torch
    (``--resume`` reads its checkpoint's settings with torch, imported then)."""
    from rlkit.configs import NAMES

    if name not in NAMES:
        raise ValueError(f"unknown algorithm {name!r}; known: {', '.join(NAMES)}")
    config = importlib.import_module(f"rlkit.configs.{name}")
    return parse_config(config.CONFIG, argv, presets=config.PRESETS, description=config.__doc__)
