"""The ``hydroagent`` command.

Subcommands: ``simulate`` (a drop-in for ``ef5 control.txt``), ``basin synth`` (a synthetic twin
basin in EF5 layout), ``demo`` (the embedded default end to end). Errors in the input print one
clear message (file:line, key, fix) and exit with status 2; no traceback unless ``--debug``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from pathlib import Path

from hydroagent_hpc import __version__
from hydroagent_hpc.params import PARAMS, PARAM_NAMES
from hydroagent_hpc.sim.errors import HydroAgentError

log = logging.getLogger("hydroagent")


def _parse_set(items: list[str] | None) -> dict[str, float]:
    """``--set NAME=VALUE`` pairs -> {name: float}, strictly."""
    out: dict[str, float] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        name = name.strip().lower()
        if not sep or not name:
            raise HydroAgentError(f"--set {item!r}: expected NAME=VALUE", fix="e.g. --set wm=2.5")
        if name not in PARAMS:
            raise HydroAgentError(f"--set {item!r}: unknown parameter {name!r}", fix=f"use one of: {', '.join(PARAM_NAMES)}")
        try:
            v = float(value)
        except ValueError:
            raise HydroAgentError(f"--set {item!r}: {value!r} is not a number", fix=f"e.g. --set {name}=1.5") from None
        if not math.isfinite(v):
            raise HydroAgentError(f"--set {item!r}: the value must be finite", fix="give a finite number")
        out[name] = v
    return out


def cmd_simulate(args: argparse.Namespace) -> int:
    from hydroagent_hpc.sim import open_simulator
    from hydroagent_hpc.sim.outputs import write_run

    overrides = _parse_set(args.set)
    t0 = time.perf_counter()
    if args.backend == "ef5":
        sim = open_simulator(args.control, "ef5", task=args.task, binary=args.ef5, timeout_s=args.timeout)
        out_dir = Path(args.output) if args.output else sim.task.output
        result = sim.run(overrides, copy_outputs_to=out_dir)
    else:
        sim = open_simulator(args.control, "embedded", task=args.task, cache_dir=False if args.no_cache else None)
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
    from hydroagent_hpc.sim.synthetic import synthesize_basin

    control = synthesize_basin(args.out, name=args.name, area_km2=args.area_km2, window_days=args.window_days,
                               warmup_days=args.warmup_days, seed=args.seed, cellsize_deg=args.cellsize,
                               start=args.start)
    print(control)
    return 0


def _env_overrides(args: argparse.Namespace) -> dict:
    over: dict = {}
    if args.max_simulations is not None:
        over["max_simulations"] = args.max_simulations
    if args.protocol:
        over["protocol"] = args.protocol
    if args.max_turns is not None:
        over["max_turns"] = None if args.max_turns <= 0 else args.max_turns
    if args.target_nse is not None:
        over["target_nse"] = args.target_nse
    if args.no_patience:
        over["patience"] = None
    return over


def cmd_calibrate(args: argparse.Namespace) -> int:
    from hydroagent_hpc.campaign import AgentSpec, Task, run_task
    from hydroagent_hpc.basin import load_basin
    from hydroagent_hpc.config import load_config, preset
    from hydroagent_hpc.store import EpisodeWriter

    env = load_config(args.config) if args.config else preset(args.preset)
    if args.config and args.preset != env.preset:
        log.info("preset from %s: %s", args.config, env.preset)
    from dataclasses import replace

    env = replace(env, **_env_overrides(args))
    options = {}
    if args.script:
        options["script"] = args.script
    if args.model:
        options["model"] = args.model
    if args.path:
        options["path"] = args.path
    if args.backend != "embedded":
        options["backend"] = args.backend
    basin = load_basin(args.basin)
    episode_id = args.episode_id or f"calibrate/{basin.basin_id}/{args.agent}/{args.seed}"
    from hydroagent_hpc.store import stored_ids

    if Path(args.out).exists() and episode_id in stored_ids(args.out):
        raise HydroAgentError(f"{args.out} already holds episode {episode_id}", fix="give another --seed, --episode-id or --out")
    task = Task(episode_id, str(args.basin), AgentSpec(args.agent, args.kind or args.agent, options), args.seed, env)
    ep = run_task(task)
    with EpisodeWriter(args.out) as w:
        if w.has(ep.episode_id):
            raise HydroAgentError(f"{args.out} already holds episode {ep.episode_id}",
                                  fix="give another --seed, --episode-id or --out")
        w.write(ep, basin)
    best = "none" if ep.best_nse is None else f"{ep.best_nse:.4f}"
    print(f"{ep.episode_id}: best NSE {best} (run {ep.best_run}) after {ep.counters.get('simulations', 0)} simulations, "
          f"{ep.counters.get('turns', 0)} turns, {ep.counters.get('parse_failures', 0)} parse failures; "
          f"stop: {ep.stop_reason}; reward {ep.total_reward:.3f}; stored in {args.out}")
    return 0


def cmd_campaign_run(args: argparse.Namespace) -> int:
    from hydroagent_hpc.campaign import load_campaign, run_campaign

    spec = load_campaign(args.file)
    summary = run_campaign(spec, args.out, workers=args.workers, progress=not args.no_progress, limit=args.limit)
    print(json.dumps(summary))
    return 0 if not summary["failed"] else 1


def cmd_demo(args: argparse.Namespace) -> int:
    from hydroagent_hpc.demo import run_demo

    return run_demo(Path(args.out), workers=args.workers, campaign=not args.no_campaign)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hydroagent", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"hydroagent-hpc {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    p.add_argument("-q", "--quiet", action="store_true", help="log warnings and errors only")
    p.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("simulate", help="run an EF5 control file (drop-in for `ef5 control.txt`)",
                       description="Run an EF5 control file's SIMU task and write what EF5 writes: "
                                   "ts.<gauge>.crest.csv, results.json and state grids.")
    s.add_argument("control", help="EF5 control file")
    s.add_argument("--backend", choices=("embedded", "ef5"), default="embedded",
                   help="embedded: our in-process engine (default); ef5: the EF5 binary in $HYDROAGENT_EF5")
    s.add_argument("--set", action="append", metavar="NAME=VALUE",
                   help=f"override a multiplier of the task's parameter sets (names: {', '.join(PARAM_NAMES)})")
    s.add_argument("--output", help="output folder (default: the task's OUTPUT); created if missing")
    s.add_argument("--task", help="task to run (default: the first in [Execute])")
    s.add_argument("--ef5", help="EF5 binary for --backend ef5 (default: $HYDROAGENT_EF5)")
    s.add_argument("--timeout", type=float, default=600.0, help="seconds before an EF5 run is killed (default 600)")
    s.add_argument("--no-cache", action="store_true", help="do not read or write the forcing cache")
    s.add_argument("--metrics", action="store_true", help="add NSE, KGE and peak errors against OBS to the summary line")
    s.set_defaults(func=cmd_simulate)

    b = sub.add_parser("basin", help="basin tools").add_subparsers(dest="basin_command", required=True)
    sy = b.add_parser("synth", help="write a synthetic twin basin in EF5 layout",
                      description="Write DEM/DDM/FAM, parameter grids, hourly storms, PET, a control file and "
                                  "'observed' discharge from hidden true multipliers (stored in truth.json).")
    sy.add_argument("--name", required=True)
    sy.add_argument("--area-km2", type=float, required=True)
    sy.add_argument("--window-days", type=int, default=60)
    sy.add_argument("--warmup-days", type=int, default=30)
    sy.add_argument("--seed", type=int, default=0)
    sy.add_argument("--cellsize", type=float, default=None, help="cell size in degrees (default: chosen from the area)")
    sy.add_argument("--start", default="2021-06-01", help="first scored day, YYYY-MM-DD (warm-up precedes it)")
    sy.add_argument("--out", required=True, help="folder to write the basin into")
    sy.set_defaults(func=cmd_basin_synth)

    c = sub.add_parser("calibrate", help="run one calibration episode and store it in HDF5",
                       description="Run one episode of an agent on a basin folder and append it to an HDF5 store.")
    c.add_argument("--basin", required=True, help="basin folder (control.txt, obs; e.g. from `basin synth`)")
    c.add_argument("--agent", required=True, help="agent name (also its kind unless --kind is given): heuristic, dds, "
                                                   "sceua, lhs, random, dream, hybrid, openai, hf_local, scripted")
    c.add_argument("--kind", help="agent kind when --agent is a free name")
    c.add_argument("--preset", choices=("paper", "released"), default="paper")
    c.add_argument("--config", help="environment config YAML (preset + overrides, strict)")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--out", required=True, help="HDF5 file to append the episode to")
    c.add_argument("--script", help="JSON script for --agent scripted")
    c.add_argument("--model", help="model name from the models file for --agent openai")
    c.add_argument("--path", help="checkpoint folder for --agent hf_local")
    c.add_argument("--backend", choices=("embedded", "ef5"), default="embedded")
    c.add_argument("--protocol", choices=("turns", "rounds"))
    c.add_argument("--max-simulations", type=int)
    c.add_argument("--max-turns", type=int, help="tool-call cap (0 = off)")
    c.add_argument("--target-nse", type=float)
    c.add_argument("--no-patience", action="store_true", help="switch off the stop after evaluations without improvement")
    c.add_argument("--episode-id")
    c.set_defaults(func=cmd_calibrate)

    cp = sub.add_parser("campaign", help="campaigns of agents x basins x seeds").add_subparsers(
        dest="campaign_command", required=True)
    cr = cp.add_parser("run", help="run a campaign file into an HDF5 store (resumes where it stopped)")
    cr.add_argument("file", help="campaign YAML")
    cr.add_argument("--out", required=True, help="HDF5 file (episodes already in it are skipped)")
    cr.add_argument("--workers", type=int, default=1, help="local worker processes (default 1)")
    cr.add_argument("--limit", type=int, help="run at most this many episodes now")
    cr.add_argument("--no-progress", action="store_true")
    cr.set_defaults(func=cmd_campaign_run)

    d = sub.add_parser("demo", help="the embedded default end to end: synthetic basins, defaults, a demo campaign")
    d.add_argument("--out", default="results/demo", help="output folder (default results/demo)")
    d.add_argument("--workers", type=int, help="worker processes for the campaign (default: up to 2)")
    d.add_argument("--no-campaign", action="store_true", help="only build the basins and run the defaults")
    d.set_defaults(func=cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        return int(args.func(args) or 0)
    except HydroAgentError as exc:
        if args.debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (ValueError, OSError) as exc:
        if args.debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
