"""A small HTTP inference server: a Hugging Face causal LM behind the SGLang and vLLM request shapes.

``python -m hydroagent_hpc.train.generation.engine_server --model PATH --port N [--dtype float32|bfloat16]
[--api-key-env NAME] [--device auto|cpu|cuda] [--context-length N | --max-model-len N]
[--token-delay-s S]`` serves the model with our own
:class:`~hydroagent_hpc.train.generation.sampler.BatchedSampler` (stdlib ``http.server``, one thread per
connection; requests run concurrently, each in its own decode loop: what a continuously batching
engine looks like from the client, without its throughput). It is the loopback stand-in for SGLang
and vLLM in the tests (no GPU and no engine here), and a usable engine for small models. The model
runs on CUDA when torch sees a device (``--device auto``), else on the CPU.

Endpoints (the subset :mod:`hydroagent_hpc.train.generation.engine` uses, with the engines' field names):

- ``GET /health``: 200 ``{"ok": true}`` (no key needed).
- ``POST /generate`` (SGLang): ``input_ids`` (one list or a list of lists), ``sampling_params``
  (one mapping or one per prompt: ``temperature`` (0 = greedy), ``top_p``, ``top_k`` (-1 = off),
  ``max_new_tokens``, ``stop_token_ids``, ``ignore_eos``, ``sampling_seed``); answers one item per
  prompt with ``output_ids``, ``text`` and ``meta_info`` (``finish_reason``, ``prompt_tokens``,
  ``completion_tokens``, ``output_token_logprobs`` as ``[logprob, id, None]`` when
  ``return_logprob``).
- ``POST /update_weights_from_disk`` (SGLang): ``{"model_path": folder}`` loads that
  ``save_pretrained`` folder; answers ``{"success", "message"}`` (400 when it fails).
- ``GET /v1/models`` and ``POST /v1/completions`` (vLLM): ``prompt`` as token ids, ``max_tokens``,
  ``temperature``, ``top_p``, ``top_k``, ``seed``, ``logprobs``, ``stop_token_ids``, ``ignore_eos``,
  ``return_tokens_as_token_ids`` (tokens as ``"token_id:N"``); ``choices[i].logprobs`` holds
  ``tokens`` and ``token_logprobs``.
- ``GET /engine_info`` (ours): the model folder, dtype, device, number of weight updates and
  :func:`weights_digest` of the served weights (so a test can check they are the trainer's), the
  counters below, the context length and whether log-probs are the unscaled ones.

Sampling is :class:`BatchedSampler`'s: each row draws from its own generator seeded with the
request's seed, so with the same seed and dtype the server samples what the trainer's in-process
sampler would. The log-probs are computed in the serving dtype: honest by default (``float32``);
``--dtype bfloat16`` serves in BF16 like a GPU engine, which makes the trainer's and the
generator's numbers differ (what truncated importance weights correct).

Each API keeps its engine's documented semantics (read from their source; the versions are named
in :mod:`hydroagent_hpc.train.generation.engine`):

- stops: ``/generate`` (SGLang, ``Req.check_finished``) stops a row at ``stop_token_ids`` and the
  model's eos ids, and with ``ignore_eos: true`` at **neither** (the row runs to
  ``max_new_tokens``); ``/v1/completions`` (vLLM, ``check_stop``) always stops at
  ``stop_token_ids`` and, unless ``ignore_eos``, at the eos ids too;
- log-probs: ``/v1/completions`` returns the model's own (temperature 1, unfiltered; vLLM V1's raw
  log-probs); ``/generate`` returns those of ``softmax(logits / T)`` (SGLang's sampler) unless the
  server's environment has ``SGLANG_RETURN_ORIGINAL_LOGPROB`` set to ``1`` or ``true``;
- context: with ``--context-length`` / ``--max-model-len`` ``C``, SGLang refuses a request whose
  prompt plus ``max_new_tokens`` reaches ``C``, vLLM one whose prompt plus ``max_tokens`` exceeds it
  (HTTP 400 each).

``--token-delay-s S`` sleeps ``S`` seconds before every forward pass (a slow engine for the tests
of concurrent requests). ``/engine_info`` counts the requests, the ids the server decoded
(``generated_tokens``, before any client cuts a row at its stop id) and the most requests it ran
at once (``peak_concurrent``).

With ``--api-key-env NAME`` every request but ``/health`` needs ``Authorization: Bearer KEY``,
``KEY`` being that environment variable's value (never logged).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import torch

from hydroagent_hpc.train.generation.sampler import BatchedSampler, Sample, Sampling

log = logging.getLogger(__name__)

__all__ = ["EngineServer", "weights_digest", "main"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def weights_digest(model: Any, dtype: torch.dtype | None = None) -> str:
    """SHA-256 over the names and bytes of the model's state dict (cast to ``dtype`` when given)."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().to("cpu")
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        h.update(name.encode())
        h.update(t.contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class _BadRequest(ValueError):
    pass


def pick_device(name: str = "auto") -> str:
    """``cuda`` when asked, or for ``auto`` when torch sees a CUDA device; else ``cpu``."""
    if name not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device {name!r}: use auto, cpu or cuda")
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def _load(path: str, dtype: torch.dtype, device: str = "cpu") -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model: Any = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype)
    model = model.to(torch.device(device)).eval()
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError):
        tokenizer = None
    return model, tokenizer


class EngineServer:
    """The server (see the module doc): ``start()`` serves from a thread, ``serve_forever()`` blocks."""

    def __init__(self, model_path: str, host: str = "127.0.0.1", port: int = 0, dtype: str = "float32",
                 api_key_env: str | None = None, served_name: str | None = None, *, device: str = "auto",
                 context_tokens: int | None = None, token_delay_s: float = 0.0) -> None:
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r}: use one of {', '.join(DTYPES)}")
        if context_tokens is not None and context_tokens < 2:
            raise ValueError(f"context length {context_tokens!r}: must be at least 2 tokens")
        self.dtype_name, self.dtype = dtype, DTYPES[dtype]
        self.device = pick_device(device)
        self.token_delay_s = float(token_delay_s)
        self.context_tokens = context_tokens
        #: SGLang's switch for unscaled log-probs (``/generate`` only; module doc)
        self.original_logprob = os.environ.get("SGLANG_RETURN_ORIGINAL_LOGPROB", "").strip().lower() in ("1", "true")
        self.model_path = str(model_path)
        self.model, self.tokenizer = self._load(self.model_path)
        self.served_name = served_name or self.model_path
        self.updates = 0
        self.requests = 0
        self.generated_tokens = 0
        self.active = 0
        self.peak_concurrent = 0
        self._key = os.environ.get(api_key_env) if api_key_env else None
        if api_key_env and not self._key:
            raise ValueError(f"--api-key-env {api_key_env}: the variable is not set")
        self._lock = threading.Lock()
        self.httpd = ThreadingHTTPServer((host, port), _handler(self))
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> EngineServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="engine-server", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> EngineServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the model ------------------------------------------------------------------------------
    def _load(self, path: str) -> tuple[Any, Any]:
        model, tokenizer = _load(path, self.dtype, self.device)
        if self.token_delay_s > 0:
            model.register_forward_pre_hook(lambda *_: time.sleep(self.token_delay_s))
        return model, tokenizer

    @staticmethod
    def _pad_id(model: Any, tokenizer: Any) -> int:
        for value in (getattr(tokenizer, "pad_token_id", None), model.config.pad_token_id,
                      model.config.eos_token_id):
            if isinstance(value, list) and value:
                value = value[0]
            if isinstance(value, int):
                return value
        return 0

    def _eos_ids(self) -> list[int]:
        eos = self.model.config.eos_token_id
        return [int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None]

    def info(self) -> dict[str, Any]:
        with self._lock:
            return {"model_path": self.model_path, "dtype": self.dtype_name, "device": self.device,
                    "updates": self.updates, "requests": self.requests, "generated_tokens": self.generated_tokens,
                    "peak_concurrent": self.peak_concurrent, "context_tokens": self.context_tokens,
                    "original_logprob": self.original_logprob, "weights_sha256": weights_digest(self.model)}

    def load(self, path: str) -> None:
        """Serve the weights of the ``save_pretrained`` folder ``path`` from now on (requests already
        running finish on the weights they started with)."""
        model, tokenizer = self._load(path)
        with self._lock:
            self.model, self.model_path = model, str(path)
            self.tokenizer = tokenizer if tokenizer is not None else self.tokenizer
            self.updates += 1
        log.info("engine server: now serving %s", path)

    def sample(self, prompts: Sequence[Sequence[int]], params: Sequence[dict[str, Any]], api: str) -> list[Sample]:
        """Sample each prompt with its parameters under ``api``'s semantics (module doc); rows whose
        parameters differ only in the seed share a batch. Requests run concurrently."""
        groups: dict[str, list[int]] = {}
        for i, p in enumerate(params):
            key = repr(sorted((k, v) for k, v in p.items() if k != "seed"))
            groups.setdefault(key, []).append(i)
        with self._lock:  # the weights this request runs on (a reload swaps them for later requests)
            model, tokenizer = self.model, self.tokenizer
            self.requests += 1
        vocab = int(model.config.vocab_size)
        for r, prompt in enumerate(prompts):
            if not prompt or any(not 0 <= t < vocab for t in prompt):
                raise _BadRequest(f"prompt ids must be non-empty and in [0, {vocab})")
            self._check_context(len(prompt), params[r]["sampling"].max_new_tokens, api)
        out: list[Sample | None] = [None] * len(prompts)
        with self._lock:
            self.active += 1
            self.peak_concurrent = max(self.peak_concurrent, self.active)
        try:
            for rows in groups.values():
                p = params[rows[0]]
                sampling = p["sampling"]
                sampler = BatchedSampler(model, self.stops(p, api), self._pad_id(model, tokenizer), sampling,
                                         max_batch=len(rows))
                got = sampler.sample([prompts[r] for r in rows], [params[r]["seed"] for r in rows])
                scaled = api == "sglang" and not self.original_logprob and not sampling.greedy \
                    and sampling.temperature != 1.0
                for r, s in zip(rows, got):
                    out[r] = Sample(s.ids, _scaled_logprobs(model, prompts[r], s.ids, sampling.temperature)) \
                        if scaled and s.ids else s
        finally:
            with self._lock:
                self.active -= 1
                self.generated_tokens += sum(len(s.ids) for s in out if s is not None)
        return [s for s in out if s is not None]

    def _check_context(self, n_prompt: int, max_new: int, api: str) -> None:
        """The engines' context-length refusals (module doc)."""
        c = self.context_tokens
        if c is None:
            return
        if api == "sglang" and (n_prompt >= c or n_prompt + max_new >= c):
            raise _BadRequest(f"Requested token count exceeds the model's maximum context length of {c} tokens: "
                              f"{n_prompt} tokens from the input and {max_new} for the completion")
        if api == "vllm" and n_prompt + max_new > c:
            raise _BadRequest(f"This model's maximum context length is {c} tokens. However, you requested "
                              f"{n_prompt + max_new} tokens ({n_prompt} in the prompt, {max_new} for the completion)")

    def stops(self, p: dict[str, Any], api: str) -> list[int]:
        """A request's stop ids under ``api``'s semantics: SGLang's ``ignore_eos`` switches off the
        stop ids and the eos ids, vLLM's only the eos ids (module doc)."""
        if api == "sglang":
            return [] if p["ignore_eos"] else list(p["stop"]) + self._eos_ids()
        return list(p["stop"]) + ([] if p["ignore_eos"] else self._eos_ids())

    def decode(self, ids: Sequence[int]) -> str:
        return "" if self.tokenizer is None else str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    def token_text(self, tok: int, as_id: bool) -> str:
        return f"token_id:{tok}" if as_id or self.tokenizer is None else self.decode([tok])

    def authorised(self, header: str | None) -> bool:
        return not self._key or header == f"Bearer {self._key}"


def _params(raw: Any, *, max_key: str) -> dict[str, Any]:
    """Our sampling parameters from one request mapping (SGLang or vLLM names)."""
    if not isinstance(raw, dict):
        raise _BadRequest("sampling parameters must be a mapping")
    try:
        temperature = float(raw.get("temperature", 1.0))
        top_k = int(raw.get("top_k", -1) or -1)
        sampling = Sampling(temperature=temperature if temperature > 0 else 1.0, top_p=float(raw.get("top_p", 1.0)),
                            top_k=0 if top_k < 0 else top_k, max_new_tokens=int(raw.get(max_key, 16)),
                            greedy=temperature <= 0)
        seed = raw.get("sampling_seed", raw.get("seed"))
        stop = [int(t) for t in raw.get("stop_token_ids") or []]
    except (TypeError, ValueError) as exc:
        raise _BadRequest(f"bad sampling parameters: {exc}") from None
    return {"sampling": sampling, "seed": None if seed is None else int(seed), "stop": stop,
            "ignore_eos": bool(raw.get("ignore_eos", False))}


@torch.inference_mode()
def _scaled_logprobs(model: Any, prompt: Sequence[int], ids: Sequence[int], temperature: float) -> list[float]:
    """``log softmax(logits / T)`` of each sampled id: SGLang's log-probs without
    ``SGLANG_RETURN_ORIGINAL_LOGPROB`` (one forward pass over the prompt and the sampled ids)."""
    seq = torch.tensor([list(prompt) + list(ids)], dtype=torch.long, device=model.device)
    logits = model(input_ids=seq).logits[0, len(prompt) - 1:len(prompt) - 1 + len(ids)].float()
    chosen = torch.tensor(list(ids), dtype=torch.long, device=logits.device)[:, None]
    return [float(x) for x in torch.log_softmax(logits / temperature, dim=-1).gather(-1, chosen)[:, 0].tolist()]


def _finish_reason(s: Sample, stops: Sequence[int]) -> tuple[str, int | None]:
    if s.ids and s.ids[-1] in stops:
        return "stop", s.ids[-1]
    return "length", None


def _sglang_generate(server: EngineServer, body: dict[str, Any]) -> Any:
    ids = body.get("input_ids")
    single = isinstance(ids, list) and bool(ids) and all(isinstance(t, int) for t in ids)
    prompts = [ids] if single else ids
    if not isinstance(prompts, list) or not all(isinstance(p, list) for p in prompts):
        raise _BadRequest("input_ids: expected a list of token ids or a list of such lists (text is not supported)")
    raw = body.get("sampling_params") or {}
    raws = raw if isinstance(raw, list) else [raw] * len(prompts)
    if len(raws) != len(prompts):
        raise _BadRequest(f"sampling_params: {len(raws)} mappings for {len(prompts)} prompts")
    params = [_params(r, max_key="max_new_tokens") for r in raws]
    samples = server.sample(prompts, params, "sglang")
    out = []
    for prompt, s, p in zip(prompts, samples, params):
        reason, matched = _finish_reason(s, server.stops(p, "sglang"))
        meta: dict[str, Any] = {"finish_reason": {"type": reason, **({"matched": matched} if matched is not None
                                                                      else {"length": len(s.ids)})},
                                "prompt_tokens": len(prompt), "completion_tokens": len(s.ids)}
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = [[lp, tok, None] for tok, lp in zip(s.ids, s.logprobs)]
        out.append({"text": server.decode(s.ids), "output_ids": s.ids, "meta_info": meta})
    return out[0] if single else out


def _vllm_completions(server: EngineServer, body: dict[str, Any]) -> Any:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        prompts = [prompt]
    elif isinstance(prompt, list) and all(isinstance(p, list) for p in prompt):
        prompts = prompt
    else:
        raise _BadRequest("prompt: expected token ids (text prompts are not supported by this server)")
    if int(body.get("n", 1) or 1) != 1:
        raise _BadRequest("n: only 1 is supported")
    p = _params(body, max_key="max_tokens")
    samples = server.sample(prompts, [p] * len(prompts), "vllm")
    as_ids = bool(body.get("return_tokens_as_token_ids"))
    choices = []
    for i, s in enumerate(samples):
        reason, matched = _finish_reason(s, server.stops(p, "vllm"))
        logprobs = None
        if body.get("logprobs") is not None:
            tokens = [server.token_text(t, as_ids) for t in s.ids]
            logprobs = {"tokens": tokens, "token_logprobs": s.logprobs, "text_offset": [0] * len(tokens),
                        "top_logprobs": [{tok: lp} for tok, lp in zip(tokens, s.logprobs)]}
        choices.append({"index": i, "text": server.decode(s.ids), "logprobs": logprobs, "finish_reason": reason,
                        "stop_reason": matched})
    n_prompt = sum(len(x) for x in prompts)
    n_out = sum(len(s.ids) for s in samples)
    return {"id": f"cmpl-{time.time_ns()}", "object": "text_completion", "created": int(time.time()),
            "model": server.served_name, "choices": choices,
            "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out}}


def _handler(server: EngineServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("engine server: %s", format % args)

        def _send(self, status: int, payload: Any) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, message: str) -> None:
            self._send(status, {"object": "error", "message": message, "code": status,
                                "error": {"message": message, "code": status}})

        def _body(self) -> dict[str, Any]:
            n = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(n) or b"{}")
            except ValueError:
                raise _BadRequest("the body is not JSON") from None
            if not isinstance(body, dict):
                raise _BadRequest("the body must be a JSON object")
            return body

        def _route(self, method: str) -> None:
            path = self.path.split("?", 1)[0].rstrip("/")
            if path == "/health":
                self._send(200, {"ok": True})
                return
            if not server.authorised(self.headers.get("Authorization")):
                self._error(401, "missing or wrong API key")
                return
            try:
                if method == "GET" and path == "/engine_info":
                    self._send(200, server.info())
                elif method == "GET" and path == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": server.served_name, "object": "model"}]})
                elif method == "POST" and path == "/generate":
                    self._send(200, _sglang_generate(server, self._body()))
                elif method == "POST" and path == "/v1/completions":
                    self._send(200, _vllm_completions(server, self._body()))
                elif method == "POST" and path == "/update_weights_from_disk":
                    folder = self._body().get("model_path")
                    try:
                        if not isinstance(folder, str) or not (Path(folder) / "config.json").is_file():
                            raise OSError(f"{folder!r} is not a save_pretrained folder")
                        server.load(folder)
                    except (OSError, ValueError, RuntimeError) as exc:
                        self._send(400, {"success": False, "message": f"cannot load {folder}: {exc}"})
                    else:
                        self._send(200, {"success": True, "message": f"loaded {folder}", "num_paused_requests": 0})
                else:
                    self._error(404, f"{method} {path}: no such endpoint")
            except _BadRequest as exc:
                self._error(400, str(exc))
            except Exception as exc:  # a failure must answer the client, not drop the connection
                log.exception("engine server: %s %s failed", method, path)
                self._error(500, f"{type(exc).__name__}: {exc}")

        def do_GET(self) -> None:
            self._route("GET")

        def do_POST(self) -> None:
            self._route("POST")

    return Handler


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hydroagent_hpc.train.generation.engine_server --model PATH --port N``."""
    ap = argparse.ArgumentParser(prog="python -m hydroagent_hpc.train.generation.engine_server",
                                 description="A causal LM behind the SGLang /generate and vLLM /v1/completions API.")
    ap.add_argument("--model", required=True, help="a save_pretrained folder")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--dtype", choices=tuple(DTYPES), default="float32", help="serving dtype (float32: honest)")
    ap.add_argument("--api-key-env", default=None, help="require the key in this environment variable")
    ap.add_argument("--served-model-name", default=None)
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                    help="where the model runs (auto: CUDA when torch sees a device)")
    ap.add_argument("--context-length", "--max-model-len", dest="context_tokens", type=int, default=None,
                    help="the context length (SGLang's and vLLM's option names; both are accepted)")
    ap.add_argument("--token-delay-s", type=float, default=0.0, help="sleep before every forward pass (tests)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(max(1, min(torch.get_num_threads(), os.cpu_count() or 1)))
    server = EngineServer(args.model, args.host, args.port, args.dtype, args.api_key_env, args.served_model_name,
                          device=args.device, context_tokens=args.context_tokens, token_delay_s=args.token_delay_s)
    log.info("engine server: serving %s (%s on %s, context %s, log-probs %s) at %s", args.model, args.dtype,
             server.device, args.context_tokens or "unlimited",
             "unscaled" if server.original_logprob else "of softmax(logits / T) on /generate", server.url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
