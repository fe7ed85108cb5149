"""PPO at SB3's CartPole settings: where the time of one batch goes, against the eager floor.

For one batch of 8 envs x 32 steps, 20 epochs of one 256-row minibatch (rl-zoo3's
CartPole-v1 settings, one torch thread), three sides are timed in the same run, repeat by
repeat (round-robin, so load on the shared CPU hits them alike):

- ``rlkit``: the PPO recipe's learner and collector (``rlkit.algorithms.ppo.build``,
  ``rlkit.data.collector.make_collector``), ms per ``collector`` batch and per
  ``learner.update``;
- ``sb3``: Stable-Baselines3's ``collect_rollouts`` and ``train`` of the same settings
  (``benchmarks/peers/sb3_split.py`` in ``.venv-sb3``);
- ``floor``: the least eager PyTorch can do for the same arithmetic, written out here with
  no framework at all: a gymnasium ``SyncVectorEnv`` of 8 CartPoles stepped 32 times with a
  no-grad 64x64 tanh MLP and a categorical sample, then 20 steps of forward (clipped
  surrogate, value loss), backward, global-norm clipping and fused Adam on two 64x64 MLPs.

The report gives each side's ms per batch, its implied frames/s, and the ratio SB3 / side:
``floor``'s ratio is the most any eager implementation can gain over SB3 on this CPU at
these settings.

    .venv/bin/python benchmarks/bench_floor.py               # writes results/floor_ppo.*
    .venv/bin/python benchmarks/bench_floor.py --quick       # smoke run, writes nothing
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import gymnasium
import torch
from common import (
    REPO_ROOT,
    command_line,
    git_commit,
    host_info,
    markdown_table,
    write_results,
)
from torch import nn

NUM_ENVS, STEPS, EPOCHS = 8, 32, 20
RESULTS = Path(__file__).parent / "results"
PEERS = Path(__file__).parent / "peers"


def _mlp(out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, out)
    )


class Floor:
    """Plain torch + gymnasium, nothing else: the same arithmetic as one PPO batch."""

    def __init__(self, seed: int) -> None:
        torch.manual_seed(seed)
        self.actor, self.critic = _mlp(2), _mlp(1)
        self.params = [*self.actor.parameters(), *self.critic.parameters()]
        self.opt = torch.optim.Adam(self.params, lr=1e-3, eps=1e-5, fused=True)
        self.opt._accelerator_graph_capture_health_check = lambda: None  # as rlkit._speedups
        self.venv = gymnasium.vector.SyncVectorEnv(
            [lambda: gymnasium.make("CartPole-v1") for _ in range(NUM_ENVS)]
        )
        self.obs = torch.as_tensor(self.venv.reset(seed=seed)[0], dtype=torch.float32)

    def collect(self) -> dict[str, torch.Tensor]:
        obs, acts, logps, rews = [], [], [], []
        with torch.no_grad():
            for _ in range(STEPS):
                dist = torch.distributions.Categorical(logits=self.actor(self.obs))
                action = dist.sample()
                obs.append(self.obs)
                acts.append(action)
                logps.append(dist.log_prob(action))
                nxt, reward, _, _, _ = self.venv.step(action.numpy())
                rews.append(torch.as_tensor(reward, dtype=torch.float32))
                self.obs = torch.as_tensor(nxt, dtype=torch.float32)
        return {
            "obs": torch.cat(obs),
            "act": torch.cat(acts),
            "logp": torch.cat(logps),
            "adv": torch.cat(rews) - 0.5,
            "ret": torch.cat(rews),
        }

    def update(self, b: dict[str, torch.Tensor]) -> None:
        for _ in range(EPOCHS):
            perm = torch.randperm(len(b["obs"]))
            obs, act, logp, adv, ret = (b[k][perm] for k in ("obs", "act", "logp", "adv", "ret"))
            dist = torch.distributions.Categorical(logits=self.actor(obs))
            ratio = (dist.log_prob(act) - logp).exp()
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            policy = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv).mean()
            value = 0.5 * (self.critic(obs).squeeze(-1) - ret).pow(2).mean()
            self.opt.zero_grad(set_to_none=True)
            (policy + 0.5 * value).backward()
            nn.utils.clip_grad_norm_(self.params, 0.5, foreach=True)
            self.opt.step()


class Rlkit:
    """The PPO recipe's learner and collector at SB3's settings."""

    def __init__(self, seed: int) -> None:
        from rlkit import _speedups
        from rlkit.algorithms import config_class, ppo
        from rlkit.data.collector import make_collector
        from rlkit.envs import make_env
        from rlkit.training import parse_config
        from rlkit.training.engine import Context, Counters

        self._patch = _speedups.patched()
        self._patch.__enter__()
        argv = ["--num-envs", str(NUM_ENVS), "--rollout-steps", str(STEPS), "--seed", str(seed)]
        cfg = parse_config(config_class("ppo"), argv, presets={})
        torch.manual_seed(seed)
        self.env = make_env("CartPole-v1", num_envs=NUM_ENVS, seed=seed)
        self.learner = ppo.build(cfg, self.env)
        for opt in self.learner.optimizers().values():
            _speedups.skip_cpu_graph_capture_check(opt)
        collector = make_collector(
            self.env, self.learner.collect_policy(), frames_per_batch=NUM_ENVS * STEPS
        )
        self.batches = iter(collector)
        fabric = SimpleNamespace(world_size=1, device=torch.device("cpu"))
        self.ctx = Context(fabric, total_frames=10**9, counters=Counters())

    def collect(self):
        return next(self.batches)

    def update(self, batch) -> None:
        self.learner.update(batch, self.ctx)


def _time_side(side, repeats: int, warmup: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"collect": [], "update": []}
    for i in range(warmup + repeats):
        start = time.perf_counter()
        batch = side.collect()
        mid = time.perf_counter()
        side.update(batch)
        end = time.perf_counter()
        if i >= warmup:
            times["collect"].append((mid - start) * 1e3)
            times["update"].append((end - mid) * 1e3)
    return times


def _sb3(seed: int, batches: int, python: str, protocol: str) -> dict[str, float]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    out = subprocess.run(
        [
            python,
            "sb3_split.py",
            "CartPole-v1",
            str(seed),
            "--batches",
            str(batches),
            "--protocol",
            protocol,
        ],
        cwd=PEERS,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="round-robin rounds")
    parser.add_argument("--batches", type=int, default=30, help="timed batches per side/round")
    parser.add_argument("--sb3-python", default=str(REPO_ROOT / ".venv-sb3" / "bin" / "python"))
    parser.add_argument(
        "--protocol", default=str(REPO_ROOT.parent / "shared" / "peers" / "sb3_solve.py")
    )
    parser.add_argument("--quick", action="store_true", help="1 round of 5 batches, no files")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.batches = 1, 5
    torch.set_num_threads(1)
    samples: dict[str, dict[str, list[float]]] = {
        s: {"collect": [], "update": []} for s in ("rlkit", "floor", "sb3")
    }
    for r in range(args.rounds):
        for name, make in (("rlkit", Rlkit), ("floor", Floor)):
            t = _time_side(make(seed=r), args.batches, warmup=3)
            for k in t:
                samples[name][k].extend(t[k])
        peer = _sb3(r, args.batches + 5, args.sb3_python, args.protocol)
        samples["sb3"]["collect"].append(peer["collect_ms"])
        samples["sb3"]["update"].append(peer["update_ms"])
        print(
            f"round {r}: "
            + ", ".join(
                f"{s} {statistics.median(v['collect']):.1f}+{statistics.median(v['update']):.1f} ms"
                for s, v in samples.items()
            ),
            flush=True,
        )

    med = {s: {k: statistics.median(v) for k, v in d.items()} for s, d in samples.items()}
    sb3_total = med["sb3"]["collect"] + med["sb3"]["update"]
    rows, summary = [], {}
    for side in ("sb3", "rlkit", "floor"):
        total = med[side]["collect"] + med[side]["update"]
        summary[side] = {
            "collect_ms": round(med[side]["collect"], 2),
            "update_ms": round(med[side]["update"], 2),
            "total_ms": round(total, 2),
            "fps": round(NUM_ENVS * STEPS / total * 1e3),
            "speedup_vs_sb3": round(sb3_total / total, 2),
        }
        s = summary[side]
        rows.append(
            [side, s["collect_ms"], s["update_ms"], s["total_ms"], s["fps"], s["speedup_vs_sb3"]]
        )
    table = markdown_table(
        ["side", "collect ms/batch", "update ms/batch", "total ms", "frames/s", "SB3 / side"],
        rows,
    )
    print(table)
    if args.quick:
        return
    payload = {
        "benchmark": "floor_ppo",
        "command": command_line(),
        "commit": git_commit(),
        "host": host_info(),
        "settings": {
            "num_envs": NUM_ENVS,
            "steps": STEPS,
            "epochs": EPOCHS,
            "minibatch": 256,
            "rounds": args.rounds,
            "batches": args.batches,
            "threads": 1,
        },
        "seeds": list(range(args.rounds)),
        "summary": summary,
        "samples": samples,
    }
    host = payload["host"]
    markdown = "\n".join(
        [
            "# PPO CartPole-v1 at SB3's settings: ms per batch against the eager floor",
            "",
            f"- commit `{payload['commit'].get('commit', '?')[:12]}`",
            f"- command: `{payload['command']}`",
            f"- host: {host.get('cpu_model', '?')}, load at start "
            f"{host.get('load_average_at_start')}; one torch thread; medians over "
            f"{args.rounds} rounds x {args.batches} batches (SB3: the median of each round's "
            "per-batch median), sides round-robin per round, seeds 0..rounds-1",
            "- batch: 8 envs x 32 steps = 256 frames; update: 20 epochs x one 256-row minibatch",
            "",
            table,
            "",
            "`floor` is plain PyTorch and gymnasium with no framework (see the module docstring): "
            "its `SB3 / side` is the most an eager implementation of the same arithmetic gains "
            "over SB3 on this CPU.",
            "",
        ]
    )
    write_results(RESULTS / "floor_ppo", payload, markdown)


if __name__ == "__main__":
    sys.exit(main())
