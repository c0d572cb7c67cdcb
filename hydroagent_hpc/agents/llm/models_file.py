"""The models file: which chat models an :class:`~hydroagent_hpc.agents.llm.openai_api.OpenAIAgent` can use.

A YAML file (``data/models.yaml`` ships the paper's nine frontier models and local vLLM/SGLang
servers) with a ``models`` mapping from a short name to one entry, and optional ``defaults``
merged under every entry section by section::

    models:
      claude-sonnet-4.6:
        provider: anthropic            # one of PROVIDERS
        model: claude-sonnet-4-6       # the id the endpoint expects
        base_url: https://api.anthropic.com/v1/
        api_key_env: ANTHROPIC_API_KEY # the only place a key is read from
        api_key_required: true         # false: a local server that may run without a key
        tool_mode: native              # native function calling, or hermes <tool_call> text
        observation_role: tool         # hermes mode: observations as "tool" or "user" messages
        sampling: {temperature: 0.0, top_p: null, max_tokens: 4096, max_tokens_param: max_tokens}
        prices: {input_usd_per_mtok: 3.0, output_usd_per_mtok: 15.0, as_of: "2026-11", assumed: true}
        limits: {timeout_s: 120, max_retries: 5, requests_per_minute: null, backoff_base_s: 1, backoff_max_s: 60,
                 max_response_bytes: 8388608, max_reply_chars: 200000}
        extra_body: {}                 # provider-specific request fields, sent as they are
        send_seed: false               # true: send the episode seed with every request
        notes: ""

Loading is strict: an unknown key, a duplicate key, a wrong type or a bad value is a
:class:`ModelsFileError` naming the file, the line and the dotted key. A ``null`` sampling value
is not sent (the provider's default applies). Keys are never stored here: only the name of the
environment variable that holds one.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydroagent_hpc.errors import ConfigError, HydroAgentError

__all__ = ["ModelSpec", "Sampling", "Prices", "Limits", "ModelsFileError", "MissingAPIKeyError", "PROVIDERS",
           "TOOL_MODES", "MAX_RESPONSE_BYTES", "MAX_REPLY_CHARS", "default_models_file", "load_models", "get_model",
           "resolve_api_key"]

PROVIDERS = ("anthropic", "openai", "google", "vllm", "sglang", "replay", "openai-compatible")
TOOL_MODES = ("native", "hermes")
OBSERVATION_ROLES = ("tool", "user")
MAX_TOKENS_PARAMS = ("max_tokens", "max_completion_tokens")
PLACEHOLDER_KEY = "EMPTY"  # what local servers without --api-key accept
#: Default ``limits.max_response_bytes``: a response body longer than this is not read further and
#: the reply is discarded (the environment sees a parse failure). A chat completion of 16k tokens
#: is well under 1 MB.
MAX_RESPONSE_BYTES = 8 * 1024 * 1024
#: Default ``limits.max_reply_chars``: the most characters of a reply's text (and of each tool
#: call's arguments) that are kept, handed to the environment and re-sent with later requests;
#: the rest is cut off and the cut marked. Equal to the environment's default message limit
#: (``EnvConfig.max_message_chars``), so a cut reply is also a "message_too_long" parse failure.
MAX_REPLY_CHARS = 200_000


class ModelsFileError(ConfigError):
    """A models file that cannot be used; the message names the file, line, key and fix."""


class MissingAPIKeyError(HydroAgentError, RuntimeError):
    """The environment variable that should hold a model's API key is not set."""


@dataclass(frozen=True)
class Sampling:
    """Sampling defaults; ``None`` leaves a value to the provider."""

    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    max_tokens_param: str = "max_tokens"  # OpenAI reasoning models want "max_completion_tokens"


@dataclass(frozen=True)
class Prices:
    """USD per million input (prompt) and output (completion) tokens; ``assumed`` marks guesses."""

    input_usd_per_mtok: float = 0.0
    output_usd_per_mtok: float = 0.0
    as_of: str = ""
    assumed: bool = True


@dataclass(frozen=True)
class Limits:
    """Per-request deadline, retries with exponential backoff, a client-side request rate, size caps.

    ``timeout_s`` bounds one attempt by the wall clock, from sending the request to the last byte
    of the answer (and each read); ``max_response_bytes`` bounds the body read, ``max_reply_chars``
    the text kept per message (see :data:`MAX_RESPONSE_BYTES`, :data:`MAX_REPLY_CHARS`).
    """

    timeout_s: float = 120.0
    max_retries: int = 5
    requests_per_minute: float | None = None
    backoff_base_s: float = 1.0
    backoff_max_s: float = 60.0
    retry_after_max_s: float = 600.0  # a longer Retry-After is capped (and logged)
    max_response_bytes: int = MAX_RESPONSE_BYTES
    max_reply_chars: int = MAX_REPLY_CHARS


@dataclass(frozen=True)
class ModelSpec:
    """One chat model behind an OpenAI-compatible endpoint (an entry of the models file)."""

    name: str
    provider: str
    model: str
    base_url: str
    api_key_env: str | None = None
    api_key_required: bool = True
    tool_mode: str = "native"
    observation_role: str = "tool"
    sampling: Sampling = field(default_factory=Sampling)
    prices: Prices = field(default_factory=Prices)
    limits: Limits = field(default_factory=Limits)
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    send_seed: bool = False  # send the episode seed (vLLM/SGLang sample reproducibly with it)
    notes: str = ""

    def __post_init__(self) -> None:
        for label, value, allowed in (("provider", self.provider, PROVIDERS), ("tool_mode", self.tool_mode, TOOL_MODES),
                                      ("observation_role", self.observation_role, OBSERVATION_ROLES),
                                      ("sampling.max_tokens_param", self.sampling.max_tokens_param,
                                       MAX_TOKENS_PARAMS)):
            if value not in allowed:
                raise ModelsFileError(f"{label}: {value!r} is not one of {', '.join(allowed)}")
        if not self.model:
            raise ModelsFileError("model: give the model id the endpoint expects")
        if not self.base_url.startswith(("http://", "https://")):
            raise ModelsFileError(f"base_url: {self.base_url!r} must start with http:// or https://")
        if self.api_key_required and not self.api_key_env:
            raise ModelsFileError("api_key_env: name the environment variable holding the key "
                                  "(or set api_key_required: false for a local server)")
        lim = self.limits
        if lim.timeout_s <= 0 or lim.max_retries < 0 or lim.backoff_base_s < 0 or lim.backoff_max_s < 0:
            raise ModelsFileError("limits: timeout_s must be > 0; max_retries and backoff times >= 0")
        if lim.max_response_bytes < 1024:
            raise ModelsFileError(f"limits.max_response_bytes: must be >= 1024 bytes, got {lim.max_response_bytes}")
        if lim.max_reply_chars < 1000:
            raise ModelsFileError(f"limits.max_reply_chars: must be >= 1000 characters, got {lim.max_reply_chars}")
        if lim.requests_per_minute is not None and lim.requests_per_minute <= 0:
            raise ModelsFileError("limits.requests_per_minute: must be > 0 or null (no limit)")
        if self.prices.input_usd_per_mtok < 0 or self.prices.output_usd_per_mtok < 0:
            raise ModelsFileError("prices: must be >= 0")
        if self.sampling.max_tokens is not None and self.sampling.max_tokens < 1:
            raise ModelsFileError("sampling.max_tokens: must be >= 1 or null")

    def describe(self) -> dict[str, Any]:
        """Everything about the model that may be recorded (never a key)."""
        return {"name": self.name, "provider": self.provider, "model": self.model, "base_url": self.base_url,
                "tool_mode": self.tool_mode, "api_key_env": self.api_key_env}


_SECTIONS = {"sampling": Sampling, "prices": Prices, "limits": Limits}


def default_models_file() -> Path:
    """``$HYDROAGENT_MODELS`` if set, else the repository's ``data/models.yaml``."""
    env = os.environ.get("HYDROAGENT_MODELS")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[3] / "data" / "models.yaml"


def resolve_api_key(spec: ModelSpec, environ: Mapping[str, str] | None = None) -> str:
    """The key from ``spec.api_key_env``; a placeholder for keyless local servers.

    Raises :class:`MissingAPIKeyError` naming the variable (never a value) when a required key is
    unset or empty.
    """
    env = os.environ if environ is None else environ
    value = env.get(spec.api_key_env, "") if spec.api_key_env else ""
    if value.strip():
        return value.strip()
    if spec.api_key_required:
        raise MissingAPIKeyError(f"model {spec.name!r} needs an API key in the environment variable "
                                 f"{spec.api_key_env}, which is not set; export {spec.api_key_env}=... "
                                 "(keys are read only from the variable the models file names)")
    return PLACEHOLDER_KEY


# ---------------------------------------------------------------------------------------------
# Strict loading


def load_models(path: str | Path | None = None) -> dict[str, ModelSpec]:
    """Read a models file strictly; returns ``{name: ModelSpec}`` in file order."""
    import yaml

    p = Path(path) if path is not None else default_models_file()
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise ModelsFileError(f"{p}: models file not found (set HYDROAGENT_MODELS or pass a path)") from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ModelsFileError(f"{p}: not valid YAML: {exc}") from None
    lines: dict[str, int] = {}
    _index_lines(root, "", lines, p)

    def fail(key: str, msg: str) -> ModelsFileError:
        line = lines.get(key) or lines.get(key.rsplit(".", 1)[0])
        return ModelsFileError(f"{p}{':' + str(line) if line else ''}: {key}: {msg}")

    if not isinstance(data, Mapping):
        raise ModelsFileError(f"{p}: the top level must be a mapping with a 'models' key")
    for key in data:
        if key not in ("version", "defaults", "models"):
            raise fail(str(key), "unknown key; valid top-level keys: version, defaults, models")
    defaults = data.get("defaults") or {}
    models = data.get("models")
    if not isinstance(models, Mapping) or not models:
        raise fail("models", "expected a non-empty mapping of model names to entries")
    if not isinstance(defaults, Mapping):
        raise fail("defaults", "expected a mapping")
    out: dict[str, ModelSpec] = {}
    for name, entry in models.items():
        where = f"models.{name}"
        if not isinstance(entry, Mapping):
            raise fail(where, "expected a mapping of keys")
        merged = dict(defaults)
        for k, v in entry.items():
            if k in _SECTIONS and isinstance(v, Mapping) and isinstance(merged.get(k), Mapping):
                merged[k] = {**merged[k], **v}
            else:
                merged[k] = v
        try:
            out[str(name)] = _spec(str(name), merged, where, fail)
        except ModelsFileError as exc:
            if str(exc).startswith(str(p)):
                raise
            raise fail(where + "." + str(exc).split(":")[0], str(exc).split(":", 1)[-1].strip()) from None
    return out


def get_model(name: str, path: str | Path | None = None) -> ModelSpec:
    """One entry of the models file, with the known names in the error if it is missing."""
    models = load_models(path)
    if name not in models:
        raise ModelsFileError(f"unknown model {name!r}; the models file lists: {', '.join(models)}")
    return models[name]


def _spec(name: str, data: Mapping[str, Any], where: str, fail) -> ModelSpec:
    known = {f.name for f in dataclasses.fields(ModelSpec)} - {"name"}
    values: dict[str, Any] = {"name": name}
    for key, value in data.items():
        sub = f"{where}.{key}"
        if key not in known:
            raise fail(sub, f"unknown key; valid keys: {', '.join(sorted(known))}")
        if key in _SECTIONS:
            values[key] = _section(_SECTIONS[key], value, sub, fail)
        elif key == "extra_body":
            if not isinstance(value, Mapping):
                raise fail(sub, "expected a mapping of request fields")
            values[key] = dict(value)
        elif key in ("api_key_required", "send_seed"):
            if not isinstance(value, bool):
                raise fail(sub, f"expected true or false, got {value!r}")
            values[key] = value
        elif key == "api_key_env":
            if value is not None and not (isinstance(value, str) and value.isidentifier()):
                raise fail(sub, f"expected an environment variable name (or null), got {value!r}")
            values[key] = value
        else:
            if not isinstance(value, str):
                raise fail(sub, f"expected text, got {value!r}")
            values[key] = value
    for required in ("provider", "model", "base_url"):
        if required not in values:
            raise fail(where, f"missing key {required!r}")
    return ModelSpec(**values)


def _section(cls: type, data: Any, where: str, fail) -> Any:
    if not isinstance(data, Mapping):
        raise fail(where, "expected a mapping of keys")
    hints = {f.name: f.type for f in dataclasses.fields(cls)}
    values = {}
    for key, value in data.items():
        sub = f"{where}.{key}"
        if key not in hints:
            raise fail(sub, f"unknown key; valid keys: {', '.join(hints)}")
        values[key] = _typed(value, str(hints[key]), sub, fail)
    return cls(**values)


def _typed(value: Any, hint: str, where: str, fail) -> Any:
    if value is None:
        if "None" in hint:
            return None
        raise fail(where, "must not be null")
    if hint.startswith("bool"):
        if not isinstance(value, bool):
            raise fail(where, f"expected true or false, got {value!r}")
        return value
    if hint.startswith("int"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise fail(where, f"expected a whole number, got {value!r}")
        return value
    if hint.startswith("float"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise fail(where, f"expected a number, got {value!r}")
        return float(value)
    if not isinstance(value, str):
        raise fail(where, f"expected text, got {value!r}")
    return value


def _index_lines(node: Any, prefix: str, lines: dict[str, int], path: Path) -> None:
    """Record the 1-based line of every mapping key by dotted path; duplicate keys are errors."""
    import yaml

    if not isinstance(node, yaml.MappingNode):
        return
    seen: set[str] = set()
    for k, v in node.value:
        key = str(getattr(k, "value", k))
        dotted = f"{prefix}.{key}" if prefix else key
        line = k.start_mark.line + 1
        if key in seen:
            raise ModelsFileError(f"{path}:{line}: {dotted}: duplicate key; give each key once")
        seen.add(key)
        lines[dotted] = line
        _index_lines(v, dotted, lines, path)
