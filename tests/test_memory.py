"""Recurrent memory, one test per boundary rule (docs/memory.md).

Every reference here is written in the test: a textbook LSTM / GRU cell loop, a textbook GAE
loop over each env's row with the critic stepped by hand, and a counting policy whose
returns tell whether its memory was kept and reset.
"""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModuleBase

from rlkit import keys
from rlkit.algorithms.memory import split_sequences
from rlkit.data.collector import VectorEnvCollector, make_collector
from rlkit.envs import make_env
from rlkit.modules import recurrent as R
from rlkit.modules.recurrent import RecurrentCore, carried_state, recurrent_actor_critic


# --------------------------------------------------------------------------- references
def textbook_lstm(core: RecurrentCore, x, is_init, h, c):
    """One LSTM step per layer from the weights, as the LSTM paper writes it."""
    for layer in range(core.num_layers):
        w_ih = getattr(core.rnn, f"weight_ih_l{layer}")
        w_hh = getattr(core.rnn, f"weight_hh_l{layer}")
        b = getattr(core.rnn, f"bias_ih_l{layer}") + getattr(core.rnn, f"bias_hh_l{layer}")
        hp = torch.where(is_init, 0.0, h[:, layer])
        cp = torch.where(is_init, 0.0, c[:, layer])
        gates = x @ w_ih.T + hp @ w_hh.T + b
        i, f, g, o = gates.chunk(4, dim=-1)
        cn = torch.sigmoid(f) * cp + torch.sigmoid(i) * torch.tanh(g)
        hn = torch.sigmoid(o) * torch.tanh(cn)
        h, c = h.clone(), c.clone()
        h[:, layer], c[:, layer] = hn, cn
        x = hn
    return x, h, c


def textbook_gru(core: RecurrentCore, x, is_init, h):
    for layer in range(core.num_layers):
        w_ih = getattr(core.rnn, f"weight_ih_l{layer}")
        w_hh = getattr(core.rnn, f"weight_hh_l{layer}")
        b_ih = getattr(core.rnn, f"bias_ih_l{layer}")
        b_hh = getattr(core.rnn, f"bias_hh_l{layer}")
        hp = torch.where(is_init, 0.0, h[:, layer])
        r_i, z_i, n_i = (x @ w_ih.T + b_ih).chunk(3, -1)
        r_h, z_h, n_h = (hp @ w_hh.T + b_hh).chunk(3, -1)
        r, z = torch.sigmoid(r_i + r_h), torch.sigmoid(z_i + z_h)
        n = torch.tanh(n_i + r * n_h)
        hn = (1 - z) * n + z * hp
        h = h.clone()
        h[:, layer] = hn
        x = hn
    return x, h


def _core(kind, layers=2, size=6, features=3):
    torch.manual_seed(0)
    core = RecurrentCore(
        in_key="x",
        out_key="y",
        kind=kind,
        input_size=features,
        hidden_size=size,
        num_layers=layers,
        prefix="s",
    )
    with torch.no_grad():  # biases away from CleanRL's zero init, so they are tested too
        for name, p in core.rnn.named_parameters():
            if name.startswith("bias"):
                p.normal_()
    return core


def _rows(n=4, t=9, features=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, t, features, generator=g)
    is_init = torch.rand(n, t, 1, generator=g) < 0.25
    is_init[0, 0] = True
    is_init[1, 0] = False
    return x, is_init


# --------------------------------------------------------------------------- the core
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_step_mode_follows_the_textbook_cell_and_resets_at_is_init(kind):
    core = _core(kind)
    x, is_init = _rows()
    n, t, _ = x.shape
    h = torch.randn(n, 2, 6)
    c = torch.randn(n, 2, 6)
    state = {"s_h": h, "s_c": c} if kind == "lstm" else {"s_h": h}
    ref_h, ref_c = h.clone(), c.clone()
    for step in range(t):
        td = TensorDict({"x": x[:, step], keys.IS_INIT: is_init[:, step], **state}, [n])
        core(td)
        if kind == "lstm":
            y, ref_h, ref_c = textbook_lstm(core, x[:, step], is_init[:, step], ref_h, ref_c)
            torch.testing.assert_close(td["next", "s_c"], ref_c, rtol=1e-5, atol=1e-6)
        else:
            y, ref_h = textbook_gru(core, x[:, step], is_init[:, step], ref_h)
        torch.testing.assert_close(td["y"], y, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(td["next", "s_h"], ref_h, rtol=1e-5, atol=1e-6)
        state = {k: td["next", k] for k in core.state_keys}


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_a_sequence_call_equals_the_step_by_step_rollout(kind):
    """Rows with episodes starting inside them, each row from its stored first state."""
    core = _core(kind)
    x, is_init = _rows()
    n, t, _ = x.shape
    state = {k: torch.randn(n, 2, 6) for k in core.state_keys}
    stored = {k: [] for k in core.state_keys}
    outs = []
    for step in range(t):
        for k in core.state_keys:  # the collector stores the state each step starts from
            stored[k].append(state[k] * ~is_init[:, step].view(n, 1, 1))
        td = TensorDict({"x": x[:, step], keys.IS_INIT: is_init[:, step], **state}, [n])
        core(td)
        outs.append(td["y"])
        state = {k: td["next", k] for k in core.state_keys}
    seq = TensorDict(
        {"x": x, keys.IS_INIT: is_init, **{k: torch.stack(v, 1) for k, v in stored.items()}},
        [n, t],
    ).refine_names(None, "time")
    core(seq)
    torch.testing.assert_close(seq["y"], torch.stack(outs, 1), rtol=1e-5, atol=1e-6)
    # cut into sequences of 3: each starts from the state stored at its first step
    chunks = split_sequences(seq.exclude("y"), 3)
    core(chunks)
    torch.testing.assert_close(chunks["y"].reshape(n, t, -1), seq["y"], rtol=1e-5, atol=1e-6)


def test_no_state_crosses_an_episode_or_an_env_and_padding_changes_nothing(monkeypatch):
    core = _core("lstm")
    x, is_init = _rows(n=3, t=10)
    is_init[:] = False
    is_init[0, 4] = True  # row 0: episodes [0, 4) and [4, 10)
    # the state stored at each step (only the first step's is read: the rows start there)
    state = {k: torch.randn(3, 1, 2, 6).expand(3, 10, 2, 6) for k in core.state_keys}
    x.requires_grad_(True)

    def run(inputs):
        td = TensorDict({"x": inputs, keys.IS_INIT: is_init, **state}, [3, 10])
        return core(td.refine_names(None, "time"))["y"]

    y = run(x)
    # the second episode's outputs have no gradient to the first episode's inputs, nor to
    # any other env's row
    grad = torch.autograd.grad(y[0, 4:].sum(), x)[0]
    assert grad[0, 4:].abs().sum() > 0
    assert grad[0, :4].abs().sum() == 0 and grad[1:].abs().sum() == 0
    # changing the first episode changes nothing after it
    changed = x.detach().clone()
    changed[0, :4] += 10.0
    torch.testing.assert_close(run(changed)[0, 4:], y[0, 4:].detach(), rtol=0, atol=0)
    # the padding of short pieces is never read: another padding value gives the same
    # outputs and the same gradients, bit for bit
    loss = run(x).pow(2).sum()
    grads = torch.autograd.grad(loss, list(core.parameters()))
    monkeypatch.setattr(R, "PAD_VALUE", 1e3)
    loss2 = run(x).pow(2).sum()
    grads2 = torch.autograd.grad(loss2, list(core.parameters()))
    assert torch.equal(loss, loss2)
    for a, b in zip(grads, grads2):
        assert torch.equal(a, b)


# --------------------------------------------------------------------------- collection
class Countdown(gymnasium.Env):
    """Episode lengths fixed per env: terminates after ``end`` steps (obs: steps left);
    wrapped in a TimeLimit shorter than ``end`` for some envs (truncation)."""

    def __init__(self, end=3):
        self.end = end
        self.observation_space = gymnasium.spaces.Box(-10.0, 10.0, (2,), np.float32)
        self.action_space = gymnasium.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([self.end, 1.0], np.float32), {}

    def step(self, action):
        self.t += 1
        obs = np.array([self.end - self.t, float(action)], np.float32)
        return obs, 1.0, self.t >= self.end, False, {}


def _lstm_parts(env, size=8):
    torch.manual_seed(0)
    return recurrent_actor_critic(
        env, kind="lstm", size=size, actor_hidden=(8,), critic_hidden=(8,)
    )


def test_the_collector_resets_the_state_where_an_episode_starts_and_carries_it_elsewhere():
    env = make_env(lambda: gymnasium.wrappers.TimeLimit(Countdown(5), 3), num_envs=2, seed=0)
    env2 = make_env(lambda: Countdown(2), num_envs=2, seed=0)
    for e, kind in ((env, "truncated"), (env2, "terminated")):
        actor, critic, _ = _lstm_parts(e)
        policy = R.collect_module(actor, critic)
        collector = VectorEnvCollector(e, policy, frames_per_batch=2 * 7)
        it = iter(collector)
        first, second = next(it), next(it)
        for batch in (first, second):
            done = batch["next", kind].squeeze(-1)
            is_init = batch[keys.IS_INIT].squeeze(-1)
            assert done.any()
            # is_init exactly on the steps after a done (and on a batch's first step when the
            # previous batch ended an episode)
            assert torch.equal(is_init[:, 1:], done[:, :-1])
            for k in ("policy_state_h", "policy_state_c", "value_state_h", "value_state_c"):
                root, after = batch[k], batch["next", k]
                # zero where an episode starts, the state after the previous step elsewhere
                assert root[is_init].abs().sum() == 0
                carried = ~is_init[:, 1:]
                assert torch.equal(root[:, 1:][carried], after[:, :-1][carried])
                # at the episode's last step the state after it is the pre-reset one
                assert after[done].abs().sum() > 0
        # carried across batches
        for k in ("policy_state_h", "value_state_c"):
            keep = ~second[keys.IS_INIT][:, 0].squeeze(-1)
            assert torch.equal(second[k][:, 0][keep], first["next", k][:, -1][keep])
        collector.shutdown()


def test_the_stored_state_is_the_one_training_starts_from():
    """On-policy, a sequence call of the actor over the batch (whole rows or chunks)
    reproduces the logits collected step by step."""
    env = make_env("CartPole-v1", num_envs=3, seed=0, max_episode_steps=9)
    actor, critic, _ = _lstm_parts(env)
    collector = VectorEnvCollector(env, R.collect_module(actor, critic), frames_per_batch=3 * 12)
    batch = next(iter(collector))
    assert batch[keys.IS_INIT][:, 1:].any()  # episodes start inside the rows
    for length in (None, 4):
        seqs = split_sequences(batch.exclude(keys.LOGITS), length)
        with torch.no_grad():
            logits = actor.get_dist(seqs).logits
        torch.testing.assert_close(
            logits.reshape(3, 12, -1), batch[keys.LOGITS].log_softmax(-1), rtol=1e-5, atol=1e-6
        )
    collector.shutdown()


# --------------------------------------------------------------------------- values
def test_gae_values_come_from_the_right_state():
    """The learner's advantages against a textbook loop: the critic stepped by hand along
    each env's row (zero state at is_init), V(next obs) from the state after the step, also
    at truncations, then GAE."""
    from rlkit.algorithms import ppo
    from rlkit.configs.ppo import PPOConfig
    from rlkit.training.learner import Context, Counters

    cfg = PPOConfig(
        env="CartPole-v1",
        num_envs=3,
        rollout_steps=16,
        minibatch_size=48,
        recurrent="gru",
        recurrent_size=8,
        hidden=(8,),
        gamma=0.9,
        gae_lambda=0.8,
        epochs=1,
    )
    env = make_env("CartPole-v1", num_envs=3, seed=0, max_episode_steps=7)
    torch.manual_seed(0)
    learner = ppo.build(cfg, env)
    collector = make_collector(env, learner.collect_policy(), frames_per_batch=48)
    assert isinstance(collector, VectorEnvCollector)
    batch = next(iter(collector))
    assert batch["next", "truncated"].any()
    critic = learner.critic
    n, t = batch.batch_size
    values = torch.zeros(n, t)
    next_values = torch.zeros(n, t)
    with torch.no_grad():
        for i in range(n):
            h = torch.zeros(1, 1, 8)
            for j in range(t):
                start = bool(batch[keys.IS_INIT][i, j])
                step = TensorDict(
                    {
                        keys.OBSERVATION: batch[keys.OBSERVATION][i, j][None],
                        keys.IS_INIT: torch.tensor([[start]]),
                        "value_state_h": h,
                    },
                    [1],
                )
                critic(step)
                values[i, j] = step[keys.STATE_VALUE].squeeze()
                after = step["next", "value_state_h"]
                boot = TensorDict(
                    {
                        keys.OBSERVATION: batch["next", keys.OBSERVATION][i, j][None],
                        keys.IS_INIT: torch.tensor([[False]]),
                        "value_state_h": after,
                    },
                    [1],
                )
                critic(boot)
                next_values[i, j] = boot[keys.STATE_VALUE].squeeze()
                h = after
    reward = batch["next", "reward"].squeeze(-1)
    done = batch["next", "done"].squeeze(-1).float()
    term = batch["next", "terminated"].squeeze(-1).float()
    adv = torch.zeros(n, t)
    last = torch.zeros(n)
    for j in reversed(range(t)):
        delta = reward[:, j] + 0.9 * next_values[:, j] * (1 - term[:, j]) - values[:, j]
        last = delta + 0.9 * 0.8 * (1 - done[:, j]) * last
        adv[:, j] = last

    class Fab:
        world_size, global_rank, device = 1, 0, torch.device("cpu")

    ctx = Context(Fab(), 10_000, Counters())
    learner.prepare(batch, ctx)
    torch.testing.assert_close(batch[keys.ADVANTAGE].squeeze(-1), adv, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(batch[keys.STATE_VALUE].squeeze(-1), values, rtol=1e-5, atol=1e-6)
    collector.shutdown()


# --------------------------------------------------------------------------- evaluation
class CountingPolicy(TensorDictModuleBase):
    """Acts ``count mod 2``, where ``count`` is its memory of the steps taken this episode:
    scores 3/3 on :class:`Alternate` with memory kept and reset, 2/3 if it forgets; carried
    into the next episode without a reset, it is out of step there."""

    def __init__(self):
        super().__init__()
        self.in_keys = [keys.OBSERVATION, keys.IS_INIT, "count"]
        self.out_keys = [keys.ACTION, (keys.NEXT, "count")]

    def state_shapes(self):
        return {"count": (1,)}

    def forward(self, td):
        count = torch.where(td[keys.IS_INIT], 0.0, td["count"])
        td[keys.ACTION] = (count.squeeze(-1) % 2).long()
        td[keys.NEXT, "count"] = count + 1
        return td


class Alternate(gymnasium.Env):
    """Three steps; reward 1 when the action is the step's parity. The observation tells
    nothing."""

    observation_space = gymnasium.spaces.Box(0.0, 1.0, (1,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        reward = float(int(action) == self.t % 2)
        self.t += 1
        return np.zeros(1, np.float32), reward, self.t >= 3, False, {}


def test_evaluation_keeps_memory_across_steps_and_resets_it_at_episode_start():
    from rlkit.training.evaluation import Evaluator

    policy = CountingPolicy()
    assert carried_state(policy) == {"count": (1,)}
    evaluator = Evaluator(Alternate, episodes=3)
    mean, _ = evaluator(policy)
    assert mean == 3.0
    # the collector carries it the same way, over several episodes per env (a reset every
    # 3 steps): every step rewarded
    env = make_env(Alternate, num_envs=2, seed=0)
    batch = next(iter(VectorEnvCollector(env, policy, frames_per_batch=2 * 9)))
    assert batch["next", "reward"].sum() == 18

    # forgetting (a policy whose state is reset every step) scores half
    class Forgetful(CountingPolicy):
        def forward(self, td):
            td[keys.IS_INIT] = torch.ones_like(td[keys.IS_INIT])
            return super().forward(td)

    assert evaluator(Forgetful())[0] == 2.0


# --------------------------------------------------------------------------- recipes
def test_recipes_without_memory_refuse_it_in_one_line(capsys):
    from rlkit.algorithms import daac, dqn, ppg
    from rlkit.configs.daac import DAACConfig
    from rlkit.configs.ppg import PPGConfig

    env = make_env("CartPole-v1", num_envs=2, seed=0)
    for module, cfg in ((ppg, PPGConfig), (daac, DAACConfig)):  # the recipes print it as
        with pytest.raises(ValueError, match=r"^--recurrent lstm: .* memory are ppo, a2c, rnd"):
            module.build(cfg(recurrent="lstm"), env)  # one "error: ..." line
    with pytest.raises(SystemExit):
        dqn.main(["--recurrent", "gru"])
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: unrecognized arguments: --recurrent gru") and "ppo, a2c" in err


def test_sequence_length_and_minibatch_are_checked_in_one_line():
    from rlkit.configs.ppo import PPOConfig

    with pytest.raises(ValueError, match="does not divide --rollout-steps 32"):
        PPOConfig(recurrent="lstm", sequence_length=5)
    with pytest.raises(ValueError, match="not a multiple of the sequence length 8"):
        PPOConfig(recurrent="lstm", sequence_length=8, minibatch_size=100)


def test_the_docs_page_runs(capsys):
    from pathlib import Path

    page = Path(__file__).resolve().parents[1] / "docs" / "memory.md"
    (block,) = __import__("re").findall(r"```python\n(.*?)```", page.read_text(), flags=16)
    exec(compile(block, "docs/memory.md", "exec"), {})
    out = capsys.readouterr().out
    assert "tensor([0., 1., 2., 3.])" in out


def test_a_dict_observation_with_memory_is_refused_in_one_line():
    class TwoEntries(gymnasium.Env):
        observation_space = gymnasium.spaces.Dict(
            {"a": gymnasium.spaces.Box(-1.0, 1.0, (2,)), "b": gymnasium.spaces.Box(-1.0, 1.0, (3,))}
        )
        action_space = gymnasium.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return self.observation_space.sample(), {}

        def step(self, action):
            return self.observation_space.sample(), 0.0, True, False, {}

    env = make_env(TwoEntries, num_envs=2, seed=0)
    with pytest.raises(ValueError, match=r"^--recurrent reads one 'observation' entry.*is a Dict"):
        recurrent_actor_critic(env, kind="gru", size=8)


@pytest.mark.slow
@pytest.mark.ddp_jobs("ppo-gru")  # a shared launch: tests/ddp_shared.py (512 frames)
def test_memory_on_two_ranks_keeps_parameters_identical(ddp_jobs):
    """``--devices 2 --recurrent gru``: each rank collects with its own envs' carried state
    and trains on its own sequences; the all-reduced gradients keep the ranks' parameters
    identical, and the run trained and evaluated."""
    run = ddp_jobs["ppo-gru"]
    summary = run.summary()
    assert summary["world_size"] == 2 and summary["frames"] == 512
    assert summary["rank_param_max_diff"] == 0.0
    from rlkit.training import checkpoint as ckpt

    actor = ckpt.load(run.dir / "checkpoints" / "last.pt")["modules"]["actor"]
    assert any("rnn.weight_hh_l0" in k for k in actor)
