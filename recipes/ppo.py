"""PPO: Proximal Policy Optimization (Schulman et al. 2017), PPO2-style options.

Run ``python recipes/ppo.py --help`` for every flag. The config, presets, networks and
learner live in :mod:`rlkit.algorithms.ppo`, importable from any directory; this script
only runs them.
"""

from rlkit.algorithms.ppo import main
from rlkit.training import cli

if __name__ == "__main__":
    cli(main)
