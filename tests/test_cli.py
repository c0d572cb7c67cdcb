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
