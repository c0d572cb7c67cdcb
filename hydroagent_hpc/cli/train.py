"""``hydroagent train sft-data``: teacher data for SFT from campaign stores (see train/sft/data.py; ``--export-hf
DIR`` also writes it as a conversational JSON Lines data set); ``hydroagent train sft-import``: such a data set
back to an SFT data file (train/sft/hf_data.py);
``hydroagent train eval CHECKPOINT_OR_URL --basins ... --budget N --out STORE.h5``: a checkpoint folder or an
OpenAI-compatible URL evaluated greedily as a campaign, with a summary table (campaign/evaluate.py);
``hydroagent train sft CONFIG --out RUN_DIR [--resume] [--KEY VALUE ...]``: weighted SFT (train/sft/launch.py);
``hydroagent train grpo CONFIG --out RUN_DIR [--resume] [--KEY VALUE ...]``: GRPO on the simulator's reward
(train/grpo/launch.py); both parsers are the entry modules' own, their config-key options made from the configs;
``hydroagent train plan CONFIG --gpu H100-80GB [--gpus N]``: the run's GPU memory plan (train/memory_plan.py);
``hydroagent train timeline RUN [--out PNG] [--steps A:B]``: a GRPO run's step timeline (train/grpo/timeline.py);
``hydroagent train submit sft|grpo CONFIG ...``: those runs as requeueable submitit jobs (train/submit.py).
:func:`add_submit_sft` and :func:`add_submit_grpo` also build the old spellings ``submit sft|grpo``
(:mod:`hydroagent_hpc.cli.aliases`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
from pathlib import Path

from hydroagent_hpc.cli.argtypes import nonnegative_int, positive_float, positive_int, probability, seed
from hydroagent_hpc.cli.runs import add_site_options, site_from_args
from hydroagent_hpc.errors import ConfigError, UsageError, one_line
from hydroagent_hpc.settings import add_arguments, arguments_given, option_names
from hydroagent_hpc.train.grpo import launch as grpo_launch
from hydroagent_hpc.train.grpo.config import load_grpo_config
from hydroagent_hpc.train.grpo.timeline import (
    FILE_NAME,
    draw,
    format_utilisation,
    parse_steps,
    read_timeline,
    utilisation,
)
from hydroagent_hpc.train.live import EvalLiveSettings, metric_values, report_evaluation, require_installed
from hydroagent_hpc.train.memory_plan import GPUS, SHAPES, MemoryPlanError, check_plan, gpu_named, plan_grpo, plan_sft
from hydroagent_hpc.train.sft import launch as sft_launch
from hydroagent_hpc.train.sft.config import load_sft_config

log = logging.getLogger("hydroagent")

#: The ``train eval`` options made from :class:`EvalLiveSettings` (--report-to, --wandb-project, --run-name).
EVAL_LIVE_OPTIONS = option_names(EvalLiveSettings)

#: The SFT data presets (kept here too so building the parser does not import torch).
_SFT_PRESETS = ("paper", "released")
#: The augment modes (train/sft/data.py AUGMENT_MODES).
_AUGMENT_MODES = ("none", "stopping_points")
#: The renderers for text-less episodes (train/sft/data.py RENDERERS).
_RENDERERS = ("none", "calls")


def cmd_sft_data(args: argparse.Namespace) -> int:
    from hydroagent_hpc.train.sft.data import build_sft_data

    report = build_sft_data(args.stores, args.out, preset=args.preset, tokenizer=args.tokenizer,
                            max_tokens=args.max_tokens, augment=args.augment, render=args.render,
                            recovery=args.recovery, recovery_seed=args.recovery_seed, export_hf=args.export_hf)
    summary = {"out": str(report.out), "export_hf": args.export_hf, "preset": report.preset,
               "augment": report.augment, "kept": report.kept,
               "examples": report.examples, "recovery_turns": report.recovery_turns, "dropped": report.dropped,
               "weights": {k: report.weights[k] for k in ("min", "median", "mean", "max")},
               "tokens": {k: report.lengths[k] for k in ("median", "max", "budget", "total_tokens")}}
    print(json.dumps(summary))
    return 0


def cmd_sft_import(args: argparse.Namespace) -> int:
    from hydroagent_hpc.train.sft.data import import_hf_dataset

    report = import_hf_dataset(args.source, args.out, tokenizer=args.tokenizer, max_tokens=args.max_tokens)
    print(json.dumps({"out": str(report.out), "examples": report.examples, "episodes": report.kept,
                      "tokens": {k: report.lengths[k] for k in ("median", "max", "budget", "total_tokens")}}))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    """Evaluate a checkpoint folder or an OpenAI-compatible URL as a campaign; print the summary table."""
    from hydroagent_hpc.campaign.evaluate import evaluate, format_summary  # loads pandas, h5py

    live = EvalLiveSettings(**arguments_given(args, EVAL_LIVE_OPTIONS))
    require_installed(live.report_to)  # before any episode is played
    result = evaluate(args.target, args.basins, args.out, budget=args.budget, preset=args.preset, seeds=args.seeds,
                      max_turns=args.max_turns, name=args.name, model_entry=args.model_entry,
                      max_new_tokens=args.max_new_tokens, max_context_tokens=args.max_context_tokens,
                      workers=args.workers)
    report_evaluation(metric_values("eval", result["summary"]), live, args.target, args.out)
    if args.json:
        print(json.dumps(result, default=str))
    else:
        print(format_summary(result["rows"]), end="")
        print(f"stored in {args.out}")
    return 0 if not result.get("failed") else 1


def cmd_sft(args: argparse.Namespace) -> int:
    summary = sft_launch.run(args)
    if int(os.environ.get("RANK", "0")) == 0:
        print(sft_launch.result_line(summary))
    return sft_launch.exit_status(summary)


def cmd_grpo(args: argparse.Namespace) -> int:
    summary = grpo_launch.run(args)  # torch-free until a training rank starts: MPI simulation ranks never load it
    if not summary.get("worker"):
        print(json.dumps({k: summary[k] for k in ("run_dir", "steps", "first_reward", "last_reward", "final",
                                                  "stopped")}))
    return 0 if summary["stopped"] is None else 143


def cmd_submit_sft(args: argparse.Namespace) -> int:
    from hydroagent_hpc.train.submit import submit_sft  # lazy: tests/test_architecture.py LAZY_OWN_IMPORTS

    site = site_from_args(args)
    out = submit_sft(args.config, args.run_dir, site, gpus=args.gpus, nodes=args.nodes, cluster=args.cluster,
                     wait=args.wait, max_requeues=args.max_requeues, save_wait_s=args.save_wait)
    print(json.dumps(out, default=str))
    return 0


def cmd_submit_grpo(args: argparse.Namespace) -> int:
    from hydroagent_hpc.train.submit import submit_grpo  # lazy: tests/test_architecture.py LAZY_OWN_IMPORTS

    site = site_from_args(args)
    out = submit_grpo(args.config, args.run_dir, site, gpus=args.gpus, cluster=args.cluster, wait=args.wait,
                      max_requeues=args.max_requeues, save_wait_s=args.save_wait, sim_ranks=args.sim_ranks,
                      trainers=args.trainers)
    print(json.dumps(out, default=str))
    return 0


def cmd_timeline(args: argparse.Namespace) -> int:
    """Draw a GRPO run's step timeline (PNG) and print each lane's utilisation per phase."""
    records = read_timeline(args.run, args.steps)
    table = utilisation(records)
    out = Path(args.out) if args.out else Path(args.run) / FILE_NAME.replace(".jsonl", ".png")
    draw(records, out)
    if args.json:
        print(json.dumps({**table, "png": str(out)}))
    else:
        print(format_utilisation(table), end="")
        print(f"\nwrote {out}")
    return 0


def _steps(text: str) -> tuple[int | None, int | None]:
    """``--steps``: ``A:B``, ``A:``, ``:B`` or ``N`` (train/grpo/timeline.py parse_steps)."""
    try:
        return parse_steps(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _load_run_config(path: str, gpus: int) -> tuple[str, object]:
    """``("sft" | "grpo", config)``: the file read as an SFT config, else as a GRPO config (for ``gpus``
    training processes). When it is neither, the error is the loader's whose required key the file has
    (``data``: SFT, ``basins``: GRPO)."""
    import yaml

    try:
        return "sft", load_sft_config(path)
    except ConfigError as sft_error:
        try:
            return "grpo", load_grpo_config(path, world_size=gpus)
        except ConfigError as grpo_error:
            try:
                keys = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
            except (OSError, yaml.YAMLError):
                keys = {}
            if isinstance(keys, dict) and "basins" in keys:
                raise grpo_error from None
            if isinstance(keys, dict) and "data" in keys:
                raise sft_error from None
            raise UsageError(f"{path}: neither an SFT config ({sft_error.message}) nor a GRPO config "
                             f"({grpo_error.message})", "plan an SFT config (with data:) or a GRPO config "
                                                        "(with basins:)") from None


def cmd_plan(args: argparse.Namespace) -> int:
    """Print the memory plan; 0 when it fits, 1 (with the reason on stderr) when it does not."""
    import sys

    if args.gpu is None and args.free_bytes is None:
        raise UsageError("train plan: --gpu: missing", f"name the GPU kind: {', '.join(GPUS)}")
    gpu = gpu_named(args.gpu) if args.free_bytes is None else None
    kind, config = _load_run_config(args.config, args.gpus)
    shape = SHAPES[args.shape] if args.shape else None
    planner = plan_sft if kind == "sft" else plan_grpo
    plan = planner(config, world=args.gpus, gpu=gpu, free_bytes=args.free_bytes, shape=shape)
    if args.shape:
        plan = dataclasses.replace(plan, notes=(f"--shape {args.shape}: {plan.shape.name}",) + plan.notes)
    error = None
    try:
        check_plan(plan)
    except MemoryPlanError as exc:
        error = one_line(exc)
    if args.json:
        print(json.dumps({**plan.to_dict(), "config": str(args.config), "error": error}))
    else:
        print(plan.format())
    if error is not None:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


def _gpu_name(text: str) -> str:
    """``--gpu``: one of :data:`~hydroagent_hpc.train.memory_plan.GPUS` (any case)."""
    for name in GPUS:
        if name.upper() == text.strip().upper().replace("_", "-"):
            return name
    raise argparse.ArgumentTypeError(f"{text!r} is not a GPU the plan knows; use one of {', '.join(GPUS)}")


def add_submit_sft(sub: argparse._SubParsersAction, name: str = "sft") -> argparse.ArgumentParser:
    """``train submit sft`` (and, in the ``submit`` alias group, its old spelling ``submit sft``): one
    definition of its help and options."""
    sf = sub.add_parser(name, help="an SFT run as one job; requeued on time limit, resumes from its checkpoint",
                        description="Submit `python -m hydroagent_hpc.train.sft CONFIG --out RUN_DIR --resume` "
                                    "through submitit: one CPU process (--gpus 0), accelerate launch over the GPUs "
                                    "of one node, or one launcher per node (--nodes N). Before a time limit or "
                                    "preemption the trainer checkpoints and the job requeues itself. Site settings "
                                    "default to $SBATCH_PARTITION, $SBATCH_ACCOUNT, $SBATCH_QOS, $HYDROAGENT_MODULES.")
    sf.add_argument("config", help="SFT config YAML (e.g. data/train/sft-qwen3-4b.yaml)")
    sf.add_argument("--run-dir", required=True, help="run folder: checkpoints/, final/, logs/, submit.json")
    sf.add_argument("--gpus", type=nonnegative_int, default=0, help="GPUs per node (default 0: one CPU process)")
    sf.add_argument("--nodes", type=positive_int, default=1, help="nodes (default 1)")
    add_site_options(sf, local="a local process")
    sf.add_argument("--max-requeues", type=nonnegative_int, default=3, help="time-limit requeues (default 3)")
    sf.add_argument("--save-wait", type=positive_float, default=240.0,
                    help="seconds to wait for the checkpoint after SIGUSR1, then for the exit after SIGTERM "
                         "(default 240)")
    sf.add_argument("--wait", action="store_true", help="wait for the run and print the trainer's result")
    sf.set_defaults(func=cmd_submit_sft)
    return sf


def add_submit_grpo(sub: argparse._SubParsersAction, name: str = "grpo") -> argparse.ArgumentParser:
    """``train submit grpo`` (and, in the ``submit`` alias group, its old spelling ``submit grpo``): one
    definition of its help and options."""
    sg = sub.add_parser(name, help="a GRPO run as one job (simulations in its threads); requeued on time limit, "
                                   "resumes from its checkpoint",
                        description=(
                            "Submit `python -m hydroagent_hpc.train.grpo CONFIG --out RUN_DIR --resume --pool "
                            "threads` through submitit: one process that trains (on one GPU with --gpus 1, on CPU "
                            "with --gpus 0) and runs the simulations in its threads on --cpus-per-task CPUs; with "
                            "--sim-ranks R the simulations run on R MPI ranks beside the trainer (mpiexec on the "
                            "job's node); with --gpus G, G trainer processes (torchrun, or ranks of the mpiexec with "
                            "--sim-ranks; generator: engine). Across nodes use `sbatch --ntasks=N slurm/grpo.sbatch "
                            "CONFIG RUN_DIR`. Before a time limit or preemption the trainer checkpoints at the end of "
                            "its step and the job requeues itself. Site settings default to $SBATCH_PARTITION, "
                            "$SBATCH_ACCOUNT, $SBATCH_QOS, $HYDROAGENT_MODULES."))
    sg.add_argument("config", help="GRPO config YAML (see hydroagent_hpc/train/grpo/config.py)")
    sg.add_argument("--out", "--run-dir", dest="run_dir", required=True,
                    help="run folder: checkpoints/, metrics.csv, rollouts.h5, final/, logs/, submit.json")
    sg.add_argument("--gpus", type=nonnegative_int, default=0,
                    help="GPUs of the job: one trainer process per GPU, or 0 to train on CPU (tiny models; "
                         "default 0)")
    sg.add_argument("--trainers", type=positive_int, default=None,
                    help="training processes (default: one per GPU, 1 on CPU; at most --gpus; more than 1 needs "
                         "generator: engine)")
    add_site_options(sg, local="a local process")
    sg.add_argument("--max-requeues", type=nonnegative_int, default=3, help="time-limit requeues (default 3)")
    sg.add_argument("--save-wait", type=positive_float, default=540.0,
                    help="seconds to wait for the checkpoint after SIGUSR1 (the trainer saves at the end of its "
                         "step), then for the exit after SIGTERM (default 540)")
    sg.add_argument("--sim-ranks", type=nonnegative_int, default=0,
                    help="MPI simulation ranks beside the trainer on the job's node (mpiexec; the job gets at least "
                         "R+1 CPUs); 0: simulations in the trainer's threads (default)")
    sg.add_argument("--wait", action="store_true", help="wait for the run and print the trainer's result")
    sg.set_defaults(func=cmd_submit_grpo)
    return sg


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """``train sft-data``, ``train sft``, ``train grpo``, ``train plan``, ``train submit sft|grpo``."""
    t = sub.add_parser("train", help="training data and training runs",
                       description="Training: SFT teacher data, SFT runs and GRPO runs, their memory plan, "
                                   "and those runs submitted as Slurm jobs.")
    tsub = t.add_subparsers(dest="train_command", required=True)
    d = tsub.add_parser("sft-data", help="campaign stores -> weighted, token-exact SFT trajectories (HDF5)",
                        description="Rebuild each text episode's conversation from campaign stores, filter and "
                                    "weight it by preset, tokenise it with the shared trajectory builder and write "
                                    "one HDF5 file (atomically). Sequences over --max-tokens are refused, not cut.")
    d.add_argument("--from", dest="stores", action="append", required=True, metavar="STORE.h5",
                   help="campaign store to read (repeatable; order is kept)")
    d.add_argument("--out", required=True, metavar="DATA.h5", help="data file to write")
    d.add_argument("--preset", choices=_SFT_PRESETS, default="paper",
                   help="paper: drop final NSE <= 0.6, weight by NSE percentile; released: clip((NSE+1)/2, 0.1, 1)")
    d.add_argument("--augment", choices=_AUGMENT_MODES, default=None,
                   help="stopping_points: one example per cut after each assistant turn that follows an evaluate "
                        "response (+ the full run), the episode weight split evenly; none: one example per episode "
                        "(default: stopping_points for paper, none for released)")
    d.add_argument("--render", choices=_RENDERERS, default="none",
                   help="calls: give episodes without assistant text (classic optimizers) one message per tool call, "
                        "its <tool_call> block alone; none (default): drop them")
    d.add_argument("--recovery", type=probability, default=0.0, metavar="P",
                   help="error-recovery turns: with probability P per teacher tool-call message, insert before it a "
                        "corrupted copy (loss mask 0) and the environment's parse-failure reply (default 0: off)")
    d.add_argument("--recovery-seed", type=seed, default=0, metavar="N",
                   help="seed of the error-recovery draws (with the episode id; default 0)")
    d.add_argument("--tokenizer", default="tiny", help="tokenizer folder or hub id (its chat template), or 'tiny'")
    d.add_argument("--max-tokens", type=positive_int, default=16384, help="context budget per sequence (default 16384)")
    d.add_argument("--export-hf", default=None, metavar="DIR",
                   help="also write the examples into DIR as a conversational JSON Lines data set (train.jsonl: "
                        "messages with tool_calls, tools, weight, episode_id, best_nse, train_mask; Hugging Face "
                        "datasets / TRL SFTTrainer) with a dataset card README.md")
    d.set_defaults(func=cmd_sft_data)
    im = tsub.add_parser("sft-import", help="a conversational JSON Lines data set -> an SFT data file (HDF5)",
                         description="Read a conversational data set (a .jsonl file, or a folder of them such as "
                                     "one --export-hf wrote: messages with role/content and assistant tool_calls, "
                                     "tools, optional weight, train_mask, episode_id, best_nse), check every record "
                                     "(one error naming the file, line and field), tokenise each with the chat "
                                     "template by the same trajectory builder as sft-data, and write one SFT data "
                                     "file atomically (preset imported).")
    im.add_argument("source", metavar="JSONL_OR_DIR", help="a .jsonl file or a folder of .jsonl files")
    im.add_argument("--out", required=True, metavar="DATA.h5", help="data file to write")
    im.add_argument("--tokenizer", default="tiny", help="tokenizer folder or hub id (its chat template), or 'tiny'")
    im.add_argument("--max-tokens", type=positive_int, default=16384,
                    help="context budget per sequence (default 16384)")
    im.set_defaults(func=cmd_sft_import)
    s = tsub.add_parser("sft", help="weighted full-parameter SFT of a model on an sft-data file",
                        description="Assistant-only, per-example-weighted SFT (transformers + accelerate; FSDP2 "
                                    "under torchrun with several processes). Writes RUN_DIR/config.yaml, metrics.csv, "
                                    "checkpoints/ (every save_every steps, on SIGUSR1, and on SIGTERM, which then "
                                    "exits 143) and final/ (a save_pretrained folder). Every key of the config can "
                                    "also be given as an option below.")
    sft_launch.build_parser(s)
    s.set_defaults(func=cmd_sft)
    g = tsub.add_parser("grpo", help="GRPO of a policy with the simulator as the verifier",
                        description="Rollouts on the training basins (one thread per episode, batched model turns, "
                                    "a global cap on simulations in flight), advantages from the environment's "
                                    "ledger, clipped-ratio loss with k3 KL and entropy. Writes RUN_DIR/config.yaml, "
                                    "metrics.csv, rollouts.h5 (every episode), checkpoints/ and final/. Every key of "
                                    "the config that holds a value can also be given as an option below.")
    grpo_launch.build_parser(g)
    g.set_defaults(func=cmd_grpo)
    ev = tsub.add_parser("eval", help="evaluate a checkpoint folder or an OpenAI-compatible URL on basins (greedy)",
                         description="Play one greedy episode per basin and seed with a local checkpoint (a "
                                     "save_pretrained folder such as a run's final/: an hf_local agent) or a model "
                                     "behind an OpenAI-compatible base URL (an openai agent: the models-file entry "
                                     "--model-entry with its base_url replaced, temperature 0), under the campaign "
                                     "budget rules (the preset with max_simulations = --budget), into an episode "
                                     "store (resumable: stored episodes are not played again), and print one row "
                                     "per episode with the mean and median best NSE (campaign/evaluate.py).")
    ev.add_argument("target", metavar="CHECKPOINT_OR_URL", help="checkpoint folder, or http(s)://HOST:PORT/v1")
    ev.add_argument("--basins", nargs="+", required=True, metavar="BASIN_DIR", help="basin folders (control.txt)")
    ev.add_argument("--budget", type=positive_int, required=True, metavar="N", help="simulations per episode")
    ev.add_argument("--out", required=True, metavar="STORE.h5", help="episode store to write (or resume)")
    ev.add_argument("--preset", choices=("paper", "released"), default="paper",
                    help="the environment preset the budget applies to (default paper)")
    ev.add_argument("--seeds", type=seed, nargs="+", default=[0], metavar="N",
                    help="episode seeds (default 0; a greedy local policy plays the same episode for each)")
    ev.add_argument("--max-turns", type=positive_int, default=None, metavar="N",
                    help="tool calls per episode (default: the preset's)")
    ev.add_argument("--name", default="eval", help="campaign and agent name in the episode ids (default eval)")
    ev.add_argument("--model-entry", default="hydroagent-local", metavar="ENTRY",
                    help="models-file entry a URL is played with (default hydroagent-local: Hermes text)")
    ev.add_argument("--max-new-tokens", type=positive_int, default=None, metavar="N",
                    help="tokens per model turn (default: the agent's)")
    ev.add_argument("--max-context-tokens", type=positive_int, default=None, metavar="N",
                    help="context of a local checkpoint (default: the agent's)")
    ev.add_argument("--workers", type=positive_int, default=1, metavar="N", help="episodes in parallel (default 1)")
    ev.add_argument("--json", action="store_true", help="print the result as one JSON object")
    add_arguments(ev, EvalLiveSettings, EVAL_LIVE_OPTIONS)
    ev.set_defaults(func=cmd_eval)
    pl = tsub.add_parser("plan", help="the GPU memory a training config needs, without a GPU",
                         description="The peak GPU memory of an SFT or GRPO config per trainer GPU, term by term "
                                     "(weights, gradients, optimizer state, activations with and without "
                                     "checkpointing, logits, KV cache; train/memory_plan.py), against a GPU kind. "
                                     "Exits 0 when it fits, 1 when it does not (naming the largest term and the "
                                     "settings that would fit). Reads the model folder's config.json only.")
    pl.add_argument("config", metavar="CONFIG", help="SFT or GRPO config YAML")
    pl.add_argument("--gpu", type=_gpu_name, default=None, metavar="KIND",
                    help=f"the GPU kind: {', '.join(GPUS)}")
    pl.add_argument("--gpus", type=positive_int, default=1, metavar="N",
                    help="training GPUs (FSDP2 ranks; with generator: engine the engine's GPU is extra; default 1)")
    pl.add_argument("--free-bytes", type=positive_int, default=None, metavar="BYTES",
                    help="plan against this many free bytes per GPU instead of a GPU kind")
    pl.add_argument("--shape", choices=tuple(SHAPES), default=None,
                    help="a built-in model shape, for a model folder that is not here (qwen3-4b: "
                         "Qwen3-4B-Instruct-2507 as published)")
    pl.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    pl.set_defaults(func=cmd_plan)
    tl = tsub.add_parser("timeline", help="a GRPO run's step timeline: a PNG and the utilisation per lane",
                         description="Read RUN/timeline.jsonl (written by the GRPO trainer every step: when each "
                                     "training process generated, waited, trained and synced weights, when each "
                                     "simulation slot was busy, and when each rollout waited for a GPU batch or a "
                                     "simulation slot), draw it as a PNG with one lane per process, slot and rollout, "
                                     "and print the share of the wall time each lane spent in each phase "
                                     "(train/grpo/timeline.py, docs/grpo.md).")
    tl.add_argument("run", metavar="RUN", help="GRPO run folder (it holds timeline.jsonl)")
    tl.add_argument("--out", metavar="PNG", default=None, help="the figure to write (default RUN/timeline.png)")
    tl.add_argument("--steps", type=_steps, default=(None, None), metavar="A:B",
                    help="steps A to B, both included (A:, :B and N also work; default: every step)")
    tl.add_argument("--json", action="store_true", help="print the utilisation as one JSON object")
    tl.set_defaults(func=cmd_timeline)
    ts = tsub.add_parser("submit", help="an SFT or GRPO run as one requeueable job (Slurm or a local process)",
                         description="Submit an SFT or GRPO run through submitit as one job that checkpoints and "
                                     "requeues itself before a time limit or preemption.")
    tss = ts.add_subparsers(dest="train_submit_command", required=True)
    add_submit_sft(tss)
    add_submit_grpo(tss)
