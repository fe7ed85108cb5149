"""Every TensorDict key rlkit reads or writes, in one place.

Names follow TorchRL's conventions so rlkit components interoperate with TorchRL's
collectors, losses and transforms. Shapes are written for a collector batch ``[N, T]``
(N environments, T time steps; the time dimension is the last batch dimension and is
named ``"time"`` by TorchRL collectors). ``*`` stands for those batch dimensions, ``O``
for the observation shape, ``A`` for the action shape.

A nested key such as ``("next", "reward")`` lives in the ``"next"`` sub-TensorDict, which
holds what the environment returned after the step.

============================  ==================  ========================================
key                           shape               written by
============================  ==================  ========================================
``OBSERVATION``               ``[*, *O]``         the environment
``ACTION``                    ``[*, *A]``         the actor (int64 ``[*]`` for discrete)
``ACTION_LOG_PROB``           ``[*]``             the actor, log mu(a|s) at collection
``LOGITS``                    ``[*, n]``          categorical actor heads (a masked actor's
                                                  hold the dtype's lowest value where masked)
``ACTION_MASK``               ``[*, n]``          the environment: bool / int8, nonzero where
                                                  the action may be taken (also under
                                                  ``"next"``, for DQN's and SAC's targets)
``LOC`` / ``SCALE``           ``[*, *A]``         Gaussian actor heads
``ACTION_PARAMS``             ``[*, P]``          multi-part actor heads (MultiDiscrete,
                                                  MultiBinary, Dict actions): every part's
                                                  logits / means and log-stds in one tensor
``STATE_VALUE``               ``[*, 1]``          V critics
``ACTION_VALUE``              ``[*, n]``          Q critics (one value per discrete action)
``STATE_ACTION_VALUE``        ``[*, 1]``          Q(s, a) critics for continuous actions
``ADVANTAGE``                 ``[*, 1]``          value estimators (GAE, V-trace)
``VALUE_TARGET``              ``[*, 1]``          value estimators (GAE, V-trace, TD(lambda))
``REWARD``                    ``[*, 1]``          the environment, ``("next", "reward")``
``DONE``                      ``[*, 1]``          terminated or truncated (bool)
``TERMINATED``                ``[*, 1]``          a true terminal state: no bootstrap
``TRUNCATED``                 ``[*, 1]``          a time limit: bootstrap from V(next obs)
``NEXT_OBSERVATION``          ``[*, *O]``         the true observation after the step,
                                                  also at done steps (never the reset one)
``NEXT_STATE_VALUE``          ``[*, 1]``          V critics applied to the next observation
``EPISODE_RETURN``            ``[*, 1]``          ``make_env`` (running undiscounted return)
``IS_INIT``                   ``[*, 1]``          the collector: True at an episode's first
                                                  step (a recurrent state starts at zero)
``POLICY_STATE_H`` / ``_C``   ``[*, L, H]``       recurrent policy cores: the state the step
                                                  started from (``("next", ...)``: after it)
``VALUE_STATE_H`` / ``_C``    ``[*, L, H]``       recurrent V critics, likewise
``STEP_COUNT``                ``[*, 1]``          ``make_env`` (steps in the episode)
============================  ==================  ========================================
"""

from __future__ import annotations

OBSERVATION = "observation"
ACTION = "action"
ACTION_LOG_PROB = "action_log_prob"
LOGITS = "logits"
#: Discrete action masks, ``[*, n]`` bool or int8 (nonzero: the action may be taken): the
#: PettingZoo / gymnasium Dict observation entry ``"action_mask"`` and TorchRL's
#: ``ActionMask`` key. Actors, Q networks and exploration read it when the env writes it
#: (``docs/actions.md``); it is stored with the batch and in the replay, next to
#: ``NEXT_ACTION_MASK``.
ACTION_MASK = "action_mask"
LOC = "loc"
SCALE = "scale"
#: Multi-part actors' parameters ``[*, P]`` (:mod:`rlkit.modules.composite`): the logits of
#: every categorical / Bernoulli part and the means and log-stds of every Normal part, in the
#: action's order (a masked MultiDiscrete's masked logits hold the dtype's lowest value).
ACTION_PARAMS = "action_params"

STATE_VALUE = "state_value"
ACTION_VALUE = "action_value"
STATE_ACTION_VALUE = "state_action_value"

ADVANTAGE = "advantage"
VALUE_TARGET = "value_target"
#: Raw (unclipped) importance ratio pi(a|s) / mu(a|s) at the stored action, ``[*, 1]``,
#: written by ``rlkit.value.VTrace``.
VTRACE_RHO = "vtrace_rho"

#: PPG: the auxiliary value head V_aux(s) on the policy network, ``[*, 1]``.
AUX_STATE_VALUE = "aux_state_value"
#: PPG: sub-TensorDict recorded before the auxiliary phase's first update: the policy's
#: distribution parameters (``(PRE_AUX, "logits")`` or ``(PRE_AUX, "loc")`` /
#: ``(PRE_AUX, "scale")``) and the critic's value ``(PRE_AUX, "state_value")`` ``[*, 1]``.
PRE_AUX = "pre_aux"

#: APPO: log pi_target(a|s) of the target network at the stored action, ``[*]``, recorded
#: once per batch (the target is fixed during a batch's epochs) by
#: ``APPOLoss.record_target_log_prob``.
TARGET_LOG_PROB = "target_log_prob"
#: Worker collectors: the learner's weights version that collected each step, ``[*]`` int64,
#: and the lag (learner version when the batch was used minus that version), ``[*]`` int64.
POLICY_VERSION = ("collector", "policy_version")
POLICY_LAG = ("collector", "policy_lag")
#: Worker collectors: the index of the env that collected each row within the rank,
#: ``[N, T]`` int64 (worker ``i``'s row ``j`` is env ``i * envs_per_worker + j``); the
#: learner's reward normaliser (``rlkit.modules.BatchRewardNorm``) keys its returns by it.
ENV_ID = ("collector", "env_id")

#: Replay: discount of the bootstrap term, gamma^m for an m-step transition, ``[*, 1]``
#: (``rlkit.objectives.dqn.nstep_transitions`` writes it).
BOOTSTRAP_DISCOUNT = "bootstrap_discount"
#: Replay: importance-sampling weight of a prioritized sample, ``[*]`` (TorchRL's
#: ``PrioritizedSampler`` writes it under this name).
PRIORITY_WEIGHT = "priority_weight"

#: RND: intrinsic reward r_int = ||f_hat(s') - f(s')||^2 (scaled), ``("next", "intrinsic_reward")``
#: ``[*, 1]``; the intrinsic value head V_int(s) ``[*, 1]``; the intrinsic stream's GAE advantage
#: and value target ``[*, 1]`` (the extrinsic stream keeps ``ADVANTAGE`` / ``VALUE_TARGET``).
INTRINSIC_REWARD = ("next", "intrinsic_reward")
INTRINSIC_STATE_VALUE = "intrinsic_state_value"
INTRINSIC_ADVANTAGE = "intrinsic_advantage"
INTRINSIC_VALUE_TARGET = "intrinsic_value_target"
#: DAAC: the policy network's advantage head A_hat(s, a) at the stored action, ``[*, 1]``.
ADVANTAGE_PRED = "advantage_pred"
#: DAAC: the advantage standardised once over the whole batch (``--advantage-norm batch``),
#: the target of the advantage head and the surrogate's weight, ``[*, 1]``.
NORMALIZED_ADVANTAGE = "normalized_advantage"
#: SVPG: the index of the policy particle that acted, ``[*]`` int64.
PARTICLE = "particle"
NEXT = "next"
REWARD = (NEXT, "reward")
DONE = (NEXT, "done")
TERMINATED = (NEXT, "terminated")
TRUNCATED = (NEXT, "truncated")
NEXT_OBSERVATION = (NEXT, OBSERVATION)
NEXT_ACTION_MASK = (NEXT, ACTION_MASK)
NEXT_STATE_VALUE = (NEXT, STATE_VALUE)
NEXT_INTRINSIC_STATE_VALUE = (NEXT, INTRINSIC_STATE_VALUE)

#: Running (undiscounted) episode return, written by ``make_env`` through TorchRL's
#: ``RewardSum``; at a done step ``("next", EPISODE_RETURN_NAME)`` is the episode's return.
EPISODE_RETURN_NAME = "episode_reward"
EPISODE_RETURN = (NEXT, EPISODE_RETURN_NAME)
STEP_COUNT_NAME = "step_count"
STEP_COUNT = (NEXT, STEP_COUNT_NAME)

#: Recurrent memory (``docs/memory.md``). ``IS_INIT`` ``[*, 1]`` bool is True at the first
#: step of an episode, where a recurrent core starts from a zero state (TorchRL's
#: ``InitTracker`` name). A core's state ``[*, num_layers, hidden]`` at the root is the state
#: the step started from; the core writes the state after the step under ``("next", ...)``,
#: which the collector carries to the next step (TorchRL's ``LSTMModule`` convention).
#: ``*_H`` is the hidden state (an LSTM's h, a GRU's only state), ``*_C`` an LSTM's cell.
IS_INIT = "is_init"
POLICY_STATE_H = "policy_state_h"
POLICY_STATE_C = "policy_state_c"
VALUE_STATE_H = "value_state_h"
VALUE_STATE_C = "value_state_c"
#: The features a recurrent core hands to its heads, ``[*, hidden]``.
POLICY_MEMORY = "policy_memory"
VALUE_MEMORY = "value_memory"

#: Name TorchRL collectors give the time dimension of a batch.
TIME_DIM_NAME = "time"


def describe(key: str | tuple[str, ...]) -> str:
    """Return a key as users write it: ``"advantage"`` or ``("next", "reward")``."""
    return repr(key) if isinstance(key, str) else "(" + ", ".join(repr(k) for k in key) + ")"


# ---------------------------------------------------------------------------------------
# Errors and key renaming shared by losses and estimators
# ---------------------------------------------------------------------------------------
class MissingKeyError(KeyError):
    """A required key is absent; the message names it, the component, and the fix.

    Raised by losses and value estimators (also importable as
    ``rlkit.objectives.MissingKeyError``). It is a ``KeyError``, so code catching TorchRL's
    missing-key errors catches it too. The last line of the message is the one that matters:
    the missing key and what writes it.
    """

    def __str__(self) -> str:  # KeyError would print the message inside quotes
        return str(self.args[0])


def under_next(key: str | tuple[str, ...]) -> tuple[str, ...]:
    """The key of an environment output after the step, as TorchRL's ``set_keys`` reads
    ``reward`` / ``done`` / ``terminated``: ``"r"`` -> ``("next", "r")``; a key that already
    starts with ``"next"`` is kept.

    Example:
        >>> under_next("reward"), under_next(("next", "done")), under_next(("agent", "r"))
        (('next', 'reward'), ('next', 'done'), ('next', 'agent', 'r'))
    """
    key = (key,) if isinstance(key, str) else tuple(key)
    return key if key[0] == NEXT else (NEXT, *key)


#: How many present keys a missing-key message lists before "and N more".
_PRESENT_SHOWN = 8


def describe_present(present) -> str:
    """A short list of present keys for an error message: the first few, then a count."""
    names = sorted(describe(k) for k in present)
    if not names:
        return "none"
    shown = ", ".join(names[:_PRESENT_SHOWN])
    more = len(names) - _PRESENT_SHOWN
    return f"{shown} and {more} more" if more > 0 else shown


#: TorchRL's ``set_keys`` names -> rlkit's, for the same key. ``loss.set_keys`` and
#: ``estimator.set_keys`` accept either (the table in ``docs/torchrl.md``).
TORCHRL_KEY_ALIASES: dict[str, str] = {
    "sample_log_prob": "action_log_prob",
    "log_prob": "action_log_prob",
    "value": "state_value",
}

#: Names TorchRL's losses accept for their value estimator's inputs; an rlkit loss that
#: does not read them points the user at the estimator instead.
_ESTIMATOR_NAMES = ("reward", "done", "terminated", "steps_to_next_obs")


def resolve_key_names(owner: str, accepted, names: dict, *, reads_env_keys: bool = True) -> dict:
    """Translate ``set_keys(**names)`` to the names in ``accepted`` (TorchRL aliases allowed).

    Raises a one-line ``ValueError`` for a name that is neither accepted nor an alias of an
    accepted name, and for two names of the same key. ``reads_env_keys=False`` (a loss that
    reads no reward or done flags) adds a pointer to the value estimator for those names.

    Example:
        >>> resolve_key_names("PPOLoss", ["action_log_prob", "state_value"],
        ...                   {"sample_log_prob": "lp", "value": "v"})
        {'action_log_prob': 'lp', 'state_value': 'v'}
    """
    accepted = list(accepted)
    out: dict = {}
    given: dict[str, str] = {}
    for name, key in names.items():
        target = name if name in accepted else TORCHRL_KEY_ALIASES.get(name)
        if target not in accepted:
            raise ValueError(_unknown_name(owner, name, accepted, reads_env_keys))
        if target in given:
            raise ValueError(
                f"{owner}.set_keys: {given[target]!r} and {name!r} name the same key "
                f"({target!r}); pass one of them"
            )
        given[target] = name
        out[target] = key
    return out


def _unknown_name(owner: str, name: str, accepted: list[str], reads_env_keys: bool) -> str:
    def shown(n: str) -> str:
        alias = [a for a, t in TORCHRL_KEY_ALIASES.items() if t == n]
        return f"{n} (or {', '.join(alias)})" if alias else n

    listed = ", ".join(shown(n) for n in accepted)
    hint = ""
    if name in _ESTIMATOR_NAMES and not reads_env_keys:
        hint = f"; {owner} does not read it: rename it on the value estimator (estimator.set_keys)"
    return f"{owner}.set_keys: unknown key name {name!r}{hint}; accepted: {listed}."
