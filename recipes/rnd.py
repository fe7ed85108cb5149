"""RND-PPO: Exploration by Random Network Distillation (Burda et al. 2018), twin critic.

Run ``python recipes/rnd.py --help`` for every flag. The config and presets live in
:mod:`rlkit.configs.rnd` (torch-free: flags and ``--help`` answer at once), the networks,
learner and ``train`` in :mod:`rlkit.algorithms.rnd`, importable from any directory; this
script only runs them.
"""

from rlkit.algorithms import recipe

if __name__ == "__main__":
    recipe("rnd")
