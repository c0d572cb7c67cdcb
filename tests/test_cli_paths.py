"""Every path a command line names is checked before the command runs (issue 32, item 5).

The cases are generated from the parser itself: every command of ``hydroagent`` (aliases included) is
walked; each option or argument that names a path must be declared in ``hydroagent_hpc/cli/paths.py``
(a new command's ``--out`` that is not fails here), and each declared one is tried with every wrong
path its kind can get: a folder where a file is needed and the reverse, a path under a file, a path
ending in ``/`` for a file to write, an empty path, a place that cannot be written. Each must end in
exit status 2 and one line on stderr naming the command's option, the path and the fix, with no
traceback and nothing written. The other arguments get placeholders that pass (a file, a folder, a
value the option's type accepts), so only the path under test can be wrong.

A few hand-written cases run real commands with real inputs (before the check, some of them ended in
a raw ``[Errno 21] Is a directory`` line or a traceback).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers.paths import pythonpath
from hydroagent_hpc.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0

#: Options whose text looks like a path but which name something else (or are checked elsewhere), with why.
NOT_PATHS: dict[str, str] = {
    "base_url": "a URL",
    "sha256": "a checksum",
    "model": "a models-file entry (calibrate) or a training config key the config loader checks",
    "data": "a training config key (data file) the config loader checks, with its file and key",
    "tokenizer": "a tokenizer folder, a hub id or 'tiny'",
    "shard": "I/N",
    "workers": "a number",
    "save_every": "a number",
    "save_wait": "a number",
    "source": "a .jsonl file or a folder of them (train sft-import checks it, naming file and line)",
    "target": "a checkpoint folder or an http(s) URL (train eval tells them apart and checks the folder)",
    "run_name": "a W&B run name",
    "report_to": "sink names (tensorboard, wandb); where they write follows from the store or run folder",
    "model_entry": "a models-file entry",
    "max_context_tokens": "a number",
}
_PATHY = re.compile(r"\b(folder|file|yaml|csv|store|binary|checkpoint|directory)\b|\.h5\b", re.I)
_PATH_DESTS = {"out", "output", "out_dir", "output_dir", "run_dir", "store", "stores", "dir", "path", "file",
               "config", "root"}


def _paths_module():
    from hydroagent_hpc.cli import paths

    return paths


def _leaves(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()):
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield words, parser
    for action in subs:
        for name, sub in action.choices.items():
            yield from _leaves(sub, (*words, name))


def _value_actions(parser: argparse.ArgumentParser):
    return [a for a in parser._actions
            if not isinstance(a, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction))
            and a.nargs != 0 and not a.choices]


def _looks_like_a_path(action: argparse.Action) -> bool:
    text = " ".join([str(action.metavar or ""), action.help or ""])
    return action.dest in _PATH_DESTS or bool(_PATHY.search(text))


def test_every_path_option_of_every_command_is_declared():
    """A path-like option without an entry in cli/paths.py fails here, naming the command and the option."""
    paths = _paths_module()
    parser = build_parser()
    declared = {(words, action.dest) for words, action, _ in paths.declared(parser)}
    missing = []
    for words, sub in _leaves(parser):
        for action in _value_actions(sub):
            if _looks_like_a_path(action) and action.dest not in NOT_PATHS and (words, action.dest) not in declared:
                missing.append(f"{' '.join(words)} {'/'.join(action.option_strings) or action.dest}")
    assert not missing, ("options that name paths but are not declared in hydroagent_hpc/cli/paths.py PATHS: "
                         + ", ".join(missing))
    assert len(declared) >= 50  # every command (aliases too) was walked


# --------------------------------------------------------------------------------------------- the generator


@dataclass(frozen=True)
class Case:
    words: tuple[str, ...]
    dest: str
    label: str  # how the error must name it
    what: str  # "file" or "folder"
    writes: bool
    wrong: str  # which kind of wrong path

    @property
    def ident(self) -> str:
        return f"{'-'.join(self.words)}:{self.dest}:{self.wrong}"


def _label(action: argparse.Action) -> str:
    if action.option_strings:
        return [s for s in action.option_strings if s.startswith("--")][0]
    return action.metavar if isinstance(action.metavar, str) else action.dest.upper()


def _unwritable_root() -> Path | None:
    """A folder nobody here can create files in: /sys (read-only to root too), if there is one."""
    sys_dir = Path("/sys")
    if not sys_dir.is_dir():
        return None
    try:
        (sys_dir / ".hydroagent-test").mkdir()
    except OSError:
        return sys_dir
    (sys_dir / ".hydroagent-test").rmdir()
    return None


def generated_cases() -> list[Case]:
    """Every declared path option x every wrong path its kind can get."""
    paths = _paths_module()
    cases = []
    for words, action, kind in paths.declared(build_parser()):
        wrongs = ["wrong-kind", "under-a-file", "deep-under-a-file", "empty"]
        if kind.writes:
            wrongs.append("unwritable-place")
            if not IS_ROOT:
                wrongs.append("read-only-folder")
            if kind.what == "file":
                wrongs.append("trailing-slash")
        for wrong in wrongs:
            cases.append(Case(words, action.dest, _label(action), kind.what, kind.writes, wrong))
    return cases


#: Values the commands themselves accept (not only argparse), so that before the path check a command got
#: as far as its path: a gauge id of 8 digits, a name that starts with a letter.
REALISTIC = {"name": "basin1", "basin": "01013500", "site": "01013500", "start": "2000-01-01", "end": "2000-01-10",
             "agent": "heuristic"}


def _placeholder(action: argparse.Action, kind, tmp: Path) -> str:
    """A value ``action`` accepts and, for a declared path, a path its check passes."""
    if kind is not None:
        if kind.what == "file":
            if kind.writes:
                return str(tmp / "placeholder-out" / "new-file.out")
            f = tmp / "placeholder-in.txt"
            f.write_text("placeholder\n")
            return str(f)
        d = tmp / ("placeholder-out-dir" if kind.writes else "placeholder-in-dir")
        if not kind.writes:
            d.mkdir(exist_ok=True)
        return str(d)
    if action.choices:
        return str(list(action.choices)[0])
    if action.dest in REALISTIC:
        return REALISTIC[action.dest]
    for candidate in ("1", "2000-01-01", "x", "1/2"):
        try:
            if action.type is not None and callable(action.type):
                action.type(candidate)
        except (ValueError, TypeError, argparse.ArgumentTypeError):
            continue
        return candidate
    return "x"


def _wrong_path(case: Case, tmp: Path) -> str:
    a_file = tmp / "a-file.txt"
    a_file.write_text("not a folder\n")
    a_folder = tmp / "a-folder"
    a_folder.mkdir(exist_ok=True)
    if case.wrong == "wrong-kind":
        return str(a_folder if case.what == "file" else a_file)
    if case.wrong == "under-a-file":
        return str(a_file / "x.h5")
    if case.wrong == "deep-under-a-file":
        return str(a_file / "a" / "b" / "x.h5")
    if case.wrong == "empty":
        return ""
    if case.wrong == "trailing-slash":
        return str(tmp / "new-folder") + "/"
    if case.wrong == "unwritable-place":
        where = _unwritable_root()
        if where is None:
            pytest.skip("no read-only folder here (/sys)")
        return str(where / "hydroagent-test" / "x.h5")
    if case.wrong == "read-only-folder":
        ro = tmp / "read-only"
        ro.mkdir(exist_ok=True)
        ro.chmod(stat.S_IRUSR | stat.S_IXUSR)
        return str(ro / "x.h5")
    raise AssertionError(case.wrong)


def build_argv(case: Case, tmp: Path) -> tuple[list[str], str]:
    """The command line of ``case``: its words, the wrong path, placeholders for the rest."""
    paths = _paths_module()
    parser = build_parser()
    kinds = {(w, a.dest): k for w, a, k in paths.declared(parser)}
    sub = dict(_leaves(parser))[case.words]
    wrong = _wrong_path(case, tmp)
    positional: list[str] = []
    options: list[str] = []
    for action in _value_actions(sub) + [a for a in sub._actions if a.choices and a.required]:
        if action.dest == case.dest:
            value = [wrong]
        elif action.required or not action.option_strings:
            value = [_placeholder(action, kinds.get((case.words, action.dest)), tmp)]
        else:
            continue
        if isinstance(action.nargs, int) and action.nargs > 1:
            value = value * action.nargs
        if action.option_strings:
            options += [f"{action.option_strings[-1]}={value[0]}"] if value[0].startswith("-") else \
                [action.option_strings[-1], *value]
        else:
            positional += value
    return ["-q", *case.words, *positional, *options], wrong


class _Alarm(Exception):
    pass


def _alarm(signum, frame):
    raise _Alarm("the command was still running after 60 s (it started work instead of refusing the path)")


CASES = generated_cases()


@pytest.mark.parametrize("case", CASES, ids=[c.ident for c in CASES])
def test_generated_wrong_path_is_one_line_naming_option_path_and_fix(case, tmp_path, capsys, monkeypatch):
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)  # an empty path must not make a command write into the current folder
    argv, wrong = build_argv(case, tmp_path)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(60)
    try:
        try:
            rc = main(argv)
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 2
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
        for ro in tmp_path.glob("read-only"):
            ro.chmod(0o755)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err, err
    assert rc == 2, f"exit {rc}; stderr: {err[-1500:]}"
    assert len(lines) == 1, f"{len(lines)} lines on stderr: {err[-1500:]}"
    line = lines[0]
    assert line.startswith("error: ") and "fix: " in line, line
    assert case.label in line, f"the option {case.label} is not named: {line}"
    assert repr(wrong) in line, f"the path {wrong!r} is not named: {line}"
    assert "[Errno" not in line, line
    after = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert after == before, f"written although refused: {sorted(set(after) - set(before))}"


# --------------------------------------------------------------------------------------------- real commands


def _campaign(tmp: Path, basin: Path) -> Path:
    p = tmp / "c.yaml"
    p.write_text(f"name: t\nbasins: [{basin}]\nagents:\n  - {{name: heuristic, kind: heuristic}}\nseeds: [0]\n"
                 "env: {preset: paper, max_simulations: 3, max_turns: null, patience: null, target_nse: 0.99}\n")
    return p


def _real_cases(tmp: Path, basin: Path) -> list[tuple[list[str], str, str]]:
    """(argv, option named, path named): real inputs, one wrong output path."""
    folder = tmp / "existing-folder"
    folder.mkdir(exist_ok=True)
    a_file = tmp / "a-file.txt"
    a_file.write_text("x\n")
    camp = str(_campaign(tmp, basin))
    return [
        (["campaign", "run", camp, "--out", str(folder), "--no-progress"], "--out", str(folder)),
        (["campaign", "run", camp, "--out", str(a_file / "c.h5"), "--no-progress"], "--out", str(a_file / "c.h5")),
        (["campaign", "run", camp, "--run-dir", str(a_file), "--no-progress"], "--run-dir", str(a_file)),
        (["calibrate", "--basin", str(basin), "--agent", "heuristic", "--out", str(folder), "--max-simulations",
          "2"], "--out", str(folder)),
        (["basin", "synth", "--name", "b", "--area-km2", "50", "--window-days", "3", "--warmup-days", "1", "--out",
          str(a_file)], "--out", str(a_file)),
        (["config", "reference", "--out", str(folder)], "--out", str(folder)),
        (["report", str(folder)], "STORE", str(folder)),
        (["store", "verify", str(folder)], "STORE", str(folder)),
        (["simulate", str(Path(basin) / "control.txt"), "--output", str(a_file)], "--output", str(a_file)),
    ]


@pytest.mark.parametrize("k", range(9))
def test_real_command_with_a_wrong_output_path(k, tmp_path, small_basin_dir, capsys):
    argv, option, path = _real_cases(tmp_path, small_basin_dir)[k]
    try:
        rc = main(["-q", *argv])
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err[-1500:]
    assert option in lines[0] and repr(path) in lines[0] and "fix: " in lines[0] and "[Errno" not in lines[0], lines


def test_a_real_subprocess_refuses_a_folder_as_the_store(tmp_path, small_basin_dir):
    folder = tmp_path / "results"
    folder.mkdir()
    env = dict(os.environ, PYTHONPATH=pythonpath())
    p = subprocess.run([sys.executable, "-m", "hydroagent_hpc.cli", "campaign", "run",
                        str(_campaign(tmp_path, small_basin_dir)), "--out", str(folder), "--no-progress"],
                       capture_output=True, text=True, timeout=120, env=env)
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("error: ")]
    assert p.returncode == 2 and len(errors) == 1 and "Traceback" not in p.stderr, p.stderr
    assert "--out" in errors[0] and str(folder) in errors[0] and "campaign.h5" in errors[0]
    assert list(folder.iterdir()) == []
