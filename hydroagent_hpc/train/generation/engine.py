"""Rollout generation through an external inference engine (SGLang or vLLM) over HTTP.

Two request paths share one protocol object per engine (:class:`EngineAPI`):

- :class:`EngineRequests` (the GRPO path): each rollout thread sends its own turn as one request,
  from its own thread, at most ``max_in_flight`` at once, and waits for that request only. The
  engine batches the requests in flight continuously (both SGLang and vLLM add and retire rows at
  every decode step), so a short turn never waits for a long one and no rollout waits for another
  rollout's batch. It has the interface of
  :class:`~hydroagent_hpc.train.generation.sampler.GenerationServer` (context manager, ``generate``,
  ``stats``); :func:`serve_rollouts` picks it for an :class:`EngineSampler`.
- :class:`EngineSampler` (the :class:`~hydroagent_hpc.train.generation.sampler.BatchedSampler` interface:
  ``sample``, ``max_batch``, ``stats``, ``forget``): a list of prompts in, their samples out, in
  blocks of ``max_batch`` rows. Used by tests and callers that hold a whole batch at once.

Either way, the token ids of a prompt go to the engine and the sampled ids come back (ending at the
first stop id, which is kept, or after ``max_new_tokens``) with the engine's log-probability of
each. The trainer compares those with its own (``logprob_mismatch_*``) and corrects for the
difference with truncated importance weights (``tis_cap``).

The sampling settings are always sent in full from the GRPO config (temperature, top-p, top-k, and
min-p 0, repetition penalty 1): both engines otherwise fill missing ones from the checkpoint's
``generation_config.json``. The trainer's stop ids (which include ``<|im_end|>`` and
``<|endoftext|>``) go in ``stop_token_ids``; ``ignore_eos`` means different things to the two:

- SGLang (``python/sglang/srt/managers/schedule_batch.py``, ``Req.check_finished``, read at
  sgl-project/sglang fd3907ee): ``if not ignore_eos`` guards the stop-token-id check **and** the eos
  check, so ``ignore_eos: true`` would decode every row to ``max_new_tokens``. ``ignore_eos: false``
  is sent; SGLang then also stops at the model's eos ids, which for Qwen3 are among the trainer's
  stop ids (a row that ends at another id is logged once).
- vLLM (``vllm/v1/core/sched/utils.py`` ``check_stop``, read at vllm-project/vllm 018d5dc7, and
  ``vllm/sampling_params.py`` ``update_from_generation_config``, read at 00388f65): ``ignore_eos``
  skips only the tokenizer's eos (and keeps the generation config's other eos ids out of the stop
  set); ``stop_token_ids`` still stop a row. ``ignore_eos: true`` is sent, so a row ends exactly at
  the trainer's stop ids.

One small protocol class per engine API, chosen by name from :data:`ENGINE_APIS`:

- ``sglang`` (:class:`SGLangAPI`): native ``POST /generate`` with ``input_ids`` (a list of id lists)
  and ``sampling_params`` as a list with one mapping per prompt (``temperature``, ``top_p``,
  ``top_k`` with -1 = off, ``max_new_tokens``, ``stop_token_ids``, ``skip_special_tokens``,
  ``no_stop_trim``, ``ignore_eos: false`` and the row's ``sampling_seed``), ``return_logprob: true``;
  a batch answers a list, each item's ``meta_info.output_token_logprobs`` holding
  ``[logprob, token_id, text]`` per generated token. Weights: ``POST /update_weights_from_disk``
  with ``{"model_path": folder}`` answers ``{"success": bool, "message": str, ...}``.
  ``GET /health`` answers 200 when the server is up. Log-probs: SGLang's sampler
  (``python/sglang/srt/layers/sampler.py``, read at 584f55d1) returns the log-probs of the
  temperature-scaled distribution (``log softmax(logits / T)``) unless the server's environment
  has ``SGLANG_RETURN_ORIGINAL_LOGPROB=1``; the launcher sets it (:attr:`EngineAPI.launch_env`).
  For a server started by someone else and a temperature other than 1, a warning is logged once:
  ``logprob_mismatch_*`` and the TIS weights then compare different distributions.
- ``vllm`` (:class:`VLLMAPI`): ``POST /v1/completions`` through the ``openai`` client, ``prompt``
  a token-id list, ``max_tokens``, ``temperature``, ``top_p``, ``seed``, ``logprobs: 0`` (the
  sampled token's log-prob only) and vLLM's extra fields ``top_k``, ``stop_token_ids``,
  ``ignore_eos: true``, ``skip_special_tokens: false``, ``include_stop_str_in_output: true``,
  ``return_tokens_as_token_ids: true`` (each ``choices[i].logprobs.tokens`` entry reads
  ``"token_id:N"``, beside ``token_logprobs``). ``seed`` is per request, so each row is its own
  request (sent concurrently; vLLM batches them). vLLM V1 returns the raw (unscaled) log-probs by
  default. vLLM's OpenAI server has no stable endpoint that reloads full weights from disk: its
  weight-transfer endpoints (NCCL / CUDA IPC) need ``VLLM_SERVER_DEV_MODE`` and a process group
  with the trainer, ``/collective_rpc`` (``reload_weights``) is a dev-mode route outside the API-key
  check, and issues vllm-project/vllm#32718 (stale weights after ``reload_weights``, open) and
  #48312 (an RFC listing reload-correctness bugs, open) say it is not yet dependable. So a ``vllm``
  engine is restarted on each new checkpoint by the launcher
  (:mod:`hydroagent_hpc.train.generation.engine_process`), always on the same folder path (a ``current``
  link swapped atomically), so that vLLM's compile cache key stays the same: ``ModelConfig.compute_hash``
  hashes every field but an ignore list (``served_model_name``, ``tokenizer``, ...) that does not
  hold ``model``, the path string as given (``vllm/config/model.py`` read at 18ec6629, a tree whose
  deprecation notes name v0.13 as the next release; older trees list ``self.model`` as the first
  factor). ``max_model_len`` is a factor too, so it is passed explicitly and never changes.

Each API also names what a launched server needs (:attr:`EngineAPI.launch_env`,
:attr:`EngineAPI.context_flag`: ``--context-length`` for SGLang, ``--max-model-len`` for vLLM;
without it both size their KV cache for the model's full 262,144-token context).

Sources relied on (field names and documented behaviour only): SGLang's "Sampling Parameters"
page (docs.sglang.io/basic_usage/sampling_params) and ``sampling_params.py`` (``sampling_seed``;
reproducible only with ``--enable-deterministic-inference``, sgl-project/sglang#15481), SGLang's
native API page (update weights from disk), SGLang's ``schedule_batch.py`` and ``sampler.py`` (named
above); vLLM's ``CompletionRequest`` / ``CompletionLogProbs`` protocol pages (docs.vllm.ai,
entrypoints/openai/completion/protocol), its "Weight Transfer" page, ``check_stop`` and
``ModelConfig.compute_hash`` (named above), the dev-mode router
(``vllm/entrypoints/serve/dev/rpc/api_router.py``), and issues vllm-project/vllm#12774 (a
disk-reload endpoint requested, closed unimplemented), #32718 and #48312. docs/rl-notes.md
section 7: weight sync into engines is version-fragile, so the sync here is the plain "save
safetensors, reload the engine" path.

The API key (optional) is read from the environment variable named by ``engine.api_key_env`` when
a client is built; it is sent as a bearer token and is never logged, stored or put in an error
message.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

from hydroagent_hpc.errors import HydroAgentError
from hydroagent_hpc.registry import Registry
from hydroagent_hpc.train.generation.engine_config import ENGINE_API_RELOAD, EngineSettings, parse_gpus
from hydroagent_hpc.train.generation.sampler import GenerationServer, RolloutSampler, Sample, Sampling

log = logging.getLogger(__name__)

__all__ = ["EngineError", "EngineSettings", "EngineAPI", "SGLangAPI", "VLLMAPI", "ENGINE_APIS", "EngineSampler",
           "EngineRequests", "serve_rollouts", "make_api", "parse_gpus", "api_key", "finish_sample", "top_k_value"]

class EngineError(HydroAgentError, RuntimeError):
    """The engine cannot be reached, refused a request or answered something unusable."""

    exit_code = 1


def api_key(settings: EngineSettings) -> str | None:
    """The engine's API key from the environment variable ``settings.api_key_env`` names (None when none)."""
    if not settings.api_key_env:
        return None
    key = os.environ.get(settings.api_key_env)
    if not key:
        raise EngineError(f"engine.api_key_env: the environment variable {settings.api_key_env} is not set",
                          f"export {settings.api_key_env}=... before the run, or drop engine.api_key_env")
    return key


def _scrub(text: str, secret: str | None) -> str:
    return text.replace(secret, "***") if secret else text


class EngineAPI:
    """One engine's HTTP protocol: health, generation, and (when ``live_reload``) a weight reload."""

    name: ClassVar[str] = ""
    #: True when the server can load new weights from a folder without a restart.
    live_reload: ClassVar[bool] = False
    health_path: ClassVar[str] = "/health"
    #: Environment variables a launched server gets (on top of the trainer's environment).
    launch_env: ClassVar[dict[str, str]] = {}
    #: The server's command-line option for its context length (prompt + generated tokens).
    context_flag: ClassVar[str] = ""
    #: True when the server returns the model's own log-probs (temperature 1, unfiltered) at any
    #: sampling temperature without ``launch_env``.
    raw_logprobs: ClassVar[bool] = True

    def __init__(self, settings: EngineSettings) -> None:
        self.settings = settings
        self._key = api_key(settings)
        #: True when the log-probs are the unscaled ones (set by the launcher for ``launch_env``).
        self.unscaled_logprobs = self.raw_logprobs
        self._warned: set[str] = set()
        self._warn_lock = threading.Lock()

    def _warn_once(self, what: str, message: str, *args: Any) -> None:
        with self._warn_lock:
            if what in self._warned:
                return
            self._warned.add(what)
        log.warning(message, *args)

    # -- plain JSON over urllib (one connection per call: safe from any number of threads) ------
    def _request(self, method: str, path: str, body: Any = None, timeout: float | None = None,
                 accept: tuple[int, ...] = ()) -> Any:
        """The JSON answer of ``method path``; an HTTP error status raises :class:`EngineError` unless it
        is in ``accept`` (an endpoint that reports its failure in the body)."""
        url = self.settings.base + path
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        req = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.settings.timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            if exc.code in accept:
                raw = exc.read()
            else:
                detail = _scrub(exc.read()[:500].decode("utf-8", "replace"), self._key)
                raise self._status_error(url, exc.code, detail) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise EngineError(f"engine at {url}: cannot connect ({_scrub(str(reason), self._key)})",
                              "start the engine server (or give engine.launch) and check engine.url") from None
        try:
            return json.loads(raw)
        except ValueError:
            raise EngineError(f"engine at {url}: the answer is not JSON ({raw[:200]!r})",
                              f"check that engine.url points at a {self.name} server") from None

    def _status_error(self, url: str, status: int, detail: str) -> EngineError:
        if status in (401, 403):
            fix = ("export the key in the environment variable named by engine.api_key_env"
                   if not self._key else f"the key in ${self.settings.api_key_env} is not the server's")
        elif status == 404:
            fix = f"check that engine.url points at a {self.name} server (engine.api: {self.name})"
        else:
            fix = "see the engine's log for the cause"
        return EngineError(f"engine at {url}: HTTP {status}: {detail}", fix)

    def health(self, timeout: float = 5.0) -> bool:
        """True when the server answers its health endpoint with 200."""
        req = urllib.request.Request(self.settings.base + self.health_path, method="GET")
        if self._key:
            req.add_header("Authorization", f"Bearer {self._key}")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return int(resp.status) == 200
        except (urllib.error.URLError, OSError):
            return False

    def generate(self, prompts: Sequence[Sequence[int]], seeds: Sequence[int | None], sampling: Sampling,
                 stop_ids: Sequence[int]) -> list[Sample]:
        raise NotImplementedError

    def load_weights(self, folder: str) -> None:
        """Make the running server serve the weights in ``folder`` (``live_reload`` APIs only)."""
        raise EngineError(f"engine.api {self.name}: the server cannot reload weights while running",
                          "give engine.launch so the trainer restarts the engine on each checkpoint")

    def reset(self) -> None:
        """Forget what was learnt about the server (it was restarted)."""

    def _check_logprobs(self, sampling: Sampling) -> None:
        """Warn once when the engine's log-probs are of the temperature-scaled distribution."""
        if self.unscaled_logprobs or sampling.greedy or sampling.temperature == 1.0:
            return
        self._warn_once("scaled", "engine %s at %s: its log-probs are of softmax(logits / %g), not of the model's "
                        "own distribution (a server not launched by the trainer, without %s): logprob_mismatch_* "
                        "and the TIS weights are biased; start the server with %s, or let engine.launch start it",
                        self.name, self.settings.base, sampling.temperature, ", ".join(self.launch_env),
                        " ".join(f"{k}={v}" for k, v in self.launch_env.items()))

    def _finish(self, ids: list[int], logprobs: list[float], stop_ids: Sequence[int], max_new: int) -> Sample:
        """:func:`finish_sample`, and a warning (once) when the engine ended a row on its own."""
        sample = finish_sample(ids, logprobs, stop_ids, max_new)
        if len(sample.ids) < max_new and (not sample.ids or sample.ids[-1] not in set(stop_ids)):
            last = sample.ids[-1] if sample.ids else None
            self._warn_once("foreign-stop", "engine %s at %s ended a row after %d ids at id %s, which is not one of "
                            "the trainer's stop ids %s: the engine stops on ids of its own (an eos id of the "
                            "model's generation_config.json) or at its context length; the trainer scores the turn "
                            "as it came", self.name, self.settings.base, len(sample.ids), last, list(stop_ids))
        return sample


def top_k_value(sampling: Sampling) -> int:
    """The engines' ``top_k`` of a sampling setting: -1 (off) when greedy or when ``top_k`` is 0."""
    return -1 if sampling.greedy or not sampling.top_k else int(sampling.top_k)


def finish_sample(ids: list[int], logprobs: list[float], stop_ids: Sequence[int], max_new: int) -> Sample:
    """Cut a row at its first stop id (kept) and at ``max_new`` ids, as BatchedSampler ends rows."""
    stop = set(stop_ids)
    end = min(len(ids), max_new)
    for i, tok in enumerate(ids[:end]):
        if tok in stop:
            end = i + 1
            break
    return Sample(ids[:end], logprobs[:end])


class SGLangAPI(EngineAPI):
    """SGLang's native ``/generate`` and ``/update_weights_from_disk`` (see the module doc)."""

    name = "sglang"
    live_reload = ENGINE_API_RELOAD["sglang"]
    launch_env: ClassVar[dict[str, str]] = {"SGLANG_RETURN_ORIGINAL_LOGPROB": "1"}
    context_flag = "--context-length"
    raw_logprobs = False

    def request_params(self, seed: int | None, sampling: Sampling, stop_ids: Sequence[int]) -> dict[str, Any]:
        """One row's ``sampling_params``. ``ignore_eos`` is false: in SGLang it would switch off
        ``stop_token_ids`` too (module doc)."""
        p: dict[str, Any] = {"temperature": 0.0 if sampling.greedy else sampling.temperature,
                             "top_p": 1.0 if sampling.greedy else sampling.top_p, "top_k": top_k_value(sampling),
                             "min_p": 0.0, "repetition_penalty": 1.0, "frequency_penalty": 0.0,
                             "presence_penalty": 0.0, "max_new_tokens": sampling.max_new_tokens,
                             "stop_token_ids": list(stop_ids), "ignore_eos": False,
                             "skip_special_tokens": False, "no_stop_trim": True}
        if seed is not None and not sampling.greedy:
            p["sampling_seed"] = int(seed) & 0x7FFFFFFF
        return p

    def generate(self, prompts: Sequence[Sequence[int]], seeds: Sequence[int | None], sampling: Sampling,
                 stop_ids: Sequence[int]) -> list[Sample]:
        self._check_logprobs(sampling)
        params = [self.request_params(seed, sampling, stop_ids) for seed in seeds]
        body = {"input_ids": [list(map(int, p)) for p in prompts], "sampling_params": params,
                "return_logprob": True, "logprob_start_len": -1, "return_text_in_logprobs": False}
        answer = self._request("POST", "/generate", body)
        if isinstance(answer, dict):
            answer = [answer]
        if not isinstance(answer, list) or len(answer) != len(prompts):
            raise EngineError(f"engine at {self.settings.base}/generate: expected {len(prompts)} results, got "
                              f"{type(answer).__name__}", "check that engine.url points at an SGLang server")
        out = []
        for item in answer:
            try:
                entries = item["meta_info"]["output_token_logprobs"]
                ids = [int(e[1]) for e in entries]
                lps = [float(e[0]) for e in entries]
            except (KeyError, TypeError, IndexError, ValueError):
                raise EngineError(f"engine at {self.settings.base}/generate: no usable "
                                  f"meta_info.output_token_logprobs in {str(item)[:200]}",
                                  "use an SGLang version that returns log-probs with return_logprob") from None
            out.append(self._finish(ids, lps, stop_ids, sampling.max_new_tokens))
        return out

    def load_weights(self, folder: str) -> None:
        answer = self._request("POST", "/update_weights_from_disk", {"model_path": folder}, accept=(400,))
        if not isinstance(answer, dict) or answer.get("success") is not True:
            message = answer.get("message") if isinstance(answer, dict) else answer
            raise EngineError(f"engine at {self.settings.base}/update_weights_from_disk: {folder} was not loaded "
                              f"({_scrub(str(message), self._key)[:300]})",
                              "the engine must see the folder (a shared file system) and serve the same architecture")


class VLLMAPI(EngineAPI):
    """vLLM's OpenAI-compatible ``/v1/completions`` (see the module doc); restarted for new weights."""

    name = "vllm"
    live_reload = ENGINE_API_RELOAD["vllm"]
    context_flag = "--max-model-len"
    raw_logprobs = True

    def __init__(self, settings: EngineSettings) -> None:
        super().__init__(settings)
        import openai

        self._openai = openai
        self._client = openai.OpenAI(base_url=settings.base + "/v1", api_key=self._key or "EMPTY", max_retries=0,
                                     timeout=settings.timeout_s)
        self._model: str | None = settings.model_name

    def reset(self) -> None:
        self._model = self.settings.model_name

    def _served_model(self) -> str:
        if self._model is None:
            answer = self._request("GET", "/v1/models")
            try:
                self._model = str(answer["data"][0]["id"])
            except (KeyError, TypeError, IndexError):
                raise EngineError(f"engine at {self.settings.base}/v1/models: no model listed",
                                  "set engine.model_name to the served model name") from None
        return self._model

    def request_extra(self, stop_ids: Sequence[int], sampling: Sampling) -> dict[str, Any]:
        """vLLM's fields beyond the OpenAI ones. ``ignore_eos: true`` skips only the tokenizer's eos
        in vLLM; ``stop_token_ids`` still stop (module doc)."""
        return {"top_k": top_k_value(sampling), "min_p": 0.0, "repetition_penalty": 1.0,
                "stop_token_ids": list(stop_ids), "ignore_eos": True, "skip_special_tokens": False,
                "include_stop_str_in_output": True, "return_tokens_as_token_ids": True}

    def _one(self, prompt: Sequence[int], seed: int | None, sampling: Sampling, stop_ids: Sequence[int]) -> Sample:
        url = self.settings.base + "/v1/completions"
        kwargs: dict[str, Any] = {}
        if seed is not None and not sampling.greedy:
            kwargs["seed"] = int(seed) & 0x7FFFFFFF
        try:
            reply = self._client.completions.create(
                model=self._served_model(), prompt=[int(i) for i in prompt], max_tokens=sampling.max_new_tokens,
                temperature=0.0 if sampling.greedy else sampling.temperature,
                top_p=1.0 if sampling.greedy else sampling.top_p, logprobs=0, n=1,
                extra_body=self.request_extra(stop_ids, sampling), **kwargs)
        except self._openai.APIStatusError as exc:
            raise self._status_error(url, int(exc.status_code), _scrub(str(exc.message), self._key)[:500]) from None
        except self._openai.APIConnectionError as exc:
            raise EngineError(f"engine at {url}: cannot connect ({type(exc).__name__})",
                              "start the engine server (or give engine.launch) and check engine.url") from None
        try:
            lp = reply.choices[0].logprobs
            ids = [int(str(t).rsplit(":", 1)[1]) for t in (lp.tokens or [])]
            lps = [float(x) for x in (lp.token_logprobs or [])]
        except (AttributeError, IndexError, TypeError, ValueError):
            raise EngineError(f"engine at {url}: no token ids in choices[0].logprobs.tokens",
                              "use a vLLM version that accepts return_tokens_as_token_ids") from None
        if len(ids) != len(lps):
            raise EngineError(f"engine at {url}: {len(ids)} tokens but {len(lps)} log-probs", "see the engine's log")
        return self._finish(ids, lps, stop_ids, sampling.max_new_tokens)

    def generate(self, prompts: Sequence[Sequence[int]], seeds: Sequence[int | None], sampling: Sampling,
                 stop_ids: Sequence[int]) -> list[Sample]:
        self._check_logprobs(sampling)
        if len(prompts) == 1:
            return [self._one(prompts[0], seeds[0], sampling, stop_ids)]
        with ThreadPoolExecutor(max_workers=min(len(prompts), 64), thread_name_prefix="vllm-request") as pool:
            return list(pool.map(lambda ps: self._one(ps[0], ps[1], sampling, stop_ids), zip(prompts, seeds)))


#: The engine APIs by name (``engine.api`` in a GRPO config).
ENGINE_APIS: Registry[type[EngineAPI]] = Registry("engine api", where="hydroagent_hpc/train/generation/engine.py")
ENGINE_APIS.register("sglang", SGLangAPI)
ENGINE_APIS.register("vllm", VLLMAPI)


def make_api(settings: EngineSettings) -> EngineAPI:
    """The protocol object of ``settings.api`` (unknown names list the registered ones)."""
    return ENGINE_APIS[settings.api](settings)


def _check_rows(prompts: Sequence[Sequence[int]], seeds: Sequence[int | None],
                keys: Sequence[Hashable | None] | None, forced: Sequence[Sequence[int] | None] | None) -> None:
    n = len(prompts)
    if len(seeds) != n or (keys is not None and len(keys) != n) or (forced is not None and len(forced) != n):
        raise ValueError("one seed (and one key / forced list, when given) per prompt")
    if forced is not None and any(f is not None for f in forced):
        raise ValueError("forced ids are not supported by an engine (use generator: local)")
    if any(not p for p in prompts):
        raise ValueError("an empty prompt cannot be continued")


class EngineSampler:
    """The :class:`~hydroagent_hpc.train.generation.sampler.BatchedSampler` interface over an engine (module doc).

    ``keys`` are accepted and ignored (the engines keep their own prefix caches); ``forced`` ids are
    not supported (a benchmark and test feature of the in-process sampler). ``stats`` counts HTTP
    requests, rows, generated tokens and the seconds spent waiting for the engine.
    """

    def __init__(self, api: EngineAPI, stop_ids: Sequence[int], sampling: Sampling, max_batch: int = 64) -> None:
        self.api = api
        self.stop_ids = tuple(int(i) for i in stop_ids)
        self.sampling = sampling
        self.max_batch = int(max_batch)
        if self.max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self.stats: dict[str, Any] = {"requests": 0, "rows": 0, "tokens": 0, "engine_s": 0.0}

    def sample(self, prompts: Sequence[Sequence[int]], seeds: Sequence[int | None],
               keys: Sequence[Hashable | None] | None = None,
               forced: Sequence[Sequence[int] | None] | None = None) -> list[Sample]:
        _check_rows(prompts, seeds, keys, forced)
        out: list[Sample] = []
        for start in range(0, len(prompts), self.max_batch):
            t0 = time.perf_counter()
            part = self.api.generate(prompts[start:start + self.max_batch], seeds[start:start + self.max_batch],
                                     self.sampling, self.stop_ids)
            self.stats["engine_s"] += time.perf_counter() - t0
            self.stats["requests"] += 1
            self.stats["rows"] += len(part)
            self.stats["tokens"] += sum(len(s.ids) for s in part)
            out += part
        return out

    def forget(self) -> None:
        """Nothing to drop here: the engine flushes its own cache when its weights change."""


class EngineRequests(GenerationServer):
    """Rollout turns sent to the engine as they come: one request per turn, from the calling thread.

    The :class:`~hydroagent_hpc.train.generation.sampler.GenerationServer` interface (a context manager whose
    :meth:`generate` blocks the calling rollout until its turn is sampled) without the server's
    batch loop: :meth:`generate` sends the turn at once and waits for that request only, so the
    engine's continuous batching decides what runs together and a short turn never waits for a long
    one. At most ``sampler.max_batch`` requests are in flight (``generation_batch`` in GRPO); a
    rollout beyond that waits for a free slot, not for a batch.

    ``stats`` keeps the server's keys: ``batches`` and ``rows`` count requests (one row each),
    ``max_batch`` is the most requests that were in flight at once, and ``busy_s`` the seconds during
    which at least one was (so it is the generation wall time, as for the batching server); also
    ``tokens`` (generated ids) and ``request_s`` (the requests' seconds summed).
    """

    def __init__(self, sampler: EngineSampler) -> None:
        super().__init__(sampler, linger_s=0.0)
        self.engine = sampler
        self.max_in_flight = sampler.max_batch
        self._slots = threading.BoundedSemaphore(self.max_in_flight)
        self._lock = threading.Lock()
        self._open = False
        self._in_flight = 0
        self._busy_since = 0.0
        self.stats = {"batches": 0, "rows": 0, "max_batch": 0, "busy_s": 0.0, "tokens": 0, "request_s": 0.0}

    def __enter__(self) -> EngineRequests:
        self._open = True
        return self

    def __exit__(self, *exc: object) -> None:
        self._open = False
        self.engine.forget()

    def generate(self, ids: Sequence[int], seed: int | None, key: Hashable | None = None,
                 forced: Sequence[int] | None = None) -> Sample:
        """Sample a turn after ``ids`` (blocks until done). ``key`` is accepted and ignored (the
        engine keeps its own prefix cache); ``forced`` ids are not supported by an engine."""
        if not self._open:
            raise RuntimeError("EngineRequests is not running (use it as a context manager)")
        _check_rows([ids], [seed], None, None if forced is None else [forced])
        with self._slots:
            t0 = self._begin()
            sample: Sample | None = None
            try:
                sample = self.engine.api.generate([list(ids)], [seed], self.engine.sampling, self.engine.stop_ids)[0]
            finally:
                self._end(t0, sample)
        return sample

    def _begin(self) -> float:
        with self._lock:
            now = time.perf_counter()
            if self._in_flight == 0:
                self._busy_since = now
            self._in_flight += 1
            self.stats["max_batch"] = max(self.stats["max_batch"], self._in_flight)
            return now

    def _end(self, t0: float, sample: Sample | None) -> None:
        with self._lock:
            now = time.perf_counter()
            self._in_flight -= 1
            if self._in_flight == 0:
                self.stats["busy_s"] += now - self._busy_since
            self.stats["batches"] += 1
            self.stats["rows"] += 1
            self.stats["request_s"] += now - t0
            self.stats["tokens"] += len(sample.ids) if sample is not None else 0


def serve_rollouts(sampler: RolloutSampler) -> GenerationServer:
    """What answers the rollouts' turns: :class:`EngineRequests` for an :class:`EngineSampler` (each
    turn its own request, the engine batching them continuously), else the batching
    :class:`~hydroagent_hpc.train.generation.sampler.GenerationServer` around the in-process sampler."""
    if isinstance(sampler, EngineSampler):
        return EngineRequests(sampler)
    return GenerationServer(sampler)
