"""FrameReplay (rlkit/data/frames.py): each uint8 frame stored once, transitions rebuilt
exactly.

References written here: a naive replay that keeps every step's full observation and next
observation, with textbook n-step transitions (a plain loop over each env's step list, windows
running across batches, cut at the first done step), fed scripted episodes whose frames carry
their own identity; and the learner's own ``transitions()`` (``nstep_transitions`` plus its
n-step tail) on the same stream.
"""

from __future__ import annotations

import dataclasses
import io
from types import SimpleNamespace

import pytest
import torch
from tensordict import TensorDict
from torch import nn

from rlkit import keys
from rlkit.algorithms import dqn
from rlkit.algorithms.offpolicy import OffPolicyConfig, OffPolicyLearner
from rlkit.data.frames import FrameReplay
from rlkit.data.replay import Replay
from rlkit.training.engine import Context, Counters

FRAME = (2, 3)  # scripted frames: [env, id % 256, id // 256, id * 7 % 256, 1, 2]
GAMMA = 0.9


def frame(env: int, ident: int) -> torch.Tensor:
    values = [env, ident % 256, ident // 256, ident * 7 % 256, 1, 2]
    return torch.tensor(values, dtype=torch.uint8).view(FRAME)


def decode(obs_newest: torch.Tensor) -> tuple[int, int]:
    flat = obs_newest.reshape(-1).tolist()
    return flat[0], flat[1] + 256 * flat[2]


class Scripted:
    """``num_envs`` scripted envs: episode lengths cycle through ``lengths[env]``; an episode
    ends terminated or truncated in turn; every new frame has a fresh id. Observations are the
    last ``k`` frames (``[k, 2, 3]``; ``[2, 3]`` for ``k = 1``) padded with the reset frame
    (gymnasium's padding "reset") or zeros."""

    def __init__(
        self, lengths, *, k: int, padding: str = "reset", skip: int = 0, first_id: int = 0
    ) -> None:
        self.lengths, self.k, self.padding = lengths, k, padding
        self.num = len(lengths)
        self.ids = [first_id] * self.num
        self.episode = [0] * self.num
        self.t = [0] * self.num
        self.stack = [self._reset(e) for e in range(self.num)]
        self.steps: list[list[dict]] = [[] for _ in range(self.num)]  # the naive replay
        for _ in range(skip):  # a stream that starts mid-episode: steps never shown
            for e in range(self.num):
                self._step(e)
        self.steps = [[] for _ in range(self.num)]

    def _new(self, e: int) -> torch.Tensor:
        self.ids[e] += 1
        return frame(e, self.ids[e])

    def _reset(self, e: int) -> list[torch.Tensor]:
        first = self._new(e)
        pad = first if self.padding == "reset" else torch.zeros(FRAME, dtype=torch.uint8)
        return [pad] * (self.k - 1) + [first]

    def _obs(self, stack) -> torch.Tensor:
        return torch.stack(stack) if self.k > 1 else stack[0].clone()

    def _step(self, e: int) -> dict:
        obs = self._obs(self.stack[e])
        self.t[e] += 1
        nxt_stack = self.stack[e][1:] + [self._new(e)]
        length = self.lengths[e][self.episode[e] % len(self.lengths[e])]
        done = self.t[e] == length
        terminated = done and self.episode[e] % 2 == 0
        step = {
            "obs": obs,
            "action": self.ids[e] % 5,
            "reward": 0.25 + 0.125 * (self.ids[e] % 7) - 0.5 * terminated,
            "next_obs": self._obs(nxt_stack),
            "terminated": terminated,
            "done": done,
        }
        self.steps[e].append(step)
        if done:
            self.episode[e] += 1
            self.t[e] = 0
            self.stack[e] = self._reset(e)
        else:
            self.stack[e] = nxt_stack
        return step

    def batch(self, steps: int) -> TensorDict:
        rows = [[self._step(e) for _ in range(steps)] for e in range(self.num)]

        def field(name, dtype=None):
            return torch.stack(
                [torch.stack([torch.as_tensor(s[name]) for s in r]) for r in rows]
            ).to(dtype)

        flag = {"dtype": torch.bool}
        return TensorDict(
            {
                keys.OBSERVATION: field("obs"),
                keys.ACTION: field("action", torch.long),
                keys.NEXT: {
                    keys.OBSERVATION: field("next_obs"),
                    "reward": field("reward", torch.float32).unsqueeze(-1),
                    "terminated": field("terminated", **flag).unsqueeze(-1),
                    "done": field("done", **flag).unsqueeze(-1),
                },
            },
            batch_size=[self.num, steps],
        )

    def textbook(self, e: int, i: int, n: int) -> dict | None:
        """The n-step transition of env ``e``'s step ``i`` (None until its window is in)."""
        steps = self.steps[e]
        total, m = 0.0, 0
        for j in range(n):
            if i + j >= len(steps):
                return None
            total += GAMMA**j * steps[i + j]["reward"]
            m = j + 1
            if steps[i + j]["done"]:
                break
        last = steps[i + m - 1]
        return {
            "obs": steps[i]["obs"],
            "action": steps[i]["action"],
            "reward": total,
            "next_obs": last["next_obs"],
            "terminated": last["terminated"],
            "done": last["done"],
            "discount": GAMMA**m,
        }

    def index(self) -> dict[tuple[int, int], int]:
        """(env, id of the observation's newest frame) -> step number."""
        newest = (lambda o: o[-1]) if self.k > 1 else (lambda o: o)
        return {decode(newest(s["obs"])): i for e in range(self.num) for i, s in
                enumerate(self.steps[e])}  # fmt: skip


def newest(obs: torch.Tensor, k: int) -> torch.Tensor:
    return obs[-1] if k > 1 else obs


def assert_matches_textbook(env: Scripted, sample: TensorDict, n: int) -> set:
    """Every sampled transition equals the textbook one of its (env, step); returns them."""
    index, seen = env.index(), set()
    for row in sample.unbind(0):
        e, ident = decode(newest(row[keys.OBSERVATION], env.k))
        i = index[(e, ident)]
        ref = env.textbook(e, i, n)
        assert ref is not None, f"env {e} step {i} sampled before its window is complete"
        assert torch.equal(row[keys.OBSERVATION], ref["obs"])
        assert torch.equal(row[keys.NEXT_OBSERVATION], ref["next_obs"]), (e, i)
        assert int(row[keys.ACTION]) == ref["action"]
        assert bool(row[keys.TERMINATED]) == ref["terminated"]
        torch.testing.assert_close(float(row[keys.REWARD]), ref["reward"], rtol=1e-6, atol=1e-6)
        if n > 1:
            assert bool(row[keys.DONE]) == ref["done"]
            discount = float(row[keys.BOOTSTRAP_DISCOUNT])
            torch.testing.assert_close(discount, ref["discount"], rtol=1e-6, atol=0)
        seen.add((e, i))
    return seen


def available(env: Scripted, n: int) -> set:
    return {(e, i) for e in range(env.num) for i in range(len(env.steps[e]))
            if env.textbook(e, i, n) is not None}  # fmt: skip


def first_per_env(replay: FrameReplay, count: int) -> TensorDict:
    """The first ``count`` sampleable transitions of each env, ``[N, count]``. (A step whose
    episode ends inside the newest ``n - 1`` steps is sampleable at once here, while the
    learner's n-step tail holds it back until ``n - 1`` more steps arrive: both textbook.)"""
    env, pos = replay.sampleable()
    rows = []
    for e in range(replay.num_envs):
        mine = pos[env == e]
        assert count <= len(mine) < count + replay.n_steps
        rows.append(replay.transitions_at(env[env == e][:count], mine[:count]))
    return torch.stack(rows)


def stored_steps(env: Scripted, replay: FrameReplay) -> set:
    index = env.index()
    out = set()
    for o in replay.transitions_at(*replay.sampleable())[keys.OBSERVATION]:
        e, ident = decode(newest(o, env.k))
        out.add((e, index[(e, ident)]))
    return out


LENGTHS = [[3, 1, 5], [7, 2], [4], [1, 1, 6]]  # ends at different times, 1-step episodes too


# --------------------------------------------------------------------------- exactness
@pytest.mark.parametrize("k", [4, 1])
@pytest.mark.parametrize("n", [1, 3])
def test_samples_equal_the_textbook_transitions_of_a_naive_replay(k, n):
    env = Scripted(LENGTHS, k=k)
    replay = FrameReplay(4 * 200, frame_stack=k, n_steps=n, gamma=GAMMA)
    for steps in (1, 3, 2, 5, 4, 1, 6):  # windows cross batch boundaries
        replay.extend(env.batch(steps))
    torch.manual_seed(0)
    sample = torch.cat(list(replay.minibatches(8, 64)))
    seen = assert_matches_textbook(env, sample, n)
    # nothing wrapped: exactly the complete windows are sampleable, and each is drawn
    assert stored_steps(env, replay) == available(env, n)
    assert len(replay) == len(available(env, n))
    assert seen == available(env, n)


@pytest.mark.parametrize("n", [1, 3])
def test_wrap_around_keeps_the_newest_steps_exact(n):
    env = Scripted(LENGTHS, k=4)
    replay = FrameReplay(4 * 40, frame_stack=4, n_steps=n, gamma=GAMMA)  # 40 slots per env
    for _ in range(30):
        replay.extend(env.batch(3))
    assert int(replay.head.min()) > 2 * replay.size  # every ring went round twice
    torch.manual_seed(1)
    assert_matches_textbook(env, torch.cat(list(replay.minibatches(4, 128))), n)
    stored = stored_steps(env, replay)
    assert stored <= available(env, n) and len(replay) == len(stored)
    for e in range(env.num):  # the newest steps are there, none older than the ring
        mine = sorted(i for f, i in stored if f == e)
        assert mine == list(range(mine[0], mine[-1] + 1))
        assert len(env.steps[e]) - mine[-1] <= n
        assert 20 <= len(mine) < 40  # less final slots (env 3 ends an episode every 3 steps)


@pytest.mark.parametrize("padding,skip", [("zero", 0), ("reset", 2), ("zero", 5)])
def test_zero_padding_and_a_stream_starting_mid_episode_are_exact(padding, skip):
    env = Scripted(LENGTHS, k=4, padding=padding, skip=skip)
    replay = FrameReplay(4 * 200, frame_stack=4, n_steps=2, gamma=GAMMA)
    for steps in (2, 5, 3, 4):
        replay.extend(env.batch(steps))
    assert stored_steps(env, replay) == available(env, 2)
    torch.manual_seed(2)
    assert_matches_textbook(env, torch.cat(list(replay.minibatches(4, 64))), 2)


@pytest.mark.parametrize("n", [1, 3])
def test_holds_exactly_what_the_learner_stores_with_the_ordinary_replay(n):
    """The learner's transitions() (nstep_transitions + its n-step tail) on the same stream:
    same keys, dtypes, shapes and values (bit for bit), env by env in time order."""
    env = Scripted(LENGTHS, k=4)
    frames = FrameReplay(4 * 200, frame_stack=4, n_steps=n, gamma=GAMMA)
    learner = SimpleNamespace(n_steps=n, gamma=GAMMA, nstep_tail=None)
    rows = []
    for steps in (3, 4, 2, 5):
        batch = env.batch(steps)
        frames.extend(batch)
        out = OffPolicyLearner.transitions(learner, batch)
        rows.append(out.reshape(env.num, -1))
    expected = torch.cat(rows, dim=1)  # [N, emitted so far], each env in time order
    got = first_per_env(frames, expected.shape[1])
    assert set(got.keys(True, True)) == set(expected.keys(True, True))
    assert got.shape == expected.shape
    for key in expected.keys(True, True):
        assert got[key].dtype == expected[key].dtype, key
        assert torch.equal(got[key], expected[key]), key


def test_sampling_is_uniform_over_sampleable_steps_and_seeded():
    env = Scripted([[5], [9, 2]], k=4)
    replay = FrameReplay(2 * 100, frame_stack=4, n_steps=3, gamma=GAMMA)
    for _ in range(10):
        replay.extend(env.batch(4))
    torch.manual_seed(3)
    draws = torch.cat(list(replay.minibatches(50, 400)))
    torch.manual_seed(3)
    again = torch.cat(list(replay.minibatches(50, 400)))
    assert (draws == again).all()
    counts: dict[tuple, int] = {}
    index = env.index()
    for o in draws[keys.OBSERVATION]:
        e, ident = decode(o[-1])
        counts[(e, index[(e, ident)])] = counts.get((e, index[(e, ident)]), 0) + 1
    assert set(counts) == available(env, 3)
    expected = len(draws) / len(counts)  # 20,000 draws over ~75 steps: 5 sigma ~ 0.3
    assert all(0.7 * expected < c < 1.3 * expected for c in counts.values())


# --------------------------------------------------------------------------- memory
def atari_batch(num_envs: int, steps: int = 1) -> TensorDict:
    obs = torch.randint(0, 255, (num_envs, steps, 1, 84, 84), dtype=torch.uint8).expand(
        num_envs, steps, 4, 84, 84
    )  # reset-padded first observations
    nxt = torch.cat([obs[:, :, 1:], obs[:, :, :1]], dim=2)
    flag = torch.zeros(num_envs, steps, 1, dtype=torch.bool)
    return TensorDict(
        {
            keys.OBSERVATION: obs.clone(),
            keys.ACTION: torch.zeros(num_envs, steps, dtype=torch.long),
            keys.NEXT: {
                keys.OBSERVATION: nxt.clone(),
                "reward": torch.zeros(num_envs, steps, 1),
                "terminated": flag,
                "done": flag.clone(),
            },
        },
        [num_envs, steps],
    )


def test_a_million_atari_transitions_fit_in_8_gb():
    """The memory check of issue 20: a 1M-slot frame replay for [4, 84, 84] uint8 holds
    under 8e9 bytes in its tensors (torch.empty: nothing is touched here), where the
    ordinary replay's rows would need 56 GB."""
    replay = FrameReplay(1_000_000, frame_stack=4, n_steps=3)
    replay.extend(atari_batch(8))
    frames = replay.frames
    assert frames.dtype == torch.uint8 and tuple(frames.shape) == (8, 125_000, 84, 84)
    assert replay.nbytes() < 8e9
    assert replay.nbytes() < 1_000_000 * (84 * 84 + 32)  # one frame + < 32 B per slot
    # the ordinary replay: bytes per stored row, measured
    ordinary = Replay(16)
    ordinary.extend(OffPolicyLearner.transitions(
        SimpleNamespace(n_steps=1), atari_batch(16)))  # fmt: skip
    stored = ordinary.buffer.storage._storage
    per_row = sum(t.numel() * t.element_size() for t in stored.values(True, True)) / 16
    assert per_row >= 2 * 4 * 84 * 84  # observation and next observation, in full
    assert per_row * 1_000_000 > 7 * replay.nbytes()


# --------------------------------------------------------------------------- checkpoint
def test_checkpoint_round_trip_resumes_sampling_identically():
    env = Scripted(LENGTHS, k=4)
    replay = FrameReplay(4 * 40, frame_stack=4, n_steps=3, gamma=GAMMA)
    for _ in range(7):  # the rings have wrapped once
        replay.extend(env.batch(3))
    blob = io.BytesIO()
    torch.save(replay.state_dict(), blob)
    blob.seek(0)
    restored = FrameReplay(4 * 40, frame_stack=4, n_steps=3, gamma=GAMMA)
    restored.load_state_dict(torch.load(blob, weights_only=True))
    for _ in range(2):
        assert len(restored) == len(replay)
        torch.manual_seed(4)
        a = torch.cat(list(replay.minibatches(3, 32)))
        torch.manual_seed(4)
        b = torch.cat(list(restored.minibatches(3, 32)))
        assert (a == b).all()
        batch = env.batch(5)  # and both go on alike
        replay.extend(batch)
        restored.extend(batch.clone())
    with pytest.raises(ValueError, match="--buffer-size"):
        FrameReplay(4 * 50, frame_stack=4).load_state_dict(replay.state_dict())
    with pytest.raises(ValueError, match="--frame-replay true"):
        Replay(100).load_state_dict(replay.state_dict())
    with pytest.raises(ValueError, match="--frame-replay false"):
        FrameReplay(100).load_state_dict(Replay(100).state_dict())


def test_a_partly_filled_checkpoint_saves_only_written_slots():
    env = Scripted(LENGTHS, k=4)
    replay = FrameReplay(4 * 1000, frame_stack=4)
    replay.extend(env.batch(3))
    state = replay.state_dict()
    assert state["frames"].shape[1] == int(replay.head.max()) < 1000
    assert state["frames"].untyped_storage().nbytes() == state["frames"].numel()


# --------------------------------------------------------------------------- bad input
def test_bad_input_is_refused_with_the_fix():
    env = Scripted(LENGTHS, k=4)
    batch = env.batch(2)
    floats = batch.clone()
    floats.set(keys.OBSERVATION, batch[keys.OBSERVATION].float())
    with pytest.raises(ValueError, match="observation torch.float32 .* next observation torch.u"):
        FrameReplay(400, frame_stack=4).extend(floats)
    with pytest.raises(ValueError, match=r"\[3, \.\.\.\] per step, got \[4, 2, 3\]"):
        FrameReplay(400, frame_stack=3).extend(batch)
    with pytest.raises(ValueError, match=r"\[N envs, T steps\]"):
        FrameReplay(400, frame_stack=4).extend(batch.reshape(-1))
    with pytest.raises(ValueError, match="raise the capacity"):
        FrameReplay(16, frame_stack=4).extend(batch)
    replay = FrameReplay(400, frame_stack=4)
    replay.extend(batch)
    with pytest.raises(ValueError, match="4 envs"):
        replay.extend(batch[:2])
    with pytest.raises(ValueError, match="observations"):
        replay.extend(torch_crop(batch))
    floats.set(keys.NEXT_OBSERVATION, batch[keys.NEXT_OBSERVATION].float())
    with pytest.raises(TypeError, match="holds torch.uint8 observations.*keep pixels uint8"):
        replay.extend(floats)
    with pytest.raises(ValueError, match="frame_stack"):  # not a frame stack of 4
        noise = batch.clone()
        noise[keys.OBSERVATION][:, :, 0] += 1
        FrameReplay(400, frame_stack=4).extend(noise)
    with pytest.raises(ValueError, match="continue the previous one"):  # a batch skipped
        env.batch(1)
        replay.extend(env.batch(2))
    with pytest.raises(ValueError, match="nothing to sample"):
        next(FrameReplay(400, n_steps=3).minibatches(1, 4))


def torch_crop(batch: TensorDict) -> TensorDict:
    """The same batch with frames one pixel narrower."""
    return TensorDict(
        {
            keys.OBSERVATION: batch[keys.OBSERVATION][..., :2].contiguous(),
            keys.ACTION: batch[keys.ACTION],
            keys.NEXT: {
                keys.OBSERVATION: batch[keys.NEXT_OBSERVATION][..., :2].contiguous(),
                "reward": batch[keys.REWARD],
                "terminated": batch[keys.TERMINATED],
                "done": batch[keys.DONE],
            },
        },
        batch.batch_size,
    )


# --------------------------------------------------------------------------- the learner
def test_frame_replay_flag_is_validated():
    with pytest.raises(ValueError, match="--prioritized"):
        OffPolicyConfig(frame_replay="true", prioritized=True)
    with pytest.raises(ValueError, match="--frame-replay must be one of"):
        OffPolicyConfig(frame_replay="yes")


def context(total_frames: int = 10_000) -> Context:
    fabric = SimpleNamespace(device=torch.device("cpu"), world_size=1)
    return Context(fabric, total_frames, Counters())


class _Pixels(nn.Module):
    """uint8 [*, H, W, C] -> float [*, H * W * C] in [0, 1], inside the network."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(-3).float() / 255


def minatar_dqn(frame_replay: str, **overrides):
    from rlkit.algorithms.dqn import DQNConfig, DQNLearner, dqn_optimizer
    from rlkit.algorithms.offpolicy import offpolicy_settings
    from rlkit.envs import make_env
    from rlkit.modules import q_critic_discrete
    from rlkit.modules.critics import action_kind
    from rlkit.objectives import DQNLoss

    settings = dict(
        env="MinAtar/Breakout-v1", num_envs=2, steps_per_batch=8, batch_size=8,
        buffer_size=2000, learning_starts=16, utd_ratio=0.25, total_frames=1000, n_steps=3,
        frame_replay=frame_replay,
    )  # fmt: skip
    cfg = DQNConfig(**(settings | overrides))
    env = make_env(cfg.env, num_envs=cfg.num_envs, seed=0)
    width = int(torch.tensor(env.observation_spec[keys.OBSERVATION].shape[-3:]).prod())
    actions = action_kind(env.action_spec, batch_shape=tuple(env.batch_size)).size
    q = q_critic_discrete(width, actions, hidden=(16,), backbone=_Pixels())
    weights = cfg.priority_weight_norm if cfg.prioritized else None
    loss = DQNLoss(q, gamma=cfg.gamma, n_steps=cfg.n_steps, priority_weights=weights)
    learner = DQNLearner(
        loss=loss,
        optimizer=dqn_optimizer(cfg, loss.q_network.parameters()),
        action_spec=env.action_spec_unbatched,
        epsilon=dqn.epsilon_schedule(cfg),
        total_frames=cfg.total_frames,
        priority_weights=weights,
        **offpolicy_settings(cfg),
    )
    return cfg, env, learner


def test_dqn_on_minatar_trains_from_the_frame_replay_and_resumes():
    pytest.importorskip("minatar")
    from rlkit.data.collector import VectorEnvCollector

    cfg, env, learner = minatar_dqn("auto")
    collector = VectorEnvCollector(env, learner.collect_policy(), frames_per_batch=16)
    ctx = context(cfg.total_frames)
    # what the ordinary replay would hold: the learner's transitions() on the same batches
    stream = SimpleNamespace(n_steps=cfg.n_steps, gamma=cfg.gamma, nstep_tail=None)
    rows, dones = [], 0
    torch.manual_seed(0)
    batches = iter(collector)
    for _ in range(8):
        batch = next(batches)
        assert batch[keys.OBSERVATION].dtype == torch.uint8
        metrics = learner.update(batch, ctx)
        ctx.counters.frames += batch.numel()
        rows.append(OffPolicyLearner.transitions(stream, batch).reshape(2, -1))
        dones += int(batch[keys.DONE].sum())
    assert isinstance(learner.replay, FrameReplay) and learner.replay.frame_stack == 1
    assert metrics["gradient_steps"] > 0 and dones > 0
    # the same transitions as the ordinary replay, env by env in time order
    expected = torch.cat(rows, dim=1)
    got = first_per_env(learner.replay, expected.shape[1])
    assert got.shape == expected.shape
    for key in expected.keys(True, True):
        assert torch.equal(got[key], expected[key]), key
    # resume: a fresh learner from the checkpointed state samples the same minibatches
    state = learner.state_dict()
    assert "nstep_tail" not in state
    _, _, fresh = minatar_dqn("auto")
    fresh.load_state_dict(state)
    restored = fresh._replay(ctx)
    assert isinstance(restored, FrameReplay) and len(restored) == len(learner.replay)
    torch.manual_seed(5)
    a = torch.cat(list(learner.replay.minibatches(2, 16)))
    torch.manual_seed(5)
    b = torch.cat(list(restored.minibatches(2, 16)))
    assert (a == b).all()
    _, _, other = minatar_dqn("false")
    other.load_state_dict(state)
    with pytest.raises(ValueError, match="--frame-replay true"):
        other._replay(ctx)
    collector.shutdown()


def test_the_flag_picks_the_buffer():
    pytest.importorskip("minatar")
    batch = Scripted([[3]], k=1).batch(2)
    for mode, kind in (("auto", FrameReplay), ("false", Replay), ("true", FrameReplay)):
        _, _, learner = minatar_dqn(mode)
        assert type(learner._replay(context(), batch)) is kind
    _, _, learner = minatar_dqn("auto", prioritized=True)
    assert type(learner._replay(context(), batch)) is Replay
    float_batch = batch.clone().set(keys.OBSERVATION, batch[keys.OBSERVATION].float())
    _, _, learner = minatar_dqn("auto")
    assert type(learner._replay(context(), float_batch)) is Replay  # CartPole-like data


def test_frame_replay_true_stores_cartpole_once_and_refuses_a_small_buffer():
    """Any dtype: a float observation is one frame (frame_stack 1), stored once."""
    from rlkit.algorithms import dqn
    from rlkit.envs import make_env

    cfg = dqn.DQNConfig(
        num_envs=2, steps_per_batch=8, batch_size=8, buffer_size=200, learning_starts=16,
        hidden=(16,), total_frames=1000, n_steps=2, frame_replay="true",
    )  # fmt: skip
    env = make_env(cfg.env, num_envs=2, seed=0)
    learner = dqn.build(cfg, env)
    stream = SimpleNamespace(n_steps=cfg.n_steps, gamma=cfg.gamma, nstep_tail=None)
    ctx, rows = context(cfg.total_frames), []
    from rlkit.data.collector import VectorEnvCollector

    collector = VectorEnvCollector(env, learner.collect_policy(), frames_per_batch=16)
    torch.manual_seed(0)
    for _, part in zip(range(5), collector, strict=False):
        metrics = learner.update(part, ctx)
        rows.append(OffPolicyLearner.transitions(stream, part).reshape(2, -1))
    collector.shutdown()
    assert isinstance(learner.replay, FrameReplay) and metrics["gradient_steps"] > 0
    assert learner.replay.frames.dtype == torch.float32
    expected = torch.cat(rows, dim=1)
    got = first_per_env(learner.replay, expected.shape[1])
    for key in expected.keys(True, True):
        assert torch.equal(got[key], expected[key]), key
    small = dataclasses.replace(cfg, buffer_size=39)
    with pytest.raises(ValueError, match="raise it to at least 40, or pass --frame-replay false"):
        dqn.build(small, env)
    dqn.build(dataclasses.replace(small, frame_replay="auto"), env)  # CartPole: ordinary replay


def test_learning_starts_once_the_rings_are_full():
    """Final slots take room, so a frame replay may never hold --learning-starts transitions
    when that is close to --buffer-size: learning starts once every ring is full."""
    from rlkit.algorithms import dqn
    from rlkit.data.collector import VectorEnvCollector
    from rlkit.envs import make_env

    cfg = dqn.DQNConfig(
        num_envs=2, steps_per_batch=8, batch_size=8, buffer_size=100, learning_starts=100,
        hidden=(16,), total_frames=1000, frame_replay="true",
    )  # fmt: skip
    env = make_env(cfg.env, num_envs=2, seed=0)
    learner = dqn.build(cfg, env)
    collector = VectorEnvCollector(env, learner.collect_policy(), frames_per_batch=16)
    ctx, started = context(cfg.total_frames), None
    torch.manual_seed(0)
    for i, batch in zip(range(12), collector, strict=False):
        metrics = learner.update(batch, ctx)
        if started is None and metrics["gradient_steps"] > 0:
            started = i
    collector.shutdown()
    replay = learner.replay
    assert replay.full and len(replay) < cfg.learning_starts  # episodes ended: final slots
    assert started is not None and started <= 100 // 16 + 1


def test_a_resumed_run_whose_envs_restart_truncates_the_stored_streams():
    """A resume's envs start afresh: the first batch after load_state_dict does not continue
    the stored stream, so each env's last stored step is cut as a truncation (done, not
    terminated) and the new stream starts an episode; everything stays textbook-exact."""
    old = Scripted(LENGTHS, k=4)
    replay = FrameReplay(4 * 200, frame_stack=4, n_steps=3, gamma=GAMMA)
    for steps in (3, 4):
        replay.extend(old.batch(steps))
    restored = FrameReplay(4 * 200, frame_stack=4, n_steps=3, gamma=GAMMA)
    restored.load_state_dict(replay.state_dict())
    new = Scripted(LENGTHS, k=4, first_id=10_000)
    restored.extend(new.batch(5))
    for e in range(old.num):  # what the learner saw: the old episodes end truncated
        last = old.steps[e][-1]
        last["done"] = True
    torch.manual_seed(6)
    sample = torch.cat(list(restored.minibatches(8, 64)))
    ids = [decode(o[-1])[1] for o in sample[keys.OBSERVATION]]
    assert_matches_textbook(old, sample[torch.tensor([i < 10_000 for i in ids])], 3)
    assert_matches_textbook(new, sample[torch.tensor([i >= 10_000 for i in ids])], 3)
    stored = set()
    for o in restored.transitions_at(*restored.sampleable())[keys.OBSERVATION]:
        e, ident = decode(o[-1])
        env = new if ident >= 10_000 else old
        stored.add((env is new, e, env.index()[(e, ident)]))
    expected = {(False, *step) for step in available(old, 3)}
    assert stored == expected | {(True, *step) for step in available(new, 3)}
    with pytest.raises(ValueError, match="continue the previous one"):  # only once
        new.batch(1)
        restored.extend(new.batch(2))


def test_a_masked_image_env_is_stored_whole_under_auto_with_one_line_and_refused_under_true(
    tmp_path, caplog
):
    """--frame-replay auto on uint8 images with an action mask: the transitions (with their
    masks) are stored whole, and one warning line says so; --frame-replay true refuses in
    one line. The env raises if a masked action is ever taken."""
    import logging

    from tests.test_engine import load_recipe

    flags = ["--env", "tests.dictobs_task:MaskedImage", "--encoder", "flatten", "--seed", "0"]
    flags += ["--total-frames", "256", "--learning-starts", "64", "--eval-episodes", "2"]
    flags += ["--progress", "false", "--num-envs", "2"]
    with caplog.at_level(logging.WARNING):
        load_recipe("dqn").main([*flags, "--run-dir", str(tmp_path / "auto")])
    lines = [
        r.getMessage() for r in caplog.records if "frame replay does not store" in r.getMessage()
    ]
    assert len(lines) == 1, lines
    with pytest.raises(ValueError, match=r"^the frame replay \(--frame-replay true.*auto or false"):
        load_recipe("dqn").main(
            [*flags, "--frame-replay", "true", "--run-dir", str(tmp_path / "t")]
        )
