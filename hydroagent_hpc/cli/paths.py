"""The files and folders a command line names, checked before the command runs.

Every option or argument of ``hydroagent`` that names a path has an entry in :data:`PATHS`: whether it
names a file or a folder, and whether the command writes there or reads it. :func:`attach` records the
entries on the parser (the argparse tree, aliases included); :func:`check` runs before the command and
refuses, with one line naming the option, the path, what is wrong and the fix (a
:class:`~hydroagent_hpc.errors.UsageError`, exit status 2):

- an empty path;
- a folder where a file is needed, or a file where a folder is needed (for a file to write, also a
  path ending in ``/``);
- a path under a file (``results.h5/run``): no folder can be made there;
- a place to write that this user cannot write (permissions, a read-only file system), found by
  creating a nameless temporary file in the nearest folder that exists, so ``root`` and access lists
  are judged as the command itself would be.

A path that does not exist yet is fine for one to write (the command creates it, and the folders above
it); a missing input is left to the command, which names what it needed.

``tests/test_cli_paths.py`` walks the parser: an option that looks like a path and has no entry here fails
it, and every entry is tried with each kind of wrong path.
"""

from __future__ import annotations

import argparse
import functools
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from hydroagent_hpc.cli.aliases import ALIASES
from hydroagent_hpc.errors import UsageError

__all__ = ["PathKind", "PATHS", "attach", "check", "declared", "problem", "leaf_parsers"]


@dataclass(frozen=True)
class PathKind:
    """What a path option names: a ``file`` or a ``folder``, written by the command (``writes``) or read.
    ``example`` is a file name the fix suggests (``campaign.h5``)."""

    what: Literal["file", "folder"]
    writes: bool
    example: str = ""


def _out_file(example: str) -> PathKind:
    return PathKind("file", True, example)


def _in_file(example: str) -> PathKind:
    return PathKind("file", False, example)


OUT_DIR = PathKind("folder", True)
IN_DIR = PathKind("folder", False)

#: Per command (its words after ``hydroagent``): the ``dest`` of each path option and what it names.
#: The old spellings (:data:`~hydroagent_hpc.cli.aliases.ALIASES`) use their new command's entry.
PATHS: dict[tuple[str, ...], dict[str, PathKind]] = {
    ("simulate",): {"control": _in_file("control.txt"), "output": OUT_DIR, "ef5": _in_file("ef5")},
    ("basin", "synth"): {"out": OUT_DIR},
    ("basin", "from-camels"): {"root": IN_DIR, "attributes": IN_DIR, "out": OUT_DIR},
    ("data", "usgs"): {"out": _out_file("discharge.csv")},
    ("data", "camels"): {"out": OUT_DIR},
    ("data", "verify"): {"dir": IN_DIR},
    ("calibrate",): {"basin": IN_DIR, "config": _in_file("env.yaml"), "out": _out_file("episodes.h5"),
                     "script": _in_file("script.json"), "path": IN_DIR},
    ("campaign", "run"): {"file": _in_file("campaign.yaml"), "out": _out_file("campaign.h5"), "run_dir": OUT_DIR},
    ("campaign", "submit"): {"file": _in_file("campaign.yaml"), "run_dir": OUT_DIR},
    ("campaign", "merge"): {"file": _in_file("campaign.yaml"), "run_dir": OUT_DIR},
    ("campaign", "status"): {"file": _in_file("campaign.yaml"), "run_dir": IN_DIR},
    ("demo",): {"out": OUT_DIR},
    ("report",): {"store": _in_file("campaign.h5"), "out": OUT_DIR},
    ("store", "verify"): {"store": _in_file("campaign.h5")},
    ("store", "salvage"): {"store": _in_file("campaign.h5"), "out": _out_file("salvaged.h5")},
    ("train", "sft-data"): {"stores": _in_file("campaign.h5"), "out": _out_file("sft-data.h5")},
    ("train", "sft-import"): {"out": _out_file("sft-data.h5")},
    ("train", "eval"): {"out": _out_file("eval.h5")},
    ("train", "sft"): {"config": _in_file("sft.yaml"), "out": OUT_DIR},
    ("train", "grpo"): {"config": _in_file("grpo.yaml"), "out": OUT_DIR},
    ("train", "plan"): {"config": _in_file("sft.yaml")},
    ("train", "timeline"): {"run": IN_DIR, "out": _out_file("timeline.png")},
    ("train", "submit", "sft"): {"config": _in_file("sft.yaml"), "run_dir": OUT_DIR},
    ("train", "submit", "grpo"): {"config": _in_file("grpo.yaml"), "run_dir": OUT_DIR},
    ("pipeline", "run"): {"file": _in_file("pipeline.yaml"), "run_dir": OUT_DIR},
    ("pipeline", "status"): {"run_dir": IN_DIR},
    ("pipeline", "submit"): {"file": _in_file("pipeline.yaml"), "run_dir": OUT_DIR, "site": _in_file("site.yaml")},
    ("config", "reference"): {"out": _out_file("configuration.md")},
}


def leaf_parsers(parser: argparse.ArgumentParser,
                 words: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every command of ``parser`` that runs (a parser without subcommands), with its words."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield words, parser
        return
    for action in subs:
        for name, sub in action.choices.items():
            yield from leaf_parsers(sub, (*words, name))


def declared(parser: argparse.ArgumentParser) -> Iterator[tuple[tuple[str, ...], argparse.Action, PathKind]]:
    """``(command words, action, kind)`` for every path option :data:`PATHS` declares, aliases included.

    Raises ``LookupError`` for an entry whose option the command does not have (the table is stale).
    """
    for words, sub in leaf_parsers(parser):
        entries = PATHS.get(words) or PATHS.get(ALIASES.get(words, ()), {})
        actions = {a.dest: a for a in sub._actions}
        for dest, kind in entries.items():
            if dest not in actions:
                raise LookupError(f"hydroagent_hpc/cli/paths.py: {' '.join(words)} has no option with dest {dest!r}")
            yield words, actions[dest], kind


def label(action: argparse.Action) -> str:
    """How the message names an option (``--out``, ``--out/--run-dir``) or an argument (``OUT``)."""
    if action.option_strings:
        return "/".join(s for s in action.option_strings if s.startswith("--")) or action.option_strings[0]
    return action.metavar if isinstance(action.metavar, str) else action.dest.upper()


def _empty_kept(convert: Callable[[str], Any]) -> Callable[[str], Any]:
    """``convert`` (an option's ``type=``, ``Path`` say), except that an empty text stays empty for :func:`check`
    to refuse (``Path("")`` would be the current folder)."""

    @functools.wraps(convert)
    def typed(text: str) -> Any:
        return text if not text.strip() else convert(text)

    return typed


def attach(parser: argparse.ArgumentParser) -> None:
    """Record on each command of ``parser`` the path options :func:`check` looks at."""
    found: dict[tuple[str, ...], list[tuple[str, str, PathKind]]] = {}
    for words, action, kind in declared(parser):
        found.setdefault(words, []).append((label(action), action.dest, kind))
        if callable(action.type) and not getattr(action.type, "__wrapped__", None):
            action.type = _empty_kept(action.type)
    for words, sub in leaf_parsers(parser):
        if words in found:
            # an old spelling is named by its new one (as the warning it logs does)
            sub.set_defaults(path_checks=(" ".join(ALIASES.get(words, words)), tuple(found[words])))


def check(args: argparse.Namespace) -> None:
    """Refuse the first path option of the command ``args`` holds that names an unusable path."""
    command, checks = getattr(args, "path_checks", ("", ()))
    for name, dest, kind in checks:
        value: Any = getattr(args, dest, None)
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if v is None:
                continue
            text = os.fspath(v)
            found = problem(text, kind, name)
            if found is not None:
                what, fix = found
                raise UsageError(f"{command} {name} {text!r}: {what}", fix)


def _stat(path: Path) -> os.stat_result | None:
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _file_above(path: Path) -> Path | None:
    """The first of the folders above ``path`` that exists and is not a folder, if any."""
    for above in reversed(path.parents):
        try:
            st = os.stat(above)
        except OSError:  # missing (nothing deeper exists either) or unreachable (the probe will say)
            return None
        if not stat.S_ISDIR(st.st_mode):
            return above
    return None


def _nearest_folder(path: Path) -> Path:
    """The nearest folder above ``path`` that exists (where the command would create what is missing)."""
    for above in path.parents:
        if os.path.isdir(above):
            return above
    return Path(".")


def _cannot_write_in(folder: Path) -> str | None:
    """Why no file can be created in ``folder`` (a nameless temporary file is tried), or None."""
    try:
        with tempfile.TemporaryFile(dir=folder, prefix=".hydroagent-write-test-"):
            pass
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    return None


def problem(text: str, kind: PathKind, name: str = "the option") -> tuple[str, str] | None:
    """``(what is wrong, the fix)`` when ``text`` cannot be the path ``kind`` needs, else None."""
    verb = "write" if kind.writes else "read"
    example = kind.example or ("a file name" if kind.what == "file" else "a folder name")
    if not text.strip():
        return "the path is empty", f"give the {kind.what} to {verb}, e.g. {name} {example}"
    path = Path(text)
    blocker = _file_above(path)
    if blocker is not None:
        return (f"{str(blocker)!r} is a file, so there is no folder to {verb} {path.name!r} in",
                f"give a path under a folder (e.g. {path.name!r} beside that file: "
                f"{str(blocker.parent / path.name)!r}), or move the file {str(blocker)!r} away")
    try:
        st = _stat(path)
    except OSError as exc:  # e.g. a folder above that this user may not enter
        return f"cannot be reached ({exc.strerror})", "choose a place this user can reach, or fix the permissions"
    is_dir = st is not None and stat.S_ISDIR(st.st_mode)
    if kind.what == "file":
        if is_dir:
            return (f"is a folder, but {name} names a file to {verb}",
                    f"name a file, e.g. {str(path / example)!r}" + ("" if kind.writes else " (the file itself)"))
        if kind.writes and st is None and text.endswith(("/", os.sep)):
            return (f"ends with '/', so it names a folder, but {name} names a file to write",
                    f"name the file, e.g. {str(path / example)!r}")
    elif st is not None and not is_dir:
        return (f"is a file, but {name} names a folder to {verb}",
                f"give a folder (one that does not exist yet is created), or move the file {text!r} away"
                if kind.writes else "give the folder itself, not a file in it")
    if not kind.writes:
        return None
    folder = path if is_dir else _nearest_folder(path)
    why = _cannot_write_in(folder)
    if why is None and st is not None and not is_dir and not os.access(path, os.W_OK):
        why = "the file is read-only"
    if why is not None:
        where = "it" if folder == path else repr(str(folder))
        return (f"cannot be written: nothing can be created in {where} ({why})",
                "choose a folder this user can write to, or fix its permissions")
    return None
