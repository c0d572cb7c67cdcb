"""What EF5 writes after a run, written the same way: ``ts.<gauge>.crest.csv``, ``results.json``
and state grids; and a reader for EF5's CSV (for the EF5 backend and for comparisons).

Format facts (``ef5-reference/README.md``): ``Time`` is ``YYYY-MM-DD HH:MM`` at the end of the
step; Discharge, Observed, Precip, PET and SM are printed ``%.2f``; Fast and Slow Flow are the
basin-mean excess rates in mm/s times 1000, ``%.4f``; a missing observation is ``nan``; rows
start at the first step, or at TIME_WARMEND inclusive. With Snow-17 EF5 appends
``Temperature (C),SWE(mm)`` (both ``%.2f``; ``Simulator.cpp:383,984``) and its Precip column is the
snowpack's outflow (rain and melt). Unlike EF5 we create the output folder,
and write every file through a temporary name so a killed run leaves no half file.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from hydroagent_hpc.sim.errors import SimulationError
from hydroagent_hpc.sim.grids import Grid, write_tif
from hydroagent_hpc.types import GaugeSeries, SimulationResult

__all__ = ["STATE_GRIDS", "HEADER", "SNOW_HEADER", "write_ts_csv", "write_results_json", "write_states", "read_ts_csv",
           "ts_filename"]

HEADER = ("Time,Discharge(m^3 s^-1),Observed(m^3 s^-1),Precip(mm h^-1),PET(mm h^-1),SM(%),"
          "Fast Flow(mm*1000),Slow Flow(mm*1000)")
SNOW_HEADER = ",Temperature (C),SWE(mm)"  # appended by EF5 when the task has SNOW


def ts_filename(gauge: str, model: str = "crest") -> str:
    return f"ts.{gauge.lower()}.{model}.csv"


def _nan_if_not_finite(a: np.ndarray) -> list[float]:
    """The column as Python floats, with every non-finite value as NaN (printed ``nan``, as EF5 does)."""
    a = np.asarray(a, dtype=np.float64)
    return np.where(np.isfinite(a), a, np.nan).tolist()


def write_ts_csv(path: str | Path, result: SimulationResult, gauge: str) -> Path:
    """Write one gauge's rows (warm-up excluded) in EF5's exact format.

    A row is one ``%``-format of the whole line (``%.2f`` prints NaN as ``nan``; other non-finite
    values are made NaN first), which is several times faster than formatting field by field; a
    drop-in run of a small basin spends a noticeable share of its time here."""
    g: GaugeSeries = result.gauges[gauge]
    keep = ~result.warmup
    snow = g.temperature is not None and g.swe is not None
    times = [t.replace("T", " ") for t in result.times[keep].astype("datetime64[m]").astype(str).tolist()]
    cols = [_nan_if_not_finite(c[keep]) for c in (g.discharge, g.observed, g.precip, g.pet, g.soil_moisture)]
    cols += [(np.asarray(c[keep], dtype=np.float64) * 1000.0).tolist() for c in (g.fast_flow, g.slow_flow)]
    fmt = "%s,%.2f,%.2f,%.2f,%.2f,%.2f,%.4f,%.4f"
    if snow:
        assert g.temperature is not None and g.swe is not None
        cols += [_nan_if_not_finite(g.temperature[keep]), _nan_if_not_finite(g.swe[keep])]
        fmt += ",%.2f,%.2f"
    lines = [HEADER + (SNOW_HEADER if snow else "")]
    lines += [fmt % row for row in zip(times, *cols)]
    p = Path(path)
    _atomic_write(p, "\n".join(lines) + "\n")
    return p


def write_results_json(path: str | Path, missing_qpe: int, runtime_s: float) -> Path:
    p = Path(path)
    _atomic_write(p, f'{{\n"missingQPE": {int(missing_qpe)},\n"missingQPF": 0,\n"runTimeSeconds": {runtime_s:f}\n}}')
    return p


# EF5's state grids, ``<name>_YYYYMMDD_HHUU.tif``, by our key: CREST soil water (mm), KW channel and
# overland flow, KW interflow reservoir. Read at TIME_BEGIN from STATES, written at TIME_STATE.
STATE_GRIDS = {"w": "crest_SM", "pq": "kwr_pCQ", "po": "kwr_pOQ", "ir": "kwr_IR"}


def write_states(folder: str | Path, stamp: str, dem: Grid, rows, cols, states: dict[str, np.ndarray]) -> list[Path]:
    """EF5's state grids over the full DEM extent, -9999 outside the basin, float32, deflate."""
    out = []
    names = list(STATE_GRIDS.items())
    names += [(k, f"snow17_{k[5:]}") for k in states if k.startswith("snow_")]  # EF5's Snow17Model::SaveStates
    for key, name in names:
        data = np.full(dem.data.shape, -9999.0)
        data[rows, cols] = states[key]
        p = Path(folder) / f"{name}_{stamp}.tif"
        write_tif(p, Grid(data, dem.xll, dem.yll, dem.cellsize, -9999.0), compress=True)
        out.append(p)
    return out


def read_ts_csv(path: str | Path) -> dict[str, np.ndarray]:
    """Read an EF5 ``ts.*.csv``: times (datetime64[m]) and the numeric columns.

    Column names are the header's words before ``(``, lower case, ``_`` for spaces: ``discharge``,
    ``observed``, ``precip``, ``pet``, ``sm``, ``fast_flow``, ``slow_flow``, and with snow
    ``temperature`` and ``swe``.

    Raises :class:`SimulationError` for a missing, empty, ragged or non-finite-discharge file,
    which is how EF5's shifted-row bug and killed runs show up.
    """
    p = Path(path)
    if not p.exists():
        raise SimulationError(f"EF5 wrote no output file {p}", fix="see EF5's log for why the run failed")
    lines = p.read_text(errors="replace").splitlines()
    if len(lines) < 2 or not lines[0].startswith("Time,"):
        raise SimulationError(f"{p}: no header or no rows (partial output)", fix="rerun; see EF5's log")
    header = lines[0].split(",")
    times, rows = [], []
    for n, line in enumerate(lines[1:], start=2):
        parts = line.split(",")
        if len(parts) != len(header):
            raise SimulationError(f"{p}:{n}: {len(parts)} columns where the header has {len(header)} "
                                  f"(partial or shifted row)",
                                  fix="treat the run as failed")
        times.append(parts[0])
        try:
            rows.append([float(x) for x in parts[1:]])
        except ValueError:
            raise SimulationError(f"{p}:{n}: a value is not a number: {line[:80]!r}",
                                  fix="treat the run as failed") from None
    data = np.array(rows, dtype=np.float64)
    out = {"times": np.array([t.replace(" ", "T") for t in times], dtype="datetime64[m]")}
    for j, name in enumerate(header[1:]):
        out[name.split("(")[0].strip().lower().replace(" ", "_")] = data[:, j]
    if not np.all(np.isfinite(out["discharge"])):
        raise SimulationError(f"{p}: non-finite discharge (EF5 prints such rows shifted)",
                              fix="treat the run as failed")
    return out


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.part")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_run(sim, result: SimulationResult, output_dir: str | Path, runtime_s: float,
              states_dir: str | Path | None = None) -> list[Path]:
    """Everything EF5 writes for a SIMU task: per-gauge CSVs, results.json, state grids.

    State grids go to the task's STATES folder, or to ``states_dir`` when given.
    """
    out = Path(output_dir)
    written = [write_ts_csv(out / ts_filename(g), result, g) for g in sim.output_gauges()]
    written.append(write_results_json(out / "results.json", result.missing_precip, runtime_s))
    states = result.info.get("states") if isinstance(result.info, dict) else None
    step = result.info.get("state_step", -1) if isinstance(result.info, dict) else -1
    if states and step >= 0 and sim.task.states is not None:
        stamp = f"{sim.steps[step]:%Y%m%d_%H%M}"
        written += write_states(states_dir or sim.task.states, stamp, sim.dem, sim.net.rows, sim.net.cols, states)
    return written
