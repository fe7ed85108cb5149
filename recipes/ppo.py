"""PPO: Proximal Policy Optimization (Schulman et al. 2017), PPO2-style options.

Run ``python recipes/ppo.py --help`` for every flag. The config and presets live in
:mod:`rlkit.configs.ppo` (torch-free: flags and ``--help`` answer at once), the networks,
learner and ``train`` in :mod:`rlkit.algorithms.ppo`, importable from any directory; this
script only runs them.
"""

from rlkit.algorithms import recipe

if __name__ == "__main__":
    recipe("ppo")
