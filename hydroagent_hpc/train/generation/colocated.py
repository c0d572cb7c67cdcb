"""The colocated layout (``generator: colocated``): an inference engine inside every trainer process.

Every trainer process (one per GPU) holds one engine (:class:`ColocatedEngine`), asleep (its GPU
memory released) while the trainer updates and awake while the rollouts run; the new weights go to it
in memory, gathered from the FSDP2 shards bucket by bucket, never through the disk. One step:

1. **Sync** (:meth:`ColocatedGenerator.sync`, every rank, where ``engine.push`` used to be): wake the
   engine, then for each bucket of about ``colocated.bucket_mb`` MiB of parameters (each gathered
   whole from its shards, ``DTensor.full_tensor``, a collective, and cast to the run's compute dtype:
   bf16 on a GPU, fp32 on the CPU) hand it to the engine; the last bucket says so (the engine flushes
   its prefix cache then). Afterwards one layer (the last decoder layer's ``mlp.down_proj.weight``,
   which neither SGLang nor vLLM fuses with another) is read back from the engine and its checksum
   compared with the trainer's (:func:`tensor_digest`); a difference stops the run
   (:class:`WeightSyncError`).
2. **Rollouts** (rank 0, as with every generator): the groups are spread over the engines that are
   alive, a whole group on one engine (its members share the prompt: the engine's prefix cache holds
   it once); :meth:`ColocatedGenerator.routes` gives each rollout the route to its group's engine.
   Each turn is one request from the rollout's own thread (the engine batches the requests in
   flight). Simulations run where they always run (the MPI ranks, the process pool or the rollout
   threads) and never wait for a GPU. An engine on another rank is reached through a small
   authenticated socket service on that rank (:class:`EngineService`, :class:`RemoteEngine`), which
   answers while that rank's main thread waits for rank 0's batch.
3. **Sleep** (every rank, once the batch is shared): the engine releases its memory.
   :meth:`ColocatedGenerator.check_released`, called by the trainer at the top of its optimisation
   step, refuses to train while an engine of this process holds memory.

With ``colocated.awake_while_training`` (:attr:`ColocatedGenerator.awake_while_training`; what
``max_staleness: 1`` needs) step 3 is left out: the engine keeps its weights and KV pool beside the
trainer (the memory plan counts both, ``train/memory_plan.py``), never sleeps nor wakes after its
construction, and :meth:`~ColocatedGenerator.check_released` lets the trainer optimise beside it. Rank 0
then plays the next step's rollouts on the engines while the trainers optimise
(:class:`~hydroagent_hpc.train.grpo.overlap.RolloutsAhead`), sampled by the weights of the last sync, and
joins that thread before the next sync: a sync never runs while a turn is in flight on its engine (the
stand-in refuses it).

An engine that fails (its ``generate`` raises: the scheduler process died, the rank went away) is
marked lost: its rollouts in flight and the later turns of its rollouts end with
:class:`EngineLostError` (recorded as failed rollouts, not trained on), the step goes on with the
others, and later steps spread the groups over the engines left. When none is left the run stops with
one line naming each engine's failure.

Backends (``colocated.backend``; :data:`BACKENDS`): ``sglang`` (``sglang.Engine``), ``vllm``
(``vllm.LLM``), both imported only when chosen (:mod:`hydroagent_hpc.train.generation.colocated_engines`
names the calls and the versions read), and ``standin``: :class:`StandinEngine`, an in-process CPU
engine over our own sampler that enforces the real engines' call order and state (generate or update
while asleep, wake twice, sleep twice, generate before a complete weight sync are errors, and a sync
must deliver every parameter exactly once), so that a wrong order in the trainer fails a test.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import socket
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

import torch

from hydroagent_hpc.errors import one_line
from hydroagent_hpc.train.generation.colocated_config import ColocatedSettings
from hydroagent_hpc.train.generation.colocated_engines import (
    ColocatedEngine,
    ColocatedError,
    EngineLostError,
    EngineOrderError,
    EngineSpec,
    SGLangEngine,
    StandinEngine,
    VLLMEngine,
    WeightSyncError,
    tensor_digest,
)
from hydroagent_hpc.train.generation.sampler import GenerationServer, Sample, Sampling

log = logging.getLogger(__name__)

__all__ = ["EngineHandle", "RemoteEngine", "EngineService", "ColocatedGenerator", "Routes", "BACKENDS",
           "weight_buckets", "checksum_name", "assign_groups", "for_run", "ColocatedEngine", "ColocatedError",
           "EngineLostError", "EngineOrderError", "EngineSpec", "StandinEngine", "WeightSyncError", "tensor_digest"]


# ---------------------------------------------------------------------------------------------
# Weights


def checksum_name(names: Sequence[str]) -> str:
    """The parameter compared after each sync: the last decoder layer's ``mlp.down_proj.weight`` (a whole
    layer's matrix that no engine fuses with another), else the last parameter."""
    downs = [n for n in names if n.endswith("mlp.down_proj.weight")]
    return downs[-1] if downs else names[-1]


def weight_buckets(model: torch.nn.Module, bucket_bytes: int, dtype: torch.dtype
                   ) -> Iterator[tuple[list[tuple[str, torch.Tensor]], bool]]:
    """``(bucket, last)``: the model's parameters, each whole (an FSDP2 shard is gathered with
    ``full_tensor()``, a collective every rank runs in the same order) and cast to ``dtype``, in
    buckets of at least ``bucket_bytes`` (one larger tensor alone) in ``named_parameters`` order."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    pending: list[tuple[str, torch.Tensor]] | None = None
    for name, param in model.named_parameters():
        tensor = param.detach()
        if hasattr(tensor, "full_tensor"):
            tensor = tensor.full_tensor()
        tensor = tensor.to(dtype)
        bucket.append((name, tensor))
        size += tensor.numel() * tensor.element_size()
        if size >= bucket_bytes:
            if pending is not None:
                yield pending, False
            pending, bucket, size = bucket, [], 0
    if bucket:
        if pending is not None:
            yield pending, False
        pending = bucket
    if pending is not None:
        yield pending, True


def assign_groups(groups: Sequence[int], engines: Sequence[int]) -> dict[int, int]:
    """Group -> engine: the ``i``-th distinct group (in order) on ``engines[i % len(engines)]``, so the
    engines get equal numbers of groups (to one) and every member of a group the same engine."""
    if not engines:
        raise ValueError("no engine to assign groups to")
    order = list(dict.fromkeys(groups))
    return {g: engines[i % len(engines)] for i, g in enumerate(order)}


#: Backend name -> factory of this process's engine (``colocated.backend``). The real engines import their
#: package only when built.
BACKENDS: dict[str, Callable[[EngineSpec], ColocatedEngine]] = {
    "sglang": SGLangEngine, "vllm": VLLMEngine, "standin": StandinEngine}


# ---------------------------------------------------------------------------------------------
# Liveness, and engines on other ranks


class EngineHandle:
    """An engine and whether it is alive: a failed ``generate`` marks it lost (once, logged), and every
    later call to it raises :class:`EngineLostError` at once."""

    def __init__(self, engine: Any, index: int) -> None:
        self.engine = engine
        self.index = index
        self.name = str(getattr(engine, "name", f"engine:{index}"))
        self.failure: str | None = None
        self._lock = threading.Lock()

    @property
    def alive(self) -> bool:
        return self.failure is None

    def lost(self, reason: str) -> EngineLostError:
        with self._lock:
            if self.failure is None:
                self.failure = reason
                log.error("colocated engine %s failed: %s; its rollouts are recorded as failed, the step goes on "
                          "with the other engines", self.name, reason)
        return EngineLostError(f"colocated engine {self.name} failed: {self.failure}",
                               "see the trainer's log; the step goes on with the other engines")

    def generate(self, ids: Sequence[int], seed: int | None, sampling: Sampling, stop_ids: Sequence[int],
                 key: Hashable | None = None) -> Sample:
        if self.failure is not None:
            raise self.lost(self.failure)
        try:
            sample: Sample = self.engine.generate(ids, seed, sampling, stop_ids, key)
            return sample
        except EngineLostError as exc:
            raise self.lost(exc.message) from None
        except Exception as exc:
            raise self.lost(f"{type(exc).__name__}: {one_line(exc)}") from exc


class EngineService:
    """This rank's engine answering rank 0's rollouts: a listener on ``(host, port)`` (authenticated with
    the run's key), one thread per connection, each request ``("generate", ids, seed, sampling, stop_ids,
    key)`` answered ``("ok", Sample)`` or ``("lost", reason)``. Runs from setup to :meth:`close`."""

    def __init__(self, handle: EngineHandle, authkey: bytes, host: str = "") -> None:
        self.handle = handle
        self._listener = Listener((host or "0.0.0.0", 0), authkey=authkey)
        port = int(self._listener.address[1])
        self.address = (host or socket.gethostname(), port)
        self._open = True
        self._thread = threading.Thread(target=self._accept, name=f"engine-service-{handle.index}", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while self._open:
            try:
                conn = self._listener.accept()
            except (OSError, EOFError):
                return
            except Exception:  # a client without the key (AuthenticationError): refuse it, keep serving
                log.warning("engine service %s: a connection without the run's key was refused", self.handle.name)
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: Connection) -> None:
        with conn:
            while True:
                try:
                    request = conn.recv()
                except (EOFError, OSError):
                    return
                _, ids, seed, sampling, stop_ids, key = request
                try:
                    conn.send(("ok", self.handle.generate(ids, seed, sampling, stop_ids, key)))
                except EngineLostError:
                    conn.send(("lost", self.handle.failure or "failed"))

    def close(self) -> None:
        self._open = False
        with contextlib.suppress(OSError):
            self._listener.close()


class RemoteEngine:
    """Rank 0's client of another rank's :class:`EngineService` (one connection per rollout thread)."""

    def __init__(self, index: int, address: tuple[str, int], authkey: bytes, timeout_s: float = 600.0) -> None:
        self.name = f"rank{index}"
        self.address = address
        self.authkey = authkey
        self.timeout_s = float(timeout_s)
        self._local = threading.local()

    def _conn(self) -> Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = Client(self.address, authkey=self.authkey)
        return conn

    def generate(self, ids: Sequence[int], seed: int | None, sampling: Sampling, stop_ids: Sequence[int],
                 key: Hashable | None = None) -> Sample:
        try:
            conn = self._conn()
            conn.send(("generate", list(ids), seed, sampling, list(stop_ids), key))
            if not conn.poll(self.timeout_s):
                raise TimeoutError(f"no answer in {self.timeout_s:g} s")
            status, value = conn.recv()
        except (OSError, EOFError, TimeoutError) as exc:
            self._local.conn = None
            raise EngineLostError(f"{self.name} at {self.address[0]}:{self.address[1]}: {type(exc).__name__}: "
                                  f"{one_line(exc)}", "see that rank's log") from None
        if status != "ok":
            raise EngineLostError(str(value), "see that rank's log")
        sample: Sample = value
        return sample


# ---------------------------------------------------------------------------------------------
# Routing the rollouts


class Routes(GenerationServer):
    """The rollout phase's routes: :meth:`for_group` gives the server of a group's engine. Its ``stats``
    are the phase's: ``busy_s`` (seconds with a request in flight on any engine), ``batches`` and
    ``rows`` (requests), ``max_batch`` (the most in flight at once) and ``tokens``; ``engine_rows``
    counts the requests per engine and ``assignment`` maps each group to its engine's index."""

    def __init__(self, handles: Sequence[EngineHandle], sampling: Sampling, stop_ids: Sequence[int],
                 groups: Sequence[int]) -> None:  # no sampler of its own: the engines sample
        live = [h.index for h in handles if h.alive]
        if not live:
            failures = "; ".join(f"{h.name}: {h.failure}" for h in handles)
            raise EngineLostError(f"every colocated engine has failed ({failures})",
                                  "see the trainer's log; resume from the last checkpoint (--resume)")
        self.handles = {h.index: h for h in handles}
        self.sampling = sampling
        self.stop_ids = tuple(int(i) for i in stop_ids)
        self.assignment = assign_groups(groups, live)
        self._lock = threading.Lock()
        self._in_flight = 0
        self._since = 0.0
        self.stats = {"batches": 0, "rows": 0, "max_batch": 0, "busy_s": 0.0, "tokens": 0}
        self.engine_rows = {h.name: 0 for h in handles}

    def __enter__(self) -> Routes:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def for_group(self, group: int) -> _Route:
        return _Route(self, self.handles[self.assignment[group]])

    def generate(self, ids: Sequence[int], seed: int | None, key: Hashable | None = None,
                 forced: Sequence[int] | None = None) -> Sample:
        raise RuntimeError("a colocated rollout asks its group's route (Routes.for_group), not the routes")

    def _begin(self) -> float:
        with self._lock:
            now = time.perf_counter()
            if self._in_flight == 0:
                self._since = now
            self._in_flight += 1
            self.stats["max_batch"] = max(self.stats["max_batch"], self._in_flight)
            return now

    def _end(self, handle: EngineHandle, sample: Sample | None) -> None:
        with self._lock:
            self._in_flight -= 1
            if self._in_flight == 0:
                self.stats["busy_s"] += time.perf_counter() - self._since
            self.stats["batches"] += 1
            self.stats["rows"] += 1
            self.stats["tokens"] += len(sample.ids) if sample is not None else 0
            self.engine_rows[handle.name] += 1


class _Route(GenerationServer):
    """One rollout's way to its group's engine (the interface RolloutPolicy calls)."""

    def __init__(self, routes: Routes, handle: EngineHandle) -> None:  # no batching thread: the engine batches
        self.routes = routes
        self.handle = handle
        self.stats = routes.stats

    def __enter__(self) -> _Route:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def generate(self, ids: Sequence[int], seed: int | None, key: Hashable | None = None,
                 forced: Sequence[int] | None = None) -> Sample:
        if forced is not None:
            raise ValueError("forced ids are not supported by an engine (use generator: local)")
        self.routes._begin()
        sample: Sample | None = None
        try:
            sample = self.handle.generate(list(ids), seed, self.routes.sampling, self.routes.stop_ids, key)
            return sample
        finally:
            self.routes._end(self.handle, sample)


# ---------------------------------------------------------------------------------------------
# The layout


class ColocatedGenerator:
    """This process's engine and, on rank 0, the routes to every rank's engine (see the module doc).

    Build it with :meth:`start` (every rank; a collective when several ranks train). ``journal`` holds
    ``(who, event)`` entries in order: each engine's calls (the stand-in's) and this layout's
    ``("trainer", "train")`` when :meth:`check_released` passes. ``awake_while_training``: the engine is
    never put to sleep, and the trainer optimises beside it (``colocated.awake_while_training``).
    """

    def __init__(self, engine: Any, *, bucket_bytes: int, dtype: torch.dtype, rank: int = 0,
                 remotes: Sequence[tuple[str, int]] = (), authkey: bytes = b"", journal: list[tuple[str, str]]
                 | None = None, service_host: str = "", awake_while_training: bool = False) -> None:
        self.local = EngineHandle(engine, rank)
        self.rank = rank
        self.awake_while_training = bool(awake_while_training)
        self.bucket_bytes = int(bucket_bytes)
        self.dtype = dtype
        self.journal: list[tuple[str, str]] = journal if journal is not None else []
        self.service: EngineService | None = None
        self.handles: list[EngineHandle] = [self.local]
        if rank == 0:
            self.handles += [EngineHandle(RemoteEngine(r, addr, authkey), r) for r, addr in enumerate(remotes, 1)]
        self.syncs = 0
        self.last_sync_s = float("nan")
        self.checked = ""

    @classmethod
    def start(cls, backend: str, spec: EngineSpec, *, bucket_bytes: int, world: int = 1, rank: int = 0,
              awake_while_training: bool = False) -> ColocatedGenerator:
        """This rank's engine from ``backend``; with several ranks the services and their addresses are
        exchanged (a collective: every rank calls it)."""
        engine = BACKENDS[backend](spec)
        if world == 1:
            return cls(engine, bucket_bytes=bucket_bytes, dtype=spec.dtype, rank=rank, journal=spec.journal,
                       awake_while_training=awake_while_training)
        import torch.distributed as dist

        box: list[Any] = [secrets.token_bytes(32) if rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        authkey = bytes(box[0])
        me = cls(engine, bucket_bytes=bucket_bytes, dtype=spec.dtype, rank=rank, journal=spec.journal,
                 awake_while_training=awake_while_training)
        if rank != 0:
            me.service = EngineService(me.local, authkey)
        addresses: list[Any] = [None] * world
        dist.all_gather_object(addresses, me.service.address if me.service is not None else None)
        if rank == 0:
            me.handles += [EngineHandle(RemoteEngine(r, tuple(addresses[r]), authkey), r) for r in range(1, world)]
        return me

    # -- the step's phases -------------------------------------------------------------------
    def sync(self, model: torch.nn.Module, step: int) -> float:
        """Wake this process's engine and hand it the model's weights, bucket by bucket (a collective
        under FSDP2: every rank calls it), then compare one layer's checksum; the seconds it took."""
        t0 = time.perf_counter()
        engine = self.local.engine if self.local.alive else None
        if engine is not None and not engine.holds_memory:
            engine.wake()
        names = [n for n, _ in model.named_parameters()]
        probe = checksum_name(names)
        expected = None
        buckets = 0
        for bucket, last in weight_buckets(model, self.bucket_bytes, self.dtype):
            buckets += 1
            for name, tensor in bucket:
                if name == probe:
                    expected = tensor_digest(tensor)
            if engine is not None:
                engine.update_weights(bucket, last=last)
        if engine is not None:
            got = engine.checksum(probe)
            if got != expected:
                raise WeightSyncError(f"colocated engine {self.local.name}: after the weight sync of step {step} its "
                                      f"{probe} has checksum {got}, the trainer's is {expected}",
                                      "the engine did not load what it was sent: check the engine version "
                                      "(pyproject extras colocated-sglang / colocated-vllm) and its log")
            self.checked = got
        self.syncs += 1
        self.last_sync_s = time.perf_counter() - t0
        log.debug("colocated engine %s: step %d weights in %d buckets, %.2f s, %s checksum %s", self.local.name,
                  step, buckets, self.last_sync_s, probe, self.checked)
        return self.last_sync_s

    def sleep(self) -> None:
        """Release this process's engine's memory (every rank, after the rollouts). The trainer does not call
        it with :attr:`awake_while_training`."""
        if self.local.alive and self.local.engine.holds_memory:
            self.local.engine.sleep()

    def check_released(self) -> None:
        """The trainer's check before it optimises: no engine of this process holds memory (with
        :attr:`awake_while_training` the engine may: the memory plan counted it beside the trainer)."""
        if self.local.engine.holds_memory and not self.awake_while_training:
            raise ColocatedError(f"colocated engine {self.local.name} holds its memory while the trainer optimises "
                                 f"(rank {self.rank})",
                                 "put the engines to sleep (ColocatedGenerator.sleep) before the optimisation step")
        self.journal.append(("trainer", "train"))

    def routes(self, sampling: Sampling, stop_ids: Sequence[int], groups: Sequence[int]) -> Routes:
        """Rank 0: the rollout phase's routes, the ``groups`` spread over the live engines."""
        return Routes(self.handles, sampling, stop_ids, groups)

    @property
    def alive(self) -> list[str]:
        return [h.name for h in self.handles if h.alive]

    def close(self) -> None:
        if self.service is not None:
            self.service.close()
        with contextlib.suppress(Exception):
            self.local.engine.close()


def for_run(config: Any, model: torch.nn.Module, tokenizer: Any, device: torch.device, dtype: torch.dtype, *,
            planned_fraction: float, world: int = 1, rank: int = 0) -> ColocatedGenerator:
    """This rank's :class:`ColocatedGenerator` for a GRPO config (``generator: colocated``; every rank calls
    it). The weights are handed over in ``dtype``, the run's compute dtype (bf16 on a GPU); the engine's
    memory share is ``colocated.memory_fraction``, else ``planned_fraction``: what the memory plan leaves
    beside the trainer's resident state on this GPU (beside its training peak with ``awake_while_training``)
    (:func:`~hydroagent_hpc.train.memory_plan.colocated_memory_fraction`)."""
    settings = config.colocated or ColocatedSettings()
    fraction = settings.memory_fraction if settings.memory_fraction is not None else planned_fraction
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    spec = EngineSpec(index=rank, model=model, model_path=None if config.model == "tiny" else str(config.model),
                      device=device, dtype=dtype, memory_fraction=fraction,
                      context_tokens=config.max_context_tokens + config.max_new_tokens, seed=config.seed,
                      pad_id=int(pad), max_batch=config.generation_batch, prefix_cache=config.prefix_cache)
    generator = ColocatedGenerator.start(settings.backend, spec, bucket_bytes=settings.bucket_mb * 2**20, world=world,
                                         rank=rank, awake_while_training=settings.awake_while_training)
    log.info("colocated engine %s on %s (memory share %.2f, weights in %s buckets of %d MiB%s)", generator.local.name,
             device, fraction, str(dtype).replace("torch.", ""), settings.bucket_mb,
             ", awake while training" if settings.awake_while_training else "")
    return generator
