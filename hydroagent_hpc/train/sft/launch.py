"""SFT's command line, torch-free: ``python -m hydroagent_hpc.train.sft CONFIG --out RUN_DIR [--resume]
[--lr X ...]`` and ``hydroagent train sft`` (one definition of both). Any key of the SFT config can be
given as an option (``--lr``, ``--max-steps``, ``--no-bucket-by-length``, ...): the options are made
from the config's fields (:mod:`hydroagent_hpc.settings`), so their help and limits are the file's, and
a value given replaces the file's. The trainer (and torch) loads only when a run starts, inside the
window where an early SIGUSR1 from Slurm is ignored."""

from __future__ import annotations

import argparse
import json
import logging
import os
from collections.abc import Sequence
from typing import Any

from hydroagent_hpc.errors import HydroAgentError, one_line
from hydroagent_hpc.settings import add_arguments, arguments_given, option_names
from hydroagent_hpc.train.sft.config import SFTConfig, load_sft_config
from hydroagent_hpc.train.signals import early_usr1_ignored
from hydroagent_hpc.train.writes import stopped_by_io

log = logging.getLogger(__name__)

__all__ = ["build_parser", "run", "main", "result_line", "exit_status", "EXIT_SIGTERM", "CONFIG_OPTIONS"]

#: The exit status of a run that SIGTERM stopped after its checkpoint (Slurm requeues it).
EXIT_SIGTERM = 143
#: The SFT config keys that are also command-line options.
CONFIG_OPTIONS = option_names(SFTConfig)


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = parser or argparse.ArgumentParser(prog="python -m hydroagent_hpc.train.sft",
                                          description="Weighted full-parameter SFT (hydroagent_hpc/train/sft/).")
    p.add_argument("config", metavar="CONFIG", help="SFT config YAML (see docs/configuration.md)")
    p.add_argument("--out", required=True, metavar="RUN_DIR", help="run folder (config, metrics, checkpoints, final)")
    p.add_argument("--resume", action="store_true", help="continue from RUN_DIR/checkpoints/latest when there is one")
    keys = p.add_argument_group("config keys", "each replaces the CONFIG file's value (give the same ones again "
                                               "with --resume: a resumed run refuses another config)")
    add_arguments(keys, SFTConfig, CONFIG_OPTIONS, defaults=dict.fromkeys(CONFIG_OPTIONS))
    return p


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Load ``args.config`` (with the options given) and train into ``args.out``; the summary."""
    config = load_sft_config(args.config, overrides=arguments_given(args, CONFIG_OPTIONS))
    from hydroagent_hpc.train.sft.trainer import train_sft  # torch: only once the config is known good

    try:
        return train_sft(config, args.out, resume=args.resume)
    except OSError as exc:  # the run folder or the data failed outside a checkpoint: one line, not a traceback
        raise stopped_by_io(exc, args.out) from None


def result_line(summary: dict[str, Any]) -> str:
    """The run's summary as one JSON line (what the commands report)."""
    keys = ("run_dir", "steps", "first_loss", "final_loss", "tokens", "tokens_per_s", "peak_mem_mb", "world_size",
            "fsdp", "stopped", "final")
    return json.dumps({k: summary[k] for k in keys})


def exit_status(summary: dict[str, Any]) -> int:
    """0 when the run finished, :data:`EXIT_SIGTERM` when a SIGTERM stopped it after saving."""
    return EXIT_SIGTERM if summary["stopped"] else 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hydroagent_hpc.train.sft``: the result line and errors go to the log (stderr)."""
    args = build_parser().parse_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        with early_usr1_ignored():  # Slurm's warning before the handler is installed would kill the process
            summary = run(args)
    except HydroAgentError as exc:
        log.error("error: %s", one_line(exc))
        return exc.exit_code
    if int(os.environ.get("RANK", "0")) == 0:
        log.info("result: %s", result_line(summary))
    return exit_status(summary)
