"""DQN: deep Q-learning from a replay buffer (Mnih et al. 2015), double-DQN and n-step options.

Run ``python recipes/dqn.py --help`` for every flag. The config and presets live in
:mod:`rlkit.configs.dqn` (torch-free: flags and ``--help`` answer at once), the networks,
learner and ``train`` in :mod:`rlkit.algorithms.dqn`, importable from any directory; this
script only runs them.
"""

from rlkit.algorithms import recipe

if __name__ == "__main__":
    recipe("dqn")
