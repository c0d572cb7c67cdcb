"""The three tools as schemas: names, descriptions and the per-parameter lines prompts reuse.

Parameter properties come from ``params.PARAMS``; ``{bounds_rule}`` in a description is filled by
:func:`tool_schemas` with one of :data:`BOUNDS_RULES` (clip or reject out-of-bounds values).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from hydroagent_hpc.params import PARAMS, TUNABLE

__all__ = ["TOOL_NAMES", "TOOL_DESCRIPTIONS", "BOUNDS_RULES", "VALID_NAMES_TEXT", "describe_parameter",
           "tool_schemas", "fmt"]

TOOL_NAMES = ("set_parameters", "run_simulation", "evaluate")

#: The tools' descriptions; ``{bounds_rule}`` is filled by :func:`tool_schemas`.
TOOL_DESCRIPTIONS: Mapping[str, str] = MappingProxyType({
    "set_parameters": (
        "Change one or more of the 11 tunable CREST/kinematic-wave multipliers. Partial updates are "
        "allowed: parameters you leave out keep their current value. Values must be plain JSON numbers; "
        "{bounds_rule} th and isu are fixed and cannot be set. Does not run the model."),
    "run_simulation": (
        "Run the model with the current parameters. Takes no arguments ({}). Reports whether the run "
        "succeeded; call evaluate next to score it."),
    "evaluate": (
        "Score your newest simulation(s) against the observed discharge (NSE and other metrics). Takes no "
        "arguments ({}). Needs a new successful simulation since the last evaluate."),
})
BOUNDS_RULES = MappingProxyType({
    True: "a value outside a parameter's bounds is clipped to the nearest bound and the clip is reported.",
    False: "a value outside a parameter's bounds makes the call invalid.",
})


def fmt(x: float) -> str:
    """A bound or default as the schemas and messages print it (``%g``)."""
    return f"{x:g}"


def _unit(name: str) -> str:
    """The unit of a value given directly ("" for grid multipliers and dimensionless values)."""
    u = PARAMS[name].unit
    return "" if "(x grid)" in u or u.strip() in ("", "-") else u


def _bounds_text(name: str) -> str:
    p = PARAMS[name]
    return f"{name} [{fmt(p.lower)}, {fmt(p.upper)}]"


def describe_parameter(name: str) -> str:
    """One line for a parameter: meaning, unit, bounds, default (schemas and prompts share it)."""
    p = PARAMS[name]
    unit = f" ({_unit(name)})" if _unit(name) else ""
    if p.fixed:
        return f"{p.meaning}{unit}; fixed at {fmt(p.default)}"
    return f"{p.meaning}{unit}; bounds [{fmt(p.lower)}, {fmt(p.upper)}], default {fmt(p.default)}"


VALID_NAMES_TEXT = ", ".join(_bounds_text(n) for n in TUNABLE)


def tool_schemas(clip_out_of_bounds: bool = True) -> list[dict[str, Any]]:
    """The three tools as OpenAI function schemas (also what the Qwen3 template puts in <tools>).

    ``clip_out_of_bounds`` must match what :func:`validate_arguments` is told (``clip``); it only
    changes one sentence of set_parameters' description.
    """
    props = {name: {"type": "number", "description": describe_parameter(name)} for name in TUNABLE}
    empty = {"type": "object", "properties": {}, "required": [], "additionalProperties": False}
    args = {
        "set_parameters": {"type": "object", "properties": props, "required": [], "additionalProperties": False},
        "run_simulation": empty,
        "evaluate": empty,
    }
    rule = BOUNDS_RULES[bool(clip_out_of_bounds)]
    return [{"type": "function",
             "function": {"name": n, "description": TOOL_DESCRIPTIONS[n].replace("{bounds_rule}", rule),
                          "parameters": json.loads(json.dumps(args[n]))}}
            for n in TOOL_NAMES]
