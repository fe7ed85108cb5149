"""Each algorithm's config, torch-free: what ``recipes/<name>.py --help`` needs and no more.

``rlkit.configs.<name>`` holds the algorithm's config dataclass (every field a flag, with
its validation), its per-environment ``PRESETS``, the algorithm box that ``--help`` shows
(the module docstring) and ``CONFIG``, the config class the recipe parses. Shared bases:
:mod:`rlkit.configs.onpolicy` (policy-gradient flags, GAE, clipping) and
:mod:`rlkit.configs.offpolicy` (replay); the V-trace base lives with IMPALA.

Nothing here imports torch, TensorDict, TorchRL or Lightning, so a recipe parses its flags
(and answers ``--help``) at once; :mod:`rlkit.algorithms.<name>` (networks, learner,
``train``) imports the same names, so ``rlkit.algorithms.ppo.PPOConfig`` is
``rlkit.configs.ppo.PPOConfig``::

    from rlkit.configs import ppo
    cfg = ppo.PPOConfig(total_frames=20_000)   # validated, no torch imported
"""

#: every algorithm, by the name of its config module, its module in :mod:`rlkit.algorithms` and
#: its recipe
NAMES = ("a2c", "appo", "daac", "dqn", "impala", "ppg", "ppo", "rnd", "sac", "svpg")
