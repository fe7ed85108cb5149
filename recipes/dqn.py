"""DQN: deep Q-learning from a replay buffer (Mnih et al. 2015), double-DQN and n-step options.

Run ``python recipes/dqn.py --help`` for every flag. The config, presets, networks and
learner live in :mod:`rlkit.algorithms.dqn`, importable from any directory; this script
only runs them.
"""

from rlkit.algorithms.dqn import main
from rlkit.training import cli

if __name__ == "__main__":
    cli(main)
