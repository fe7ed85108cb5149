"""Speed of rlkit's value estimators against TorchRL's loop kernels (CPU, 1 thread).

Compares, on the same inputs, :func:`rlkit.value.functional.gae` / ``vtrace`` /
``td_lambda`` with ``torchrl.objectives.value.functional.generalized_advantage_estimate``,
``vtrace_advantage_estimate`` and ``td_lambda_return_estimate`` (their fast loop kernels,
not the ``vec_*`` variants, which are ~30x slower on CPU with dones). Batches are
``[batch, time, 1]`` with 2% done steps, half of them truncations (``terminated`` passed to
TorchRL too, whose kernels then follow the same episode-boundary rule, so both must agree;
this is asserted before timing).

Each timing is the median over ``--repeats`` repeats of the mean of ``number`` calls, with
rlkit and TorchRL interleaved so that load from other processes hits both alike. The script
exits non-zero if any ratio rlkit / torchrl exceeds 1.0.

Run: ``.venv/bin/python benchmarks/bench_value.py`` (writes
``benchmarks/results/bench_value.json`` and ``.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torchrl
from torchrl.objectives.value import functional as trl

from rlkit.value import functional as rlk

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
SIZES = [(64, 128), (1024, 256)]
GAMMA, LMBDA = 0.99, 0.95


def make_inputs(batch: int, steps: int, *, seed: int, p_done: float = 0.02) -> dict:
    g = torch.Generator().manual_seed(seed)
    shape = (batch, steps, 1)
    done = torch.rand(shape, generator=g) < p_done
    return {
        "reward": torch.randn(shape, generator=g),
        "value": torch.randn(shape, generator=g),
        "next_value": torch.randn(shape, generator=g),
        "done": done,
        "terminated": done & (torch.rand(shape, generator=g) < 0.5),  # half are truncations
        "behavior_log_prob": -torch.rand(shape, generator=g) * 2,
        "target_log_prob": -torch.rand(shape, generator=g) * 2,
    }


def pairs(x: dict) -> dict[str, tuple[Callable, Callable]]:
    """Per estimator: (rlkit call, torchrl call) computing the same thing."""
    r, v, nv, d, t = x["reward"], x["value"], x["next_value"], x["done"], x["terminated"]
    blp, tlp = x["behavior_log_prob"], x["target_log_prob"]
    return {
        "gae": (
            lambda: rlk.gae(r, v, nv, d, t, gamma=GAMMA, lmbda=LMBDA),
            lambda: trl.generalized_advantage_estimate(GAMMA, LMBDA, v, nv, r, d, t),
        ),
        "vtrace": (
            # lambda = 1 and pg_rho_clip = rho_clip: TorchRL's V-trace has neither knob.
            # Its code computes rho = exp(log_pi - log_mu): log_pi is the target policy.
            lambda: rlk.vtrace(blp, tlp, r, v, nv, d, t, gamma=GAMMA),
            lambda: trl.vtrace_advantage_estimate(GAMMA, tlp, blp, v, nv, r, d, t),
        ),
        "td_lambda": (
            lambda: (rlk.td_lambda(r, nv, d, t, gamma=GAMMA, lmbda=LMBDA),),
            lambda: (trl.td_lambda_return_estimate(GAMMA, LMBDA, nv, r, d, t),),
        ),
    }


def max_abs_diff(a: tuple, b: tuple) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b, strict=True))


def timed(fn: Callable, number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number


def bench_pair(ours: Callable, theirs: Callable, *, repeats: int, number: int) -> dict:
    ours(), theirs()  # warm-up
    t_ours, t_theirs = [], []
    for _ in range(repeats):
        t_ours.append(timed(ours, number))
        t_theirs.append(timed(theirs, number))
    m_ours, m_theirs = statistics.median(t_ours), statistics.median(t_theirs)
    return {
        "rlkit_ms": 1e3 * m_ours,
        "torchrl_ms": 1e3 * m_theirs,
        "ratio": m_ours / m_theirs,
        "rlkit_ms_all": [1e3 * s for s in t_ours],
        "torchrl_ms_all": [1e3 * s for s in t_theirs],
        "number": number,
    }


def git_commit() -> tuple[str, bool]:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout.strip()

    dirty = bool(git("status", "--porcelain", "--", "rlkit/value", "benchmarks/bench_value.py"))
    return git("rev-parse", "HEAD") or "unknown", dirty


def markdown(results: list[dict], meta: dict) -> str:
    lines = [
        "# Value estimators: rlkit vs TorchRL loop kernels",
        "",
        f"CPU, 1 thread, median of {meta['repeats']} repeats; 2% done steps, half truncated; "
        f"load average {meta['load_average_1_5_15min'][0]} on {meta['cpu_count']} cores "
        "(shared machine: compare ratios). "
        f"torch {meta['torch']}, torchrl {meta['torchrl']}, commit `{meta['commit'][:10]}`"
        f"{' (uncommitted changes)' if meta['dirty'] else ''}, seed {meta['seed']}.",
        f"Command: `{meta['command']}`",
        "",
        "| estimator | batch x time | rlkit ms | torchrl ms | ratio | max abs diff |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        lines.append(
            f"| {r['estimator']} | {r['batch']} x {r['time']} | {r['rlkit_ms']:.3f} | "
            f"{r['torchrl_ms']:.3f} | {r['ratio']:.3f} | {r['max_abs_diff']:.1e} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15, help="timing repeats (median)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    parser.add_argument("--out", type=Path, default=RESULTS / "bench_value.json")
    args = parser.parse_args()
    torch.set_num_threads(1)

    results = []
    for batch, steps in SIZES:
        inputs = make_inputs(batch, steps, seed=args.seed)
        number = 20 if batch * steps < 50_000 else 3  # calls per timed repeat
        for name, (ours, theirs) in pairs(inputs).items():
            diff = max_abs_diff(ours(), theirs())
            if diff > 1e-4:
                raise SystemExit(f"{name} {batch}x{steps}: rlkit and torchrl differ by {diff}")
            row = bench_pair(ours, theirs, repeats=args.repeats, number=number)
            row |= {"estimator": name, "batch": batch, "time": steps, "max_abs_diff": diff}
            results.append(row)
            print(
                f"{name:9s} {batch:5d} x {steps:3d}  rlkit {row['rlkit_ms']:7.3f} ms  "
                f"torchrl {row['torchrl_ms']:7.3f} ms  ratio {row['ratio']:.3f}  "
                f"max|diff| {diff:.1e}",
                flush=True,
            )

    commit, dirty = git_commit()
    meta = {
        "commit": commit,
        "dirty": dirty,
        "torch": torch.__version__,
        "torchrl": torchrl.__version__,
        "python": platform.python_version(),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "load_average_1_5_15min": [round(x, 2) for x in os.getloadavg()],
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "seed": args.seed,
        "repeats": args.repeats,
        "sizes": SIZES,
        "p_done": 0.02,
        "gamma": GAMMA,
        "lmbda": LMBDA,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(markdown(results, meta))
    print(f"wrote {args.out} and {args.out.with_suffix('.md')}")

    slow = [r for r in results if r["ratio"] > 1.0]
    for r in slow:
        print(f"FAIL {r['estimator']} {r['batch']}x{r['time']}: ratio {r['ratio']:.3f} > 1.0")
    return 1 if slow else 0


if __name__ == "__main__":
    sys.exit(main())
