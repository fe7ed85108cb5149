"""rlkit: a modular reinforcement-learning kit on TorchRL, TensorDict and Lightning."""

from rlkit import _quiet, _speedups  # _quiet first: it silences third-party import notices

_speedups.apply()
del _quiet

__version__ = "0.1.0"
