"""RND-PPO: Exploration by Random Network Distillation (Burda et al. 2018), twin critic.

Run ``python recipes/rnd.py --help`` for every flag. The config, presets, networks and
learner live in :mod:`rlkit.algorithms.rnd`, importable from any directory; this script
only runs them.
"""

from rlkit.algorithms.rnd import main
from rlkit.training import cli

if __name__ == "__main__":
    cli(main)
