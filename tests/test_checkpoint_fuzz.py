"""The checkpoint loader turns every failure into its one line (issue 51).

Before, of 400 random 4 KB files given to ``--resume`` 37 got past the loader's refusal
(``IndexError: pop from empty list`` from torch's unpickler, ``error: 133`` from a KeyError,
``UnicodeDecodeError``), a bit flipped in a tensor loaded silently, and a zip bomb (a
compressed member, unknown to the run) was inflated whole. Here every file below, given to
the loading function both ``--resume`` and ``--init-from`` go through
(:func:`rlkit.training.checkpoint.load`) and to the settings reader of ``--resume``'s parse
(:func:`rlkit.training.cli.stored_settings`), must end in a :class:`CheckpointError` (one of
the command line's user errors) whose message is one line naming the file, or load exactly
what was saved (a flip in zip metadata nothing reads): random bytes, truncations and
bit flips of a real checkpoint, and crafted archives (a zip bomb, a forged size, a forged
member count, too many members, deep nesting, a foreign compression, a pickle nested
100,000 deep, a valid pickle of the wrong layout). The zip bomb's refusal allocates under
1 MiB and never reaches ``torch.load``. Two cases run the recipes in process: ``ppo
--resume`` and ``sac --init-from`` of a corrupt file, exit 2 and one line.
"""

from __future__ import annotations

import io
import random
import struct
import sys
import tracemalloc
import zipfile
from pathlib import Path

import pytest
import torch

from rlkit.algorithms import load as load_algorithm
from rlkit.training import checkpoint as ckpt
from rlkit.training import cli
from rlkit.training.cli import USER_ERRORS, stored_settings

#: fuzz cases per kind; derandomised (seeded)
RANDOM_FILES, TRUNCATIONS, FLIPS = 60, 30, 60


@pytest.fixture(scope="module")
def real(tmp_path_factory) -> Path:
    """A PPO run's checkpoint (64 frames)."""
    run_dir = tmp_path_factory.mktemp("fuzz") / "run"
    flags = ["--num-envs", "2", "--rollout-steps", "32", "--minibatch-size", "32"]
    flags += ["--epochs", "1", "--total-frames", "64", "--eval-episodes", "1"]
    flags += ["--eval-max-steps", "5", "--progress", "false", "--hidden", "16"]
    load_algorithm("ppo").main([*flags, "--run-dir", str(run_dir)])
    return run_dir / "checkpoints" / "last.pt"


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return a == b or (a != a and b != b)


def check(path: Path, original: dict | None = None) -> str:
    """The file is refused in one line naming it, or loads exactly ``original``."""
    try:
        payload = ckpt.load(path)
    except ckpt.CheckpointError as err:
        assert isinstance(err, USER_ERRORS)
        message = str(err)
        assert "\n" not in message and str(path) in message, message
        assert stored_settings(path) is None  # --resume's parse: the engine names it later
        return "refused"
    assert original is not None and same(payload, original), f"{path} loaded"
    assert same(stored_settings(path), original["config"])
    return "loaded"


def test_random_files_truncations_and_bit_flips(real, tmp_path):
    rng = random.Random(51)
    data = real.read_bytes()
    original = ckpt.load(real)
    path = tmp_path / "x.pt"
    outcomes = {"refused": 0, "loaded": 0}
    for _ in range(RANDOM_FILES):
        path.write_bytes(rng.randbytes(rng.choice((0, 1, 22, 100, 4096))))
        outcomes[check(path)] += 1
    # random bytes that end as a zip does (an end record) but are none
    path.write_bytes(rng.randbytes(4000) + b"PK\x05\x06" + bytes(18))
    outcomes[check(path)] += 1
    for _ in range(TRUNCATIONS):
        path.write_bytes(data[: rng.randrange(len(data))])
        outcomes[check(path)] += 1
    for _ in range(FLIPS):
        flipped = bytearray(data)
        flipped[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(flipped))
        outcomes[check(path, original)] += 1
    # a flip in a tensor's bytes no longer loads silently: the members' CRCs are checked
    flipped = bytearray(data)
    with zipfile.ZipFile(real) as archive:
        info = max(archive.infolist(), key=lambda i: i.file_size)
    name_length, extra_length = struct.unpack_from("<HH", data, info.header_offset + 26)
    flipped[info.header_offset + 30 + name_length + extra_length + 1] ^= 4
    path.write_bytes(bytes(flipped))
    assert check(path, original) == "refused"
    assert outcomes["refused"] >= RANDOM_FILES + TRUNCATIONS + FLIPS // 2, outcomes


def _rezip(source: Path, target: Path, *, compression=zipfile.ZIP_STORED, rename=None) -> None:
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(target, "w", compression) as out:
        for info in src.infolist():
            name = rename(info.filename) if rename else info.filename
            out.writestr(name, src.read(info))


def _patch(source: Path, target: Path, signature: bytes, offset: int, value: bytes) -> None:
    """``source`` with ``value`` written at ``offset`` of its last record ``signature``."""
    data = source.read_bytes()
    at = data.rfind(signature) + offset
    target.write_bytes(data[:at] + value + data[at + len(value) :])


def _nested_pickle(depth: int) -> bytes:
    """A protocol-2 pickle of a list nested ``depth`` deep (pickle.dumps would recurse)."""
    return b"\x80\x02" + b"]" * depth + b"a" * (depth - 1) + b"."


def _with_member(source: Path, target: Path, name: str, data: bytes) -> None:
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(target, "w") as out:
        for info in src.infolist():
            payload = data if info.filename.endswith(name) else src.read(info)
            out.writestr(info.filename, payload)


@pytest.fixture(scope="module")
def bomb(real, tmp_path_factory) -> Path:
    """A zip bomb: the run's payload plus an unknown 8 MiB tensor, every member deflated
    (~40 KB on disk)."""
    folder = tmp_path_factory.mktemp("bomb")
    source, bomb = folder / "source.pt", folder / "bomb.pt"
    torch.save({**ckpt.load(real), "unknown": torch.zeros(2 << 20)}, source)
    _rezip(source, bomb, compression=zipfile.ZIP_DEFLATED)
    source.unlink()
    return bomb


def test_crafted_archives_are_refused_before_loading(real, bomb, tmp_path, monkeypatch):
    original = ckpt.load(real)
    cases: dict[str, Path] = {}

    cases["bomb"] = bomb
    # a forged size: the directory's last entry declares 1.5 GiB (uncompressed size: byte 24)
    cases["forged size"] = tmp_path / "forged.pt"
    _patch(real, cases["forged size"], b"PK\x01\x02", 24, struct.pack("<I", 3 << 29))
    # a forged member count in the end record (byte 10; zip's 16-bit most, the cap lowered)
    cases["forged count"] = tmp_path / "count.pt"
    _patch(real, cases["forged count"], b"PK\x05\x06", 10, struct.pack("<H", 0xFFF0))
    cases["deep"] = tmp_path / "deep.pt"
    _rezip(real, cases["deep"], rename=lambda n: n.replace("data/", "d/" * 12 + "data/"))
    cases["bzip2"] = tmp_path / "bzip2.pt"
    _rezip(real, cases["bzip2"], compression=zipfile.ZIP_BZIP2)
    cases["nested pickle"] = tmp_path / "nested.pt"
    _with_member(real, cases["nested pickle"], "data.pkl", _nested_pickle(100_000))
    cases["no pickle"] = tmp_path / "nopickle.pt"
    _rezip(real, cases["no pickle"], rename=lambda n: n.replace("data.pkl", "other.pkl"))
    cases["legacy format"] = tmp_path / "legacy.pt"
    torch.save(original, cases["legacy format"], _use_new_zipfile_serialization=False)
    for key, value in [("modules", 3), ("counters", {"frames": "x"}), ("optimizers", None)]:
        cases[f"layout {key}"] = tmp_path / f"layout_{key}.pt"
        torch.save({**original, key: value}, cases[f"layout {key}"])
    cases["no modules"] = tmp_path / "nomodules.pt"
    torch.save({k: v for k, v in original.items() if k != "modules"}, cases["no modules"])

    def no_torch_load(*args, **kwargs):
        raise AssertionError("torch.load reached")

    for name, path in cases.items():
        if name in ("bomb", "forged size", "forged count", "deep"):
            monkeypatch.setattr(torch, "load", no_torch_load)  # refused before loading
        if name == "forged count":
            monkeypatch.setattr(ckpt, "MAX_MEMBERS", 1000)
        assert check(path) == "refused", name
        monkeypatch.undo()
    monkeypatch.setattr(ckpt, "MAX_MEMBERS", 40)  # this run's checkpoint has more members
    assert check(real) == "refused"


def test_a_zip_bomb_is_refused_in_bounded_memory(bomb):
    """The bomb declares 8 MiB in a file of ~40 KB; its refusal allocates < 1 MiB."""
    declared = sum(i.file_size for i in zipfile.ZipFile(bomb).infolist())
    assert declared > 64 * bomb.stat().st_size
    tracemalloc.start()
    try:
        with pytest.raises(ckpt.CheckpointError, match="zip bomb or a forged size"):
            ckpt.load(bomb)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"peak {peak / 2**20:.1f} MiB for a file declaring {declared >> 20} MiB"


def _run(monkeypatch, capsys, algo: str, argv: list[str]) -> tuple[int, list[str]]:
    monkeypatch.setattr(sys, "argv", [f"recipes/{algo}.py", *argv])
    monkeypatch.delenv("RLKIT_TRACEBACK", raising=False)
    capsys.readouterr()
    code = 0
    try:
        cli(load_algorithm(algo).main)
    except SystemExit as stop:
        code = stop.code
    err = capsys.readouterr().err
    return code, [line for line in err.splitlines() if line.strip()]


def test_resume_and_init_from_a_corrupt_file_end_in_one_line(tmp_path, monkeypatch, capsys):
    # the cases: random bytes that took torch's unpickler to an IndexError
    rng = random.Random(7)
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"\x80\x02" + rng.randbytes(4094))
    quiet = ["--progress", "false", "--run-dir", str(tmp_path / "run")]
    for algo, flag in (("ppo", "--resume"), ("sac", "--init-from")):
        code, lines = _run(monkeypatch, capsys, algo, [*quiet, flag, str(bad)])
        assert code == 2 and len(lines) == 1, (algo, lines)
        assert lines[0].startswith("error: ") and str(bad) in lines[0], lines


def test_the_loader_reads_a_real_checkpoint_in_memory_too(real):
    """``torch.load`` of the checked file gives the payload (nothing lost to the checks)."""
    buffer = io.BytesIO(real.read_bytes())
    assert same(ckpt.load(real), torch.load(buffer, weights_only=True))
