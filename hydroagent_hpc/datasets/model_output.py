"""The CAMELS-US SAC-SMA + Snow-17 benchmark files: a published simulation to beat.

``<id>_05_model_output.txt`` (Newman et al. 2015, HESS 19, 209-223; calibration run 05), one
header line ``YR MNTH DY HR SWE PRCP RAIM TAIR PET ET MOD_RUN OBS_RUN``, whitespace separated:
SWE (mm), PRCP (mm/day), RAIM (rain + melt, mm/day), TAIR (degC), PET (mm/day,
Priestley-Taylor), ET (mm/day), MOD_RUN (simulated runoff, mm/day), OBS_RUN (observed runoff,
mm/day = USGS flow / basin area).

The file's OBS_RUN is not always an observation: after the USGS record ends (01031500 after
2014-09-30) it holds zeros. :func:`reference_nse` therefore masks the days the USGS streamflow
file flags missing when it is given, and values below 0 always.

NSE (Nash and Sutcliffe 1970, J. Hydrol. 10, 282-290): ``1 - sum((s-o)^2) / sum((o-mean(o))^2)``
over the days both are valid; it does not depend on the unit, so mm/day and m3/s agree.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hydroagent_hpc.datasets.camels import BasinForcing, Streamflow, bad_file, check_gauge_id
from hydroagent_hpc.metrics import nse
from hydroagent_hpc.sim.errors import InputError

log = logging.getLogger(__name__)

__all__ = ["ModelOutput", "read_model_output", "find_model_output_file", "reference_nse", "forcing_from_model_output"]

_HEADER = ("yr", "mnth", "dy", "hr", "swe", "prcp", "raim", "tair", "pet", "et", "mod_run", "obs_run")


@dataclass
class ModelOutput:
    gauge_id: str
    path: str
    dates: np.ndarray  # datetime64[D]
    columns: dict  # swe, prcp, raim, tair, pet, et, mod_run, obs_run -> array

    def __getitem__(self, key: str) -> np.ndarray:
        return self.columns[key]


def find_model_output_file(root, gauge_id: str) -> Path:
    """``<id>_05_model_output.txt`` (or another calibration run ``_NN_``) under ``root``."""
    gid = check_gauge_id(gauge_id)
    hits = sorted(Path(root).rglob(f"{gid}_*_model_output.txt"))
    if not hits:
        raise InputError(f"no {gid}_05_model_output.txt under {root}",
                         fix="point --root at the CAMELS model_output folder (or a copy holding <id>/)")
    five = [h for h in hits if h.name == f"{gid}_05_model_output.txt"]
    return (five or hits)[0]


def read_model_output(path) -> ModelOutput:
    p = Path(path)
    try:
        lines = p.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        raise InputError(f"model output file not found: {p}", fix="check the path") from None
    if not lines or tuple(h.lower() for h in lines[0].split()) != _HEADER:
        raise bad_file(p, 1, f"unexpected header {lines[0][:80] if lines else ''!r}",
                       "expected 'YR MNTH DY HR SWE PRCP RAIM TAIR PET ET MOD_RUN OBS_RUN'")
    rows = []
    for lineno, line in enumerate(lines[1:], start=2):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != len(_HEADER):
            raise bad_file(p, lineno, f"{len(parts)} values where the header has {len(_HEADER)}",
                           "each row has the twelve columns of the header")
        try:
            rows.append([float(x) for x in parts])
        except ValueError:
            raise bad_file(p, lineno, f"a value is not a number: {line.strip()[:80]!r}", "write numbers") from None
    data = np.array(rows)
    dates = np.array([f"{int(y):04d}-{int(m):02d}-{int(d):02d}" for y, m, d in data[:, :3]], dtype="datetime64[D]")
    step = np.diff(dates).astype(np.int64)
    if step.size and np.any(step != 1):
        i = int(np.argmax(step != 1))
        raise bad_file(p, i + 3, f"the date {dates[i + 1]} does not follow {dates[i]}", "rows must be consecutive days")
    gid = check_gauge_id(p.name.split("_")[0])
    return ModelOutput(gid, str(p), dates, {k: data[:, j] for j, k in enumerate(_HEADER) if j >= 4})


def reference_nse(mo: ModelOutput, start, end, streamflow: Streamflow | None = None) -> dict:
    """NSE of the published MOD_RUN against OBS_RUN over ``start..end`` (inclusive days).

    Days before/after the file, OBS_RUN < 0, and days the USGS file flags missing are left out.
    Returns ``{"nse", "days", "start", "end"}`` with the days actually scored.
    """
    a, b = np.datetime64(start, "D"), np.datetime64(end, "D")
    keep = (mo.dates >= a) & (mo.dates <= b) & (mo["obs_run"] >= 0.0)
    if streamflow is not None:
        missing = set(streamflow.dates[~np.isfinite(streamflow.q_cfs)].tolist())
        outside = (mo.dates < streamflow.dates[0]) | (mo.dates > streamflow.dates[-1])
        keep &= ~outside & ~np.isin(mo.dates, np.array(sorted(missing), dtype="datetime64[D]"))
    if keep.sum() < 2:
        raise ValueError(f"{mo.path}: no scored days between {a} and {b}; "
                         f"the file covers {mo.dates[0]}..{mo.dates[-1]}")
    days = mo.dates[keep]
    return {"nse": nse(mo["obs_run"][keep], mo["mod_run"][keep], min_points=2), "days": int(keep.sum()),
            "start": str(days[0]), "end": str(days[-1])}


def forcing_from_model_output(mo: ModelOutput, precip: str = "prcp") -> BasinForcing:
    """Forcing from the model-output file: PRCP (or RAIM, rain + Snow-17 melt) and its PET.

    ``precip="raim"`` feeds the benchmark's own snow model output to a model without snow; it is
    a diagnostic, not an independent forcing. Temperature is TAIR in both Tmax and Tmin;
    radiation, vapour pressure and day length are not in the file (NaN).
    """
    if precip not in ("prcp", "raim"):
        raise ValueError(f"precip={precip!r}: use 'prcp' (total precipitation) or 'raim' (rain + snowmelt)")
    n = mo.dates.size
    nan = np.full(n, np.nan)
    return BasinForcing(mo.gauge_id, "model_output", mo.path, mo.dates.copy(), mo[precip].copy(), mo["tair"].copy(),
                        mo["tair"].copy(), nan, nan.copy(), nan.copy(), pet=mo["pet"].copy(),
                        notes={"precip_column": precip.upper(),
                               "pet": "PET column of the model output (Priestley-Taylor)"})
