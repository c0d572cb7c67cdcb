"""Differential testing against the real EF5: random cases through both engines, compared at print precision.

``python -m hydroagent_hpc.bench.differential --cases 300`` (needs ``$HYDROAGENT_EF5``) draws
cases with :func:`hydroagent_hpc.sim.synth.cases.draw_case`, runs each with EF5 and with our
embedded engine, and prints one row per case and gauge plus a summary. ``make test`` runs a seeded
few dozen of the same cases (``tests/test_ef5_differential.py``).

EF5 prints discharge and soil moisture with 2 decimals and the fast/slow flows (mm x 1000) with 4,
so a perfect re-implementation differs from the printed values by at most half a unit in the last
place. EF5 computes in float32 where we compute in float64, so we allow that half unit plus a
relative float32 allowance: ``|ours - ef5| <= 0.5 * 10**-decimals + REL * |ef5|`` with
:data:`REL` = 1e-4 (about 800 float32 ulps; the accumulated rounding of a long routing chain).
State grids (written by EF5 as float32 GeoTIFF, full precision) are compared with the same
relative allowance plus 1e-4 absolute.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np
from tqdm import tqdm

from hydroagent_hpc.sim.controlfile import parse_control
from hydroagent_hpc.sim.ef5 import EF5Simulator
from hydroagent_hpc.sim.embedded import EmbeddedSimulator
from hydroagent_hpc.sim.grids import read_tif
from hydroagent_hpc.sim.outputs import STATE_GRIDS
from hydroagent_hpc.sim.synth.cases import CaseSpec, draw_case, write_case

__all__ = ["REL", "Comparison", "compare_control", "compare_case", "sweep", "summary", "main"]

log = logging.getLogger(__name__)

REL = 1e-4
# column -> (our series attribute, factor to EF5's printed unit, printed decimals)
_COLUMNS = {"discharge": ("discharge", 1.0, 2), "sm": ("soil_moisture", 1.0, 2),
            "fast_flow": ("fast_flow", 1000.0, 4), "slow_flow": ("slow_flow", 1000.0, 4),
            "precip": ("precip", 1.0, 2), "pet": ("pet", 1.0, 2)}


@dataclass
class Comparison:
    """The largest differences of one case, and whether every one is within print precision."""

    label: str
    rows: int
    max_abs: dict[str, float]  # "gauge:column" -> max |ours - EF5|
    worst: dict[str, tuple[int, float]]  # "gauge:column" -> (row, EF5 value) of the largest excess
    failures: list[str]
    missing_qpe: tuple[int, int]  # (ours, EF5)
    ef5_s: float
    ours_s: float

    @property
    def ok(self) -> bool:
        return not self.failures

    def as_dict(self) -> dict[str, object]:
        return {"label": self.label, "rows": self.rows, "max_abs": self.max_abs, "failures": self.failures,
                "missing_qpe": list(self.missing_qpe), "ef5_s": self.ef5_s, "ours_s": self.ours_s}


def _excess(ours: np.ndarray, ef5: np.ndarray, decimals: int) -> tuple[np.ndarray, np.ndarray]:
    diff = np.abs(ours - ef5)
    return diff, diff - (0.5 * 10.0 ** -decimals + 1e-9 + REL * np.abs(ef5))


def compare_control(control: Path, label: str, workdir: Path, binary: str | Path | None = None) -> Comparison:
    """Run ``control`` with EF5 and with our engine; compare every printed column and the state grids."""
    cf = parse_control(control)
    task = cf.task(None)
    save_states = task.states is not None and task.time_state is not None
    ef5 = EF5Simulator(cf, binary=binary, workdir=workdir)
    ef5_out = workdir / "ef5-output"
    t0 = time.perf_counter()
    theirs = ef5.run(copy_outputs_to=ef5_out)
    ef5_s = time.perf_counter() - t0
    ours_sim = EmbeddedSimulator(cf, cache_dir=False)
    t0 = time.perf_counter()
    ours = ours_sim.run(keep_states=save_states)
    ours_s = time.perf_counter() - t0
    keep = ~ours.warmup
    max_abs: dict[str, float] = {}
    worst: dict[str, tuple[int, float]] = {}
    failures: list[str] = []
    for gauge, series in theirs.gauges.items():
        mine = ours.gauges[gauge]
        for col, (attr, factor, decimals) in _COLUMNS.items():
            ref = getattr(series, attr) * (1000.0 if col in ("fast_flow", "slow_flow") else 1.0)
            val = getattr(mine, attr)[keep] * factor
            diff, excess = _excess(val, ref, decimals)
            key = f"{gauge}:{col}"
            max_abs[key] = float(np.nanmax(diff)) if diff.size else 0.0
            if np.isnan(diff).any() or (excess > 0).any():
                i = int(np.nanargmax(np.where(np.isnan(diff), np.inf, excess)))
                worst[key] = (i, float(ref[i]))
                failures.append(f"{key}: |dx| {diff[i]:.4g} at row {i} (EF5 {ref[i]:.4f}, ours {val[i]:.4f})")
    if save_states and task.states is not None and task.time_state is not None:
        stamp = f"{task.time_state:%Y%m%d_%H%M}"
        states = ours.info["states"] if isinstance(ours.info, dict) else {}
        assert isinstance(states, dict)
        for key, name in STATE_GRIDS.items():
            path = ef5_out / f"{name}_{stamp}.tif"
            if not path.exists():
                failures.append(f"state {key}: EF5 wrote no {path.name}")
                continue
            ref = read_tif(path).data[ours_sim.net.rows, ours_sim.net.cols].astype(np.float64)
            diff = np.abs(np.asarray(states[key]) - ref)
            max_abs[f"state:{key}"] = float(diff.max())
            bad = diff > 1e-4 + REL * np.abs(ref)
            if bad.any():
                i = int(np.argmax(diff - REL * np.abs(ref)))
                failures.append(f"state {key}: |dx| {diff[i]:.4g} at node {i} (EF5 {ref[i]:.6g})")
    missing = (ours.missing_precip, theirs.missing_precip)
    if missing[0] != missing[1]:
        failures.append(f"missingQPE: ours {missing[0]}, EF5 {missing[1]}")
    return Comparison(label, int(keep.sum()), max_abs, worst, failures, missing, ef5_s, ours_s)


def compare_case(spec: CaseSpec, root: Path, binary: str | Path | None = None) -> Comparison:
    """Write ``spec`` under ``root`` and compare the engines on it."""
    folder = root / spec.label
    control = write_case(spec, folder)
    work = folder / "ef5-runs"
    work.mkdir()
    return compare_control(control, spec.label, work, binary)


def summary(rows: list[Comparison]) -> str:
    """Markdown: how many cases agree, and the largest difference of each column over all cases."""
    keys = sorted({k.split(":", 1)[1] if not k.startswith("state:") else k for r in rows for k in r.max_abs})
    out = [f"{len(rows)} cases, {sum(r.ok for r in rows)} within print precision, "
           f"{sum(not r.ok for r in rows)} not.", "", "| column | largest |dx| over all cases | case |",
           "|---|---|---|"]
    for col in keys:
        best = (0.0, "")
        for r in rows:
            for k, v in r.max_abs.items():
                if (k == col or k.endswith(":" + col)) and v >= best[0]:
                    best = (v, r.label)
        out.append(f"| {col} | {best[0]:.4g} | {best[1]} |")
    return "\n".join(out)


def sweep(seeds: range, keep: Path | None = None, sink: TextIO | None = None) -> list[Comparison]:
    """Compare the engines on the case of every seed (folders under ``keep``, else a temporary folder)."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="ef5-diff-") as tmp:
        root = keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        for seed in tqdm(seeds, desc="differential cases", unit="case", disable=None, leave=False):
            spec = draw_case(seed)
            r = compare_case(spec, root)
            rows.append(r)
            if sink:
                sink.write(json.dumps({"spec": spec.as_dict(), **r.as_dict()}) + "\n")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hydroagent_hpc.bench.differential",
                                 description="Random cases through EF5 and our engine, compared at print precision.")
    ap.add_argument("--cases", type=int, default=200, help="how many cases (seeds --first ... --first+cases-1)")
    ap.add_argument("--first", type=int, default=1000, help="first seed (make test uses seeds 0-39)")
    ap.add_argument("--keep", type=Path, default=None, help="keep the case folders here (default: a temp folder)")
    ap.add_argument("--json", type=Path, default=None, help="also write every comparison as JSON lines here")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if not os.environ.get("HYDROAGENT_EF5"):
        print("HYDROAGENT_EF5 is not set: build EF5 with ../shared/scripts/build-ef5.sh and export its path",
              file=sys.stderr)
        return 2
    sink = args.json.open("w") if args.json else None
    try:
        rows = sweep(range(args.first, args.first + args.cases), args.keep, sink)
    finally:
        if sink:
            sink.close()
    for r in rows:
        if not r.ok:
            print(f"- {r.label}: " + "; ".join(r.failures[:4]))
    print()
    print(summary(rows))
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
