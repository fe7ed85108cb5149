"""What ``--env`` names, torch-free: a gymnasium id, gymnasium's ``module:Env-vN``, or an env
factory ``module:qualname``.

- ``CartPole-v1``: a registered gymnasium id.
- ``mypkg.envs:Corridor-v0``: gymnasium's own syntax: ``mypkg.envs`` is imported (registering
  its envs), then ``Corridor-v0`` is made.
- ``mypkg.envs:make_corridor``: a callable of an importable module that returns an env (a
  gymnasium env, a gymnasium vector env or a TorchRL ``EnvBase``; see
  :func:`rlkit.envs.make_env`). The engine stores a Python factory's import path under this
  form, so a resumed run (and a recipe's ``--resume``) builds its env again.

After ``module:``, a registered gymnasium id wins over a callable of the same name. The
config layer calls :func:`resolve_env` when it parses ``--env`` (so an unimportable module or
an unknown id is refused before anything is built); :func:`rlkit.envs.make_env` calls it again
in every process that builds an env.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from typing import Any

__all__ = [
    "env_label",
    "factory_path",
    "importable",
    "not_importable",
    "resolve_env",
    "split_env_id",
]


def split_env_id(env: str) -> tuple[str | None, str]:
    """``"mypkg.envs:Corridor-v0"`` -> ``("mypkg.envs", "Corridor-v0")``; an id without a
    module -> ``(None, env)``."""
    if ":" not in env:
        return None, env
    module, _, name = env.partition(":")
    if not module or not name or ":" in name:
        raise ValueError(
            f"--env {env!r} is not MODULE:NAME: write e.g. mypkg.envs:Corridor-v0 (a module "
            "that registers the id, then the id) or mypkg.envs:make_env (a factory)"
        )
    return module, name


def _import(module: str, env: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as err:
        missing = getattr(err, "name", None)
        own = missing is None or module == missing or module.startswith(f"{missing}.")
        what = "" if own else f" (it imports {missing!r}, which is missing)"
        raise ValueError(
            f"--env {env!r}: cannot import module {module!r}{what}: {err}; install the "
            f"package that provides it or put its folder on PYTHONPATH"
        ) from None


def _attribute(root: Any, qualname: str) -> Any:
    obj = root
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def resolve_env(env: str) -> str | Callable[..., Any]:
    """What ``env`` names: a gymnasium id (returned without its module, the module imported)
    or an env factory (returned as the callable).

    Raises:
        ValueError: a module that cannot be imported, or a name that is neither a gymnasium
            id registered by the module nor a callable in it (one line each, with the fix).
    """
    if not isinstance(env, str):
        raise TypeError(f"env must be a gymnasium id string, got {type(env).__name__}")
    module, name = split_env_id(env)
    if module is None:
        return env
    root = _import(module, env)
    import gymnasium

    if name in gymnasium.registry:
        return name
    factory = None if "<" in name else _attribute(root, name)
    if callable(factory):
        return factory
    if not_importable(env):  # a lambda, a function inside another, a script's function
        raise ValueError(
            f"the run's env factory {env!r} cannot be imported here (a lambda, a function "
            "defined inside another or in a script): pass the factory again "
            "(train(cfg, env=factory) or run(..., env=factory)), or define it in a module"
        )
    raise ValueError(
        f"unknown environment {name!r}: importing {module!r} registered no gymnasium id "
        f"{name!r} and it has no callable of that name; register the id in {module!r} "
        "(gymnasium.register) or name a factory there"
    )


def factory_path(factory: Callable[..., Any]) -> str:
    """What a run stores as the ``env`` of ``factory``: its ``module:qualname`` when that
    imports back to ``factory`` itself, else a name marked as not importable by ``<...>``
    (``__main__:<lambda>``, ``mypkg:outer.<locals>.make``, ``functools:<partial>``), which
    :func:`resolve_env` refuses with the fix (pass the factory again)."""
    module = getattr(factory, "__module__", None) or "__main__"
    qualname = getattr(factory, "__qualname__", None)
    if qualname is None:  # a functools.partial, an instance with __call__
        return f"{module}:<{type(factory).__qualname__}>"
    path = f"{module}:{qualname}"
    if "<" in qualname or importable(factory):
        return path
    return f"{module}:<{qualname}>"


def importable(factory: Callable[..., Any]) -> bool:
    """True when ``module:qualname`` of ``factory`` imports back to ``factory`` itself."""
    module = getattr(factory, "__module__", None)
    qualname = getattr(factory, "__qualname__", None)
    if not module or not qualname:
        return False
    try:
        root = importlib.import_module(module)
    except ImportError:
        return False
    return _attribute(root, qualname) is factory


def not_importable(env: str) -> bool:
    """True for a stored factory name that no process can import (:func:`factory_path`'s
    ``<...>`` names, or a script's ``__main__``): checked where a factory was passed."""
    module, name = split_env_id(env)
    return module is not None and ("<" in name or module == "__main__")


def env_label(env: str) -> str:
    """A file-name-safe short name of ``env`` for run directories: the id without its
    module, or the factory's name (``rlkit/MountainCarSparse-v0`` -> ``rlkit-MountainCarSparse-v0``,
    ``mypkg.envs:Corridor-v0`` -> ``Corridor-v0``, ``__main__:<lambda>`` -> ``lambda``)."""
    if ":" in env:
        name = env.rpartition(":")[2]
        if "." in name and not re.search(r"-v\d+$", name):  # a factory's qualname
            name = name.rpartition(".")[2]
    else:
        name = env
    name = re.sub(r"[^\w.-]+", "-", name.replace("/", "-")).strip("-.")
    return name or "env"
