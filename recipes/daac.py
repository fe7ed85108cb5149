"""DAAC: Decoupled Advantage Actor-Critic (Raileanu & Fergus 2021).

Run ``python recipes/daac.py --help`` for every flag. The config and presets live in
:mod:`rlkit.configs.daac` (torch-free: flags and ``--help`` answer at once), the networks,
learner and ``train`` in :mod:`rlkit.algorithms.daac`, importable from any directory; this
script only runs them.
"""

from rlkit.algorithms import recipe

if __name__ == "__main__":
    recipe("daac")
