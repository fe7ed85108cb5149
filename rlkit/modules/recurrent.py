"""Recurrent memory: an LSTM or GRU core whose state lives in TensorDict keys.

A :class:`RecurrentCore` reads a feature key, :data:`rlkit.keys.IS_INIT` and its state keys,
and writes its output features and, under ``("next", ...)``, the state after the step
(TorchRL's ``LSTMModule`` convention, so rlkit's collector, evaluator and TorchRL's own
collectors can all carry it). It runs in one of two modes, chosen from the TensorDict:

- **step** (collection, evaluation; any TensorDict without a dim named ``"time"``): one step
  per row, from the stored state, zeroed where ``is_init`` is True;
- **sequence** (training; the last batch dim named ``"time"``, ``[*, T]``): each row is a
  sequence that starts from the state stored at its first step. Where ``is_init`` is True
  inside a row, a new episode starts: the row is cut there and the new piece starts from a
  zero state, so no state crosses an episode boundary. The pieces are padded to one length
  and run in ONE call of the ``nn.LSTM`` / ``nn.GRU``; padding only ever follows a piece's
  real steps, and the outputs at padded positions are dropped before anything reads them, so
  padding reaches no loss, statistic or gradient.

On-policy, the state stored at each step was computed with the same parameters that train
on it first, so a sequence call reproduces the collection's features step for step
(``tests/test_memory.py`` checks it to float tolerance).

The rules at each boundary (docs/memory.md): the state is zero at an episode's first step;
it is carried across collector batches; a sequence never runs across an episode or an env;
bootstrap values at a truncation come from the pre-reset observation with the state that saw
it (``("next", state)``); evaluation carries the state across steps and resets it where an
episode starts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase
from tensordict.utils import NestedKey
from torch import nn

from rlkit import keys

__all__ = [
    "RecurrentCore",
    "carried_state",
    "initial_state",
    "collect_module",
    "is_recurrent",
    "next_state_values",
    "recurrent_actor_critic",
    "reset_rows",
    "scratch_keys",
    "sequence_mode",
    "state_keys",
]

KINDS = ("lstm", "gru")

_WEIGHTS = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")

#: What the padding of a sequence call holds (never read: the tests change it and see the
#: same outputs and gradients).
PAD_VALUE = 0.0


def state_keys(kind: str, prefix: str) -> list[str]:
    """The state keys of a core: ``[prefix_h, prefix_c]`` for an LSTM, ``[prefix_h]`` for a
    GRU (``prefix`` is ``"policy_state"`` or ``"value_state"`` in the builders)."""
    _check_kind(kind)
    return [f"{prefix}_h", f"{prefix}_c"] if kind == "lstm" else [f"{prefix}_h"]


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"recurrent core kind must be 'lstm' or 'gru', got {kind!r}")


def sequence_mode(td: TensorDictBase) -> bool:
    """Whether a core runs ``td`` as sequences: its last batch dim is named ``"time"``."""
    if td.batch_dims < 2:
        return False
    names = td.names
    return names[-1] == keys.TIME_DIM_NAME


class RecurrentCore(TensorDictModuleBase):
    """An LSTM / GRU over ``in_key`` that keeps its state in TensorDict keys.

    Reads ``in_key`` ``[*, F]``, :data:`~rlkit.keys.IS_INIT` ``[*, 1]`` and its state keys
    ``[*, num_layers, hidden]``; writes ``out_key`` ``[*, hidden]`` and, in step mode, the
    state after the step under ``("next", state_key)``. See the module docstring for the two
    modes.

    Args:
        in_key, out_key: the features read and written.
        kind: ``"lstm"`` or ``"gru"``.
        input_size: the width of ``in_key`` (after ``backbone``).
        hidden_size, num_layers: the recurrent net's.
        prefix: the state keys' prefix (:func:`state_keys`).
        backbone: applied to ``in_key`` first (an observation normaliser, an encoder).
    """

    def __init__(
        self,
        *,
        in_key: NestedKey,
        out_key: NestedKey,
        kind: str,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        prefix: str,
        backbone: nn.Module | None = None,
    ) -> None:
        super().__init__()
        _check_kind(kind)
        for name, value in (("input_size", input_size), ("hidden_size", hidden_size)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"num_layers must be a positive int, got {num_layers!r}")
        self.kind, self.hidden_size, self.num_layers = kind, hidden_size, num_layers
        net = nn.LSTM if kind == "lstm" else nn.GRU
        self.rnn = net(input_size, hidden_size, num_layers=num_layers, batch_first=True)
        for name, param in self.rnn.named_parameters():  # CleanRL's ppo_atari_lstm.py
            if name.startswith("bias"):
                nn.init.constant_(param, 0.0)
            else:
                nn.init.orthogonal_(param, 1.0)
        self.backbone = backbone
        self.in_key, self.out_key = in_key, out_key
        self.state_keys = state_keys(kind, prefix)
        self.in_keys = [in_key, keys.IS_INIT, *self.state_keys]
        self.out_keys = [out_key, *((keys.NEXT, k) for k in self.state_keys)]

    # ---------------------------------------------------------------- state
    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        """Each state key's shape for one env: ``(num_layers, hidden_size)``."""
        return {k: (self.num_layers, self.hidden_size) for k in self.state_keys}

    # ---------------------------------------------------------------- forward
    def forward(self, td: TensorDictBase) -> TensorDictBase:
        x = td.get(self.in_key)
        if self.backbone is not None:
            x = self.backbone(x)
        is_init = _read_is_init(td)
        states = [td.get(k) for k in self.state_keys]
        if sequence_mode(td):
            out = self._sequence(x, is_init, states)
        else:
            out, after = self._step(x, is_init, states)
            for k, s in zip(self.state_keys, after, strict=True):
                td.set((keys.NEXT, k), s)
        td.set(self.out_key, out)
        return td

    def _run(self, x: torch.Tensor, states: list[torch.Tensor]):
        """``x`` [B, L, F], states [B, layers, H] -> outputs [B, L, H], states after."""
        h0 = [s.transpose(0, 1).contiguous() for s in states]
        out, hn = self.rnn(x, (h0[0], h0[1]) if self.kind == "lstm" else h0[0])
        hn = hn if self.kind == "lstm" else (hn,)
        return out, [s.transpose(0, 1) for s in hn]

    def _step(self, x, is_init, states):
        """One step per row through the cell functions on the ``nn.LSTM`` / ``nn.GRU``
        weights: the same maths as a sequence call, at about half the cost of calling the
        module for one step (``torch.lstm_cell`` / ``torch.gru_cell``, measured here)."""
        lead = x.shape[:-1]
        inp = x.reshape(-1, x.shape[-1])
        keep = (~is_init.reshape(-1)).to(inp.dtype).view(-1, 1, 1)
        start = [s.reshape(-1, *s.shape[-2:]) * keep for s in states]
        hs, cs = [], []
        for layer in range(self.num_layers):
            weights = [getattr(self.rnn, f"{n}_l{layer}") for n in _WEIGHTS]
            if self.kind == "lstm":
                h, c = torch.lstm_cell(inp, (start[0][:, layer], start[1][:, layer]), *weights)
                cs.append(c)
            else:
                h = torch.gru_cell(inp, start[0][:, layer], *weights)
            hs.append(h)
            inp = h
        after = [torch.stack(hs, 1)] + ([torch.stack(cs, 1)] if cs else [])
        return inp.reshape(*lead, -1), [s.reshape(*lead, *s.shape[-2:]) for s in after]

    def _sequence(self, x, is_init, states):
        """Rows ``[*, T]`` cut where ``is_init`` (new episodes start from zero), padded, run
        in one call; outputs gathered back to ``[*, T, hidden]``."""
        lead, t, f = x.shape[:-2], x.shape[-2], x.shape[-1]
        x = x.reshape(-1, t, f)
        rows = x.shape[0]
        init = is_init.reshape(rows, t)
        starts = init.clone()
        starts[:, 0] = True
        flat_starts = starts.reshape(-1)
        piece = torch.cumsum(flat_starts.long(), 0) - 1  # [rows*T]: the piece of each step
        first = flat_starts.nonzero().squeeze(-1)  # flat index of each piece's first step
        pos = torch.arange(rows * t, device=x.device) - first[piece]
        pieces, longest = first.numel(), int(pos.max()) + 1
        padded = x.new_full((pieces, longest, f), PAD_VALUE)
        padded[piece, pos] = x.reshape(rows * t, f)
        # each piece starts from the state stored at its first step, zero at an episode start
        keep = (~init.reshape(-1)[first]).to(x.dtype).view(-1, 1, 1)
        start = [s.reshape(rows * t, *s.shape[-2:])[first] * keep for s in states]
        out, _ = self._run(padded, start)
        return out[piece, pos].reshape(*lead, t, -1)

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}, in_key={self.in_key!r}, state_keys={self.state_keys}"


def _read_is_init(td: TensorDictBase) -> torch.Tensor:
    is_init = td.get(keys.IS_INIT, None)
    if is_init is None:
        raise KeyError(
            f"a recurrent core reads {keys.IS_INIT!r} (True at an episode's first step) and the "
            "TensorDict has none: collect with rlkit's collector, or add TorchRL's InitTracker "
            "to the env (docs/memory.md)"
        )
    return is_init.bool()


# --------------------------------------------------------------------------- policies
def _cores(module: nn.Module) -> list[nn.Module]:
    return [m for m in module.modules() if isinstance(m, RecurrentCore)]


def carried_state(policy: nn.Module) -> dict[NestedKey, tuple[int, ...]]:
    """The state a policy reads and writes back under ``("next", key)``, with each key's
    shape for one env: from every sub-module with a ``state_shapes()`` method returning
    ``{key: shape}`` (rlkit's :class:`RecurrentCore`, or a module of your own that reads
    ``is_init`` and its state keys and writes ``("next", key)``), and from TorchRL's
    ``LSTMModule`` / ``GRUModule`` (their ``make_tensordict_primer``). Empty for a policy
    without memory."""
    out: dict[NestedKey, tuple[int, ...]] = {}
    for m in policy.modules():
        shapes = getattr(m, "state_shapes", None)
        if callable(shapes):  # rlkit's cores, and a research module of the same contract
            out.update(shapes())
            continue
        make_primer = getattr(m, "make_tensordict_primer", None)
        if make_primer is None:
            continue
        try:
            primer = make_primer()
        except Exception:  # not a TorchRL recurrent module after all
            continue
        for key, spec in primer.primers.items(True, True):
            out[key] = tuple(spec.shape)
    return out


def scratch_keys(policy: nn.Module) -> set[NestedKey]:
    """The features a policy's cores hand to its heads: recomputed in training, so a
    collector need not store them."""
    return {core.out_key for core in _cores(policy)}


def next_state_values(
    critic: nn.Module, td: TensorDictBase, value_key: NestedKey = keys.STATE_VALUE
):
    """V of ``("next", "observation")`` ``[*, 1]`` for a recurrent ``critic``, each from the
    critic's state after its step, ``("next", state_key)``, as the collector stored it: the
    state that saw the episode so far, also at a truncation (the bootstrap of the pre-reset
    observation). Each step is one step-mode call (no reset), whatever ``td``'s names."""
    nxt = td.get(keys.NEXT)
    state = carried_state(critic)
    present = set(nxt.keys(True))
    missing = [k for k in state if k not in present]
    if missing:
        raise KeyError(
            f"the recurrent critic's state after each step, {[(keys.NEXT, k) for k in missing]}, "
            "is not in the batch: collect with the learner's collect_policy(), which carries "
            "the critic's state too (docs/memory.md)"
        )
    source = {k: nxt.get(k) for k in getattr(critic, "in_keys", ()) if k in present}
    shape = td.batch_size
    source[keys.IS_INIT] = torch.zeros(*shape, 1, dtype=torch.bool, device=td.device)
    flat = TensorDict(source, batch_size=shape, device=td.device).reshape(-1)  # step mode
    return critic(flat).get(value_key).reshape(*shape, -1)


def collect_module(actor: nn.Module, critic: nn.Module | None) -> nn.Module:
    """What a collector runs for an actor and critic: the actor, and the critic's recurrent
    core when it has one (its state carried and stored; its values are computed in training,
    with the learner's parameters)."""
    cores = _cores(critic) if critic is not None else []
    if not cores:
        return actor
    from tensordict.nn import TensorDictSequential

    return TensorDictSequential(actor, *cores)


def is_recurrent(policy: nn.Module) -> bool:
    """Whether ``policy`` carries a recurrent state (:func:`carried_state` is not empty)."""
    return bool(carried_state(policy))


def initial_state(
    shapes: Mapping[NestedKey, tuple[int, ...]], batch: Iterable[int], *, device=None
) -> dict[NestedKey, torch.Tensor]:
    """Zero states for ``batch`` envs (``{key: [*batch, *shape]}``)."""
    batch = tuple(batch)
    return {k: torch.zeros(*batch, *shape, device=device) for k, shape in shapes.items()}


def reset_rows(state: Mapping[NestedKey, torch.Tensor], rows: torch.Tensor) -> dict:
    """``state`` (``{key: [N, *S]}``) with the rows where ``rows`` (bool ``[N]``) is True
    set to zero: the envs whose episode starts anew."""
    keep = ~rows.reshape(-1)
    return {k: v * keep.view(-1, *([1] * (v.dim() - 1))) for k, v in state.items()}


# --------------------------------------------------------------------------- builders
def recurrent_actor_critic(
    env,
    *,
    kind: str,
    size: int = 128,
    layers: int = 1,
    actor_hidden=(64,),
    critic_hidden=(64,),
    activation: str = "tanh",
    normalize_obs: bool = False,
    encoder: str = "mlp",
    feature_dim: int | None = None,
    actor_kw: Mapping | None = None,
):
    """A recurrent actor and V critic for ``env``: ``(actor, critic, obs_norm)``.

    Each network has its own :class:`RecurrentCore` (``kind`` ``"lstm"`` / ``"gru"``,
    ``size`` units, ``layers`` layers) over the observation (normalised first with
    ``normalize_obs``, through an image encoder with ``encoder`` other than ``"mlp"``),
    then its MLP head (``actor_hidden`` / ``critic_hidden``), as SB3-contrib's
    ``RecurrentPPO`` does by default (separate LSTMs for actor and critic). The actor's state
    keys are :data:`~rlkit.keys.POLICY_STATE_H` (and ``_C``), the critic's
    :data:`~rlkit.keys.VALUE_STATE_H` (and ``_C``).
    """
    from torchrl.data import Unbounded
    from torchrl.modules.tensordict_module.probabilistic import (
        SafeProbabilisticTensorDictSequential,
    )

    from rlkit.modules.actors import make_actor
    from rlkit.modules.builders import image_obs_shape, obs_shape
    from rlkit.modules.critics import make_value
    from rlkit.modules.networks import make_encoder
    from rlkit.modules.normalization import Normalize, RunningMeanStd

    spec = env.observation_spec
    batch = tuple(env.batch_size)
    shape = obs_shape(env)
    obs_norm = None
    if shape is None:
        raise ValueError(
            "--recurrent reads one 'observation' entry, and this env's observation is a Dict "
            "(--obs-keys' encoder has no recurrent form yet): flatten it (gymnasium's "
            "FlattenObservation) or drop --recurrent (docs/memory.md)"
        )
    if encoder != "mlp":
        shape = image_obs_shape(env, encoder, normalize_obs=normalize_obs)
    elif len(shape) != 1:
        raise ValueError(
            f"--recurrent reads a flat observation vector (or an image with --encoder), and "
            f"this env's observation has shape {shape}: flatten it or choose an --encoder"
        )
    elif normalize_obs:
        obs_norm = RunningMeanStd(shape)

    def backbone() -> tuple[nn.Module | None, int]:
        if encoder != "mlp":
            enc, width = make_encoder(encoder, shape, feature_dim=feature_dim)
            return enc, width
        return (Normalize(obs_norm) if obs_norm is not None else None), int(shape[0])

    def core(out_key: str, prefix: str) -> RecurrentCore:
        net, width = backbone()
        return RecurrentCore(
            in_key=keys.OBSERVATION,
            out_key=out_key,
            kind=kind,
            input_size=width,
            hidden_size=size,
            num_layers=layers,
            prefix=prefix,
            backbone=net,
        )

    memory_spec = spec.clone()
    for key in (keys.POLICY_MEMORY, keys.VALUE_MEMORY):
        memory_spec[key] = Unbounded(shape=(*batch, size))
    head = make_actor(
        memory_spec,
        env.action_spec,
        obs_key=keys.POLICY_MEMORY,
        hidden=tuple(actor_hidden),
        activation=activation,
        **dict(actor_kw or {}),
    )
    actor = SafeProbabilisticTensorDictSequential(
        core(keys.POLICY_MEMORY, "policy_state"), *head.module
    )
    value = make_value(
        memory_spec, obs_key=keys.VALUE_MEMORY, hidden=tuple(critic_hidden), activation=activation
    )
    from tensordict.nn import TensorDictSequential

    critic = TensorDictSequential(core(keys.VALUE_MEMORY, "value_state"), value)
    return actor, critic, obs_norm
