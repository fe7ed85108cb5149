"""Loss modules: one file per algorithm, maths in :mod:`rlkit.objectives.functional`.

Every loss follows TorchRL's ``LossModule`` contract: ``forward(td)`` returns a
TensorDict whose ``loss_*`` entries are weighted scalars to be summed
(:func:`total_loss`) and whose other entries are detached diagnostics. See
``docs/objectives.md``.
"""

from rlkit.objectives import functional
from rlkit.objectives.a2c import A2CLoss
from rlkit.objectives.common import ActorCriticLoss, MissingKeyError, total_loss
from rlkit.objectives.functional import standardize
from rlkit.objectives.ppo import PPOLoss

__all__ = [
    "A2CLoss",
    "ActorCriticLoss",
    "MissingKeyError",
    "PPOLoss",
    "functional",
    "standardize",
    "total_loss",
]

from rlkit.objectives.dqn import DQNLoss, nstep_transitions  # noqa: E402
from rlkit.objectives.sac import DiscreteSACLoss, SACLoss  # noqa: E402

__all__ += ["DQNLoss", "DiscreteSACLoss", "SACLoss", "nstep_transitions"]

from rlkit.objectives.appo import APPOLoss  # noqa: E402
from rlkit.objectives.impala import IMPALALoss  # noqa: E402

__all__ += ["APPOLoss", "IMPALALoss"]

from rlkit.objectives.ppg import PPGAuxLoss  # noqa: E402

__all__ += ["PPGAuxLoss"]
