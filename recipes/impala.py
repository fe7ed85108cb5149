"""IMPALA: V-trace actor-critic with asynchronous collection (Espeholt et al. 2018).

Run ``python recipes/impala.py --help`` for every flag. The config, presets, networks and
learner live in :mod:`rlkit.algorithms.impala`, importable from any directory; this script
only runs them.
"""

from rlkit.algorithms.impala import main
from rlkit.training import cli

if __name__ == "__main__":
    cli(main)
