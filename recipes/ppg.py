"""PPG: Phasic Policy Gradient (Cobbe et al. 2020).

Run ``python recipes/ppg.py --help`` for every flag. The config, presets, networks and
learner live in :mod:`rlkit.algorithms.ppg`, importable from any directory; this script
only runs them.
"""

from rlkit.algorithms.ppg import main
from rlkit.training import cli

if __name__ == "__main__":
    cli(main)
