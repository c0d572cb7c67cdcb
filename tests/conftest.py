"""Shared fixtures: where ../shared is, and the golden EF5 reference cases."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("HYDROAGENT_SHARED", ROOT.parent / "shared"))
REFERENCE = SHARED / "ef5-reference"

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
    if not REFERENCE.is_dir():
        pytest.skip(f"EF5 reference cases not found at {REFERENCE} (set HYDROAGENT_SHARED to the shared folder)")
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
def small_sim(small_basin_dir):
    from hydroagent_hpc.sim.embedded import EmbeddedSimulator

    return EmbeddedSimulator(small_basin_dir / "control.txt", cache_dir=False)
