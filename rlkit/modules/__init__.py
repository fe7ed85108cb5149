"""Networks, actors, critics, target networks and observation normalisation.

See ``docs/modules.md`` for usage examples.
"""

from rlkit.modules.actors import categorical_actor, gaussian_actor, make_actor, shared_actor_critic
from rlkit.modules.builders import actor_critic_networks
from rlkit.modules.compat import ActionSpecMismatchError, check_actor_spec, check_env_compat
from rlkit.modules.critics import (
    make_q,
    make_value,
    q_critic_continuous,
    q_critic_discrete,
    value_critic,
)
from rlkit.modules.networks import (
    ENCODERS,
    ChannelsLast,
    FlatImage,
    ImpalaCNN,
    MinAtarCNN,
    NatureCNN,
    image_layout,
    init_orthogonal_,
    make_encoder,
    mlp,
    mlp_body,
)
from rlkit.modules.normalization import (
    BatchRewardNorm,
    Normalize,
    ObservationNorm,
    PopulationRewardNorm,
    RewardNorm,
    RunningMeanStd,
)
from rlkit.modules.target import TargetNetwork

__all__ = [
    "ActionSpecMismatchError",
    "ChannelsLast",
    "ENCODERS",
    "ImpalaCNN",
    "MinAtarCNN",
    "FlatImage",
    "NatureCNN",
    "Normalize",
    "ObservationNorm",
    "RewardNorm",
    "BatchRewardNorm",
    "PopulationRewardNorm",
    "RunningMeanStd",
    "TargetNetwork",
    "actor_critic_networks",
    "categorical_actor",
    "check_actor_spec",
    "check_env_compat",
    "gaussian_actor",
    "image_layout",
    "init_orthogonal_",
    "make_actor",
    "make_encoder",
    "make_q",
    "make_value",
    "mlp",
    "mlp_body",
    "q_critic_continuous",
    "q_critic_discrete",
    "shared_actor_critic",
    "value_critic",
]
