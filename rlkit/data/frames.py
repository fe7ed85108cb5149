r"""A replay buffer for ``uint8`` pixel observations that stores each frame once.

Why a hand-written storage: :class:`~rlkit.data.replay.Replay` (TorchRL's
``LazyTensorStorage``) keeps ``observation`` and ``("next", "observation")`` in full in every
row. For Atari (``uint8 [4, 84, 84]``) that is 56,448 B of observations per transition
(measured by ``benchmarks/bench_replay_memory.py``: 56,469 B per row with the action, reward and
flags), 56 GB for a 1M-transition DQN buffer. Each step brings one new 84x84 frame (7,056 B),
so :class:`FrameReplay` keeps one ring of raw steps per env and stores only the newest frame
of each observation: 7.06 GB of frames for 1M steps, plus 23 B of action, reward, flags and
episode start per slot. (Stable-Baselines3's ``optimize_memory_usage`` drops the next
observation only, and still stores four frames per step.)

Layout, per env, in absolute positions (ring slot ``position % size``):

- a **step** slot holds the newest frame of the step's ``observation`` and its ``action``,
  ``("next", "reward")``, ``("next", "terminated")``, ``("next", "done")``;
- after a done step, a **final** slot holds the newest frame of its
  ``("next", "observation")`` (the true final observation: a truncated step bootstraps from
  it); otherwise the next step's slot is the next observation's;
- every slot records the position of its episode's first frame.

An observation stack of ``k`` frames (``frame_stack``, stacked along dim 0) at position
``p`` is read back as the frames at ``max(p - k + 1 + j, start)`` for ``j < k``: exact for
gymnasium's ``FrameStackObservation(padding_type="reset")`` (after a reset the stack is the
reset frame ``k`` times). An episode whose first observation is not padded that way (another
padding, or a stream that starts mid-episode, e.g. after a resume without the buffer) gets its
``k - 1`` older frames written before its first step, so it is read back exactly too. With
``k = 1`` (MinAtar) the observation is the frame: still half the memory of ``Replay``. Any
dtype works the same way (a float vector observation is stored once instead of twice); the
off-policy learners pick this buffer by themselves for ``uint8`` images only
(``--frame-replay auto``).

:meth:`FrameReplay.extend` reads every observation it was given back from the storage and
refuses (``ValueError``) a batch it would not reproduce exactly: observations that are not a
frame stack, or batches that do not continue each other. The one allowed break is the first
batch after :meth:`FrameReplay.load_state_dict` (a resumed run's envs start afresh): an env
whose stream does not continue ends its last stored step as truncated (done, not
terminated), so its windows stop there and bootstrap from the next observation it had.

Sampling is uniform with replacement over the sampleable steps (rejection from all
positions, ``torch.randint`` on the default generator, so ``torch.manual_seed`` seeds it). A
step ``p`` yields what :meth:`~rlkit.algorithms.offpolicy.OffPolicyLearner.transitions`
stores: for ``n_steps == 1`` the keys of :data:`~rlkit.data.replay.STORED`; for
``n_steps > 1`` those of :func:`~rlkit.objectives.dqn.nstep_transitions`, the textbook n-step
transition: with :math:`m \le n` the steps up to and including the first done one,
``("next", "reward")`` :math:`= \sum_{j<m} \gamma^j r_{p+j}`, the next observation at
``p + m``, ``terminated`` / ``done`` of step ``p + m - 1`` and ``bootstrap_discount``
:math:`= \gamma^m`. A window runs on across collector batches (as the learner's n-step tail
does; :func:`~rlkit.objectives.dqn.nstep_transitions` alone cuts it at the batch end), so a
step becomes sampleable once its ``n`` steps (or its episode's end) are stored. Because the
buffer stores raw steps, ``n_steps`` and ``gamma`` are read at sampling time only.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from tensordict import NestedKey, TensorDict, TensorDictBase

from rlkit import keys

__all__ = ["FORMAT", "FrameReplay"]

#: ``state_dict()["format"]``: tells a frame replay's checkpoint from ``Replay``'s
FORMAT = "frame_replay"
#: per-step values stored besides the frame, by batch key
_STEP_KEYS = {
    "action": keys.ACTION,
    "reward": keys.REWARD,
    "terminated": keys.TERMINATED,
    "done": keys.DONE,
}
_META = ("is_step", "start", *_STEP_KEYS)
#: the batch leaves :meth:`FrameReplay.extend` stores
_STORED_KEYS = (keys.OBSERVATION, keys.NEXT_OBSERVATION, *_STEP_KEYS.values())


class FrameReplay:
    """Uniform replay that stores each frame once (see the module docstring).

    Args:
        capacity: slots in all (steps, plus one final slot per episode end, plus ``k - 1``
            frames before an episode that does not start reset-padded), split evenly over
            the envs of the first batch.
        frame_stack: frames stacked along dim 0 of each observation (Atari: 4; 1 when the
            observation is one frame, as MinAtar's).
        n_steps: steps per transition (n-step returns when > 1).
        gamma: discount of the n-step return.
        device: where the frames live and minibatches are returned (the step metadata, a
            few bytes per slot, stays on the CPU).
        check: read every extended observation back and refuse a batch it would not
            reproduce (a cheap gather: on by default).

    Example:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> frames = torch.arange(5, dtype=torch.uint8).view(1, 5, 1, 1).expand(1, 5, 2, 2)
        >>> stack = torch.stack([frames[:, [0, 0, 1, 2]], frames[:, [0, 1, 2, 3]]], 1)
        >>> nxt = torch.stack([frames[:, [0, 1, 2, 3]], frames[:, [1, 2, 3, 4]]], 1)
        >>> flag = torch.zeros(1, 2, 1, dtype=torch.bool)
        >>> batch = TensorDict({"observation": stack, "action": torch.zeros(1, 2, dtype=torch.long),
        ...     "next": {"observation": nxt, "reward": torch.ones(1, 2, 1),
        ...              "terminated": flag, "done": flag}}, [1, 2])
        >>> replay = FrameReplay(32, frame_stack=4)
        >>> replay.extend(batch)
        >>> len(replay), replay.nbytes() < 32 * 4 * (2 * 2 + 8)
        (2, True)
    """

    def __init__(
        self,
        capacity: int,
        *,
        frame_stack: int = 1,
        n_steps: int = 1,
        gamma: float = 0.99,
        device: torch.device | str = "cpu",
        check: bool = True,
    ) -> None:
        for name, value in (("capacity", capacity), ("frame_stack", frame_stack)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"FrameReplay: {name} must be an int >= 1, got {value!r}")
        if isinstance(n_steps, bool) or not isinstance(n_steps, int) or n_steps < 1:
            raise ValueError(f"FrameReplay: n_steps must be an int >= 1, got {n_steps!r}")
        self.capacity, self.frame_stack = capacity, frame_stack
        self.n_steps, self.gamma = n_steps, float(gamma)
        self.device, self.check = torch.device(device), check
        self.num_envs: int | None = None
        self.size = 0  # slots per env
        self.observation_shape: tuple[int, ...] | None = None
        self.frames: torch.Tensor | None = None  # [N, size, *frame] on device
        self.meta: dict[str, torch.Tensor] = {}  # [N, size, ...] on the CPU
        self.head = torch.zeros(0, dtype=torch.long)  # [N] next position to write
        self.open = torch.zeros(0, dtype=torch.bool)  # [N] position head - 1 awaits its step
        self.episode_start = torch.zeros(0, dtype=torch.long)  # [N] open episode's start
        self._resumed = False  # loaded from a checkpoint, no batch since
        #: ``len(self)`` until the next write (None: to compute); see :meth:`__len__`
        self._length: int | None = None

    # ------------------------------------------------------------------ storage
    def _allocate(self, batch: TensorDictBase) -> None:
        num = batch.batch_size[0]
        obs = batch.get(keys.OBSERVATION)
        shape = tuple(obs.shape[2:])
        k = self.frame_stack
        if k > 1 and (not shape or shape[0] != k):
            raise ValueError(
                f"FrameReplay(frame_stack={k}) needs observations stacked along dim 0, "
                f"[{k}, ...] per step, got {list(shape)}: build it with the env's frame stack "
                "(frame_stack=1 for an unstacked observation)"
            )
        size = self.capacity // num
        least = self.least_capacity(num, batch.batch_size[1], frame_stack=k, n_steps=self.n_steps)
        if self.capacity < least:
            raise ValueError(
                f"FrameReplay: capacity {self.capacity} gives {size} slots to each of {num} "
                f"envs, fewer than batches of {batch.batch_size[1]} steps need: raise the "
                f"capacity (--buffer-size) to at least {least}"
            )
        frame = shape[1:] if k > 1 else shape
        self.num_envs, self.size, self.observation_shape = num, size, shape
        # torch.empty: a 1M-slot Atari buffer reserves 7 GB without touching it; only slots
        # written are ever read
        self.frames = torch.empty((num, size, *frame), dtype=obs.dtype, device=self.device)
        self._frame_numel = self.frames[0, 0].numel()
        self._frame_rows = self._as_rows(self.frames)  # a view: writes go to self.frames
        self.meta = {"is_step": torch.zeros(num, size, dtype=torch.bool)}
        self.meta["start"] = torch.zeros(num, size, dtype=torch.long)
        for name, key in _STEP_KEYS.items():
            value = batch.get(key)
            self.meta[name] = torch.zeros((num, size, *value.shape[2:]), dtype=value.dtype)
        self.head = torch.zeros(num, dtype=torch.long)
        self.open = torch.zeros(num, dtype=torch.bool)
        self.episode_start = torch.zeros(num, dtype=torch.long)
        self._length = None

    @staticmethod
    def least_capacity(num_envs: int, steps: int, *, frame_stack: int, n_steps: int) -> int:
        """The smallest capacity for batches of ``num_envs x steps``: one batch's slots
        (each step at most ``k + 1``: itself, a final slot and ``k - 1`` frames before it)
        plus a window of ``n`` steps and ``k`` frames, per env."""
        return num_envs * (steps * (frame_stack + 1) + n_steps + frame_stack + 1)

    @property
    def full(self) -> bool:
        """Every env's ring has wrapped: the buffer holds as many steps as it ever will."""
        return self.frames is not None and bool((self.head >= self.size).all())

    def nbytes(self) -> int:
        """Bytes held by the buffer's tensors (allocated, whether touched or not)."""
        tensors = [self.frames, *self.meta.values()] if self.frames is not None else []
        return sum(t.numel() * t.element_size() for t in tensors)

    def _check_batch(self, batch: TensorDictBase) -> dict[NestedKey, torch.Tensor]:
        """Refuse a batch this buffer cannot store; return the leaves it stores, by key."""
        if batch.batch_dims != 2:
            raise ValueError(
                "FrameReplay.extend needs a collector batch [N envs, T steps] (each env's "
                f"steps in order), got batch_size {list(batch.batch_size)}"
            )
        leaves = {k: batch.get(k, None) for k in _STORED_KEYS}
        missing = [k for k, value in leaves.items() if value is None]
        if missing:
            raise KeyError(f"FrameReplay.extend: the batch lacks {missing} (the collector's keys)")
        obs, nxt = leaves[keys.OBSERVATION], leaves[keys.NEXT_OBSERVATION]
        if obs.shape != nxt.shape or obs.dtype != nxt.dtype:
            raise ValueError(
                f"FrameReplay: observation {obs.dtype} {list(obs.shape)} and next observation "
                f"{nxt.dtype} {list(nxt.shape)} differ"
            )
        if self.num_envs is not None:
            if batch.batch_size[0] != self.num_envs:
                raise ValueError(
                    f"FrameReplay was filled from {self.num_envs} envs, this batch has "
                    f"{batch.batch_size[0]}: one buffer per collector, same env count"
                )
            if tuple(obs.shape[2:]) != self.observation_shape:
                raise ValueError(
                    f"FrameReplay holds observations {list(self.observation_shape)}, this "
                    f"batch has {list(obs.shape[2:])}"
                )
            if obs.dtype != self.frames.dtype:
                raise TypeError(
                    f"FrameReplay holds {self.frames.dtype} observations, this batch has "
                    f"{obs.dtype}: keep pixels uint8 from the env to the network (scale them "
                    "in the encoder)"
                )
        return leaves

    # ------------------------------------------------------------------ writing
    def extend(self, batch: TensorDictBase) -> None:
        """Store a collector batch ``[N, T]`` (each env's steps in order, every batch
        continuing the previous one). Raises ``ValueError`` where the storage would not
        read its observations back exactly (see the module docstring)."""
        leaves = self._check_batch(batch)
        if not batch.batch_size[1]:
            return
        if self.frames is None:
            self._allocate(batch)
        self._length = None
        # the stored leaves on the CPU (no-ops there): ``batch.to("cpu")`` rebuilt the whole
        # TensorDict, every key, at each call: 1.2 of the 2.9 ms of a one-step MinAtar
        # extend under cProfile here
        leaves = {k: value.to("cpu") for k, value in leaves.items()}
        obs, nxt = leaves[keys.OBSERVATION], leaves[keys.NEXT_OBSERVATION]
        num, steps = batch.batch_size
        if steps + 2 > self.size:
            raise ValueError(f"FrameReplay: a batch of {steps} steps overfills its ring")
        if self._resumed:
            self._resumed = False
            self._cut_discontinued(obs)
        done = leaves[keys.DONE].reshape(num, steps)
        pos, start, prefix = self._positions(done.tolist(), lambda e, t: self._padded(obs[e, t]))
        size, k = self.size, self.frame_stack
        env = torch.arange(num)[:, None].expand(num, steps)
        base = env * size
        # the next observation's frame at p + 1 (the final slot after a done step), then
        # older frames before an episode start that is not reset-padded, then the steps;
        # rows of the [N * size] views (index_copy_ of distinct rows: what the [env, slot]
        # assignment did, with fewer index computations per call)
        starts = start.reshape(-1)
        after = (base + (pos + 1) % size).reshape(-1)
        self._write_rows(after, self._newest(nxt))
        self._meta_rows("is_step").index_fill_(0, after, False)
        self._meta_rows("start").index_copy_(0, after, starts)
        if prefix.any():
            e, t = prefix.nonzero(as_tuple=True)
            for j in range(k - 1):
                slot = (pos[e, t] - (k - 1) + j) % size
                self._write_frames(e, slot, obs[e, t, j])
                self.meta["is_step"][e, slot] = False
                self.meta["start"][e, slot] = start[e, t]
        here = (base + pos % size).reshape(-1)
        self._write_rows(here, self._newest(obs))
        self._meta_rows("is_step").index_fill_(0, here, True)
        self._meta_rows("start").index_copy_(0, here, starts)
        for name, key in _STEP_KEYS.items():
            rows = self._meta_rows(name)
            values = leaves[key].reshape(len(here), *rows.shape[1:])
            rows.index_copy_(0, here, values.to(rows.dtype))
        if self.check:
            self._check_readback(obs, nxt, pos, start)

    def _cut_discontinued(self, obs: torch.Tensor) -> None:
        """The first batch after :meth:`load_state_dict`: an env whose observation does not
        continue its stored stream (a resumed run's envs start afresh) ends its last stored
        step as truncated (done, not terminated): its windows stop there and bootstrap from
        the next observation it had."""
        for e in self.open.nonzero().flatten().tolist():
            head = self.head[e : e + 1]
            stored = self._stack(torch.tensor([e]), head - 1, self.episode_start[e : e + 1])
            if not _bitwise_equal(stored[0], obs[e, 0].to(self.device)):
                self.meta["done"][e, (int(head) - 2) % self.size] = True
                self.open[e] = False

    def _newest(self, obs: torch.Tensor) -> torch.Tensor:
        return obs[:, :, -1] if self.frame_stack > 1 else obs

    def _padded(self, obs: torch.Tensor) -> bool:
        """The stack is its newest frame ``k`` times (how a reset-padded episode starts)."""
        return self.frame_stack == 1 or bool((obs[:-1] == obs[-1:]).all())

    def _rows(self, env: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
        """Row indices of ``(env, slot)`` in the frames viewed as ``[N * size, frame]``."""
        return (env * self.size + slot).reshape(-1).to(self.device)

    def _as_rows(self, frames: torch.Tensor) -> torch.Tensor:
        """Frames as ``[count, words]`` of the widest integer dividing a frame's bytes:
        index_select / index_copy_ of whole rows, measured 4x faster as int64 than as uint8
        (and 6x faster than advanced indexing of ``[N, size, *frame]``) on CPU here."""
        row = self._frame_numel * self.frames.element_size()
        wide = next(d for d in (torch.int64, torch.int32, torch.int16, torch.uint8)
                    if row % d.itemsize == 0)  # fmt: skip
        data = frames.contiguous()
        count = data.numel() // self._frame_numel
        return data.view(-1).view(torch.uint8).view(count, row).view(wide)

    def _meta_rows(self, name: str) -> torch.Tensor:
        """``meta[name]`` ``[N, size, ...]`` viewed as ``[N * size, ...]`` (row ``env * size +
        slot``): one index_select / index_copy_ on it reads or writes what ``[env, slot]``
        does, with one index tensor instead of two."""
        values = self.meta[name]
        return values.view(-1, *values.shape[2:])

    def _gather(self, name: str, rows: torch.Tensor) -> torch.Tensor:
        """``meta[name]`` at the rows ``env * size + slot``: ``meta[name][env, slot]``."""
        return self._meta_rows(name).index_select(0, rows)

    def _write_rows(self, rows: torch.Tensor, frames: torch.Tensor) -> None:
        """Write ``frames`` ``[count, *frame]`` to the distinct rows ``env * size + slot``."""
        source = self._as_rows(frames.to(self.device))
        self._frame_rows.index_copy_(0, rows.to(self.device), source)

    def _from_rows(self, rows: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        return rows.view(torch.uint8).view(self.frames.dtype).view(shape)

    def _write_frames(self, env: torch.Tensor, slot: torch.Tensor, frames: torch.Tensor):
        self._write_rows(self._rows(env.expand_as(slot), slot), frames)

    def _positions(self, done: list, padded):
        """Positions ``[N, T]`` of the steps, their episodes' starts, and which steps start
        an episode with ``k - 1`` older frames written before them; advances the cursors."""
        k = self.frame_stack
        num, steps = len(done), len(done[0])
        pos = [[0] * steps for _ in range(num)]
        start = [[0] * steps for _ in range(num)]
        prefix = [[False] * steps for _ in range(num)]
        heads, opens, starts = self.head.tolist(), self.open.tolist(), self.episode_start.tolist()
        for e in range(num):
            p, first = (heads[e] - 1, False) if opens[e] else (heads[e], True)
            ep = starts[e]
            for t in range(steps):
                if first or (t and done[e][t - 1]):
                    if not first:
                        p += 2  # past the final slot of the episode that just ended
                    ep = p
                    if not padded(e, t):
                        prefix[e][t] = True
                        p += k - 1
                elif t:
                    p += 1
                first = False
                pos[e][t], start[e][t] = p, ep
            heads[e], opens[e], starts[e] = p + 2, not done[e][-1], ep
        self.head = torch.tensor(heads, dtype=torch.long)
        self.open = torch.tensor(opens, dtype=torch.bool)
        self.episode_start = torch.tensor(starts, dtype=torch.long)
        return torch.tensor(pos), torch.tensor(start), torch.tensor(prefix)

    def _check_readback(
        self, obs: torch.Tensor, nxt: torch.Tensor, pos: torch.Tensor, start: torch.Tensor
    ) -> None:
        """Read the batch's observations and next observations back from the storage (one
        gather and one comparison for both) and refuse the batch where they differ."""
        count, shape = pos.numel(), self.observation_shape
        env = torch.arange(pos.shape[0])[:, None].expand_as(pos).reshape(-1).repeat(2)
        at = torch.cat([pos.reshape(-1), pos.reshape(-1) + 1])
        stored = self._stack(env, at, start.reshape(-1).repeat(2))
        given = torch.cat([obs.reshape(count, *shape), nxt.reshape(count, *shape)])
        given = given.to(self.device)
        if _bitwise_equal(stored.reshape(given.shape), given):
            return
        differs = not _bitwise_equal(stored[:count].reshape(count, *shape), given[:count])
        key = keys.OBSERVATION if differs else keys.NEXT_OBSERVATION
        raise ValueError(
            f"FrameReplay cannot store these observations exactly: {key!r} read back "
            f"from the stored frames differs from the batch's. With frame_stack="
            f"{self.frame_stack} each observation must be the last {self.frame_stack} "
            "frames along dim 0 (padded as gymnasium's FrameStackObservation pads), "
            "and each batch must continue the previous one env by env (one collector, "
            "steps in order). Build the replay with the env's true frame stack "
            "(frame_stack=1 stores whole observations), or use the ordinary replay "
            "(--frame-replay false)"
        )

    # ------------------------------------------------------------------ reading
    def _stack(self, env: torch.Tensor, at: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """Observations ``[B, *obs]`` whose newest frame is at positions ``at``."""
        k, frame = self.frame_stack, tuple(self.frames.shape[2:])
        flat = self._frame_rows
        if k == 1:
            rows = flat.index_select(0, self._rows(env, at % self.size))
            return self._from_rows(rows, (len(at), *frame))
        offsets = torch.arange(-(k - 1), 1)
        where = torch.maximum(at[:, None] + offsets, start[:, None]) % self.size
        rows = flat.index_select(0, self._rows(env[:, None].expand_as(where), where))
        return self._from_rows(rows, (len(at), k, *frame))

    def _window(self, env: torch.Tensor, pos: torch.Tensor):
        """For steps ``(env, pos)``: whether sampleable, and the n-step length ``m`` and
        return of each window (where sampleable; the others' are unspecified)."""
        size, head = self.size, self.head[env]
        base = env * size
        rows = base + pos % size
        lowest = (head - size).clamp(min=0)
        step = self._gather("is_step", rows)
        first = torch.maximum(pos - (self.frame_stack - 1), self._gather("start", rows))
        if self.n_steps == 1:
            # the loop below for j = 0 alone: a step slot, its frames not overwritten, and
            # stored (at most head - 2, which implies < head); its window is itself, and an
            # n = 1 transition reads its reward from the storage. About 25 tensor ops fewer
            # per call (0.2 ms here; each minibatch calls it twice, each write once)
            ok = (pos >= lowest) & (pos <= head - 2) & step & (first >= lowest)
            return ok, torch.ones_like(pos), self._gather("reward", rows)
        ok = (pos >= lowest) & (pos < head) & step & (first >= lowest)
        rewards = self._meta_rows("reward")
        total = torch.zeros((len(pos), *rewards.shape[1:]), dtype=rewards.dtype)
        length = torch.zeros_like(pos)
        alive = torch.ones_like(ok)
        for j in range(self.n_steps):
            q = pos + j
            # step p + j's row; for j = 0 the step itself, already read
            rows_q = rows if j == 0 else base + q % size
            # step p + j is stored (positions up to head - 2 hold steps or final slots)
            stored = (q <= head - 2) & (step if j == 0 else self._gather("is_step", rows_q))
            ok &= ~alive | stored
            alive &= stored
            reward = self.gamma**j * rewards.index_select(0, rows_q)
            total = total + torch.where(alive.view(-1, *[1] * (reward.dim() - 1)), reward, 0.0)
            length = torch.where(alive, j + 1, length)
            alive &= ~self._gather("done", rows_q).reshape(len(pos), -1).any(-1)
        return ok, length, total

    def _draw(self, count: int) -> tuple[torch.Tensor, ...]:
        """``count`` sampleable steps ``(env, position)``, uniform with replacement, and their
        windows' lengths and returns (as :meth:`_window`: the sampling reads them anyway).

        Rejection: the slots whose step is not sampleable draw again, in order, until every
        slot holds a sampleable one."""
        lowest = (self.head - self.size).clamp(min=0)
        filled = self.head - lowest
        bounds = filled.cumsum(0)
        slots = int(bounds[-1])
        offset = lowest - (bounds - filled)  # draw u of env e is position offset[e] + u

        def draw(n: int) -> tuple[torch.Tensor, ...]:
            u = torch.randint(slots, (n,))
            e = torch.searchsorted(bounds, u, right=True)
            p = offset[e] + u
            return (e, p, *self._window(e, p))

        if not count:
            empty, reward = torch.zeros(0, dtype=torch.long), self._meta_rows("reward")
            return empty, empty, empty, reward.new_zeros((0, *reward.shape[1:]))
        # the first round fills every slot; only the rejected ones are written again
        env, pos, ok, length, total = draw(count)
        todo = (~ok).nonzero().squeeze(1)
        while len(todo):
            e, p, ok, m, ret = draw(len(todo))
            keep = todo[ok]
            env[keep], pos[keep], length[keep], total[keep] = e[ok], p[ok], m[ok], ret[ok]
            todo = todo[~ok]
        return env, pos, length, total

    def transitions_at(self, env: torch.Tensor, pos: torch.Tensor) -> TensorDict:
        """The transitions of steps ``(env, pos)`` (all sampleable), keys and shapes as the
        learner's ``transitions()`` stores them (module docstring)."""
        ok, length, total = self._window(env, pos)
        if not bool(ok.all()):
            raise IndexError("FrameReplay.transitions_at: a requested step is not sampleable")
        return self._transitions(env, pos, length, total)

    def _transitions(
        self, env: torch.Tensor, pos: torch.Tensor, length: torch.Tensor, total: torch.Tensor
    ) -> TensorDict:
        """:meth:`transitions_at` of sampleable steps whose :meth:`_window` is
        ``length``, ``total``."""
        base, device = env * self.size, self.device
        rows = base + pos % self.size
        last = base + (pos + length - 1) % self.size
        start = self._gather("start", rows) if self.frame_stack > 1 else None
        nxt = {
            keys.OBSERVATION: self._stack(env, pos + length, start),
            keys.TERMINATED[-1]: self._gather("terminated", last).to(device),
        }
        out = {
            keys.OBSERVATION: self._stack(env, pos, start),
            keys.ACTION: self._gather("action", rows).to(device),
            keys.NEXT: nxt,
        }
        if self.n_steps == 1:
            nxt[keys.REWARD[-1]] = self._gather("reward", rows).to(device)
        else:
            nxt[keys.DONE[-1]] = self._gather("done", last).to(device)
            nxt[keys.REWARD[-1]] = total.to(device)
            discount = torch.pow(self.gamma, length.to(total.dtype)).unsqueeze(-1)
            out[keys.BOOTSTRAP_DISCOUNT] = discount.to(device)
        return _tensordict(out, len(pos), device)

    def sampleable(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every sampleable step ``(env, position)``, env-major and in time order (a scan of
        the whole buffer: for tests and inspection)."""
        if self.frames is None:
            return torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
        lowest = (self.head - self.size).clamp(min=0)
        env = torch.arange(self.num_envs).repeat_interleave(self.size)
        pos = lowest.repeat_interleave(self.size) + torch.arange(self.size).repeat(self.num_envs)
        ok = self._window(env, pos)[0]
        return env[ok], pos[ok]

    def __len__(self) -> int:
        """Sampleable steps: the stored steps less the newest whose window is not complete
        and the oldest whose earlier frames were overwritten."""
        if self.frames is None:
            return 0
        if self._length is None:  # once per write: the learner asks several times a batch
            self._length = self._count_sampleable()
        return self._length

    def _count_sampleable(self) -> int:
        """:meth:`__len__`: the step slots less the stale ones, found among each env's
        newest ``n + 1`` and oldest ``k`` positions."""
        n, k, size = self.n_steps, self.frame_stack, self.size
        # the edge positions as Python ints (a few per env): a handful of tensor ops fewer
        # than building them as tensors, about 0.3 ms of a 0.6 ms count measured here
        edges = set()
        for e, head in enumerate(self.head.tolist()):
            lowest = max(head - size, 0)
            for p in (*range(head - n - 1, head), *range(lowest, lowest + k)):
                if lowest <= p < head:
                    edges.add((e, p))
        stored = int(torch.count_nonzero(self.meta["is_step"]))  # 63 us, sum() 117 us here
        if not edges:
            return stored
        env, pos = torch.tensor(sorted(edges)).unbind(1)
        stale = self._gather("is_step", env * size + pos % size) & ~self._window(env, pos)[0]
        return stored - int(stale.sum())

    def minibatches(self, steps: int, batch_size: int) -> Iterator[TensorDictBase]:
        """``steps`` minibatches of ``batch_size`` transitions, their steps drawn at once
        (uniform with replacement, as :class:`~rlkit.data.replay.Replay`)."""
        if steps <= 0:
            return
        if not len(self):
            raise ValueError("FrameReplay: nothing to sample yet (no complete window stored)")
        drawn = self._draw(steps * batch_size)
        # built one minibatch at a time: 1,000 Atari minibatches of 32 at once would be 1.8 GB
        for e, p, m, ret in zip(*(t.split(batch_size) for t in drawn), strict=True):
            yield self._transitions(e, p, m, ret)

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        """Tensors and plain values only (a ``weights_only`` checkpoint): the written part of
        the rings, the cursors and the layout."""
        state: dict[str, Any] = {
            "format": FORMAT,
            "capacity": self.capacity,
            "frame_stack": self.frame_stack,
            "num_envs": self.num_envs,
        }
        if self.frames is None:
            return state
        used = int(min(self.size, int(self.head.max())))
        frames = self.frames[:, :used]
        # a slice of a partly filled ring is saved on its own (torch.save writes whole storages)
        state["frames"] = frames.to("cpu").clone() if used < self.size else frames.to("cpu")
        state["meta"] = {name: t[:, :used].clone() for name, t in self.meta.items()}
        state["observation_shape"] = list(self.observation_shape)
        for name in ("head", "open", "episode_start"):
            state[name] = getattr(self, name).clone()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("format") != FORMAT:
            raise ValueError(
                "the checkpoint's replay buffer stores whole transitions (--frame-replay "
                "false); resume with --frame-replay false"
            )
        for name in ("capacity", "frame_stack"):
            if state[name] != getattr(self, name):
                flag = " (--buffer-size)" if name == "capacity" else ""
                raise ValueError(
                    f"the checkpoint's frame replay has {name} {state[name]}, this one "
                    f"{getattr(self, name)}: resume with the same {name}{flag}"
                )
        if state.get("num_envs") is None:
            return
        frames, meta = state["frames"], state["meta"]
        num, used = frames.shape[:2]
        obs = torch.zeros((num, 1, *state["observation_shape"]), dtype=frames.dtype)
        like = TensorDict({keys.OBSERVATION: obs}, [num, 1])
        for name, key in _STEP_KEYS.items():
            like.set(key, meta[name][:, :1])
        self._allocate(like)
        self.frames[:, :used] = frames.to(self.device)
        for name in _META:
            self.meta[name][:, :used] = meta[name]
        for name in ("head", "open", "episode_start"):
            setattr(self, name, state[name].clone())
        self._resumed = True
        self._length = None


def _tensordict(entries: dict, batch: int, device: torch.device) -> TensorDict:
    """``TensorDict(entries, [batch], device=device)`` (one level of nested dicts) for
    tensors already of that batch size on that device, without the constructor's per-entry
    checks and copies."""
    size = torch.Size([batch])
    tensors = {
        k: _tensordict(v, batch, device) if isinstance(v, dict) else v for k, v in entries.items()
    }
    return TensorDict._new_unsafe(tensors, batch_size=size, device=device)


def _bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit (NaN observations included)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    # as bytes, then 8 at a time where they divide: torch.equal on floats calls NaN unequal,
    # and on uint8 it is 8x slower than on the same bytes as int64 here
    a, b = a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8)
    if a.numel() % 8 == 0:
        a, b = a.view(torch.int64), b.view(torch.int64)
    return torch.equal(a, b)
