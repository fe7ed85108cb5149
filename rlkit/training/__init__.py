"""The training engine on Lightning Fabric: config parsing, the loop, the one update loop,
checkpoints, evaluation and logs. Algorithms live in :mod:`rlkit.algorithms`."""

from rlkit.training.checkpoint import CheckpointError
from rlkit.training.config import TrainConfig, parse_config
from rlkit.training.engine import Context, Engine, Learner, NonFiniteError, cli, run

__all__ = [
    "CheckpointError",
    "Context",
    "Engine",
    "Learner",
    "NonFiniteError",
    "TrainConfig",
    "cli",
    "parse_config",
    "run",
]
