"""The three tools as schemas: names, descriptions and the per-parameter lines prompts reuse.

Parameter properties come from ``params.PARAMS``; ``{bounds_rule}`` in a description is filled by
:func:`tool_schemas` with one of :data:`BOUNDS_RULES` (clip or reject out-of-bounds values).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from hydroagent_hpc.params import CREST_SET, ParameterSet, spec_of

__all__ = ["TOOL_NAMES", "TOOL_DESCRIPTIONS", "BOUNDS_RULES", "VALID_NAMES_TEXT", "describe_parameter",
           "tool_schemas", "fmt", "valid_names_text"]

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
    u = spec_of(name).unit
    return "" if "(x grid)" in u or u.strip() in ("", "-") else u


def _bounds_text(name: str) -> str:
    p = spec_of(name)
    return f"{name} [{fmt(p.lower)}, {fmt(p.upper)}]"


def describe_parameter(name: str) -> str:
    """One line for a parameter: meaning, unit, bounds, default (schemas and prompts share it)."""
    p = spec_of(name)
    unit = f" ({_unit(name)})" if _unit(name) else ""
    if p.fixed:
        return f"{p.meaning}{unit}; fixed at {fmt(p.default)}"
    return f"{p.meaning}{unit}; bounds [{fmt(p.lower)}, {fmt(p.upper)}], default {fmt(p.default)}"


def valid_names_text(parameters: ParameterSet = CREST_SET) -> str:
    """The tunable names of a basin with their bounds, as error messages list them."""
    return ", ".join(_bounds_text(n) for n in parameters.tunable)


VALID_NAMES_TEXT = valid_names_text(CREST_SET)

_SNOW_SENTENCE = (" This basin also runs the Snow-17 snow model: its 8 parameters (uadj, mbase, mfmax, mfmin, tipm, "
                  "nmf, plwhc, scf) are values, not multipliers, and can be set the same way.")


def tool_schemas(clip_out_of_bounds: bool = True, parameters: ParameterSet = CREST_SET) -> list[dict[str, Any]]:
    """The three tools as OpenAI function schemas (also what the Qwen3 template puts in <tools>).

    ``clip_out_of_bounds`` must match what :func:`validate_arguments` is told (``clip``); it only
    changes one sentence of set_parameters' description. ``parameters`` (the basin's set, e.g.
    ``CalibrationEnv.parameters``) adds the Snow-17 parameters for a basin with snow.
    """
    props = {name: {"type": "number", "description": describe_parameter(name)} for name in parameters.tunable}
    empty = {"type": "object", "properties": {}, "required": [], "additionalProperties": False}
    args = {
        "set_parameters": {"type": "object", "properties": props, "required": [], "additionalProperties": False},
        "run_simulation": empty,
        "evaluate": empty,
    }
    rule = BOUNDS_RULES[bool(clip_out_of_bounds)]
    return [{"type": "function",
             "function": {"name": n, "description": TOOL_DESCRIPTIONS[n].replace("{bounds_rule}", rule)
                          + (_SNOW_SENTENCE if n == "set_parameters" and parameters.snow else ""),
                          "parameters": json.loads(json.dumps(args[n]))}}
            for n in TOOL_NAMES]
