"""A loopback server that replays recorded chat-completion responses (offline tests of a setup).

``POST .../chat/completions`` answers with the next entry of a script, in order; every request
is recorded (with credentials redacted) so a test can check what the client sent. A script is a
JSON list (or ``{"responses": [...], "strict": true}``) whose entries are either

- a chat-completion body (an object with ``choices``), served with status 200, or
- an envelope ``{"status": 429, "headers": {"Retry-After": "1"}, "body": {...}, "delay_s": 2.0}``
  (every key optional; ``raw`` instead of ``body`` sends a text body as it is, UTF-8 encoded with
  lone surrogates passed through as the invalid bytes they make). ``delay_s`` waits
  before answering, to provoke a client timeout; an envelope with neither body nor status
  answers 504 after its delay. ``comment`` is ignored.

Hostile answers, for tests of a client's bounds: ``content_type`` sets the Content-Type header
(default ``application/json`` for ``body``, ``text/plain; charset=utf-8`` for ``raw``; an HTML
page can claim to be JSON); ``drip_s`` sends the answer one byte at a time with that many
seconds between bytes (the body only, or, with ``drip_headers: true``, from the status line
on), so a client whose timeout applies per read waits for ever.

Bounded: the server binds only to a loopback address, reads request bodies up to a size limit,
serves each entry once and then answers 500 "script exhausted". With ``strict`` (the default) it
rejects, with a 400 as OpenAI does and without using an entry, a request whose ``tool`` messages
do not answer the ``tool_call_id``\\ s of the preceding assistant message or that leaves a tool
call unanswered. ``GET .../models`` lists the models the script names.

Use it from Python (``with ReplayServer(script) as srv: OpenAI(base_url=srv.base_url, ...)``)
or from a shell: ``python -m hydroagent_hpc.agents.llm.replay_server --script FILE --port 8765``.
"""

from __future__ import annotations

import argparse
import copy
import ipaddress
import json
import logging
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["ReplayServer", "ReplayEntry", "RecordedRequest", "load_replay_script", "main"]

MAX_BODY_BYTES = 16 * 1024 * 1024
_ENVELOPE_KEYS = {"status", "headers", "body", "raw", "delay_s", "comment", "content_type", "drip_s", "drip_headers"}
MAX_DRIP_S = 60.0
_REDACT = {"authorization", "api-key", "x-api-key", "x-goog-api-key", "proxy-authorization", "cookie"}


@dataclass(frozen=True)
class ReplayEntry:
    """One scripted answer."""

    status: int = 200
    body: Any = None
    raw: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    content_type: str | None = None  # None: JSON for a body, plain text for raw
    drip_s: float = 0.0  # > 0: one byte of the answer every drip_s seconds
    drip_headers: bool = False  # drip from the status line on, not only the body


@dataclass(frozen=True)
class RecordedRequest:
    """A request the server received: path, JSON body, redacted headers, and what it answered."""

    index: int
    method: str
    path: str
    headers: Mapping[str, str]
    body: Any
    status: int
    entry: int | None  # the script entry used; None when the request was rejected or the script ran out


def _entry(i: int, item: Any, where: str) -> ReplayEntry:
    if not isinstance(item, Mapping):
        raise ValueError(f"{where}: entry {i} must be a JSON object, got {type(item).__name__}")
    if "choices" in item or "object" in item:
        return ReplayEntry(body=copy.deepcopy(dict(item)))
    unknown = sorted(set(item) - _ENVELOPE_KEYS)
    if unknown:
        raise ValueError(f"{where}: entry {i}: unknown key(s) {unknown}; an entry is a chat-completion body "
                         f"(with 'choices') or an envelope with {sorted(_ENVELOPE_KEYS)}")
    if "body" in item and "raw" in item:
        raise ValueError(f"{where}: entry {i}: give 'body' or 'raw', not both")
    has_payload = "body" in item or "raw" in item or "status" in item
    status = item.get("status", 200 if has_payload else 504)
    if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
        raise ValueError(f"{where}: entry {i}: status must be an HTTP status code, got {status!r}")
    headers = item.get("headers", {})
    if not isinstance(headers, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                  for k, v in headers.items()):
        raise ValueError(f"{where}: entry {i}: headers must map names to strings")
    delay = item.get("delay_s", 0.0)
    if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not 0 <= delay <= 3600:
        raise ValueError(f"{where}: entry {i}: delay_s must be a number of seconds in [0, 3600]")
    raw = item.get("raw")
    if raw is not None and not isinstance(raw, str):
        raise ValueError(f"{where}: entry {i}: raw must be a string")
    content_type = item.get("content_type")
    if content_type is not None and (not isinstance(content_type, str) or not content_type.isprintable()):
        raise ValueError(f"{where}: entry {i}: content_type must be a header value such as 'text/html'")
    drip = item.get("drip_s", 0.0)
    if isinstance(drip, bool) or not isinstance(drip, (int, float)) or not 0 <= drip <= MAX_DRIP_S:
        raise ValueError(f"{where}: entry {i}: drip_s must be a number of seconds in [0, {MAX_DRIP_S:g}]")
    drip_headers = item.get("drip_headers", False)
    if not isinstance(drip_headers, bool):
        raise ValueError(f"{where}: entry {i}: drip_headers must be true or false")
    body = copy.deepcopy(item.get("body"))
    if not has_payload:
        body = {"error": {"message": "replay: delayed entry without a body", "type": "replay_timeout"}}
    return ReplayEntry(status=status, body=body, raw=raw, headers=dict(headers), delay_s=float(delay),
                       content_type=content_type, drip_s=float(drip), drip_headers=drip_headers)


def load_replay_script(script: str | Path | Sequence[Any] | Mapping[str, Any]) -> tuple[list[ReplayEntry], bool | None]:
    """Entries of a script (a file path, a list, or ``{"responses": [...], "strict": bool}``).

    Returns the entries and the script's ``strict`` setting (``None`` when it does not say).
    """
    where = "script"
    data: Any = script
    if isinstance(script, (str, Path)):
        where = str(script)
        try:
            data = json.loads(Path(script).read_text())
        except FileNotFoundError:
            raise ValueError(f"replay script not found: {script}") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"{script}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    strict = None
    if isinstance(data, Mapping):
        unknown = sorted(set(data) - {"responses", "strict", "comment"})
        if unknown or "responses" not in data:
            raise ValueError(f"{where}: a script object has 'responses' (a list) and optionally 'strict'")
        strict = data.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise ValueError(f"{where}: strict must be true or false")
        data = data["responses"]
    if not isinstance(data, list):
        raise ValueError(f"{where}: a replay script is a JSON list of responses")
    return [_entry(i, item, where) for i, item in enumerate(data)], strict


def _error(message: str, type_: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": None, "code": None}}


def check_tool_messages(body: Any) -> str | None:
    """What OpenAI would reject in a chat request's messages, or ``None`` if it is acceptable."""
    if not isinstance(body, Mapping):
        return "the request body must be a JSON object"
    if not isinstance(body.get("model"), str) or not body.get("model"):
        return "you must provide a model parameter"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty array"
    if body.get("stream"):
        return "the replay server does not stream; send stream=false"
    pending: list[str] = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or m.get("role") not in ("system", "developer", "user", "assistant", "tool"):
            return f"messages[{i}]: a message needs a role of system, developer, user, assistant or tool"
        if m["role"] == "tool":
            tcid = m.get("tool_call_id")
            if not isinstance(tcid, str) or tcid not in pending:
                return (f"messages[{i}]: messages with role 'tool' must be a response to a preceding message "
                        f"with 'tool_calls' (tool_call_id {tcid!r} does not answer one)")
            pending.remove(tcid)
            continue
        if pending:
            return (f"messages[{i}]: an assistant message with 'tool_calls' must be followed by tool messages "
                    f"responding to each 'tool_call_id'; missing: {', '.join(pending)}")
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = m["tool_calls"]
            if not isinstance(calls, list):
                return f"messages[{i}].tool_calls must be an array"
            for j, c in enumerate(calls):
                fn = c.get("function") if isinstance(c, Mapping) else None
                if not isinstance(c, Mapping) or not isinstance(c.get("id"), str) or not isinstance(fn, Mapping) \
                        or not isinstance(fn.get("name"), str) or not isinstance(fn.get("arguments"), str):
                    return f"messages[{i}].tool_calls[{j}] needs an id and a function with a name and arguments text"
                pending.append(c["id"])
    if pending:
        return ("an assistant message with 'tool_calls' must be followed by tool messages responding to each "
                f"'tool_call_id'; missing: {', '.join(pending)}")
    return None


class ReplayServer:
    """Serve ``script`` on ``host:port`` (port 0: a free port) until :meth:`stop`.

    ``base_url`` is what an OpenAI client takes; ``requests`` lists what arrived; ``served``
    counts the entries used. ``strict`` None follows the script (default True). At most
    ``max_records`` requests are kept (then one empty marker record, then none).
    """

    def __init__(self, script: str | Path | Sequence[Any] | Mapping[str, Any], *, host: str = "127.0.0.1",
                 port: int = 0, strict: bool | None = None, max_body_bytes: int = MAX_BODY_BYTES,
                 max_records: int = 10_000) -> None:
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = host == "localhost"
        if not loopback:
            raise ValueError(f"the replay server binds only to a loopback address (127.0.0.1, ::1), not {host!r}")
        self.entries, script_strict = load_replay_script(script)
        self.strict = strict if strict is not None else (script_strict if script_strict is not None else True)
        self.max_body_bytes = int(max_body_bytes)
        self.max_records = int(max_records)
        self._lock = threading.Lock()
        self._next = 0
        self._requests: list[RecordedRequest] = []
        self._count = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        handler = type("_BoundHandler", (_Handler,), {"replay": self})
        server_cls: type[ThreadingHTTPServer] = ThreadingHTTPServer
        if ":" in host:
            server_cls = type("_V6Server", (ThreadingHTTPServer,), {"address_family": socket.AF_INET6})
        self._httpd = server_cls((host, int(port)), handler)
        self._httpd.daemon_threads = True
        self.host = host
        self.port = int(self._httpd.server_address[1])

    # ------------------------------------------------------------------ lifecycle
    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    def start(self) -> ReplayServer:
        """Serve in a background thread."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                            name=f"replay-server-{self.port}", daemon=True)
            self._thread.start()
            log.info("replay server on %s with %d scripted responses", self.base_url, len(self.entries))
        return self

    def serve_forever(self) -> None:
        """Serve in this thread until interrupted (the command line)."""
        log.info("replay server on %s with %d scripted responses", self.base_url, len(self.entries))
        try:
            self._httpd.serve_forever(poll_interval=0.2)
        finally:
            self._httpd.server_close()

    def stop(self) -> None:
        """Stop serving; delayed answers still waiting are cut short."""
        self._stop.set()
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> ReplayServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"ReplayServer({self.base_url}, served={self.served}/{len(self.entries)}, strict={self.strict})"

    # ------------------------------------------------------------------ state
    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    @property
    def served(self) -> int:
        with self._lock:
            return self._next

    @property
    def remaining(self) -> int:
        with self._lock:
            return len(self.entries) - self._next

    def chat_requests(self) -> list[Any]:
        """Bodies of the chat requests that were answered from the script, in order."""
        return [r.body for r in self.requests if r.entry is not None]

    def _take(self) -> tuple[int | None, ReplayEntry | None]:
        with self._lock:
            if self._next >= len(self.entries):
                return None, None
            i = self._next
            self._next += 1
            return i, self.entries[i]

    def _record(self, req: RecordedRequest) -> None:
        with self._lock:
            if len(self._requests) < self.max_records:
                self._requests.append(req)
            elif len(self._requests) == self.max_records:
                log.warning("replay: %d requests recorded; recording no more", self.max_records)
                self._requests.append(RecordedRequest(req.index, "", "", {}, None, 0, None))

    def _new_index(self) -> int:
        with self._lock:
            self._count += 1
            return self._count - 1

    def _models(self) -> list[str]:
        names = []
        for e in self.entries:
            m = e.body.get("model") if isinstance(e.body, Mapping) else None
            if isinstance(m, str) and m not in names:
                names.append(m)
        return names or ["replay"]


class _Handler(BaseHTTPRequestHandler):
    replay: ReplayServer
    server_version = "hydroagent-replay/1"

    def log_message(self, fmt: str, *args: Any) -> None:  # route http.server's lines to logging
        # http.server hands over its own %-format and arguments: joined, they stay lazily formatted
        log.debug("replay %s: " + fmt, self.address_string(), *args)  # noqa: G003

    def _headers(self) -> dict[str, str]:
        return {k: ("[redacted]" if k.lower() in _REDACT else v) for k, v in self.headers.items()}

    def _send(self, status: int, body: Any = None, raw: str | None = None,
              headers: Mapping[str, str] | None = None, content_type: str | None = None,
              drip_s: float = 0.0, drip_headers: bool = False) -> None:
        data = (raw if raw is not None else json.dumps(body if body is not None else {})).encode("utf-8",
                                                                                                 "surrogatepass")
        if content_type is None:
            content_type = "application/json" if raw is None else "text/plain; charset=utf-8"
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            if drip_s > 0 and drip_headers:
                buffered: list[bytes] = getattr(self, "_headers_buffer", [])
                head = b"".join(buffered) + b"\r\n"  # what end_headers would send
                buffered.clear()
                self._drip(head + data, drip_s)
                return
            self.end_headers()
            if drip_s > 0:
                self._drip(data, drip_s)
            else:
                self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (its timeout)
            log.debug("replay: client closed the connection before the answer")

    def _drip(self, data: bytes, drip_s: float) -> None:
        """Write ``data`` one byte every ``drip_s`` seconds, until done, the client leaves or the server stops."""
        for k in range(len(data)):
            self.wfile.write(data[k:k + 1])
            self.wfile.flush()
            if self.replay._stop.wait(drip_s):
                return

    def do_GET(self) -> None:
        if self.path.rstrip("/").endswith("/models"):
            data = [{"id": m, "object": "model", "owned_by": "replay"} for m in self.replay._models()]
            self._send(200, {"object": "list", "data": data})
        else:
            self._send(404, _error(f"no route GET {self.path}", "not_found"))

    def do_POST(self) -> None:
        srv = self.replay
        index = srv._new_index()
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._send(404, _error(f"no route POST {self.path}; the replay server serves /v1/chat/completions",
                                   "not_found"))
            return
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if length < 0 or length > srv.max_body_bytes:
            self._send(413, _error(f"request body must have a Content-Length of at most {srv.max_body_bytes} bytes"))
            return
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            srv._record(RecordedRequest(index, "POST", self.path, self._headers(), None, 400, None))
            self._send(400, _error("the request body is not valid JSON"))
            return
        problem = check_tool_messages(body) if srv.strict else None
        if problem:
            log.warning("replay: rejected request %d: %s", index, problem)
            srv._record(RecordedRequest(index, "POST", self.path, self._headers(), body, 400, None))
            self._send(400, _error(problem))
            return
        i, entry = srv._take()
        if entry is None:
            srv._record(RecordedRequest(index, "POST", self.path, self._headers(), body, 500, None))
            self._send(500, _error(f"replay script exhausted after {len(srv.entries)} responses", "replay_exhausted"))
            return
        srv._record(RecordedRequest(index, "POST", self.path, self._headers(), body, entry.status, i))
        log.debug("replay: request %d -> entry %d (status %d, delay %.2fs)", index, i, entry.status, entry.delay_s)
        if entry.delay_s > 0 and srv._stop.wait(entry.delay_s):
            return  # stopping: drop the answer
        self._send(entry.status, entry.body, entry.raw, entry.headers, entry.content_type, entry.drip_s,
                   entry.drip_headers)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hydroagent_hpc.agents.llm.replay_server --script FILE [--port N] [--lenient]``."""
    ap = argparse.ArgumentParser(prog="python -m hydroagent_hpc.agents.llm.replay_server",
                                 description="Replay recorded chat-completion responses on a loopback port.")
    ap.add_argument("--script", required=True, help="JSON list of responses (see the module docstring)")
    ap.add_argument("--port", type=int, default=8765, help="port (0: any free port; default 8765)")
    ap.add_argument("--host", default="127.0.0.1", help="a loopback address (default 127.0.0.1)")
    ap.add_argument("--lenient", action="store_true", help="accept tool messages without matching tool_call_ids")
    ap.add_argument("-v", "--verbose", action="store_true", help="log every request")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(message)s")
    try:
        srv = ReplayServer(args.script, host=args.host, port=args.port, strict=False if args.lenient else None)
    except (ValueError, OSError) as exc:
        log.error("replay server: %s", exc)
        return 2
    t0 = time.monotonic()
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    log.info("replay server stopped after %.0f s: %d requests, %d of %d responses served", time.monotonic() - t0,
             len(srv.requests), srv.served, len(srv.entries))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
