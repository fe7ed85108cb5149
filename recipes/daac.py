"""DAAC: Decoupled Advantage Actor-Critic (Raileanu & Fergus 2021).

Run ``python recipes/daac.py --help`` for every flag. The config, presets, networks and
learner live in :mod:`rlkit.algorithms.daac`, importable from any directory; this script
only runs them.
"""

from rlkit.algorithms.daac import main
from rlkit.training import cli

if __name__ == "__main__":
    cli(main)
