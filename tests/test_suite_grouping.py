"""``make test JOBS=2`` keeps each test file on one xdist worker and every Slurm/MPI test on one worker.

The grouping lives in ``tests/conftest.py`` (``pytest_collection_modifyitems``); it silently stops working when
xdist cannot read the groups (pytest 9.2 with pytest-xdist 3.8, pytest-dev/pytest-xdist#1386, hence the pin in
setup.cfg) or when the hook adds them after xdist read them. This runs a real two-worker session over three small
files with the suite's own conftest and reads which worker ran what.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

pytest.importorskip("xdist")
ROOT = Path(__file__).resolve().parents[1]


def test_a_files_tests_share_one_worker_and_cluster_tests_one_worker(tmp_path):
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slurm: x\n    mpi: x\n    gpu: x\n    slow: x\n")
    for name in ("a", "b"):
        (tmp_path / f"test_{name}.py").write_text(
            "import pytest, time\n"
            "@pytest.mark.parametrize('i', range(8))\n"
            "def test_x(i):\n    time.sleep(0.05)\n")
    (tmp_path / "test_c.py").write_text(  # cluster tests of another file join the Slurm/MPI group
        "import pytest\n@pytest.mark.slurm\ndef test_s():\n    pass\n@pytest.mark.mpi\ndef test_m():\n    pass\n")
    (tmp_path / "test_d.py").write_text("import pytest\n@pytest.mark.mpi\ndef test_m2():\n    pass\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p",
                           "no:cacheprovider", "-p", "no:randomly", str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    workers: dict[str, set[str]] = defaultdict(set)
    for worker, nodeid in re.findall(r"\[(gw\d)\] \[[ \d]+%\] PASSED (\S+)", proc.stdout):
        workers[nodeid.split("::")[0] if "::test_x" in nodeid else "cluster"].add(worker)
    assert set(workers) == {"test_a.py", "test_b.py", "cluster"}, proc.stdout[-3000:]
    assert all(len(w) == 1 for w in workers.values()), dict(workers)


def test_a_generated_family_runs_its_fixed_cases_and_a_repeatable_sample_unless_every_case_is_asked(monkeypatch):
    from helpers.cases import ENV, sampled

    params = [pytest.param(i, id=f"c{i}") for i in range(20)]
    monkeypatch.delenv(ENV, raising=False)
    got = sampled("family", params, fast={"c3"}, sample=4)
    assert len(got) == 5 and "c3" in [p.id for p in got]
    assert [p.id for p in got] == [p.id for p in sampled("family", params, fast={"c3"}, sample=4)]  # repeatable
    assert [p.id for p in got] != [p.id for p in sampled("another", params, fast={"c3"}, sample=4)]
    slow = {p.id for p in got if any(m.name == "slow" for m in p.marks)}
    assert slow == {p.id for p in got} - {"c3"}  # the fixed case runs in make test, the sample with the slow ones
    monkeypatch.setenv(ENV, "all")
    assert [p.id for p in sampled("family", params, fast={"c3"}, sample=4)] == [p.id for p in params]
    with pytest.raises(ValueError, match="c99"):
        sampled("family", params, fast={"c99"}, sample=4)
