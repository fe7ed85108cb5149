"""APPO: asynchronous PPO with V-trace and a clipped target network (IMPACT, Luo et al. 2020).

Run ``python recipes/appo.py --help`` for every flag. The config and presets live in
:mod:`rlkit.configs.appo` (torch-free: flags and ``--help`` answer at once), the networks,
learner and ``train`` in :mod:`rlkit.algorithms.appo`, importable from any directory; this
script only runs them.
"""

from rlkit.algorithms import recipe

if __name__ == "__main__":
    recipe("appo")
