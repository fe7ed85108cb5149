r"""Random Network Distillation (Burda et al. 2018): the exploration bonus and its predictor's
loss.

The pieces (RND-PPO's two streams are :mod:`rlkit.objectives.intrinsic`'s ``RNDReward`` with
an intrinsic critic of its own, attached to any policy-gradient learner):

* :class:`RND` -- a frozen random *target* network :math:`f` and a trained *predictor*
  :math:`\hat f` on normalised, clipped observations. The intrinsic reward of a step is the
  predictor's error at the observation the step returned, scaled by the running standard
  deviation of the discounted intrinsic return.
* :class:`RNDPredictorLoss` -- the predictor's distillation loss on a minibatch's next
  observations, a loss of its own (its own optimiser) trained in lockstep with the PPO loss.

References: Burda, Edwards, Storkey, Klimov 2018, "Exploration by Random Network
Distillation" (arXiv:1810.12894), section 2.2-2.4 and appendix A.4 (hyperparameters);
reference code ``openai/random-network-distillation`` (``policies/cnn_policy_param_matched.py``,
``ppo_agent.py``: ``RewardForwardFilter``, ``proportion_of_exp_used_for_predictor_update``).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from tensordict import NestedKey, TensorDict, TensorDictBase
from torch import Tensor, nn

from rlkit import keys
from rlkit.modules.networks import make_encoder, mlp
from rlkit.modules.normalization import RunningMeanStd
from rlkit.objectives.common import (
    LossBase,
    require_keys,
)

__all__ = [
    "RND",
    "ReturnScaler",
    "RNDPredictorLoss",
]


def _check_real(name: str, value: object, low: float, high: float, *, open_low: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    value = float(value)
    ok = (low < value if open_low else low <= value) and value <= high  # NaN fails
    if not ok:
        bracket = "(" if open_low else "["
        raise ValueError(f"{name} must be in {bracket}{low:g}, {high:g}], got {value}")
    return value


# --------------------------------------------------------------------------- reward scale
class ReturnScaler(nn.Module):
    r"""Scale a reward stream by the running std of its discounted return.

    Per environment :math:`R_t = \gamma R_{t-1} + r_t` (episodic: reset to 0 after a done
    step; non-episodic: never reset, the paper's ``RewardForwardFilter`` for the intrinsic
    stream). Every :math:`R_t` enters a scalar
    :class:`~rlkit.modules.normalization.RunningMeanStd`, and the reward is divided (never
    shifted) by its standard deviation: :math:`\tilde r_t = r_t / \sqrt{\mathrm{Var}[R] +
    10^{-8}}`. Buffers: ``running_return`` ``[num_envs]`` float64 and ``stats``.

    Args:
        num_envs: rows of the ``[N, T]`` reward batches.
        gamma: discount of :math:`R` in [0, 1].
        episodic: reset :math:`R` at episode ends (needs ``done``).

    Example:
        >>> scaler = ReturnScaler(num_envs=1, gamma=0.5, episodic=False)
        >>> scaler.returns(torch.tensor([[1.0, 1.0, 1.0]])).tolist()
        [[1.0, 1.5, 1.75]]
    """

    running_return: Tensor

    def __init__(self, *, num_envs: int, gamma: float, episodic: bool) -> None:
        super().__init__()
        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"ReturnScaler: num_envs must be an int >= 1, got {num_envs!r}")
        self.num_envs = num_envs
        self.gamma = _check_real("ReturnScaler: gamma", gamma, 0.0, 1.0, open_low=False)
        self.episodic = bool(episodic)
        self.stats = RunningMeanStd(())
        self.register_buffer("running_return", torch.zeros(num_envs, dtype=torch.float64))

    def extra_repr(self) -> str:
        return f"num_envs={self.num_envs}, gamma={self.gamma}, episodic={self.episodic}"

    def resize(self, num_envs: int) -> None:
        """Rows of ``num_envs`` envs from now on, each return starting from zero (a
        population member built on the shared env of every member's rows)."""
        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"ReturnScaler: num_envs must be an int >= 1, got {num_envs!r}")
        self.num_envs = num_envs
        self.running_return = self.running_return.new_zeros(num_envs)

    @torch.no_grad()
    def returns(self, reward: Tensor, done: Tensor | None = None) -> Tensor:
        r"""Advance :math:`R` over ``reward`` ``[N, T]`` (envs, time); return every
        :math:`R_t` ``[N, T]`` (float64) and keep the running value for the next batch."""
        if reward.dim() != 2 or reward.shape[0] != self.num_envs:
            raise ValueError(
                f"ReturnScaler: rewards of shape {list(reward.shape)} must be [N, T] with N = "
                f"num_envs = {self.num_envs} (envs first, time second: the collector's layout)"
            )
        if self.episodic and (done is None or done.shape != reward.shape):
            raise ValueError(
                "ReturnScaler(episodic=True) needs done flags of the reward's shape "
                f"{list(reward.shape)}, got {None if done is None else list(done.shape)}"
            )
        out = torch.empty(reward.shape, dtype=torch.float64, device=reward.device)
        running = self.running_return.to(reward.device)
        for t in range(reward.shape[1]):
            running = running * self.gamma + reward[:, t].double()
            out[:, t] = running
            if self.episodic:
                running = running.masked_fill(done[:, t], 0.0)
        self.running_return.copy_(running)
        return out

    def scale(self) -> Tensor:
        r""":math:`1 / \sqrt{\mathrm{Var}[R] + 10^{-8}}`, a float64 scalar."""
        return (self.stats.var + 1e-8).rsqrt()

    @torch.no_grad()
    def forward(
        self,
        reward: Tensor,
        done: Tensor | None = None,
        *,
        update_stats: bool = True,
        all_gather: Callable[[Tensor], Tensor] | None = None,
    ) -> Tensor:
        """Scaled ``reward`` ``[N, T]``; with ``update_stats`` the returns advance and every
        rank's (``all_gather``) returns enter the statistics first."""
        if update_stats:
            returns = self.returns(reward, done)
            self.stats.update(returns if all_gather is None else all_gather(returns))
        return (reward.double() * self.scale()).to(reward.dtype)


def normalized_flat(
    obs: Tensor, stats: RunningMeanStd, obs_shape: torch.Size, clip: float, *, owner: str
) -> Tensor:
    """``clip((obs - mean) / std, -clip, clip)`` of observations ``[*, *obs_shape]`` with
    ``stats``, flattened to ``[*, numel(obs_shape)]`` (an exploration bonus's input)."""
    lead = obs.shape[: obs.dim() - len(obs_shape)]
    if obs.shape[len(lead) :] != obs_shape:
        raise ValueError(
            f"{owner} expects observations [*, {', '.join(map(str, obs_shape))}], got a "
            f"tensor of shape {list(obs.shape)}"
        )
    return stats.normalize(obs.float(), clip=clip).reshape(*lead, -1)


def encoded_mlp(
    obs_shape: torch.Size,
    out_features: int,
    *,
    hidden: Sequence[int],
    activation: str | type[nn.Module],
    encoder: str = "mlp",
    encoder_dim: int | None = None,
) -> nn.Module:
    """A network over flattened observations ``[*, numel(obs_shape)]`` (what
    :func:`normalized_flat` gives): :func:`~rlkit.modules.networks.mlp` for ``encoder="mlp"``
    (exactly as before encoders existed), else ``unflatten -> encoder -> mlp``."""
    if encoder == "mlp":
        if encoder_dim is not None:
            make_encoder("mlp", (int(obs_shape.numel()),), feature_dim=encoder_dim)
        return mlp(int(obs_shape.numel()), out_features, hidden=hidden, activation=activation)
    enc, width = make_encoder(encoder, tuple(obs_shape), feature_dim=encoder_dim)
    head = mlp(width, out_features, hidden=hidden, activation=activation)
    return nn.Sequential(nn.Unflatten(-1, tuple(obs_shape)), enc, head)


# --------------------------------------------------------------------------- the bonus
class RND(nn.Module):
    r"""Random Network Distillation: target :math:`f`, predictor :math:`\hat f`, statistics.

    Observations are standardised with running statistics and clipped,
    :math:`x = \mathrm{clip}((s - \mu_s)/\sigma_s, -c, c)` (:math:`c` = ``obs_clip``, 5 in
    the paper). The raw bonus of the step that returned :math:`s'` is

    .. math:: e(s') = \lVert \hat f(x') - f(x') \rVert_2^2 ,

    and the intrinsic reward divides it by the running standard deviation of the
    *discounted intrinsic return* of each environment, accumulated non-episodically
    (episode ends do not reset it, as in the paper's ``RewardForwardFilter``):

    .. math:: R_t = \gamma_I R_{t-1} + e_t,\qquad r^I_t = e_t / \sigma(R).

    The predictor minimises the mean squared error over the features on a random fraction
    :math:`p` (``update_proportion``, 0.25 in the paper) of each minibatch, every sample kept
    independently with probability :math:`p`:

    .. math:: L_{pred} = \frac{\sum_i m_i \, e(s'_i) / k}{\max(1, \sum_i m_i)},
        \quad m_i \sim \mathrm{Bernoulli}(p),

    with :math:`k` the feature width. The target's parameters never receive gradients.

    State (all buffers or parameters, so ``state_dict`` and checkpoints carry them):
    ``obs_stats`` (:class:`~rlkit.modules.normalization.RunningMeanStd` of observations),
    ``return_scaler`` (a non-episodic :class:`ReturnScaler`: the per-environment :math:`R`
    and its statistics), the target's and predictor's weights.

    Args:
        obs_shape: the observation shape ``O`` (flattened into the networks' input).
        num_envs: environments in a batch (rows of :meth:`intrinsic_reward`'s input).
        feature_dim: width :math:`k` of the random features (the paper: 512 on Atari).
        target_hidden, predictor_hidden: hidden widths; the paper's predictor is deeper.
        activation: hidden activation (the paper: leaky ReLU).
        encoder: ``"mlp"`` (flat input), or an image encoder of
            :func:`~rlkit.modules.networks.make_encoder` (``"nature"``, ``"impala"``,
            ``"minatar"``) that the target and the predictor each get their own of, before
            their hidden layers (the paper's conv nets; observations ``[H, W, C]`` or
            ``[C, H, W]``, standardised per pixel as above).
        encoder_dim: the image encoder's output width (None: the paper's of that encoder).
        obs_clip: :math:`c > 0`.
        gamma_int: :math:`\gamma_I \in [0, 1]` of the return whose spread scales the reward.
        update_proportion: :math:`p \in (0, 1]`.

    Deviations: the encoders' activations are ReLU (the paper's CNNs: leaky ReLU), and all
    channels are read (the paper: the last frame of the stack); the observation
    statistics are updated from every batch *before* its rewards are computed (so the first
    batch, collected by the near-uniform initial policy, initialises them, which plays the
    role of the paper's random-policy warm-up steps). ``e`` is the squared norm (the
    reference code takes the mean over features, a constant factor :math:`k` that the
    division by :math:`\sigma(R)` cancels).

    Example:
        >>> rnd = RND((2,), num_envs=3, feature_dim=8, target_hidden=(16,),
        ...           predictor_hidden=(16,))
        >>> r = rnd.intrinsic_reward(torch.randn(3, 5, 2))
        >>> r.shape, bool((r >= 0).all())
        (torch.Size([3, 5, 1]), True)
    """

    def __init__(
        self,
        obs_shape: Sequence[int] | int,
        *,
        num_envs: int,
        feature_dim: int = 64,
        target_hidden: Sequence[int] = (64, 64),
        predictor_hidden: Sequence[int] = (64, 64),
        activation: str | type[nn.Module] = "relu",
        obs_clip: float = 5.0,
        gamma_int: float = 0.99,
        update_proportion: float = 0.25,
        encoder: str = "mlp",
        encoder_dim: int | None = None,
    ) -> None:
        super().__init__()
        self.obs_shape = torch.Size([obs_shape] if isinstance(obs_shape, int) else obs_shape)
        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"RND: num_envs must be an int >= 1, got {num_envs!r}")
        self.num_envs = num_envs
        self.update_proportion = _check_real(
            "RND: update_proportion", update_proportion, 0.0, 1.0, open_low=True
        )
        self.gamma_int = _check_real("RND: gamma_int", gamma_int, 0.0, 1.0, open_low=False)
        self.obs_clip = _check_real("RND: obs_clip", obs_clip, 0.0, math.inf, open_low=True)
        self.encoder = encoder
        net = dict(activation=activation, encoder=encoder, encoder_dim=encoder_dim)
        self.target = encoded_mlp(self.obs_shape, feature_dim, hidden=target_hidden, **net)
        self.target.requires_grad_(False)
        self.predictor = encoded_mlp(self.obs_shape, feature_dim, hidden=predictor_hidden, **net)
        self.feature_dim = feature_dim
        self.obs_stats = RunningMeanStd(self.obs_shape)
        self.return_scaler = ReturnScaler(num_envs=num_envs, gamma=gamma_int, episodic=False)

    def resize(self, num_envs: int) -> None:
        """Batches of ``num_envs`` envs from now on (:meth:`ReturnScaler.resize`)."""
        self.return_scaler.resize(num_envs)
        self.num_envs = num_envs

    @property
    def return_stats(self) -> RunningMeanStd:
        """Statistics of the discounted intrinsic return (``return_scaler.stats``)."""
        return self.return_scaler.stats

    @property
    def running_return(self) -> Tensor:
        """The per-env discounted intrinsic return ``[num_envs]`` (float64)."""
        return self.return_scaler.running_return

    def extra_repr(self) -> str:
        return (
            f"obs_shape={tuple(self.obs_shape)}, num_envs={self.num_envs}, "
            f"gamma_int={self.gamma_int}, update_proportion={self.update_proportion}, "
            f"obs_clip={self.obs_clip}, encoder={self.encoder!r}"
        )

    # ----------------------------------------------------------------- networks
    def normalize(self, obs: Tensor) -> Tensor:
        """``clip((obs - mean) / std, -obs_clip, obs_clip)``, flattened to ``[*, numel(O)]``."""
        return normalized_flat(obs, self.obs_stats, self.obs_shape, self.obs_clip, owner="RND")

    def prediction_error(self, obs: Tensor) -> Tensor:
        r""":math:`\lVert \hat f(x) - f(x) \rVert^2` per sample, ``[*]``; grad reaches the
        predictor only."""
        x = self.normalize(obs)
        with torch.no_grad():
            target = self.target(x)
        return (self.predictor(x) - target).square().sum(-1)

    def predictor_loss(
        self,
        obs: Tensor,
        *,
        mask: Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Mean squared feature error on the kept samples (``mask``, or a fresh Bernoulli
        mask with probability ``update_proportion`` drawn from ``generator``)."""
        error = self.prediction_error(obs) / self.feature_dim
        if mask is None:
            mask = self.sample_mask(error.shape, generator=generator)
        if mask.shape != error.shape:
            raise ValueError(
                f"RND.predictor_loss: mask of shape {list(mask.shape)} does not match the "
                f"samples {list(error.shape)}"
            )
        mask = mask.to(error.device, error.dtype)
        return (error * mask).sum() / mask.sum().clamp_min(1.0)

    def sample_mask(
        self, shape: Sequence[int], *, generator: torch.Generator | None = None
    ) -> Tensor:
        """Bool mask keeping each sample independently with probability ``update_proportion``
        (drawn on the CPU from ``generator``, so a seeded run repeats on any device)."""
        return torch.rand(torch.Size(shape), generator=generator) < self.update_proportion

    # ----------------------------------------------------------------- rewards
    def reward_scale(self) -> Tensor:
        r""":math:`1 / \sigma(R)` from the current return statistics (a float64 scalar)."""
        return self.return_scaler.scale()

    @torch.no_grad()
    def intrinsic_reward(
        self,
        next_obs: Tensor,
        *,
        update_stats: bool = True,
        all_gather: Callable[[Tensor], Tensor] | None = None,
    ) -> Tensor:
        r"""The intrinsic reward :math:`r^I` ``[N, T, 1]`` of next observations ``[N, T, *O]``.

        With ``update_stats`` (training): merge ``next_obs`` into the observation statistics,
        compute :math:`e`, advance the per-env discounted return and merge it into the
        return statistics, then scale. ``all_gather`` (e.g. ``Context.all_gather``) stacks a
        tensor from every rank, so every rank merges the same data and the statistics stay
        identical across ranks. Without ``update_stats`` nothing is changed.
        """
        gather = all_gather or (lambda t: t)
        self._check_envs(next_obs, "next_obs")
        if update_stats:
            self.obs_stats.update(gather(next_obs))
        raw = self.prediction_error(next_obs)
        return self.return_scaler(raw, update_stats=update_stats, all_gather=all_gather).unsqueeze(
            -1
        )

    def _check_envs(self, tensor: Tensor, name: str) -> None:
        if tensor.dim() < 2 or tensor.shape[0] != self.num_envs:
            raise ValueError(
                f"RND: {name} of shape {list(tensor.shape)} must be [N, T, ...] with N = "
                f"num_envs = {self.num_envs} (envs first, time second: the collector's layout)"
            )


# --------------------------------------------------------------------------- the predictor
LOSS_PREDICTOR = "loss_predictor"
WRITTEN_BY_COLLECTOR = "the collector writes it (the observation the step returned)"


class RNDPredictorLoss(LossBase):
    r"""RND's predictor loss as a loss module: :meth:`RND.predictor_loss` on the minibatch's
    *next* observations :math:`s'` (the observations the bonus scores).

    .. math:: \text{loss\_predictor} = \frac{\sum_i m_i\, \lVert \hat f(x'_i) -
        f(x'_i) \rVert^2 / k}{\max(1, \sum_i m_i)},\qquad m_i \sim
        \mathrm{Bernoulli}(p)

    Each call draws a fresh mask from :attr:`generator` (``None``: torch's global generator);
    :class:`~rlkit.algorithms.rnd.RNDLearner` sets it to the run's generator
    (``Context.generator``) before each update, so a seeded run repeats.

    Keys read: ``keys.NEXT_OBSERVATION`` ``[*, *O]`` (renamable with
    ``set_keys(next_observation=...)``). Writes ``loss_predictor``; its gradient reaches the
    predictor only (the target is frozen).

    Args:
        rnd: the :class:`RND` module whose predictor this trains.

    Example:
        >>> rnd = RND((2,), num_envs=1, feature_dim=4, target_hidden=(8,), predictor_hidden=(8,))
        >>> loss = RNDPredictorLoss(rnd)
        >>> loss.generator = torch.Generator().manual_seed(0)
        >>> td = TensorDict({keys.NEXT_OBSERVATION: torch.randn(6, 2)}, batch_size=[6])
        >>> loss(td)["loss_predictor"].backward()
    """

    @dataclass
    class _AcceptedKeys:
        """Input keys, renamable with ``loss.set_keys(name=key)``."""

        next_observation: NestedKey = keys.NEXT_OBSERVATION

    def __init__(self, rnd: RND) -> None:
        super().__init__()
        if not isinstance(rnd, RND):
            raise TypeError(
                f"RNDPredictorLoss: rnd must be an RND module, got {type(rnd).__name__}"
            )
        self.rnd = rnd
        #: the generator the Bernoulli mask is drawn from (set by the learner)
        self.generator: torch.Generator | None = None

    @classmethod
    def default_keys(cls) -> _AcceptedKeys:
        return cls._AcceptedKeys()

    @property
    def in_keys(self) -> list[NestedKey]:
        return [self.tensor_keys.next_observation]

    @property
    def out_keys(self) -> list[str]:
        return [LOSS_PREDICTOR]

    def make_value_estimator(self, value_type: object = None, **hyperparams: object) -> None:
        raise NotImplementedError("RNDPredictorLoss has no value estimator")

    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        key = self.tensor_keys.next_observation
        require_keys(tensordict, {key: WRITTEN_BY_COLLECTOR}, owner="RNDPredictorLoss")
        loss = self.rnd.predictor_loss(tensordict.get(key), generator=self.generator)
        return TensorDict({LOSS_PREDICTOR: loss}, batch_size=[])
