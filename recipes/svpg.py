"""SVPG: Stein Variational Policy Gradient (Liu, Ramachandran, Liu & Peng 2017), A2C particles.

Run ``python recipes/svpg.py --help`` for every flag. The config, presets, networks and
learner live in :mod:`rlkit.algorithms.svpg`, importable from any directory; this script
only runs them.
"""

from rlkit.algorithms.svpg import main
from rlkit.training import cli

if __name__ == "__main__":
    cli(main)
