"""Asynchronous vs synchronous collection for APPO: frames/s and policy lag.

The APPO recipe's learner (``recipes/appo.py`` defaults: CartPole-v1, 8 envs x 32 steps,
10 epochs x 2 minibatches per batch) is driven by the engine's loop body (collect,
``learner.update``, ``collector.update_policy_weights_()``) over three collectors with the
same env count, in the same process, round-robin (repeat r of every mode before r + 1):

- ``async``: ``WorkerCollector(sync=False)``: the worker(s) act while the learner updates;
- ``sync``: ``WorkerCollector(sync=True)``: the same worker process(es), but each batch is
  collected after the previous update, with its weights (no overlap, zero lag);
- ``inprocess``: the engine's default in-process ``VectorEnvCollector`` (for reference).

Each measurement discards ``--warmup`` batches (worker start-up), then times ``--batches``
batches; frames/s counts collected frames over the wall time of collect + update + publish.
The report gives the median frames/s per mode, the median of the per-repeat ratios
async / sync, and the mean policy lag of the async batches (learner version minus the
version that acted).

    .venv/bin/python benchmarks/bench_async.py              # writes results/bench_async.*
    .venv/bin/python benchmarks/bench_async.py --quick      # a smoke run, writes nothing

Other flags go to the APPO recipe's config (e.g. ``--epochs 4``); the report records them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    REPO_ROOT,
    command_line,
    git_commit,
    host_info,
    markdown_table,
    package_versions,
    write_results,
)

from rlkit.data.async_collect import WorkerCollector  # noqa: E402
from rlkit.data.collector import make_collector  # noqa: E402
from rlkit.envs import make_env  # noqa: E402
from rlkit.training.engine import Context, Counters  # noqa: E402

MODES = ("async", "sync", "inprocess")


class _OneProcess:
    """The part of a Fabric the learner's update reads, for one CPU process."""

    device = torch.device("cpu")
    world_size = 1


def _recipe():
    from rlkit.algorithms import appo

    return appo


def measure(mode: str, args: argparse.Namespace, seed: int) -> dict:
    appo = _recipe()
    flags = ["--seed", str(seed), "--workers", str(args.workers), "--progress", "false"]
    flags += args.recipe_flags
    cfg = appo.parse_config(appo.APPOConfig, flags, presets=appo.PRESETS)
    torch.manual_seed(seed)
    env = make_env(cfg.env, num_envs=cfg.num_envs, seed=seed)
    learner = appo.build(cfg, env)
    if mode == "inprocess":
        collector = make_collector(
            env, learner.collect_policy(), frames_per_batch=learner.frames_per_batch
        )
    else:
        collector = WorkerCollector(
            env_id=cfg.env,
            policy=learner.collect_policy(),
            num_envs=cfg.num_envs,
            frames_per_batch=learner.frames_per_batch,
            num_workers=cfg.workers,
            sync=mode == "sync",
            seed=seed,
        )
    ctx = Context(_OneProcess(), cfg.total_frames, Counters())
    lags: list[float] = []
    wait = update = 0.0
    try:
        batches = iter(collector)
        for i in range(args.warmup + args.batches):
            if i == args.warmup:
                start = time.perf_counter()
            t0 = time.perf_counter()
            batch = next(batches)
            t1 = time.perf_counter()
            metrics = learner.update(batch, ctx)
            collector.update_policy_weights_()
            t2 = time.perf_counter()
            ctx.counters.frames += batch.numel()
            if i >= args.warmup:
                lags.append(metrics.get("policy_lag", 0.0))
                wait, update = wait + t1 - t0, update + t2 - t1
        seconds = time.perf_counter() - start
    finally:
        collector.shutdown()
        env.close()
    frames = args.batches * learner.frames_per_batch
    return {
        "mode": mode,
        "seed": seed,
        "frames": frames,
        "seconds": round(seconds, 3),
        "fps": round(frames / seconds, 1),
        "mean_lag": round(sum(lags) / len(lags), 3),
        # learner time waiting for a batch vs updating: async hides the first behind the second
        "learner_wait_s": round(wait, 3),
        "learner_update_s": round(update, 3),
        "load_average_1min": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batches", type=int, default=40, help="timed batches per measurement")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="1 repeat x 6 batches, write nothing")
    args, args.recipe_flags = p.parse_known_args()
    if args.quick:
        args.repeats, args.batches, args.warmup = 1, 6, 2
    torch.set_num_threads(1)
    rows = []
    for r in range(args.repeats):
        for mode in MODES:
            row = measure(mode, args, seed=r) | {"repeat": r}
            print(row, flush=True)
            rows.append(row)
    fps = {m: statistics.median(x["fps"] for x in rows if x["mode"] == m) for m in MODES}
    paired = [
        next(x["fps"] for x in rows if x["mode"] == "async" and x["repeat"] == r)
        / next(x["fps"] for x in rows if x["mode"] == "sync" and x["repeat"] == r)
        for r in range(args.repeats)
    ]
    lag = statistics.mean(x["mean_lag"] for x in rows if x["mode"] == "async")
    summary = {
        "fps_median": fps,
        "async_over_sync_median": round(statistics.median(paired), 3),
        "async_over_sync_per_repeat": [round(x, 3) for x in paired],
        "async_mean_policy_lag": round(lag, 3),
        "bar": "async / sync >= 1.3",
    }
    print(summary)
    if args.quick:
        return
    payload = {
        "command": command_line(),
        "commit": git_commit(),
        "host": host_info(),
        "packages": package_versions(sys.executable, ["torch", "torchrl", "tensordict"]),
        "settings": vars(args),
        "niceness": os.nice(0),
        "summary": summary,
        "rows": rows,
    }

    def mean_of(mode: str, key: str) -> float:
        return round(statistics.mean(x[key] for x in rows if x["mode"] == mode), 3)

    table = markdown_table(
        ["mode", "median frames/s", "mean policy lag", "learner wait s", "learner update s"],
        [
            [m, fps[m], mean_of(m, "mean_lag"), mean_of(m, "learner_wait_s")]
            + [mean_of(m, "learner_update_s")]
            for m in MODES
        ],
    )
    markdown = (
        "# Asynchronous vs synchronous collection (APPO, CartPole-v1)\n\n"
        f"`{command_line()}`, commit `{payload['commit']['commit'][:10]}`"
        f"{' (uncommitted changes)' if payload['commit'].get('dirty') else ''}, "
        f"{args.workers} worker(s), "
        f"recipe defaults{' + ' + ' '.join(args.recipe_flags) if args.recipe_flags else ''}, "
        f"{args.batches} timed batches x {args.repeats} repeats.\n\n"
        f"{table}\n\n"
        f"async / sync (median of paired repeats): **{summary['async_over_sync_median']}** "
        f"(per repeat {summary['async_over_sync_per_repeat']}); bar >= 1.3. "
        f"Mean policy lag of async batches: **{summary['async_mean_policy_lag']}** "
        "learner updates. 1-minute load average during the runs: "
        f"{[x['load_average_1min'] for x in rows]} on {os.cpu_count()} cores, "
        f"benchmark niceness {os.nice(0)} (overlap needs an idle core: on a shared machine "
        "run it as `nice -n -15 ...` so other jobs yield the CPU).\n"
    )
    write_results(REPO_ROOT / "benchmarks" / "results" / "bench_async", payload, markdown)


if __name__ == "__main__":
    main()
