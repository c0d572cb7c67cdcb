"""``hydroagent pipeline run|status|submit``: the whole recipe (hydroagent_hpc/pipeline, docs/pipeline.md)."""

from __future__ import annotations

import argparse
import json

from hydroagent_hpc.cli.argtypes import positive_int

STAGE_NAMES = ("basins", "base", "teacher", "sft-data", "sft", "grpo", "evaluation", "report")


def cmd_run(args: argparse.Namespace) -> int:
    from hydroagent_hpc.pipeline.runner import format_status, pipeline_status, run_pipeline

    out = run_pipeline(args.file, args.run_dir, workers=args.workers, until=args.until, only=args.only)
    if args.json:
        print(json.dumps(out, default=str))
    else:
        for s in out["stages"]:
            print(f"{s['stage']:<11} {s['action']:<7} {s['wall_s']:>8.1f} s  {s['why']}")
        print(format_status(pipeline_status(args.run_dir)).splitlines()[0])
        report = f"{out['run_dir']}/report/report.md"
        print(f"report: {report}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from hydroagent_hpc.pipeline.runner import format_status, pipeline_status

    status = pipeline_status(args.run_dir)
    print(json.dumps(status, default=str) if args.json else format_status(status))
    return 1 if any(r["status"] == "damaged" for r in status["stages"]) else 0  # its row names the file and field


def cmd_submit(args: argparse.Namespace) -> int:
    from hydroagent_hpc.pipeline.submit import load_site, submit_pipeline

    out = submit_pipeline(args.file, args.run_dir, load_site(args.site), cluster=args.cluster, wait=args.wait)
    print(json.dumps(out, default=str))
    return 0 if not out.get("failed") else 1


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pipeline", help="the whole recipe: basins, teacher, SFT data, SFT, GRPO, evaluation, report",
                       description="Run the recipe of a pipeline file (data/pipelines/*.yaml) into a run folder. "
                                   "Each stage records its inputs' checksums and its outputs; a rerun skips stages "
                                   "whose inputs did not change, resumes one that was cut off, and reruns a stage "
                                   "whose inputs changed and everything after it.")
    ps = p.add_subparsers(dest="pipeline_command", required=True)
    r = ps.add_parser("run", help="run the stages that are not up to date, in this process (trainers as children)")
    r.add_argument("file", metavar="PIPELINE.yaml")
    r.add_argument("--run-dir", required=True, metavar="RUN", help="run folder (created; reruns continue it)")
    r.add_argument("--workers", type=positive_int, default=1, help="worker processes for the campaigns (default 1)")
    r.add_argument("--until", choices=STAGE_NAMES, help="stop after this stage")
    r.add_argument("--only", choices=STAGE_NAMES, help="run only this stage (the ones before it must be done)")
    r.add_argument("--json", action="store_true", help="print one JSON object")
    r.set_defaults(func=cmd_run)
    s = ps.add_parser("status", help="where a run folder stands: each stage's record and what a rerun would do")
    s.add_argument("run_dir", metavar="RUN")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.set_defaults(func=cmd_status)
    b = ps.add_parser("submit", help="submit the stages as Slurm jobs chained with afterok (submitit)",
                      description="Submit every stage that is not done as Slurm jobs through submitit: campaign "
                                  "stages as a begin job, an array of shard jobs and a merge job; SFT and GRPO as "
                                  "requeueable jobs on the site's GPU partition (or on CPU when the site file says "
                                  "gpus: 0); each job waits for the one before it (afterok). Resubmitting the same "
                                  "command after a failure submits only what is not done.")
    b.add_argument("file", metavar="PIPELINE.yaml")
    b.add_argument("--run-dir", required=True, metavar="RUN")
    b.add_argument("--site", metavar="SITE.yaml", help="site file (partitions, GPUs, times; see docs/pipeline.md); "
                                                       "default: $SBATCH_PARTITION etc. and training on CPU")
    b.add_argument("--cluster", choices=("auto", "slurm", "local", "debug"), default="auto")
    b.add_argument("--wait", action="store_true", help="wait for the report job and print the stages' states")
    b.set_defaults(func=cmd_submit)
