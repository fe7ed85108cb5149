"""APPO: asynchronous PPO with V-trace and a clipped target network (IMPACT, Luo et al. 2020).

Run ``python recipes/appo.py --help`` for every flag. The config, presets, networks and
learner live in :mod:`rlkit.algorithms.appo`, importable from any directory; this script
only runs them.
"""

from rlkit.algorithms.appo import main
from rlkit.training import cli

if __name__ == "__main__":
    cli(main)
