"""Narrow work-arounds for measured third-party slow paths. Each names its evidence.

1. ``tensordict.TensorDict.from_any`` (tensordict 0.14.3) calls
   ``importlib.util.find_spec("pandas")`` every time it is given an object, and
   ``TensorDictModule`` passes every output tensor through it. Without pandas installed,
   each call searches ``sys.path`` again: measured 50-60 us per call here, 10 calls per PPO
   loss forward (0.5 ms of a 2.6 ms forward) and 2-3 per policy step during collection.
   The answer cannot change while the process runs unless pandas is installed meanwhile,
   so inside :func:`patched` (the engine's ``run``) ``tensordict.base`` gets an ``importlib``
   whose ``util.find_spec`` remembers answers; importing rlkit patches nothing.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import types
from collections.abc import Iterator


def _memoized_importlib() -> types.SimpleNamespace:
    find_spec = functools.lru_cache(maxsize=64)(importlib.util.find_spec)
    util = types.SimpleNamespace(**{**vars(importlib.util), "find_spec": find_spec})
    return types.SimpleNamespace(**{**vars(importlib), "util": util})


@contextlib.contextmanager
def patched() -> Iterator[None]:
    """Memoised ``find_spec`` for tensordict inside the block; the original comes back after."""
    try:
        import tensordict.base as td_base
    except ImportError:  # pragma: no cover - tensordict is a dependency
        yield
        return
    original = getattr(td_base, "importlib", None)
    if original is not importlib:  # patched already (nested runs) or changed by someone else
        yield
        return
    td_base.importlib = _memoized_importlib()
    try:
        yield
    finally:
        td_base.importlib = original


def skip_cpu_graph_capture_check(optimizer) -> None:
    """Drop Adam's per-step CUDA-graph capture check for an optimiser that runs on the CPU.

    2. torch 2.14's ``Adam.step`` calls ``Optimizer._accelerator_graph_capture_health_check``
       every step, which asks ``torch.accelerator.current_accelerator(check_available=True)``.
       On the CUDA build of torch with no GPU (these CI machines), CUDA's device count is not
       cached before CUDA initialises, so every step dlopens NVML again: 0.3-0.4 ms per
       optimiser step measured here, 10-15% of a PPO minibatch step. The check only guards
       CUDA/XPU graph capture, which cannot happen on CPU tensors.
    """
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if params and all(p.device.type == "cpu" for p in params):
        optimizer._accelerator_graph_capture_health_check = lambda: None
