"""``hydroagent calibrate``, ``campaign run|submit|merge|status``, ``demo`` and ``report``.

:func:`add_campaign_submit` builds ``campaign submit`` and its old spelling ``submit campaign``
(:mod:`hydroagent_hpc.cli.aliases`); :func:`add_site_options` is shared with ``train submit sft|grpo``."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from hydroagent_hpc.cli.argtypes import nonnegative_int, positive_float, positive_int, seed
from hydroagent_hpc.config import PRESETS, EnvConfig, load_config, preset
from hydroagent_hpc.errors import UsageError
from hydroagent_hpc.hpc.site import SITE_OPTIONS, SiteSettings
from hydroagent_hpc.settings import add_arguments, arguments_given
from hydroagent_hpc.sim import BACKENDS as SIM_BACKENDS
from hydroagent_hpc.sim.errors import HydroAgentError

log = logging.getLogger("hydroagent")


#: The environment settings ``calibrate`` takes as options, generated from :class:`EnvConfig`'s fields
#: (``--max-turns`` with 0 for off and ``--no-patience`` are the command line's own spellings).
CALIBRATE_ENV_OPTIONS = ("protocol", "max_simulations", "target_nse")


def _env_overrides(args: argparse.Namespace) -> dict:
    over: dict = arguments_given(args, CALIBRATE_ENV_OPTIONS)
    if args.max_turns is not None:
        over["max_turns"] = None if args.max_turns <= 0 else args.max_turns
    if args.no_patience:
        over["patience"] = None
    return over


_AGENT_FLAGS = {"script": "--script", "model": "--model", "path": "--path", "backend": "--backend"}


def _agent_options(args: argparse.Namespace) -> dict:
    """The agent options ``calibrate`` was given, checked against the kind (a UsageError naming the flag)."""
    from hydroagent_hpc.campaign.spec import AGENT_KINDS, check_agent_options

    kind = args.kind or args.agent
    if kind not in AGENT_KINDS:
        flag = "--kind" if args.kind else "--agent"
        raise UsageError(f"{flag} {kind!r}: unknown agent kind; use one of {', '.join(AGENT_KINDS)}",
                         fix=("--agent NAME --kind KIND for a free name; " if not args.kind else "")
                         + "a new kind is one module and one line in hydroagent_hpc/agents/factory.py")
    options = {o: getattr(args, o) for o in _AGENT_FLAGS if getattr(args, o)}
    if options.get("backend") == "embedded":
        del options["backend"]
    problem = check_agent_options(kind, options)
    if problem:
        flag = _AGENT_FLAGS.get(problem[0], problem[0])
        if problem[0] in options:
            raise UsageError(f"{flag}: agent kind {kind!r} does not take {flag}")
        raise UsageError(f"{flag}: agent kind {kind!r} needs {flag}",
                         fix={"--model": "--model NAME (an entry of the models file, data/models.yaml)",
                              "--path": "--path FOLDER (a local checkpoint)",
                              "--script": "--script FILE (a JSON script)"}.get(flag, ""))
    return options


def cmd_calibrate(args: argparse.Namespace) -> int:
    from hydroagent_hpc.campaign import AgentSpec, Task, run_task
    from hydroagent_hpc.sim.basin import load_basin
    from hydroagent_hpc.store import EpisodeWriter

    options = _agent_options(args)  # before anything is read or run: a wrong agent is a usage error
    env = load_config(args.config) if args.config else preset(args.preset)
    if args.config and args.preset != env.preset:
        log.info("preset from %s: %s", args.config, env.preset)
    from dataclasses import replace

    env = replace(env, **_env_overrides(args))
    basin = load_basin(args.basin)
    episode_id = args.episode_id or f"calibrate/{basin.basin_id}/{args.agent}/{args.seed}"
    from hydroagent_hpc.store import stored_ids

    if Path(args.out).exists() and episode_id in stored_ids(args.out):
        raise HydroAgentError(f"{args.out} already holds episode {episode_id}",
                              fix="give another --seed, --episode-id or --out")
    task = Task(episode_id, str(args.basin), AgentSpec(args.agent, args.kind or args.agent, options), args.seed, env)
    ep = run_task(task)
    with EpisodeWriter(args.out) as w:
        if w.has(ep.episode_id):
            raise HydroAgentError(f"{args.out} already holds episode {ep.episode_id}",
                                  fix="give another --seed, --episode-id or --out")
        w.write(ep, basin)
    best = "none" if ep.best_nse is None else f"{ep.best_nse:.4f}"
    print(f"{ep.episode_id}: best NSE {best} (run {ep.best_run}) after "
          f"{ep.counters.get('simulations', 0)} simulations, "
          f"{ep.counters.get('turns', 0)} turns, {ep.counters.get('parse_failures', 0)} parse failures; "
          f"stop: {ep.stop_reason}; reward {ep.total_reward:.3f}; stored in {args.out}")
    return 0


def cmd_campaign_run(args: argparse.Namespace) -> int:
    from hydroagent_hpc.campaign import load_campaign
    from hydroagent_hpc.campaign.submit import run_on_pool, run_shard

    if (args.out is None) == (args.run_dir is None):
        raise HydroAgentError("campaign run: give exactly one of --out FILE or --run-dir DIR",
                              fix="--out for one HDF5 file; --run-dir (with --shard I/N) for cluster shards")
    progress = not args.no_progress
    if args.run_dir is not None:
        from hydroagent_hpc.campaign.shards import parse_shard

        index, count = parse_shard(args.shard or "0/1")
        summary = run_shard(args.file, args.run_dir, index, count, pool=args.pool, workers=args.workers,
                            max_in_flight=args.max_in_flight, timeout_s=args.timeout,
                            progress=progress and sys.stderr.isatty())
    elif args.shard:
        raise HydroAgentError("--shard needs --run-dir", fix="shards are written as RUN_DIR/shards/shard-I-of-N.h5")
    else:
        summary = run_on_pool(load_campaign(args.file), args.out, args.pool, args.workers, default_workers=1,
                              max_in_flight=args.max_in_flight, timeout_s=args.timeout, progress=progress,
                              limit=args.limit)
    if summary is None:  # an MPI worker rank: the root reports
        return 0
    print(json.dumps(summary))
    return 0 if not summary["failed"] else 1


def cmd_campaign_merge(args: argparse.Namespace) -> int:
    from hydroagent_hpc.campaign import load_campaign
    from hydroagent_hpc.campaign.shards import IncompleteMergeError, merge_run

    try:
        summary = merge_run(load_campaign(args.file), args.run_dir, allow_missing=args.allow_missing)
    except IncompleteMergeError:
        from hydroagent_hpc.campaign.submit import array_active, defer_merge

        if not (args.after_array and array_active(args.after_array)):
            raise
        job = defer_merge(args.after_array, sys.argv, args.run_dir)
        log.warning("array %s still has queued tasks (a requeued shard); the merge runs again as job %s",
                    args.after_array, job)
        print(json.dumps({"deferred_to": job}))
        return 0
    if args.report:
        from hydroagent_hpc.campaign.submit import write_run_report

        summary["report"] = write_run_report(args.run_dir)
    print(json.dumps(summary))
    return 0


def cmd_campaign_status(args: argparse.Namespace) -> int:
    from hydroagent_hpc.campaign import load_campaign
    from hydroagent_hpc.campaign.shards import format_status, run_status

    status = run_status(load_campaign(args.file), args.run_dir)
    print(json.dumps(status) if args.json else format_status(status))
    return 0


def cmd_submit_campaign(args: argparse.Namespace) -> int:
    from hydroagent_hpc.campaign.submit import submit_campaign

    site = site_from_args(args, CAMPAIGN_SITE_OPTIONS)
    out = submit_campaign(args.file, args.run_dir, args.array, site, cluster=args.cluster, wait=args.wait,
                          pool=args.pool, workers=args.workers, max_in_flight=args.max_in_flight,
                          timeout_s=args.timeout, report=not args.no_report)
    print(json.dumps(out, default=str))
    merge = out.get("merge")
    return 1 if out.get("shard_failures") or (merge is not None and merge.get("missing")) else 0


def cmd_demo(args: argparse.Namespace) -> int:
    from hydroagent_hpc.cli.demo import run_demo

    return run_demo(Path(args.out), workers=args.workers, campaign=not args.no_campaign)


def cmd_report(args: argparse.Namespace) -> int:
    from hydroagent_hpc.report import write_report
    from hydroagent_hpc.store import StoreError

    store = Path(args.store)
    out = Path(args.out) if args.out else store.parent / f"{store.stem}_report"
    try:
        report = write_report(store, out, compare=tuple(args.compare) if args.compare else None,
                              allow_partial=args.partial, precip=not args.no_precip)
    except StoreError as exc:  # not a store, empty, partial, older schema: one line, exit 2
        raise HydroAgentError(str(exc)) from None
    print(f"report: {report.markdown} and {report.html} ({len(report.figures)} figures in {out / 'figures'}, "
          f"{len(report.tables)} tables in {out / 'tables'}; {report.seconds:.1f} s)")
    return 0

#: The Slurm fields ``campaign submit`` takes besides :data:`SITE_OPTIONS`: MPI ranks and parallel shards.
CAMPAIGN_SITE_OPTIONS = ("ntasks", "array_parallelism")


def add_site_options(p: argparse.ArgumentParser, *, local: str, extra: tuple[str, ...] = ()) -> None:
    """The Slurm site options every ``submit`` subcommand takes, generated from the fields of
    :class:`hydroagent_hpc.hpc.site.SiteSettings` (:data:`~hydroagent_hpc.hpc.site.SITE_OPTIONS` plus
    ``extra``): the same help text, limits and checks as the pipeline's site file."""
    p.add_argument("--cluster", choices=("auto", "slurm", "local", "debug"), default="auto",
                   help=f"auto: Slurm when sbatch is here, else {local}")
    add_arguments(p, SiteSettings, (*SITE_OPTIONS, *extra))


def site_from_args(args: argparse.Namespace, extra: tuple[str, ...] = ()) -> SiteSettings:
    """The :class:`SiteSettings` the options of :func:`add_site_options` give (then the environment, then defaults)."""
    return SiteSettings.from_env(**arguments_given(args, (*SITE_OPTIONS, *extra)))


def pool_choices() -> tuple[str, ...]:
    """The ``--pool`` choices of ``campaign run|submit``: auto and the pool backends."""
    from hydroagent_hpc.hpc.pool import BACKENDS as POOL_BACKENDS

    return ("auto", *POOL_BACKENDS.names())


def add_campaign_submit(sub: argparse._SubParsersAction, name: str = "submit") -> argparse.ArgumentParser:
    """``campaign submit`` (and, under the name ``campaign`` of the ``submit`` alias group, its old
    spelling ``submit campaign``): one definition of its help and options."""
    sc = sub.add_parser(name, help="a campaign as a job array of shards plus a dependent merge job",
                        description="Submit a campaign as an array of --array shard jobs and a merge job that runs "
                                    "after all of them (Slurm), or run them as local processes and merge (no "
                                    "Slurm). Shards are requeued on preemption or time limit and resume from their "
                                    "files. Site settings default to $SBATCH_PARTITION, $SBATCH_ACCOUNT, "
                                    "$SBATCH_QOS and $HYDROAGENT_MODULES.")
    sc.add_argument("file", help="campaign YAML")
    sc.add_argument("--run-dir", required=True, help="run folder: shards/, campaign.h5, logs/, report/")
    sc.add_argument("--array", type=positive_int, default=4, help="number of shard jobs (default 4)")
    add_site_options(sc, local="local processes", extra=CAMPAIGN_SITE_OPTIONS)
    sc.add_argument("--pool", choices=pool_choices(), default="auto")
    sc.add_argument("--workers", type=positive_int, help="worker processes per shard job (default: its CPUs)")
    sc.add_argument("--max-in-flight", type=positive_int, default=32)
    sc.add_argument("--timeout", type=positive_float, help="seconds one episode may run")
    sc.add_argument("--no-report", action="store_true", help="merge only; do not write RUN_DIR/report/")
    sc.add_argument("--wait", action="store_true", help="wait for the merge job and print its summary")
    sc.set_defaults(func=cmd_submit_campaign)
    return sc


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """The calibrate, campaign, demo and report subcommands."""
    from hydroagent_hpc.agents.factory import AGENT_KINDS

    POOLS = pool_choices()
    c = sub.add_parser("calibrate", help="run one calibration episode and store it in HDF5",
                       description="Run one episode of an agent on a basin folder and append it to an HDF5 store.")
    c.add_argument("--basin", required=True, help="basin folder (control.txt, obs; e.g. from `basin synth`)")
    kinds = AGENT_KINDS.names()  # the one table of agent kinds (agents/factory.py), read when the parser is built
    c.add_argument("--agent", required=True,
                   help=f"agent name (also its kind unless --kind is given): {', '.join(kinds)}")
    c.add_argument("--kind", choices=kinds, help="agent kind when --agent is a free name")
    c.add_argument("--preset", choices=PRESETS.names(), default="paper")
    c.add_argument("--config", help="environment config YAML (preset + overrides, strict)")
    c.add_argument("--seed", type=seed, default=0)
    c.add_argument("--out", required=True, help="HDF5 file to append the episode to")
    c.add_argument("--script", help="JSON script for --agent scripted")
    c.add_argument("--model", help="model name from the models file for --agent openai")
    c.add_argument("--path", help="checkpoint folder for --agent hf_local")
    c.add_argument("--backend", choices=SIM_BACKENDS.names(), default="embedded")
    add_arguments(c, EnvConfig, CALIBRATE_ENV_OPTIONS)
    c.add_argument("--max-turns", type=nonnegative_int, help="tool-call cap (0 = off)")
    c.add_argument("--no-patience", action="store_true",
                   help="switch off the stop after evaluations without improvement")
    c.add_argument("--episode-id")
    c.set_defaults(func=cmd_calibrate)

    cp = sub.add_parser("campaign", help="campaigns of agents x basins x seeds").add_subparsers(
        dest="campaign_command", required=True)
    cr = cp.add_parser("run", help="run a campaign file into an HDF5 store (resumes where it stopped)",
                       description="Run a campaign's episodes into one HDF5 file (--out), or one shard of them into "
                                   "a cluster run folder (--run-dir, --shard I/N). Episodes already stored are "
                                   "skipped, so rerunning the same command resumes.")
    cr.add_argument("file", help="campaign YAML")
    cr.add_argument("--out", help="HDF5 file (episodes already in it are skipped)")
    cr.add_argument("--run-dir", help="run folder for cluster shards: writes RUN_DIR/shards/shard-I-of-N.h5")
    cr.add_argument("--shard", metavar="I/N", help="with --run-dir: run shard I (0-based) of N (default 0/1)")
    cr.add_argument("--pool", choices=POOLS, default="auto",
                    help="where episodes run: auto = MPI ranks under mpiexec/srun, else local processes when "
                         "--workers > 1 (with --run-dir: the task's CPUs), else this process")
    cr.add_argument("--workers", type=positive_int,
                    help="local worker processes (default 1; with --run-dir: SLURM_CPUS_PER_TASK)")
    cr.add_argument("--max-in-flight", type=positive_int, default=32,
                    help="episodes running at once on the MPI pool (default 32)")
    cr.add_argument("--timeout", type=positive_float,
                    help="seconds one episode may run before it is killed and counted failed")
    cr.add_argument("--limit", type=nonnegative_int, help="run at most this many episodes now")
    cr.add_argument("--no-progress", action="store_true")
    cr.set_defaults(func=cmd_campaign_run)
    add_campaign_submit(cp)
    cm = cp.add_parser("merge", help="merge a run folder's shards into RUN_DIR/campaign.h5, each episode once",
                       description="Merge RUN_DIR/shards/*.h5 (and an earlier RUN_DIR/campaign.h5) into a new "
                                   "RUN_DIR/campaign.h5. Fails, replacing nothing, when an episode is missing or "
                                   "sits in two shards of one submission.")
    cm.add_argument("file", help="campaign YAML (names every expected episode)")
    cm.add_argument("--run-dir", required=True)
    cm.add_argument("--allow-missing", action="store_true", help="merge what is there even if episodes are missing")
    cm.add_argument("--report", action="store_true", help="write RUN_DIR/report/ after merging")
    cm.add_argument("--after-array", metavar="JOBID", help="Slurm array of the shards: if episodes are missing while "
                    "a task of it is still queued (requeued), submit this merge again after it instead of failing")
    cm.set_defaults(func=cmd_campaign_merge)
    cs = cp.add_parser("status", help="progress of a run folder: episodes per shard and agent, what is missing",
                       description="Read a run folder's shards and merged file (safe while the array writes them) "
                                   "and print how many episodes each holds, per agent, and which are missing.")
    cs.add_argument("file", help="campaign YAML")
    cs.add_argument("--run-dir", required=True)
    cs.add_argument("--json", action="store_true", help="print one JSON object")
    cs.set_defaults(func=cmd_campaign_status)

    d = sub.add_parser("demo", help="the embedded default end to end: synthetic basins, defaults, a demo campaign")
    d.add_argument("--out", default="results/demo", help="output folder (default results/demo)")
    d.add_argument("--workers", type=positive_int, help="worker processes for the campaign (default: up to 2)")
    d.add_argument("--no-campaign", action="store_true", help="only build the basins and run the defaults")
    d.set_defaults(func=cmd_demo)

    r = sub.add_parser("report", help="write a campaign's report: Markdown, one HTML page, PNG figures, CSV tables",
                       description="Read a campaign's HDF5 store and write report.md, report.html (self-contained), "
                                   "figures/*.png and tables/*.csv into --out.")
    r.add_argument("store", help="the campaign's HDF5 store (e.g. results/demo/campaign.h5)")
    r.add_argument("--out", help="output folder (default: <store name>_report beside the store)")
    r.add_argument("--compare", nargs=2, metavar=("BASE", "OTHER"),
                   help="the two agents to compare (default: lowest vs highest panel-mean best NSE)")
    r.add_argument("--partial", action="store_true",
                   help="report the committed episodes of a store a campaign is still writing (or a killed one left)")
    r.add_argument("--no-precip", action="store_true", help="do not read the basins' forcing for the hydrographs")
    r.set_defaults(func=cmd_report)
