"""The Lightning (Fabric) training layer: configs, the engine, learners, logs, checkpoints."""

from rlkit.training.checkpoint import CheckpointError
from rlkit.training.config import TrainConfig, parse_config
from rlkit.training.engine import Context, Engine, Learner, NonFiniteError, cli, run
from rlkit.training.onpolicy import OnPolicyConfig, PolicyGradientLearner

__all__ = [
    "CheckpointError",
    "Context",
    "Engine",
    "Learner",
    "NonFiniteError",
    "OnPolicyConfig",
    "PolicyGradientLearner",
    "TrainConfig",
    "cli",
    "parse_config",
    "run",
]
