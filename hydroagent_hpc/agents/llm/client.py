"""One chat-completion request at a time, made robust: retries, backoff, rate limit, accounting.

:class:`ChatClient` wraps the ``openai`` client (its own retries switched off, so every attempt
is seen and counted here) for one :class:`~hydroagent_hpc.agents.llm.models_file.ModelSpec`:

- a per-request timeout (``limits.timeout_s``);
- retries on 429, 408, 409, 5xx, timeouts, connection errors and unusable bodies, at most
  ``limits.max_retries`` after the first attempt, with exponential backoff and jitter
  (``base * 2**(n-1)`` capped at ``backoff_max_s``, scaled by a random factor in [0.5, 1]); a
  ``Retry-After`` (or ``retry-after-ms``) header is obeyed instead, up to ``retry_after_max_s``;
- an optional client-side rate limit (requests per minute, shareable between clients);
- token and cost accounting in a :class:`UsageMeter` (prompt/completion tokens per request and
  in total, cost from the models file's prices, attempts and retries by reason).

Other errors (400, 401, 403, 404, 422) fail at once with a :class:`LLMRequestError` that says
what to check. The API key is passed to the client and nowhere else: it is scrubbed from every
message this module logs or raises, and no repr or usage record holds it.
"""

from __future__ import annotations

import email.utils
import logging
import random
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Mapping, Sequence

from hydroagent_hpc.agents.llm.models_file import PLACEHOLDER_KEY, ModelSpec, resolve_api_key
from hydroagent_hpc.errors import HydroAgentError

log = logging.getLogger(__name__)

__all__ = ["ChatClient", "Completion", "RateLimiter", "UsageMeter", "LLMError", "LLMRequestError",
           "RETRY_KINDS", "parse_retry_after"]

RETRY_KINDS = ("rate_limit", "timeout", "connection", "server_error", "bad_response")
_RETRY_STATUS = (408, 409)


class LLMError(HydroAgentError, RuntimeError):
    """A chat request that failed for good. ``kind``: a retry kind or ``http_<status>``."""

    exit_code = 1  # a run that could not complete

    def __init__(self, message: str, *, kind: str = "", status: int | None = None, attempts: int = 0) -> None:
        super().__init__(message)
        self.kind, self.status, self.attempts = kind, status, attempts


class LLMRequestError(LLMError):
    """The endpoint refused the request, or retries ran out."""


@dataclass
class Completion:
    """The parts of one chat-completion response the agent uses."""

    content: str | None
    tool_calls: list[Any]
    finish_reason: str | None
    response_id: str | None
    model: str | None
    usage: dict[str, Any] = field(default_factory=dict)  # this request's entry of UsageMeter.turns


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

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        p = self.spec.prices
        return prompt_tokens * p.input_usd_per_mtok / 1e6 + completion_tokens * p.output_usd_per_mtok / 1e6

    def record(self, response: Any, attempts: int, latency_s: float, finish_reason: str | None,
               n_tool_calls: int) -> dict[str, Any]:
        """Account one successful response; returns its turn entry."""
        u = getattr(response, "usage", None)
        pt, ct = _int(getattr(u, "prompt_tokens", None)), _int(getattr(u, "completion_tokens", None))
        cached = _int(getattr(getattr(u, "prompt_tokens_details", None), "cached_tokens", None))
        reasoning = _int(getattr(getattr(u, "completion_tokens_details", None), "reasoning_tokens", None))
        entry = {"request": len(self.turns), "response_id": _str(getattr(response, "id", None)),
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
            "stopped": self.stopped, "turns": [dict(t) for t in self.turns],
        })
        out["total_tokens"] = out["prompt_tokens"] + out["completion_tokens"]
        return out


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


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

        ``None`` sampling values are left out; ``seed`` is sent only where ``spec.send_seed``.
        """
        s = self.spec.sampling
        kwargs: dict[str, Any] = {"model": self.spec.model, "messages": [dict(m) for m in messages]}
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
        """One completion, retried as the limits allow; raises :class:`LLMRequestError` for good."""
        kwargs = self.request_arguments(messages, tools, seed)
        lim = self.spec.limits
        attempt = 0
        while True:
            attempt += 1
            if self.limiter is not None:
                self.meter.rate_limit_wait_s += self.limiter.acquire()
            self.meter.attempts += 1
            t0 = self._clock()
            try:
                response = self._client.chat.completions.create(**kwargs)
                problem = _unusable(response)
                kind, status, retry_after, detail = ("bad_response", 200, None, problem) if problem else \
                    (None, None, None, "")
            except Exception as exc:  # classified below; anything not from the API is re-raised
                response = None
                kind, status, retry_after, detail = self._classify(exc)
            elapsed = self._clock() - t0
            self.meter.api_time_s += elapsed
            if response is not None and kind is None:
                choice = response.choices[0]
                msg = choice.message
                calls = list(getattr(msg, "tool_calls", None) or [])
                entry = self.meter.record(response, attempt, elapsed, getattr(choice, "finish_reason", None),
                                          len(calls))
                return Completion(getattr(msg, "content", None), calls, entry["finish_reason"], entry["response_id"],
                                  _str(getattr(response, "model", None)), entry)
            retryable = kind in RETRY_KINDS
            if not retryable or attempt > lim.max_retries:
                label = kind or f"http_{status}"
                self.meter.errors[label] = self.meter.errors.get(label, 0) + 1
                why = f"giving up after {attempt} attempts" if retryable else "not retryable"
                message = self.scrub(f"{self.spec.name} ({self.spec.model} at {self.spec.base_url}): {detail} "
                                     f"[{label}; {why}]{self._hint(status)}")
                log.error("%s", message)
                raise LLMRequestError(message, kind=label, status=status, attempts=attempt) from None
            delay = self.retry_delay(attempt, retry_after)
            self.meter.retries[kind] = self.meter.retries.get(kind, 0) + 1
            self.meter.backoff_s += delay
            log.warning("%s: %s (attempt %d of %d): %s; retrying in %.2f s", self.spec.name, kind, attempt,
                        lim.max_retries + 1, self.scrub(detail)[:300], delay)
            if delay > 0:
                self._sleep(delay)

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

        if isinstance(exc, openai.APITimeoutError):
            return "timeout", None, None, f"no answer within {self.spec.limits.timeout_s:g} s"
        if isinstance(exc, openai.APIConnectionError):
            return "connection", None, None, f"connection failed ({type(exc).__name__})"
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


def _unusable(response: Any) -> str | None:
    """Why a 200 response cannot be used (no choices, no message), or None."""
    choices = getattr(response, "choices", None)
    if not choices:
        return "the response has no choices"
    if getattr(choices[0], "message", None) is None:
        return "the response's first choice has no message"
    return None
