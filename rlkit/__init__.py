"""rlkit: a modular reinforcement-learning kit on TorchRL, TensorDict and Lightning.

Importing rlkit changes nothing outside it: warning filters and speed work-arounds apply
inside the engine's ``run`` and the recipes' command line only (``rlkit._quiet``,
``rlkit._speedups``).
"""

__version__ = "0.1.0"
