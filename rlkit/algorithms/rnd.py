"""RND-PPO (Burda et al. 2018): PPO with the RND intrinsic reward, what ``recipes/rnd.py``
runs: ``recipes/ppo.py --intrinsic rnd`` with the paper's weights and RND's own flags.

The config (:class:`RNDConfig`), its presets and the algorithm box that ``--help`` shows live
in the torch-free :mod:`rlkit.configs.rnd`.

Per collected batch ``[N, T]`` (Burda et al. 2018, Algorithm 1), through the shared
policy-gradient learner (:meth:`~rlkit.algorithms.onpolicy.PolicyGradientLearner.
attach_intrinsic`)::

    GAE on the extrinsic reward with PPO's critic: A_ext, V_ext target (episodic, gamma)
    merge the batch's next observations into RND's observation statistics (all ranks)
    r_int = ||f_hat(s') - f(s')||^2 / std(discounted intrinsic return)
    non-episodic GAE on r_int with the intrinsic critic: A_int, V_int target (gamma_int)
    for epoch in 1..epochs, for each minibatch (update_loop, two loss groups in lockstep):
        "policy":    PPO clipped surrogate on ext_coef * A_ext + int_coef * A_int
                     + value_coef * V_ext regression + entropy              -> optimizer
        "intrinsic": predictor MSE on s' of a random update_proportion of the
                     minibatch + value_coef * V_int regression          -> intrinsic opt.

The paper's critic is one network with two heads; here the intrinsic value is a network of
its own, trained with the predictor (its gradient never enters the policy's clipping norm).

Multi-device: gradients of both optimisers are all-reduced by ``Context.step_optimizer``; the
observation and return statistics are merged from ``Context.all_gather``-ed data, so every
rank holds the same statistics and the same parameters.
"""

from __future__ import annotations

from functools import partial

from rlkit.algorithms._parts import gae_part, make_part
from rlkit.algorithms.onpolicy import (
    PolicyGradientLearner,
    build_actor_critic,
    intrinsic_optimizer,
    policy_gradient_settings,
    policy_optimizer,
)
from rlkit.configs import rnd as _config
from rlkit.configs.rnd import PRESETS, RNDConfig
from rlkit.modules.dictobs import PackedObsView, obs_entries, resolve_obs_keys
from rlkit.objectives import PPOLoss
from rlkit.objectives.intrinsic import RNDReward, make_intrinsic
from rlkit.training import parse_config, run
from rlkit.value import GAE

__all__ = ["PRESETS", "RNDConfig", "build", "build_bonus", "main", "train"]


# 2-3. networks and the bonus ----------------------------------------------------------------
def build_bonus(cfg: RNDConfig, env) -> RNDReward:
    """The RND intrinsic reward (:func:`~rlkit.objectives.intrinsic.make_intrinsic`) with a
    config's flags, one intrinsic return per env of ``env``; its critic is sized as the
    recipe's (``--critic-hidden``, else ``--hidden``). With an image ``--encoder`` the
    target, the predictor and the intrinsic critic each get their own (``--feature-dim``)."""
    image = {}
    entries = resolve_obs_keys(env, cfg.obs_keys)
    if entries is not None:  # a Dict observation: the chosen entries as one flat vector
        env = PackedObsView(env, obs_entries(env, entries))
    elif cfg.encoder != "mlp":
        image = dict(encoder=cfg.encoder, encoder_dim=cfg.feature_dim)
    return make_intrinsic(
        "rnd",
        env,
        feature_dim=cfg.rnd_features,
        target_hidden=tuple(cfg.rnd_hidden),
        predictor_hidden=tuple(cfg.rnd_hidden),
        activation=cfg.rnd_activation,
        obs_clip=cfg.rnd_obs_clip,
        gamma_int=cfg.gamma_int,
        update_proportion=cfg.update_proportion,
        value_coef=cfg.value_coef,
        critic_hidden=tuple(cfg.critic_layers or cfg.hidden),
        **image,
    )


# 4-6. estimator, loss, learner --------------------------------------------------------------
def build(cfg: RNDConfig, env, *, loss_cls=None, estimator_cls=None) -> PolicyGradientLearner:
    """PPO's learner (actor, critic, GAE, clipped loss) with :func:`build_bonus` attached at
    ``--ext-coef`` / ``--int-coef`` (``--int-coef 0``: the same agent, its bonus trained but
    not learned from; ``--ext-coef 0``: exploration alone) and ``--predictor-lr``.

    ``loss_cls`` (default :class:`~rlkit.objectives.PPOLoss`) and ``estimator_cls`` (the
    extrinsic estimator; default :class:`~rlkit.value.GAE`): a subclass (or
    ``functools.partial`` of one) built in their place with exactly the recipe's arguments,
    ``loss_cls(actor, critic, clip_epsilon=, entropy_coef=, value_coef=, value_clip_epsilon=,
    normalize_advantage=)`` and ``estimator_cls(gamma=, lmbda=, value_network=critic)``; the
    bonus and everything else are built as the recipe builds them."""
    actor, critic, obs_norm = build_actor_critic(cfg, env)
    estimator = gae_part(estimator_cls, GAE, cfg, critic, where="rnd.build")
    loss = make_part(
        loss_cls,
        PPOLoss,
        actor,
        critic,
        clip_epsilon=cfg.clip_epsilon,
        entropy_coef=cfg.entropy_coef,
        value_coef=cfg.value_coef,
        value_clip_epsilon=cfg.value_clip,
        normalize_advantage=cfg.normalize_advantage,
        where="rnd.build",
    )
    learner = PolicyGradientLearner(
        algo="rnd",
        actor=actor,
        critic=critic,
        estimator=estimator,
        loss=loss,
        optimizer=policy_optimizer(cfg, actor, critic, obs_norm),
        obs_norm=obs_norm,
        **policy_gradient_settings(cfg, cfg.loss_schedules),
    )
    bonus = build_bonus(cfg, env)
    entries = resolve_obs_keys(env, cfg.obs_keys)
    if entries is not None:
        learner.intrinsic_entries = obs_entries(env, entries)
    learner.attach_intrinsic(
        bonus,
        int_coef=cfg.int_coef,
        ext_coef=cfg.ext_coef,
        optimizer=intrinsic_optimizer(cfg, bonus, lr=cfg.predictor_lr),
        lmbda=cfg.gae_lambda,
    )
    return learner


# 7. fit -------------------------------------------------------------------------------------
def train(cfg: RNDConfig, *, env=None, loss_cls=None, estimator_cls=None) -> dict:
    """Train RND-PPO under a parsed ``cfg`` (what ``recipes/rnd.py`` runs after its
    flags); returns the run summary. ``loss_cls``, ``estimator_cls``: as for :func:`build`."""
    build_parts = partial(build, loss_cls=loss_cls, estimator_cls=estimator_cls)
    return run(cfg, build_parts, algo="rnd", env=env)


def main(argv: list[str] | None = None) -> dict:
    """``recipes/rnd.py`` from Python: parse ``argv`` (default: the command line), then
    :func:`train`."""
    cfg = parse_config(RNDConfig, argv, presets=PRESETS, description=_config.__doc__)
    return train(cfg)
