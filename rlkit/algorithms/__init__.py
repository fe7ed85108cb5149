"""Each algorithm in one module: its config, presets, networks wiring, learner and ``main``.

``rlkit.algorithms.<name>`` is what ``recipes/<name>.py`` runs; research code imports the
same config, presets and ``build`` from any directory::

    from rlkit.algorithms import ppo
    cfg = ppo.PPOConfig(total_frames=20_000)
    summary = ppo.main(["--total-frames", "20000", "--progress", "false"])
"""

from __future__ import annotations

import importlib
from types import ModuleType

#: every algorithm, by the name of its module and recipe
NAMES = ("a2c", "appo", "daac", "dqn", "impala", "ppg", "ppo", "rnd", "sac", "svpg")


def load(name: str) -> ModuleType:
    """The module of algorithm ``name`` (``"ppo"``, ...)."""
    if name not in NAMES:
        raise ValueError(f"unknown algorithm {name!r}; known: {', '.join(NAMES)}")
    return importlib.import_module(f"rlkit.algorithms.{name}")
