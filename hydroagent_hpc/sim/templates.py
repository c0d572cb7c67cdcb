"""Control-file templates with ``{placeholder}`` fields (see ``ef5/templates/``).

Filling is strict because values may come from configs or from a model's tool call: numbers must
be finite and are written with ``repr``; text values (paths, ids) must be single tokens with no
white space, brackets, ``=`` or comment markers, so nothing can add a key or a section. Every
placeholder must be given and every given value must be used.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path

from hydroagent_hpc.sim.controlfile import Forcing

__all__ = ["TEMPLATE_DIR", "placeholders", "fill_template", "basin_control_text"]

TEMPLATE_DIR = Path(__file__).resolve().parents[2] / "ef5" / "templates"
_FIELD = re.compile(r"\{([a-z_][a-z0-9_]*)\}")
_SAFE_TEXT = re.compile(r"^[A-Za-z0-9_./:+\-]+$")


def placeholders(text: str) -> set[str]:
    """Placeholder names used outside comment lines."""
    body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    return set(_FIELD.findall(body))


def _render(name: str, value) -> str:
    if isinstance(value, bool):
        raise ValueError(f"template field {name!r}: a boolean is not allowed")
    if isinstance(value, (int, float)):
        if not math.isfinite(float(value)):
            raise ValueError(f"template field {name!r}: {value!r} is not finite")
        return repr(value) if isinstance(value, int) else repr(float(value))
    text = str(value)
    if not _SAFE_TEXT.match(text) or "//" in text:
        raise ValueError(f"template field {name!r}: {text!r} must be one token of letters, digits and ._/:+- "
                         "(no spaces, '=', brackets or comment markers)")
    return text


def fill_template(template: str | Path, values: Mapping[str, object]) -> str:
    """The template's text with every ``{field}`` replaced; comment lines are dropped."""
    text = Path(template).read_text() if isinstance(template, Path) or "\n" not in str(template) else str(template)
    needed = placeholders(text)
    missing = sorted(needed - set(values))
    extra = sorted(set(values) - needed)
    if missing:
        raise ValueError(f"template needs values for: {', '.join(missing)}")
    if extra:
        raise ValueError(f"template has no field(s): {', '.join(extra)}")
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    rendered = {k: _render(k, v) for k, v in values.items()}
    return "\n".join(_FIELD.sub(lambda m: rendered[m.group(1)], line) for line in lines).strip() + "\n"


def basin_control_text(*, header: list[str], gauge: str, cell: tuple[int, int], precip: Forcing, pet: Forcing,
                       timestep: str, begin: datetime, warm: datetime | None, end: datetime,
                       grid_files: Mapping[str, str], scalars: Mapping[str, float], temp: Forcing | None = None,
                       snow: Mapping[str, float] | None = None, snow_grids: Mapping[str, str] | None = None) -> str:
    """The control file of a basin folder in our layout (``basic/``, ``params/``, forcing folders, ``obs/``).

    Every path is relative to the folder (a forcing's ``loc`` too); ``header`` lines become ``#`` comments; ``cell`` is
    (row, col) of the gauge; ``grid_files`` names the parameter grids in ``params/``; ``scalars``
    gives the multiplier of every parameter (written with ``repr``). Used by the synthetic and the
    CAMELS basin writers, so both produce the same layout.

    Snow-17: ``temp`` (a ``[TempForcing]``, its ``dem`` path relative too) with ``snow`` (the eight
    Snow-17 values by name) adds ``[TempForcing]``, ``[Snow17ParamSet SNOWPARAMS]`` (with
    ``snow_grids``: parameter -> file in ``params/``) and ``SNOW=SNOW17`` to the task.
    """
    if (temp is None) != (snow is None):
        raise ValueError("give both temp= and snow= for a Snow-17 basin, or neither")
    snow_names = ("uadj", "mbase", "mfmax", "mfmin", "tipm", "nmf", "plwhc", "scf")
    crest, kw = ("wm", "b", "im", "ke", "fc", "iwu"), ("under", "leaki", "th", "isu", "alpha", "beta", "alpha0")
    lines = [*(f"# {h}" for h in header),
             "", "[Basic]", "DEM=basic/dem.asc", "DDM=basic/ddm.asc", "FAM=basic/fam.asc", "PROJ=geographic",
             "ESRIDDM=true", "SELFFAM=false"]
    for kind, f in (("PrecipForcing", precip), ("PETForcing", pet)):
        lines += ["", f"[{kind} {f.name}]", f"TYPE={f.type}", f"UNIT={f.unit}", f"FREQ={f.freq}",
                  f"LOC={f.loc.as_posix()}", f"NAME={f.pattern}"]
    if temp is not None:
        lines += ["", f"[TempForcing {temp.name}]", f"TYPE={temp.type}", f"UNIT={temp.unit}", f"FREQ={temp.freq}",
                  f"LOC={temp.loc.as_posix()}", f"NAME={temp.pattern}",
                  *([f"DEM={temp.dem.as_posix()}"] if temp.dem is not None else [])]
    snow_lines: list[str] = []
    task_snow: list[str] = []
    if snow is not None and temp is not None:
        snow_lines = ["", "[Snow17ParamSet SNOWPARAMS]",
                      *(f"{k}_grid=params/{f}" for k, f in (snow_grids or {}).items()),
                      f"GAUGE={gauge}", *(f"{k.upper()}={float(snow[k])!r}" for k in snow_names)]
        task_snow = ["SNOW=SNOW17", "SNOW_PARAM_SET=SNOWPARAMS", f"TEMP={temp.name}"]
    lines += [
        "", f"[Gauge {gauge}]", f"CELLX={cell[1]}", f"CELLY={cell[0]}", "OBS=obs/obs.csv", "OUTPUTTS=TRUE",
        "", "[Basin BASIN]", f"GAUGE={gauge}",
        "", "[CrestParamSet CRESTPARAMS]", *(f"{k}_grid=params/{grid_files[k]}" for k in ("wm", "b", "im", "fc")),
        f"GAUGE={gauge}", *(f"{k.upper()}={float(scalars[k])!r}" for k in crest),
        "", "[KWParamSet KWPARAMS]",
        *(f"{k}_grid=params/{grid_files[k]}" for k in ("leaki", "alpha", "beta", "alpha0")),
        f"GAUGE={gauge}", *(f"{k.upper()}={float(scalars[k])!r}" for k in kw), *snow_lines,
        "", "[Task RUN]", "STYLE=SIMU", "MODEL=CREST", "ROUTING=KW", "BASIN=BASIN", f"PRECIP={precip.name}",
        f"PET={pet.name}", "OUTPUT=output", "PARAM_SET=CRESTPARAMS", "ROUTING_PARAM_SET=KWPARAMS", *task_snow,
        f"TIMESTEP={timestep}", f"TIME_BEGIN={begin:%Y%m%d%H%M}",
        *([f"TIME_WARMEND={warm:%Y%m%d%H%M}"] if warm else []),
        f"TIME_END={end:%Y%m%d%H%M}", "", "[Execute]", "TASK=RUN", "",
    ]
    return "\n".join(lines)
