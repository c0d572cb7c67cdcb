"""The engines of the colocated layout (:mod:`hydroagent_hpc.train.generation.colocated`): their protocol,
the stand-in, and SGLang's ``Engine`` and vLLM's ``LLM`` inside the trainer process.

:class:`ColocatedEngine` is what the layout drives; :class:`StandinEngine` is an in-process CPU engine
over our own sampler that enforces the real engines' call order and state (tests, laptops).

The real engines import their package only when built (``colocated.backend`` names one): the extras
``colocated-sglang`` and ``colocated-vllm`` in setup.cfg pin the versions whose public source was read
for the calls below. Neither runs in this project's CI (no GPU there); the stand-in engine
(:class:`~hydroagent_hpc.train.generation.colocated.StandinEngine`) follows the same call order, and
``docs/colocated.md`` lists what a GPU check must confirm.

Both are started with ``load_format="dummy"`` (random weights, nothing read from disk: the first sync
replaces them), with the memory share from the memory plan, the run's context length, and this process's
GPU.

**SGLang** (``python/sglang/srt/entrypoints/engine.py``, read at sgl-project/sglang 001067ff, a tree
after 0.5.3; whether 0.5.23, the release the extra pins, spells every call so is for a GPU check):
``Engine(model_path=..., enable_memory_saver=True, mem_fraction_static=..., context_length=...,
base_gpu_id=..., load_format="dummy", random_seed=...)``; sleep and wake are
``release_memory_occupation()`` / ``resume_memory_occupation()`` (every tag: KV cache and weights;
the scheduler asserts it is idle, so the rollouts are over first); a bucket is
``update_weights_from_tensor(named_tensors=[(name, tensor), ...], flush_cache=last)``; the checksum
reads ``get_weights_by_name(name, truncate_size=rows)``. Every synchronous method runs
``self.loop.run_until_complete`` on the engine's own event loop, so they are called from one thread
while that loop is idle; the turns of the rollouts go through ``async_generate(input_ids=...,
sampling_params=..., return_logprob=True)`` submitted to that loop, which a thread of ours runs while
the engine serves (so SGLang batches the requests in flight continuously), and which stops before any
control call. Sampling fields and ``ignore_eos: false`` as for the HTTP path
(:mod:`hydroagent_hpc.train.generation.engine`); ``meta_info.output_token_logprobs`` holds
``(logprob, id, text)`` per generated id. ``SGLANG_RETURN_ORIGINAL_LOGPROB=1`` is set before the engine
starts (its log-probs are then the model's own at any temperature).

**vLLM** (``vllm/entrypoints/llm.py``, read at vllm-project/vllm 10fdb8f0; the extra pins 0.33.0): ``LLM(model=...,
enable_sleep_mode=True, gpu_memory_utilization=..., max_model_len=..., load_format="dummy",
worker_extension_cls=...)`` with ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (the engine core and its worker in
this process, so ``collective_rpc`` hands the bucket's tensors over by reference); sleep and wake are
``sleep(level=1)`` / ``wake_up()``; a bucket is ``collective_rpc("hydro_load_weights", args=(bucket,))``,
a method of :class:`VLLMWeights` (the worker extension: ``model_runner.model.load_weights``), and the
checksum ``collective_rpc("hydro_digest", args=(name,))``; the prefix cache is reset after the last
bucket (``reset_prefix_cache``). ``LLM.generate`` is not thread-safe, so the turns are batched by one
thread of ours (:class:`~hydroagent_hpc.train.generation.sampler.GenerationServer`): the requests
waiting together share one ``generate`` call (``TokensPrompt``, one ``SamplingParams`` with its
``seed`` per row, ``logprobs=0``).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import threading
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from hydroagent_hpc.errors import CannotHealError, ConfigError, HydroAgentError
from hydroagent_hpc.train.generation.engine import finish_sample, top_k_value
from hydroagent_hpc.train.generation.sampler import BatchedSampler, GenerationServer, Sample, Sampling

log = logging.getLogger(__name__)

__all__ = ["ColocatedEngine", "ColocatedError", "EngineOrderError", "EngineLostError", "WeightSyncError",
           "EngineSpec", "StandinEngine", "SGLangEngine", "VLLMEngine", "VLLMWeights", "sglang_params",
           "tensor_digest"]


class ColocatedError(HydroAgentError, RuntimeError):
    """The colocated layout cannot go on (names the engine and the fix)."""

    exit_code = 1


class EngineOrderError(ColocatedError):
    """A call the engine's API does not allow in its state (a wake while awake, a generate while asleep, ...)."""


class EngineLostError(ColocatedError, CannotHealError):
    """The engine failed: the rollouts on it are recorded as failed (the error leaves the episode)."""


class WeightSyncError(ColocatedError):
    """The engine does not hold the weights it was sent (a checksum of one layer differs)."""


class ColocatedEngine(Protocol):
    """What the layout drives in each trainer process (see the module doc for the order).

    ``holds_memory`` is True while the engine is awake. ``update_weights`` takes one bucket of
    ``(name, tensor)`` pairs in the trainer's parameter names; ``last`` marks the sync's last bucket.
    ``checksum(name)`` is :func:`tensor_digest` of the parameter as the engine holds it. ``generate``
    samples one turn after ``ids`` and may be called from many threads at once.
    """

    name: str

    @property
    def holds_memory(self) -> bool: ...

    def wake(self) -> None: ...

    def sleep(self) -> None: ...

    def update_weights(self, bucket: Sequence[tuple[str, torch.Tensor]], *, last: bool) -> None: ...

    def checksum(self, name: str) -> str: ...

    def generate(self, ids: Sequence[int], seed: int | None, sampling: Sampling, stop_ids: Sequence[int],
                 key: Hashable | None = None) -> Sample: ...

    def close(self) -> None: ...


@dataclass
class EngineSpec:
    """What a backend needs to build this process's engine."""

    index: int
    model: Any  # the trainer's Hugging Face model (its config; the weights come by sync)
    model_path: str | None  # a save_pretrained folder the real engines read the config and tokenizer from
    device: torch.device
    dtype: torch.dtype  # the dtype the weights are handed over in
    memory_fraction: float
    context_tokens: int
    seed: int
    pad_id: int
    max_batch: int = 64
    prefix_cache: bool = True
    journal: list[tuple[str, str]] = field(default_factory=list)



# ---------------------------------------------------------------------------------------------
# Weights


def tensor_digest(tensor: torch.Tensor) -> str:
    """A checksum of a tensor's values: SHA-256 of them as float32 (exact for bf16 and fp32 values), 16 hex."""
    values = tensor.detach().to(device="cpu", dtype=torch.float32).contiguous()
    return hashlib.sha256(values.numpy().tobytes()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# The stand-in engine


class StandinEngine:
    """An in-process CPU engine with the real engines' call order and state (see the module doc).

    It holds a copy of the trainer's architecture (``AutoModelForCausalLM.from_config``) whose weights
    come only from :meth:`update_weights`, and samples with
    :class:`~hydroagent_hpc.train.generation.sampler.BatchedSampler` (prefix cache by ``key``) behind
    a :class:`~hydroagent_hpc.train.generation.sampler.GenerationServer` per sampling setting, so the
    requests in flight are batched as an engine batches them. ``journal`` gets one entry per control call
    and ``generate`` / ``generated`` around every turn. A control call (wake, sleep, a bucket, the checksum)
    while a ``generate`` is in flight is an :class:`EngineOrderError`: SGLang's scheduler must be idle
    for them, and vLLM's ``LLM`` is not thread-safe (``in_flight`` counts the turns in flight).
    ``fail_after``: the engine fails (raises) on that many ``generate`` calls from now (tests).
    """

    def __init__(self, spec: EngineSpec, fail_after: int | None = None) -> None:
        from transformers import AutoModelForCausalLM

        self.name = f"standin:{spec.index}"
        self.spec = spec
        self.journal = spec.journal
        with torch.device("cpu"):
            self.model = AutoModelForCausalLM.from_config(spec.model.config).to(spec.dtype).eval()
        self.model.config.use_cache = True
        self._params = dict(self.model.named_parameters())
        self._lock = threading.Lock()
        self._awake = True  # like SGLang's Engine and vLLM's LLM: memory is taken at construction
        self._ready = False  # a complete sync since the last wake
        self._in_sync = False  # buckets of a sync arriving
        self._received: dict[str, int] = {}
        self.syncs: list[list[list[str]]] = []  # per sync, the names of each bucket received
        self._servers: dict[Sampling, GenerationServer] = {}
        self.fail_after = fail_after
        self.generated = 0
        self.in_flight = 0  # generate calls between their start and their answer
        self.requests: list[list[int]] = []  # the ids of every generate call, in order (what tests read)
        self.closed = False

    def _note(self, event: str) -> None:
        self.journal.append((self.name, event))

    def _require(self, awake: bool, what: str) -> None:
        if self.closed:
            raise EngineOrderError(f"{self.name}: {what} after close", "build a new engine")
        if what != "generate" and self.in_flight:
            raise EngineOrderError(f"{self.name}: {what} while {self.in_flight} generate call(s) are in flight",
                                   "join the rollouts (RolloutsAhead.wait) before the engine's weights or "
                                   "memory change")
        if self._awake != awake:
            state = "awake" if self._awake else "asleep"
            raise EngineOrderError(f"{self.name}: {what} while {state}",
                                   "the layout wakes the engine before a sync and puts it to sleep before training")

    @property
    def holds_memory(self) -> bool:
        return self._awake and not self.closed

    def wake(self) -> None:
        with self._lock:
            self._require(False, "wake")
            self._awake, self._ready, self._in_sync = True, False, False
            self._note("wake")

    def sleep(self) -> None:
        with self._lock:
            self._require(True, "sleep")
            self._stop_servers()
            self._awake, self._ready, self._in_sync = False, False, False
            self._note("sleep")

    def update_weights(self, bucket: Sequence[tuple[str, torch.Tensor]], *, last: bool) -> None:
        with self._lock:
            self._require(True, "update_weights")
            if not self._in_sync:
                self._ready, self._in_sync = False, True
                self._received = {}
                self.syncs.append([])
                self._stop_servers()  # the prefix caches hold keys and values of the old weights
            self.syncs[-1].append([name for name, _ in bucket])
            with torch.no_grad():
                for name, tensor in bucket:
                    if name not in self._params:
                        raise EngineOrderError(f"{self.name}: update_weights got {name}, which the model does not have",
                                               "send the trainer's own parameter names")
                    target = self._params[name]
                    if tuple(target.shape) != tuple(tensor.shape):
                        raise EngineOrderError(f"{self.name}: update_weights got {name} of shape "
                                               f"{tuple(tensor.shape)}, the model's is {tuple(target.shape)}",
                                               "send whole (gathered) tensors")
                    target.copy_(tensor.to(device=target.device, dtype=target.dtype))
                    self._received[name] = self._received.get(name, 0) + 1
            self._note("update")
            if last:
                wrong = {n: self._received.get(n, 0) for n in self._params if self._received.get(n, 0) != 1}
                if wrong:
                    self._in_sync = False  # this sync failed; the next update starts another
                    shown = ", ".join(f"{n} x{c}" for n, c in list(wrong.items())[:3])
                    raise EngineOrderError(f"{self.name}: a weight sync must deliver every parameter once; got "
                                           f"{shown} ({len(wrong)} wrong)", "send every bucket exactly once per sync")
                self._ready, self._in_sync = True, False
                self._note("synced")

    def checksum(self, name: str) -> str:
        with self._lock:
            self._require(True, "checksum")
            self._note("checksum")
            return tensor_digest(self._params[name])

    def _server(self, sampling: Sampling, stop_ids: Sequence[int], ids: Sequence[int]) -> GenerationServer:
        with self._lock:
            self._require(True, "generate")
            if not self._ready:
                raise EngineOrderError(f"{self.name}: generate before a complete weight sync since the last wake",
                                       "sync the weights (every bucket, the last marked) before the rollouts")
            server = self._servers.get(sampling)
            if server is None:
                sampler = BatchedSampler(self.model, stop_ids, self.spec.pad_id, sampling,
                                         max_batch=self.spec.max_batch, prefix_cache=self.spec.prefix_cache)
                server = self._servers[sampling] = GenerationServer(sampler).__enter__()
            if self.fail_after is not None:
                if self.fail_after <= 0:
                    raise RuntimeError(f"{self.name}: the scheduler process died (fail_after)")
                self.fail_after -= 1
            self.generated += 1
            self.in_flight += 1
            self.requests.append(list(ids))
            self._note("generate")
            return server

    def generate(self, ids: Sequence[int], seed: int | None, sampling: Sampling, stop_ids: Sequence[int],
                 key: Hashable | None = None) -> Sample:
        server = self._server(sampling, stop_ids, ids)  # counted in flight from here
        try:
            return server.generate(ids, seed, key=key)
        finally:
            with self._lock:
                self.in_flight -= 1
                self._note("generated")

    def _stop_servers(self) -> None:
        for server in self._servers.values():
            server.__exit__(None, None, None)
        self._servers.clear()

    def close(self) -> None:
        with self._lock:
            self._stop_servers()
            self.closed = True



# ---------------------------------------------------------------------------------------------
# SGLang and vLLM


def _missing(package: str, extra: str) -> ConfigError:
    return ConfigError(f"colocated.backend: {package} is not installed in this environment",
                       f"pip install '.[{extra}]' on the GPU nodes (the version pinned there), or use "
                       f"colocated.backend: standin on a CPU")


def _require_gpu(spec: EngineSpec, backend: str) -> None:
    if spec.device.type != "cuda":
        raise ConfigError(f"colocated.backend: {backend} needs a CUDA GPU, the trainer runs on {spec.device}",
                          "use colocated.backend: standin on a CPU")
    if spec.model_path is None:
        raise ConfigError(f"colocated.backend: {backend} needs a model folder (config and tokenizer), "
                          f"model is tiny", "use colocated.backend: standin with model: tiny")


def sglang_params(seed: int | None, sampling: Sampling, stop_ids: Sequence[int]) -> dict[str, Any]:
    """One request's ``sampling_params`` (every value explicit; ``ignore_eos`` false, see the HTTP path)."""
    params: dict[str, Any] = {"temperature": 0.0 if sampling.greedy else sampling.temperature,
                              "top_p": 1.0 if sampling.greedy else sampling.top_p, "top_k": top_k_value(sampling),
                              "min_p": 0.0, "repetition_penalty": 1.0, "max_new_tokens": sampling.max_new_tokens,
                              "stop_token_ids": list(stop_ids), "ignore_eos": False, "skip_special_tokens": False,
                              "no_stop_trim": True}
    if seed is not None and not sampling.greedy:
        params["sampling_seed"] = int(seed) & 0x7FFFFFFF
    return params


class SGLangEngine:
    """``sglang.Engine`` behind the colocated protocol (module doc)."""

    def __init__(self, spec: EngineSpec) -> None:
        _require_gpu(spec, "sglang")
        os.environ.setdefault("SGLANG_RETURN_ORIGINAL_LOGPROB", "1")
        try:
            import sglang
        except ImportError:
            raise _missing("sglang", "colocated-sglang") from None
        self.name = f"sglang:{spec.index}"
        self.engine = sglang.Engine(model_path=spec.model_path, enable_memory_saver=True,
                                    mem_fraction_static=spec.memory_fraction, context_length=spec.context_tokens,
                                    base_gpu_id=spec.device.index or 0, load_format="dummy", random_seed=spec.seed,
                                    log_level="error")
        self._awake = True
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def holds_memory(self) -> bool:
        return self._awake

    def _serving(self) -> asyncio.AbstractEventLoop:
        """The engine's loop, run by a thread of ours while the rollouts send requests."""
        loop: asyncio.AbstractEventLoop = self.engine.loop
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=loop.run_forever, name="sglang-loop", daemon=True)
                self._thread.start()
        return loop

    def _control(self) -> None:
        """Stop serving (the synchronous API runs the loop itself)."""
        with self._lock:
            if self._thread is not None:
                loop: asyncio.AbstractEventLoop = self.engine.loop
                loop.call_soon_threadsafe(loop.stop)
                self._thread.join()
                self._thread = None

    def wake(self) -> None:
        if self._awake:
            raise EngineOrderError(f"{self.name}: wake while awake", "sleep first")
        self._control()
        self.engine.resume_memory_occupation()
        self._awake = True

    def sleep(self) -> None:
        self._control()
        self.engine.release_memory_occupation()
        self._awake = False

    def update_weights(self, bucket: Sequence[tuple[str, torch.Tensor]], *, last: bool) -> None:
        self._control()
        answer = self.engine.update_weights_from_tensor(named_tensors=list(bucket), flush_cache=last)
        ok = answer[0] if isinstance(answer, tuple) else getattr(answer, "success", True)
        if not ok:
            raise EngineOrderError(f"{self.name}: update_weights_from_tensor refused a bucket ({answer})",
                                   "see the engine's log")

    def checksum(self, name: str) -> str:
        self._control()
        values = self.engine.get_weights_by_name(name, truncate_size=1 << 30)
        if values is None:
            raise EngineOrderError(f"{self.name}: get_weights_by_name({name}) answered nothing",
                                   "use the pinned SGLang version (colocated-sglang extra)")
        return tensor_digest(torch.tensor(values, dtype=torch.float32))

    def generate(self, ids: Sequence[int], seed: int | None, sampling: Sampling, stop_ids: Sequence[int],
                 key: Hashable | None = None) -> Sample:
        loop = self._serving()
        coro = self.engine.async_generate(input_ids=list(ids), sampling_params=sglang_params(seed, sampling, stop_ids),
                                          return_logprob=True)
        out = asyncio.run_coroutine_threadsafe(coro, loop).result()
        entries = out["meta_info"]["output_token_logprobs"]
        ids_out, lps = [int(e[1]) for e in entries], [float(e[0]) for e in entries]
        return finish_sample(ids_out, lps, stop_ids, sampling.max_new_tokens)

    def close(self) -> None:
        self._control()
        self.engine.shutdown()


class VLLMWeights:
    """vLLM's worker extension (``worker_extension_cls``): the methods ``collective_rpc`` calls on the worker."""

    model_runner: Any

    def hydro_load_weights(self, named: list[tuple[str, torch.Tensor]]) -> None:
        self.model_runner.model.load_weights(weights=named)

    def hydro_digest(self, name: str) -> str:
        return tensor_digest(dict(self.model_runner.model.named_parameters())[name])


class _VLLMSampler:
    """One sampling setting's batch call into ``LLM.generate`` (the RolloutSampler interface)."""

    def __init__(self, llm: Any, sampling: Sampling, stop_ids: Sequence[int], max_batch: int) -> None:
        self.llm = llm
        self.sampling = sampling
        self.stop_ids = tuple(stop_ids)
        self.max_batch = max_batch
        self.stats: dict[str, Any] = {}

    def sample(self, prompts: Sequence[Sequence[int]], seeds: Sequence[int | None],
               keys: Sequence[Hashable | None] | None = None,
               forced: Sequence[Sequence[int] | None] | None = None) -> list[Sample]:
        from vllm import SamplingParams, TokensPrompt

        s = self.sampling
        params = [SamplingParams(temperature=0.0 if s.greedy else s.temperature, top_p=1.0 if s.greedy else s.top_p,
                                 top_k=top_k_value(s), min_p=0.0, max_tokens=s.max_new_tokens, logprobs=0,
                                 stop_token_ids=list(self.stop_ids), ignore_eos=True, skip_special_tokens=False,
                                 seed=None if seed is None or s.greedy else int(seed) & 0x7FFFFFFF)
                  for seed in seeds]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
        samples = []
        for out in outs:
            comp = out.outputs[0]
            ids = [int(t) for t in comp.token_ids]
            lps = [float(step[t].logprob) for t, step in zip(ids, comp.logprobs or [])]
            samples.append(finish_sample(ids, lps, self.stop_ids, s.max_new_tokens))
        return samples

    def forget(self) -> None:
        pass


class VLLMEngine:
    """``vllm.LLM`` behind the colocated protocol (module doc)."""

    def __init__(self, spec: EngineSpec) -> None:
        _require_gpu(spec, "vllm")
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        try:
            from vllm import LLM
        except ImportError:
            raise _missing("vllm", "colocated-vllm") from None
        self.name = f"vllm:{spec.index}"
        self.spec = spec
        self.llm = LLM(model=spec.model_path, enable_sleep_mode=True, gpu_memory_utilization=spec.memory_fraction,
                       max_model_len=spec.context_tokens, load_format="dummy", seed=spec.seed, dtype="bfloat16",
                       enable_prefix_caching=True,
                       worker_extension_cls="hydroagent_hpc.train.generation.colocated_engines.VLLMWeights")
        self._awake = True
        self._servers: dict[Sampling, GenerationServer] = {}
        self._lock = threading.Lock()

    @property
    def holds_memory(self) -> bool:
        return self._awake

    def _stop(self) -> None:
        with self._lock:
            for server in self._servers.values():
                server.__exit__(None, None, None)
            self._servers.clear()

    def wake(self) -> None:
        if self._awake:
            raise EngineOrderError(f"{self.name}: wake while awake", "sleep first")
        self.llm.wake_up()
        self._awake = True

    def sleep(self) -> None:
        self._stop()
        self.llm.sleep(level=1)
        self._awake = False

    def update_weights(self, bucket: Sequence[tuple[str, torch.Tensor]], *, last: bool) -> None:
        self._stop()
        self.llm.collective_rpc("hydro_load_weights", args=(list(bucket),))
        if last:
            self.llm.reset_prefix_cache()

    def checksum(self, name: str) -> str:
        return str(self.llm.collective_rpc("hydro_digest", args=(name,))[0])

    def generate(self, ids: Sequence[int], seed: int | None, sampling: Sampling, stop_ids: Sequence[int],
                 key: Hashable | None = None) -> Sample:
        with self._lock:
            server = self._servers.get(sampling)
            if server is None:
                sampler = _VLLMSampler(self.llm, sampling, stop_ids, self.spec.max_batch)
                server = self._servers[sampling] = GenerationServer(sampler).__enter__()
        return server.generate(ids, seed)

    def close(self) -> None:
        self._stop()
