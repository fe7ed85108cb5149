"""The config shared by the off-policy recipes (DQN, SAC), torch-free.

:mod:`rlkit.algorithms.offpolicy` (replay, exploration and the learner) imports it back, so
``rlkit.algorithms.offpolicy.OffPolicyConfig`` still works.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlkit.configs.base import TrainConfig, in_unit_interval, non_negative, positive
from rlkit.configs.checks import (
    LR_DECAY_FRAMES_HELP,
    check_lr_decay_frames,
    finite_floats,
)

#: ``--priority-weight-norm`` choices: how prioritized replay's importance weights are
#: normalised (:class:`~rlkit.objectives.DQNLoss` / ``SACLoss``'s ``priority_weights``)
PRIORITY_WEIGHT_NORMS = ("max", "sum")
#: ``--frame-replay`` choices
FRAME_REPLAY_MODES = ("auto", "true", "false")


def _help(text: str, **kw: Any) -> dict[str, Any]:
    return {"help": text, **kw}


@dataclass(frozen=True)
class OffPolicyConfig(TrainConfig):
    """Flags shared by off-policy recipes (DQN, SAC)."""

    num_envs: int = 1
    steps_per_batch: int = field(
        default=1, metadata=_help("env steps per env between update phases (SB3 train_freq)")
    )
    utd_ratio: float = field(
        default=1.0,
        metadata=_help("gradient steps per collected frame (update-to-data ratio)"),
    )
    batch_size: int = field(default=256, metadata=_help("transitions per gradient step"))
    buffer_size: int = field(default=1_000_000, metadata=_help("replay buffer capacity per rank"))
    learning_starts: int = field(
        default=100,
        metadata=_help(
            "frames of uniform random actions before learning; updates start once "
            "the buffer holds this many transitions"
        ),
    )
    warmup_with_policy: bool = field(
        default=False,
        metadata=_help(
            "fill the buffer's first --learning-starts frames with the policy's own "
            "exploration instead of uniform random actions (pyrado's "
            "use_trained_policy_for_refill: after --init-from, warm up with the trained policy)"
        ),
    )
    prioritized: bool = field(default=False, metadata=_help("prioritized experience replay"))
    priority_alpha: float = field(default=0.6, metadata=_help("PER priority exponent alpha"))
    priority_beta: float = field(
        default=0.4, metadata=_help("PER importance exponent beta, annealed linearly to 1")
    )
    priority_eps: float = field(default=1e-6, metadata=_help("added to |TD error| priorities"))
    priority_weight_norm: str = field(
        default="max",
        metadata=_help(
            "PER importance-weight normalisation: max (Schaul et al.: mean(w / max w * "
            "loss)) or sum (sum(w * loss) / sum(w))",
            choices=PRIORITY_WEIGHT_NORMS,
        ),
    )
    save_buffer: bool = field(
        default=True,
        metadata=_help("store the replay buffer in checkpoints (resume without refill)"),
    )
    frame_replay: str = field(
        default="auto",
        metadata=_help(
            "store each uint8 frame once (rlkit.data.frames.FrameReplay: a 1M-transition "
            "Atari buffer in 7.1 GB instead of 56 GB): true, false, or auto (on when "
            "observations are uint8 images and replay is uniform)",
            choices=FRAME_REPLAY_MODES,
        ),
    )
    n_steps: int = field(default=1, metadata=_help("n-step returns (1: one-step TD)"))
    gamma: float = field(default=0.99, metadata=_help("discount factor"))
    lr: float = field(default=1e-3, metadata=_help("learning rate"))
    lr_schedule: str = field(
        default="constant",
        metadata=_help(
            "constant, or linear to --lr-final over the frame budget, set before every "
            "gradient step from the frame counter (pyrado's lr_scheduler); every optimiser "
            "alike (SAC's actor and temperature rates in proportion)",
            choices=("constant", "linear"),
        ),
    )
    lr_final: float = field(
        default=0.0,
        metadata=_help(
            "final learning rate of --lr-schedule linear (SAC: of the critics; the actor's "
            "and the temperature's fall in the same ratio)"
        ),
    )
    lr_decay_frames: int | None = field(
        default=None,
        metadata=_help(LR_DECAY_FRAMES_HELP),
    )
    adam_eps: float = field(default=1e-8, metadata=_help("Adam epsilon"))
    max_grad_norm: float = field(default=0.0, metadata=_help("gradient clipping norm (0: off)"))
    standardize_reward: bool = field(
        default=False, metadata=_help("standardise rewards in each sampled minibatch")
    )
    reward_scale: float = field(
        default=1.0,
        metadata=_help(
            "multiply sampled rewards by this (after --standardize-reward, as pyrado's "
            "rew_scale: standardised rewards then have std --reward-scale)"
        ),
    )
    hidden: tuple[int, ...] = field(
        default=(256, 256), metadata=_help("hidden layer sizes, e.g. '256 256'")
    )
    activation: str = field(
        default="relu", metadata=_help("relu or tanh", choices=("relu", "tanh"))
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        finite_floats(self)
        positive(self, "steps_per_batch", "utd_ratio", "batch_size", "buffer_size", "n_steps")
        positive(self, "lr", "adam_eps", "priority_eps", "reward_scale")
        non_negative(self, "learning_starts", "max_grad_norm", "lr_final")
        check_lr_decay_frames(self)
        in_unit_interval(self, "gamma", "priority_beta")
        in_unit_interval(self, "priority_alpha", closed_low=False)
        if self.priority_weight_norm not in PRIORITY_WEIGHT_NORMS:
            raise ValueError(
                f"--priority-weight-norm must be one of {PRIORITY_WEIGHT_NORMS}, got "
                f"{self.priority_weight_norm!r}"
            )
        if self.frame_replay not in FRAME_REPLAY_MODES:
            raise ValueError(
                f"--frame-replay must be one of {FRAME_REPLAY_MODES}, got {self.frame_replay!r}"
            )
        if self.frame_replay == "true" and self.prioritized:
            raise ValueError(
                "--frame-replay true samples uniformly and cannot serve --prioritized: drop "
                "--prioritized, or pass --frame-replay false (whole transitions per row)"
            )
        if self.batch_size > self.buffer_size:
            raise ValueError(
                f"--batch-size {self.batch_size} is larger than --buffer-size "
                f"{self.buffer_size}: lower the batch or enlarge the buffer"
            )
        if self.learning_starts > self.buffer_size:
            raise ValueError(
                f"--learning-starts {self.learning_starts} exceeds --buffer-size "
                f"{self.buffer_size}: learning would never start"
            )
        # with an image encoder the head may read its features directly (hidden=(), as the
        # MinAtar and Nature DQN networks; rlkit.configs.suites)
        image = getattr(self, "encoder", "mlp") != "mlp"
        if (not self.hidden and not image) or any(h <= 0 for h in self.hidden):
            raise ValueError(f"--hidden needs positive layer sizes, got {self.hidden}")

    @property
    def frames_per_batch(self) -> int:
        """Frames per collected batch on one rank."""
        return self.num_envs * self.steps_per_batch
