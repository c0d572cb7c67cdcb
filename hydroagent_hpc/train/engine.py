"""Rollout generation through an external inference engine (SGLang or vLLM) over HTTP.

:class:`EngineSampler` has the interface of :class:`~hydroagent_hpc.train.sampler.BatchedSampler`
(``sample``, ``max_batch``, ``stats``, ``forget``), so the
:class:`~hydroagent_hpc.train.sampler.GenerationServer` drives it unchanged: a batch of token-id
prompts goes to the engine, the sampled ids come back (ending at the first stop id, which is kept,
or after ``max_new_tokens``) with the engine's log-probability of each. The trainer compares those
with its own (``logprob_mismatch_*``) and corrects for the difference with truncated importance
weights (``tis_cap``).

The sampling settings are always sent in full from the GRPO config (temperature, top-p, top-k, and
min-p 0, repetition penalty 1): both engines otherwise fill missing ones from the checkpoint's
``generation_config.json``. ``ignore_eos`` is sent as true so that the engine stops exactly at the
trainer's stop ids (which include eos) and not at extra ids of the generation config.

One small protocol class per engine API, chosen by name from :data:`ENGINE_APIS`:

- ``sglang`` (:class:`SGLangAPI`): native ``POST /generate`` with ``input_ids`` (a list of id lists)
  and ``sampling_params`` as a list with one mapping per prompt (``temperature``, ``top_p``,
  ``top_k`` with -1 = off, ``max_new_tokens``, ``stop_token_ids``, ``skip_special_tokens``,
  ``no_stop_trim``, ``ignore_eos`` and the row's ``sampling_seed``), ``return_logprob: true``; a
  batch answers a list, each item's ``meta_info.output_token_logprobs`` holding
  ``[logprob, token_id, text]`` per generated token. Weights: ``POST /update_weights_from_disk``
  with ``{"model_path": folder}`` answers ``{"success": bool, "message": str, ...}``.
  ``GET /health`` answers 200 when the server is up.
- ``vllm`` (:class:`VLLMAPI`): ``POST /v1/completions`` through the ``openai`` client, ``prompt``
  a token-id list, ``max_tokens``, ``temperature``, ``top_p``, ``seed``, ``logprobs: 0`` (the
  sampled token's log-prob only) and vLLM's extra fields ``top_k``, ``stop_token_ids``,
  ``skip_special_tokens: false``, ``include_stop_str_in_output: true``,
  ``return_tokens_as_token_ids: true`` (each ``choices[i].logprobs.tokens`` entry reads
  ``"token_id:N"``, beside ``token_logprobs``). ``seed`` is per request, so each row is its own
  request (sent concurrently; vLLM batches them). vLLM's OpenAI server has no stable endpoint that
  reloads full weights from disk: its weight-transfer endpoints (NCCL / CUDA IPC) need
  ``VLLM_SERVER_DEV_MODE`` and a process group with the trainer, ``collective_rpc`` is a dev-mode
  call, and issue vllm-project/vllm#32718 reports ``reload_weights`` serving stale weights. So a
  ``vllm`` engine is restarted on each new checkpoint by the launcher
  (:mod:`hydroagent_hpc.train.engine_process`), which therefore must own its process.

Sources relied on (field names and documented behaviour only): SGLang's "Sampling Parameters"
page (docs.sglang.io/basic_usage/sampling_params) and ``sampling_params.py`` (``sampling_seed``;
reproducible only with ``--enable-deterministic-inference``, sgl-project/sglang#15481), SGLang's
native API page (update weights from disk), SGLang test code reading
``meta_info.output_token_logprobs``; vLLM's ``CompletionRequest`` / ``CompletionLogProbs``
protocol pages (docs.vllm.ai, entrypoints/openai/completion/protocol), its "Weight Transfer" page,
and issues vllm-project/vllm#12774 (a disk-reload endpoint requested, closed unimplemented) and
#32718. docs/rl-notes.md section 7: weight sync into engines is version-fragile, so the sync here
is the plain "save safetensors, reload the engine" path.

The API key (optional) is read from the environment variable named by ``engine.api_key_env`` when
a client is built; it is sent as a bearer token and is never logged, stored or put in an error
message.
"""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.error
import urllib.request
from collections.abc import Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar

from hydroagent_hpc.errors import HydroAgentError
from hydroagent_hpc.registry import Registry
from hydroagent_hpc.train.sampler import Sample, Sampling

log = logging.getLogger(__name__)

__all__ = ["EngineError", "EngineSettings", "EngineAPI", "SGLangAPI", "VLLMAPI", "ENGINE_APIS", "EngineSampler",
           "make_api", "ENGINE_KEYS"]

#: The keys of the GRPO config's ``engine`` mapping (checked in ``grpo_config.py``).
ENGINE_KEYS = ("api", "url", "launch", "api_key_env", "model_name", "timeout_s", "start_timeout_s", "weights_dir")


class EngineError(HydroAgentError, RuntimeError):
    """The engine cannot be reached, refused a request or answered something unusable."""

    exit_code = 1


@dataclass(frozen=True)
class EngineSettings:
    """The ``engine`` mapping of a GRPO config (see ``docs/grpo.md``, "Generation by an engine").

    ``launch``: the argument list that starts the server (``{model}`` becomes the weights folder,
    ``{api_key}`` the key); None when the server is started by someone else. ``weights_dir``: where
    the pushed weights are written (the engine must see it; default ``RUN/engine-weights``).
    """

    api: str
    url: str
    launch: tuple[str, ...] | None = None
    api_key_env: str | None = None
    model_name: str | None = None
    timeout_s: float = 600.0
    start_timeout_s: float = 900.0
    weights_dir: str | None = None

    @classmethod
    def from_mapping(cls, data: dict[str, Any]) -> EngineSettings:
        values = dict(data)
        if values.get("launch") is not None:
            values["launch"] = tuple(str(a) for a in values["launch"])
        return cls(**values)

    @property
    def base(self) -> str:
        return self.url.rstrip("/")

    def api_key(self) -> str | None:
        """The key from the environment (None when no variable is named)."""
        if not self.api_key_env:
            return None
        key = os.environ.get(self.api_key_env)
        if not key:
            raise EngineError(f"engine.api_key_env: the environment variable {self.api_key_env} is not set",
                              f"export {self.api_key_env}=... before the run, or drop engine.api_key_env")
        return key


def _scrub(text: str, secret: str | None) -> str:
    return text.replace(secret, "***") if secret else text


class EngineAPI:
    """One engine's HTTP protocol: health, generation, and (when ``live_reload``) a weight reload."""

    name: ClassVar[str] = ""
    #: True when the server can load new weights from a folder without a restart.
    live_reload: ClassVar[bool] = False
    health_path: ClassVar[str] = "/health"

    def __init__(self, settings: EngineSettings) -> None:
        self.settings = settings
        self._key = settings.api_key()

    # -- plain JSON over urllib ---------------------------------------------------------------
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


def _top_k(sampling: Sampling) -> int:
    return -1 if sampling.greedy or not sampling.top_k else int(sampling.top_k)


def _finish(ids: list[int], logprobs: list[float], stop_ids: Sequence[int], max_new: int) -> Sample:
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
    live_reload = True

    def generate(self, prompts: Sequence[Sequence[int]], seeds: Sequence[int | None], sampling: Sampling,
                 stop_ids: Sequence[int]) -> list[Sample]:
        params = []
        for seed in seeds:
            p: dict[str, Any] = {"temperature": 0.0 if sampling.greedy else sampling.temperature,
                                 "top_p": 1.0 if sampling.greedy else sampling.top_p, "top_k": _top_k(sampling),
                                 "min_p": 0.0, "repetition_penalty": 1.0, "frequency_penalty": 0.0,
                                 "presence_penalty": 0.0, "max_new_tokens": sampling.max_new_tokens,
                                 "stop_token_ids": list(stop_ids), "ignore_eos": True,
                                 "skip_special_tokens": False, "no_stop_trim": True}
            if seed is not None and not sampling.greedy:
                p["sampling_seed"] = int(seed) & 0x7FFFFFFF
            params.append(p)
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
            out.append(_finish(ids, lps, stop_ids, sampling.max_new_tokens))
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
    live_reload = False

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

    def _one(self, prompt: Sequence[int], seed: int | None, sampling: Sampling, stop_ids: Sequence[int]) -> Sample:
        url = self.settings.base + "/v1/completions"
        extra = {"top_k": _top_k(sampling), "min_p": 0.0, "repetition_penalty": 1.0,
                 "stop_token_ids": list(stop_ids), "ignore_eos": True, "skip_special_tokens": False,
                 "include_stop_str_in_output": True, "return_tokens_as_token_ids": True}
        kwargs: dict[str, Any] = {}
        if seed is not None and not sampling.greedy:
            kwargs["seed"] = int(seed) & 0x7FFFFFFF
        try:
            reply = self._client.completions.create(
                model=self._served_model(), prompt=[int(i) for i in prompt], max_tokens=sampling.max_new_tokens,
                temperature=0.0 if sampling.greedy else sampling.temperature,
                top_p=1.0 if sampling.greedy else sampling.top_p, logprobs=0, n=1, extra_body=extra, **kwargs)
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
        return _finish(ids, lps, stop_ids, sampling.max_new_tokens)

    def generate(self, prompts: Sequence[Sequence[int]], seeds: Sequence[int | None], sampling: Sampling,
                 stop_ids: Sequence[int]) -> list[Sample]:
        if len(prompts) == 1:
            return [self._one(prompts[0], seeds[0], sampling, stop_ids)]
        with ThreadPoolExecutor(max_workers=min(len(prompts), 64), thread_name_prefix="vllm-request") as pool:
            return list(pool.map(lambda ps: self._one(ps[0], ps[1], sampling, stop_ids), zip(prompts, seeds)))


#: The engine APIs by name (``engine.api`` in a GRPO config).
ENGINE_APIS: Registry[type[EngineAPI]] = Registry("engine api", where="hydroagent_hpc/train/engine.py")
ENGINE_APIS.register("sglang", SGLangAPI)
ENGINE_APIS.register("vllm", VLLMAPI)


def make_api(settings: EngineSettings) -> EngineAPI:
    """The protocol object of ``settings.api`` (unknown names list the registered ones)."""
    return ENGINE_APIS[settings.api](settings)


class EngineSampler:
    """The :class:`~hydroagent_hpc.train.sampler.BatchedSampler` interface over an engine (module doc).

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
        n = len(prompts)
        if len(seeds) != n or (keys is not None and len(keys) != n) or (forced is not None and len(forced) != n):
            raise ValueError("one seed (and one key / forced list, when given) per prompt")
        if forced is not None and any(f is not None for f in forced):
            raise ValueError("forced ids are not supported by an engine (use generator: local)")
        if any(not p for p in prompts):
            raise ValueError("an empty prompt cannot be continued")
        out: list[Sample] = []
        for start in range(0, n, self.max_batch):
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
