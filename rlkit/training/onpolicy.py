"""Moved: the on-policy config and learner live in :mod:`rlkit.algorithms.onpolicy`."""

from rlkit.algorithms.onpolicy import *  # noqa: F403
from rlkit.algorithms.onpolicy import _Mean, build_actor_critic  # noqa: F401
from rlkit.modules.normalization import Normalize  # noqa: F401
