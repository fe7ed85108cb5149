r"""Multi-process collection for V-trace learners (IMPALA, APPO), asynchronous or synchronous.

:class:`WorkerCollector` runs ``num_workers`` worker processes. Each owns a slice of the
rank's envs (``make_env(env_id, num_envs=num_envs // num_workers)``), a CPU copy of the
collection policy and an in-process :class:`~rlkit.data.collector.VectorEnvCollector`, and
sends ``[n, T]`` batches back through its pipe. The learner publishes weights (parameters
*and* buffers, so observation-normaliser statistics travel with them) into shared memory
with :meth:`WorkerCollector.update_policy_weights_`, which also increments the learner's
policy version :math:`k`. A worker loads the newest weights before each rollout and stamps
every step with the version it acted with, :math:`v`.

* ``sync=False`` (asynchronous, IMPALA's actor-learner split): workers collect all the
  time; a batch is the first ``num_workers`` worker batches delivered (any worker),
  concatenated along the env dim. Acting overlaps learning, so data lags the learner.
* ``sync=True``: after each weight update every worker collects exactly one rollout with
  the new weights, and the learner waits for all of them (ordered by worker): no overlap,
  zero lag, deterministic for fixed seeds. The same processes and env count, so the two
  modes compare fairly (``benchmarks/bench_async.py``).

Batches travel through shared memory: the learner allocates ``queue_size + 1`` shared
TensorDict slots per worker from the layout of the worker's first batch, and the worker
afterwards sends only ``(slot, seconds)`` through its pipe; the learner copies the slot out
and hands it back. Pickling each batch through
``torch.multiprocessing``'s queue instead (a new shared-memory segment per tensor per batch)
cost the learner ~45 ms per 256-frame CartPole batch (learner wait 2.5 s vs 1.1 s in-process
per 30 batches, ``benchmarks/bench_async.py``, idle 2-core machine), which is more than
collecting it; with slots the async learner's wait fell to 0.03 s per 30 batches.

Each batch carries ``POLICY_VERSION`` (:math:`v`, ``[N, T]`` int64), ``POLICY_LAG``
(:math:`k - v` at the time the learner takes the batch, ``[N, T]`` int64) and ``ENV_ID``
(which of the rank's envs collected each row, ``[N, T]`` int64); the collector
also keeps the running mean lag (:attr:`WorkerCollector.mean_lag`). The behaviour
log-prob :math:`\log\mu(a|s)` is the stored ``keys.ACTION_LOG_PROB`` written by the worker's
policy at acting time, whatever version that was.

Why a small worker loop and not TorchRL's multi-process collectors
(``Collector(num_collectors=k)``): the lag needs the version of the weights behind every
batch, which this loop stamps where it loads them, and each worker can run the in-process
``VectorEnvCollector`` (2.2x TorchRL's ``Collector`` per step,
``benchmarks/results/bench_collect.md``). Workers are started with the ``forkserver``
method (``fork`` is unsafe after torch / gloo initialisation; the server imports rlkit
once, so later workers start fast).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import multiprocessing.connection as mp_connection
import re
import signal
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
import torch.multiprocessing as mp
from tensordict import TensorDict, TensorDictBase
from torch import nn

from rlkit import keys
from rlkit.data.errors import ActorLost, EnvFault

__all__ = [
    "POLICY_LAG",
    "POLICY_VERSION",
    "WorkerCollector",
    "WorkerEnvs",
    "worker_seed",
    "worker_collector_factory",
]


def worker_seed(seed: int, worker: int) -> int:
    """The seed of worker ``worker`` of a :class:`WorkerCollector` seeded ``seed``: its torch
    stream (``torch.manual_seed``) and its first env. The config layer states the same rule,
    torch-free, for a population's members (``rlkit.configs.impala.worker_seed``;
    tests/test_startup.py checks that the two agree)."""
    return seed + 100 * worker


#: ``[N, T]`` int64: the learner version of the weights that acted (0: the initial weights).
POLICY_VERSION = keys.POLICY_VERSION
ENV_ID = keys.ENV_ID
#: ``[N, T]`` int64: learner version when the batch was consumed minus ``POLICY_VERSION``.
POLICY_LAG = keys.POLICY_LAG

_log = logging.getLogger(__name__)

_POLL_S = 0.05
#: how long :meth:`WorkerCollector.shutdown` waits for its workers to end on their own
_JOIN_S = 3.0
#: a worker's first batch (imports, env construction) may take this much longer than the
#: hang timeout
STARTUP_S = 60.0
#: a worker delivering no batch for this many times the slowest batch measured (or
#: ``actor_timeout`` seconds, whichever is longer) is hung
HANG_FACTOR = 10.0
#: the replacement worker of a run's ``r``-th restart is seeded
#: ``worker_seed(seed, worker) + RESTART_SEED * r``: a new stream, apart from every worker's
RESTART_SEED = 7919


def _running(stop) -> bool:
    """Keep working: not stopped, and the learner that started this worker is alive (a
    SIGKILLed learner never sets ``stop``; without this check its workers would live on)."""
    if stop.is_set():
        return False
    parent = mp.parent_process()
    return parent is None or parent.is_alive()


class _Inbox:
    """A worker's end of its pipe: ``"go"`` (synchronous mode) and free slots from the
    learner; ``None`` ends the worker."""

    def __init__(self, conn, stop, slots: int) -> None:
        self.conn, self.stop = conn, stop
        self.free, self.gos = list(range(slots)), 0
        self.buffers: list[TensorDictBase] | None = None

    def wait(self, sync: bool) -> int | None:
        """The slot of the next rollout (after its ``"go"`` in synchronous mode); ``None``
        when the worker is to end."""
        while _running(self.stop):
            if (self.gos or not sync) and self.free:
                self.gos -= bool(sync)
                return self.free.pop()
            if not self._read():
                return None
        return None

    def slots(self, layout: tuple) -> list[TensorDictBase] | None:
        """The shared-memory slots the learner allocates for batches of ``layout``."""
        if not self.send(("layout", layout)):
            return None
        while self.buffers is None and _running(self.stop):
            if not self._read():
                return None
        return self.buffers

    def _read(self) -> bool:
        """Take in the learner's next message, if one comes within a poll; False: end."""
        if not self.conn.poll(_POLL_S):
            return True
        try:
            msg = self.conn.recv()
        except (EOFError, OSError):  # the learner is gone
            return False
        if msg is None:
            return False
        if msg == "go":
            self.gos += 1
        elif isinstance(msg, tuple):  # ("slots", buffers)
            self.buffers = msg[1]
        else:
            self.free.append(msg)
        return True

    def send(self, msg) -> bool:
        try:
            self.conn.send(msg)
            return True
        except (BrokenPipeError, EOFError, OSError):  # the learner is gone
            return False


_SUB_ENV = re.compile(r"\(sub-env ([0-9, ]+)\)")


def _load_weights(policy: nn.Module, shared, version, seq) -> int:
    """Load the published weights into ``policy``; their version. A sequence lock: the
    learner makes ``seq`` odd while it writes, so a copy made while ``seq`` was odd or
    changed is torn and made again."""
    while True:
        before = seq.value
        if before % 2:
            time.sleep(0.0005)
            continue
        current = version.value
        policy.load_state_dict(shared)
        if seq.value == before:
            return current


def _worker_fault(index: int, num_envs: int, err: Exception) -> str:
    """An env fault's line, in the learner's words: its sub-envs numbered as the rank's
    (worker ``index`` steps sub-envs ``index * num_envs`` on), and the worker named."""

    def shift(match: re.Match) -> str:
        ids = ", ".join(str(int(i) + index * num_envs) for i in match.group(1).split(", "))
        return f"(sub-env {ids})"

    line = _SUB_ENV.sub(shift, str(err), count=1)
    return f"{line} (collector worker {index})"


def _worker(
    index: int,
    env_id: str,
    num_envs: int,
    steps: int,
    seed: int,
    policy: nn.Module,
    shared: Mapping[str, torch.Tensor],
    version,
    seq,
    conn,
    stop,
    sync: bool,
    slots: int,
    env_kwargs: Mapping[str, Any],
) -> None:
    # Ctrl-C reaches the whole process group and a scheduler's SIGTERM may too: the learner
    # alone decides when to stop (rlkit.training.signals) and tells the workers through
    # `stop`; a worker whose learner died stops by itself (_running). First thing, before
    # the imports: the forkserver hands each worker the default handlers back
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    from rlkit.data.collector import make_collector
    from rlkit.data.errors import EnvFault
    from rlkit.envs import make_env

    inbox = _Inbox(conn, stop, slots)
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    env = collector = None
    try:
        env = make_env(env_id, num_envs=num_envs, seed=seed, **env_kwargs)
        collector = make_collector(env, policy, frames_per_batch=num_envs * steps)
        batches = iter(collector)
        local = -1
        buffers: list[TensorDictBase] | None = None  # shared-memory slots (the learner's)
        while _running(stop):
            # a free slot first, then the newest weights: the rollout acts with the weights
            # current when it starts, and at most `slots` batches wait for the learner
            slot = inbox.wait(sync)
            if slot is None:
                break
            if version.value != local:
                local = _load_weights(policy, shared, version, seq)
            tick = time.perf_counter()
            batch = next(batches)
            seconds = time.perf_counter() - tick
            batch.set(POLICY_VERSION, torch.full(batch.batch_size, local, dtype=torch.int64))
            if buffers is None:
                buffers = inbox.slots(_layout(batch))
                if buffers is None:
                    break
            buffers[slot].update_(batch)
            # sent only once the slot is whole: a worker lost while writing one sends nothing
            if not inbox.send((slot, seconds)):
                break
    except EnvFault as err:  # the learner stops the run with this line
        inbox.send(("fault", _worker_fault(index, num_envs, err)))
    finally:
        if collector is not None:
            collector.shutdown()
        if env is not None:
            env.close()


def _layout(batch: TensorDictBase) -> tuple:
    """A batch's batch size and leaves (key, shape, dtype): plain data, which the learner
    turns into shared-memory slots (:func:`_allocate`)."""
    leaves = [(key, tuple(x.shape), x.dtype) for key, x in batch.items(True, True)]
    return tuple(batch.batch_size), leaves


def _allocate(layout: tuple, count: int) -> list[TensorDictBase]:
    """``count`` zero batches of ``layout`` in shared memory, allocated by the learner.

    The learner, not the worker, owns them: a shared tensor travels as a file descriptor that
    the receiver fetches from the sender's process, and a worker stopped (SIGSTOP) after
    sending its slots left the learner blocked for ever in that fetch."""
    size, leaves = layout
    slots = []
    for _ in range(count):
        td = TensorDict({}, batch_size=size)
        for key, shape, dtype in leaves:
            td.set(key, torch.zeros(shape, dtype=dtype))
        slots.append(td.share_memory_())
    return slots


def _why_exited(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


@dataclass(eq=False)
class _Handle:
    """The learner's view of one worker process."""

    proc: Any
    conn: Any
    seed: int
    slots: list[TensorDictBase] | None = None
    #: free slots the worker holds (asynchronous mode: it owes a batch while it holds one)
    held: int = 0
    #: since when the worker owes its next batch (a delivery, a slot handed back, a "go")
    since: float = 0.0
    delivered: bool = False
    lost: bool = False


class WorkerCollector:
    """Collect in worker processes; see the module docstring.

    A worker that dies (its exit code or signal) or hangs (owes a batch and delivered none
    for ``max(actor_timeout, HANG_FACTOR x`` the slowest batch measured so far) seconds;
    :data:`STARTUP_S` more for its first batch) is replaced by a new process with the newest
    weights and version, seeded ``worker_seed(seed, i) + RESTART_SEED * r`` on the run's
    ``r``-th restart, and one ``warning:`` line is logged
    (``logging.getLogger("rlkit.data.async_collect")``). The batch it was writing is dropped
    (a slot is sent only once written; its unread messages go with its pipe); batches it had
    sent whole are used. Past ``max_restarts`` restarts :class:`~rlkit.data.errors.ActorLost`
    is raised. An env fault in a worker (:class:`~rlkit.data.errors.EnvFault`) is raised by
    :meth:`next_batch` with the worker's line, its sub-envs numbered as the rank's.

    Args:
        env_id: gymnasium id passed to :func:`rlkit.envs.make_env` in each worker.
        policy: the learner's collection policy (a TensorDict module writing
            ``keys.ACTION`` and ``keys.ACTION_LOG_PROB``). Workers get a CPU copy; the
            learner's module is only read by :meth:`update_policy_weights_`.
        num_envs: envs per batch, split evenly over the workers.
        frames_per_batch: frames per learner batch, a multiple of ``num_envs``.
        num_workers: worker processes (>= 1, dividing ``num_envs``).
        sync: synchronous mode (see the module docstring).
        seed: worker ``i`` seeds its envs and torch with ``seed + 100 * i``.
        device: where batches are returned (``None``: CPU).
        env_kwargs: extra arguments for ``make_env`` (e.g. ``max_episode_steps``).
        queue_size: batches per worker that may wait for the learner while the worker
            collects the next one (async); lag grows with it.
        start_method: ``"forkserver"`` (default) or ``"spawn"``.
        actor_timeout: the least seconds without a batch after which a worker is hung.
        max_restarts: lost workers replaced over the collector's life; the next one lost
            raises :class:`~rlkit.data.errors.ActorLost`.
    """

    def __init__(
        self,
        *,
        env_id: str,
        policy: nn.Module,
        num_envs: int,
        frames_per_batch: int,
        num_workers: int = 1,
        sync: bool = False,
        seed: int = 0,
        device: torch.device | str | None = None,
        env_kwargs: Mapping[str, Any] | None = None,
        queue_size: int = 1,
        start_method: str = "forkserver",
        actor_timeout: float = 30.0,
        max_restarts: int = 3,
    ) -> None:
        from rlkit.envs.ids import not_importable

        if not_importable(env_id):  # a worker would fail inside its own process
            raise ValueError(
                f"--env {env_id}: collector worker processes build their envs by name, and a "
                "factory defined in a script or as a lambda cannot be imported there: define "
                "it in a module on the path (mypkg/envs.py) and pass mypkg.envs:make_env"
            )
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers must be an int >= 1, got {num_workers!r}")
        if num_envs % num_workers:
            raise ValueError(
                f"num_envs={num_envs} is not divisible by num_workers={num_workers}: each "
                "worker steps the same number of envs; change --num-envs or --workers"
            )
        if frames_per_batch % num_envs:
            raise ValueError(
                f"frames_per_batch={frames_per_batch} is not a multiple of num_envs={num_envs}"
            )
        if isinstance(queue_size, bool) or not isinstance(queue_size, int) or queue_size < 1:
            raise ValueError(f"queue_size must be an int >= 1, got {queue_size!r}")
        if (
            isinstance(actor_timeout, bool)
            or not isinstance(actor_timeout, int | float)
            or not 0 < actor_timeout < float("inf")
        ):
            raise ValueError(f"actor_timeout must be seconds > 0, got {actor_timeout!r}")
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
            raise ValueError(f"max_restarts must be an int >= 0, got {max_restarts!r}")
        self.num_workers, self.sync = num_workers, bool(sync)
        self.num_envs, self.frames_per_batch = num_envs, frames_per_batch
        self.device = None if device is None else torch.device(device)
        self.policy = policy
        self.version = 0
        self.lags: list[float] = []
        self.actor_timeout, self.max_restarts = float(actor_timeout), max_restarts
        self._base_seed = seed
        #: workers replaced so far
        self.restarts = 0
        #: the slowest batch a worker has reported, in seconds
        self.slowest_batch_s = 0.0
        self._ctx = ctx = mp.get_context(start_method)
        if start_method == "forkserver":
            ctx.set_forkserver_preload(["rlkit.data.async_collect", "rlkit.data.collector"])
        # .to("cpu"), not .cpu(): TorchRL's modules move their action specs in .to() alone, and
        # a spec left on the GPU reaches the workers as CUDA tensors (measured on a GPU)
        self._local = copy.deepcopy(policy).to("cpu")
        self._shared = {
            k: v.detach().cpu().clone().share_memory_() for k, v in self._local.state_dict().items()
        }
        # no lock: a worker stopped or killed while holding one would block the learner's
        # next publication for ever; a sequence count tells a worker its copy was torn
        self._version = ctx.Value("q", 0, lock=False)
        self._seq = ctx.Value("q", 0, lock=False)
        self._stop = ctx.Event()
        self._slot_count = queue_size + 1
        self._env_id, self._env_kwargs = env_id, dict(env_kwargs or {})
        self._per_worker = num_envs // num_workers
        self._steps = frames_per_batch // num_envs
        #: asynchronous mode: batches received and not yet taken, (worker, handle, slot)
        self._ready: deque[tuple[int, _Handle, int]] = deque()
        self._workers: list[_Handle] = []
        self.closed = False
        for i in range(num_workers):
            self._workers.append(self._spawn(i, worker_seed(seed, i)))

    def _spawn(self, index: int, seed: int) -> _Handle:
        mine, theirs = self._ctx.Pipe(duplex=True)
        args = (index, self._env_id, self._per_worker, self._steps, seed, self._local)
        args += (self._shared, self._version, self._seq, theirs, self._stop, self.sync)
        args += (self._slot_count, self._env_kwargs)
        proc = self._ctx.Process(target=_worker, args=args, daemon=True)
        proc.start()
        theirs.close()  # the worker's end lives in the worker: its death reads as EOF here
        return _Handle(proc, mine, seed, held=self._slot_count, since=time.monotonic())

    @property
    def pids(self) -> list[int]:
        """The worker processes' pids, in worker order (replacements in their place)."""
        return [w.proc.pid for w in self._workers]

    @property
    def mean_lag(self) -> float:
        """Mean policy lag over every step consumed so far (0.0 before the first batch)."""
        return sum(self.lags) / len(self.lags) if self.lags else 0.0

    def __iter__(self) -> Iterator[TensorDictBase]:
        while not self.closed:
            yield self.next_batch()

    # ------------------------------------------------------------------ faults
    def hang_timeout(self, first: bool = False) -> float:
        """Seconds without a batch after which a worker that owes one is hung."""
        limit = max(self.actor_timeout, HANG_FACTOR * self.slowest_batch_s)
        return limit + (STARTUP_S if first else 0.0)

    def _owes(self, index: int, waiting: set[int] | None) -> bool:
        return index in waiting if waiting is not None else self._workers[index].held > 0

    def _check(self, waiting: set[int] | None) -> None:
        """Replace each worker that died, or owes a batch and is hung."""
        now = time.monotonic()
        for i, w in enumerate(self._workers):
            code = w.proc.exitcode
            if code is None and w.lost:  # its pipe closed: it is ending
                w.proc.join(timeout=1.0)
                code = w.proc.exitcode
            if code is not None:
                self._replace(i, _why_exited(code), waiting)
                continue
            if w.lost:
                self._replace(i, "closed its pipe", waiting)
                continue
            if not self._owes(i, waiting):
                continue
            waited, limit = now - w.since, self.hang_timeout(first=not w.delivered)
            if waited > limit:
                why = f"delivered no batch for {waited:.0f} s (hung; limit {limit:.0f} s)"
                self._replace(i, why, waiting)

    def _replace(self, index: int, why: str, waiting: set[int] | None) -> None:
        old = self._workers[index]
        if old.proc.is_alive():  # hung (stopped, or stuck in its env): it ends here
            old.proc.kill()
            old.proc.join(timeout=5.0)
        old.conn.close()  # with any batch it sent and the learner did not read
        self._ready = deque(item for item in self._ready if item[1] is not old)
        lost = f"collector worker {index} (pid {old.proc.pid}) {why}"
        if self.restarts >= self.max_restarts:
            raise ActorLost(
                f"{lost}, and the {self.max_restarts} restart(s) --max-actor-restarts allows "
                "were used"
            )
        self.restarts += 1
        seed = worker_seed(self._base_seed, index) + RESTART_SEED * self.restarts
        new = self._workers[index] = self._spawn(index, seed)
        if waiting is not None and index in waiting:  # this round's rollout, by the new one
            new.conn.send("go")
        _log.warning(
            f"warning: {lost}: replaced by pid {new.proc.pid} (restart {self.restarts} of "
            f"{self.max_restarts}; its unfinished batch dropped)"
        )

    # ------------------------------------------------------------------ batches
    def _receive(self, index: int, waiting: set[int] | None, parts: dict) -> None:
        """One message from worker ``index`` (a batch, its slots or its env's fault)."""
        w = self._workers[index]
        try:
            msg = w.conn.recv()
        except (EOFError, OSError):  # it died: _check replaces it
            w.lost = True
            return
        if msg[0] == "layout":  # its first batch's: the learner allocates its slots
            w.slots = _allocate(msg[1], self._slot_count)
            w.conn.send(("slots", w.slots))
            return
        if msg[0] == "fault":
            raise EnvFault(msg[1])
        slot, seconds = msg
        w.held -= 1
        w.since, w.delivered = time.monotonic(), True
        self.slowest_batch_s = max(self.slowest_batch_s, float(seconds))
        if waiting is None:
            self._ready.append((index, w, slot))
        else:
            waiting.discard(index)
            parts[index] = (index, w, slot)

    def _gather(self) -> list[tuple[int, _Handle, int]]:
        """This batch's worker batches: one per worker, in worker order (synchronous mode),
        or the first ``num_workers`` delivered (asynchronous)."""
        waiting = set(range(self.num_workers)) if self.sync else None
        parts: dict[int, tuple[int, _Handle, int]] = {}
        if waiting is not None:
            now = time.monotonic()
            for w in self._workers:
                w.conn.send("go")
                w.since = now
        # once at least, without waiting: a learner fed by the other workers also checks
        # for a hung one (what has arrived is read first, so a worker whose batch waits
        # unread is not taken for hung)
        timeout = 0.0
        while timeout == 0.0 or len(self._ready if waiting is None else parts) < self.num_workers:
            live = [i for i in range(self.num_workers) if not self._workers[i].lost]
            if waiting is not None:
                live = [i for i in live if i in waiting]
            conns = {self._workers[i].conn: i for i in live}
            for conn in mp_connection.wait(list(conns), timeout=timeout):
                self._receive(conns[conn], waiting, parts)
            self._check(waiting)
            timeout = _POLL_S
        if waiting is not None:
            return [parts[i] for i in range(self.num_workers)]
        return [self._ready.popleft() for _ in range(self.num_workers)]

    def next_batch(self) -> TensorDictBase:
        """One learner batch ``[num_envs, T]`` (see the module docstring)."""
        parts = self._gather()
        tds = [w.slots[slot] for _, w, slot in parts]
        # copy out of shared memory, then hand the slots back to their workers
        batch = torch.cat(tds, dim=0) if len(tds) > 1 else tds[0].clone()
        per_worker = self._per_worker
        env_ids = torch.cat([torch.arange(per_worker) + i * per_worker for i, _, _ in parts])
        batch.set(ENV_ID, env_ids[:, None].expand(batch.batch_size).clone())
        for i, w, slot in parts:
            if self._workers[i] is w and not w.lost:  # a replaced worker's slots go with it
                if w.held == 0:
                    w.since = time.monotonic()
                w.held += 1
                try:
                    w.conn.send(slot)
                except OSError:
                    w.lost = True
        batch.names = [None, "time"]
        lag = self.version - batch.get(POLICY_VERSION)
        batch.set(POLICY_LAG, lag)
        self.lags.append(float(lag.float().mean()))
        return batch if self.device is None else batch.to(self.device)

    @torch.no_grad()
    def update_policy_weights_(self) -> None:
        """Publish the learner policy's parameters and buffers; version += 1."""
        state = self.policy.state_dict()
        self._seq.value += 1  # odd: being written
        for k, v in self._shared.items():
            v.copy_(state[k])
        self._version.value += 1
        self._seq.value += 1
        self.version += 1

    def shutdown(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._stop.set()
        procs = [w.proc for w in self._workers]
        for w in self._workers:
            with contextlib.suppress(OSError):
                w.conn.send(None)
        # 3 s for all the workers together, then SIGTERM, then SIGKILL: a worker stopped by
        # SIGSTOP (or hung in its env) ignores SIGTERM until continued, and Python's exit
        # joins every child it has: without the SIGKILL a second Ctrl-C never ended the run
        # (the same when a second Ctrl-C interrupts the wait)
        try:
            deadline = time.monotonic() + _JOIN_S
            for proc in procs:
                if _stopped(proc.pid):  # SIGSTOP: it would only use up the wait
                    proc.kill()
                proc.join(timeout=max(0.0, deadline - time.monotonic()))
        finally:
            for ending in ("terminate", "kill"):
                alive = [proc for proc in procs if proc.is_alive()]
                for proc in alive:
                    getattr(proc, ending)()
                for proc in alive:
                    proc.join(timeout=1.0)
        for w in self._workers:
            w.conn.close()


def _stopped(pid: int | None) -> bool:
    """True when process ``pid`` is stopped (SIGSTOP, a debugger: Linux /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


@dataclass(frozen=True)
class WorkerEnvs:
    """The envs a :class:`WorkerCollector` of a learner builds (its ``worker_envs``, which
    :func:`worker_collector_factory` reads): ``make_env(env_id, num_envs=..., seed=...,
    **env_kwargs)`` split over the workers.

    Args:
        env_id: a gymnasium id, or an env factory's import path ``module:qualname``.
        num_envs: the rank's envs, when the learner's env does not say (it is batched).
        seed: the run's seed: a rank's workers start from ``seed + 1000 * rank`` when the
            engine passes no seed of its own.
        env_kwargs: extra ``make_env`` arguments (``env_kwargs``, ``max_episode_steps``, ...).
    """

    env_id: str
    num_envs: int
    seed: int
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)


def worker_collector_factory(
    *,
    num_workers: int,
    sync: bool,
    env_kwargs: Mapping[str, Any] | None = None,
    actor_timeout: float = 30.0,
    max_restarts: int = 3,
) -> Callable[[Any, Any, Any], WorkerCollector]:
    """``make_collector`` for :func:`rlkit.training.run`: a :class:`WorkerCollector` over the
    rank's env count and frames per batch, its workers seeded from the engine's ``seed`` for
    the rank (``--seed + 1000 * rank``, plus the frames trained when a run resumes), as the
    engine's own env; the envs are the learner's ``worker_envs`` (:class:`WorkerEnvs`),
    ``env_kwargs`` (when given) in place of theirs; ``actor_timeout`` and ``max_restarts``
    as :class:`WorkerCollector` takes them."""
    return partial(
        _build,
        num_workers=num_workers,
        sync=sync,
        env_kwargs=env_kwargs,
        faults={"actor_timeout": actor_timeout, "max_restarts": max_restarts},
    )


def _build(env, learner, device, *, num_workers, sync, env_kwargs, faults, seed=None):
    if learner.collects_in_process:
        # the learner's env and policy stand for the workers already (a population's env
        # holds every member's workers' sub-envs, seeded as theirs, and its policy samples
        # each worker's block from that worker's stream): collect in this process
        if not sync:
            raise ValueError(
                f"{learner.algo}: collecting in this process needs --sync-collect true "
                "(--population / --sweep)"
            )
        from rlkit.data.collector import make_collector

        return make_collector(
            env,
            learner.collect_policy(),
            frames_per_batch=learner.frames_per_batch,
            total_frames=-1,
            device=device,
        )
    envs: WorkerEnvs | None = getattr(learner, "worker_envs", None)
    if envs is None:
        raise TypeError(
            f"{type(learner).__name__} has no worker_envs (a WorkerEnvs naming the env the "
            "workers build): the worker collector needs one, as IMPALA's and APPO's builds give"
        )
    if seed is None:
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        seed = envs.seed + 1000 * rank
    return WorkerCollector(
        env_id=envs.env_id,
        policy=learner.collect_policy(),
        num_envs=int(env.batch_size[0]) if env.batch_size else envs.num_envs,
        frames_per_batch=learner.frames_per_batch,
        num_workers=num_workers,
        sync=sync,
        seed=seed,
        device=device,
        # --env-kwargs / --max-episode-steps reach the workers' envs as the engine's own
        env_kwargs=envs.env_kwargs if env_kwargs is None else env_kwargs,
        **faults,
    )
