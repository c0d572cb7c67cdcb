"""``hydroagent train sft-data``: teacher data for SFT from campaign stores (see train/sft_data.py);
``hydroagent train sft CONFIG --out RUN_DIR [--resume]``: weighted SFT (see train/sft.py);
``hydroagent train grpo CONFIG --out RUN_DIR [--resume]``: GRPO on the simulator's reward (train/grpo.py)."""

from __future__ import annotations

import argparse
import json
import logging
import os

from hydroagent_hpc.cli.argtypes import positive_int, probability, seed

log = logging.getLogger("hydroagent")

#: The SFT data presets (kept here too so building the parser does not import torch).
_SFT_PRESETS = ("paper", "released")
#: The augment modes (train/sft_data.py AUGMENT_MODES).
_AUGMENT_MODES = ("none", "stopping_points")
#: The renderers for text-less episodes (train/sft_data.py RENDERERS).
_RENDERERS = ("none", "calls")


def cmd_sft_data(args: argparse.Namespace) -> int:
    from hydroagent_hpc.train.sft_data import build_sft_data

    report = build_sft_data(args.stores, args.out, preset=args.preset, tokenizer=args.tokenizer,
                            max_tokens=args.max_tokens, augment=args.augment, render=args.render,
                            recovery=args.recovery, recovery_seed=args.recovery_seed)
    summary = {"out": str(report.out), "preset": report.preset, "augment": report.augment, "kept": report.kept,
               "examples": report.examples, "recovery_turns": report.recovery_turns, "dropped": report.dropped,
               "weights": {k: report.weights[k] for k in ("min", "median", "mean", "max")},
               "tokens": {k: report.lengths[k] for k in ("median", "max", "budget", "total_tokens")}}
    print(json.dumps(summary))
    return 0


def cmd_sft(args: argparse.Namespace) -> int:
    from hydroagent_hpc.train.sft import exit_status, result_line, run_cli

    summary = run_cli(args)
    if int(os.environ.get("RANK", "0")) == 0:
        print(result_line(summary))
    return exit_status(summary)


def cmd_grpo(args: argparse.Namespace) -> int:
    from hydroagent_hpc.train.grpo_launch import run  # torch-free: MPI simulation ranks never load torch

    summary = run(args)
    if not summary.get("worker"):
        print(json.dumps({k: summary[k] for k in ("run_dir", "steps", "first_reward", "last_reward", "final",
                                                  "stopped")}))
    return 0 if summary["stopped"] is None else 143


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """``train sft-data``, ``train sft``, ``train grpo``."""
    t = sub.add_parser("train", help="training data and training runs",
                       description="Training: SFT teacher data, SFT runs and GRPO runs.")
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
    d.set_defaults(func=cmd_sft_data)
    s = tsub.add_parser("sft", help="weighted full-parameter SFT of a model on an sft-data file",
                        description="Assistant-only, per-example-weighted SFT (transformers + accelerate; FSDP2 "
                                    "under torchrun with several processes). Writes RUN_DIR/config.yaml, metrics.csv, "
                                    "checkpoints/ (every save_every steps, on SIGUSR1, and on SIGTERM, which then "
                                    "exits 143) and final/ (a save_pretrained folder).")
    s.add_argument("config", metavar="CONFIG", help="SFT config YAML (see hydroagent_hpc/train/config.py)")
    s.add_argument("--out", required=True, metavar="RUN_DIR", help="run folder")
    s.add_argument("--resume", action="store_true", help="continue from RUN_DIR/checkpoints/latest when there is one")
    s.set_defaults(func=cmd_sft)
    g = tsub.add_parser("grpo", help="GRPO of a policy with the simulator as the verifier",
                        description="Rollouts on the training basins (one thread per episode, batched model turns, "
                                    "a global cap on simulations in flight), advantages from the environment's "
                                    "ledger, clipped-ratio loss with k3 KL and entropy. Writes RUN_DIR/config.yaml, "
                                    "metrics.csv, rollouts.h5 (every episode), checkpoints/ and final/.")
    g.add_argument("config", metavar="CONFIG", help="GRPO config YAML (see hydroagent_hpc/train/grpo_config.py)")
    g.add_argument("--out", required=True, metavar="RUN_DIR", help="run folder")
    g.add_argument("--resume", action="store_true", help="continue from RUN_DIR/checkpoints/latest when there is one")
    g.add_argument("--pool", choices=("threads", "mpi"), default="threads",
                   help="where simulations run: threads of this process (default), or the worker ranks of an MPI "
                        "launch (srun --mpi=pmi2 / mpiexec; rank 0 trains, the others simulate)")
    g.add_argument("--sim-timeout", type=float, default=600.0,
                   help="seconds before a simulation on a worker rank is killed and recorded as failed (mpi)")
    g.set_defaults(func=cmd_grpo)
