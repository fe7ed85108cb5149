"""Checkpoints: atomic, tensor-only, safe to load.

A checkpoint is a plain dictionary of tensors, numbers, strings, lists and dicts, so it loads
with ``torch.load(..., weights_only=True)``: loading never executes code from the file.
It is written to a temporary file in the same directory, flushed to disk and renamed over the
destination, so a crash leaves either the old file or the new one, never half of one.

Layout::

    {"format": FORMAT, "algo": "ppo", "env": "CartPole-v1",
     "modules": {name: state_dict}, "optimizers": {name: state_dict},
     "counters": {"frames": int, "batches": int, ...}, "algo_state": {...},
     "rng": {...}, "config": {...}}
"""

from __future__ import annotations

import io
import os
import pickle
import random
import tempfile
import zipfile
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase
from torch import nn

from rlkit.training.errors import CheckpointError  # defined torch-free, for the command line

FORMAT = "rlkit-checkpoint/1"


def to_cpu(obj: Any, _memo: dict[int, torch.Tensor] | None = None) -> Any:
    """``obj`` with every tensor in its dicts, lists and tuples on the CPU. A tensor already
    there is not copied; one GPU tensor met twice (tied weights) is copied once, so the file
    stores it once, as a CPU run's does."""
    memo = {} if _memo is None else _memo
    if isinstance(obj, torch.Tensor):
        if obj.device.type == "cpu":
            return obj.detach()
        if id(obj) not in memo:
            memo[id(obj)] = obj.detach().to("cpu")
        return memo[id(obj)]
    if isinstance(obj, TensorDictBase):
        raise TypeError("a checkpoint holds plain dicts of tensors: call .to_dict() first")
    if isinstance(obj, Mapping):
        out = {k: to_cpu(v, memo) for k, v in obj.items()}
        if isinstance(obj, OrderedDict):  # a state_dict: keep its version metadata
            out = OrderedDict(out)
            if hasattr(obj, "_metadata"):
                out._metadata = obj._metadata
        return out
    if isinstance(obj, list):
        return [to_cpu(v, memo) for v in obj]
    if isinstance(obj, tuple):
        items = [to_cpu(v, memo) for v in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    return obj


def atomic_save(obj: Any, path: str | os.PathLike) -> Path:
    """``torch.save`` to ``path`` through a temporary file and an atomic rename. Tensors are
    written from the CPU (:func:`to_cpu`), so a run trained on a GPU writes a file that loads
    anywhere, even without ``map_location``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    torch.save(to_cpu(obj), buffer)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(buffer.getbuffer())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def safe_load(
    path: str | os.PathLike,
    *,
    what: str = "checkpoint",
    example: str = "<run-dir>/checkpoints/last.pt",
    remedy: str = "use an earlier checkpoint or start a new run",
) -> Any:
    """``torch.load(path, weights_only=True)`` on the CPU: loading never executes code from
    the file. A missing, truncated, corrupt or unsafe file raises :class:`CheckpointError`
    naming ``what`` it should have been (``example``: where such files live) and the
    ``remedy``."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(
            f"{what} {str(path)!r} does not exist: pass the path of a .pt file written by "
            f"an rlkit run ({example})"
        )
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, pickle.UnpicklingError, EOFError, zipfile.BadZipFile, OSError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(
            f"{what} {str(path)!r} is corrupt or not a safe rlkit {what} ({first}); {remedy}"
        ) from None


def load(path: str | os.PathLike) -> dict[str, Any]:
    """Load an rlkit checkpoint with ``weights_only=True`` and check its format."""
    path = Path(path)
    payload = safe_load(path)
    if not isinstance(payload, Mapping) or payload.get("format") != FORMAT:
        raise CheckpointError(
            f"{str(path)!r} is not an rlkit checkpoint (expected format {FORMAT!r}); "
            "pass a file from <run-dir>/checkpoints/"
        )
    return dict(payload)


def check_compatible(payload: Mapping[str, Any], *, algo: str, path: str | os.PathLike) -> None:
    """Raise when a checkpoint was written by another algorithm."""
    if payload.get("algo") != algo:
        raise CheckpointError(
            f"checkpoint {str(path)!r} was written by algorithm {payload.get('algo')!r}, "
            f"but this recipe is {algo!r}: use a checkpoint from a {algo} run"
        )


def load_module_state(module: nn.Module, state: Mapping[str, Any], *, name: str, path) -> None:
    """``load_state_dict`` with a message that names the mismatching tensors."""
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    mismatched = [
        f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
        for k in own
        if k in state and hasattr(state[k], "shape") and state[k].shape != own[k].shape
    ]
    if missing or unexpected or mismatched:
        details = "; ".join(
            part
            for part in (
                f"missing {missing[:5]}" if missing else "",
                f"unexpected {unexpected[:5]}" if unexpected else "",
                f"shape mismatch {mismatched[:3]}" if mismatched else "",
            )
            if part
        )
        raise CheckpointError(
            f"checkpoint {str(path)!r} does not fit module {name!r} ({details}): it was written "
            "for other network sizes or another environment; use matching flags "
            "(see config in the checkpoint) or start a new run"
        )
    module.load_state_dict(state)


def all_finite(modules: Mapping[str, nn.Module]) -> bool:
    """True when every parameter and floating buffer is finite."""
    for module in modules.values():
        for t in list(module.parameters()) + list(module.buffers()):
            if t.is_floating_point() and not torch.isfinite(t).all():
                return False
    return True


# --------------------------------------------------------------------------- RNG state


def rng_state() -> dict[str, Any]:
    """Python, numpy and torch RNG states as tensors and plain containers; with CUDA in use,
    every GPU's generator too (a GPU run samples its actions there)."""
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    py_version, py_state, py_gauss = random.getstate()
    cuda = {}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        cuda = {"cuda": list(torch.cuda.get_rng_state_all())}
    return cuda | {
        "torch": torch.get_rng_state(),
        "numpy": {
            "name": np_name,
            "keys": torch.from_numpy(np_keys.astype(np.int64)),
            "pos": int(np_pos),
            "has_gauss": int(np_has_gauss),
            "gauss": float(np_gauss),
        },
        "python": {"version": py_version, "state": list(py_state), "gauss": py_gauss},
    }


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore what :func:`rng_state` captured. GPU generators are restored on the GPUs
    this process has (a GPU run resumed on the CPU samples from the CPU's stream anyway)."""
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        for index, cuda_state in enumerate(state["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(cuda_state, index)
    n = state["numpy"]
    np.random.set_state(
        (n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"])
    )
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss"]))
