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
import random
import struct
import tempfile
import warnings
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


#: The archive checks made before a file reaches ``torch.load`` (:func:`check_archive`).
#: ``torch.save`` stores its members uncompressed, so the sizes an rlkit checkpoint declares
#: add up to about its own size (its members are padded to 64 bytes: the total is a little
#: less). A zip whose members declare far more than the file holds (a compressed member, a
#: forged size) would be inflated whole into memory by ``torch.load``: refused when the
#: declared total exceeds both :data:`MAX_INFLATION` x the file's size and
#: :data:`INFLATION_FLOOR`.
MAX_INFLATION = 64
INFLATION_FLOOR = 1 << 20
#: members: one per tensor storage plus 6 of torch's own; a run's checkpoint has tens to a
#: few thousands (a replay buffer adds a handful). The count is read from the archive's end
#: record before its directory is parsed (each entry costs ~0.5 KB of memory to parse).
MAX_MEMBERS = 100_000
#: path depth of a member name: torch writes ``archive/data/0`` (3 parts)
MAX_DEPTH = 8
#: the last bytes of a zip that hold its end record (22 bytes and a comment of up to 64 KiB)
_END_SEARCH = 22 + (1 << 16)


def safe_load(
    path: str | os.PathLike,
    *,
    what: str = "checkpoint",
    example: str = "<run-dir>/checkpoints/last.pt",
    remedy: str = "use an earlier checkpoint or start a new run",
) -> Any:
    """``torch.load(path, weights_only=True)`` on the CPU: loading never executes code from
    the file. The archive is checked first (:func:`check_archive`: a zip, its members' CRCs,
    sizes in proportion to the file's); a missing, truncated, corrupt, oversized or unsafe
    file, and any failure of reading or unpickling it, raises :class:`CheckpointError` in one
    line naming the file, what it should have been (``what``; ``example``: where such files
    live) and the ``remedy``."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(
            f"{what} {str(path)!r} does not exist: pass the path of a .pt file written by "
            f"an rlkit run ({example})"
        )
    check_archive(path, what=what, remedy=remedy)
    try:
        with warnings.catch_warnings():  # torch warns about odd pickle protocols: one line
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # any failure of torch's reader or unpickler (IndexError, ...)
        raise CheckpointError(
            f"{what} {str(path)!r} is corrupt or not a safe rlkit {what} ({_first_line(err)}); "
            f"{remedy}"
        ) from None


def _first_line(err: BaseException, limit: int = 160) -> str:
    text = str(err).strip()
    first = text.splitlines()[0] if text else ""
    first = f"{type(err).__name__}: {first}" if first else type(err).__name__
    return first if len(first) <= limit else first[: limit - 3] + "..."


def check_archive(path: Path, *, what: str = "checkpoint", remedy: str = "") -> None:
    """Refuse, before anything is loaded, a file that is not a zip archive (``torch.save``'s
    format: a truncated file has lost its directory), that declares more than
    :data:`MAX_MEMBERS` members or names nested deeper than :data:`MAX_DEPTH`, whose members
    declare an uncompressed total out of proportion to the file (:data:`MAX_INFLATION`,
    :data:`INFLATION_FLOOR`), or whose members' data do not match their CRC-32 (a flipped
    bit). Memory stays bounded: the members are streamed in 1 MiB chunks, never inflated
    whole."""
    name = str(path)

    def refuse(problem: str) -> CheckpointError:
        return CheckpointError(f"{what} {name!r} {problem}; {remedy or 'start a new run'}")

    def corrupt(problem: str) -> CheckpointError:
        return refuse(f"is corrupt or not a safe rlkit {what} ({problem})")

    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            count = _declared_members(f, size)
            if count is None:
                raise corrupt("not a zip archive, torch's format: truncated or another file")
            if count > MAX_MEMBERS:
                raise refuse(f"declares {count:,} members (at most {MAX_MEMBERS:,})")
            with zipfile.ZipFile(f) as archive:
                infos = archive.infolist()
                _check_members(infos, size, refuse)
                _check_crcs(archive, infos)
    except CheckpointError:
        raise
    except Exception as err:  # BadZipFile (a bad CRC, a bad header), struct.error, OSError...
        raise corrupt(_first_line(err)) from None


def _check_members(infos: list[zipfile.ZipInfo], size: int, refuse) -> None:
    if len(infos) > MAX_MEMBERS:
        raise refuse(f"holds {len(infos):,} members (at most {MAX_MEMBERS:,})")
    deep = next((i.filename for i in infos if i.filename.count("/") >= MAX_DEPTH), None)
    if deep is not None:
        raise refuse(f"nests member {deep[:80]!r} deeper than {MAX_DEPTH} levels")
    declared = sum(i.file_size for i in infos)
    if declared > MAX_INFLATION * size and declared > INFLATION_FLOOR:
        raise refuse(
            f"declares {declared / 2**20:,.1f} MiB uncompressed in a {size / 2**20:,.2f} MiB "
            f"file (more than {MAX_INFLATION}x: a zip bomb or a forged size; torch.save "
            "writes its members uncompressed)"
        )


def _check_crcs(archive: zipfile.ZipFile, infos: list[zipfile.ZipInfo]) -> None:
    """Read every member in chunks: zipfile raises BadZipFile at the end of one whose data
    do not match its CRC-32. A file torch wrote without CRCs (all zero) is not checked."""
    if not any(i.CRC for i in infos):
        return
    for info in infos:
        with archive.open(info) as member:
            while member.read(1 << 20):
                pass


def _declared_members(f, size: int) -> int | None:
    """The member count of a zip's end record (zip64's where the record defers to it), read
    before the directory is parsed; None when the file has no end record."""
    f.seek(max(0, size - _END_SEARCH))
    tail = f.read()
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) - at < 22:
        return None
    (count,) = struct.unpack("<H", tail[at + 10 : at + 12])
    locator = at - 20
    if count == 0xFFFF and locator >= 0 and tail[locator : locator + 4] == b"PK\x06\x07":
        (offset,) = struct.unpack("<Q", tail[locator + 8 : locator + 16])
        f.seek(offset)
        record = f.read(56)
        if len(record) == 56 and record[:4] == b"PK\x06\x06":
            (count,) = struct.unpack("<Q", record[32:40])
    return count


#: the parts of every rlkit checkpoint (:mod:`rlkit.training.engine` writes them): the type
#: each must have, and whether it must be there
_LAYOUT: dict[str, tuple[type, bool]] = {
    "algo": (str, True),
    "modules": (Mapping, True),
    "optimizers": (Mapping, True),
    "counters": (Mapping, True),
    "env": (str, False),
    "learner": (Mapping, False),
    "rng": (Mapping, False),
    "config": (Mapping, False),
    "world_size": (int, False),
    "save_id": (str, False),
}


def check_layout(payload: Mapping[str, Any], path: str | os.PathLike) -> None:
    """Raise :class:`CheckpointError` when a checkpoint lacks a part every rlkit checkpoint
    has (its networks, optimisers, counters) or holds one of another type: a file edited or
    corrupted into a valid pickle fails here, in one line, not in the engine's resume."""

    def refuse(problem: str) -> CheckpointError:
        return CheckpointError(
            f"checkpoint {str(path)!r} {problem}: it is damaged or was not written by an rlkit "
            "run; use an earlier checkpoint (<run-dir>/checkpoints/) or start a new run"
        )

    for key, (kind, required) in _LAYOUT.items():
        if key not in payload:
            if required:
                raise refuse(f"has no {key!r}")
            continue
        if not isinstance(payload[key], kind) or isinstance(payload[key], bool):
            raise refuse(f"holds a {type(payload[key]).__name__} as {key!r}")
    for name, state in payload["modules"].items():
        if not isinstance(state, Mapping):
            raise refuse(f"holds a {type(state).__name__} as the state of module {name!r}")
    for name, state in payload["optimizers"].items():
        if not isinstance(state, Mapping):
            raise refuse(f"holds a {type(state).__name__} as the state of optimizer {name!r}")
    frames = payload["counters"].get("frames")
    if not isinstance(frames, int) or isinstance(frames, bool) or frames < 0:
        raise refuse("has no frame count (counters['frames'])")


def load(path: str | os.PathLike) -> dict[str, Any]:
    """Load an rlkit checkpoint with ``weights_only=True`` (:func:`safe_load`) and check its
    format and layout (:func:`check_layout`)."""
    path = Path(path)
    payload = safe_load(path)
    if not isinstance(payload, Mapping) or payload.get("format") != FORMAT:
        raise CheckpointError(
            f"{str(path)!r} is not an rlkit checkpoint (expected format {FORMAT!r}); "
            "pass a file from <run-dir>/checkpoints/"
        )
    check_layout(payload, path)
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
