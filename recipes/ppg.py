"""PPG: Phasic Policy Gradient (Cobbe et al. 2020).

Run ``python recipes/ppg.py --help`` for every flag. The config and presets live in
:mod:`rlkit.configs.ppg` (torch-free: flags and ``--help`` answer at once), the networks,
learner and ``train`` in :mod:`rlkit.algorithms.ppg`, importable from any directory; this
script only runs them.
"""

from rlkit.algorithms import recipe

if __name__ == "__main__":
    recipe("ppg")
