"""What a learner does differently with memory: collect with the critic's state too, score
bootstrap values with the state that saw the observation, and train on sequences.

The policy-gradient learners hold one :class:`Memory` (off without a recurrent actor or
critic, :mod:`rlkit.modules.recurrent`). The rules it keeps (docs/memory.md):

- the collector runs the actor and, when the critic has memory, the critic's recurrent core
  too, so both states are carried and stored (the values themselves are computed in
  training, with the learner's parameters, each sequence from its stored first state);
- the bootstrap value of each step, V of ``("next", "observation")``, comes from the
  critic's state *after* the step (``("next", "value_state_h")``): at a truncation that is
  the pre-reset observation with the state that saw the episode, never the reset's;
- training runs on sequences cut from each env's row of the batch (never across envs); the
  recurrent cores restart from a zero state where an episode starts inside a sequence, so
  no state crosses an episode boundary, and no padding reaches the losses
  (:class:`~rlkit.modules.recurrent.RecurrentCore`).
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from torch import nn

from rlkit import keys
from rlkit.modules.recurrent import carried_state, collect_module, next_state_values

__all__ = ["Memory", "split_sequences"]


class Memory:
    """A learner's memory handling (``on`` is False without a recurrent actor or critic).

    Args:
        actor, critic: the learner's networks.
        sequence_length: steps per training sequence (None: each env's whole row).
        minibatch_size: the learner's minibatch size in frames (None: the whole batch); with
            memory it must be a multiple of ``sequence_length``.
    """

    def __init__(
        self,
        actor: nn.Module,
        critic: nn.Module | None,
        sequence_length: int | None,
        minibatch_size: int | None,
    ) -> None:
        self.actor_state = carried_state(actor)
        self.critic_state = carried_state(critic) if critic is not None else {}
        self.on = bool(self.actor_state or self.critic_state)
        if sequence_length is not None and (
            isinstance(sequence_length, bool)
            or not isinstance(sequence_length, int)
            or sequence_length < 1
        ):
            raise ValueError(
                f"--sequence-length must be a positive int (or None: whole rows), got "
                f"{sequence_length!r}"
            )
        if self.on and sequence_length and minibatch_size and minibatch_size % sequence_length:
            raise ValueError(
                f"--minibatch-size {minibatch_size} is not a multiple of --sequence-length "
                f"{sequence_length}: a recurrent policy trains on whole sequences; use a "
                f"multiple such as {max(1, minibatch_size // sequence_length) * sequence_length}"
            )
        self.length = sequence_length
        self.critic = critic
        self.collect_policy = collect_module(actor, critic if critic is not actor else None)

    @torch.no_grad()
    def bootstrap_values(self, batch: TensorDictBase) -> None:
        """Write ``("next", "state_value")`` with a recurrent critic: V of each next
        observation from the critic's state after the step
        (:func:`~rlkit.modules.recurrent.next_state_values`). Nothing when the critic has no
        memory (the estimator computes it as usual)."""
        if batch.batch_dims == 2 and keys.TIME_DIM_NAME not in batch.names:
            # a batch [N, T] saved and loaded without its names: the cores read it as
            # sequences, as the collector's named batch (never as N x T single steps)
            batch.refine_names(None, keys.TIME_DIM_NAME)
        if not self.critic_state or keys.NEXT_STATE_VALUE in batch.keys(True):
            return
        batch.set(keys.NEXT_STATE_VALUE, next_state_values(self.critic, batch))

    def sequences(self, batch: TensorDictBase) -> TensorDictBase:
        """``batch`` ``[N, T]`` as training sequences (:func:`split_sequences`)."""
        return split_sequences(batch, self.length)


def split_sequences(batch: TensorDictBase, length: int | None) -> TensorDictBase:
    """Cut each env's row of ``batch`` (``[N, T]``, time named or last) into sequences of
    ``length`` steps: ``[N * T / length, length]``, the last dim named ``"time"``, rows in
    env-major order. None: whole rows (``[N, T]``). ``T`` must be a multiple of ``length``."""
    names = batch.names
    if keys.TIME_DIM_NAME in names and names.index(keys.TIME_DIM_NAME) != batch.batch_dims - 1:
        batch = batch.transpose(names.index(keys.TIME_DIM_NAME), batch.batch_dims - 1)
    if batch.batch_dims != 2:
        raise ValueError(
            f"a recurrent learner trains on batches [envs, time]; got batch size "
            f"{tuple(batch.batch_size)}"
        )
    n, t = batch.batch_size
    length = length or t
    if t % length:
        raise ValueError(
            f"the batch has {t} steps per env, not a multiple of --sequence-length {length}: "
            "choose a divisor of --rollout-steps"
        )
    out = batch.reshape(n * (t // length), length)
    return out.refine_names(None, keys.TIME_DIM_NAME)
