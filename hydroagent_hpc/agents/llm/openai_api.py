"""OpenAIAgent: a calibration policy served by any OpenAI-compatible chat endpoint.

Hosted frontier models (Anthropic, OpenAI, Google compatibility endpoints) and local vLLM or
SGLang servers on a GPU node all go through the ``openai`` client; which one, and how, is an
entry of the models file (:mod:`hydroagent_hpc.agents.llm.models_file`). Requests, retries, rate
limits and token/cost accounting are :class:`~hydroagent_hpc.agents.llm.client.ChatClient`'s.

Two tool modes:

- ``native`` (function calling): the request carries ``tools=toolcalls.tool_schemas()``. The
  rollout hands ``env.step`` text, so the model's ``message.tool_calls`` are rendered as Hermes
  ``<tool_call>`` blocks, one per native call, in order: a well-formed call exactly as
  :func:`~hydroagent_hpc.env.toolcalls.render_hermes` writes it ("<" escaped as ``\\u003c`` so no
  argument text can close a block), a broken one as a block holding its raw name and raw
  ``arguments`` string, which the environment's strict parser rejects for the
  same reason :func:`~hydroagent_hpc.env.toolcalls.from_openai_tool_calls` gives (checked on every
  message; a mismatch is logged). Tags inside the model's prose are defused (``[tool_call]``)
  so the environment executes exactly what the model called natively. The conversation sent
  back to the API keeps the native form: the assistant message with its ``tool_calls`` (echoed
  as received, so provider extras such as Gemini thought signatures survive) and one ``tool``
  message per call, answering its ``tool_call_id`` with the observation the rollout appended
  for that call (observations arrive in call order). Observations without a call (a message
  with no native call, or beyond the per-message limit) are sent as a user message of
  ``<tool_response>`` blocks; calls the environment did not reach are answered "not executed".
  A reply without native calls is passed on as text, so Hermes blocks in it still count.
  A malformed ``tool_calls`` field (not an array, or items that are not ``{"function": {"name":
  text, ...}}`` objects) is no reason to end the episode: each item becomes a block the
  environment rejects (a parse failure of that turn), and since such calls cannot be echoed to
  the API, the assistant message is kept as that text and its observations go back as a user
  message.
- ``hermes`` (servers without function calling): no ``tools`` in the request (the system
  prompt describes them); the model's text goes to the environment as it is; observations are
  sent as ``tool`` messages or, with ``observation_role: user``, as one user message of
  ``<tool_response>`` blocks per step.

Replies are bounded by the client (:mod:`~hydroagent_hpc.agents.llm.client`): text cut to
``limits.max_reply_chars`` and marked, bodies over ``limits.max_response_bytes`` discarded, so
what the environment sees and what is sent again stays small. Text with lone surrogates reaches
the environment as it is (its parser makes the message one "invalid_text" parse failure) and is
sent back to the API with U+FFFD in their place.

``agent.usage`` is the episode's token and cost record (store it in ``Episode.usage``); it
restarts when a new conversation begins. API keys never reach logs, errors, reprs or usage.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from hydroagent_hpc.agents.llm.client import ChatClient, Completion
from hydroagent_hpc.agents.llm.models_file import Limits, ModelSpec, Prices, Sampling, get_model
from hydroagent_hpc.env import toolcalls
from hydroagent_hpc.errors import ConfigError
from hydroagent_hpc.params import ParameterSet
from hydroagent_hpc.types import ToolCall

log = logging.getLogger(__name__)

__all__ = ["OpenAIAgent", "make_openai_agent", "native_calls_to_text", "with_changes", "NOT_EXECUTED", "echoable",
           "unusable_calls_block"]

NOT_EXECUTED = json.dumps({"status": "error", "error": "not_executed",
                           "message": "this call was not executed (the message had more calls than the "
                                      "environment runs per message, or the episode ended)"})
_SECTIONS = {"sampling": Sampling, "prices": Prices, "limits": Limits}


def with_changes(spec: ModelSpec, **changes: Any) -> ModelSpec:
    """``spec`` with fields replaced; section fields by their own name (``timeout_s=0.5``)."""
    top = {f.name for f in dataclasses.fields(ModelSpec)}
    direct = {k: v for k, v in changes.items() if k in top}
    for section, cls in _SECTIONS.items():
        names = {f.name for f in dataclasses.fields(cls)}
        sub = {k: v for k, v in changes.items() if k in names}
        if sub:
            direct[section] = dataclasses.replace(direct.get(section, getattr(spec, section)), **sub)
    unknown = set(changes) - top - {n for c in _SECTIONS.values() for n in (f.name for f in dataclasses.fields(c))}
    if unknown:
        raise ConfigError(f"unknown model setting(s) {sorted(unknown)}",
                          "use the names of the models file's keys (sections' keys by their own name)")
    return dataclasses.replace(spec, **direct)


def _get(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, Mapping) else getattr(obj, key, None)


def _raw_block(call: Any) -> str:
    """A Hermes block carrying a native call as received (for calls that do not parse)."""
    fn = _get(call, "function")
    typ, name, args = _get(call, "type"), _get(fn, "name"), _get(fn, "arguments")
    obj: dict[str, Any] = {}
    if typ is not None and typ != "function":
        obj["type"] = str(typ)
    if name is not None:
        obj["name"] = name if isinstance(name, (str, int, float, bool)) else str(name)
    if args is not None:
        obj["arguments"] = args if isinstance(args, (str, Mapping)) else str(args)
    try:
        return _block(obj)
    except (TypeError, ValueError):  # non-finite numbers in dict arguments: keep them as (invalid) text
        obj["arguments"] = json.dumps(args, ensure_ascii=False, default=str)
        return _block(obj)


def _block(obj: Mapping[str, Any]) -> str:
    """``obj`` in a Hermes block, serialised as :func:`toolcalls.render_hermes` does.

    "<" is written as the JSON escape ``\\u003c`` (it can only occur inside strings), so text
    such as "</tool_call>" inside arguments cannot close the block early; a call without "<" is
    byte for byte what render_hermes writes.
    """
    body = json.dumps(obj, ensure_ascii=False, allow_nan=False).replace("<", "\\u003c")
    return f"{toolcalls.OPEN_TAG}\n{body}\n{toolcalls.CLOSE_TAG}"


def _defuse(text: str) -> str:
    return text.replace(toolcalls.OPEN_TAG, "[tool_call]").replace(toolcalls.CLOSE_TAG, "[/tool_call]")


def native_calls_to_text(tool_calls: Sequence[Any], content: str | None = None) -> str:
    """The assistant text ``env.step`` needs to execute exactly ``tool_calls``, in order.

    Prose first (with any tags defused), then one Hermes block per native call.
    """
    calls = list(tool_calls)
    parsed = toolcalls.from_openai_tool_calls(calls, max_calls=max(len(calls), 1))
    blocks = []
    for call, item in zip(calls, parsed.items()):
        blocks.append(_block({"name": item.name, "arguments": dict(item.arguments)}) if isinstance(item, ToolCall)
                      else _raw_block(call))
    joined = "\n".join(blocks)
    if not toolcalls.LONE_SURROGATE.search(joined):  # with one, the whole message is "invalid_text" by design
        check = toolcalls.parse_message(joined, max_calls=max(len(calls), 1), max_chars=max(len(joined), 1))
        want = [(type(i).__name__, getattr(i, "reason", getattr(i, "name", ""))) for i in parsed.items()]
        got = [(type(i).__name__, getattr(i, "reason", getattr(i, "name", ""))) for i in check.items()]
        if calls and want != got:
            log.warning("native tool calls rendered as Hermes parse differently: %s vs %s", want, got)
    prose = _defuse(content or "").strip()
    return "\n".join([prose] + blocks if prose else blocks)


def unusable_calls_block(why: str) -> str:
    """A block standing for a ``tool_calls`` field that is not an array: the environment rejects it
    ("malformed_call"), so the turn records a parse failure."""
    return _block({"tool_calls": why})


def echoable(tool_calls: Sequence[Any]) -> bool:
    """Whether every call can be sent back to the API as received: an object whose ``function``
    is an object with a text ``name`` and text, object or absent ``arguments``."""
    for call in tool_calls:
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) \
                or not (fn.get("arguments") is None or isinstance(fn.get("arguments"), (str, Mapping))) \
                or not (call.get("type") is None or isinstance(call.get("type"), str)):
            return False
    return True


def _drop_none(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


def _echo_call(call: Any, call_id: str) -> dict[str, Any]:
    """A tool call as the API should see it again: as received (extras kept), id fixed."""
    data = call.model_dump(exclude_none=True) if hasattr(call, "model_dump") else _drop_none(dict(call))
    data["id"] = call_id
    data.setdefault("type", "function")
    fn = dict(data.get("function") or {})
    args = fn.get("arguments")
    if not isinstance(args, str):
        fn["arguments"] = "" if args is None else json.dumps(args, ensure_ascii=False, default=str)
    fn.setdefault("name", "")
    data["function"] = fn
    return data


def _responses(observations: Sequence[str]) -> str:
    return "\n".join(f"<tool_response>\n{o}\n</tool_response>" for o in observations)


class OpenAIAgent:
    """A :class:`~hydroagent_hpc.agents.base.Policy` over an OpenAI-compatible endpoint.

    ``spec``: a :class:`ModelSpec` or a name in the models file (``models_file``, default
    ``data/models.yaml``); ``changes`` replace spec fields (``base_url=``, ``tool_mode=``,
    ``timeout_s=``, ``max_retries=``, ``temperature=`` ...). ``client`` replaces the
    :class:`ChatClient` (tests inject clocks); ``client_options`` go to it. ``seed`` is sent
    with every request where the spec says ``send_seed`` (local servers); ``max_cost_usd`` stops the
    episode (``act`` returns None, ``usage["stopped"] == "cost_budget"``) once the estimated cost
    reaches it; ``max_calls_per_message`` should match the environment's.
    """

    def __init__(self, spec: ModelSpec | str, *, models_file: str | None = None, client: ChatClient | None = None,
                 name: str | None = None, seed: int | None = None, max_cost_usd: float | None = None,
                 clip_out_of_bounds: bool = True, client_options: Mapping[str, Any] | None = None,
                 **changes: Any) -> None:
        base = get_model(spec, models_file) if isinstance(spec, str) else spec
        self.spec = with_changes(base, **changes) if changes else base
        self.client = client if client is not None else ChatClient(self.spec, **dict(client_options or {}))
        self.name = name or self.spec.name
        self.seed = seed
        self.max_cost_usd = max_cost_usd
        self.native = self.spec.tool_mode == "native"
        self.clip_out_of_bounds = bool(clip_out_of_bounds)
        self._tools = toolcalls.tool_schemas(clip_out_of_bounds) if self.native else None
        self.reset()

    def __repr__(self) -> str:
        return (f"OpenAIAgent(name={self.name!r}, model={self.spec.model!r}, base_url={self.spec.base_url!r}, "
                f"tool_mode={self.spec.tool_mode!r})")

    def close(self) -> None:
        """Close the HTTP connections."""
        self.client.close()

    def __enter__(self) -> OpenAIAgent:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def use_parameters(self, parameters: ParameterSet) -> None:
        """The basin's parameter set (run_episode calls this): native tools then list the Snow-17 ones too."""
        if self.native:
            self._tools = toolcalls.tool_schemas(self.clip_out_of_bounds, parameters=parameters)

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        """Forget the conversation and start a new usage record (done automatically per episode)."""
        self._history: list[dict[str, Any]] = []
        self._seen: list[tuple[Any, Any]] = []
        self._consumed = 0
        self._pending: list[str] = []
        self._returned: str | None = None
        self._requests = 0
        self.client.meter.reset()

    @property
    def usage(self) -> dict[str, Any]:
        """Tokens, cost, requests, retries of the current (or last) episode; JSON-ready, no key."""
        return self.client.meter.snapshot()

    @property
    def history(self) -> list[dict[str, Any]]:
        """The conversation as last sent to the API (a copy)."""
        return [dict(m) for m in self._history]

    # ------------------------------------------------------------------ policy
    def act(self, messages: list[dict[str, str]]) -> str | None:
        """Send the conversation, return the next assistant message (native calls as Hermes text)."""
        self._sync(messages)
        meter = self.client.meter
        if self.max_cost_usd is not None and self.usage["cost_usd"] >= self.max_cost_usd:
            meter.stopped = "cost_budget"
            log.info("%s: cost budget of $%.4f reached; stopping", self.name, self.max_cost_usd)
            return None
        completion = self.client.complete(self._history, self._tools, self.seed)
        text = self._take(completion)
        self._returned = text
        u = completion.usage
        if completion.finish_reason == "length":
            log.warning("%s: request %d hit the token limit (max_tokens %s); the reply is cut off", self.name,
                        u["request"], self.spec.sampling.max_tokens)
        log.info("%s: request %d: %d tool call(s), %s+%s tokens, $%.5f, %d attempt(s)", self.name, u["request"],
                 len(completion.tool_calls), u["prompt_tokens"], u["completion_tokens"], u["cost_usd"], u["attempts"])
        return text

    def _take(self, c: Completion) -> str:
        """Append the reply to the API history and return the text for the environment."""
        self._requests += 1
        if c.tool_calls_error or (c.tool_calls and not echoable(c.tool_calls)):
            log.warning("%s: request %d: malformed tool calls (%s); the turn records them as parse failures",
                        self.name, self._requests, c.tool_calls_error or "items that are not function calls")
            text = native_calls_to_text(c.tool_calls, c.content)
            if c.tool_calls_error:
                text = "\n".join(t for t in (text, unusable_calls_block(c.tool_calls_error)) if t)
            self._history.append({"role": "assistant", "content": text})
            self._pending = []
            return text
        if self.native and c.tool_calls:
            ids = []
            for k, call in enumerate(c.tool_calls):
                cid = _get(call, "id")
                ids.append(cid if isinstance(cid, str) and cid else f"call_{self._requests}_{k}")
            self._history.append({"role": "assistant", "content": c.content,
                                  "tool_calls": [_echo_call(call, i) for call, i in zip(c.tool_calls, ids)]})
            self._pending = ids
            return native_calls_to_text(c.tool_calls, c.content)
        if c.tool_calls:  # hermes mode, but the server parsed calls anyway: keep them as text
            log.warning("%s: hermes mode got %d native tool call(s); passing them on as text", self.name,
                        len(c.tool_calls))
            text = native_calls_to_text(c.tool_calls, c.content)
            self._history.append({"role": "assistant", "content": text})
            self._pending = []
            return text
        self._history.append({"role": "assistant", "content": c.content or ""})
        self._pending = []
        return c.content or ""

    def _sync(self, messages: Sequence[Mapping[str, Any]]) -> None:
        """Bring the API history up to date with what the rollout appended since the last call."""
        seen = [(m.get("role"), m.get("content")) for m in messages[:self._consumed]]
        replied = self._returned is None or (len(messages) > self._consumed
                                             and messages[self._consumed].get("role") == "assistant")
        if not self._history or len(messages) < self._consumed or seen != self._seen or not replied:
            self.reset()  # a new conversation: a new episode
        new = list(messages[self._consumed:])
        if self._returned is not None and new and new[0].get("role") == "assistant":
            if new[0].get("content") != self._returned:
                log.warning("%s: the conversation's last assistant message is not the one this agent returned",
                            self.name)
            new = new[1:]
        self._returned = None
        observations: list[str] = []
        for m in new:
            role, content = m.get("role"), m.get("content")
            if role == "tool":
                observations.append(content if isinstance(content, str) else json.dumps(content))
                continue
            self._answer(observations)
            observations = []
            self._history.append({"role": role, "content": content})
        self._answer(observations)
        self._consumed = len(messages)
        self._seen = [(m.get("role"), m.get("content")) for m in messages]

    def _answer(self, observations: list[str]) -> None:
        """Turn the observations of one step into API messages (answering pending tool_call ids)."""
        ids, self._pending = self._pending, []
        if not observations and not ids:
            return
        for k, cid in enumerate(ids):
            content = observations[k] if k < len(observations) else NOT_EXECUTED
            self._history.append({"role": "tool", "tool_call_id": cid, "content": content})
        extra = observations[len(ids):]
        if not extra:
            return
        if self.native or self.spec.observation_role == "user":
            self._history.append({"role": "user", "content": _responses(extra)})
        else:
            self._history.extend({"role": "tool", "content": o} for o in extra)


#: The options of a campaign's openai agent that are the agent's own (the rest are model settings).
AGENT_OPTIONS = ("models_file", "max_cost_usd", "clip_out_of_bounds")


def make_openai_agent(*, model: str, seed: int | None = None, name: str | None = None,
                      **options: Any) -> OpenAIAgent:
    """An :class:`OpenAIAgent` from a campaign's agent options.

    ``model`` names a models-file entry; ``models_file``, ``max_cost_usd`` and
    ``clip_out_of_bounds`` go to the agent; every other option replaces a spec field
    (``base_url``, ``tool_mode``, ``timeout_s``, ``temperature`` ...; unknown names are errors).
    ``backend`` (the simulator's option, shared by all agent kinds) is ignored.
    """
    options.pop("backend", None)
    agent_opts = {k: options.pop(k) for k in AGENT_OPTIONS if k in options}
    return OpenAIAgent(model, seed=seed, name=name, **agent_opts, **options)
