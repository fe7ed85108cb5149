"""SVPG: Stein Variational Policy Gradient (Liu, Ramachandran, Liu & Peng 2017), A2C or PPO
particles.

Run ``python recipes/svpg.py --help`` for every flag. The config and presets live in
:mod:`rlkit.configs.svpg` (torch-free: flags and ``--help`` answer at once), the networks,
learner and ``train`` in :mod:`rlkit.algorithms.svpg`, importable from any directory; this
script only runs them.
"""

from rlkit.algorithms import recipe

if __name__ == "__main__":
    recipe("svpg")
