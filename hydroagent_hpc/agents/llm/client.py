"""One chat-completion request at a time, made robust: retries, backoff, rate limit, accounting.

:class:`ChatClient` wraps the ``openai`` client (its own retries switched off, so every attempt
is seen and counted here) for one :class:`~hydroagent_hpc.agents.llm.models_file.ModelSpec`:

- a wall-clock deadline per attempt (``limits.timeout_s``, from sending the request to the last
  byte of the answer; the HTTP client's own timeout applies per read only, so a server that
  drips a byte every half second would otherwise hold a request for ever): the exchange runs in
  a worker thread that is abandoned at the deadline, and the attempt counts as a "timeout";
- bounded replies: a body beyond ``limits.max_response_bytes`` is not read further and the
  reply is discarded (its text becomes a marked note, so the environment records a parse failure
  and nothing large is kept); the text of a reply and each tool call's arguments are cut to
  ``limits.max_reply_chars`` and the cut is marked, so a huge reply is never sent again with the
  later requests;
- the body is read and checked here, not by the ``openai`` client's models: a 200 whose body is
  not UTF-8 JSON (an HTML error page, a truncated body) or has no usable ``choices[0].message``
  is retried as "bad_response"; a message whose ``content`` is not text or whose ``tool_calls``
  is not an array is passed on marked (:attr:`Completion.tool_calls_error`), for the agent to
  turn into a parse failure of that turn;
- requests never carry lone surrogates (they cannot be encoded as UTF-8): they are replaced by
  U+FFFD in every string sent;
- retries on 429, 408, 409, 5xx, timeouts, connection errors and unusable bodies, at most
  ``limits.max_retries`` after the first attempt, with exponential backoff and jitter
  (``base * 2**(n-1)`` capped at ``backoff_max_s``, scaled by a random factor in [0.5, 1]); a
  ``Retry-After`` (or ``retry-after-ms``) header is obeyed instead, up to ``retry_after_max_s``;
- an optional client-side rate limit (requests per minute, shareable between clients);
- token and cost accounting in a :class:`UsageMeter` (prompt/completion tokens per request and
  in total, cost from the models file's prices, attempts and retries by reason).

Other errors (400, 401, 403, 404, 422) fail at once with a :class:`LLMRequestError` that says
what to check. Those no retry and no later episode can heal (401 and 403: the key or the account; 402:
payment; 404, or a 400/422 whose body says the model is unknown: the model id or ``base_url``) raise
:class:`LLMAccessError`, a :class:`~hydroagent_hpc.errors.CannotHealError`: the episode does not record
it as a policy error, and a campaign stops at once with one line naming the model and the fix.
The API key is passed to the client and nowhere else: it is scrubbed from every message this module
logs or raises, and no repr or usage record holds it.
"""

from __future__ import annotations

import email.utils
import json
import logging
import random
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from hydroagent_hpc.agents.llm.models_file import PLACEHOLDER_KEY, ModelSpec, resolve_api_key
from hydroagent_hpc.env.toolcalls import LONE_SURROGATE
from hydroagent_hpc.errors import CannotHealError, HydroAgentError

log = logging.getLogger(__name__)

__all__ = ["ChatClient", "Completion", "RateLimiter", "UsageMeter", "LLMError", "LLMRequestError", "LLMAccessError",
           "RETRY_KINDS", "unknown_model_reply", "quota_exhausted_reply", "parse_retry_after", "CUT_MARK",
           "DISCARDED_MARK", "NOT_TEXT_MARK", "clean_text"]

RETRY_KINDS = ("rate_limit", "timeout", "connection", "server_error", "bad_response")
_RETRY_STATUS = (408, 409)

#: Notes put into a reply's text where it was cut or could not be used. Plain text in brackets:
#: nothing the tool-call parser could take for a call, and obviously not the model's words.
CUT_MARK = "\n[hydroagent: {more} more characters of this reply were cut off (limits.max_reply_chars = {cap})]"
DISCARDED_MARK = ("[hydroagent: this reply was discarded unread: its response body is larger than "
                  "limits.max_response_bytes = {cap} bytes]")
NOT_TEXT_MARK = "[hydroagent: this reply's message.content was a JSON {kind}, not text]"


class LLMError(HydroAgentError, RuntimeError):
    """A chat request that failed for good. ``kind``: a retry kind or ``http_<status>``."""

    exit_code = 1  # a run that could not complete

    def __init__(self, message: str, *, kind: str = "", status: int | None = None, attempts: int = 0,
                 fix: str = "") -> None:
        super().__init__(message, fix)
        self.kind, self.status, self.attempts = kind, status, attempts


class LLMRequestError(LLMError):
    """The endpoint refused the request, or retries ran out."""


class LLMAccessError(LLMRequestError, CannotHealError):
    """The endpoint refused the key or the account (401, 402, 403) or does not know the model (404, or a
    400/422 saying so): nothing a retry or another episode can change. ``fix`` says what to check."""


#: A 400 or 422 whose error says the model is unknown (providers differ: OpenAI's code ``model_not_found``,
#: vLLM's "The model `x` does not exist", Ollama's "model 'x' not found", OpenRouter's "not a valid model ID").
_UNKNOWN_MODEL = re.compile(r"\bmodel\b[^\n]{0,120}?\b(?:does not exist|not found|is not a valid|no such)\b"
                            r"|\b(?:unknown|invalid|unsupported|no such) model\b|\bnot a valid model\b", re.I)
_UNKNOWN_MODEL_CODES = ("model_not_found", "not_found_error", "notfounderror", "unknown_model", "invalid_model")


def quota_exhausted_reply(body: Any) -> bool:
    """Whether an error reply (a 429) says the account's quota or credit is used up: OpenAI's code
    ``insufficient_quota`` ("You exceeded your current quota, please check your plan and billing
    details"). Unlike a rate limit, no wait heals it within a run."""
    err = body.get("error", body) if isinstance(body, Mapping) else None
    return isinstance(err, Mapping) and any(
        isinstance(err.get(k), str) and err[k].strip().lower() == "insufficient_quota" for k in ("code", "type"))


def unknown_model_reply(body: Any) -> bool:
    """Whether an error reply's body says the model is unknown (its code, type or message)."""
    err = body.get("error", body) if isinstance(body, Mapping) else body
    texts: list[str] = []
    if isinstance(err, Mapping):
        for key in ("code", "type"):
            value = err.get(key)
            if isinstance(value, str) and value.strip().lower() in _UNKNOWN_MODEL_CODES:
                return True
        texts += [v for v in (err.get("message"), body.get("message") if isinstance(body, Mapping) else None)
                  if isinstance(v, str)]
    elif isinstance(err, str):
        texts.append(err)
    return any(_UNKNOWN_MODEL.search(t[:2000]) for t in texts)


@dataclass
class Completion:
    """The parts of one chat-completion response the agent uses, bounded by the limits.

    ``content`` is text or None (a non-text content became :data:`NOT_TEXT_MARK`, a discarded
    body :data:`DISCARDED_MARK`); ``tool_calls`` the message's calls as received (plain JSON
    values, strings cut to ``limits.max_reply_chars``); ``tool_calls_error`` says why
    ``message.tool_calls`` was unusable as a whole (then ``tool_calls`` is empty); ``cut`` counts
    the characters cut off.
    """

    content: str | None
    tool_calls: list[Any]
    finish_reason: str | None
    response_id: str | None
    model: str | None
    usage: dict[str, Any] = field(default_factory=dict)  # this request's entry of UsageMeter.turns
    tool_calls_error: str | None = None
    cut: int = 0
    discarded: bool = False


class RateLimiter:
    """At most ``requests_per_minute`` request starts per minute, evenly spaced; thread-safe.

    Share one instance between the clients (threads) that use the same account.
    """

    def __init__(self, requests_per_minute: float, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if requests_per_minute <= 0:
            raise ValueError("requests_per_minute must be > 0")
        self.interval = 60.0 / float(requests_per_minute)
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()
        self._next = -float("inf")

    def acquire(self) -> float:
        """Wait for the next slot; returns the seconds waited."""
        with self._lock:
            now = self._clock()
            start = max(now, self._next)
            self._next = start + self.interval
        wait = start - now
        if wait > 0:
            self._sleep(wait)
        return max(wait, 0.0)


def parse_retry_after(headers: Mapping[str, str] | None, now: float | None = None) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``retry-after`` (seconds or an HTTP date)."""
    if not headers:
        return None
    lower = {str(k).lower(): str(v) for k, v in headers.items()}
    ms = lower.get("retry-after-ms")
    if ms is not None:
        try:
            return max(float(ms) / 1000.0, 0.0)
        except ValueError:
            pass
    ra = lower.get("retry-after")
    if ra is None:
        return None
    try:
        return max(float(ra), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(ra)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    ref = now if now is not None else datetime.now(timezone.utc).timestamp()
    return max(when.timestamp() - ref, 0.0)


class UsageMeter:
    """Tokens, cost, requests and retries of one episode; :meth:`snapshot` is ``agent.usage``."""

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.reset()

    def reset(self) -> None:
        self.turns: list[dict[str, Any]] = []
        self.attempts = 0
        self.retries: dict[str, int] = {}
        self.errors: dict[str, int] = {}
        self.backoff_s = 0.0
        self.rate_limit_wait_s = 0.0
        self.api_time_s = 0.0
        self.stopped: str | None = None
        self.replies_cut = 0
        self.reply_chars_cut = 0
        self.replies_discarded = 0

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        p = self.spec.prices
        return prompt_tokens * p.input_usd_per_mtok / 1e6 + completion_tokens * p.output_usd_per_mtok / 1e6

    def record(self, response: Mapping[str, Any] | None, attempts: int, latency_s: float,
               finish_reason: str | None, n_tool_calls: int) -> dict[str, Any]:
        """Account one successful response (its decoded JSON body; None if discarded); returns its turn entry."""
        u = _get(response, "usage")
        u = u if isinstance(u, Mapping) else None
        pt, ct = _int(_get(u, "prompt_tokens")), _int(_get(u, "completion_tokens"))
        cached = _int(_get(_get(u, "prompt_tokens_details"), "cached_tokens"))
        reasoning = _int(_get(_get(u, "completion_tokens_details"), "reasoning_tokens"))
        entry = {"request": len(self.turns), "response_id": _str(_get(response, "id")),
                 "prompt_tokens": pt, "completion_tokens": ct, "cached_prompt_tokens": cached,
                 "reasoning_tokens": reasoning, "cost_usd": self.cost(pt or 0, ct or 0),
                 "usage_reported": u is not None and pt is not None and ct is not None,
                 "attempts": attempts, "latency_s": round(latency_s, 6), "finish_reason": finish_reason,
                 "tool_calls": n_tool_calls}
        self.turns.append(entry)
        return entry

    def snapshot(self) -> dict[str, Any]:
        """A JSON-ready summary: totals, prices used, retries by reason and one entry per request."""
        def total(key: str) -> int:
            return int(sum(t[key] or 0 for t in self.turns))

        p = self.spec.prices
        out: dict[str, Any] = dict(self.spec.describe())
        out.update({
            "requests": len(self.turns), "attempts": self.attempts, "retries": int(sum(self.retries.values())),
            "retry_reasons": dict(self.retries), "errors": dict(self.errors),
            "prompt_tokens": total("prompt_tokens"), "completion_tokens": total("completion_tokens"),
            "cached_prompt_tokens": total("cached_prompt_tokens"), "reasoning_tokens": total("reasoning_tokens"),
            "usage_missing": sum(1 for t in self.turns if not t["usage_reported"]),
            "cost_usd": float(sum(t["cost_usd"] for t in self.turns)),
            "prices": {"input_usd_per_mtok": p.input_usd_per_mtok, "output_usd_per_mtok": p.output_usd_per_mtok,
                       "as_of": p.as_of, "assumed": p.assumed},
            "tool_calls": total("tool_calls"), "api_time_s": round(self.api_time_s, 6),
            "backoff_s": round(self.backoff_s, 6), "rate_limit_wait_s": round(self.rate_limit_wait_s, 6),
            "stopped": self.stopped, "replies_cut": self.replies_cut, "reply_chars_cut": self.reply_chars_cut,
            "replies_discarded": self.replies_discarded, "turns": [dict(t) for t in self.turns],
        })
        out["total_tokens"] = out["prompt_tokens"] + out["completion_tokens"]
        return out


def _int(v: Any) -> int | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v in (float("inf"), float("-inf")):
        return None
    return int(v)


def _get(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, Mapping) else None


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


class ChatClient:
    """Chat completions for ``spec`` through the ``openai`` client, with retries and accounting.

    The key comes from ``spec.api_key_env`` (see :func:`resolve_api_key`); ``environ`` replaces
    ``os.environ`` for that lookup. ``limiter`` (else one from ``limits.requests_per_minute``),
    ``sleep``, ``clock`` and ``rng`` are injectable for tests; ``http_client`` is passed to the
    ``openai`` client (proxies, custom transports).
    """

    def __init__(self, spec: ModelSpec, *, environ: Mapping[str, str] | None = None,
                 limiter: RateLimiter | None = None, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic, rng: random.Random | None = None,
                 http_client: Any = None) -> None:
        try:
            import openai
        except ImportError:
            raise ImportError("the openai package is needed for hosted and served models: "
                              "pip install 'hydroagent-hpc[llm]'") from None
        self.spec = spec
        key = resolve_api_key(spec, environ)
        self._secrets = tuple(s for s in {key} if s and s != PLACEHOLDER_KEY and len(s) >= 4)
        self._client = openai.OpenAI(api_key=key, base_url=spec.base_url, timeout=spec.limits.timeout_s,
                                     max_retries=0, http_client=http_client)
        del key
        rpm = spec.limits.requests_per_minute
        self.limiter = limiter if limiter is not None else (RateLimiter(rpm, clock=clock, sleep=sleep) if rpm else None)
        self._sleep, self._clock = sleep, clock
        self._rng = rng or random.Random()
        self.meter = UsageMeter(spec)

    def __repr__(self) -> str:
        return f"ChatClient(model={self.spec.model!r}, base_url={self.spec.base_url!r})"

    def close(self) -> None:
        self._client.close()

    def scrub(self, text: str) -> str:
        """``text`` with the key replaced by ``[redacted]``."""
        for s in self._secrets:
            text = text.replace(s, "[redacted]")
        return text

    def request_arguments(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping] | None = None,
                          seed: int | None = None) -> dict[str, Any]:
        """The keyword arguments of ``chat.completions.create``.

        ``None`` sampling values are left out; ``seed`` is sent only where ``spec.send_seed``. Lone
        surrogates in the messages become U+FFFD (see :func:`clean_text`).
        """
        s = self.spec.sampling
        kwargs: dict[str, Any] = {"model": self.spec.model, "messages": [_clean(dict(m)) for m in messages]}
        if tools:
            kwargs["tools"] = [dict(t) for t in tools]
        if s.temperature is not None:
            kwargs["temperature"] = s.temperature
        if s.top_p is not None:
            kwargs["top_p"] = s.top_p
        if s.max_tokens is not None:
            kwargs[s.max_tokens_param] = s.max_tokens
        if seed is not None and self.spec.send_seed:
            kwargs["seed"] = int(seed)
        if self.spec.extra_body:
            kwargs["extra_body"] = dict(self.spec.extra_body)
        return kwargs

    def complete(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping] | None = None,
                 seed: int | None = None) -> Completion:
        """One completion, retried as the limits allow; raises :class:`LLMRequestError` for good.

        Each attempt ends within ``limits.timeout_s`` of wall-clock time; the whole call within
        ``(max_retries + 1) * timeout_s`` plus the waits between attempts.
        """
        kwargs = self.request_arguments(messages, tools, seed)
        lim = self.spec.limits
        attempt = 0
        while True:
            attempt += 1
            if self.limiter is not None:
                self.meter.rate_limit_wait_s += self.limiter.acquire()
            self.meter.attempts += 1
            t0 = self._clock()
            body: dict[str, Any] | None = None
            answered = False
            unknown_model = out_of_credit = False
            kind: str | None
            status: int | None
            retry_after: float | None
            try:
                data, over = self._exchange(kwargs)
                body, detail = (None, "") if over else _decode_body(data)
                answered = over or body is not None
                kind, status, retry_after = (None, None, None) if answered else ("bad_response", 200, None)
            except Exception as exc:  # classified below; anything not from the API or HTTP is re-raised
                kind, status, retry_after, detail = self._classify(exc)
                unknown_model = unknown_model_reply(getattr(exc, "body", None))
                if kind == "rate_limit" and quota_exhausted_reply(getattr(exc, "body", None)):
                    kind, out_of_credit = None, True  # not a rate limit: no wait heals it within the run
            elapsed = self._clock() - t0
            self.meter.api_time_s += elapsed
            if answered:
                return self._completion(body, attempt, elapsed)
            retryable = kind in RETRY_KINDS
            if not retryable or attempt > lim.max_retries:
                label = kind or f"http_{status}"
                self.meter.errors[label] = self.meter.errors.get(label, 0) + 1
                why = f"giving up after {attempt} attempts" if retryable else "not retryable"
                where = f"{self.spec.name} ({self.spec.model} at {self.spec.base_url})"
                fix = None if retryable else self._cannot_heal(status, unknown_model, out_of_credit)
                if fix is not None:  # no retry or later episode can heal it: the caller stops, printing it once
                    message = self.scrub(f"model {where}: {detail} [{label}; not retryable]")
                    log.debug("%s; fix: %s", message, fix)
                    raise LLMAccessError(message, kind=label, status=status, attempts=attempt,
                                         fix=self.scrub(fix)) from None
                message = self.scrub(f"{where}: {detail} [{label}; {why}]{self._hint(status)}")
                log.error("%s", message)
                raise LLMRequestError(message, kind=label, status=status, attempts=attempt) from None
            delay = self.retry_delay(attempt, retry_after)
            reason = str(kind)  # retryable: one of RETRY_KINDS
            self.meter.retries[reason] = self.meter.retries.get(reason, 0) + 1
            self.meter.backoff_s += delay
            log.warning("%s: %s (attempt %d of %d): %s; retrying in %.2f s", self.spec.name, kind, attempt,
                        lim.max_retries + 1, self.scrub(detail)[:300], delay)
            if delay > 0:
                self._sleep(delay)

    def _exchange(self, kwargs: Mapping[str, Any]) -> tuple[bytes, bool]:
        """Send one request and read its body, within ``limits.timeout_s`` of wall-clock time.

        Returns the body (at most ``limits.max_response_bytes``) and whether it was longer. The
        exchange runs in a daemon thread; at the deadline it is told to stop (it does at the next
        chunk it reads, or when its per-read timeout fires) and :class:`_DeadlineExceeded` is
        raised here. HTTP errors come from the ``openai`` client as its exceptions.
        """
        lim = self.spec.limits
        cap = lim.max_response_bytes
        cancel = threading.Event()
        box: dict[str, Any] = {}

        def work() -> None:
            try:
                with self._client.chat.completions.with_streaming_response.create(**kwargs) as response:
                    buf = bytearray()
                    for chunk in response.iter_bytes():
                        if cancel.is_set():
                            return
                        buf += chunk
                        if len(buf) > cap:
                            box["answer"] = (bytes(buf[:cap]), True)
                            return
                    box["answer"] = (bytes(buf), False)
            except BaseException as exc:  # handed to the caller (or dropped if it gave up)
                box["error"] = exc

        worker = threading.Thread(target=work, name=f"chat-{self.spec.name}", daemon=True)
        worker.start()
        worker.join(lim.timeout_s)
        if worker.is_alive():
            cancel.set()
            raise _DeadlineExceeded(lim.timeout_s)
        if "error" in box:
            raise box["error"]
        return box["answer"]

    def _completion(self, body: dict[str, Any] | None, attempt: int, elapsed: float) -> Completion:
        """The usable parts of a checked body (None: a body over the byte limit), bounded and accounted."""
        lim = self.spec.limits
        if body is None:
            self.meter.replies_discarded += 1
            log.warning("%s: a response body over limits.max_response_bytes (%d) was discarded", self.spec.name,
                        lim.max_response_bytes)
            entry = self.meter.record(None, attempt, elapsed, None, 0)
            return Completion(DISCARDED_MARK.format(cap=lim.max_response_bytes), [], None, None, None, entry,
                              discarded=True)
        choice = body["choices"][0]
        msg = choice["message"]
        content, cut = _text(msg.get("content"), lim.max_reply_chars)
        calls, calls_error, cut_calls = _tool_calls(msg.get("tool_calls"), lim.max_reply_chars)
        cut += cut_calls
        if cut:
            self.meter.replies_cut += 1
            self.meter.reply_chars_cut += cut
            log.warning("%s: %d characters of a reply cut off (limits.max_reply_chars = %d)", self.spec.name, cut,
                        lim.max_reply_chars)
        if calls_error:
            log.warning("%s: %s", self.spec.name, calls_error)
        finish = choice.get("finish_reason")
        entry = self.meter.record(body, attempt, elapsed, finish if isinstance(finish, str) else None, len(calls))
        return Completion(content, calls, entry["finish_reason"], entry["response_id"], _str(body.get("model")),
                          entry, tool_calls_error=calls_error, cut=cut)

    def retry_delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait after failed attempt ``attempt`` (1-based): Retry-After, else backoff."""
        lim = self.spec.limits
        if retry_after is not None:
            if retry_after > lim.retry_after_max_s:
                log.warning("%s: Retry-After %.0f s capped at %.0f s", self.spec.name, retry_after,
                            lim.retry_after_max_s)
            return min(retry_after, lim.retry_after_max_s)
        cap = min(lim.backoff_max_s, lim.backoff_base_s * 2 ** (attempt - 1))
        return cap * (0.5 + 0.5 * self._rng.random())

    def _classify(self, exc: Exception) -> tuple[str | None, int | None, float | None, str]:
        """(retry kind or None, HTTP status, Retry-After seconds, scrubbed detail)."""
        import openai

        if isinstance(exc, _DeadlineExceeded):
            return "timeout", None, None, (f"no complete answer within {exc.seconds:g} s (limits.timeout_s, the "
                                           "wall-clock deadline of one attempt)")
        if isinstance(exc, openai.APITimeoutError):
            return "timeout", None, None, f"no answer within {self.spec.limits.timeout_s:g} s"
        if isinstance(exc, openai.APIConnectionError):
            return "connection", None, None, f"connection failed ({type(exc).__name__})"
        # reading the body happens after the openai client has returned: its HTTP library's errors
        http = _http_errors()
        if isinstance(exc, http["timeout"]):
            return "timeout", None, None, f"no data for {self.spec.limits.timeout_s:g} s while reading the answer"
        if isinstance(exc, http["decoding"]):
            return "bad_response", None, None, f"the response body could not be decoded ({type(exc).__name__})"
        if isinstance(exc, http["transport"]):
            return "connection", None, None, f"the connection failed while reading the answer ({type(exc).__name__})"
        if isinstance(exc, openai.APIStatusError):
            status = int(exc.status_code)
            headers = getattr(getattr(exc, "response", None), "headers", None)
            retry_after = parse_retry_after(headers)
            detail = self.scrub(f"HTTP {status}: {_error_message(exc)}")
            if status == 429:
                return "rate_limit", status, retry_after, detail
            if status >= 500 or status in _RETRY_STATUS:
                return "server_error", status, retry_after, detail
            return None, status, None, detail
        raise exc

    def _cannot_heal(self, status: int | None, unknown_model: bool, out_of_credit: bool = False) -> str | None:
        """The fix for a refusal no retry or later episode can heal; None for the others."""
        spec = self.spec
        if out_of_credit:
            return (f"the account behind {spec.base_url} is out of quota or credit: check its plan and billing, "
                    "then rerun (stored episodes are kept)")
        if status in (401, 403):
            key = (f"check the key in ${spec.api_key_env}" if spec.api_key_env else
                   f"entry {spec.name!r} sends no key (api_key_env: null): name the variable holding the server's key")
            return f"{key} and the account's access to model {spec.model!r}, then rerun (stored episodes are kept)"
        if status == 402:
            return f"check the account's credit or billing for {spec.base_url}, then rerun (stored episodes are kept)"
        if status == 404 or (status in (400, 422) and unknown_model):
            return (f"check the model id {spec.model!r} of entry {spec.name!r} and its base_url {spec.base_url} in "
                    "the models file (a local server: the name it serves), then rerun (stored episodes are kept)")
        return None

    def _hint(self, status: int | None) -> str:
        if status in (401, 403):
            return f"; check the key in ${self.spec.api_key_env} and the account's access to {self.spec.model!r}"
        if status == 404:
            return f"; check the model id {self.spec.model!r} and base_url in the models file"
        if status in (400, 422):
            return "; the endpoint rejected the request (context too long, or a parameter this model does not take?)"
        return ""


def _error_message(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, Mapping):
        err = body.get("error", body)
        if isinstance(err, Mapping) and isinstance(err.get("message"), str):
            return err["message"][:500]
    return str(getattr(exc, "message", "") or type(exc).__name__)[:500]


class _DeadlineExceeded(Exception):
    """One attempt ran past ``limits.timeout_s`` of wall-clock time."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"deadline of {seconds:g} s exceeded")
        self.seconds = seconds


def _http_errors() -> dict[str, tuple[type[BaseException], ...]]:
    """Timeout, transport and decoding error classes of the HTTP libraries the openai client may use."""
    found: dict[str, list[type[BaseException]]] = {"timeout": [], "transport": [], "decoding": []}
    for name in ("httpx2", "httpx"):
        try:
            mod = __import__(name)
        except ImportError:
            continue
        found["timeout"].append(mod.TimeoutException)
        found["transport"].append(mod.TransportError)
        found["decoding"].append(mod.DecodingError)
    return {k: tuple(v) for k, v in found.items()}


def _kind(v: Any) -> str:
    """The JSON name of a decoded value's type."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    return {int: "number", float: "number", str: "string", list: "array", dict: "object"}.get(type(v), type(v).__name__)


def _snippet(text: str, n: int = 80) -> str:
    """The start of an untrusted text for a log line: one line, escaped, short."""
    return json.dumps(text[:n])


def _decode_body(data: bytes) -> tuple[dict[str, Any] | None, str]:
    """A 200 body as a chat-completion object with a usable ``choices[0].message``, or (None, why not)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, f"the response body is not UTF-8 text (bad byte at offset {exc.start})"
    try:
        body = json.loads(text)
    except RecursionError:
        return None, "the response body is JSON nested too deeply"
    except ValueError as exc:
        head = text.lstrip()[:200]
        if head.startswith("<"):
            title = re.search(r"<title>(.*?)</title>", head, re.I | re.S)
            what = f": {_snippet(title.group(1).strip())}" if title else ""
            return None, f"the response is an HTML page, not JSON (a proxy or gateway error?){what}"
        if not head:
            return None, "the response body is empty"
        return None, f"the response body is not JSON ({exc}); it starts {_snippet(head)}"
    if not isinstance(body, dict):
        return None, f"the response is a JSON {_kind(body)}, not an object"
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices:
        err = body.get("error")
        msg = err.get("message") if isinstance(err, Mapping) else err
        if msg is not None:
            return None, f"the response carries an error instead of choices: {_snippet(str(msg), 300)}"
        return None, ("the response has no choices" if choices in (None, []) else
                      f"the response's choices are a JSON {_kind(choices)}, not an array")
    if not isinstance(choices[0], dict):
        return None, f"the response's first choice is a JSON {_kind(choices[0])}, not an object"
    if not isinstance(choices[0].get("message"), dict):
        return None, "the response's first choice has no message object"
    return body, ""


def _cut(text: str, cap: int) -> tuple[str, int]:
    """``text`` cut to ``cap`` characters with :data:`CUT_MARK` appended, and the number cut."""
    if len(text) <= cap:
        return text, 0
    more = len(text) - cap
    return text[:cap] + CUT_MARK.format(more=more, cap=cap), more


def _text(content: Any, cap: int) -> tuple[str | None, int]:
    """A message's content as text (None stays None; a list of text parts is joined), cut to ``cap``."""
    if content is None or isinstance(content, str):
        return (None, 0) if content is None else _cut(content, cap)
    if isinstance(content, list) and content and all(
            isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
        return _cut("".join(p["text"] for p in content), cap)
    return NOT_TEXT_MARK.format(kind=_kind(content)), 0


def _tool_calls(value: Any, cap: int) -> tuple[list[Any], str | None, int]:
    """``message.tool_calls`` bounded: (calls, why unusable as a whole or None, characters cut).

    Every string in a call is cut to ``cap`` characters (marked); calls that together still hold
    more than ``2 * cap`` characters are unusable as a whole, as is a value that is not an array.
    """
    if value is None:
        return [], None, 0
    if not isinstance(value, list):
        return [], f"message.tool_calls must be an array of tool calls, got a JSON {_kind(value)}", 0
    cut = 0

    def bound(v: Any) -> Any:
        nonlocal cut
        if isinstance(v, str):
            v, n = _cut(v, cap)
            cut += n
            return v
        if isinstance(v, dict):
            return {str(k)[:cap]: bound(x) for k, x in v.items()}
        if isinstance(v, list):
            return [bound(x) for x in v]
        return v

    try:
        calls = [bound(c) for c in value]
        size = len(json.dumps(calls, ensure_ascii=False))
    except RecursionError:
        return [], "message.tool_calls is nested too deeply", 0
    if size > 2 * cap:
        return [], (f"message.tool_calls holds {size} characters, more than twice limits.max_reply_chars "
                    f"({cap}); none of its calls was kept"), cut
    return calls, None, cut


def clean_text(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD (what UTF-8 can encode)."""
    return LONE_SURROGATE.sub("\ufffd", text)


def _clean(value: Any) -> Any:
    """``value`` (JSON-like) with :func:`clean_text` applied to every string, keys included."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, Mapping):
        return {_clean(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value
