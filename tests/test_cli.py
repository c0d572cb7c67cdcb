"""The `hydroagent` command as a user runs it: help, --set, errors, summary."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from hydroagent_hpc.sim.embedded import EmbeddedSimulator
from hydroagent_hpc.sim.outputs import read_ts_csv


def _run(*args, check=True):
    proc = subprocess.run([sys.executable, "-m", "hydroagent_hpc.cli", *args], capture_output=True, text=True,
                          timeout=300)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


@pytest.mark.parametrize("sub", [[], ["simulate"], ["basin", "synth"], ["demo"]])
def test_help(sub):
    out = _run(*sub, "--help").stdout
    assert "usage: hydroagent" in out


def test_set_overrides_and_metrics_summary(reference_dir, tmp_path):
    control = reference_dir / "dendritic" / "control_c.txt"
    proc = _run("-q", "simulate", str(control), "--set", "wm=2.5", "--set", "ALPHA=0.9", "--output", str(tmp_path),
                "--metrics")
    summary = json.loads(proc.stdout)
    assert summary["backend"] == "embedded" and summary["missingQPE"] == 3
    assert -1e9 < summary["NSE"] <= 1 and summary["n_points"] > 100 and "nse_band" in summary
    ours = read_ts_csv(tmp_path / "ts.outlet.crest.csv")
    res = EmbeddedSimulator(control, cache_dir=False).run({"wm": 2.5, "alpha": 0.9})
    np.testing.assert_allclose(ours["discharge"], np.round(res.discharge[~res.warmup], 2), atol=1e-9)


@pytest.mark.parametrize("bad,words", [
    ("wmm=1", ["unknown parameter 'wmm'", "wm, b, im"]),
    ("wm=abc", ["'abc' is not a number"]),
    ("wm=nan", ["finite"]),
    ("wm", ["expected NAME=VALUE"]),
])
def test_bad_set_values(reference_dir, tmp_path, bad, words):
    proc = _run("simulate", str(reference_dir / "tiny" / "control_a.txt"), "--set", bad, "--output", str(tmp_path),
                check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    for w in words:
        assert w in proc.stderr


def test_missing_control_file(tmp_path):
    proc = _run("simulate", str(tmp_path / "nope.txt"), check=False)
    assert proc.returncode == 2 and "control file not found" in proc.stderr


def test_the_light_parser_for_basin_commands_matches_the_full_one():
    """`hydroagent simulate|basin|data` build only their own subparsers; COMMANDS must list exactly those."""
    import argparse

    from hydroagent_hpc.cli import basins, build_parser

    sub = argparse.ArgumentParser().add_subparsers(dest="command")
    basins.add_parsers(sub)
    assert tuple(sub.choices) == basins.COMMANDS
    full = build_parser()
    for argv in (["simulate", "c.txt", "--set", "wm=1.5"], ["data", "verify", "b"],
                 ["-q", "basin", "synth", "--out", "o", "--name", "x", "--area-km2", "50"]):
        light = build_parser(argv)
        assert vars(light.parse_args(argv)) == vars(full.parse_args(argv))
    assert "calibrate" in build_parser(["calibrate", "--help"])._subparsers._group_actions[0].choices


# --------------------------------------------------------------------------- one grammar: hydroagent NOUN VERB
#: Every command of `hydroagent`, spelled out: the single words, then NOUN VERB (+ OBJECT for `train submit`).
SINGLE_WORDS = {"simulate", "calibrate", "demo", "report"}
GRAMMAR = {
    "campaign": {"run": None, "submit": None, "merge": None, "status": None},
    "train": {"sft-data": None, "sft-import": None, "sft": None, "grpo": None, "eval": None, "plan": None,
              "timeline": None, "submit": {"sft", "grpo"}},
    "pipeline": {"run": None, "status": None, "submit": None},
    "store": {"verify": None, "salvage": None},
    "basin": {"synth": None, "from-camels": None},
    "data": {"usgs": None, "camels": None, "verify": None},
    "config": {"reference": None},
}
#: The old spellings kept as aliases: old words -> new words.
OLD_SPELLINGS = {
    ("submit", "campaign"): ("campaign", "submit"),
    ("submit", "sft"): ("train", "submit", "sft"),
    ("submit", "grpo"): ("train", "submit", "grpo"),
}


def _subparsers(parser):
    import argparse

    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return actions[0] if actions else None


def _commands(parser, path=()):
    """Every runnable command of ``parser``: the word paths of the parsers without subcommands."""
    sub = _subparsers(parser)
    if sub is None:
        return {path}
    out = set()
    for name, child in sub.choices.items():
        out |= _commands(child, (*path, name))
    return out


def _table_commands():
    out = {(w,) for w in SINGLE_WORDS}
    for noun, verbs in GRAMMAR.items():
        for verb, objects in verbs.items():
            out |= {(noun, verb, o) for o in objects} if objects else {(noun, verb)}
    return out


def test_every_command_is_a_single_word_or_noun_verb():
    """A new command, or a new mixed spelling (`hydroagent VERB NOUN`), fails here until it is NOUN VERB and
    in the table above (or, for an old spelling kept as an alias, in OLD_SPELLINGS)."""
    from hydroagent_hpc.cli import aliases, build_parser

    assert aliases.ALIASES == OLD_SPELLINGS
    found = _commands(build_parser())
    assert found - set(OLD_SPELLINGS) == _table_commands()
    assert set(OLD_SPELLINGS) <= found
    verbs = {v for vs in GRAMMAR.values() for v in vs}
    assert not verbs & (set(GRAMMAR) | SINGLE_WORDS), "a word is both a verb and a noun or single-word command"
    for new in OLD_SPELLINGS.values():
        assert new in found and new[0] in GRAMMAR


@pytest.mark.parametrize("old", sorted(OLD_SPELLINGS))
def test_old_spellings_parse_to_the_same_command(old):
    """`hydroagent submit campaign|sft|grpo ...` = `hydroagent campaign submit ...` / `train submit sft|grpo ...`:
    the same handler and options, plus the warning line that names the new spelling."""
    from hydroagent_hpc.cli import build_parser

    new = OLD_SPELLINGS[old]
    rest = {"campaign": ["c.yaml", "--run-dir", "r", "--array", "3", "--cluster", "local", "--time", "5",
                         "--module", "a", "--module", "b", "--pool", "serial", "--no-report", "--wait"],
            "sft": ["c.yaml", "--run-dir", "r", "--gpus", "2", "--nodes", "2", "--partition", "gpu",
                    "--max-requeues", "1", "--save-wait", "30", "--wait"],
            "grpo": ["g.yaml", "--out", "r", "--gpus", "2", "--trainers", "2", "--sim-ranks", "4",
                     "--cpus-per-task", "8", "--mem-gb", "64"]}[old[1]]

    def options(ns):
        return {k: v for k, v in vars(ns).items() if not k.endswith("command") and k != "old_spelling"}

    parser = build_parser()
    was, now = parser.parse_args(["-q", *old, *rest]), parser.parse_args(["-q", *new, *rest])
    assert was.func is now.func
    assert options(was) == options(now)
    assert getattr(now, "old_spelling", None) is None
    assert was.old_spelling == (f"`hydroagent {' '.join(old)}` is now `hydroagent {' '.join(new)}`; "
                                "the old spelling still works")
    for spelling in (old, new):  # and the same options: every flag of one is a flag of the other, same help
        sub = build_parser()
        for word in spelling:
            sub = _subparsers(sub).choices[word]
        if spelling == old:
            old_actions = [(a.option_strings, a.dest, a.default, a.help, a.choices) for a in sub._actions]
        else:
            assert old_actions == [(a.option_strings, a.dest, a.default, a.help, a.choices) for a in sub._actions]


@pytest.mark.parametrize("old", sorted(OLD_SPELLINGS))
def test_old_spellings_behave_the_same_and_warn(old, tmp_path, monkeypatch, capsys, caplog):
    """Run both spellings on a missing file: the same exit status and error, and one warning line only for
    the old spelling (on stderr, also with -q)."""
    from hydroagent_hpc.cli import main

    monkeypatch.chdir(tmp_path)
    rest = ["nope.yaml", "--run-dir", "r"] + (["--cluster", "debug"] if old[1] == "campaign" else [])
    rc, err, warned = {}, {}, {}
    for spelling in (old, OLD_SPELLINGS[old]):
        caplog.clear()
        rc[spelling] = main(["-q", *spelling, *rest])
        err[spelling] = capsys.readouterr().err
        warned[spelling] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    new = OLD_SPELLINGS[old]
    assert rc[old] == rc[new] == 2
    assert warned[new] == [] and len(warned[old]) == 1
    assert f"`hydroagent {' '.join(new)}`" in warned[old][0]
    assert "error:" in err[new] and err[new] in err[old]
    assert "old spelling" not in err[new]


def test_old_spelling_warns_on_stderr():
    """The warning as a user sees it (the logging set up by `main`, not pytest's)."""
    proc = _run("-q", "submit", "sft", "nope.yaml", "--run-dir", "r", check=False)
    assert proc.returncode == 2
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("WARNING")]
    assert warnings == ["WARNING hydroagent: `hydroagent submit sft` is now `hydroagent train submit sft`; "
                        "the old spelling still works"]


def test_help_lists_the_new_grammar():
    out = _run("--help").stdout
    listed = out.split("positional arguments:")[1].split("options:")[0]
    for word in [*SINGLE_WORDS, *GRAMMAR]:
        assert f"\n    {word} " in listed
    assert "submit" not in out  # the old `submit` group is not listed
    for noun, verbs in GRAMMAR.items():
        assert "{" + ",".join(verbs) + "}" in _run(noun, "--help").stdout
    assert "{sft,grpo}" in _run("train", "submit", "--help").stdout
    old = _run("submit", "sft", "--help").stdout
    assert "Deprecated spelling of `hydroagent train submit sft`" in " ".join(old.split())
