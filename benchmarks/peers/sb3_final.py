"""Peer: Stable-Baselines3's final return at a frame budget, with rl-zoo3's settings.

    python sb3_final.py ALGO ENV_ID FRAME_BUDGET SEED [EVAL_EVERY]
    python sb3_final.py sac Hopper-v5 200000 0 20000

The final-return sibling of the shared time-to-solve protocol (``../shared/peers/sb3_solve.py``):
the same evaluation (the deterministic policy on 10 episodes, reset with seeds 10000 + i, one
torch thread), every ``EVAL_EVERY`` frames and at the budget, never stopping early. Prints one
JSON line: the final mean return, the curve and the training seconds (evaluations excluded).
``benchmarks/bench_learning.py --sb3-python`` runs it next to rlkit for the same seeds.

Settings (rl-zoo3 ``hyperparams/sac.yml``, ``mujoco-defaults``, shared by Hopper, HalfCheetah
and Walker2d): SB3's SAC defaults with ``learning_starts=10000``.
"""

import json
import sys
import time

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3 import SAC
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env

MUJOCO_SAC = dict(n_envs=1, kw=dict(learning_starts=10_000))
ZOO = {("sac", task): MUJOCO_SAC for task in ("Hopper-v5", "HalfCheetah-v5", "Walker2d-v5")}
ALGOS = dict(sac=SAC)


def main(argv: list[str]) -> None:
    if len(argv) not in (4, 5):
        sys.exit(__doc__)
    algo, env_id, budget, seed = argv[0], argv[1], int(argv[2]), int(argv[3])
    eval_every = int(argv[4]) if len(argv) > 4 else 20_000
    if (algo, env_id) not in ZOO:
        sys.exit(f"sb3_final.py: no rl-zoo3 settings for {algo} on {env_id}; known: {list(ZOO)}")
    torch.set_num_threads(1)
    cfg = ZOO[(algo, env_id)]
    env = make_vec_env(env_id, n_envs=cfg["n_envs"], seed=seed)
    model = ALGOS[algo]("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **cfg["kw"])
    eval_env = gym.make(env_id)

    def evaluate(n: int = 10) -> float:
        returns = []
        for i in range(n):
            obs, _ = eval_env.reset(seed=10_000 + i)
            done, ret = False, 0.0
            while not done:
                action, _ = model.predict(obs, deterministic=True)
                obs, reward, term, trunc, _ = eval_env.step(action)
                ret += float(reward)
                done = term or trunc
            returns.append(ret)
        return float(np.mean(returns))

    class Probe(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.next_eval, self.eval_time, self.curve = eval_every, 0.0, []

        def _on_step(self) -> bool:
            if self.num_timesteps >= self.next_eval:
                self.next_eval += eval_every
                self.record()
            return True

        def record(self) -> None:
            t = time.perf_counter()
            self.curve.append((int(self.num_timesteps), evaluate()))
            self.eval_time += time.perf_counter() - t

    probe = Probe()
    start = time.perf_counter()
    model.learn(total_timesteps=budget, callback=probe)
    if not probe.curve or probe.curve[-1][0] != model.num_timesteps:
        probe.record()  # the final evaluation, at the budget
    train_seconds = time.perf_counter() - start - probe.eval_time
    print(
        json.dumps(
            dict(
                peer="sb3",
                algo=algo,
                env=env_id,
                seed=seed,
                frames=int(model.num_timesteps),
                final_return=probe.curve[-1][1],
                curve=probe.curve,
                train_seconds=round(train_seconds, 2),
                fps=round(model.num_timesteps / train_seconds, 1),
            )
        )
    )


if __name__ == "__main__":
    main(sys.argv[1:])
