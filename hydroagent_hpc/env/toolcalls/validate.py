"""Validation of one call against its tool: only finite real numbers under tunable names pass.

Upper-case names are rejected with a hint (one canonical spelling keeps training data
consistent); out-of-bounds values are clipped and reported per parameter (or rejected with
``clip=False``).
"""

from __future__ import annotations

import difflib
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from hydroagent_hpc.env.toolcalls.schema import TOOL_NAMES, fmt, valid_names_text
from hydroagent_hpc.env.toolcalls.strictjson import json_type, show
from hydroagent_hpc.params import CREST_SET, SNOW_PARAMS, ParameterSet, ParamValues, check_values, spec_of
from hydroagent_hpc.types import ToolCall

__all__ = ["VALIDATION_REASONS", "MAX_ABS_VALUE", "Validated", "validate_arguments"]

#: Codes a failed :class:`Validated` may carry.
VALIDATION_REASONS = ("unknown_tool", "bad_arguments", "empty_arguments", "unknown_parameter",
                      "fixed_parameter", "not_a_number", "not_finite", "too_large", "out_of_bounds")


MAX_ABS_VALUE = 1e12


@dataclass(frozen=True)
class Validated:
    """The outcome of checking one call against its tool.

    ``params`` is the full parameter set after the call (``current`` merged with the update; the
    current set unchanged for run_simulation, evaluate and any error), every value a Python float: a
    :class:`~hydroagent_hpc.params.ParamValues`, the validated record the environment hands to the
    simulator as it is.
    ``applied`` holds the values this call set (after clipping); ``clipped[name] = (asked, used)``.
    On error ``reason`` is one of :data:`VALIDATION_REASONS` and ``detail`` names the field and
    the fix; on success ``detail`` describes any clipping.
    """

    tool: str
    ok: bool
    params: ParamValues
    applied: dict[str, float] = field(default_factory=dict)
    clipped: dict[str, tuple[float, float]] = field(default_factory=dict)
    reason: str = ""
    detail: str = ""


def _full(current: Mapping[str, float], parameters: ParameterSet) -> ParamValues:
    """Every parameter of the basin in EF5 order: ``current`` where given, else the default (a record that
    already is exactly that comes back as it is)."""
    if isinstance(current, ParamValues) and tuple(current) == parameters.names:
        return current
    return check_values({n: float(current[n]) if n in current else float(spec_of(n).default)
                         for n in parameters.names}, "current parameters", snow=True)


def _is_number(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and type(v).__name__ not in ("bool", "bool_")


def validate_arguments(call: ToolCall, current: Mapping[str, float], *, clip: bool = True,
                       parameters: ParameterSet = CREST_SET) -> Validated:
    """Check ``call`` against its tool and return the new parameter set or an error.

    set_parameters: at least one parameter; names must be tunable and lower-case; values must be
    real numbers (int or float; not bool, str, null, arrays or objects), finite, with
    ``abs < 1e12``. Out-of-bounds values are clipped (``clip=False``: rejected). Any problem
    rejects the whole call and nothing is applied; the detail lists every problem.
    run_simulation / evaluate: arguments must be exactly ``{}``. ``parameters`` is the basin's set
    (:class:`~hydroagent_hpc.params.ParameterSet`): the Snow-17 names pass only when it has snow.
    """
    base = _full(current, parameters)
    names_text = valid_names_text(parameters)
    name, args = call.name, call.arguments
    if name not in TOOL_NAMES:
        return Validated(str(name), False, base, reason="unknown_tool",
                         detail=f"unknown tool {show(str(name), 60)}; the tools are {', '.join(TOOL_NAMES)}")
    if not isinstance(args, Mapping):
        return Validated(name, False, base, reason="bad_arguments",
                         detail=f"arguments of {name} must be a JSON object")
    if name != "set_parameters":
        if args:
            keys = ", ".join(show(str(k)) for k in list(args)[:5])
            return Validated(name, False, base, reason="bad_arguments",
                             detail=f"{name} takes no arguments, got {keys}; call it with \"arguments\": {{}}")
        return Validated(name, True, base)
    if not args:
        return Validated(name, False, base, reason="empty_arguments",
                         detail="set_parameters needs at least one parameter, e.g. {\"wm\": 1.5}; valid: "
                                + names_text)
    problems: list[tuple[str, str]] = []
    applied: dict[str, float] = {}
    clipped: dict[str, tuple[float, float]] = {}
    for key, value in args.items():
        code, msg = _check_one(key, value, parameters)
        if code:
            problems.append((code, msg))
            continue
        p = spec_of(key)
        v = float(cast(numbers.Real, value)) + 0.0  # a Python float (checked above); -0.0 becomes 0.0
        used = min(max(v, p.lower), p.upper)
        if used != v:
            if not clip:
                problems.append(("out_of_bounds", f"{key}={fmt(v)} is outside its bounds "
                                                  f"[{fmt(p.lower)}, {fmt(p.upper)}]; choose a value inside"))
                continue
            clipped[key] = (v, float(used))
        applied[key] = float(used)
    if problems:
        detail = "; ".join(m for _, m in problems)
        if any(c == "unknown_parameter" for c, _ in problems):
            detail += ". Valid parameters: " + names_text
        return Validated(name, False, base, reason=problems[0][0], detail=detail + ". Nothing was changed.")
    new = ParamValues._validated({**base, **applied})  # applied: each value checked above
    detail = "; ".join(f"{k} clipped from {fmt(a)} to {fmt(u)} (bounds [{fmt(spec_of(k).lower)}, "
                       f"{fmt(spec_of(k).upper)}])" for k, (a, u) in clipped.items())
    return Validated(name, True, new, applied, clipped, detail=detail)


def _check_one(key: Any, value: Any, parameters: ParameterSet) -> tuple[str, str]:
    if not isinstance(key, str):
        return "unknown_parameter", f"parameter name {show(str(key))} is not a string"
    shown = show(key)
    if key not in parameters:
        low = key.lower()
        if low in SNOW_PARAMS and not parameters.snow:
            return "unknown_parameter", (f"{shown} is a Snow-17 parameter, but this basin has no snow model (its "
                                         "task has no SNOW=SNOW17); set only the CREST/KW multipliers")
        if low in parameters and spec_of(low).fixed:
            return "fixed_parameter", f"{shown}: {low} is fixed and cannot be set (names are lower-case)"
        if low in parameters:
            return "unknown_parameter", f"unknown parameter {shown}: names are lower-case, use {show(low)}"
        match = difflib.get_close_matches(low, parameters.tunable, n=1, cutoff=0.7)
        hint = f" (did you mean {show(match[0])}?)" if match else ""
        return "unknown_parameter", f"unknown parameter {shown}{hint}"
    p = spec_of(key)
    if p.fixed:
        return "fixed_parameter", f"{key} is fixed at {fmt(p.default)} and cannot be set; leave it out"
    if not _is_number(value):
        got = json_type(value)
        fix = " (write the number without quotes)" if isinstance(value, str) else ""
        return "not_a_number", f"{key} must be a JSON number, got a {got}{fix}"
    within = f"use a value within [{fmt(p.lower)}, {fmt(p.upper)}]"
    if isinstance(value, numbers.Integral):
        if abs(int(value)) >= MAX_ABS_VALUE:
            return "too_large", f"{key} is too large; {within}"
        return "", ""
    try:
        v = float(value)
    except (OverflowError, ValueError, TypeError):
        return "too_large", f"{key} is not a usable number; {within}"
    if not math.isfinite(v):
        return "not_finite", f"{key} must be finite; {within}"
    if abs(v) >= MAX_ABS_VALUE:
        return "too_large", f"{key}={v:g} is too large; {within}"
    return "", ""
