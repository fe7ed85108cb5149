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


def config_class(name: str) -> type:
    """The config dataclass that algorithm ``name``'s ``main`` parses: the module's own
    ``TrainConfig`` subclass that no other class of the module extends."""
    import dataclasses

    from rlkit.training.config import TrainConfig

    module = load(name)
    own = [
        v
        for v in vars(module).values()
        if isinstance(v, type)
        and issubclass(v, TrainConfig)
        and dataclasses.is_dataclass(v)
        and v.__module__ == module.__name__
    ]
    leaves = [c for c in own if not any(o is not c and issubclass(o, c) for o in own)]
    if len(leaves) != 1:
        raise RuntimeError(f"{module.__name__} declares configs {leaves}, expected one leaf")
    return leaves[0]
