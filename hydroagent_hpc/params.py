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

__all__ = ["ParamSpec", "PARAMS", "PARAM_NAMES", "CREST_NAMES", "KW_NAMES", "DEFAULTS", "TUNABLE",
           "check_values"]


@dataclass(frozen=True)
class ParamSpec:
    name: str
    model: str  # "crest" or "kw"
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


def check_values(values: Mapping[str, float], source: str = "parameters") -> dict[str, float]:
    """Validate names and finiteness (not bounds: the simulator accepts any value EF5 accepts)."""
    out = {}
    for name, value in values.items():
        key = str(name).lower()
        if key not in PARAMS:
            raise ValueError(f"{source}: unknown parameter {name!r}; valid names: {', '.join(PARAM_NAMES)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{source}: {key} must be a number, got {type(value).__name__}")
        v = float(value)
        if not math.isfinite(v):
            raise ValueError(f"{source}: {key} must be finite, got {v}")
        out[key] = v
    return out
