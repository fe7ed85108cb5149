"""rlkit's parts in a TorchRL user's code: action-spec checks, set_keys in TorchRL's names,
renamable estimators, extension points, missing-key messages (issue 22)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torchrl.envs import GymEnv
from torchrl.modules import ProbabilisticActor

from rlkit import keys
from rlkit.keys import MissingKeyError
from rlkit.modules import (
    ActionSpecMismatchError,
    categorical_actor,
    check_env_compat,
    gaussian_actor,
    make_actor,
    value_critic,
)
from rlkit.objectives import A2CLoss, IMPALALoss, PPOLoss, total_loss
from rlkit.value import GAE, TDLambda, VTrace

OBS, N_ACT, N, T = 4, 2, 3, 9


@pytest.fixture(scope="module")
def one_hot_env():
    env = GymEnv("CartPole-v1")  # TorchRL's default: a OneHot(2) action spec
    yield env
    env.close()


@pytest.fixture(scope="module")
def index_env():
    env = GymEnv("CartPole-v1", categorical_action_encoding=True)
    yield env
    env.close()


@pytest.fixture(scope="module")
def pendulum():
    env = GymEnv("Pendulum-v1")  # Bounded [-2, 2], 1-dim
    yield env
    env.close()


# --------------------------------------------------------------------------- action specs
def test_an_index_actor_on_a_one_hot_env_is_refused_naming_both_sides_and_the_fix(one_hot_env):
    """docs/modules.md's categorical_actor(4, 2) on a default GymEnv("CartPole-v1") ran and
    never learned: TorchRL read every index action as the one-hot vector of action 0."""
    with pytest.raises(ActionSpecMismatchError) as info:
        check_env_compat(categorical_actor(OBS, N_ACT), one_hot_env)
    message = str(info.value)
    assert "\n" not in message
    assert "index actions" in message and "OneHot(n=2)" in message  # both sides
    assert "make_actor(env.observation_spec, env.action_spec)" in message  # the fix
    assert "categorical_action_encoding=True" in message


def test_the_silent_failure_is_real_without_the_check(one_hot_env):
    """What the check prevents, measured on TorchRL itself: index actions 1 reach the env as
    action 0 (the pole falls to the left every time)."""
    index_actor = categorical_actor(OBS, N_ACT)
    with torch.no_grad():
        index_actor.module[0].module[-1].bias.fill_(0)  # the logits layer
        index_actor.module[0].module[-1].bias[1] = 50.0  # always action 1 ("push right")
    one_hot_env.set_seed(0)
    td = one_hot_env.rollout(5, index_actor)
    assert (td["action"] == 1).all()  # the actor asked for "right" ...
    right = make_actor(one_hot_env.observation_spec, one_hot_env.action_spec)
    with torch.no_grad():
        right.module[0].module[-1].bias.fill_(0)
        right.module[0].module[-1].bias[1] = 50.0
    one_hot_env.set_seed(0)
    good = one_hot_env.rollout(5, right)
    # ... but the cart moved as for "left": velocity (obs[1]) falls, as with a left push
    assert (td["next", "observation"][:, 1] < good["next", "observation"][:, 1]).all()


def test_a_one_hot_actor_on_an_index_env_and_wrong_counts_are_refused(index_env, one_hot_env):
    with pytest.raises(ActionSpecMismatchError, match=r"one-hot actions.*Categorical\(n=2\)"):
        check_env_compat(categorical_actor(OBS, N_ACT, one_hot=True), index_env)
    with pytest.raises(ActionSpecMismatchError, match="3 actions to choose from.*n=2"):
        check_env_compat(categorical_actor(OBS, 3), index_env)
    with pytest.raises(ActionSpecMismatchError, match="3 actions to choose from.*OneHot"):
        check_env_compat(categorical_actor(OBS, 3, one_hot=True), one_hot_env)


def test_continuous_shape_and_bounds_are_checked(pendulum):
    with pytest.raises(ActionSpecMismatchError, match="2 action dimensions"):
        check_env_compat(gaussian_actor(3, 2), pendulum)
    with pytest.raises(ActionSpecMismatchError, match=r"in \[-1, 1\].*in \[-2, 2\]"):
        check_env_compat(gaussian_actor(3, 1, tanh=True), pendulum)  # never reaches |a| > 1
    check_env_compat(gaussian_actor(3, 1, tanh=True, low=-2.0, high=2.0), pendulum)
    check_env_compat(gaussian_actor(3, 1), pendulum)  # unbounded Normal: the env clips
    check_env_compat(make_actor(pendulum, tanh=True), pendulum)
    check_env_compat(make_actor(pendulum), pendulum)


def test_actors_that_fit_pass_and_the_check_leaves_the_random_state_alone(one_hot_env, index_env):
    fits = [
        (make_actor(one_hot_env), one_hot_env),
        (make_actor(index_env.observation_spec, index_env.action_spec), index_env),
        (categorical_actor(OBS, N_ACT), index_env),
        (categorical_actor(OBS, N_ACT, one_hot=True), one_hot_env),
    ]
    before = torch.get_rng_state()
    for actor, env in fits:
        check_env_compat(actor, env)  # calls the actor once, sampling under a forked RNG
    assert torch.equal(before, torch.get_rng_state())


def test_a_hand_built_torchrl_actor_without_a_spec_is_probed(one_hot_env):
    """No spec attached: the check calls the actor once and reads what it wrote."""
    net = TensorDictModule(torch.nn.Linear(OBS, N_ACT), [keys.OBSERVATION], [keys.LOGITS])
    actor = ProbabilisticActor(
        net, in_keys=[keys.LOGITS], distribution_class=torch.distributions.Categorical
    )
    with pytest.raises(ActionSpecMismatchError, match="index actions"):
        check_env_compat(actor, one_hot_env)


def test_make_actor_checks_an_override_against_the_spec(one_hot_env):
    with pytest.raises(ActionSpecMismatchError, match="OneHot"):
        make_actor(one_hot_env.observation_spec, one_hot_env.action_spec, one_hot=False)
    assert make_actor(one_hot_env)(one_hot_env.reset())["action"].shape == (N_ACT,)


def test_rlkit_collectors_refuse_a_misfit_actor(one_hot_env):
    from rlkit.data.collector import VectorEnvCollector, make_collector
    from rlkit.envs import make_env

    with pytest.raises(ActionSpecMismatchError, match="index actions.*OneHot"):
        make_collector(one_hot_env, categorical_actor(OBS, N_ACT), frames_per_batch=8)
    env = make_env("CartPole-v1", num_envs=2, seed=0)  # index actions
    with pytest.raises(ActionSpecMismatchError, match="one-hot actions.*Categorical"):
        VectorEnvCollector(env, categorical_actor(OBS, N_ACT, one_hot=True), frames_per_batch=8)
    env.close()


# --------------------------------------------------------------------------- set_keys
def _batch(seed: int = 0) -> TensorDict:
    """A [N, T] batch with terminations and truncations, collection-time log-probs."""
    g = torch.Generator().manual_seed(seed)
    done = torch.rand(N, T, 1, generator=g) < 0.2
    terminated = done & (torch.rand(N, T, 1, generator=g) < 0.5)
    return TensorDict(
        {
            keys.OBSERVATION: torch.randn(N, T, OBS, generator=g),
            keys.ACTION: torch.randint(0, N_ACT, (N, T), generator=g),
            keys.NEXT: {
                keys.OBSERVATION: torch.randn(N, T, OBS, generator=g),
                "reward": torch.randn(N, T, 1, generator=g),
                "done": done,
                "terminated": terminated,
            },
        },
        batch_size=[N, T],
    )


def _networks(value_key: str = keys.STATE_VALUE):
    torch.manual_seed(0)
    actor = categorical_actor(OBS, N_ACT)
    critic = value_critic(OBS)
    if value_key != keys.STATE_VALUE:
        critic = TensorDictModule(critic.module, [keys.OBSERVATION], [value_key])
    return actor, critic


def _with_log_prob(td: TensorDict, actor, key: str) -> TensorDict:
    with torch.no_grad():
        dist = actor.get_dist(td.select(keys.OBSERVATION))
        td.set(key, dist.log_prob(td[keys.ACTION]) - 0.1)  # slightly off-policy
    return td


@pytest.mark.parametrize("loss_cls", [PPOLoss, A2CLoss, IMPALALoss])
def test_a_torchrl_users_set_keys_works_on_rlkit_losses(loss_cls):
    """set_keys(sample_log_prob=..., value=...): TorchRL's names for rlkit's
    action_log_prob and state_value; the loss computes what it does under its own names."""
    actor, critic = _networks()
    base = _with_log_prob(_batch(), actor, keys.ACTION_LOG_PROB)
    base[keys.ADVANTAGE] = torch.randn(N, T, 1)
    base[keys.VALUE_TARGET] = torch.randn(N, T, 1)
    expected = loss_cls(actor, critic)(base.clone())

    renamed_critic = TensorDictModule(critic.module, [keys.OBSERVATION], ["v"])
    loss = loss_cls(actor, renamed_critic)
    loss.set_keys(sample_log_prob="lp", value="v")
    assert keys.ACTION_LOG_PROB not in loss.in_keys
    assert ("lp" in loss.in_keys) == (loss_cls is not A2CLoss)  # A2C needs no log mu
    td = base.clone()
    td.rename_key_(keys.ACTION_LOG_PROB, "lp")
    out = loss(td)
    for name in expected.keys():  # noqa: SIM118
        torch.testing.assert_close(out[name], expected[name], msg=name)


@pytest.mark.parametrize("loss_cls", [PPOLoss, A2CLoss, IMPALALoss])
def test_an_unknown_set_keys_name_is_one_line_listing_the_accepted_names(loss_cls):
    actor, critic = _networks()
    with pytest.raises(ValueError) as info:
        loss_cls(actor, critic).set_keys(sample_logprob="lp")
    message = str(info.value)
    assert "\n" not in message and "Field(" not in message and "dataclass" not in message
    assert "'sample_logprob'" in message
    assert "action_log_prob (or sample_log_prob, log_prob)" in message
    assert "state_value (or value)" in message


def test_set_keys_refuses_two_names_for_one_key_and_points_estimator_keys_away():
    actor, critic = _networks()
    loss = PPOLoss(actor, critic)
    with pytest.raises(ValueError, match="name the same key"):
        loss.set_keys(sample_log_prob="a", action_log_prob="b")
    with pytest.raises(ValueError, match=r"does not read it: rename it on the value estimator"):
        loss.set_keys(reward="r")


def test_every_rlkit_loss_takes_torchrl_names():
    import inspect

    from torchrl.objectives import LossModule

    import rlkit.objectives as objectives
    from rlkit.objectives.common import LossBase

    losses = [
        c for c in vars(objectives).values() if inspect.isclass(c) and issubclass(c, LossModule)
    ]
    assert len(losses) >= 11  # every exported loss (RNDPPOLoss, the 12th, is removed)
    for cls in losses:
        assert issubclass(cls, LossBase), cls.__name__


def _gae_reference(td, *, value_key, adv_key, target_key):
    """TorchRL's GAE (loop kernel) with the same renamed keys: an independent reference."""
    from torchrl.objectives.value import GAE as TorchRLGAE

    ref = TorchRLGAE(gamma=0.9, lmbda=0.8, value_network=None, vectorized=False)
    ref.set_keys(value=value_key, advantage=adv_key, value_target=target_key)
    return ref(td.clone())


def test_gae_reads_and_writes_renamed_keys_and_matches_torchrl():
    actor, critic = _networks("v")
    td = _batch()
    gae = GAE(gamma=0.9, lmbda=0.8, value_network=critic)
    gae.set_keys(value="v", advantage="adv", value_target="vt")
    out = gae(td.clone())
    assert "adv" in out.keys() and keys.ADVANTAGE not in out.keys()  # noqa: SIM118
    assert gae.in_keys[-2:] == ["v", ("next", "v")] and gae.out_keys == ["adv", "vt"]
    ref = _gae_reference(out.exclude("adv", "vt"), value_key="v", adv_key="adv", target_key="vt")
    torch.testing.assert_close(out["adv"], ref["adv"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out["vt"], ref["vt"], atol=1e-5, rtol=1e-5)


def test_td_lambda_reads_renamed_keys_and_matches_torchrl():
    from torchrl.objectives.value import TDLambdaEstimator

    actor, critic = _networks("v")
    td = _batch()
    est = TDLambda(gamma=0.9, lmbda=0.8, value_network=critic).set_keys(value="v")
    out = est(td.clone())
    with torch.no_grad():
        critic(out)  # TorchRL's estimator reads V(s) as well
    ref = TDLambdaEstimator(gamma=0.9, lmbda=0.8, value_network=None, vectorized=False)
    ref.set_keys(value="v")
    expected = ref(out.clone().exclude(keys.VALUE_TARGET))
    torch.testing.assert_close(
        out[keys.VALUE_TARGET], expected[keys.VALUE_TARGET], atol=1e-5, rtol=1e-5
    )


def test_vtrace_takes_torchrl_names_and_gives_what_it_gives_under_its_own():
    actor, critic = _networks()
    base = _with_log_prob(_batch(), actor, keys.ACTION_LOG_PROB)
    expected = VTrace(gamma=0.9, actor=actor, value_network=critic)(base.clone())

    renamed_critic = TensorDictModule(critic.module, [keys.OBSERVATION], ["v"])
    vtrace = VTrace(gamma=0.9, actor=actor, value_network=renamed_critic)
    vtrace.set_keys(sample_log_prob="lp", value="v", advantage="adv", vtrace_rho="rho")
    td = base.clone()
    td.rename_key_(keys.ACTION_LOG_PROB, "lp")
    out = vtrace(td)
    torch.testing.assert_close(out["adv"], expected[keys.ADVANTAGE])
    torch.testing.assert_close(out[keys.VALUE_TARGET], expected[keys.VALUE_TARGET])
    torch.testing.assert_close(out["rho"], expected[keys.VTRACE_RHO])


def test_a_critic_writing_another_key_is_a_missing_key_error_naming_the_fix():
    """rlkit.value.GAE with a critic writing "value" died with AttributeError on None."""
    _, critic = _networks("value")
    gae = GAE(gamma=0.9, lmbda=0.8, value_network=critic)
    with pytest.raises(MissingKeyError) as info:
        gae(_batch())
    message = str(info.value)
    assert message.startswith("GAE: 'state_value' is missing")
    assert "value_network wrote ['value']" in message and "set_keys(value='value')" in message


@pytest.mark.parametrize(
    ("estimator", "key"),
    [
        ("GAE", keys.REWARD),
        ("TDLambda", keys.TERMINATED),
        ("VTrace", keys.ACTION_LOG_PROB),
        ("VTrace", keys.ACTION),
    ],
)
def test_an_estimator_missing_an_input_raises_missing_key_error_naming_key_and_module(
    estimator, key
):
    actor, critic = _networks()
    build = {
        "GAE": lambda: GAE(gamma=0.9, lmbda=0.8, value_network=critic),
        "TDLambda": lambda: TDLambda(gamma=0.9, lmbda=0.8, value_network=critic),
        "VTrace": lambda: VTrace(gamma=0.9, actor=actor, value_network=critic),
    }[estimator]
    td = _with_log_prob(_batch(), actor, keys.ACTION_LOG_PROB).exclude(key)
    with pytest.raises(
        MissingKeyError,
        match=rf"^{estimator}: {keys.describe(key)}".replace("(", r"\(").replace(")", r"\)"),
    ):
        build()(td)


def test_an_unknown_estimator_key_name_is_one_line():
    with pytest.raises(ValueError) as info:
        GAE(gamma=0.9, lmbda=0.8).set_keys(values="v")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("GAE.set_keys: unknown key name 'values'")
    assert "state_value (or value)" in message


def test_estimator_reward_keys_are_read_under_next_as_torchrl_reads_them():
    td = _batch()
    td["next", "r"] = td["next", "reward"] * 2
    expected = GAE(gamma=0.9, lmbda=0.8)(_with_values(td.clone()))
    renamed = GAE(gamma=0.9, lmbda=0.8).set_keys(reward="r")
    assert renamed.in_keys[0] == ("next", "r")
    out = renamed(_with_values(td.clone()))
    assert not torch.allclose(out[keys.ADVANTAGE], expected[keys.ADVANTAGE])
    td2 = td.clone()
    td2["next", "reward"] = td["next", "r"]
    torch.testing.assert_close(
        out[keys.ADVANTAGE], GAE(gamma=0.9, lmbda=0.8)(_with_values(td2))[keys.ADVANTAGE]
    )


def _with_values(td: TensorDict) -> TensorDict:
    g = torch.Generator().manual_seed(1)
    td[keys.STATE_VALUE] = torch.randn(N, T, 1, generator=g)
    td[keys.NEXT_STATE_VALUE] = torch.randn(N, T, 1, generator=g)
    return td


# --------------------------------------------------------------------------- extension points
class _KLPPO(PPOLoss):
    extra_loss_terms = ("loss_kl",)

    def _policy_terms(self, log_prob, advantage, tensordict):
        out = super()._policy_terms(log_prob, advantage, tensordict)
        behaviour = tensordict.get(self.tensor_keys.action_log_prob).reshape_as(log_prob)
        out["loss_kl"] = 0.5 * ((log_prob - behaviour) ** 2).mean()
        return out


def _ppo_batch(actor):
    td = _with_log_prob(_batch(), actor, keys.ACTION_LOG_PROB)
    td[keys.ADVANTAGE] = torch.randn(N, T, 1)
    td[keys.VALUE_TARGET] = torch.randn(N, T, 1)
    return td


def test_a_subclass_term_is_in_out_keys_and_in_the_total():
    actor, critic = _networks()
    loss = _KLPPO(actor, critic)
    assert "loss_kl" in loss.out_keys  # declared: listed before any call
    out = loss(_ppo_batch(actor))
    returned = [k for k in out.keys() if k.startswith("loss_")]  # noqa: SIM118
    assert {k for k in loss.out_keys if k.startswith("loss_")} == set(returned)
    parts = out["loss_policy"] + out["loss_value"] + out["loss_entropy"] + out["loss_kl"]
    torch.testing.assert_close(total_loss(out), parts)
    assert out["loss_kl"].requires_grad


def test_an_undeclared_subclass_term_joins_out_keys_once_returned():
    class Undeclared(_KLPPO):
        extra_loss_terms = ()

    actor, critic = _networks()
    loss = Undeclared(actor, critic)
    assert "loss_kl" not in loss.out_keys
    loss(_ppo_batch(actor))
    assert "loss_kl" in loss.out_keys


def test_a_subclass_declares_a_key_it_reads():
    class Weighted(PPOLoss):
        def _required_keys(self):
            needs = super()._required_keys()
            needs["weight"] = "the user writes it: a per-sample weight"
            return needs

        def _policy_terms(self, log_prob, advantage, tensordict):
            weight = tensordict.get("weight").reshape_as(advantage)
            return super()._policy_terms(log_prob, weight * advantage, tensordict)

    actor, critic = _networks()
    loss = Weighted(actor, critic)
    assert "weight" in loss.in_keys  # so the update loop hands it over
    td = _ppo_batch(actor)
    with pytest.raises(MissingKeyError, match="'weight': the user writes it"):
        loss(td)
    td["weight"] = torch.ones(N, T)
    assert torch.isfinite(loss(td)["loss_policy"])


# --------------------------------------------------------------------------- messages
def test_missing_key_error_ends_with_the_missing_key_and_its_writer():
    actor, critic = _networks()
    td = _ppo_batch(actor).exclude(keys.ADVANTAGE)
    for i in range(20):  # a batch with many keys: the list must not bury the message
        td[f"extra_{i}"] = torch.zeros(N, T)
    with pytest.raises(MissingKeyError) as info:
        PPOLoss(actor, critic)(td)
    lines = str(info.value).splitlines()
    assert "'advantage'" in lines[-1] and "rlkit.value.GAE" in lines[-1]
    assert lines[0].startswith("PPOLoss is missing required key(s)")
    assert "more" in lines[0] and len(lines[0]) < 400  # the present keys, shortened


def test_the_value_page_renaming_example_runs(capsys):
    import re
    from pathlib import Path

    page = Path(__file__).resolve().parents[1] / "docs" / "value.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
    (block,) = [b for b in blocks if "set_keys(value=" in b]
    exec(compile(block, "docs/value.md", "exec"), {})
    assert "['adv', 'value_target']" in capsys.readouterr().out


def test_the_collectors_section_of_the_envs_page_runs(capsys):
    import re
    from pathlib import Path

    page = Path(__file__).resolve().parents[1] / "docs" / "envs.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
    (block,) = [b for b in blocks if "make_collector(" in b]
    exec(compile(block, "docs/envs.md", "exec"), {})
    printed = capsys.readouterr().out
    assert printed.count("VectorEnvCollector torch.Size([4, 16]) [None, 'time']") == 2
