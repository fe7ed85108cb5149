r"""Multi-process collection for V-trace learners (IMPALA, APPO), asynchronous or synchronous.

:class:`WorkerCollector` runs ``num_workers`` worker processes. Each owns a slice of the
rank's envs (``make_env(env_id, num_envs=num_envs // num_workers)``), a CPU copy of the
collection policy and an in-process :class:`~rlkit.data.collector.VectorEnvCollector`, and
sends ``[n, T]`` batches back through a queue. The learner publishes weights (parameters
*and* buffers, so observation-normaliser statistics travel with them) into shared memory
with :meth:`WorkerCollector.update_policy_weights_`, which also increments the learner's
policy version :math:`k`. A worker loads the newest weights before each rollout and stamps
every step with the version it acted with, :math:`v`.

* ``sync=False`` (asynchronous, IMPALA's actor-learner split): workers collect all the
  time; a batch is the first ``num_workers`` worker batches in the queue (any worker),
  concatenated along the env dim. Acting overlaps learning, so data lags the learner.
* ``sync=True``: after each weight update every worker collects exactly one rollout with
  the new weights, and the learner waits for all of them (ordered by worker): no overlap,
  zero lag, deterministic for fixed seeds. The same processes and env count, so the two
  modes compare fairly (``benchmarks/bench_async.py``).

Batches travel through shared memory: each worker allocates ``queue_size + 1`` shared
TensorDict slots from its first batch and afterwards sends only ``(worker, slot)`` through
the queue; the learner copies the slot out and hands it back. Pickling each batch through
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

import copy
import queue
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
import torch.multiprocessing as mp
from tensordict import TensorDictBase
from torch import nn

from rlkit import keys

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

_POLL_S = 0.05
#: how long :meth:`WorkerCollector.shutdown` waits for its workers to end on their own
_JOIN_S = 3.0


def _running(stop) -> bool:
    """Keep working: not stopped, and the learner that started this worker is alive (a
    SIGKILLed learner never sets ``stop``; without this check its workers would live on)."""
    if stop.is_set():
        return False
    parent = mp.parent_process()
    return parent is None or parent.is_alive()


def _put(q, item, stop) -> bool:
    while _running(stop):
        try:
            q.put(item, timeout=_POLL_S)
            return True
        except queue.Full:
            continue
    return False


def _get(q, stop):
    while _running(stop):
        try:
            return q.get(timeout=_POLL_S)
        except queue.Empty:
            continue
    return None


def _worker(
    index: int,
    env_id: str,
    num_envs: int,
    steps: int,
    seed: int,
    policy: nn.Module,
    shared: Mapping[str, torch.Tensor],
    version,
    lock,
    out_q,
    go_q,
    free_q,
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
    from rlkit.envs import make_env

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    env = make_env(env_id, num_envs=num_envs, seed=seed, **env_kwargs)
    collector = make_collector(env, policy, frames_per_batch=num_envs * steps)
    batches = iter(collector)
    local = -1
    buffers: list[TensorDictBase] = []  # shared-memory slots, made from the first batch
    free = list(range(slots))
    try:
        while _running(stop):
            if sync:
                try:
                    if go_q.get(timeout=_POLL_S) is None:
                        break
                except queue.Empty:
                    continue
            # a free slot first, then the newest weights: the rollout acts with the weights
            # current when it starts, and at most `slots` batches wait for the learner
            slot = free.pop() if free else _get(free_q, stop)
            if slot is None:
                break
            if version.value != local:
                with lock:
                    policy.load_state_dict(shared)
                    local = version.value
            batch = next(batches)
            batch.set(POLICY_VERSION, torch.full(batch.batch_size, local, dtype=torch.int64))
            if not buffers:
                buffers = [batch.clone().share_memory_() for _ in range(slots)]
                if not _put(out_q, ("slots", index, buffers), stop):
                    break
            buffers[slot].update_(batch)
            if not _put(out_q, (index, slot), stop):
                break
    finally:
        collector.shutdown()
        env.close()


class WorkerCollector:
    """Collect in worker processes; see the module docstring.

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
        self.num_workers, self.sync = num_workers, bool(sync)
        self.num_envs, self.frames_per_batch = num_envs, frames_per_batch
        self.device = None if device is None else torch.device(device)
        self.policy = policy
        self.version = 0
        self.lags: list[float] = []
        ctx = mp.get_context(start_method)
        if start_method == "forkserver":
            ctx.set_forkserver_preload(["rlkit.data.async_collect", "rlkit.data.collector"])
        # .to("cpu"), not .cpu(): TorchRL's modules move their action specs in .to() alone, and
        # a spec left on the GPU reaches the workers as CUDA tensors (measured on a GPU)
        local = copy.deepcopy(policy).to("cpu")
        self._shared = {
            k: v.detach().cpu().clone().share_memory_() for k, v in local.state_dict().items()
        }
        self._version = ctx.Value("q", 0)
        self._lock = ctx.Lock()
        self._stop = ctx.Event()
        self._out = ctx.Queue()
        self._go = [ctx.Queue() for _ in range(num_workers)]
        self._free = [ctx.Queue() for _ in range(num_workers)]
        self._slots: dict[int, list[TensorDictBase]] = {}
        per_worker = num_envs // num_workers
        steps = frames_per_batch // num_envs
        self._procs = []
        for i in range(num_workers):
            args = (i, env_id, per_worker, steps, worker_seed(seed, i), local, self._shared)
            args += (self._version, self._lock, self._out, self._go[i], self._free[i])
            args += (self._stop, self.sync, queue_size + 1, dict(env_kwargs or {}))
            proc = ctx.Process(target=_worker, args=args, daemon=True)
            proc.start()
            self._procs.append(proc)
        self.closed = False

    @property
    def mean_lag(self) -> float:
        """Mean policy lag over every step consumed so far (0.0 before the first batch)."""
        return sum(self.lags) / len(self.lags) if self.lags else 0.0

    def __iter__(self) -> Iterator[TensorDictBase]:
        while not self.closed:
            yield self.next_batch()

    def _get(self) -> tuple[int, int]:
        """The next ``(worker, slot)`` message; registers a worker's slots on its first."""
        while True:
            try:
                item = self._out.get(timeout=1.0)
                if item[0] == "slots":
                    self._slots[item[1]] = item[2]
                    continue
                return item
            except queue.Empty:
                dead = [i for i, p in enumerate(self._procs) if not p.is_alive()]
                if dead:
                    raise RuntimeError(
                        f"collector worker(s) {dead} exited (exit codes "
                        f"{[self._procs[i].exitcode for i in dead]}); see their stderr"
                    ) from None

    def next_batch(self) -> TensorDictBase:
        """One learner batch ``[num_envs, T]`` (see the module docstring)."""
        if self.sync:
            for go in self._go:
                go.put(True)
        parts = [self._get() for _ in range(self.num_workers)]
        if self.sync:
            parts.sort(key=lambda item: item[0])
        tds = [self._slots[i][slot] for i, slot in parts]
        # copy out of shared memory, then hand the slots back to their workers
        batch = torch.cat(tds, dim=0) if len(tds) > 1 else tds[0].clone()
        per_worker = self.num_envs // self.num_workers
        env_ids = torch.cat([torch.arange(per_worker) + i * per_worker for i, _ in parts])
        batch.set(ENV_ID, env_ids[:, None].expand(batch.batch_size).clone())
        for i, slot in parts:
            self._free[i].put(slot)
        batch.names = [None, "time"]
        lag = self.version - batch.get(POLICY_VERSION)
        batch.set(POLICY_LAG, lag)
        self.lags.append(float(lag.float().mean()))
        return batch if self.device is None else batch.to(self.device)

    @torch.no_grad()
    def update_policy_weights_(self) -> None:
        """Publish the learner policy's parameters and buffers; version += 1."""
        state = self.policy.state_dict()
        with self._lock:
            for k, v in self._shared.items():
                v.copy_(state[k])
            self._version.value += 1
        self.version += 1

    def shutdown(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._stop.set()
        for go in self._go:
            go.put(None)
        # 3 s for all the workers together, then SIGTERM, then SIGKILL: a worker stopped by
        # SIGSTOP (or hung in its env) ignores SIGTERM until continued, and Python's exit
        # joins every child it has: without the SIGKILL a second Ctrl-C never ended the run
        # (the same when a second Ctrl-C interrupts the wait)
        try:
            deadline = time.monotonic() + _JOIN_S
            for proc in self._procs:
                if _stopped(proc.pid):  # SIGSTOP: it would only use up the wait
                    proc.kill()
                proc.join(timeout=max(0.0, deadline - time.monotonic()))
        finally:
            for ending in ("terminate", "kill"):
                alive = [proc for proc in self._procs if proc.is_alive()]
                for proc in alive:
                    getattr(proc, ending)()
                for proc in alive:
                    proc.join(timeout=1.0)
        for q in (self._out, *self._go, *self._free):
            q.cancel_join_thread()
            q.close()


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
    *, num_workers: int, sync: bool, env_kwargs: Mapping[str, Any] | None = None
) -> Callable[[Any, Any, Any], WorkerCollector]:
    """``make_collector`` for :func:`rlkit.training.run`: a :class:`WorkerCollector` over the
    rank's env count and frames per batch, its workers seeded from the engine's ``seed`` for
    the rank (``--seed + 1000 * rank``, plus the frames trained when a run resumes), as the
    engine's own env; the envs are the learner's ``worker_envs`` (:class:`WorkerEnvs`),
    ``env_kwargs`` (when given) in place of theirs."""
    return partial(_build, num_workers=num_workers, sync=sync, env_kwargs=env_kwargs)


def _build(env, learner, device, *, num_workers, sync, env_kwargs, seed=None):
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
    )
