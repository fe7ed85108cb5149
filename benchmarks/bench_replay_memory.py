"""Resident memory of a DQN replay of Atari transitions (issue 20: 1M within 8 GB).

Fills a :class:`rlkit.data.frames.FrameReplay` of ``--capacity`` slots (default 1,000,000)
with Atari-shaped steps (``uint8 [4, 84, 84]`` observations, gymnasium's reset-padded frame
stack, episodes of 200 to 2,000 steps ending terminated or truncated, 8 envs) until every
env's ring has wrapped, and reports the process's resident-set growth (``/proc/self/status``
``VmRSS``, and the high-water mark ``VmHWM``) against the buffer's own tensor bytes. Every
extend reads its observations back (the buffer's default check), so the fill is also an
exactness run. For contrast, the bytes per row of :class:`rlkit.data.replay.Replay`
(TorchRL's ``LazyTensorStorage``, observation and next observation in full) are measured on
a 64-row buffer and multiplied out; that buffer is not filled.

Then it times uniform minibatches of 32 n-step transitions from the full buffer.

    python benchmarks/bench_replay_memory.py                       # 1M slots, ~8 GB free
    python benchmarks/bench_replay_memory.py --capacity 500000     # half, where RAM is short

Writes ``benchmarks/results/replay_memory.{json,md}``.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch
from tensordict import TensorDict

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import command_line, git_commit, host_info, markdown_table, write_results  # noqa: E402

from rlkit import keys  # noqa: E402
from rlkit.data.frames import FrameReplay  # noqa: E402
from rlkit.data.replay import Replay  # noqa: E402

K, SIDE, POOL = 4, 84, 251  # frame stack, frame side, distinct frames drawn from
GB = 1e9


def rss() -> dict[str, int]:
    """VmRSS and VmHWM of this process, bytes."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            out[name] = int(value.split()[0]) * 1024
    return out


class AtariLike:
    """``num_envs`` envs of frame ids (rows of a frame pool), stacked and reset-padded as
    gymnasium's ``FrameStackObservation(4)``."""

    def __init__(self, num_envs: int, seed: int) -> None:
        self.rng = random.Random(seed)
        gen = torch.Generator().manual_seed(seed)
        self.pool = torch.randint(0, 256, (POOL, SIDE, SIDE), dtype=torch.uint8, generator=gen)
        self.num, self.next_id = num_envs, 0
        self.stack = [self._reset() for _ in range(num_envs)]
        self.left = [self.rng.randint(200, 2000) for _ in range(num_envs)]
        self.episodes = 0

    def _frame(self) -> int:
        self.next_id += 1
        return self.next_id % POOL

    def _reset(self) -> list[int]:
        return [self._frame()] * K

    def batch(self, steps: int) -> TensorDict:
        obs, nxt = [], []
        done = torch.zeros(self.num, steps, 1, dtype=torch.bool)
        terminated = torch.zeros_like(done)
        for e in range(self.num):
            for t in range(steps):
                after = self.stack[e][1:] + [self._frame()]
                obs.append(self.stack[e])
                nxt.append(after)
                self.left[e] -= 1
                if self.left[e] == 0:
                    done[e, t] = True
                    terminated[e, t] = self.episodes % 2 == 0
                    self.episodes += 1
                    self.left[e] = self.rng.randint(200, 2000)
                    self.stack[e] = self._reset()
                else:
                    self.stack[e] = after
        shape = (self.num, steps, K, SIDE, SIDE)
        return TensorDict(
            {
                keys.OBSERVATION: self.pool[torch.tensor(obs)].view(shape),
                keys.ACTION: torch.randint(0, 18, (self.num, steps)),
                keys.NEXT: {
                    keys.OBSERVATION: self.pool[torch.tensor(nxt)].view(shape),
                    "reward": torch.randint(-1, 2, (self.num, steps, 1)).float(),
                    "terminated": terminated,
                    "done": done,
                },
            },
            [self.num, steps],
        )


def ordinary_bytes_per_row(env: AtariLike) -> float:
    """Bytes per row of Replay (LazyTensorStorage) for these transitions, measured."""
    replay = Replay(64)
    batch = env.batch(8)
    stored = ("observation", "action", ("next", "observation"), ("next", "reward"))
    rows = batch.select(*stored, keys.TERMINATED).reshape(-1)
    replay.extend(rows)
    tensors = replay.buffer.storage._storage.values(True, True)
    return sum(t.numel() * t.element_size() for t in tensors) / 64


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--capacity", type=int, default=1_000_000)
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=64, help="steps per env per batch")
    parser.add_argument("--n-steps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "replay_memory"))
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    env = AtariLike(args.num_envs, args.seed)
    per_row = ordinary_bytes_per_row(env)
    env = AtariLike(args.num_envs, args.seed)
    env.batch(1)  # warm the batch path before the baseline
    before = rss()
    replay = FrameReplay(args.capacity, frame_stack=K, n_steps=args.n_steps)
    start = time.perf_counter()
    batches = 0
    while not replay.full:
        replay.extend(env.batch(args.steps))
        batches += 1
        if batches % 200 == 0:
            print(f"{batches} batches, {len(replay):,} transitions", file=sys.stderr)
    fill_s = time.perf_counter() - start
    after = rss()
    transitions = len(replay)
    start = time.perf_counter()
    for sample in replay.minibatches(1000, 32):
        assert sample[keys.OBSERVATION].shape == (32, K, SIDE, SIDE)
    sample_ms = (time.perf_counter() - start) / 1000 * 1e3
    grown = after["VmRSS"] - before["VmRSS"]
    figures = {
        "capacity_slots": args.capacity,
        "transitions_held": transitions,
        "episodes_ended": env.episodes,
        "buffer_tensor_bytes": replay.nbytes(),
        "rss_before_bytes": before["VmRSS"],
        "rss_after_fill_bytes": after["VmRSS"],
        "rss_growth_bytes": grown,
        "peak_rss_bytes": after["VmHWM"],
        "rss_growth_per_transition_bytes": grown / transitions,
        "rss_growth_per_1M_transitions_gb": grown / transitions * 1e6 / GB,
        "ordinary_replay_bytes_per_row": per_row,
        "ordinary_replay_1M_rows_gb": per_row * 1e6 / GB,
        "fill_seconds": fill_s,
        "minibatch_32_ms": sample_ms,
    }
    payload = {
        "command": command_line(),
        **git_commit(),
        "host": host_info(),
        "torch": torch.__version__,
        "args": vars(args),
        "figures": figures,
    }
    rows = [
        ["FrameReplay, tensors allocated", f"{replay.nbytes() / GB:.3f} GB"],
        ["FrameReplay, RSS growth after the fill", f"{grown / GB:.3f} GB"],
        ["transitions held (sampleable)", f"{transitions:,}"],
        ["RSS growth per transition", f"{grown / transitions:,.0f} B"],
        ["RSS growth per 1M transitions", f"{grown / transitions * 1e6 / GB:.3f} GB"],
        ["process peak RSS (VmHWM)", f"{after['VmHWM'] / GB:.3f} GB"],
        ["Replay (LazyTensorStorage), bytes per row", f"{per_row:,.0f} B"],
        ["Replay, 1M rows (not filled)", f"{per_row * 1e6 / GB:.1f} GB"],
        ["fill time (with the read-back check)", f"{fill_s:.0f} s"],
        ["uniform minibatch of 32 (3-step), full buffer", f"{sample_ms:.2f} ms"],
    ]
    markdown = "\n".join(
        [
            "# DQN replay memory: Atari `uint8 [4, 84, 84]`",
            "",
            f"Command: `{payload['command']}`  ",
            f"Commit: `{payload['commit']}`{' (dirty)' if payload['dirty'] else ''}  ",
            f"Host: {payload['host']['cpu_model']}, {payload['host']['memory_gb']} GB RAM; "
            f"torch {torch.__version__}; seed {args.seed}",
            "",
            f"A `FrameReplay` of {args.capacity:,} slots filled from {args.num_envs} envs "
            f"until every ring wrapped ({env.episodes} episodes of 200-2,000 steps ended), "
            "every batch read back exactly.",
            "",
            markdown_table(["figure", "value"], rows),
            "",
        ]
    )
    for path in write_results(args.out, payload, markdown):
        print(path)
    print(markdown)


if __name__ == "__main__":
    main()
