"""The three calibration tools: one source for their schemas, parsing, validation and rendering.

Tools (descriptions in :data:`TOOL_DESCRIPTIONS`, parameter properties from ``params.PARAMS``):

- ``set_parameters``: a partial update of the 11 tunable multipliers (others keep their value);
- ``run_simulation`` and ``evaluate``: no arguments (exactly ``{}``).

Model output is untrusted. :func:`parse_message` reads Hermes blocks
(``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``) strictly: a block that is
not exactly one JSON object with ``name`` and ``arguments`` is a :class:`ParseFailure`, never a
repaired call (the reference parser turned broken JSON into ``{}`` calls; see
docs/reference-implementation.md, section 4). NaN/Infinity literals, overflowing numbers and
duplicate keys are rejected. :func:`validate_arguments` then checks a call against the tool:
only finite real numbers under tunable lower-case names reach the returned parameter dict, as
Python floats.

Decisions: upper-case names are rejected with a hint (one canonical spelling keeps training
data consistent); out-of-bounds values are clipped and reported per parameter (or rejected with
``clip=False``); observations render non-finite floats as ``null`` (JSON has no NaN).

One module per noun; this package re-exports their public names, so
``from hydroagent_hpc.env.toolcalls import X`` is the import to use:

- :mod:`.schema`: tool names, descriptions, :func:`tool_schemas`, :func:`describe_parameter`;
- :mod:`.strictjson`: the strict JSON decoder untrusted text goes through (package-internal);
- :mod:`.message`: :class:`ParsedMessage`, :class:`ParseFailure` and how they are collected;
- :mod:`.parse`: :func:`parse_message` (Hermes blocks in text);
- :mod:`.validate`: :func:`validate_arguments` and :class:`Validated`;
- :mod:`.render`: :func:`render_hermes`, :func:`render_tool_response`, :func:`format_example`,
  :func:`retry_hint`;
- :mod:`.openai`: :func:`from_openai_tool_calls`, :func:`to_openai_tool_call`.
"""

from hydroagent_hpc.env.toolcalls.message import CLOSE_TAG, OPEN_TAG, PARSE_REASONS, ParsedMessage, ParseFailure
from hydroagent_hpc.env.toolcalls.openai import from_openai_tool_calls, to_openai_tool_call
from hydroagent_hpc.env.toolcalls.parse import LONE_SURROGATE, MAX_MESSAGE_CHARS, parse_message
from hydroagent_hpc.env.toolcalls.render import format_example, render_hermes, render_tool_response, retry_hint
from hydroagent_hpc.env.toolcalls.schema import (
    BOUNDS_RULES,
    TOOL_DESCRIPTIONS,
    TOOL_NAMES,
    VALID_NAMES_TEXT,
    describe_parameter,
    tool_schemas,
)
from hydroagent_hpc.env.toolcalls.strictjson import MAX_DEPTH, RAW_CHARS
from hydroagent_hpc.env.toolcalls.validate import MAX_ABS_VALUE, VALIDATION_REASONS, Validated, validate_arguments

__all__ = [
    "TOOL_NAMES", "TOOL_DESCRIPTIONS", "BOUNDS_RULES", "PARSE_REASONS", "VALIDATION_REASONS", "MAX_MESSAGE_CHARS",
    "MAX_ABS_VALUE", "ParseFailure", "ParsedMessage", "Validated", "tool_schemas", "parse_message",
    "validate_arguments", "render_hermes", "render_tool_response", "from_openai_tool_calls",
    "to_openai_tool_call", "retry_hint", "format_example", "describe_parameter",
    "OPEN_TAG", "CLOSE_TAG", "MAX_DEPTH", "RAW_CHARS", "VALID_NAMES_TEXT", "LONE_SURROGATE",
]
