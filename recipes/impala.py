"""IMPALA: V-trace actor-critic with asynchronous collection (Espeholt et al. 2018).

Run ``python recipes/impala.py --help`` for every flag. The config and presets live in
:mod:`rlkit.configs.impala` (torch-free: flags and ``--help`` answer at once), the networks,
learner and ``train`` in :mod:`rlkit.algorithms.impala`, importable from any directory; this
script only runs them.
"""

from rlkit.algorithms import recipe

if __name__ == "__main__":
    recipe("impala")
