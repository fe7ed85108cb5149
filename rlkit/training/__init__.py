"""The training engine on Lightning Fabric: config parsing, the loop, the one update loop,
checkpoints, evaluation and logs. Algorithms live in :mod:`rlkit.algorithms`.

Importing this package imports no torch: config parsing (:mod:`rlkit.configs.base`) and
the command line (:mod:`rlkit.training.cli`) are torch-free, so a recipe's ``--help``
answers at once; the engine's names (``run``, ``Engine``, ``Context``, ``Learner``) are
imported from :mod:`rlkit.training.engine` on first use (PEP 562).
"""

import importlib
from typing import Any

from rlkit.configs.base import TrainConfig

# ``cli`` the function, bound here so that it, not the submodule of the same name, is
# ``rlkit.training.cli`` once ``rlkit.training.cli`` (the module) has been imported
from rlkit.training.cli import cli, parse_config
from rlkit.training.errors import CheckpointError, NonFiniteError, RunInterrupted

#: names imported from the engine (torch, TensorDict, Lightning) when first asked for
_LAZY = {name: "rlkit.training.engine" for name in ("Context", "Engine", "Learner", "run")}
_LAZY["Callback"] = "rlkit.training.runlog"  # research code's hooks into a run


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "Callback",
    "CheckpointError",
    "Context",
    "Engine",
    "Learner",
    "NonFiniteError",
    "RunInterrupted",
    "TrainConfig",
    "cli",
    "parse_config",
    "run",
]
