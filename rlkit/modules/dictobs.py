"""Dict observations: choose entries, encode each, concatenate into one feature vector.

An env whose observation is a gymnasium ``Dict`` space writes each entry under its own key
(:func:`rlkit.envs.make_env`). The recipes read the entries ``--obs-keys`` names (default:
every entry but ``"action_mask"``, which the action mask reads) through a
:class:`DictObsEncoder` placed in front of each network's hidden layers:

- a vector entry ``[F]`` (or any float shape, flattened) goes in as it is, standardised on
  its own (one :class:`~rlkit.modules.normalization.RunningMeanStd` per entry,
  :class:`EntryNorms`) with ``--normalize-obs``;
- a Discrete entry (int64 ``[]``) goes in one-hot;
- an image entry (3-D, uint8 or float, ``[H, W, C]`` or ``[C, H, W]``) goes through its own
  image encoder of :func:`~rlkit.modules.networks.make_encoder` (the recipe's
  ``--encoder``: nature, impala, minatar or flatten), which scales uint8 pixels itself;
- the features are concatenated in ``--obs-keys`` order.

The networks' TensorDict modules read exactly the chosen keys (``in_keys``), so the
collector, the replay and the losses see every entry under its own key, and a change to an
entry that was not chosen changes no output.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from tensordict import TensorDictBase
from torch import Tensor, nn
from torchrl.data import Categorical
from torchrl.envs import TransformedEnv

from rlkit import keys
from rlkit.modules.networks import make_encoder
from rlkit.modules.normalization import RunningMeanStd

__all__ = [
    "DICT_OBS_RECIPES",
    "DictObsEncoder",
    "EntryNorms",
    "ObsEntry",
    "MultiInputSequential",
    "dict_obs_encoder",
    "observation_entries",
    "resolve_obs_keys",
]


#: The recipes whose networks read any Dict observation, images included (svpg's stacked
#: particles read its vector and Discrete entries only).
DICT_OBS_RECIPES = "ppo, a2c, ppg, impala, appo, daac, rnd, dqn and sac (and population members)"


class ObsEntry(NamedTuple):
    """One chosen entry: its key, shape (env batch dims stripped), dtype, and ``n`` for a
    Discrete entry (one-hot width; None otherwise)."""

    key: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    n: int | None = None

    @property
    def kind(self) -> str:
        """``"image"`` (3-D), ``"discrete"`` (one-hot) or ``"vector"`` (flattened)."""
        if self.n is not None:
            return "discrete"
        return "image" if len(self.shape) == 3 else "vector"


def observation_entries(env) -> list[str]:
    """The entries of ``env``'s observation (its base env's observation keys: what the
    gymnasium space holds, not the trackers ``make_env`` adds), the action mask excluded."""
    base = env.base_env if isinstance(env, TransformedEnv) else env
    return [k for k in base.observation_spec.keys(True, True) if k != keys.ACTION_MASK]


def _name(key) -> str:
    return key if isinstance(key, str) else ".".join(key)


def resolve_obs_keys(env, obs_keys: Sequence[str] | None) -> list[str] | None:
    """The entries a recipe's networks read, or None for a single ``"observation"`` (the
    flat path, unchanged).

    ``obs_keys`` None: every entry but the action mask. An entry the env does not have, the
    action mask itself, or a name given twice is a one-line ``ValueError`` listing the
    entries.
    """
    entries = observation_entries(env)
    listed = ", ".join(repr(_name(k)) for k in entries)
    if obs_keys is None:
        chosen = list(entries)
    else:
        chosen = [str(k) for k in obs_keys]
        if not chosen:
            raise ValueError(f"--obs-keys is empty: name one or more of {listed}")
        if keys.ACTION_MASK in chosen:
            raise ValueError(
                f"--obs-keys names {keys.ACTION_MASK!r}, the action mask, which the policy "
                f"reads as a mask, not as an input: drop it (the entries: {listed})"
            )
        unknown = [k for k in chosen if k not in entries]
        if unknown:
            raise ValueError(
                f"--obs-keys names {', '.join(map(repr, unknown))}, which this env's observation "
                f"does not have; its entries are {listed}"
            )
        twice = sorted({k for k in chosen if chosen.count(k) > 1})
        if twice:
            raise ValueError(f"--obs-keys names {', '.join(map(repr, twice))} twice: once each")
    if chosen == [keys.OBSERVATION]:
        return None
    return chosen


def _entry(env, key: str) -> ObsEntry:
    spec = env.observation_spec[key]
    shape = tuple(spec.shape[len(env.batch_size) :])
    if isinstance(spec, Categorical) and shape == ():
        return ObsEntry(key, shape, spec.dtype, int(spec.space.n))
    return ObsEntry(key, shape, spec.dtype)


class EntryNorms(nn.Module):
    """One :class:`RunningMeanStd` per normalised (float vector) entry of a Dict observation.

    The learner calls :meth:`update_from` with each batch (as it calls ``update`` on the
    flat path's single one); the encoders read :meth:`of` ``(key)``.
    """

    def __init__(self, entries: Sequence[ObsEntry]) -> None:
        super().__init__()
        self.keys = [e.key for e in entries]
        self.stats = nn.ModuleList(RunningMeanStd(e.shape) for e in entries)

    def of(self, key: str) -> RunningMeanStd:
        return self.stats[self.keys.index(key)]

    @torch.no_grad()
    def update_from(
        self, batch: TensorDictBase, gather: Callable[[Tensor], Tensor] = lambda x: x
    ) -> None:
        """Merge each entry of ``batch`` (every rank's, through ``gather``) into its own
        statistics."""
        for key, rms in zip(self.keys, self.stats, strict=True):
            rms.update(gather(batch.get(key)))

    def update(self, batch: TensorDictBase) -> None:
        self.update_from(batch)


def normalised_entries(entries: Sequence[ObsEntry]) -> list[ObsEntry]:
    """The entries ``--normalize-obs`` standardises: float vectors (images are scaled by their
    encoder, Discrete entries are one-hot)."""
    return [e for e in entries if e.kind == "vector" and e.dtype.is_floating_point]


class _Vector(nn.Module):
    """A vector entry: standardised (with statistics) and flattened to ``[*, F]``."""

    def __init__(self, shape: tuple[int, ...], stats: RunningMeanStd | None) -> None:
        super().__init__()
        self.ndim, self.stats = len(shape), stats
        self.out_features = int(torch.Size(shape).numel())

    def forward(self, x: Tensor) -> Tensor:
        if not x.is_floating_point():
            x = x.float()
        if self.stats is not None:
            x = self.stats.normalize(x, clip=10.0)
        return x.reshape(*x.shape[: x.dim() - self.ndim], self.out_features)


class _FlatPixels(nn.Module):
    """``--encoder flatten`` for an image entry: its pixels as one vector in the entry's own
    layout (an MLP follows, so the order does not matter), uint8 scaled to [0, 1] in one
    pass (``x * (1 / 255)``, not a cast, a division and a channels-first copy)."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.ndim, self.out_features = len(shape), int(torch.Size(shape).numel())

    def forward(self, x: Tensor) -> Tensor:
        x = x.reshape(*x.shape[: x.dim() - self.ndim], self.out_features)
        if x.dtype == torch.uint8:
            return x * (1.0 / 255.0)
        return x if x.is_floating_point() else x.float()


class _OneHot(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.out_features = n

    def forward(self, x: Tensor) -> Tensor:
        return nn.functional.one_hot(x.long(), self.out_features).float()


class DictObsEncoder(nn.Module):
    """``(*entries) -> [*, sum of widths]``: each chosen entry through its own encoder (see
    the module docstring), concatenated in order. ``in_keys`` are the entries' keys, the
    order its ``forward`` takes them in; ``out_features`` the total width."""

    multi_input = True

    def __init__(
        self,
        entries: Sequence[ObsEntry],
        *,
        encoder: str = "mlp",
        feature_dim: int | None = None,
        norms: EntryNorms | None = None,
    ) -> None:
        super().__init__()
        self.in_keys = [e.key for e in entries]
        parts = []
        for e in entries:
            if e.kind == "image":
                if encoder in ("mlp",):
                    raise ValueError(
                        f"observation entry {_name(e.key)!r} is an image {list(e.shape)}; "
                        "--encoder mlp reads vectors: add --encoder nature, impala, minatar "
                        "or flatten (each image entry gets its own)"
                    )
                if encoder == "flatten":
                    make_encoder(encoder, e.shape, feature_dim=feature_dim)  # its checks
                    parts.append(_FlatPixels(e.shape))
                else:
                    parts.append(make_encoder(encoder, e.shape, feature_dim=feature_dim)[0])
            elif e.kind == "discrete":
                parts.append(_OneHot(int(e.n)))
            else:
                stats = None
                if norms is not None and e.key in norms.keys:
                    stats = norms.of(e.key)
                parts.append(_Vector(e.shape, stats))
        self.parts = nn.ModuleList(parts)
        self.out_features = sum(int(p.out_features) for p in parts)

    def forward(self, *xs: Tensor) -> Tensor:
        if len(xs) != len(self.parts):
            raise ValueError(f"DictObsEncoder reads {self.in_keys}, got {len(xs)} tensors")
        feats = [part(x) for part, x in zip(self.parts, xs, strict=True)]
        return feats[0] if len(feats) == 1 else torch.cat(feats, dim=-1)


class MultiInputSequential(nn.Sequential):
    """``nn.Sequential`` whose first module takes several inputs (a :class:`DictObsEncoder`):
    ``(*xs) -> m_k(... m_1(m_0(*xs)))``. Same parameter names as ``nn.Sequential``."""

    multi_input = True

    def forward(self, *xs: Tensor) -> Tensor:  # type: ignore[override]
        x = self[0](*xs)
        for module in list(self)[1:]:
            x = module(x)
        return x


def chain(backbone: nn.Module, head: nn.Module) -> nn.Module:
    """``nn.Sequential(backbone, head)``, or :class:`MultiInputSequential` when the backbone
    takes several inputs."""
    if getattr(backbone, "multi_input", False):
        return MultiInputSequential(backbone, head)
    return nn.Sequential(backbone, head)


def obs_in_keys(obs_key) -> list:
    """A network's observation ``in_keys``: ``obs_key`` (one key, a string or a nested
    tuple), or a list of keys (a Dict observation's chosen entries)."""
    return list(obs_key) if isinstance(obs_key, list) else [obs_key]


def dict_obs_encoder(
    env,
    obs_keys: Sequence[str],
    *,
    encoder: str = "mlp",
    feature_dim: int | None = None,
    norms: EntryNorms | None = None,
) -> DictObsEncoder:
    """A :class:`DictObsEncoder` for ``env``'s entries ``obs_keys`` (from
    :func:`resolve_obs_keys`)."""
    entries = [_entry(env, k) for k in obs_keys]
    return DictObsEncoder(entries, encoder=encoder, feature_dim=feature_dim, norms=norms)


def entry_norms(env, obs_keys: Sequence[str]) -> EntryNorms | None:
    """:class:`EntryNorms` over the float vector entries among ``obs_keys`` (None when there
    is none: images and Discrete entries are not standardised)."""
    vectors = normalised_entries([_entry(env, k) for k in obs_keys])
    return EntryNorms(vectors) if vectors else None


def pack_entries(td: TensorDictBase, entries: Sequence[ObsEntry], *, next_: bool = False) -> Tensor:
    """The entries of ``td`` (under ``"next"`` with ``next_``) flattened into one float vector
    ``[*, sum of sizes]``: uint8 pixels scaled to [0, 1], Discrete entries one-hot. What an
    intrinsic reward built for one flat observation (RND's target and predictor) reads."""
    parts = []
    for e in entries:
        x = td.get((keys.NEXT, e.key) if next_ else e.key)
        lead = x.shape[: x.dim() - len(e.shape)]
        if e.kind == "discrete":
            x = nn.functional.one_hot(x.long(), int(e.n)).float()
        elif x.dtype == torch.uint8:
            x = x.float() / 255.0
        else:
            x = x.float()
        parts.append(x.reshape(*lead, -1))
    return torch.cat(parts, dim=-1)


def packed_width(entries: Sequence[ObsEntry]) -> int:
    """The width of :func:`pack_entries`."""
    return sum(
        int(e.n) if e.kind == "discrete" else int(torch.Size(e.shape).numel()) for e in entries
    )


class PackedObsView:
    """What :func:`~rlkit.objectives.intrinsic.make_intrinsic` reads of an env (its batch
    size, action spec and an ``"observation"`` spec), for the packed entries of a Dict
    observation (:func:`pack_entries`)."""

    def __init__(self, env, entries: Sequence[ObsEntry]) -> None:
        from torchrl.data import Composite, Unbounded

        self.batch_size = env.batch_size
        self.action_spec = env.action_spec
        width = packed_width(entries)
        self.observation_spec = Composite(
            {keys.OBSERVATION: Unbounded(shape=(*env.batch_size, width))},
            shape=env.batch_size,
        )


def obs_entries(env, obs_keys: Sequence[str]) -> list[ObsEntry]:
    """:class:`ObsEntry` of each of ``env``'s entries ``obs_keys``."""
    return [_entry(env, k) for k in obs_keys]
