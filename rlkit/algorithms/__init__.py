"""Each algorithm in one module: its networks wiring, learner, ``build``, ``train`` and ``main``.

``rlkit.algorithms.<name>`` is what ``recipes/<name>.py`` trains; its config and presets are
declared torch-free in :mod:`rlkit.configs.<name>` (the recipe parses its flags there, so
``--help`` imports no torch) and imported here under the same names. Research code imports
the config, presets and ``build`` from any directory::

    from rlkit.algorithms import ppo
    cfg = ppo.PPOConfig(total_frames=20_000)
    summary = ppo.main(["--total-frames", "20000", "--progress", "false"])
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from types import ModuleType

from rlkit.configs import NAMES

__all__ = ["NAMES", "config_class", "load", "recipe"]


def load(name: str) -> ModuleType:
    """The module of algorithm ``name`` (``"ppo"``, ...)."""
    if name not in NAMES:
        raise ValueError(f"unknown algorithm {name!r}; known: {', '.join(NAMES)}")
    return importlib.import_module(f"rlkit.algorithms.{name}")


def config_class(name: str) -> type:
    """The config dataclass that algorithm ``name``'s ``main`` (and ``recipes/<name>.py``)
    parses: ``CONFIG`` of its torch-free config module :mod:`rlkit.configs.<name>` (imports
    no torch)."""
    if name not in NAMES:
        raise ValueError(f"unknown algorithm {name!r}; known: {', '.join(NAMES)}")
    return importlib.import_module(f"rlkit.configs.{name}").CONFIG


def recipe(name: str, argv: Sequence[str] | None = None) -> None:
    """``recipes/<name>.py``: parse the flags (:func:`rlkit.training.cli.parse`; ``--help``
    exits there, before torch is imported), then ``rlkit.algorithms.<name>.train(cfg)``,
    under :func:`rlkit.training.cli.cli`'s error handling. A recipe is three lines::

        from rlkit.algorithms import recipe

        if __name__ == "__main__":
            recipe("ppo")
    """
    from rlkit.training.cli import cli, parse

    def main(args: list[str] | None) -> dict:
        cfg = parse(name, argv if args is None else args)
        return load(name).train(cfg)

    cli(main)
