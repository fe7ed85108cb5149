"""rlkit: a modular reinforcement-learning kit on TorchRL, TensorDict and Lightning."""

from rlkit import _quiet  # noqa: F401  (silence third-party import-time warnings first)

__version__ = "0.1.0"
