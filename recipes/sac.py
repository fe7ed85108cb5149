"""SAC: soft actor-critic (Haarnoja et al. 2018), continuous or discrete actions.

Run ``python recipes/sac.py --help`` for every flag. The config, presets, networks and
learner live in :mod:`rlkit.algorithms.sac`, importable from any directory; this script
only runs them.
"""

from rlkit.algorithms.sac import main
from rlkit.training import cli

if __name__ == "__main__":
    cli(main)
