"""The old spellings of commands that moved to ``hydroagent NOUN VERB``: ``hydroagent submit campaign|sft|grpo``.

Each alias is built by the very function that builds its new command (same help, options and handler),
under a ``submit`` group that ``hydroagent --help`` does not list. Parsing one sets ``old_spelling``;
:func:`hydroagent_hpc.cli.main` then logs one warning naming the new spelling and runs the command as usual.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from hydroagent_hpc.cli import runs, train

__all__ = ["ALIASES", "add_parsers", "warning"]

#: old spelling -> new spelling (words after ``hydroagent``).
ALIASES: dict[tuple[str, ...], tuple[str, ...]] = {
    ("submit", "campaign"): ("campaign", "submit"),
    ("submit", "sft"): ("train", "submit", "sft"),
    ("submit", "grpo"): ("train", "submit", "grpo"),
}

#: The builder of each old spelling's verb: the function that builds the new command.
_BUILDERS: dict[str, Callable[[argparse._SubParsersAction, str], argparse.ArgumentParser]] = {
    "campaign": runs.add_campaign_submit,
    "sft": train.add_submit_sft,
    "grpo": train.add_submit_grpo,
}


def warning(old: tuple[str, ...]) -> str:
    """The line logged when ``old`` is used."""
    return (f"`hydroagent {' '.join(old)}` is now `hydroagent {' '.join(ALIASES[old])}`; "
            "the old spelling still works")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """The hidden ``submit`` group: no ``help=``, so ``hydroagent --help`` does not list it (see
    :func:`hide`)."""
    s = sub.add_parser("submit", description="Old spellings, kept as aliases: "
                                             + "; ".join(f"`hydroagent {' '.join(o)}` is now "
                                                         f"`hydroagent {' '.join(n)}`" for o, n in ALIASES.items())
                                             + ".")
    ss = s.add_subparsers(dest="submit_command", required=True)
    for old in ALIASES:
        p = _BUILDERS[old[1]](ss, old[1])
        p.description = f"Deprecated spelling of `hydroagent {' '.join(ALIASES[old])}` (still works). {p.description}"
        p.set_defaults(old_spelling=warning(old))


def hide(sub: argparse._SubParsersAction) -> None:
    """List only the commands with a help line in ``{...}`` of the usage (the aliases have none)."""
    shown = [a.dest for a in sub._choices_actions]
    sub.metavar = "{" + ",".join(shown) + "}"
