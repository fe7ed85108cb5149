"""Peer throughput: Stable-Baselines3 frames/s for a fixed frame budget, no evaluation.

Runs in the benchmark-only environment ``.venv-sb3`` (``benchmarks/peers/setup_sb3.sh``):

    .venv-sb3/bin/python benchmarks/peers/sb3_fps.py ppo CartPole-v1 50000 0

Trains ``ALGO`` on ``ENV_ID`` for ``FRAMES`` environment steps with exactly the rl-zoo3
hyperparameters of the shared protocol ``../shared/peers/sb3_solve.py``: its ``ZOO`` table
is read from that file at run time (parsed with ``ast``, not copied), so the two cannot
drift apart. Like the protocol: ``torch.set_num_threads(1)``, ``device="cpu"``,
``make_vec_env(..., seed=SEED)``. Prints one JSON line:
``{"peer", "algo", "env", "seed", "frames", "train_seconds", "fps", "setup_seconds"}``,
where ``train_seconds`` times ``model.learn`` only and ``fps = frames / train_seconds``
(rollouts plus updates, as SB3 users see it).
"""

from __future__ import annotations

import argparse
import ast
import json
import time
from pathlib import Path
from typing import Any

DEFAULT_PROTOCOL = Path(__file__).resolve().parents[3] / "shared" / "peers" / "sb3_solve.py"


def lin(value: float):
    """Linear schedule from ``value`` to 0, as in the protocol (progress goes 1 -> 0)."""
    return lambda progress: progress * value


def load_zoo(protocol: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """Evaluate the ``ZOO = {...}`` assignment of ``protocol`` with ``lin`` in scope."""
    if not protocol.is_file():
        raise FileNotFoundError(
            f"peer protocol {protocol} not found: it lives outside the repository at "
            "../shared/peers/sb3_solve.py; pass --protocol PATH"
        )
    tree = ast.parse(protocol.read_text(), filename=str(protocol))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "ZOO" for t in node.targets
        ):
            code = compile(ast.Expression(node.value), str(protocol), "eval")
            return eval(code, {"lin": lin, "dict": dict})  # noqa: S307 (trusted, shared file)
    raise ValueError(f"{protocol} has no top-level `ZOO = {{...}}` table")


def main() -> None:
    """Parse arguments, train for the frame budget, print the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("algo", choices=["ppo", "a2c", "dqn", "sac"])
    parser.add_argument("env_id")
    parser.add_argument("frames", type=int, help="environment steps to train for")
    parser.add_argument("seed", type=int)
    parser.add_argument("--protocol", type=Path, default=DEFAULT_PROTOCOL)
    args = parser.parse_args()
    zoo = load_zoo(args.protocol)
    if (args.algo, args.env_id) not in zoo:
        parser.error(f"no zoo entry for {(args.algo, args.env_id)}; known: {sorted(zoo)}")

    setup_start = time.perf_counter()
    import torch
    from stable_baselines3 import A2C, DQN, PPO, SAC
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(1)
    cfg = zoo[(args.algo, args.env_id)]
    algo_cls = {"ppo": PPO, "a2c": A2C, "dqn": DQN, "sac": SAC}[args.algo]
    env = make_vec_env(args.env_id, n_envs=cfg["n_envs"], seed=args.seed)
    model = algo_cls("MlpPolicy", env, seed=args.seed, device="cpu", verbose=0, **cfg["kw"])
    setup_seconds = time.perf_counter() - setup_start

    start = time.perf_counter()
    model.learn(total_timesteps=args.frames)
    train_seconds = time.perf_counter() - start
    frames = int(model.num_timesteps)
    result = dict(
        peer="sb3",
        algo=args.algo,
        env=args.env_id,
        seed=args.seed,
        frames=frames,
        train_seconds=round(train_seconds, 3),
        fps=round(frames / train_seconds, 1),
        setup_seconds=round(setup_seconds, 3),
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
