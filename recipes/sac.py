"""SAC: soft actor-critic (Haarnoja et al. 2018), continuous or discrete actions.

Run ``python recipes/sac.py --help`` for every flag. The config and presets live in
:mod:`rlkit.configs.sac` (torch-free: flags and ``--help`` answer at once), the networks,
learner and ``train`` in :mod:`rlkit.algorithms.sac`, importable from any directory; this
script only runs them.
"""

from rlkit.algorithms import recipe

if __name__ == "__main__":
    recipe("sac")
