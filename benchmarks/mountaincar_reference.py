"""How good a MountainCar-v0 policy must be to pass the published solve (-110 over 100
episodes; rlkit's bars use the mean of 10 deterministic evaluation episodes).

Plays two hand-written policies from the same start states (``env.reset(seed=s)``):

- ``velocity-sign, right from rest`` and ``velocity-sign, left from rest``: push in the
  direction of the velocity, the usual energy-pumping heuristic; at rest (every start has
  velocity 0) push right, or left. The second is what IMPALA and PPO learn here
  (docs/recipes/impala.md, "Results");
- ``best-first-push``: for each start, the best of "push left or right for k steps (k < 60),
  then follow the velocity's sign", found by trying every choice from that exact start. It
  knows the start, so it is an optimistic reference, not a policy a learner could match.

Prints each one's mean, range and the share of consecutive 10-episode blocks whose mean is
-110 or better::

    python benchmarks/mountaincar_reference.py --starts 300
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np

LEFT, RIGHT = 0, 2


def play(env, state: np.ndarray, first: int, k: int, at_rest: int = RIGHT) -> float:
    """The return from ``state`` of: ``first`` for ``k`` steps, then the velocity's sign
    (``at_rest`` at velocity 0)."""
    raw = env.unwrapped
    raw.state = np.array(state, dtype=np.float64)
    total = 0.0
    for t in range(200):
        v = raw.state[1]
        action = first if t < k else (RIGHT if v > 0 else LEFT if v < 0 else at_rest)
        _, reward, terminated, _, _ = raw.step(action)
        total += reward
        if terminated:
            break
    return total


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=300, help="start states (seeds 0..N-1)")
    args = parser.parse_args(argv)
    env = gym.make("MountainCar-v0")
    returns: dict[str, list[float]] = {
        "velocity-sign, right from rest": [],
        "velocity-sign, left from rest": [],
        "best-first-push": [],
    }
    for seed in range(args.starts):
        env.reset(seed=seed)
        start = env.unwrapped.state.copy()
        returns["velocity-sign, right from rest"].append(play(env, start, RIGHT, 0))
        returns["velocity-sign, left from rest"].append(play(env, start, LEFT, 0, at_rest=LEFT))
        returns["best-first-push"].append(
            max(play(env, start, first, k) for first in (LEFT, RIGHT) for k in range(60))
        )
    out = {}
    for name, values in returns.items():
        r = np.asarray(values)
        blocks = r[: len(r) // 10 * 10].reshape(-1, 10).mean(axis=1)
        out[name] = {
            "mean": float(r.mean()),
            "min": float(r.min()),
            "max": float(r.max()),
            "blocks_at_or_above_-110": float((blocks >= -110).mean()),
        }
        print(
            f"{name:31s} mean {r.mean():7.1f}  range [{r.min():.0f}, {r.max():.0f}]  "
            f"10-episode blocks >= -110: {(blocks >= -110).mean():.0%} of {len(blocks)}"
        )
    return out


if __name__ == "__main__":
    main()
