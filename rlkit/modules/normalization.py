"""Running statistics and the observation / reward normalisers built on them.

Three pieces:

- :class:`RunningMeanStd`: mean and variance of a stream of batches, merged exactly with
  the parallel algorithm of Chan et al., so statistics gathered by several workers or
  ranks combine into what one process would have computed over all the data.
- :class:`ObservationNorm`: a TorchRL transform that standardises ``keys.OBSERVATION``
  with a :class:`RunningMeanStd`, clipping the result.
- :class:`RewardNorm`: a TorchRL transform that scales rewards by the running standard
  deviation of the discounted return (the scheme of Stable-Baselines3's ``VecNormalize``).

Why not TorchRL's ``VecNormV2``: by default it keeps one set of statistics per
sub-environment (``reduce_batch_dims=False``), computes the variance as
``E[x^2] - E[x]^2`` in float32 (cancellation when ``|mean| >> std``), decays old data
(``decay=0.9999``) and, applied to the reward, standardises the reward itself instead of
scaling it by the spread of the discounted return (CartPole's constant +1 becomes 0).
``tests/test_normalization.py`` pins the per-env statistics and the zeroed reward down.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist
from tensordict import TensorDictBase
from torch import Tensor, nn
from torchrl.data import Composite, Unbounded
from torchrl.envs.transforms import Transform

from rlkit import keys

__all__ = [
    "BatchRewardNorm",
    "ObservationNorm",
    "PopulationRewardNorm",
    "RewardNorm",
    "RunningMeanStd",
]

_RESET_KEY = "_reset"
Moments = tuple[Tensor, Tensor, Tensor]


def merge_moments(a: Moments, b: Moments) -> Moments:
    r"""Combine ``(mean, var, count)`` of two disjoint data sets (Chan et al., 1979).

    .. math::
        n = n_a + n_b,\quad \delta = \mu_b - \mu_a,\quad
        \mu = \mu_a + \delta\,\frac{n_b}{n},\quad
        \sigma^2 = \frac{n_a\sigma_a^2 + n_b\sigma_b^2 + \delta^2 n_a n_b / n}{n}

    Variances are population variances (divide by ``n``). An empty side (count 0)
    returns the other side unchanged.
    """
    mean_a, var_a, count_a = a
    mean_b, var_b, count_b = b
    count = count_a + count_b
    if float(count_b) == 0.0 or float(count) == 0.0:
        return mean_a, var_a, count_a
    delta = mean_b - mean_a
    mean = mean_a + delta * (count_b / count)
    m2 = var_a * count_a + var_b * count_b + delta.square() * (count_a * count_b / count)
    return mean, m2 / count, count


def subtract_moments(total: Moments, part: Moments) -> Moments:
    """Invert :func:`merge_moments`: the moments of ``total``'s data that ``part`` lacks.

    ``part`` must describe a subset of the data summarised by ``total``.
    """
    mean_t, var_t, count_t = total
    mean_p, var_p, count_p = part
    count = count_t - count_p
    if float(count) <= 1e-9 * max(float(count_t), 1.0):  # nothing left (up to rounding)
        return torch.zeros_like(mean_t), torch.ones_like(var_t), torch.zeros_like(count_t)
    mean = (mean_t * count_t - mean_p * count_p) / count
    m2 = var_t * count_t - var_p * count_p - (mean - mean_p).square() * (count_p * count / count_t)
    return mean, (m2 / count).clamp_min(0.0), count


def _mark_synced_after_load(module: RunningMeanStd, incompatible_keys: object) -> None:
    module._mark_synced()  # a module-level function, so RunningMeanStd stays picklable


class RunningMeanStd(nn.Module):
    r"""Mean and variance of everything passed to :meth:`update`, in float64.

    The statistics start from a prior of ``epsilon`` pseudo-samples with mean 0 and
    variance 1 (the convention of OpenAI Baselines and Stable-Baselines3, so a normaliser
    is close to the identity before it has seen data); ``epsilon=0`` gives exact sample
    statistics. Each batch is merged with :func:`merge_moments`.

    Buffers (plain tensors, so they travel in ``state_dict`` and checkpoints):
    ``mean`` ``[*shape]``, ``var`` ``[*shape]`` (population variance), ``count`` ``[]``.

    Args:
        shape: shape of one sample, e.g. ``(obs_dim,)``; ``()`` for scalars.
        epsilon: prior pseudo-count, ``>= 0``.

    Example:
        >>> rms = RunningMeanStd((2,), epsilon=0.0)
        >>> rms.update(torch.tensor([[0.0, 1.0], [2.0, 3.0]]))
        >>> rms.mean.tolist(), rms.var.tolist(), rms.count.item()
        ([1.0, 2.0], [1.0, 1.0], 2.0)
    """

    mean: Tensor
    var: Tensor
    count: Tensor

    def __init__(self, shape: Sequence[int] | int = (), *, epsilon: float = 1e-4) -> None:
        super().__init__()
        if epsilon < 0:
            raise ValueError(f"epsilon must be >= 0 (a prior pseudo-count), got {epsilon}")
        self.shape = torch.Size([shape] if isinstance(shape, int) else shape)
        self.epsilon = float(epsilon)
        kw = {"dtype": torch.float64}
        self.register_buffer("mean", torch.zeros(self.shape, **kw))
        self.register_buffer("var", torch.ones(self.shape, **kw))
        self.register_buffer("count", torch.tensor(self.epsilon, **kw))
        # The statistics every rank agreed on at the last all_reduce_ / sync / load:
        # all_reduce_ merges what each rank added since then, so nothing is counted twice.
        self.register_buffer("_base_mean", self.mean.clone(), persistent=False)
        self.register_buffer("_base_var", self.var.clone(), persistent=False)
        self.register_buffer("_base_count", self.count.clone(), persistent=False)
        self.register_load_state_dict_post_hook(_mark_synced_after_load)

    @property
    def std(self) -> Tensor:
        """Population standard deviation ``sqrt(var)``."""
        return self.var.sqrt()

    def moments(self) -> Moments:
        """``(mean, var, count)`` as a tuple of tensors (not copies)."""
        return self.mean, self.var, self.count

    @torch.no_grad()
    def update(self, x: Tensor) -> None:
        """Merge a batch ``x`` of shape ``[*B, *shape]`` (leading dims are flattened)."""
        if x.shape[x.dim() - len(self.shape) :] != self.shape:
            raise ValueError(
                f"RunningMeanStd.update expects samples of shape {tuple(self.shape)} as the "
                f"trailing dims, got a tensor of shape {tuple(x.shape)}"
            )
        x = x.detach().reshape(-1, *self.shape).to(self.mean.device, torch.float64)
        n_b = x.shape[0]
        if n_b == 0:
            return
        var_b, mean_b = torch.var_mean(x, 0, correction=0)
        # merge_moments, in place (this runs on every environment step)
        n_a = self.count.item()
        n = n_a + n_b
        delta = mean_b - self.mean
        self.mean.add_(delta, alpha=n_b / n)
        self.var.mul_(n_a / n).add_(var_b, alpha=n_b / n).addcmul_(
            delta, delta, value=n_a * n_b / n**2
        )
        self.count.fill_(n)

    @torch.no_grad()
    def merge_(self, other: RunningMeanStd | Mapping[str, Tensor] | Moments) -> RunningMeanStd:
        """Merge statistics gathered elsewhere, as if this instance had seen that data.

        ``other`` is a :class:`RunningMeanStd` (its ``epsilon`` prior is removed first, so
        the prior is counted once), or raw data statistics as a mapping with ``mean``,
        ``var``, ``count`` or a ``(mean, var, count)`` tuple. The data behind ``other``
        must be disjoint from the data already here.
        """
        if isinstance(other, RunningMeanStd):
            prior = (torch.zeros_like(other.mean), torch.ones_like(other.var))
            stats = subtract_moments(
                other.moments(), (*prior, other.count.new_tensor(other.epsilon))
            )
        elif isinstance(other, Mapping):
            stats = (other["mean"], other["var"], other["count"])
        else:
            stats = tuple(other)
        self._set(merge_moments(self.moments(), self._as_moments(stats)))
        return self

    @torch.no_grad()
    def sync_from(self, other: RunningMeanStd) -> RunningMeanStd:
        """Copy ``other``'s statistics exactly (e.g. a learner pushing to its collectors)."""
        if other.shape != self.shape:
            raise ValueError(
                f"cannot sync statistics of shape {tuple(other.shape)} into {tuple(self.shape)}"
            )
        self._set(other.moments())
        self._mark_synced()
        return self

    @torch.no_grad()
    def all_reduce_(self, group: dist.ProcessGroup | None = None) -> RunningMeanStd:
        """Merge the statistics of every ``torch.distributed`` rank, exactly.

        Each rank contributes what it has seen since the last ``all_reduce_`` (or since
        construction, ``sync_from`` or ``load_state_dict``, which must have left every rank
        with the same statistics); afterwards all ranks hold the statistics of the union of
        the data. A no-op when ``torch.distributed`` is not initialised.
        """
        if not (dist.is_available() and dist.is_initialized()):
            return self
        base = (self._base_mean, self._base_var, self._base_count)
        mean, var, count = subtract_moments(self.moments(), base)
        packed = torch.cat([count.reshape(1), mean.flatten(), var.flatten()])
        if dist.get_backend(group) == "nccl":
            packed = packed.to(torch.device("cuda", torch.cuda.current_device()))
        gathered = [torch.empty_like(packed) for _ in range(dist.get_world_size(group))]
        dist.all_gather(gathered, packed, group=group)
        result = base
        for g in gathered:
            g = g.to(self.mean.device)
            n = self.mean.numel()
            rank_stats = (g[1 : 1 + n].view(self.shape), g[1 + n :].view(self.shape), g[0])
            result = merge_moments(result, rank_stats)
        self._set(result)
        self._mark_synced()
        return self

    def normalize(self, x: Tensor, *, epsilon: float = 1e-8, clip: float | None = None) -> Tensor:
        """``clip((x - mean) / sqrt(var + epsilon), -clip, clip)`` in ``x``'s dtype."""
        inv_std = (self.var + epsilon).rsqrt_().to(x.device, x.dtype)
        out = (x - self.mean.to(x.device, x.dtype)).mul_(inv_std)
        # out of place: torch.vmap (population members) has no batching rule for clamp_
        return out if clip is None else out.clamp(-clip, clip)

    def _as_moments(self, stats: Sequence[Tensor | float]) -> Moments:
        mean, var, count = (torch.as_tensor(s, dtype=torch.float64) for s in stats)
        if mean.shape != self.shape or var.shape != self.shape:
            raise ValueError(
                f"statistics of shape mean={tuple(mean.shape)}, var={tuple(var.shape)} cannot "
                f"merge into a RunningMeanStd of shape {tuple(self.shape)}"
            )
        return mean.to(self.mean.device), var.to(self.mean.device), count.to(self.mean.device)

    def _set(self, moments: Moments) -> None:
        mean, var, count = moments
        self.mean.copy_(mean)
        self.var.copy_(var)
        self.count.copy_(count)

    def _mark_synced(self) -> None:
        self._base_mean.copy_(self.mean)
        self._base_var.copy_(self.var)
        self._base_count.copy_(self.count)

    def extra_repr(self) -> str:
        return f"shape={tuple(self.shape)}, epsilon={self.epsilon}"


class Normalize(nn.Module):
    """``(x - mean) / std`` clipped to +-``clip``, with statistics from a shared
    :class:`RunningMeanStd` (updated by the learner, not by this forward)."""

    def __init__(self, stats: nn.Module, *, clip: float = 10.0) -> None:
        super().__init__()
        self.stats, self.clip = stats, clip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stats.normalize(x, clip=self.clip)


def _reset_rows(tensordict: TensorDictBase | None, batch_size: torch.Size) -> Tensor | None:
    """The ``_reset`` mask as ``[*batch]`` booleans, or None for a full reset."""
    mask = None if tensordict is None else tensordict.get(_RESET_KEY, None)
    return None if mask is None else mask.reshape(batch_size)


class ObservationNorm(Transform):
    r"""Standardise ``keys.OBSERVATION`` with running statistics, then clip.

    .. math:: \tilde o = \operatorname{clip}\big((o - \mu) / \sqrt{\sigma^2 + \epsilon},
        -c, c\big)

    Reads and writes ``key`` (default ``keys.OBSERVATION``, ``[*B, *O]``) in the reset
    output and in ``("next", key)`` after each step. When ``update_stats`` is true every
    observation the environment emits is added to the statistics exactly once: the
    ``("next", key)`` of each step (the true final observation at done steps) and the
    observation of each sub-environment that is reset. Statistics are updated before the
    batch is normalised, as in Stable-Baselines3's ``VecNormalize``.

    Outside an env, calling the transform on a TensorDict (``forward``, e.g. in a replay
    buffer) normalises ``key`` and ``("next", key)`` without touching the statistics.

    Args:
        shape: observation shape ``O``.
        key: the observation entry to normalise.
        clip: bound ``c`` on the normalised value (``None``: no clipping). Default 10.
        epsilon: added to the variance. Default 1e-8.
        update_stats: update the statistics from the data (training collectors); set to
            ``False`` for evaluation envs or to freeze a normaliser.
        stats: an existing :class:`RunningMeanStd` to use (and share); a fresh one with
            ``epsilon=1e-4`` when ``None``.

    The statistics are the submodule ``stats``: ``state_dict()`` holds plain tensors
    (``stats.mean``, ``stats.var``, ``stats.count``) for checkpoints.
    """

    def __init__(
        self,
        shape: Sequence[int] | int,
        *,
        key: str = keys.OBSERVATION,
        clip: float | None = 10.0,
        epsilon: float = 1e-8,
        update_stats: bool = True,
        stats: RunningMeanStd | None = None,
    ) -> None:
        super().__init__(in_keys=[key], out_keys=[key])
        if clip is not None and clip <= 0:
            raise ValueError(f"clip must be positive or None, got {clip}")
        self.key = key
        self.clip = clip
        self.epsilon = epsilon
        self.update_stats = update_stats
        self.stats = stats if stats is not None else RunningMeanStd(shape)
        if self.stats.shape != torch.Size([shape] if isinstance(shape, int) else shape):
            raise ValueError(f"stats of shape {tuple(self.stats.shape)} != shape {shape}")

    def shared(self, *, update_stats: bool | None = None) -> ObservationNorm:
        """A new transform on the same statistics object (e.g. for an evaluation env)."""
        return ObservationNorm(
            self.stats.shape,
            key=self.key,
            clip=self.clip,
            epsilon=self.epsilon,
            update_stats=self.update_stats if update_stats is None else update_stats,
            stats=self.stats,
        )

    def sync_from(self, other: ObservationNorm | RunningMeanStd) -> ObservationNorm:
        """Copy another normaliser's statistics into this one (values, not a link)."""
        self.stats.sync_from(other.stats if isinstance(other, ObservationNorm) else other)
        return self

    def _apply_transform(self, obs: Tensor) -> Tensor:
        return self.stats.normalize(obs, epsilon=self.epsilon, clip=self.clip)

    def observe(self, obs: Tensor, rows: Tensor | None = None) -> Tensor:
        """What the env does with fresh observations ``obs`` ``[*B, *O]``: add them (only
        ``obs[rows]`` when a ``[*B]`` mask is given) to the statistics if ``update_stats``,
        then return all of ``obs`` normalised. Collectors that bypass TorchRL's transform
        machinery call this to stay identical to the transform."""
        if self.update_stats:
            self.stats.update(obs if rows is None else obs[rows])
        return self._apply_transform(obs)

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        next_tensordict.set(self.key, self.observe(next_tensordict.get(self.key)))
        return next_tensordict

    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        rows = _reset_rows(tensordict, tensordict_reset.batch_size)
        tensordict_reset.set(self.key, self.observe(tensordict_reset.get(self.key), rows))
        return tensordict_reset

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        for key in (self.key, (keys.NEXT, self.key)):
            value = tensordict.get(key, None)
            if value is not None:
                tensordict.set(key, self._apply_transform(value))
        return tensordict

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        spec = observation_spec[self.key]
        observation_spec[self.key] = Unbounded(spec.shape, device=spec.device, dtype=spec.dtype)
        return observation_spec


class RewardNorm(Transform):
    r"""Scale rewards by the running std of the discounted return (SB3 ``VecNormalize``).

    Per sub-environment it keeps the discounted return :math:`G_t = \gamma G_{t-1} + r_t`
    (reset to 0 when the episode ends), adds :math:`G_t` to a scalar
    :class:`RunningMeanStd`, and writes

    .. math:: \tilde r_t = \operatorname{clip}\big(r_t / \sqrt{\operatorname{Var}[G] +
        \epsilon}, -c, c\big)

    The reward is scaled, never shifted, so the sign of every reward (and which states
    are better) is kept. Reads ``("next", "reward")`` ``[*B, 1]`` and ``("next", "done")``;
    writes ``("next", "reward")``. Place :class:`torchrl.envs.RewardSum` before it so the
    tracked episode return stays in the environment's units.

    Args:
        gamma: discount of the return whose spread sets the scale (match the agent's).
        clip: bound ``c`` on the scaled reward (``None``: no clipping). Default 10.
        epsilon: added to the variance. Default 1e-8.
        update_stats: update the statistics from the data.
        stats: an existing scalar :class:`RunningMeanStd` to use.

    Reference: Engstrom et al., "Implementation Matters in Deep Policy Gradients" (2020),
    reward scaling; ``stable_baselines3.common.vec_env.VecNormalize``.
    """

    def __init__(
        self,
        *,
        gamma: float,
        clip: float | None = 10.0,
        epsilon: float = 1e-8,
        update_stats: bool = True,
        stats: RunningMeanStd | None = None,
    ) -> None:
        reward_key = keys.REWARD[-1]
        super().__init__(in_keys=[reward_key], out_keys=[reward_key])
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must lie in [0, 1], got {gamma}")
        if clip is not None and clip <= 0:
            raise ValueError(f"clip must be positive or None, got {clip}")
        self.gamma = gamma
        self.clip = clip
        self.epsilon = epsilon
        self.update_stats = update_stats
        self.stats = stats if stats is not None else RunningMeanStd(())
        self._returns: Tensor | None = None  # [*B, 1] float64, per sub-environment

    def sync_from(self, other: RewardNorm | RunningMeanStd) -> RewardNorm:
        """Copy another normaliser's statistics into this one (values, not a link)."""
        self.stats.sync_from(other.stats if isinstance(other, RewardNorm) else other)
        return self

    def _apply_transform(self, reward: Tensor) -> Tensor:
        scaled = reward * (self.stats.var + self.epsilon).rsqrt().to(reward.device, reward.dtype)
        return scaled if self.clip is None else scaled.clamp(-self.clip, self.clip)

    def observe(self, reward: Tensor, done: Tensor) -> Tensor:
        """One environment step: update the discounted returns with ``reward`` ``[*B, 1]``,
        add them to the statistics if ``update_stats``, zero them where ``done``, and
        return the scaled reward. Collectors that bypass TorchRL's transform machinery call
        this to stay identical to the transform."""
        returns = self._returns
        if returns is None or returns.shape != reward.shape:
            returns = torch.zeros(reward.shape, dtype=torch.float64, device=reward.device)
        scaled, self._returns = self.scale_step(returns, reward, done)
        return scaled

    def scale_step(self, returns: Tensor, reward: Tensor, done: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`observe` for discounted returns held by the caller (any rows, float64):
        returns ``(scaled reward, returns after this step, zeroed where done)``."""
        returns = returns * self.gamma + reward
        if self.update_stats:
            self.stats.update(returns)
        return self._apply_transform(reward), returns.masked_fill(done.reshape(returns.shape), 0.0)

    def reset_returns(self, rows: Tensor | None = None) -> None:
        """Zero the discounted returns of the sub-envs in the ``[*B]`` mask ``rows``
        (all of them when ``None``)."""
        if self._returns is None or rows is None:
            self._returns = None
        else:
            self._returns[rows] = 0.0

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        reward = next_tensordict.get(self.in_keys[0])
        done = next_tensordict.get(keys.DONE[-1])
        next_tensordict.set(self.in_keys[0], self.observe(reward, done))
        return next_tensordict

    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        self.reset_returns(_reset_rows(tensordict, tensordict_reset.batch_size))
        return tensordict_reset

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        reward = tensordict.get(keys.REWARD, None)
        if reward is not None:
            tensordict.set(keys.REWARD, self._apply_transform(reward))
        return tensordict


class PopulationRewardNorm(RewardNorm):
    r""":class:`RewardNorm` for a population's env of ``P x num_envs`` sub-envs: member ``i``'s
    rows ``[i N, (i + 1) N)`` keep their own discounted returns and statistics (with the
    member's own ``gamma``), exactly as the :class:`RewardNorm` of its standalone run would,
    so one member's rewards never change another's scale.

    The statistics are ``members[i].stats`` (checkpointed with the env's other statistics);
    the running returns live in ``members[i]``.

    Args:
        gammas: one discount per member (a sweep may differ in ``gamma``).
        num_envs: sub-envs per member (``N``).
        clip, epsilon: as :class:`RewardNorm`.
    """

    def __init__(
        self,
        gammas: Sequence[float],
        num_envs: int,
        *,
        clip: float | None = 10.0,
        epsilon: float = 1e-8,
    ) -> None:
        if not gammas:
            raise ValueError("PopulationRewardNorm needs at least one member's gamma")
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        reward_key = keys.REWARD[-1]
        Transform.__init__(self, in_keys=[reward_key], out_keys=[reward_key])
        self.members = nn.ModuleList(
            RewardNorm(gamma=g, clip=clip, epsilon=epsilon) for g in gammas
        )
        self.num_envs = int(num_envs)
        self.clip, self.epsilon, self.update_stats = clip, epsilon, True

    def _rows(self, x: Tensor) -> tuple[Tensor, ...]:
        rows = len(self.members) * self.num_envs
        if x.shape[0] != rows:
            raise ValueError(
                f"PopulationRewardNorm holds {len(self.members)} members x {self.num_envs} envs "
                f"= {rows} rows, got a reward of shape {tuple(x.shape)}"
            )
        return x.split(self.num_envs)

    def observe(self, reward: Tensor, done: Tensor) -> Tensor:
        parts = zip(self.members, self._rows(reward), self._rows(done), strict=True)
        return torch.cat([m.observe(r, d) for m, r, d in parts])

    def reset_returns(self, rows: Tensor | None = None) -> None:
        if rows is None:
            for m in self.members:
                m.reset_returns(None)
            return
        for m, part in zip(self.members, self._rows(rows), strict=True):
            m.reset_returns(part)

    def _apply_transform(self, reward: Tensor) -> Tensor:
        parts = zip(self.members, self._rows(reward), strict=True)
        return torch.cat([m._apply_transform(r) for m, r in parts])

    def scale_step(self, returns: Tensor, reward: Tensor, done: Tensor) -> tuple[Tensor, Tensor]:
        raise NotImplementedError(
            "PopulationRewardNorm scales a population's own env; for batches of worker "
            "envs use BatchRewardNorm"
        )

    def sync_from(self, other: RewardNorm | RunningMeanStd) -> RewardNorm:
        raise NotImplementedError(
            "a population's members keep separate reward statistics: copy "
            "members[i].stats one by one"
        )


class BatchRewardNorm(nn.Module):
    r""":class:`RewardNorm` applied by the learner to collected ``[N, T]`` batches, for
    collectors whose envs live in other processes (IMPALA's and APPO's workers): one set of
    statistics for all workers, kept in the learner's checkpoint with every env's running
    discounted return, so a resumed run scales rewards exactly as an uninterrupted one.

    For each row (one env's ``T`` consecutive steps) it runs :meth:`RewardNorm.scale_step`
    step by step, as the env-side transform would: :math:`G_t = \gamma G_{t-1} + r_t`
    (zeroed after a done step), :math:`G_t` added to the statistics, and
    :math:`\tilde r_t = \operatorname{clip}(r_t / \sqrt{\operatorname{Var}[G] + \epsilon},
    -c, c)` written to ``("next", "reward")`` in place. Rows are matched to envs by
    ``env_ids`` ``[N]`` (the worker collector's ``keys.ENV_ID``); rows of one env that arrive
    in one batch (a fast worker's two rollouts) are processed in arrival order.

    Args:
        num_envs: envs on this rank (``env_ids`` lie in ``[0, num_envs)``).
        gamma, clip, epsilon: as :class:`RewardNorm`.

    Example:
        >>> from tensordict import TensorDict
        >>> norm = BatchRewardNorm(2, gamma=0.99)
        >>> td = TensorDict({"next": {"reward": torch.ones(2, 3, 1),
        ...     "done": torch.zeros(2, 3, 1, dtype=torch.bool)}}, [2, 3])
        >>> norm(td)["next", "reward"].shape
        torch.Size([2, 3, 1])
    """

    returns: Tensor

    def __init__(
        self, num_envs: int, *, gamma: float, clip: float | None = 10.0, epsilon: float = 1e-8
    ) -> None:
        super().__init__()
        if num_envs < 1:
            raise ValueError(f"BatchRewardNorm: num_envs must be >= 1, got {num_envs}")
        self.norm = RewardNorm(gamma=gamma, clip=clip, epsilon=epsilon)  # statistics inside
        self.register_buffer("returns", torch.zeros(num_envs, 1, dtype=torch.float64))

    def forward(self, batch: TensorDictBase, env_ids: Tensor | None = None) -> TensorDictBase:
        reward, done = batch.get(keys.REWARD), batch.get(keys.DONE)
        rows, steps = batch.batch_size
        ids = torch.arange(rows) if env_ids is None else env_ids.reshape(rows).long().cpu()
        if int(ids.min()) < 0 or int(ids.max()) >= self.returns.shape[0]:
            raise ValueError(
                f"BatchRewardNorm: env ids {ids.tolist()} outside [0, {self.returns.shape[0]}): "
                "build it with the rank's number of envs"
            )
        scaled = torch.empty_like(reward)
        for layer in _distinct_layers(ids):
            returns = self.returns[ids[layer]].to(reward.device)
            for t in range(steps):
                scaled[layer, t], returns = self.norm.scale_step(
                    returns, reward[layer, t], done[layer, t]
                )
            self.returns[ids[layer]] = returns.to(self.returns.device)
        batch.set(keys.REWARD, scaled)
        return batch


def _distinct_layers(ids: Tensor) -> list[Tensor]:
    """Row indices split into groups of distinct ids, each id's rows in their order (the
    k-th occurrence of an id goes to group k), so a group can run in parallel."""
    seen: dict[int, int] = {}
    groups: list[list[int]] = []
    for row, env in enumerate(ids.tolist()):
        k = seen.get(env, 0)
        seen[env] = k + 1
        if k == len(groups):
            groups.append([])
        groups[k].append(row)
    return [torch.tensor(g) for g in groups]
