"""The ``hydroagent`` command.

Subcommands, wired here and defined in :mod:`hydroagent_hpc.cli.basins` (``simulate``, a drop-in
for ``ef5 control.txt``; ``basin synth|from-camels``; ``data usgs|camels|verify``) and
:mod:`hydroagent_hpc.cli.runs` (``calibrate``; ``campaign run|submit|merge|status``; ``demo``; ``report``) and
:mod:`hydroagent_hpc.cli.store` (``store verify|salvage``) and
:mod:`hydroagent_hpc.cli.train` (``train sft-data|sft|grpo|plan``; ``train submit sft|grpo``) and
:mod:`hydroagent_hpc.cli.pipeline` (``pipeline run|status|submit``). One grammar: ``hydroagent NOUN VERB``
(``train submit sft``: NOUN VERB OBJECT), besides the single words ``simulate``, ``calibrate``, ``demo`` and
``report``. :mod:`hydroagent_hpc.cli.aliases` keeps the old spellings ``submit campaign|sft|grpo`` working
(unlisted in ``--help``; each logs one warning naming the new spelling). Errors in the input print one clear
message (file:line, key, fix) and exit with status 2 (an incomplete merge exits 1); no traceback unless ``--debug``
(which also sets :data:`hydroagent_hpc.errors.DEBUG_ENV`, so logs, worker processes included, carry tracebacks).
Every path an option names is checked before the command runs (:mod:`hydroagent_hpc.cli.paths`).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys


def _blas_single_threaded_for_simulate() -> None:
    """``hydroagent simulate`` is a drop-in for one EF5 process: its only BLAS call is a small matrix
    product, but numpy's OpenBLAS starts a thread per core at import, which on a busy node costs the
    start-up tens of milliseconds (80-140 ms for ``import numpy`` on a loaded 2-core machine, 80 ms
    steady with one thread). So, before numpy is imported and unless the user chose, that command
    asks for one BLAS thread. Other commands keep numpy's default."""
    words = [w for w in sys.argv[1:] if not w.startswith("-")]
    if words[:1] == ["simulate"] and "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


_blas_single_threaded_for_simulate()

from hydroagent_hpc import __version__  # noqa: E402  (after the BLAS choice above)
from hydroagent_hpc.cli import aliases, basins, config, paths, pipeline, runs, store, train  # noqa: E402
from hydroagent_hpc.errors import DEBUG_ENV, HydroAgentError, one_line  # noqa: E402

__all__ = ["build_parser", "main"]


def _command(argv: list[str] | None) -> str | None:
    """The subcommand ``argv`` names (its first word that is not an option), if any."""
    for word in sys.argv[1:] if argv is None else argv:
        if not word.startswith("-"):
            return word
    return None


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The whole command line; given ``argv`` whose subcommand is one of :data:`basins.COMMANDS`, only
    those (``hydroagent simulate`` then starts without importing the agents, presets and pools that
    the other subcommands' choices list)."""
    p = argparse.ArgumentParser(prog="hydroagent",
                                description="Calibrate CREST/EF5 with agents, on a laptop or a Slurm cluster.")
    p.add_argument("--version", action="version", version=f"hydroagent-hpc {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    p.add_argument("-q", "--quiet", action="store_true", help="log warnings and errors only")
    p.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = p.add_subparsers(dest="command", required=True)
    basins.add_parsers(sub)
    if argv is not None and _command(argv) in basins.COMMANDS:
        paths.attach(p)
        return p
    runs.add_parsers(sub)
    store.add_parsers(sub)
    train.add_parsers(sub)
    pipeline.add_parsers(sub)
    config.add_parsers(sub)
    aliases.add_parsers(sub)
    aliases.hide(sub)
    paths.attach(p)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    level = logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if getattr(args, "old_spelling", None):
        logging.getLogger("hydroagent").warning("%s", args.old_spelling)
    if args.debug:
        os.environ[DEBUG_ENV] = "1"
    try:
        paths.check(args)
        return int(args.func(args) or 0)
    except HydroAgentError as exc:  # every error raised on purpose: one message, no traceback
        if args.debug:
            raise
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return exc.exit_code
    except (ValueError, OSError) as exc:
        if args.debug:
            raise
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 2
