"""Shared fixtures: the test data in ``tests/data`` (golden EF5 cases, the CAMELS-US subset).

Every fixture the fidelity tests read is part of the repository (``tests/data/README.md``), so a
clone alone runs them; a missing fixture is an error naming the file and how to restore it, never a
skip. ``../shared`` is only for the benchmarks.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEST_DATA = ROOT / "tests" / "data"
REFERENCE = TEST_DATA / "ef5-reference"
#: The CAMELS-US test subset (see tests/data/camels/PROVENANCE.md).
CAMELS = TEST_DATA / "camels"


def require(path: Path) -> Path:
    """``path`` if it exists; otherwise fail (never skip) with the file and how to get it back."""
    if not path.exists():
        rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        pytest.fail(f"test fixture {rel} is missing: it is part of the repository, restore it with "
                    f"`git checkout -- {rel}` (provenance and regeneration: tests/data/README.md)", pytrace=False)
    return path

# (case, control file, expected folder)
GOLDEN_CASES = [
    ("tiny", "control_a.txt", "expected_a"),
    ("tiny", "control_b.txt", "expected_b"),
    ("dendritic", "control_a.txt", "expected_a"),
    ("dendritic", "control_b.txt", "expected_b"),
    ("dendritic", "control_c.txt", "expected_c"),
    ("tif", "control.txt", "expected"),
]


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    for case, control, expected in GOLDEN_CASES:
        require(REFERENCE / case / control)
        require(REFERENCE / case / expected)
    return REFERENCE


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Every test gets its own forcing cache, never the user's."""
    monkeypatch.setenv("HYDROAGENT_CACHE", str(tmp_path_factory.getbasetemp() / "forcing-cache"))


@pytest.fixture(scope="session")
def small_basin_dir(tmp_path_factory) -> Path:
    """A small synthetic basin (about 80 km2, 10 days + 3 days warm-up), built once per session."""
    from hydroagent_hpc.sim.synth.basins import synthesize_basin

    control = synthesize_basin(tmp_path_factory.mktemp("basins") / "syn_small", name="syn_small", area_km2=80.0,
                               window_days=10, warmup_days=3, seed=7, start="2021-07-01")
    return control.parent


@pytest.fixture(scope="session")
def grpo_basins(tmp_path_factory) -> Path:
    """Three small synthetic basins (b1, b2 for training; v1 held out) for the GRPO tests, built once."""
    from hydroagent_hpc.sim.synth.basins import synthesize_basin

    root = tmp_path_factory.mktemp("grpo-basins")
    for i, name in enumerate(("b1", "b2", "v1")):
        synthesize_basin(root / name, name=f"syn_{name}", area_km2=80.0, window_days=5, warmup_days=2, seed=40 + i,
                         start="2021-07-01")
    return root


@pytest.fixture(scope="session")
def small_sim(small_basin_dir):
    from hydroagent_hpc.sim.embedded import EmbeddedSimulator

    return EmbeddedSimulator(small_basin_dir / "control.txt", cache_dir=False)


#: Under pytest-xdist (``make test JOBS=2``, ``--dist loadgroup``) the tests of one file run on one worker
#: (their module fixtures, a trained tiny model say, are built once), and every test that starts Slurm jobs
#: or an MPI world runs on one worker, one at a time, as without xdist: two at once would queue behind each
#: other on the single node and race their own timeouts.
SHARED_MACHINERY = ("slurm", "mpi")


#: The longest groups (measured: make test TESTS=all JOBS=2 --durations, 2026-12-04) go to the workers
#: first, so that two long ones do not end the run on one worker while the other idles (the kill tests
#: alone are 4 min; alphabetically they came last). The Makefile passes --no-loadscope-reorder, without
#: which xdist hands out the groups with the most tests first instead.
LONG_GROUPS = ("cluster", "tests/test_pipeline.py", "tests/test_train_kill.py", "tests/test_grpo_fsdp.py",
               "tests/test_grpo_train.py", "tests/test_grpo_timeline.py", "tests/test_grpo_overlap.py",
               "tests/test_colocated.py", "tests/test_colocated_overlap.py", "tests/test_sft.py",
               "tests/test_env_fuzz.py", "tests/test_learning_bench.py", "tests/test_bench_sft_learning.py",
               "tests/test_done_means_intact.py", "tests/test_grpo_ops.py", "tests/test_checkpoint_damage.py",
               "tests/test_pipeline_faults.py", "tests/test_sft_ops.py", "tests/test_store_damage.py")


#: Files whose tests run in one group per test function (the SFT and GRPO kill sweeps, 3-4 min each, have
#: their own module fixtures: together on one worker they were the run's last 7 minutes).
SPLIT_BY_TEST = ("tests/test_train_kill.py",)


def _xdist_groups(items) -> None:
    """Each test's group (its file, or ``cluster``), the long groups first in the collection order, which
    is the order xdist hands groups to the workers (a stable sort: a file's tests keep their order)."""
    group = {}
    for item in items:
        shared = next((m for m in SHARED_MACHINERY if item.get_closest_marker(m) is not None), None)
        file = item.nodeid.split("::")[0]
        # a file whose long tests share no module fixture: one group per test function
        group[item.nodeid] = ("cluster" if shared else item.nodeid.split("[")[0] if file in SPLIT_BY_TEST
                              else file)
        item.add_marker(pytest.mark.xdist_group(group[item.nodeid]))
    rank = {name: i for i, name in enumerate(LONG_GROUPS)}
    items.sort(key=lambda item: rank.get(group[item.nodeid], rank.get(item.nodeid.split("::")[0], len(rank))))


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups into the test ids
def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` skip, saying why, where torch sees no CUDA device; under xdist, each test
    gets its group (:data:`SHARED_MACHINERY`)."""
    # the groups are read in the worker processes, where xdist has set ``dist`` to "no" and ``loadgroup`` to
    # whether the run asked for --dist loadgroup
    if getattr(config.option, "loadgroup", False) or getattr(config.option, "dist", "no") == "loadgroup":
        _xdist_groups(items)
    marked = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not marked:
        return
    try:
        import torch

        if torch.cuda.is_available():
            return
        why = f"needs a CUDA GPU: torch {torch.__version__} sees none (run it on a GPU node: make gpu-check)"
    except ImportError:
        why = "needs a CUDA GPU and torch, which is not installed"
    for item in marked:
        item.add_marker(pytest.mark.skip(reason=why))


# The engine tests' module-scoped fixtures (tests/test_engine_requests.py, tests/test_grpo_engine.py):
# the tiny offline Qwen3, its save_pretrained folder and its stop and pad ids.


@pytest.fixture(scope="module")
def tiny():
    from hydroagent_hpc.train.tiny import build_tiny

    return build_tiny(seed=0)


@pytest.fixture(scope="module")
def model_dir(tiny, tmp_path_factory) -> Path:
    from hydroagent_hpc.train.tiny import save_tiny

    model, tok = tiny
    return save_tiny(tmp_path_factory.mktemp("engine") / "tiny", model, tok)


@pytest.fixture(scope="module")
def stops(tiny):
    from hydroagent_hpc.agents.llm.hf_local import HFLocalPolicy

    probe = HFLocalPolicy(*tiny)
    return probe.stop_ids, probe.pad_id


@pytest.fixture(scope="session")
def caller(grpo_basins: Path, tmp_path_factory) -> Path:
    """:func:`test_grpo_train.calling_policy`, trained in a child process on one thread: the same weights on every
    machine, and this process's torch thread settings untouched (changing them and back changes the
    rounding of later matmuls, and the resume test compares this process's run with a child's bit
    for bit). One thread is also the fastest on a shared 2-core machine (about 10 s)."""
    out = tmp_path_factory.mktemp("caller") / "model"
    script = ("import sys, torch; from pathlib import Path; torch.set_num_threads(1); "
              "sys.path.insert(0, sys.argv[1]); from test_grpo_train import calling_policy; "
              "calling_policy(Path(sys.argv[2]), Path(sys.argv[3]))")
    from helpers.paths import pythonpath  # here, not at the top: test_suite_grouping runs a copy of this file alone

    env = dict(os.environ, PYTHONPATH=pythonpath(), HF_HUB_OFFLINE="1")
    done = subprocess.run([sys.executable, "-c", script, str(ROOT / "tests"), str(grpo_basins), str(out)], env=env,
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return out
