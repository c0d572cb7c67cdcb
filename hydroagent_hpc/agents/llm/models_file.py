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

Loading is strict (:func:`hydroagent_hpc.settings.load_file`): an unknown key, a duplicate key, a
wrong type or a bad value is a :class:`~hydroagent_hpc.errors.ConfigError` naming the file, the line,
the dotted key and the fix (a key taken from ``defaults`` is placed at its line under ``defaults``).
A ``null`` sampling value is not sent (the provider's default applies). Keys are never stored here:
only the name of the environment variable that holds one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from hydroagent_hpc.errors import CannotHealError, ConfigError
from hydroagent_hpc.settings import KeyPath, Settings, from_mapping, invalid, load_file, setting
from hydroagent_hpc.yamlio import brief

__all__ = ["ModelSpec", "ModelsFile", "Sampling", "Prices", "Limits", "MissingAPIKeyError", "PROVIDERS",
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


class MissingAPIKeyError(CannotHealError, RuntimeError):
    """The environment variable that should hold a model's API key is not set (a campaign stops at once)."""


@dataclass(frozen=True)
class Sampling(Settings):
    """Sampling defaults; ``None`` leaves a value to the provider."""

    section: ClassVar[str] = "sampling"

    temperature: float | None = setting(None, ge=0, help="sampling temperature (null: the provider's default)")
    top_p: float | None = setting(None, gt=0, le=1, help="nucleus sampling mass (null: the provider's default)")
    max_tokens: int | None = setting(None, ge=1, help="most tokens per reply (null: the provider's default)")
    max_tokens_param: str = setting("max_tokens", choices=MAX_TOKENS_PARAMS,
                                    help="the request field that carries max_tokens (OpenAI reasoning models want "
                                         "max_completion_tokens)")


@dataclass(frozen=True)
class Prices(Settings):
    """USD per million input (prompt) and output (completion) tokens; ``assumed`` marks guesses."""

    section: ClassVar[str] = "prices"

    input_usd_per_mtok: float = setting(0.0, ge=0, help="USD per million input (prompt) tokens")
    output_usd_per_mtok: float = setting(0.0, ge=0, help="USD per million output (completion) tokens")
    as_of: str = setting("", help="when the prices were read (free text, e.g. 2026-11)")
    assumed: bool = setting(True, help="true: the prices are remembered list prices, not checked")


@dataclass(frozen=True)
class Limits(Settings):
    """Per-request deadline, retries with exponential backoff, a client-side request rate, size caps.

    ``timeout_s`` bounds one attempt by the wall clock, from sending the request to the last byte
    of the answer (and each read); ``max_response_bytes`` bounds the body read, ``max_reply_chars``
    the text kept per message (see :data:`MAX_RESPONSE_BYTES`, :data:`MAX_REPLY_CHARS`).
    """

    section: ClassVar[str] = "limits"

    timeout_s: float = setting(120.0, gt=0, help="seconds one attempt may take, request to last byte")
    max_retries: int = setting(5, ge=0, help="retries of a failed request (exponential backoff)")
    requests_per_minute: float | None = setting(None, gt=0, help="client-side request rate (null: no limit)")
    backoff_base_s: float = setting(1.0, ge=0, help="first backoff before a retry, doubled each time")
    backoff_max_s: float = setting(60.0, ge=0, help="longest backoff before a retry")
    retry_after_max_s: float = setting(600.0, ge=0, help="a longer Retry-After from the server is capped (and logged)")
    max_response_bytes: int = setting(MAX_RESPONSE_BYTES, ge=1024,
                                      help="a longer response body is not read; the turn is a parse failure")
    max_reply_chars: int = setting(MAX_REPLY_CHARS, ge=1000,
                                   help="reply text (and each call's arguments) kept; the rest is cut and marked")


@dataclass(frozen=True)
class ModelSpec(Settings):
    """One chat model behind an OpenAI-compatible endpoint (an entry of the models file; ``name`` is its key)."""

    name: str = setting(help="the entry's name (its key under models)", nonempty=True)
    provider: str = setting(help="who serves the model", choices=PROVIDERS)
    model: str = setting(help="the model id the endpoint expects", nonempty=True,
                         fix="give the model id the endpoint expects")
    base_url: str = setting(help="the endpoint (http:// or https://)")
    api_key_env: str | None = setting(None, help="the environment variable holding the API key (the only place a "
                                                 "key is read from)")
    api_key_required: bool = setting(True, help="false: a local server that may run without a key")
    tool_mode: str = setting("native", choices=TOOL_MODES,
                             help="native function calling, or hermes <tool_call> blocks in the text")
    observation_role: str = setting("tool", choices=OBSERVATION_ROLES,
                                    help="hermes mode: observations as tool or user messages")
    sampling: Sampling = setting(factory=Sampling, help="sampling defaults")
    prices: Prices = setting(factory=Prices, help="prices, for the cost estimate and max_cost_usd")
    limits: Limits = setting(factory=Limits, help="deadline, retries, request rate and size caps")
    extra_body: Mapping[str, Any] = setting(factory=dict, help="provider-specific request fields, sent as they are")
    send_seed: bool = setting(False, help="send the episode seed (vLLM/SGLang sample reproducibly with it)")
    notes: str = setting("", help="free text")

    def check(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise invalid("base_url", f"{brief(self.base_url)} must start with http:// or https://")
        if self.api_key_env is not None and not self.api_key_env.isidentifier():
            raise invalid("api_key_env", f"expected an environment variable name (or null), got "
                                         f"{brief(self.api_key_env)}")
        if self.api_key_required and not self.api_key_env:
            raise invalid("api_key_env", "missing: name the environment variable holding the key",
                          "add api_key_env: NAME, or api_key_required: false for a local server")

    def describe(self) -> dict[str, Any]:
        """Everything about the model that may be recorded (never a key)."""
        return {"name": self.name, "provider": self.provider, "model": self.model, "base_url": self.base_url,
                "tool_mode": self.tool_mode, "api_key_env": self.api_key_env}


_SECTIONS = ("sampling", "prices", "limits")


@dataclass(frozen=True)
class ModelsFile(Settings):
    """A whole models file: ``models`` by name, each read over ``defaults`` (sections merged key by key)."""

    models: Mapping[str, Any] = setting(help="the models by name (ModelSpec keys)", nonempty=True)
    defaults: Mapping[str, Any] = setting(factory=dict, help="keys of a model entry given to every entry "
                                                             "(sections merged key by key)")
    version: int = setting(1, choices=(1,), help="the format's version")

    def check(self) -> None:
        """Every entry (with the defaults under it) becomes a :class:`ModelSpec`; an error names its key."""
        out: dict[str, ModelSpec] = {}
        for name, entry in self.models.items():
            if isinstance(entry, ModelSpec):
                out[name] = entry
                continue
            if isinstance(entry, Mapping) and "name" in entry:
                raise invalid(("models", name, "name"), "is the entry's key under models, not a setting",
                              "remove it; the entry's key is its name")
            merged = dict(self.defaults)
            for k, v in (entry.items() if isinstance(entry, Mapping) else ()):
                both = k in _SECTIONS and isinstance(v, Mapping) and isinstance(merged.get(k), Mapping)
                merged[k] = {**merged[k], **v} if both else v
            data = {"name": name, **merged} if isinstance(entry, Mapping) else entry
            try:
                out[name] = from_mapping(ModelSpec, data, at=("models", name))
            except ConfigError as exc:
                raise invalid(_written_at(exc.at[2:], name, entry, self.defaults), exc.problem or exc.message,
                              exc.fix) from None
        object.__setattr__(self, "models", out)


def _written_at(key: KeyPath, name: str, entry: Any, defaults: Mapping[str, Any]) -> KeyPath:
    """Where ``key`` (a path within entry ``name`` merged over ``defaults``) is written in the file."""
    section = entry.get(key[0]) if key and isinstance(entry, Mapping) else None
    in_entry = bool(key) and isinstance(entry, Mapping) and key[0] in entry and not (
        len(key) > 1 and isinstance(section, Mapping) and key[1] not in section)
    if key and not in_entry and key[0] in defaults:
        return ("defaults", *key)
    return ("models", name, *key)


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
        raise MissingAPIKeyError(f"model {spec.name!r} ({spec.model} at {spec.base_url}) needs an API key in the "
                                 f"environment variable {spec.api_key_env}, which is not set",
                                 f"export {spec.api_key_env}=... (keys are read only from the variable the models "
                                 "file names), then rerun")
    return PLACEHOLDER_KEY


def load_models(path: str | Path | None = None) -> dict[str, ModelSpec]:
    """Read a models file strictly; returns ``{name: ModelSpec}`` in file order."""
    p = Path(path) if path is not None else default_models_file()
    if not p.exists():
        raise ConfigError(f"models file not found: {p}", "check the path, or set HYDROAGENT_MODELS")
    return dict(load_file(ModelsFile, p, what="models file").models)


def get_model(name: str, path: str | Path | None = None) -> ModelSpec:
    """One entry of the models file, with the known names in the error if it is missing."""
    models = load_models(path)
    if name not in models:
        raise ConfigError(f"unknown model {name!r}; the models file lists: {', '.join(models)}",
                          "use one of those names, or add an entry to the models file")
    return models[name]
