"""Flags of a critic trained apart from the policy (pyrado's ``GAE`` settings), torch-free.

``--value-lr``, ``--value-epochs``, ``--value-minibatch-size`` and ``--value-max-grad-norm``
each default to none: the critic then trains in the policy's loss, with the policy's
optimiser, epochs, minibatches and clip, exactly as without these flags. Setting any of them
gives the critic a loss group of its own (:class:`rlkit.algorithms.critic.CriticGroupLearner`).
``--empirical-returns`` sets what the critic regresses on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlkit.configs.base import non_negative, positive

#: the fields that give the critic its own loss group when one is set
CRITIC_GROUP_FIELDS = ("value_lr", "value_epochs", "value_minibatch_size", "value_max_grad_norm")


def _help(text: str, **kw: Any) -> dict[str, Any]:
    return {"help": text, **kw}


@dataclass(frozen=True)
class CriticConfig:
    """Flags of the critic's own training settings (PPO, A2C).

    Mixed in before the recipe's config class (``class PPOConfig(CriticConfig, ...)``), so its
    ``__post_init__`` runs the rest of the chain first (``batch_size`` and ``minibatch`` come
    from :class:`~rlkit.configs.onpolicy.PolicyGradientConfig`)."""

    value_lr: float | None = field(
        default=None,
        metadata=_help(
            "the critic's learning rate, on the policy's schedule (pyrado's GAE lr); none: "
            "--lr, in the policy's optimiser unless another --value-* flag is set"
        ),
    )
    value_epochs: int | None = field(
        default=None,
        metadata=_help(
            "passes of the critic over each batch (pyrado's GAE num_epoch); none: --epochs"
        ),
    )
    value_minibatch_size: int | None = field(
        default=None,
        metadata=_help(
            "samples per critic gradient step (pyrado's GAE batch_size); none: the policy's "
            "minibatches"
        ),
    )
    value_max_grad_norm: float | None = field(
        default=None,
        metadata=_help(
            "clip the critic's gradient to this norm on its own (pyrado's GAE max_grad_norm; "
            "0: off); none: --max-grad-norm, over actor and critic together unless another "
            "--value-* flag is set"
        ),
    )
    empirical_returns: bool = field(
        default=False,
        metadata=_help(
            "the critic regresses on the discounted return of the rollout (reward-to-go, "
            "bootstrapped from V only where an episode is truncated or the rollout ends; "
            "pyrado's use_empirical_returns) instead of the GAE lambda-return; the policy's "
            "advantage stays GAE"
        ),
    )

    def __post_init__(self) -> None:
        super().__post_init__()  # type: ignore[misc]
        positive(self, "value_lr", "value_epochs", "value_minibatch_size")
        non_negative(self, "value_max_grad_norm")
        size, batch = self.value_minibatch_size, self.batch_size  # type: ignore[attr-defined]
        if size is not None and size > batch:
            raise ValueError(
                f"--value-minibatch-size {size} is larger than the batch (--num-envs "
                f"{self.num_envs} x --rollout-steps {self.rollout_steps} = {batch}): "  # type: ignore[attr-defined]
                "lower it or collect more per batch"
            )

        swept = {s.split("=")[0].replace("-", "_") for s in (self.sweep or ())}  # type: ignore[attr-defined]
        population = self.population > 1 or bool(self.sweep)  # type: ignore[attr-defined]
        if (self.critic_group and population) or swept & set(CRITIC_GROUP_FIELDS):
            raise ValueError(
                "--value-lr, --value-epochs, --value-minibatch-size and --value-max-grad-norm "
                "give the critic a loss group of its own, which --population / --sweep cannot "
                "vectorise yet: drop them or train the members as separate runs"
            )

    @property
    def critic_group(self) -> bool:
        """Whether the critic trains as a loss group of its own (a ``--value-*`` flag is set)."""
        return any(getattr(self, name) is not None for name in CRITIC_GROUP_FIELDS)

    @property
    def critic_epochs(self) -> int:
        """The critic's passes per batch: ``--value-epochs``, else ``--epochs``."""
        return self.epochs if self.value_epochs is None else self.value_epochs  # type: ignore[attr-defined]

    @property
    def critic_minibatch(self) -> int:
        """Samples per critic step: ``--value-minibatch-size``, else the policy's."""
        if self.value_minibatch_size is None:
            return self.minibatch  # type: ignore[attr-defined]
        return self.value_minibatch_size

    @property
    def critic_max_grad_norm(self) -> float:
        """The critic's clip norm: ``--value-max-grad-norm``, else ``--max-grad-norm``."""
        if self.value_max_grad_norm is None:
            return self.max_grad_norm  # type: ignore[attr-defined]
        return self.value_max_grad_norm

    @property
    def critic_lr(self) -> float:
        """The critic's initial learning rate: ``--value-lr``, else ``--lr``."""
        return self.lr if self.value_lr is None else self.value_lr  # type: ignore[attr-defined]
