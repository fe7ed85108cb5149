"""Peer: Stable-Baselines3's final return at a frame budget, with rl-zoo3's settings.

    python sb3_final.py ALGO ENV_ID FRAME_BUDGET SEED [EVAL_EVERY]
    python sb3_final.py sac Hopper-v5 200000 0 20000
    python sb3_final.py ppo Swimmer-v5 1000000 0 50000
    python sb3_final.py --known       # the ALGO:ENV_ID pairs it has settings for, as JSON

The final-return sibling of the shared time-to-solve protocol (``../shared/peers/sb3_solve.py``):
the same evaluation (the deterministic policy on 10 episodes, reset with seeds 10000 + i, one
torch thread), every ``EVAL_EVERY`` frames and at the budget, never stopping early. Prints one
JSON line: the final mean return, the curve and the training seconds (evaluations excluded).
``benchmarks/bench_learning.py --sb3-python`` runs it next to rlkit for the same seeds, and
``benchmarks/bench_suite.py`` across a suite.

Settings: rl-zoo3's tuned files (DLR-RM/rl-baselines3-zoo at commit
208b6fdf3a9aa24de44b2e068c6e5f6a07d97fcc, ``hyperparams/ppo.yml`` and ``hyperparams/sac.yml``,
section "=== Mujoco Envs ==="), each v4 (or v2) id mapped to its v5 id. Where the zoo says
``normalize: true`` the training env is wrapped in ``VecNormalize`` (observations and rewards,
its ``gamma`` the algorithm's, as the zoo's ``ExperimentManager`` does) and the evaluation
normalises observations with the training statistics frozen (no update, raw rewards), as the
zoo's evaluation with ``vecnormalize.pkl`` does. ``n_envs`` defaults to 1 as in the zoo.
"""

import json
import sys
import time

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3 import PPO, SAC
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import VecNormalize

# rl-zoo3's policy_kwargs for its tuned HalfCheetah, Hopper, Humanoid and HumanoidStandup PPO
ZOO_PPO_NET = dict(
    log_std_init=-2,
    ortho_init=False,
    activation_fn=torch.nn.ReLU,
    net_arch=dict(pi=[256, 256], vf=[256, 256]),
)


def _ppo(n_envs: int = 1, **kw) -> dict:
    return dict(n_envs=n_envs, normalize=True, kw=kw)


# hyperparams/ppo.yml (zoo id in each comment); every entry has "normalize: true"
ZOO_PPO = {
    # Ant-v4: &mujoco-defaults (SB3's PPO defaults)
    "Ant-v5": _ppo(),
    # Swimmer-v4 ("tuned"): mujoco-defaults with these
    "Swimmer-v5": _ppo(
        4, gamma=0.9999, n_steps=1024, batch_size=256, learning_rate=6e-4, gae_lambda=0.98
    ),
    # HalfCheetah-v4
    "HalfCheetah-v5": _ppo(
        batch_size=64,
        n_steps=512,
        gamma=0.98,
        learning_rate=2.0633e-05,
        ent_coef=0.000401762,
        clip_range=0.1,
        n_epochs=20,
        gae_lambda=0.92,
        max_grad_norm=0.8,
        vf_coef=0.58096,
        policy_kwargs=ZOO_PPO_NET,
    ),
    # Hopper-v4
    "Hopper-v5": _ppo(
        batch_size=32,
        n_steps=512,
        gamma=0.999,
        learning_rate=9.80828e-05,
        ent_coef=0.00229519,
        clip_range=0.2,
        n_epochs=5,
        gae_lambda=0.99,
        max_grad_norm=0.7,
        vf_coef=0.835671,
        policy_kwargs=ZOO_PPO_NET,
    ),
    # HumanoidStandup-v2
    "HumanoidStandup-v5": _ppo(
        batch_size=32,
        n_steps=512,
        gamma=0.99,
        learning_rate=2.55673e-05,
        ent_coef=3.62109e-06,
        clip_range=0.3,
        n_epochs=20,
        gae_lambda=0.9,
        max_grad_norm=0.7,
        vf_coef=0.430793,
        policy_kwargs=ZOO_PPO_NET,
    ),
    # Humanoid-v4
    "Humanoid-v5": _ppo(
        batch_size=256,
        n_steps=512,
        gamma=0.95,
        learning_rate=3.56987e-05,
        ent_coef=0.00238306,
        clip_range=0.3,
        n_epochs=5,
        gae_lambda=0.9,
        max_grad_norm=2,
        vf_coef=0.431892,
        policy_kwargs=ZOO_PPO_NET,
    ),
    # InvertedDoublePendulum-v2
    "InvertedDoublePendulum-v5": _ppo(
        batch_size=512,
        n_steps=128,
        gamma=0.98,
        learning_rate=0.000155454,
        ent_coef=1.05057e-06,
        clip_range=0.4,
        n_epochs=10,
        gae_lambda=0.8,
        max_grad_norm=0.5,
        vf_coef=0.695929,
    ),
    # InvertedPendulum-v2
    "InvertedPendulum-v5": _ppo(
        batch_size=64,
        n_steps=32,
        gamma=0.999,
        learning_rate=0.000222425,
        ent_coef=1.37976e-07,
        clip_range=0.4,
        n_epochs=5,
        gae_lambda=0.9,
        max_grad_norm=0.3,
        vf_coef=0.19816,
    ),
    # Reacher-v2
    "Reacher-v5": _ppo(
        batch_size=32,
        n_steps=512,
        gamma=0.9,
        learning_rate=0.000104019,
        ent_coef=7.52585e-08,
        clip_range=0.3,
        n_epochs=5,
        gae_lambda=1.0,
        max_grad_norm=0.9,
        vf_coef=0.950368,
    ),
    # Walker2d-v4
    "Walker2d-v5": _ppo(
        batch_size=32,
        n_steps=512,
        gamma=0.99,
        learning_rate=5.05041e-05,
        ent_coef=0.000585045,
        clip_range=0.1,
        n_epochs=20,
        gae_lambda=0.95,
        max_grad_norm=1,
        vf_coef=0.871923,
    ),
}

# hyperparams/sac.yml: HalfCheetah-v4: &mujoco-defaults (SB3's SAC defaults with
# learning_starts 10000), shared by Ant-v4, Hopper-v4, Walker2d-v4 and Humanoid-v4;
# Swimmer-v4 adds gamma 0.999. No VecNormalize.
MUJOCO_SAC = dict(n_envs=1, normalize=False, kw=dict(learning_starts=10_000))
ZOO_SAC = {
    task: MUJOCO_SAC
    for task in ("HalfCheetah-v5", "Ant-v5", "Hopper-v5", "Walker2d-v5", "Humanoid-v5")
}
ZOO_SAC["Swimmer-v5"] = dict(MUJOCO_SAC, kw=dict(learning_starts=10_000, gamma=0.999))

ZOO = {("ppo", t): c for t, c in ZOO_PPO.items()} | {("sac", t): c for t, c in ZOO_SAC.items()}
ALGOS = dict(ppo=PPO, sac=SAC)


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
    if cfg["normalize"]:
        env = VecNormalize(env, gamma=cfg["kw"].get("gamma", 0.99))
    model = ALGOS[algo]("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **cfg["kw"])
    eval_env = gym.make(env_id)

    def evaluate(n: int = 10) -> float:
        """The deterministic policy's mean return; with VecNormalize, observations normalised
        by the training statistics as they stand (normalize_obs never updates them)."""
        returns = []
        for i in range(n):
            obs, _ = eval_env.reset(seed=10_000 + i)
            done, ret = False, 0.0
            while not done:
                seen = env.normalize_obs(obs) if cfg["normalize"] else obs
                action, _ = model.predict(seen, deterministic=True)
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
    if sys.argv[1:] == ["--known"]:  # the (algo, task) pairs the zoo tunes, for bench_suite.py
        print(json.dumps(sorted(f"{algo}:{task}" for algo, task in ZOO)))
    else:
        main(sys.argv[1:])
