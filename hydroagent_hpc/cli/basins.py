"""``hydroagent simulate``, ``basin synth|from-camels`` and ``data usgs|camels|verify``: basins and their data."""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from pathlib import Path

from hydroagent_hpc.cli.argtypes import nonnegative_int, positive_float, positive_int, seed
from hydroagent_hpc.datasets.usgs import download_hourly
from hydroagent_hpc.errors import UsageError
from hydroagent_hpc.params import PARAM_NAMES, PARAMS, SNOW_NAMES, SNOW_PARAMS
from hydroagent_hpc.sim.errors import HydroAgentError
from hydroagent_hpc.sim.manifest import verify_manifest, write_manifest
from hydroagent_hpc.sim.outputs import write_run

log = logging.getLogger("hydroagent")


def _parse_set(items: list[str] | None) -> dict[str, float]:
    """``--set NAME=VALUE`` pairs -> {name: float}, strictly."""
    out: dict[str, float] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        name = name.strip().lower()
        if not sep or not name:
            raise HydroAgentError(f"--set {item!r}: expected NAME=VALUE", fix="e.g. --set wm=2.5")
        if name not in PARAMS and name not in SNOW_PARAMS:
            raise HydroAgentError(f"--set {item!r}: unknown parameter {name!r}",
                                  fix=f"use one of: {', '.join(PARAM_NAMES)} (with SNOW=SNOW17 also: "
                                      f"{', '.join(SNOW_NAMES)})")
        try:
            v = float(value)
        except ValueError:
            raise HydroAgentError(f"--set {item!r}: {value!r} is not a number", fix=f"e.g. --set {name}=1.5") from None
        if not math.isfinite(v):
            raise HydroAgentError(f"--set {item!r}: the value must be finite", fix="give a finite number")
        out[name] = v
    return out


def cmd_simulate(args: argparse.Namespace) -> int:
    overrides = _parse_set(args.set)
    t0 = time.perf_counter()
    if args.backend == "ef5":
        from hydroagent_hpc.sim.ef5 import EF5Simulator  # only here: the drop-in process starts without it

        if args.snow_physics != "ef5":
            raise HydroAgentError(f"--snow-physics {args.snow_physics} needs --backend embedded",
                                  fix="EF5 computes Snow-17 its own way; drop --snow-physics or use the "
                                      "embedded engine")
        ef5 = EF5Simulator(args.control, task=args.task, binary=args.ef5, timeout_s=args.timeout)
        out_dir = Path(args.output) if args.output else ef5.task.output
        result = ef5.run(overrides, copy_outputs_to=out_dir)
    else:
        from hydroagent_hpc.sim.embedded import EmbeddedSimulator

        sim = EmbeddedSimulator(args.control, task=args.task, cache_dir=False if args.no_cache else None,
                                snow_physics=args.snow_physics)
        out_dir = Path(args.output) if args.output else sim.task.output
        result = sim.run(overrides, keep_states=sim.task.states is not None)
        write_run(sim, result, out_dir, time.perf_counter() - t0, states_dir=Path(args.output) if args.output else None)
    if result.missing_precip:
        log.warning("%d precipitation file(s) were missing and read as zero (missingQPE in results.json)",
                    result.missing_precip)
    summary = {"backend": result.backend, "output": str(out_dir), "gauge": result.gauge,
               "wall_time_s": round(time.perf_counter() - t0, 4), "missingQPE": result.missing_precip}
    mask = result.evaluation_mask()
    if args.metrics and mask.sum() >= 2:
        from hydroagent_hpc.metrics import evaluate

        m = evaluate(result.observed, result.discharge, result.times, mask=mask)
        summary.update({k: (round(float(m[k]), 4) if isinstance(m[k], float) else m[k])
                        for k in ("NSE", "KGE", "PBIAS", "peak_error_pct", "peak_lag_h", "n_points", "nse_band")})
    summary["peak_q"] = round(float(result.discharge[~result.warmup].max()), 3)
    print(json.dumps(summary))
    return 0


def cmd_basin_synth(args: argparse.Namespace) -> int:
    from hydroagent_hpc.sim.synth.basins import synthesize_basin

    control = synthesize_basin(args.out, name=args.name, area_km2=args.area_km2, window_days=args.window_days,
                               warmup_days=args.warmup_days, seed=args.seed, cellsize_deg=args.cellsize,
                               start=args.start)
    print(control)
    return 0


def _command_line() -> str:
    import shlex

    return "hydroagent " + shlex.join(sys.argv[1:])


def cmd_basin_from_camels(args: argparse.Namespace) -> int:
    from hydroagent_hpc.datasets.camels_basin import write_camels_basin

    control = write_camels_basin(args.out, root=args.root, gauge_id=args.basin, start=args.start, end=args.end,
                                 warmup_days=args.warmup_days, forcing=args.forcing, attributes=args.attributes,
                                 spinup=args.spinup, precip_column=args.precip_column, target_cells=args.cells,
                                 network=args.network, snow=args.snow, command=_command_line())
    print(control)
    return 0


def cmd_data_usgs(args: argparse.Namespace) -> int:
    meta = download_hourly(args.site, args.start, args.end, args.out, base_url=args.base_url)
    print(json.dumps({k: meta[k] for k in ("site", "start_utc", "end_utc", "hours", "missing_hours", "kept",
                                           "rejected_by_qualifier", "duplicate_rows")} | {"out": str(args.out)}))
    return 0


def cmd_data_camels(args: argparse.Namespace) -> int:
    from hydroagent_hpc.datasets.download import OFFICIAL_BASE_URL, download_camels  # ssl, http, email, zipfile

    sums: dict[str, str] = {}
    for item in args.sha256 or []:
        name, sep, digest = item.partition("=")
        if not sep or len(digest) != 64:
            raise UsageError(f"--sha256 {item!r}: expected NAME=HEX with a 64-digit SHA-256",
                             fix="e.g. --sha256 camels_topo.txt=<64 hex digits>")
        sums[name] = digest
    record = download_camels(Path(args.out), base_url=args.base_url or OFFICIAL_BASE_URL,
                             timeseries=not args.attributes_only,
                             attributes=not args.timeseries_only, keep_archive=args.keep_archive,
                             expected_sha256=sums, timeout=args.timeout)
    print(json.dumps({"out": str(args.out), "source": record["source"],
                      "files": [{k: f[k] for k in ("name", "bytes", "sha256", "reused") if k in f}
                                for f in record["files"]]}))
    return 0


def cmd_data_verify(args: argparse.Namespace) -> int:
    if args.write:
        path = write_manifest(args.dir, source={"recorded_by": "hydroagent data verify --write"},
                              command=_command_line())
        print(path)
        return 0
    problems = verify_manifest(args.dir, required=True)
    for line in problems:
        print(line)
    if not problems:
        print(f"{args.dir}: every file matches its manifest")
    return 1 if problems else 0


#: The subcommands :func:`add_parsers` adds.
COMMANDS = ("simulate", "basin", "data")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """The simulate, basin and data subcommands (:data:`COMMANDS`)."""
    s = sub.add_parser("simulate", help="run an EF5 control file (drop-in for `ef5 control.txt`)",
                       description="Run an EF5 control file's SIMU task and write what EF5 writes: "
                                   "ts.<gauge>.crest.csv, results.json and state grids.")
    s.add_argument("control", help="EF5 control file")
    s.add_argument("--backend", choices=("embedded", "ef5"), default="embedded",
                   help="embedded: our in-process engine (default); ef5: the EF5 binary in $HYDROAGENT_EF5")
    s.add_argument("--set", action="append", metavar="NAME=VALUE",
                   help=f"override a multiplier of the task's parameter sets (names: {', '.join(PARAM_NAMES)}; "
                        f"with SNOW=SNOW17 also {', '.join(SNOW_NAMES)})")
    s.add_argument("--output", help="output folder (default: the task's OUTPUT); created if missing")
    s.add_argument("--task", help="task to run (default: the first in [Execute])")
    s.add_argument("--ef5", help="EF5 binary for --backend ef5 (default: $HYDROAGENT_EF5)")
    s.add_argument("--timeout", type=positive_float, default=600.0,
                   help="seconds before an EF5 run is killed (default 600)")
    s.add_argument("--no-cache", action="store_true", help="do not read or write the forcing cache")
    s.add_argument("--snow-physics", choices=("ef5", "textbook"), default="ef5",
                   help="with SNOW=SNOW17: ef5 = EF5's arithmetic, quirks included (default); textbook = Anderson's "
                        "seasonal melt factor and a mass-conserving ripe snowpack (ef5/README.md)")
    s.add_argument("--metrics", action="store_true",
                   help="add NSE, KGE and peak errors against OBS to the summary line")
    s.set_defaults(func=cmd_simulate)

    b = sub.add_parser("basin", help="basin tools").add_subparsers(dest="basin_command", required=True)
    sy = b.add_parser("synth", help="write a synthetic twin basin in EF5 layout",
                      description="Write DEM/DDM/FAM, parameter grids, hourly storms, PET, a control file and "
                                  "'observed' discharge from hidden true multipliers (stored in truth.json).")
    sy.add_argument("--name", required=True)
    sy.add_argument("--area-km2", type=positive_float, required=True)
    sy.add_argument("--window-days", type=positive_int, default=60)
    sy.add_argument("--warmup-days", type=nonnegative_int, default=30)
    sy.add_argument("--seed", type=seed, default=0)
    sy.add_argument("--cellsize", type=positive_float, default=None,
                    help="cell size in degrees (default: chosen from the area)")
    sy.add_argument("--start", default="2021-06-01", help="first scored day, YYYY-MM-DD (warm-up precedes it)")
    sy.add_argument("--out", required=True, help="folder to write the basin into")
    sy.set_defaults(func=cmd_basin_synth)
    fc = b.add_parser("from-camels", help="write a CAMELS-US gauge as a daily EF5 basin",
                      description="Real daily basin-mean forcing (PET derived where the file has none) and USGS "
                                  "discharge on a synthetic river-network template of the gauge's area; "
                                  "TIMESTEP=1d. See hydroagent_hpc/datasets/camels_basin.py.")
    fc.add_argument("--root", required=True, help="CAMELS folder (basin_mean_forcing/, usgs_streamflow/, "
                                                  "camels_attributes_v2.0/) or a model_output folder")
    fc.add_argument("--basin", required=True, help="8-digit gauge id, e.g. 01013500")
    fc.add_argument("--start", required=True, help="first scored day, YYYY-MM-DD")
    fc.add_argument("--end", required=True, help="last scored day, YYYY-MM-DD")
    fc.add_argument("--warmup-days", type=nonnegative_int, default=365,
                    help="days simulated before --start, not scored")
    fc.add_argument("--forcing", default="nldas",
                    choices=("nldas", "daymet", "maurer", "maurer_extended", "model_output"))
    fc.add_argument("--attributes", help="camels_attributes_v2.0 folder (default: the one under --root)")
    fc.add_argument("--spinup", choices=("none", "repeat"), default="none",
                    help="repeat: fill warm-up days before the record with the forcing a year later")
    fc.add_argument("--precip-column", choices=("prcp", "raim"), default="prcp",
                    help="with --forcing model_output: PRCP (precipitation) or RAIM (rain + Snow-17 melt)")
    fc.add_argument("--cells", type=positive_int, default=150, help="cells of the network template (default 150)")
    fc.add_argument("--network", choices=("comb", "valley"), default="comb",
                    help="network template: comb (cardinal flow directions; EF5's kinematic wave conserves volume "
                         "on it, default) or valley (a D8 valley DEM; EF5's scheme inflates volume on diagonal steps)")
    fc.add_argument("--snow", action="store_true",
                    help="run EF5's Snow-17 in front of CREST: [TempForcing] (daily mean of Tmax/Tmin, degC), "
                         "[Snow17ParamSet] at the default values, SNOW=SNOW17, the DEM at the basin's mean "
                         "elevation; its 8 parameters become calibratable")
    fc.add_argument("--out", required=True, help="folder to write the basin into")
    fc.set_defaults(func=cmd_basin_from_camels)

    da = sub.add_parser("data", help="data tools").add_subparsers(dest="data_command", required=True)
    us = da.add_parser("usgs", help="hourly USGS discharge (UTC, m3/s) as an EF5 observation CSV",
                       description="Fetch instantaneous discharge (parameter 00060) with dataretrieval's Water Data "
                                   "API, convert to m3/s and UTC, drop ice/equipment values and duplicates, average "
                                   "to hours ending at the stamp; missing hours get no row.")
    us.add_argument("--site", required=True, help="8-digit USGS site id")
    us.add_argument("--start", required=True, help="first hour, YYYY-MM-DD (00:00 UTC) or 'YYYY-MM-DD HH:00'")
    us.add_argument("--end", required=True, help="last hour, YYYY-MM-DD (23:00 UTC) or 'YYYY-MM-DD HH:00'")
    us.add_argument("--out", required=True, help="CSV to write (a .json with counts is written beside it)")
    us.add_argument("--base-url", help="Water Data API root instead of the USGS one (a mirror or a replay server)")
    us.set_defaults(func=cmd_data_usgs)
    ca = da.add_parser("camels", help="download CAMELS-US (time series and attributes) from NCAR and unpack it",
                       description="Fetch basin_timeseries_v1p2_metForcing_obsFlow.zip (about 3.4 GB) and the "
                                   "camels_attributes_v2.0 tables from NCAR's CAMELS pages, resume a broken "
                                   "download, CRC-check and unpack atomically. The result is a --root for "
                                   "`hydroagent basin from-camels`. See hydroagent_hpc/datasets/README.md.")
    ca.add_argument("--out", required=True, help="folder to fill (basin_dataset_public_v1p2/, camels_attributes_v2.0/)")
    ca.add_argument("--base-url", help="folder URL holding the CAMELS files (default: NCAR's GDEX camels folder, "
                                       "hydroagent_hpc.datasets.download.OFFICIAL_BASE_URL)")
    part = ca.add_mutually_exclusive_group()
    part.add_argument("--attributes-only", action="store_true", help="only the attribute tables (about 0.6 MB)")
    part.add_argument("--timeseries-only", action="store_true", help="only the time-series archive")
    ca.add_argument("--keep-archive", action="store_true", help="keep the zip under OUT/downloads/ after unpacking")
    ca.add_argument("--sha256", action="append", metavar="NAME=HEX", help="expected SHA-256 of a file (repeatable)")
    ca.add_argument("--timeout", type=float, default=60.0, help="seconds without data before giving up (default 60)")
    ca.set_defaults(func=cmd_data_camels)
    dv = da.add_parser("verify", help="check a basin folder against its manifest.json (exit 1 on any difference)")
    dv.add_argument("dir", help="basin folder")
    dv.add_argument("--write", action="store_true", help="record the folder's current files in a new manifest.json")
    dv.set_defaults(func=cmd_data_verify)
