"""Loss modules: one file per algorithm, maths in :mod:`rlkit.objectives.functional`.

Every loss follows TorchRL's ``LossModule`` contract: ``forward(td)`` returns a
TensorDict whose ``loss_*`` entries are weighted scalars to be summed
(:func:`total_loss`) and whose other entries are detached diagnostics. See
``docs/objectives.md``.
"""

from rlkit.objectives import functional
from rlkit.objectives.a2c import A2CLoss
from rlkit.objectives.appo import APPOLoss
from rlkit.objectives.common import ActorCriticLoss, MissingKeyError, total_loss
from rlkit.objectives.daac import DAACLoss, DAACValueLoss
from rlkit.objectives.dqn import DQNLoss, nstep_transitions
from rlkit.objectives.functional import standardize
from rlkit.objectives.impala import IMPALALoss
from rlkit.objectives.ppg import PPGAuxLoss
from rlkit.objectives.ppo import PPOLoss
from rlkit.objectives.rnd import RND, ReturnScaler
from rlkit.objectives.sac import DiscreteSACLoss, SACLoss
from rlkit.objectives.svpg import median_bandwidth, rbf_kernel, stein_update

__all__ = [
    "A2CLoss",
    "APPOLoss",
    "ActorCriticLoss",
    "DAACLoss",
    "DAACValueLoss",
    "DQNLoss",
    "DiscreteSACLoss",
    "IMPALALoss",
    "MissingKeyError",
    "PPGAuxLoss",
    "PPOLoss",
    "RND",
    "ReturnScaler",
    "SACLoss",
    "functional",
    "median_bandwidth",
    "nstep_transitions",
    "rbf_kernel",
    "standardize",
    "stein_update",
    "total_loss",
]
