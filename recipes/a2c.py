"""A2C: synchronous advantage actor-critic (Mnih et al. 2016), as in Stable-Baselines3.

Run ``python recipes/a2c.py --help`` for every flag. The config and presets live in
:mod:`rlkit.configs.a2c` (torch-free: flags and ``--help`` answer at once), the networks,
learner and ``train`` in :mod:`rlkit.algorithms.a2c`, importable from any directory; this
script only runs them.
"""

from rlkit.algorithms import recipe

if __name__ == "__main__":
    recipe("a2c")
