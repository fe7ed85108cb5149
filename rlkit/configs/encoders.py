"""``--encoder`` and ``--feature-dim``, torch-free: the observation encoder of every recipe
whose action space fits (ppo, a2c, impala, appo, ppg, daac, rnd, dqn, and sac for discrete
actions). The encoders themselves are built by :func:`rlkit.modules.networks.make_encoder`
(the registry these choices name)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlkit.configs.base import positive

#: ``--encoder`` choices, the keys of :data:`rlkit.modules.networks.ENCODERS`
ENCODERS = ("mlp", "nature", "impala", "minatar", "flatten")


@dataclass(frozen=True)
class EncoderConfig:
    """Flags of the observation encoder: ``--encoder NAME`` and ``--feature-dim N``.

    Mixed in before the recipe's config class (``class PPOConfig(EncoderConfig, ...)``), so
    its ``__post_init__`` runs the rest of the chain first. With an image encoder, each
    network gets its own encoder followed by the ``--hidden`` layers and its head (PPG: as
    ``--arch`` says; DQN's target and SAC's target critics are copies); ``mlp`` (the
    default) builds exactly the networks it always did."""

    encoder: str = field(
        default="mlp",
        metadata={
            "help": "observation encoder: mlp (flat vectors), or for images ([H, W, C] or "
            "[C, H, W], uint8 pixels scaled inside) nature (Mnih et al. 2015 DQN CNN), "
            "impala (Espeholt et al. 2018 residual CNN) or minatar (Young & Tian 2019: one "
            "16-filter 3x3 conv) or flatten (the pixels as one vector, no conv: gymnax-blines' "
            "MinAtar MLP); the --hidden layers follow it",
            "choices": ENCODERS,
        },
    )
    feature_dim: int | None = field(
        default=None,
        metadata={
            "help": "width of the image encoder's output features (rllte's feature_dim); "
            "none: the paper's, 512 nature, 256 impala, 128 minatar"
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()  # type: ignore[misc]
        positive(self, "feature_dim")
        if self.encoder == "mlp" and self.feature_dim is not None:
            raise ValueError(
                "--feature-dim sizes an image encoder's output; --encoder mlp has none (its "
                "layers are --hidden): drop --feature-dim or add --encoder nature, impala or "
                "minatar"
            )


@dataclass(frozen=True)
class OffPolicyEncoderConfig(EncoderConfig):
    """:class:`EncoderConfig` for the off-policy recipes (dqn, sac): with an image encoder
    ``--hidden`` may be empty (a preset's ``hidden=()``), so the head reads the encoder's
    features directly, as the Nature and MinAtar DQN networks do. ``OffPolicyConfig`` refuses
    an empty ``--hidden`` only with ``--encoder mlp`` (an MLP needs layers)."""
