"""The EF5 binary backend, driven through real subprocesses.

Most tests drive a real executable script with EF5's command line, so that they can make it fail
the ways EF5 fails: the good one runs our own engine through `hydroagent simulate` (reads an EF5
control file, writes EF5's files); the bad ones crash, hang or write partial output. With
HYDROAGENT_EF5 naming the real EF5 (`.ci/run` builds one), the `ef5`-marked test runs the golden
cases on it; `test_ef5_differential.py` compares the two engines on generated cases.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import GOLDEN_CASES
from helpers.waiting import wait_until
from hydroagent_hpc.sim.ef5 import EF5Simulator
from hydroagent_hpc.sim.embedded import EmbeddedSimulator
from hydroagent_hpc.sim.errors import InputError, SimulationError
from hydroagent_hpc.sim.outputs import read_ts_csv


def _script(tmp_path: Path, name: str, body: str) -> Path:
    p = tmp_path / name
    p.write_text("#!/bin/sh\n" + body + "\n")
    p.chmod(0o755)
    return p


@pytest.fixture
def standin(tmp_path) -> Path:
    """An EF5 stand-in: records its argv and control file, then runs the embedded engine."""
    log = tmp_path / "calls"
    log.mkdir()
    return _script(tmp_path, "ef5-standin",
                   f'echo "$#:$1" >> {log}/argv\ncp "$1" {log}/control.$$.txt\n'
                   f'exec {sys.executable} -m hydroagent_hpc.cli -q simulate "$1" --no-cache')


@pytest.fixture
def control(reference_dir) -> Path:
    return reference_dir / "dendritic" / "control_b.txt"


def test_ef5_backend_runs_and_parses(standin, control, tmp_path):
    sim = EF5Simulator(control, binary=standin, workdir=tmp_path)
    res = sim.run({"wm": 0.8})
    emb = EmbeddedSimulator(control, cache_dir=False).run({"wm": 0.8})
    k = ~emb.warmup
    assert res.backend == "ef5" and res.gauge == "outlet" and set(res.gauges) == {"outlet", "inner"}
    np.testing.assert_array_equal(res.times, emb.times[k])
    assert np.max(np.abs(res.discharge - emb.discharge[k])) <= 0.005 + 1e-9  # printed to 2 decimals
    assert res.params["wm"] == 0.8 and res.params["alpha0"] == 0.0 and res.missing_precip == 3
    # EF5 got one argument, a control file whose parameter lines hold numbers only
    assert (tmp_path / "calls" / "argv").read_text().strip() == "1:control.txt"
    text = next((tmp_path / "calls").glob("control.*.txt")).read_text()
    assert "WM=0.8\n" in text and "B=2.0\n" in text
    assert not list(tmp_path.glob("ef5-run-*")), "run folders are removed"


def test_batch_runs_concurrently(standin, control, tmp_path):
    sim = EF5Simulator(control, binary=standin, workdir=tmp_path)
    out = sim.run_batch([{"wm": 0.6}, {"wm": 1.2}], workers=2)
    assert out[0].discharge.max() != out[1].discharge.max()


@pytest.mark.parametrize("body,words", [
    ('echo "Failed to load DEM!" >&2; exit 3', ["exit status 3", "Failed to load DEM!"]),
    ("kill -SEGV $$", ["signal 11"]),
    ("echo ran; exit 0", ["wrote no output file", "ran"]),
    ('printf "Time,Discharge(m^3 s^-1),Observed(m^3 s^-1),Precip(mm h^-1),PET(mm h^-1),SM(%%),Fast Flow(mm*1000),'
     'Slow Flow(mm*1000)\\n2021-07-03 00:00,1.00,nan,0.00,0.1,50.00,0.0000,0.0000\\n" > output/ts.outlet.crest.csv; '
     "cp output/ts.outlet.crest.csv output/ts.inner.crest.csv", ["1 rows, expected 193", "partial"]),
    ('printf "Time,Discharge(m^3 s^-1),Observed(m^3 s^-1),Precip(mm h^-1),PET(mm h^-1),SM(%%),Fast Flow(mm*1000),'
     'Slow Flow(mm*1000)\\n2021-07-03 00:00,-nan,1.00,0.00,0.1,50.00,0.0000,0.0000\\n" > output/ts.outlet.crest.csv',
     ["non-finite discharge"]),
])
def test_failures_are_clear_errors(tmp_path, control, body, words):
    sim = EF5Simulator(control, binary=_script(tmp_path, "bad-ef5", body), workdir=tmp_path)
    with pytest.raises(SimulationError) as ei:
        sim.run()
    for w in words:
        assert w in str(ei.value), str(ei.value)
    assert not list(tmp_path.glob("ef5-run-*"))


def test_timeout_kills_the_process_group(tmp_path, control):
    pidfile = tmp_path / "pid"
    body = f"sleep 60 & echo $! > {pidfile}; wait"
    sim = EF5Simulator(control, binary=_script(tmp_path, "slow-ef5", body), workdir=tmp_path, timeout_s=1.0)
    t0 = time.monotonic()
    with pytest.raises(SimulationError, match="did not finish within 1 s"):
        sim.run()
    assert time.monotonic() - t0 < 15
    child = int(pidfile.read_text())
    wait_until(lambda: not Path(f"/proc/{child}").exists() or "zombie" in _state(child), 5,
               f"the grandchild {child} to die with the process group (it survived)")


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return "zombie"


def test_failed_run_never_returns_previous_output(tmp_path, standin, control):
    sim = EF5Simulator(control, binary=standin, workdir=tmp_path)
    sim.run()
    sim.binary = _script(tmp_path, "broken", "exit 0")
    with pytest.raises(SimulationError, match="wrote no output file"):
        sim.run()


def test_binary_must_be_configured(control, monkeypatch, tmp_path):
    monkeypatch.delenv("HYDROAGENT_EF5", raising=False)
    with pytest.raises(InputError, match="HYDROAGENT_EF5"):
        EF5Simulator(control)
    with pytest.raises(InputError, match="not an executable"):
        EF5Simulator(control, binary=tmp_path / "nope")


def test_cli_ef5_backend_copies_ef5_outputs(standin, control, tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "HYDROAGENT_EF5": str(standin)}
    proc = subprocess.run([sys.executable, "-m", "hydroagent_hpc.cli", "-q", "simulate", str(control),
                           "--backend", "ef5", "--set", "alpha=1.5", "--output", str(out)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["results.json", "ts.inner.crest.csv", "ts.outlet.crest.csv"]
    assert '"backend": "ef5"' in proc.stdout


@pytest.mark.ef5
@pytest.mark.parametrize("case,ctl,expected", GOLDEN_CASES)
def test_real_ef5_on_golden_cases(reference_dir, tmp_path, case, ctl, expected):
    if not os.environ.get("HYDROAGENT_EF5"):
        pytest.skip("HYDROAGENT_EF5 is not set: no real EF5 binary on this machine")
    res = EF5Simulator(reference_dir / case / ctl, workdir=tmp_path).run()
    ref = read_ts_csv(next((reference_dir / case / expected).glob(f"ts.{res.gauge}.crest.csv")))
    assert np.max(np.abs(res.discharge - ref["discharge"])) <= 0.01


def test_stale_run_folders_of_dead_processes_are_swept(tmp_path, standin, control):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"ef5-run-{dead.pid}-abc"
    stale.mkdir()
    (stale / "control.txt").write_text("x")
    alive = tmp_path / f"ef5-run-{os.getpid()}-keep"
    alive.mkdir()
    EF5Simulator(control, binary=standin, workdir=tmp_path)
    assert not stale.exists() and alive.exists()
