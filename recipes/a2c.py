"""A2C: synchronous advantage actor-critic (Mnih et al. 2016), as in Stable-Baselines3.

Run ``python recipes/a2c.py --help`` for every flag. The config, presets, networks and
learner live in :mod:`rlkit.algorithms.a2c`, importable from any directory; this script
only runs them.
"""

from rlkit.algorithms.a2c import main
from rlkit.training import cli

if __name__ == "__main__":
    cli(main)
