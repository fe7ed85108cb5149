"""Small helpers shared by the benchmark scripts in ``benchmarks/``.

Provenance (git commit, package versions, host, command line) and resource measurement of
a child process: whole-process wall time, peak resident memory of the child's process tree,
CPU seconds. Results are written as a JSON file (every raw number) plus a Markdown table.

Peak RSS of a child tree, and why it is measured two ways
---------------------------------------------------------
``resource.getrusage(RUSAGE_CHILDREN).ru_maxrss`` is *not* the peak of a child tree: it is
the largest single-process high-water mark over **every** child this harness has ever
reaped (it never resets, so after one big run every later, smaller run reports the same
number), and it is a max over processes, never a sum of processes alive at the same time
(a recipe with worker processes would be under-counted).

So :func:`run_measured` does two things:

* it polls the live tree (the child plus all its descendants, via psutil) every
  ``poll_s`` (50 ms) and records the peak of the **sum** of their RSS; this is the tree's
  footprint, but sampling can miss a spike shorter than the interval;
* it reaps the child itself with ``os.wait4``, whose rusage belongs to that one child:
  ``ru_maxrss`` is the kernel's exact high-water mark of the child and its reaped
  descendants (max over processes), which catches short spikes.

The reported ``peak_rss_mb`` is the larger of the two. For a single-process run (both
rlkit recipes with in-process envs and SB3's ``DummyVecEnv``) the two agree within a few
MB and the kernel number is exact; with worker processes the tree sum dominates. Summed RSS
counts pages shared between processes (libtorch mapped by each worker) once per process,
so it is an upper bound on the tree's true footprint; both sides are measured the same way.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

REPO_ROOT = Path(__file__).resolve().parent.parent
"""Repository root (the folder holding ``pyproject.toml``)."""

MB = 1024 * 1024


@dataclass
class ProcessResult:
    """Outcome and resource use of one measured child process.

    Attributes:
        command: The argv that was run.
        returncode: Exit status (negative: killed by that signal; None: never reaped).
        timed_out: True when the run hit ``timeout_s`` and its process group was killed.
        wall_seconds: Whole-process wall time, launch to exit (imports and setup included).
        peak_rss_mb: ``max(tree_rss_mb, kernel_maxrss_mb)``: the number to compare.
        tree_rss_mb: Peak over 50 ms samples of the summed RSS of the live process tree.
        kernel_maxrss_mb: ``ru_maxrss`` from ``wait4``: exact per-process high-water mark.
        cpu_seconds: User plus system CPU time of the child and its reaped descendants.
        stdout: Captured standard output.
        stderr: Captured standard error.
    """

    command: list[str]
    returncode: int | None
    timed_out: bool
    wall_seconds: float
    peak_rss_mb: float
    tree_rss_mb: float
    kernel_maxrss_mb: float
    cpu_seconds: float
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        """True when the process exited with status 0 within its time limit."""
        return self.returncode == 0 and not self.timed_out

    def error_tail(self, n_chars: int = 2000) -> str:
        """The last ``n_chars`` of stderr (stdout if stderr is empty), for failure records."""
        text = self.stderr.strip() or self.stdout.strip()
        head = "timed out; " if self.timed_out else f"exit status {self.returncode}; "
        return head + text[-n_chars:]

    def summary(self) -> dict[str, Any]:
        """The measured numbers, without captured output (what goes into result files)."""
        out = asdict(self)
        del out["stdout"], out["stderr"]
        return out


def _tree_rss_bytes(proc: psutil.Process) -> int:
    """Summed RSS of ``proc`` and all its live descendants; 0 once the process is gone."""
    try:
        members = [proc, *proc.children(recursive=True)]
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return 0
    total = 0
    for member in members:
        try:
            total += member.memory_info().rss
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            continue
    return total


def _kill_group(pid: int) -> None:
    """SIGKILL the process group led by ``pid`` (the child was started in a new session)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def run_measured(
    command: Sequence[str],
    *,
    cwd: str | Path = REPO_ROOT,
    env: dict[str, str] | None = None,
    timeout_s: float = 600.0,
    poll_s: float = 0.05,
) -> ProcessResult:
    """Run ``command`` to completion and measure wall time, peak tree RSS and CPU time.

    The child runs in its own session (process group) so a timeout kills its whole tree.
    Output goes to temporary files, not pipes, so a chatty child can never block.

    Args:
        command: argv of the child.
        cwd: Working directory of the child (default: the repository root).
        env: Environment of the child (default: inherit).
        timeout_s: Wall-clock limit; on expiry the process group gets SIGKILL and the
            result has ``timed_out=True``.
        poll_s: RSS sampling interval in seconds (50 ms by default).

    Returns:
        A :class:`ProcessResult`. A launch failure (missing executable) raises ``OSError``.
    """
    if timeout_s <= 0 or poll_s <= 0:
        raise ValueError(f"timeout_s and poll_s must be > 0, got {timeout_s=} {poll_s=}")
    argv = [str(part) for part in command]
    with tempfile.TemporaryFile() as out_f, tempfile.TemporaryFile() as err_f:
        start = time.perf_counter()
        popen = subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=out_f, stderr=err_f, start_new_session=True
        )
        watched = psutil.Process(popen.pid)
        peak_tree, timed_out = 0, False
        # waitid(WNOWAIT) notices the exit without reaping: the zombie leader keeps its
        # process-group id reserved, so the killpg below can only reach our own tree.
        while os.waitid(os.P_PID, popen.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            peak_tree = max(peak_tree, _tree_rss_bytes(watched))
            if time.perf_counter() - start > timeout_s:
                timed_out = True
                break
            time.sleep(poll_s)
        _kill_group(popen.pid)  # the whole tree on timeout; stray grandchildren otherwise
        _, status, usage = os.wait4(popen.pid, 0)
        wall = time.perf_counter() - start
        popen.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        out_f.seek(0), err_f.seek(0)
        stdout = out_f.read().decode(errors="replace")
        stderr = err_f.read().decode(errors="replace")
    kernel = usage.ru_maxrss * 1024  # Linux reports kilobytes
    return ProcessResult(
        command=argv,
        returncode=popen.returncode,
        timed_out=timed_out,
        wall_seconds=round(wall, 3),
        peak_rss_mb=round(max(peak_tree, kernel) / MB, 1),
        tree_rss_mb=round(peak_tree / MB, 1),
        kernel_maxrss_mb=round(kernel / MB, 1),
        cpu_seconds=round(usage.ru_utime + usage.ru_stime, 3),
        stdout=stdout,
        stderr=stderr,
    )


def last_json_line(text: str) -> dict[str, Any]:
    """Parse the last line of ``text`` that is a JSON object.

    Raises:
        ValueError: When no line parses as a JSON object (the message shows the tail).
    """
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    raise ValueError(f"no JSON object line in the output; its tail was: {text[-500:]!r}")


def git_commit(repo: str | Path = REPO_ROOT) -> dict[str, Any]:
    """The commit hash of ``repo`` and whether tracked files differ from it."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=False)
        return done.stdout.strip()

    commit = git("rev-parse", "HEAD") or "unknown"
    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    return {"commit": commit, "dirty": dirty}


def package_versions(python: str | Path, packages: Iterable[str]) -> dict[str, str | None]:
    """Installed versions of ``packages`` in the interpreter ``python`` (None if absent)."""
    script = (
        "import json, sys\n"
        "from importlib import metadata\n"
        "out = {}\n"
        "for name in sys.argv[1:]:\n"
        "    try:\n"
        "        out[name] = metadata.version(name)\n"
        "    except metadata.PackageNotFoundError:\n"
        "        out[name] = None\n"
        "out['python'] = sys.version.split()[0]\n"
        "print(json.dumps(out))\n"
    )
    done = subprocess.run(
        [str(python), "-c", script, *packages], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        return {"error": done.stderr.strip()[-500:]}
    return json.loads(done.stdout)


def host_info() -> dict[str, Any]:
    """CPU model, core counts, memory, OS and load average of this machine."""
    cpu_model = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "cpu_model": cpu_model,
        "logical_cpus": psutil.cpu_count(logical=True),
        "physical_cpus": psutil.cpu_count(logical=False),
        "memory_gb": round(psutil.virtual_memory().total / 1024**3, 1),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "harness_python": sys.version.split()[0],
    }


def command_line() -> str:
    """The command that launched this process, shell-quoted, for result files."""
    return shlex.join([Path(sys.executable).name, *sys.argv])


def median_or_none(values: Iterable[float | None]) -> float | None:
    """Median of the values that are not None; None when there are none."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator`` rounded to 3 places; None if either is missing or 0."""
    if numerator is None or not denominator:
        return None
    return round(numerator / denominator, 3)


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub-flavoured Markdown table; None cells print as an em dash."""

    def cell(value: Any) -> str:
        if value is None:
            return "—"
        if isinstance(value, float):
            return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
        return str(value)

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def write_results(stem: str | Path, payload: dict[str, Any], markdown: str) -> list[Path]:
    """Write ``<stem>.json`` (indented, sorted keys kept in insertion order) and ``<stem>.md``.

    Returns:
        The two paths written.
    """
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    json_path, md_path = stem.with_suffix(".json"), stem.with_suffix(".md")
    json_path.write_text(json.dumps(payload, indent=2, allow_nan=False) + "\n")
    md_path.write_text(markdown.rstrip() + "\n")
    return [json_path, md_path]
