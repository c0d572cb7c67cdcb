"""The 13 CREST/KW scalar multipliers an agent calibrates: order, bounds, defaults, fixed ones.

EF5 order is CREST ``wm b im ke fc iwu`` then KW ``under leaki th isu alpha beta alpha0``
(``docs/ef5-crest-spec.md`` section 3). HydroAgent (li2026hydroagent) tunes 11 of them and fixes
``th = 10`` and ``isu = 0``; its bounds and defaults are below. A multiplier multiplies the
parameter grid where the control file names one; without a grid it is the value itself (and IM
is then a percentage).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import NoReturn

__all__ = ["ParamSpec", "PARAMS", "PARAM_NAMES", "CREST_NAMES", "KW_NAMES", "DEFAULTS", "TUNABLE",
           "SNOW_PARAMS", "SNOW_NAMES", "SNOW_DEFAULTS", "check_values", "spec_of", "ParameterSet", "CREST_SET",
           "SNOW17_SET", "parameter_set", "parameter_set_of", "ParamValues"]


@dataclass(frozen=True)
class ParamSpec:
    name: str
    model: str  # "crest", "kw" or "snow17"
    lower: float
    upper: float
    default: float
    meaning: str
    unit: str

    @property
    def fixed(self) -> bool:
        return self.lower == self.upper


_TABLE = (
    ParamSpec("wm", "crest", 0.1, 10.0, 1.0, "soil water capacity multiplier", "mm (x grid)"),
    ParamSpec("b", "crest", 1e-6, 3.0, 1.0, "infiltration-curve exponent multiplier", "-"),
    ParamSpec("im", "crest", 0.0, 1.0, 1.0, "impervious fraction multiplier", "fraction (x grid)"),
    ParamSpec("ke", "crest", 0.8, 1.2, 1.0, "PET to actual ET multiplier", "-"),
    ParamSpec("fc", "crest", 0.1, 2.0, 1.0, "saturated conductivity multiplier", "mm/h (x grid)"),
    ParamSpec("iwu", "crest", 0.1, 100.0, 25.0, "initial soil water", "% of WM"),
    ParamSpec("under", "kw", 0.1, 10.0, 1.0, "interflow speed multiplier", "m/s per sqrt(slope)"),
    ParamSpec("leaki", "kw", 0.1, 10.0, 1.0, "interflow leak fraction multiplier", "1/step (x grid)"),
    ParamSpec("th", "kw", 10.0, 10.0, 10.0, "channel threshold on flow accumulation", "cells"),
    ParamSpec("isu", "kw", 0.0, 0.0, 0.0, "initial interflow state", "mm/s"),
    ParamSpec("alpha", "kw", 0.1, 3.0, 1.0, "channel alpha multiplier", "- (x grid)"),
    ParamSpec("beta", "kw", 0.1, 3.0, 1.0, "channel beta multiplier", "- (x grid)"),
    ParamSpec("alpha0", "kw", 0.0, 3.0, 0.0, "overland alpha multiplier (0 = pass-through)", "- (x grid)"),
)

PARAMS: Mapping[str, ParamSpec] = MappingProxyType({p.name: p for p in _TABLE})
PARAM_NAMES = tuple(p.name for p in _TABLE)
CREST_NAMES = tuple(p.name for p in _TABLE if p.model == "crest")
KW_NAMES = tuple(p.name for p in _TABLE if p.model == "kw")
DEFAULTS: Mapping[str, float] = MappingProxyType({p.name: p.default for p in _TABLE})
TUNABLE = tuple(p.name for p in _TABLE if not p.fixed)

# Snow-17 (EF5 ``[Snow17ParamSet]``, EF5's order): only for a basin whose task has SNOW=SNOW17; never
# part of the 13 above. Values (times a grid where the set names one), with the ranges and
# defaults Anderson (2006) gives for a 6-hour step (melt factors in mm/degC/6h).
_SNOW_TABLE = (
    ParamSpec("uadj", "snow17", 0.01, 0.2, 0.04, "wind function for rain-on-snow melt", "mm/mb/6h"),
    ParamSpec("mbase", "snow17", -1.0, 1.0, 0.0, "base temperature of non-rain melt", "degC"),
    ParamSpec("mfmax", "snow17", 0.5, 2.0, 1.0, "melt factor on 21 June", "mm/degC/6h"),
    ParamSpec("mfmin", "snow17", 0.05, 0.6, 0.3, "melt factor on 21 December", "mm/degC/6h"),
    ParamSpec("tipm", "snow17", 0.01, 1.0, 0.1, "antecedent temperature index weight", "-"),
    ParamSpec("nmf", "snow17", 0.05, 0.5, 0.15, "maximum negative melt factor", "mm/degC/6h"),
    ParamSpec("plwhc", "snow17", 0.02, 0.3, 0.04, "liquid water holding capacity", "fraction of ice"),
    ParamSpec("scf", "snow17", 0.7, 1.6, 1.0, "snowfall correction factor", "-"),
)
SNOW_PARAMS: Mapping[str, ParamSpec] = MappingProxyType({p.name: p for p in _SNOW_TABLE})
SNOW_NAMES = tuple(p.name for p in _SNOW_TABLE)
SNOW_DEFAULTS: Mapping[str, float] = MappingProxyType({p.name: p.default for p in _SNOW_TABLE})


class ParamValues(dict[str, float]):
    """A parameter set that passed validation: lower-case known names, every value a finite Python float.

    The one record a parameter set travels in once it has entered the environment (a tool call,
    :func:`~hydroagent_hpc.env.toolcalls.validate_arguments`) or the simulator (:func:`check_values`, or
    :meth:`ParameterSet.check`): only those validating functions make one, so the layers after them
    (the environment's bookkeeping, the simulator's runs, its result) trust the type and check nothing
    again (:func:`check_values` hands a record back as it is). A read-only ``dict`` (JSON and ``dict(...)``
    take it as one; a copy is a plain, unvalidated dict). ``snow``: whether it holds any Snow-17 name (a
    simulator without Snow-17 validates such a record again, and refuses it with the usual message).
    """

    __slots__ = ("_snow",)
    _snow: bool

    def __new__(cls, *args: object, **kwargs: object) -> ParamValues:
        raise TypeError("ParamValues is made only by validation: use hydroagent_hpc.params.check_values(...), "
                        "ParameterSet.check(...) or toolcalls.validate_arguments(...)")

    def __init__(self, *args: object, **kwargs: object) -> None:  # the values are set by _validated
        pass

    @classmethod
    def _validated(cls, values: Mapping[str, float]) -> ParamValues:
        """For the validating functions only: ``values`` must already be checked (names known, finite floats)."""
        rec = dict.__new__(cls)
        dict.update(rec, values)
        rec._snow = any(k in SNOW_PARAMS for k in rec)
        return rec

    @property
    def snow(self) -> bool:
        return self._snow

    def _read_only(self, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError("ParamValues is read-only: validate a changed copy (check_values({**values, ...}))")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _read_only

    def __repr__(self) -> str:
        return f"ParamValues({dict.__repr__(self)})"

    def __reduce__(self) -> tuple[object, ...]:  # pickles (a pool worker's results) as a validated record again
        return (_revalidate, (dict(self),))


def _revalidate(values: dict[str, float]) -> ParamValues:
    return check_values(values, snow=True)


def check_values(values: Mapping[str, float], source: str = "parameters", snow: bool = False) -> ParamValues:
    """Validate names and finiteness (not bounds: the simulator accepts any value EF5 accepts).

    ``snow=True`` (a task with Snow-17) also accepts the :data:`SNOW_NAMES`. A :class:`ParamValues`
    (already validated) comes back as it is, unless it holds Snow-17 names and ``snow`` is false.
    """
    if isinstance(values, ParamValues) and (snow or not values.snow):
        return values
    return _check_values(values, source, snow)


def _check_values(values: Mapping[str, float], source: str, snow: bool) -> ParamValues:
    out = {}
    for name, value in values.items():
        key = str(name).lower()
        if key not in PARAMS and not (snow and key in SNOW_PARAMS):
            valid = PARAM_NAMES + (SNOW_NAMES if snow else ())
            hint = "" if snow or key not in SNOW_PARAMS else " (a Snow-17 parameter: the task has no SNOW=SNOW17)"
            raise ValueError(f"{source}: unknown parameter {name!r}{hint}; valid names: {', '.join(valid)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{source}: {key} must be a number, got {type(value).__name__}")
        v = float(value)
        if not math.isfinite(v):
            raise ValueError(f"{source}: {key} must be finite, got {v}")
        out[key] = v
    return ParamValues._validated(out)


def spec_of(name: str) -> ParamSpec:
    """The spec of a CREST/KW multiplier or a Snow-17 parameter (``KeyError`` for anything else)."""
    return PARAMS[name] if name in PARAMS else SNOW_PARAMS[name]


@dataclass(frozen=True)
class ParameterSet:
    """The parameters one basin can calibrate: the 13 multipliers, plus Snow-17's 8 when the task has snow.

    Derived from the simulator (:func:`parameter_set_of`), never from the basin's name: the environment
    exposes it (``CalibrationEnv.parameters``) and validation, prompts, tool schemas, the heuristic
    agent and the optimizers' :class:`~hydroagent_hpc.agents.optimizers.space.ParameterSpace` take
    the names, bounds, defaults and meanings from here. A snow-free basin gets :data:`CREST_SET`,
    which is exactly the paper's 13 (11 tunable) and nothing else.
    """

    snow: bool = False

    @property
    def names(self) -> tuple[str, ...]:
        """Every parameter, in EF5 order (CREST, KW, then Snow-17)."""
        return PARAM_NAMES + (SNOW_NAMES if self.snow else ())

    @property
    def tunable(self) -> tuple[str, ...]:
        """The names an agent may set (``th`` and ``isu`` are fixed)."""
        return tuple(n for n in self.names if not spec_of(n).fixed)

    @property
    def fixed(self) -> tuple[str, ...]:
        return tuple(n for n in self.names if spec_of(n).fixed)

    @property
    def snow_names(self) -> tuple[str, ...]:
        return SNOW_NAMES if self.snow else ()

    @property
    def defaults(self) -> dict[str, float]:
        return {n: float(spec_of(n).default) for n in self.names}

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.names

    def spec(self, name: str) -> ParamSpec:
        """The spec of ``name``; a clear ``ValueError`` when this basin has no such parameter."""
        if name not in self:
            raise ValueError(self.unknown_message(name))
        return spec_of(name)

    def unknown_message(self, name: str) -> str:
        """Why ``name`` is not a parameter of this basin, and what to use instead."""
        key = str(name)
        if not self.snow and key.lower() in SNOW_PARAMS:
            return (f"{key} is a Snow-17 parameter, but this basin has no snow model (its task has no "
                    f"SNOW=SNOW17 and [Snow17ParamSet]); use one of: {', '.join(self.tunable)}")
        return f"unknown parameter {key!r}; use one of: {', '.join(self.tunable)}"

    def check(self, values: Mapping[str, float], source: str = "parameters") -> ParamValues:
        """Strict check of a (partial) set: known tunable names, finite numbers, inside the bounds.

        Raises ``ValueError`` naming the field and the fix; returns the values as floats.
        """
        out: dict[str, float] = {}
        for name, value in values.items():
            if name not in self:
                raise ValueError(f"{source}: {self.unknown_message(name)}")
            p = spec_of(name)
            if p.fixed:
                raise ValueError(f"{source}: {name} is fixed at {p.default:g}; leave it out")
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{source}: {name} must be a number, got {type(value).__name__}")
            v = float(value)
            if not math.isfinite(v):
                raise ValueError(f"{source}: {name} must be finite, got {v}; use a value in [{p.lower:g}, {p.upper:g}]")
            if not p.lower <= v <= p.upper:
                raise ValueError(f"{source}: {name}={v:g} is outside its bounds [{p.lower:g}, {p.upper:g}]; "
                                 "choose a value inside")
            out[name] = v
        return ParamValues._validated(out)


#: The paper's parameters (every snow-free basin).
CREST_SET = ParameterSet(snow=False)
#: The paper's parameters and Snow-17's (a basin whose task has SNOW=SNOW17).
SNOW17_SET = ParameterSet(snow=True)


def parameter_set(snow: bool = False) -> ParameterSet:
    return SNOW17_SET if snow else CREST_SET


def parameter_set_of(simulator: object) -> ParameterSet:
    """The parameter set of the basin ``simulator`` runs: with Snow-17 only when its task has snow."""
    snow = getattr(simulator, "has_snow", None)
    if snow is None:
        task = getattr(simulator, "task", None)
        snow = getattr(task, "snow", None)
    return parameter_set(bool(snow))
