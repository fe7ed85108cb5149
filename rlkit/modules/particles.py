r"""Particle ensembles: P networks of one architecture, stacked and run as one vmapped batch.

Pieces, bottom up:

* :class:`StackedNetworks` holds ``P`` networks of one architecture with every parameter
  stacked along a leading particle dim ``[P, ...]`` (``torch.func.stack_module_state``); its
  forward runs all particles at once with ``torch.vmap`` over ``torch.func.functional_call``.
* :class:`ParticleRouter` routes the rows of an ``[N, ...]`` input to particles: row ``r``
  is scored by particle :func:`particle_index` ``= floor(r P / N)``, i.e. equal contiguous
  blocks of ``N / P`` rows when ``P`` divides ``N``. The training envs of a rank and the
  evaluation episodes are rows, so env ``e`` of ``num_envs`` acts with particle
  ``e // (num_envs / P)`` and evaluation episode ``e`` with ``e // (episodes / P)``.
* :func:`particle_ensemble` turns ``P`` TorchRL modules (``ProbabilisticActor``,
  ``ValueOperator``) into one module of the same kind whose network is a router over the
  stacked networks, so losses, estimators, collectors and the evaluator use it unchanged.
* :class:`ParticlePolicy` is the collection / evaluation policy: the ensemble actor plus
  ``keys.PARTICLE`` ``[N]`` (int64), the particle that acted in each row.

SVPG (:mod:`rlkit.algorithms.svpg`) trains such ensembles.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictModuleBase, TensorDictSequential
from torch import Tensor, nn

from rlkit import keys

__all__ = [
    "ParticlePolicy",
    "ParticleRouter",
    "StackedNetworks",
    "build_particles",
    "particle_ensemble",
    "particle_index",
    "particle_member",
    "stacked_networks",
]

Output = Tensor | tuple[Tensor, ...]


def _check_num_particles(num_particles: Any) -> int:
    if isinstance(num_particles, bool) or not isinstance(num_particles, int):
        raise TypeError(f"the number of particles must be an int, got {num_particles!r}")
    if num_particles < 1:
        raise ValueError(
            f"SVPG needs at least 1 particle, got {num_particles} (--particles 4 is the default)"
        )
    return num_particles


def particle_index(rows: int, num_particles: int, *, device=None) -> Tensor:
    """The particle of each of ``rows`` rows, ``floor(r P / rows)``, int64 ``[rows]``.

    With ``P`` dividing ``rows`` these are equal contiguous blocks:
    ``particle_index(8, 4) = [0, 0, 1, 1, 2, 2, 3, 3]``.
    """
    _check_num_particles(num_particles)
    return torch.arange(rows, device=device) * num_particles // rows


def _map(fn: Callable[[Tensor], Tensor], out: Output) -> Output:
    return tuple(fn(o) for o in out) if isinstance(out, tuple) else fn(out)


class StackedNetworks(nn.Module):
    r"""``P`` networks of one architecture run as one: parameters stacked ``[P, ...]``.

    ``forward(x)`` takes ``x`` ``[P, *B, *F]`` (particle first) and returns
    ``[P, *B, *out]``: :math:`y_p = f(x_p; \theta_p)` for every ``p`` in one vmapped call.
    Parameters live in ``self.stacked`` (one ``nn.Parameter`` per parameter of the
    architecture, in ``self.names`` order), so a single optimiser, checkpoint and gradient
    all-reduce see all particles; ``flat_parameters()`` / ``flat_grads()`` give them as
    ``[P, D]`` rows.

    Args:
        members: the ``P >= 1`` networks (plain ``nn.Module`` tensor -> tensor(s));
            their current values are copied in. Buffers are not supported (running
            statistics would have to be shared or reduced; SVPG's recipe does not use them).
    """

    def __init__(self, members: Sequence[nn.Module]) -> None:
        super().__init__()
        members = list(members)
        _check_num_particles(len(members))
        shapes = [[(n, p.shape) for n, p in m.named_parameters()] for m in members]
        if any(s != shapes[0] for s in shapes):
            raise ValueError("the particle networks must share one architecture")
        if any(True for m in members for _ in m.buffers()):
            raise ValueError(
                "StackedNetworks does not stack buffers (running statistics): build the "
                "particle networks without observation normalisation"
            )
        params, _ = torch.func.stack_module_state(members)
        self.names = list(params)
        self.stacked = nn.ParameterList([nn.Parameter(params[n].detach()) for n in self.names])
        # the architecture only (no storage), outside the module tree so it is neither a
        # parameter nor moved by .to(); functional_call substitutes the stacked values
        self._base = (copy.deepcopy(members[0]).to("meta"),)

    @property
    def num_particles(self) -> int:
        return self.stacked[0].shape[0]

    def _call(self, params: dict[str, Tensor], *xs: Tensor) -> Output:
        return torch.func.functional_call(self._base[0], params, xs)

    def forward(self, *xs: Tensor) -> Output:
        """``xs``: one input (a flat observation) or several (a Dict observation's entries,
        the architecture a :class:`~rlkit.modules.dictobs.MultiInputSequential`), each
        particle first."""
        for x in xs:
            if x.shape[0] != self.num_particles:
                raise ValueError(
                    f"StackedNetworks expects the particle dim first: input of shape "
                    f"{list(x.shape)} for {self.num_particles} particles (use ParticleRouter "
                    "for [rows, ...] inputs)"
                )
        params = dict(zip(self.names, self.stacked))
        return torch.vmap(self._call)(params, *xs)

    def member(self, index: int) -> nn.Module:
        """Particle ``index``'s network as a stand-alone module of the architecture (a copy
        of its parameters)."""
        if not 0 <= index < self.num_particles:
            raise IndexError(
                f"particle {index} does not exist: this ensemble has {self.num_particles} "
                f"(0 to {self.num_particles - 1})"
            )
        net = copy.deepcopy(self._base[0]).to_empty(device=self.stacked[0].device)
        state = {n: t[index].detach().clone() for n, t in zip(self.names, self.stacked)}
        net.load_state_dict(state)
        return net

    def flat_parameters(self) -> Tensor:
        """``[P, D]``: each particle's parameters flattened in ``self.names`` order."""
        p = self.num_particles
        return torch.cat([t.detach().reshape(p, -1) for t in self.stacked], dim=1)

    def flat_grads(self) -> Tensor:
        """``[P, D]``: each particle's ``.grad`` flattened like :meth:`flat_parameters`
        (zeros where a parameter has no gradient)."""
        p = self.num_particles
        return torch.cat(
            [
                (t.grad if t.grad is not None else torch.zeros_like(t)).reshape(p, -1)
                for t in self.stacked
            ],
            dim=1,
        )

    def set_flat_grads(self, grads: Tensor) -> None:
        """Write ``[P, D]`` rows back into the parameters' ``.grad``."""
        offset = 0
        for t in self.stacked:
            n = t[0].numel()
            value = grads[:, offset : offset + n].reshape(t.shape)
            if t.grad is None:
                t.grad = value.clone()
            else:
                t.grad.copy_(value)
            offset += n


class ParticleRouter(nn.Module):
    """Scores row ``r`` of an ``[N, ...]`` input with particle :func:`particle_index`.

    When ``P`` divides ``N`` the input is viewed as ``[P, N/P, ...]`` (no copy, one
    vmapped forward). Otherwise (e.g. a 1-row video episode) every particle scores every
    row and row ``r`` keeps its own particle's output.
    """

    def __init__(self, networks: StackedNetworks) -> None:
        super().__init__()
        self.networks = networks

    def forward(self, *xs: Tensor) -> Output:
        n, p = xs[0].shape[0], self.networks.num_particles
        if n % p == 0:
            out = self.networks(*(x.reshape(p, n // p, *x.shape[1:]) for x in xs))
            return _map(lambda o: o.reshape(n, *o.shape[2:]), out)
        out = self.networks(*(x.unsqueeze(0).expand(p, *x.shape) for x in xs))
        rows = torch.arange(n, device=xs[0].device)
        owner = particle_index(n, p, device=xs[0].device)
        return _map(lambda o: o[owner, rows], out)


def _network_slot(module: nn.Module) -> TensorDictModule:
    """The one ``TensorDictModule`` inside ``module`` that wraps a plain network."""
    slots = [
        m
        for m in module.modules()
        if isinstance(m, TensorDictModule)
        and not isinstance(m, TensorDictSequential)
        and not isinstance(m.module, TensorDictModuleBase)
    ]
    if len(slots) != 1:
        raise TypeError(
            f"{type(module).__name__} must hold exactly one TensorDictModule around a plain "
            f"network (as make_actor / make_value build), found {len(slots)}"
        )
    return slots[0]


def particle_ensemble(members: Sequence[nn.Module]) -> nn.Module:
    """``P`` TensorDict modules of one kind -> one module scoring rows by particle.

    The result is a copy of ``members[0]`` (same keys, distribution, spec) whose network
    is a :class:`ParticleRouter` over the members' networks stacked; the members keep
    their own parameters (the stack holds copies).
    """
    members = list(members)
    _check_num_particles(len(members))
    nets = [_network_slot(m).module for m in members]
    ensemble = copy.deepcopy(members[0])
    _network_slot(ensemble).module = ParticleRouter(StackedNetworks(nets))
    return ensemble


def particle_member(ensemble: nn.Module, index: int) -> nn.Module:
    """Particle ``index`` of an ensemble built by :func:`particle_ensemble`, as a module of
    the members' kind (a ``ProbabilisticActor`` for an actor ensemble): a copy of the
    ensemble whose network is that particle's own, usable on its own (collectors,
    evaluation, ``--init-from`` of a one-actor recipe with the same architecture)."""
    member = copy.deepcopy(ensemble)
    slot = _network_slot(member)
    router = slot.module
    if not isinstance(router, ParticleRouter):
        raise TypeError(f"{type(ensemble).__name__} is not a particle ensemble")
    slot.module = router.networks.member(index)
    return member


def stacked_networks(module: nn.Module) -> StackedNetworks:
    """The :class:`StackedNetworks` inside an ensemble built by :func:`particle_ensemble`."""
    found = [m for m in module.modules() if isinstance(m, StackedNetworks)]
    if len(found) != 1:
        raise TypeError(
            f"expected one StackedNetworks inside {type(module).__name__} (build it with "
            f"particle_ensemble), found {len(found)}"
        )
    return found[0]


class ParticlePolicy(TensorDictModuleBase):
    """The ensemble actor, also writing ``keys.PARTICLE`` ``[N]`` int64 (who acted)."""

    def __init__(self, actor: nn.Module) -> None:
        super().__init__()
        self.actor = actor
        self.num_particles = stacked_networks(actor).num_particles
        self.in_keys = list(actor.in_keys)
        self.out_keys = [*actor.out_keys, keys.PARTICLE]

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        tensordict = self.actor(tensordict)
        rows = tensordict.batch_size[0]
        index = particle_index(rows, self.num_particles, device=tensordict.device)
        tensordict.set(keys.PARTICLE, index)
        return tensordict


def build_particles(
    env,
    *,
    num_particles: int,
    hidden: Sequence[int] = (64, 64),
    activation: str = "tanh",
    obs_keys: Sequence[str] | None = None,
) -> tuple[nn.Module, nn.Module]:
    """``num_particles`` independently initialised actors and V critics sized from ``env``,
    as two ensembles (:func:`particle_ensemble`): ``(actor, critic)``.

    ``obs_keys``: a Dict observation's chosen entries (from
    :func:`~rlkit.modules.dictobs.resolve_obs_keys`; None: one ``"observation"``): each
    particle's networks read them through their own
    :class:`~rlkit.modules.dictobs.DictObsEncoder` (vector and Discrete entries; an image
    entry is refused in one line, the particles have no image encoder)."""
    from rlkit.modules import make_actor, make_value
    from rlkit.modules.dictobs import DICT_OBS_RECIPES, dict_obs_encoder

    _check_num_particles(num_particles)
    net = dict(hidden=tuple(hidden), activation=activation)
    obs_spec, act_spec = env.observation_spec, env.action_spec
    if obs_keys is not None:

        def entries() -> dict:
            try:
                enc = dict_obs_encoder(env, obs_keys)
            except ValueError as err:
                if "is an image" not in str(err):
                    raise
                raise ValueError(
                    f"{str(err).split(';')[0]}: svpg's particles read vector and Discrete "
                    f"entries (no image encoder); choose others with --obs-keys, or use one "
                    f"of {DICT_OBS_RECIPES}, whose networks take images"
                ) from None
            return dict(backbone=enc, in_features=enc.out_features, obs_key=list(obs_keys))

        actors = [make_actor(obs_spec, act_spec, **entries(), **net) for _ in range(num_particles)]
        critics = [make_value(obs_spec, **entries(), **net) for _ in range(num_particles)]
        return particle_ensemble(actors), particle_ensemble(critics)
    actors = [make_actor(obs_spec, act_spec, **net) for _ in range(num_particles)]
    critics = [make_value(obs_spec, **net) for _ in range(num_particles)]
    return particle_ensemble(actors), particle_ensemble(critics)
