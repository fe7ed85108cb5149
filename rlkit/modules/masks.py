r"""Discrete action masks: the network heads that apply them, and the checks around them.

An env that exposes a mask (a gymnasium Dict observation entry ``"action_mask"``, the
PettingZoo convention, or a TorchRL env with an ``ActionMask``-style ``"action_mask"`` key)
writes :data:`rlkit.keys.ACTION_MASK` ``[*, n]`` (bool or int8, nonzero where the action may be
taken) next to ``"observation"``. :func:`~rlkit.modules.actors.make_actor` and the DQN / SAC
Q networks then read it, through :class:`MaskedHead`:

.. math::
    \tilde z_a = \begin{cases} z_a & m_a \ne 0 \\ \text{lowest}(\text{dtype}) & m_a = 0
    \end{cases}

so a categorical policy over :math:`\tilde z` is :math:`\pi(a|s) = e^{z_a} / \sum_{b: m_b \ne 0}
e^{z_b}` on the valid actions and exactly 0 elsewhere (:math:`e^{\text{lowest} - \max z}`
underflows to 0 in float32), its log-probabilities, entropy and KLs run over the valid actions
only, ``argmax`` never picks a masked action, and ``masked_fill`` passes no gradient to a
masked logit (exactly 0). The network never sees the mask: it reads ``"observation"`` alone.

Why the mask is applied to the logits inside the network and not by TorchRL's
``MaskedCategorical`` (measured with torchrl 0.14.1, torch 2.14, CPU, one thread;
``benchmarks/bench_masked_categorical.py``, ``tests/test_masks.py``):

- both are right in the dense form: samples and the mode are never masked, log-prob and
  entropy match a softmax over the valid logits, gradients at masked logits are 0, entropy is
  finite with 1,000 actions and one valid (pytorch/rl#4112, the mode returned as an index into
  the compact list, concerns the sparse form only);
- the logits key (:data:`rlkit.keys.LOGITS`) then holds the masked logits, so everything that
  rebuilds a distribution from stored logits (PPG's pre-auxiliary KL, discrete SAC's exact
  expectations, rlkit's direct sampling path) honours the mask without knowing about it;
  ``MaskedCategorical`` keeps the raw logits and needs the mask passed to every such place;
- the fill is the dtype's lowest finite value, not ``MaskedCategorical``'s default ``-inf``:
  a plain ``probs * log_probs`` is then 0 where masked, where ``0 * -inf`` is NaN (a loss
  that scales the log-probabilities by more than 1 before multiplying, as discrete SAC's
  temperature may, still overflows with either: :class:`~rlkit.objectives.DiscreteSACLoss`
  zeroes the masked log-probabilities first);
- log-prob + entropy + backward took 0.65-0.76x the time of ``MaskedCategorical``'s ([8, 8]
  763 vs 1,006 us, [256, 8] 871 vs 1,310 us, [256, 1000] 31.8 vs 49.0 ms); build + sample +
  log-prob cost about the same (0.9-1.2x) (``benchmarks/results/bench_masked_categorical.json``,
  2 shared cores).
"""

from __future__ import annotations

import torch
from tensordict import NestedKey
from torch import Tensor, nn
from torchrl.data import Composite, TensorSpec

from rlkit import keys

__all__ = [
    "MASK_RECIPES",
    "MaskedHead",
    "check_mask_spec",
    "mask_key_of",
    "masked_fill_lowest",
    "random_valid_action",
    "refuse_mask",
]

#: The recipes that read an action mask (discrete actions); the one line that refuses a mask
#: names them.
MASK_RECIPES = "ppo, a2c, ppg, impala, appo, daac, rnd, dqn and sac (discrete actions)"


def masked_fill_lowest(values: Tensor, mask: Tensor) -> Tensor:
    """``values`` with the entries where ``mask`` is 0 / False set to the dtype's lowest
    finite value (never ``-inf``: ``0 * -inf`` is NaN)."""
    return values.masked_fill(mask == 0, torch.finfo(values.dtype).min)


class MaskedHead(nn.Module):
    """``(x, mask) -> net(x)`` with masked outputs set to the dtype's lowest value.

    Wraps a policy head (logits) or a Q head (one value per action); the network reads the
    observation features only. ``mask``: ``[*, n]`` bool or integer, nonzero where valid.
    """

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, *inputs: Tensor) -> Tensor:
        *x, mask = inputs  # the observation (or a Dict observation's entries), then the mask
        return masked_fill_lowest(self.net(*x), mask)


def random_valid_action(mask: Tensor) -> Tensor:
    """A uniformly random valid action per row of ``mask`` ``[*, n]``: int64 ``[*]``.

    The argmax of i.i.d. uniform numbers over the valid entries (the invalid ones set to -1)
    is each valid index with equal probability. A row with no valid action gives index 0."""
    noise = torch.rand(mask.shape, device=mask.device)
    return noise.masked_fill(mask == 0, -1.0).argmax(-1)


def mask_key_of(observation_spec: TensorSpec) -> NestedKey | None:
    """:data:`rlkit.keys.ACTION_MASK` when a Composite observation spec holds it, else None."""
    if isinstance(observation_spec, Composite) and keys.ACTION_MASK in observation_spec:
        return keys.ACTION_MASK
    return None


def refuse_mask(what: str) -> ValueError:
    """The one line that refuses an action mask a part cannot honour."""
    return ValueError(
        f"this env writes an action mask ({keys.ACTION_MASK!r}), which {what} cannot honour: "
        f"the recipes that read one are {MASK_RECIPES} (docs/actions.md)"
    )


def check_mask_spec(observation_spec: Composite, n_actions: int, batch_dims: int) -> None:
    """The mask entry holds one flag per action: ``[*, n_actions]`` bool or integer."""
    spec = observation_spec[keys.ACTION_MASK]
    shape = tuple(spec.shape[batch_dims:])
    if shape != (n_actions,) or spec.dtype.is_floating_point:
        raise ValueError(
            f"the action mask {keys.ACTION_MASK!r} has shape {list(shape)} and dtype "
            f"{spec.dtype}; expected one bool or integer flag per action, shape [{n_actions}]"
        )
