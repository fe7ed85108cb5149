r"""Intrinsic rewards as a part: a module that reads a batch's transitions, writes an
intrinsic reward, and trains with a loss of its own in the shared update loop.

An :class:`IntrinsicReward` has two faces:

* :meth:`IntrinsicReward.intrinsic_reward` (no gradient): the bonus of every step of an
  ``[N, T]`` batch (envs first), from the step's observation :math:`s`, action :math:`a` and
  next observation :math:`s'`, scaled by the running standard deviation of its discounted
  (non-episodic) return, as RND scales its bonus; the statistics it needs (inputs, returns)
  are updated first, from every rank's data.
* :meth:`IntrinsicReward.value`: the bonus's own critic :math:`V_I(s)`, the value of the
  intrinsic stream, non-episodic (episode ends do not cut it) with its own discount
  :math:`\gamma_I`, as RND-PPO's intrinsic value head;
* :attr:`IntrinsicReward.loss`: a loss module returning ``loss_*`` terms (the bonus's own,
  and ``loss_intrinsic_value``, the critic's regression to its GAE target) whose gradients
  reach only the bonus's parameters, trained by a :class:`~rlkit.training.update.LossGroup`
  of its own optimiser, in lockstep with the policy's minibatches.

Two families:

* :class:`RNDReward` -- novelty: Random Network Distillation (Burda et al. 2018), the
  predictor's error at :math:`s'` (:class:`~rlkit.objectives.rnd.RND`).
* :class:`ICM` -- curiosity: the Intrinsic Curiosity Module (Pathak et al. 2017), the error
  of a forward model that predicts the features of :math:`s'` from those of :math:`s` and
  the action, in a feature space learned by an inverse model (which action led from
  :math:`s` to :math:`s'`).

A policy-gradient learner combines the two streams' advantages, as RND-PPO does
(:meth:`rlkit.algorithms.onpolicy.PolicyGradientLearner.attach_intrinsic`): its own
estimator and critic see the extrinsic reward only, the bonus's critic and a non-episodic
GAE give :math:`A^I`, and the loss reads :math:`A = c_E A^E + c_I A^I` (``--ext-coef``,
``--int-coef``; ``--pretraining``: :math:`c_I A^I` alone, the extrinsic return still logged
and its critic still trained). :func:`make_intrinsic` builds one from an env's specs, what
``--intrinsic NAME`` does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tensordict import NestedKey, TensorDict, TensorDictBase
from torch import Tensor, nn

from rlkit import keys
from rlkit.modules.networks import IMAGE_ENCODERS, mlp
from rlkit.modules.normalization import RunningMeanStd
from rlkit.objectives.common import LossBase, require_keys
from rlkit.objectives.rnd import (
    RND,
    ReturnScaler,
    RNDPredictorLoss,
    encoded_mlp,
    normalized_flat,
)

__all__ = [
    "ICM",
    "INTRINSIC_REWARDS",
    "ICMLoss",
    "IntrinsicReward",
    "IntrinsicLoss",
    "RNDReward",
    "make_intrinsic",
]

LOSS_ICM_INVERSE = "loss_icm_inverse"
LOSS_ICM_FORWARD = "loss_icm_forward"
LOSS_INTRINSIC_VALUE = "loss_intrinsic_value"
_COLLECTOR = "the collector writes it"

#: the names ``--intrinsic`` accepts (besides ``none``)
INTRINSIC_REWARDS = ("rnd", "icm")


class IntrinsicReward(nn.Module):
    """Base class of an intrinsic reward: :meth:`intrinsic_reward` and :attr:`loss`.

    Subclasses implement :meth:`raw_bonus` (``[N, T]``, no gradient), :meth:`observe`
    (merge a batch into input statistics), :meth:`normalize` (observations as the networks'
    input), :attr:`return_scaler` and ``bonus_loss`` (the bonus's own ``loss_*`` terms), and
    call :meth:`_build_critic`; the scaling by the discounted return's spread
    (:class:`~rlkit.objectives.rnd.ReturnScaler`, non-episodic), the intrinsic critic and
    :attr:`loss` are shared.
    """

    name = "intrinsic"
    #: the bonus's own loss terms (a loss module; not a submodule: it refers to this one)
    bonus_loss: nn.Module
    #: ``bonus_loss`` plus the intrinsic critic's regression (:class:`IntrinsicLoss`)
    loss: nn.Module

    def _build_critic(
        self,
        width: int,
        *,
        value_coef: float,
        hidden: Sequence[int],
        obs_shape: Sequence[int] | None = None,
        encoder: str = "mlp",
        encoder_dim: int | None = None,
    ) -> None:
        """The intrinsic critic ``V_I``: an MLP (tanh) from the normalised observation; with
        an image ``encoder`` (``obs_shape`` the image's), its own encoder first."""
        if encoder == "mlp":
            self.critic = mlp(width, 1, hidden=tuple(hidden), activation="tanh")
        else:
            self.critic = encoded_mlp(
                torch.Size(obs_shape),
                1,
                hidden=tuple(hidden),
                activation="tanh",
                encoder=encoder,
                encoder_dim=encoder_dim,
            )
        self.__dict__["loss"] = IntrinsicLoss(self, value_coef=value_coef)

    def normalize(self, obs: Tensor) -> Tensor:
        """Observations ``[*, *O]`` as the networks' input ``[*, numel(O)]``."""
        raise NotImplementedError

    def value(self, obs: Tensor) -> Tensor:
        """:math:`V_I(s)` of observations ``[*, *O]``, ``[*, 1]``."""
        return self.critic(self.normalize(obs))

    @property
    def return_scaler(self) -> ReturnScaler:
        """The non-episodic :class:`~rlkit.objectives.rnd.ReturnScaler` of the bonus."""
        raise NotImplementedError

    @property
    def num_envs(self) -> int:
        return self.return_scaler.num_envs

    def resize(self, num_envs: int) -> None:
        """Batches of ``num_envs`` envs from now on, their discounted returns from zero: a
        population member is built on the env of every member's rows and trains on its own
        (:meth:`rlkit.training.learner.Learner.use_rows`)."""
        self.return_scaler.resize(num_envs)

    def observe(self, next_obs: Tensor) -> None:
        """Merge a batch's next observations (every rank's) into the input statistics
        (nothing by default)."""

    def raw_bonus(self, obs: Tensor, action: Tensor, next_obs: Tensor) -> Tensor:
        """The unscaled bonus of every step, ``[N, T]``."""
        raise NotImplementedError

    @torch.no_grad()
    def intrinsic_reward(
        self,
        obs: Tensor,
        action: Tensor,
        next_obs: Tensor,
        *,
        update_stats: bool = True,
        all_gather: Callable[[Tensor], Tensor] | None = None,
    ) -> Tensor:
        r"""The intrinsic reward ``[N, T, 1]`` of an ``[N, T]`` batch (envs first).

        With ``update_stats`` (training): the next observations enter the statistics (every
        rank's, via ``all_gather``), then the raw bonus :math:`e_t` is computed, each env's
        discounted return :math:`R_t = \gamma_I R_{t-1} + e_t` advances and enters the
        return statistics, and :math:`r^I_t = e_t / \sigma(R)`."""
        if obs.dim() < 2 or obs.shape[0] != self.num_envs:
            raise ValueError(
                f"{type(self).__name__}: observations of shape {list(obs.shape)} must be "
                f"[N, T, ...] with N = num_envs = {self.num_envs} (envs first, time second)"
            )
        if update_stats:
            self.observe(next_obs if all_gather is None else all_gather(next_obs))
        raw = self.raw_bonus(obs, action, next_obs)
        scaled = self.return_scaler(raw, update_stats=update_stats, all_gather=all_gather)
        return scaled.unsqueeze(-1)


# --------------------------------------------------------------------------- RND
class RNDReward(IntrinsicReward):
    """RND (:class:`~rlkit.objectives.rnd.RND`) as an :class:`IntrinsicReward`: the bonus of a
    step is the predictor's error at :math:`s'`; :attr:`loss` is
    :class:`~rlkit.objectives.rnd.RNDPredictorLoss` (``loss_predictor``). Keyword arguments
    go to :class:`~rlkit.objectives.rnd.RND`."""

    name = "rnd"

    def __init__(
        self,
        obs_shape: Sequence[int] | int,
        *,
        num_envs: int,
        value_coef: float = 0.5,
        critic_hidden: Sequence[int] = (64, 64),
        **kwargs,
    ) -> None:
        super().__init__()
        self.rnd = RND(obs_shape, num_envs=num_envs, **kwargs)
        self.__dict__["bonus_loss"] = RNDPredictorLoss(self.rnd)
        self._build_critic(
            int(self.rnd.obs_shape.numel()),
            value_coef=value_coef,
            hidden=critic_hidden,
            obs_shape=self.rnd.obs_shape,
            encoder=self.rnd.encoder,
            encoder_dim=kwargs.get("encoder_dim"),
        )

    def normalize(self, obs: Tensor) -> Tensor:
        return self.rnd.normalize(obs)

    @property
    def return_scaler(self) -> ReturnScaler:
        return self.rnd.return_scaler

    def resize(self, num_envs: int) -> None:
        self.rnd.resize(num_envs)

    def observe(self, next_obs: Tensor) -> None:
        self.rnd.obs_stats.update(next_obs)

    def raw_bonus(self, obs: Tensor, action: Tensor, next_obs: Tensor) -> Tensor:
        return self.rnd.prediction_error(next_obs)


# --------------------------------------------------------------------------- ICM
class ICM(IntrinsicReward):
    r"""The Intrinsic Curiosity Module (Pathak, Agrawal, Efros, Darrell 2017).

    Observations are standardised with running statistics and clipped (as RND's),
    :math:`x = \mathrm{clip}((s - \mu)/\sigma, -c, c)`, and encoded, :math:`\phi(x)`. An
    inverse model :math:`g(\phi(x), \phi(x'))` predicts the action (logits over the actions
    for a discrete space, the action itself for a continuous one); a forward model
    :math:`f(\phi(x), a)` predicts :math:`\phi(x')` (a discrete action enters one-hot). The
    raw bonus of a step is the forward model's error,

    .. math:: e_t = \tfrac12 \lVert f(\phi(x_t), a_t) - \phi(x'_t) \rVert_2^2 ,

    scaled by the running std of its discounted return (:class:`IntrinsicReward`; the
    paper's :math:`\eta` is a constant factor this cancels). The loss is

    .. math:: (1 - \beta) L_I + \beta L_F,\quad
        L_F = \tfrac12 \lVert f(\mathrm{sg}[\phi(x)], a) - \mathrm{sg}[\phi(x')] \rVert^2,

    with :math:`L_I` the cross-entropy (discrete) or squared error (continuous) of the
    inverse model, both averaged over the minibatch; :math:`\beta` = ``beta`` (0.2 in the
    paper).

    Deviation from the paper: the forward loss does not train the encoder (``sg`` above),
    so the features are those the inverse model needs, and the forward loss cannot shrink
    them towards a trivial prediction; the paper's code lets both losses reach it.

    Args:
        obs_shape: the observation shape (flattened into the networks' input).
        num_envs: envs of a batch (rows of :meth:`intrinsic_reward`'s inputs).
        action_dim: the number of actions (``discrete``) or the action's width.
        discrete: whether actions are categorical (index or one-hot).
        feature_dim, hidden, activation: the encoder's output width, and every network's
            hidden widths and activation.
        beta: the forward loss's weight in (0, 1).
        obs_clip: :math:`c > 0`.
        gamma_int: the discount of the return that scales the bonus.
    """

    name = "icm"

    def __init__(
        self,
        obs_shape: Sequence[int] | int,
        *,
        num_envs: int,
        action_dim: int,
        discrete: bool,
        feature_dim: int = 64,
        hidden: Sequence[int] = (64, 64),
        activation: str = "relu",
        beta: float = 0.2,
        obs_clip: float = 5.0,
        gamma_int: float = 0.99,
        value_coef: float = 0.5,
    ) -> None:
        super().__init__()
        if not 0 < beta < 1:
            raise ValueError(f"ICM: beta must be in (0, 1), got {beta!r}")
        if not (obs_clip > 0 and math.isfinite(obs_clip)):
            raise ValueError(f"ICM: obs_clip must be a finite number > 0, got {obs_clip!r}")
        if isinstance(action_dim, bool) or not isinstance(action_dim, int) or action_dim < 1:
            raise ValueError(f"ICM: action_dim must be an int >= 1, got {action_dim!r}")
        self.obs_shape = torch.Size([obs_shape] if isinstance(obs_shape, int) else obs_shape)
        self.action_dim, self.discrete = action_dim, bool(discrete)
        self.beta, self.obs_clip, self.feature_dim = float(beta), float(obs_clip), feature_dim
        width = int(self.obs_shape.numel())
        net = dict(hidden=tuple(hidden), activation=activation)
        self.encoder = mlp(width, feature_dim, **net)
        self.inverse = mlp(2 * feature_dim, action_dim, **net)
        self.forward_model = mlp(feature_dim + action_dim, feature_dim, **net)
        self.obs_stats = RunningMeanStd(self.obs_shape)
        self.scaler = ReturnScaler(num_envs=num_envs, gamma=gamma_int, episodic=False)
        self.__dict__["bonus_loss"] = ICMLoss(self)
        self._build_critic(width, value_coef=value_coef, hidden=hidden)

    @property
    def return_scaler(self) -> ReturnScaler:
        return self.scaler

    def extra_repr(self) -> str:
        kind = "discrete" if self.discrete else "continuous"
        return (
            f"obs_shape={tuple(self.obs_shape)}, num_envs={self.num_envs}, "
            f"actions={self.action_dim} ({kind}), beta={self.beta}"
        )

    # ----------------------------------------------------------------- pieces
    def normalize(self, obs: Tensor) -> Tensor:
        """``clip((obs - mean) / std, -obs_clip, obs_clip)``, flattened to ``[*, numel(O)]``."""
        return normalized_flat(obs, self.obs_stats, self.obs_shape, self.obs_clip, owner="ICM")

    def features(self, obs: Tensor) -> Tensor:
        r""":math:`\phi(x)` of observations ``[*, *O]``, ``[*, feature_dim]``."""
        return self.encoder(self.normalize(obs))

    def encode_action(self, action: Tensor, lead: torch.Size) -> Tensor:
        """Actions as the forward model's input ``[*lead, action_dim]`` (one-hot if discrete)."""
        if not self.discrete:
            return action.reshape(*lead, self.action_dim).float()
        if action.is_floating_point() and action.shape[-1:] == (self.action_dim,):
            return action.reshape(*lead, self.action_dim)  # one-hot already
        index = action.reshape(lead).long()
        return F.one_hot(index, self.action_dim).float()

    def action_index(self, action: Tensor, lead: torch.Size) -> Tensor:
        """Discrete actions as indices ``[*lead]``."""
        if action.is_floating_point() and action.shape[-1:] == (self.action_dim,):
            return action.reshape(*lead, self.action_dim).argmax(-1)
        return action.reshape(lead).long()

    def forward_error(self, phi: Tensor, action: Tensor, phi_next: Tensor) -> Tensor:
        r""":math:`\tfrac12 \lVert f(\phi, a) - \phi' \rVert^2` per sample."""
        lead = phi.shape[:-1]
        pred = self.forward_model(torch.cat([phi, self.encode_action(action, lead)], -1))
        return 0.5 * (pred - phi_next).square().sum(-1)

    # ----------------------------------------------------------------- IntrinsicReward
    def observe(self, next_obs: Tensor) -> None:
        self.obs_stats.update(next_obs)

    def raw_bonus(self, obs: Tensor, action: Tensor, next_obs: Tensor) -> Tensor:
        return self.forward_error(self.features(obs), action, self.features(next_obs))


class ICMLoss(LossBase):
    r"""ICM's loss, :math:`(1-\beta) L_I + \beta L_F` (:class:`ICM`), as two terms:
    ``loss_icm_inverse`` (trains the encoder and the inverse model) and ``loss_icm_forward``
    (the forward model only). Reads ``observation``, ``action`` and ``("next",
    "observation")`` of a minibatch (renamable with ``set_keys``)."""

    @dataclass
    class _AcceptedKeys:
        """Input keys, renamable with ``loss.set_keys(name=key)``."""

        observation: NestedKey = keys.OBSERVATION
        action: NestedKey = keys.ACTION
        next_observation: NestedKey = keys.NEXT_OBSERVATION

    def __init__(self, icm: ICM) -> None:
        super().__init__()
        self.__dict__["icm"] = icm  # not a submodule: the ICM holds this loss

    @property
    def in_keys(self) -> list[NestedKey]:
        k = self.tensor_keys
        return [k.observation, k.action, k.next_observation]

    @property
    def out_keys(self) -> list[str]:
        return [LOSS_ICM_INVERSE, LOSS_ICM_FORWARD]

    def make_value_estimator(self, value_type: object = None, **hyperparams: object) -> None:
        raise NotImplementedError("ICMLoss has no value estimator")

    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        require_keys(tensordict, dict.fromkeys(self.in_keys, _COLLECTOR), owner="ICMLoss")
        icm, k = self.icm, self.tensor_keys
        obs, action = tensordict.get(k.observation), tensordict.get(k.action)
        phi, phi_next = icm.features(obs), icm.features(tensordict.get(k.next_observation))
        lead = phi.shape[:-1]
        pred = icm.inverse(torch.cat([phi, phi_next], -1))
        if icm.discrete:
            inverse = F.cross_entropy(pred.reshape(-1, icm.action_dim),
                                      icm.action_index(action, lead).reshape(-1))  # fmt: skip
        else:
            inverse = (pred - icm.encode_action(action, lead)).square().sum(-1).mean()
        forward = icm.forward_error(phi.detach(), action, phi_next.detach()).mean()
        out = {
            LOSS_ICM_INVERSE: (1 - icm.beta) * inverse,
            LOSS_ICM_FORWARD: icm.beta * forward,
        }
        return TensorDict(out, batch_size=[])


# --------------------------------------------------------------------------- the loss
class IntrinsicLoss(LossBase):
    r"""An intrinsic reward's loss: its bonus's own terms (``bonus_loss``, e.g.
    ``loss_predictor``) and the intrinsic critic's regression to the non-episodic GAE target
    the learner wrote,

    .. math:: \text{loss\_intrinsic\_value} = c_V \cdot \tfrac12\,
        \overline{(V_I(s) - \hat V_I)^2} .

    Reads ``observation`` and ``intrinsic_value_target`` besides the bonus's keys."""

    @dataclass
    class _AcceptedKeys:
        """Input keys, renamable with ``loss.set_keys(name=key)``."""

        observation: NestedKey = keys.OBSERVATION
        intrinsic_value_target: NestedKey = keys.INTRINSIC_VALUE_TARGET

    def __init__(self, bonus: IntrinsicReward, *, value_coef: float = 0.5) -> None:
        super().__init__()
        if not (value_coef >= 0 and math.isfinite(value_coef)):
            raise ValueError(f"IntrinsicLoss: value_coef must be >= 0, got {value_coef!r}")
        self.__dict__["bonus"] = bonus  # not a submodule: the bonus holds this loss
        self.value_coef = float(value_coef)

    @property
    def generator(self) -> torch.Generator | None:
        """The bonus loss's random generator (RND's predictor mask), if it has one."""
        return getattr(self.bonus.bonus_loss, "generator", None)

    @generator.setter
    def generator(self, value: torch.Generator | None) -> None:
        if hasattr(self.bonus.bonus_loss, "generator"):
            self.bonus.bonus_loss.generator = value

    @property
    def in_keys(self) -> list[NestedKey]:
        k = self.tensor_keys
        return list(dict.fromkeys([*self.bonus.bonus_loss.in_keys, k.observation,
                                   k.intrinsic_value_target]))  # fmt: skip

    @property
    def out_keys(self) -> list[str]:
        return [*self.bonus.bonus_loss.out_keys, LOSS_INTRINSIC_VALUE]

    def make_value_estimator(self, value_type: object = None, **hyperparams: object) -> None:
        raise NotImplementedError("IntrinsicLoss: the learner computes the intrinsic GAE")

    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        k = self.tensor_keys
        require_keys(
            tensordict,
            {k.observation: _COLLECTOR,
             k.intrinsic_value_target: "the learner writes it (the intrinsic stream's GAE)"},
            owner="IntrinsicLoss",
        )  # fmt: skip
        out = dict(self.bonus.bonus_loss(tensordict).items())
        value = self.bonus.value(tensordict.get(k.observation))
        target = tensordict.get(k.intrinsic_value_target).reshape(value.shape)
        out[LOSS_INTRINSIC_VALUE] = self.value_coef * 0.5 * (value - target).square().mean()
        return TensorDict(out, batch_size=[])


# --------------------------------------------------------------------------- builder
def _spaces(env, name: str = "icm") -> tuple[torch.Size, int, bool]:
    """Observation shape, action size and whether actions are discrete, from env specs
    (RND reads no action: ``(shape, 0, False)``, whatever the action space)."""
    from torchrl.data import Categorical, OneHot

    batch = len(env.batch_size)
    obs_shape = env.observation_spec[keys.OBSERVATION].shape[batch:]
    if name == "rnd":
        return obs_shape, 0, False
    from rlkit.modules.composite import refuse_structured

    refuse_structured(env, "icm (its inverse and forward models take Discrete or Box actions)")
    spec = env.action_spec
    if isinstance(spec, Categorical):
        return obs_shape, int(spec.space.n), True
    if isinstance(spec, OneHot):
        return obs_shape, int(spec.shape[-1]), True
    shape = spec.shape[batch:]
    if len(shape) != 1:
        raise ValueError(
            f"intrinsic rewards need a flat action vector, got action shape {list(shape)}"
        )
    return obs_shape, int(shape[0]), False


def make_intrinsic(name: str, env, **kwargs) -> IntrinsicReward:
    """The intrinsic reward ``name`` (``rnd`` or ``icm``) for ``env``'s observations and
    actions and its number of envs; ``kwargs`` go to :class:`RNDReward` (and through it to
    :class:`~rlkit.objectives.rnd.RND`) or :class:`ICM`. Defaults: 64 features, two hidden
    layers of 64, ReLU; RND keeps a random quarter of each minibatch for its predictor.
    ``encoder`` (RND only): an image encoder of
    :func:`~rlkit.modules.networks.make_encoder` for its target, predictor and critic."""
    obs_shape, action_dim, discrete = _spaces(env, name)
    encoder = kwargs.get("encoder", "mlp")
    if encoder != "mlp":
        if name != "rnd":
            raise ValueError(
                f"intrinsic reward {name!r} builds MLPs over flat vector observations; "
                f"--encoder {encoder} is for images: use --intrinsic rnd (its networks take "
                "the encoder) or --encoder mlp"
            )
    elif len(obs_shape) != 1:
        raise ValueError(
            f"intrinsic reward {name!r} builds MLPs over flat vector observations, got shape "
            f"{list(obs_shape)}: for images use rnd with an image encoder (--encoder "
            f"{IMAGE_ENCODERS}), else drop it for this env"
        )
    num_envs = int(env.batch_size.numel())
    if name == "rnd":
        return RNDReward(obs_shape, num_envs=num_envs, **{"update_proportion": 0.25, **kwargs})
    if name == "icm":
        return ICM(obs_shape, num_envs=num_envs, action_dim=action_dim, discrete=discrete, **kwargs)
    raise ValueError(
        f"unknown intrinsic reward {name!r}: choose one of {', '.join(INTRINSIC_REWARDS)}"
    )
