"""Regenerate ``tests/data/ef5-reference/snow/``: a small Snow-17 case and what the real EF5 wrote for it.

usage: HYDROAGENT_EF5=/path/to/ef5 python tests/scripts/make_snow_reference.py [OUT]   (default: the fixture folder)

Builds :data:`GOLDEN_SNOW` with :func:`hydroagent_hpc.sim.synth.snow.make_snow_case`, runs EF5 in the case
folder (``ef5 control.txt``, relative paths, as EF5 expects) and keeps its output as ``expected/``. Drops
what the fixture does not need (the synthetic truth, the manifest). Then update
``tests/data/SHA256SUMS`` and ``tests/data/ef5-reference/PROVENANCE.md``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from hydroagent_hpc.sim.synth.snow import SnowCase, make_snow_case

ROOT = Path(__file__).resolve().parents[2]
#: ~45 cells, 4 days hourly, hourly ASCII temperature with one missing file, states saved mid-run.
GOLDEN_SNOW = SnowCase("snow_golden", seed=21, area_km2=40.0, window_days=4, warmup_days=0, start="2021-03-01",
                       cellsize_deg=0.01, temp_type="ASC", temp_freq="1h", t_start=-7.0, t_end=10.0, missing=1,
                       snow={"scf": 1.1, "mfmax": 1.4, "mfmin": 0.25, "plwhc": 0.1, "nmf": 0.3, "tipm": 0.2},
                       time_state="202103030000")


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "tests" / "data" / "ef5-reference" / "snow"
    ef5 = os.environ.get("HYDROAGENT_EF5")
    if not ef5:
        print("set HYDROAGENT_EF5 to the EF5 binary", file=sys.stderr)
        return 2
    if out.exists():
        shutil.rmtree(out)
    control = make_snow_case(out, GOLDEN_SNOW)
    for name in ("truth.json", "manifest.json"):
        (out / name).unlink()
    shutil.rmtree(out / "output")
    (out / "output").mkdir()
    proc = subprocess.run([ef5, control.name], cwd=out, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        print(proc.stdout[-2000:], proc.stderr[-2000:], file=sys.stderr)
        return 1
    (out / "output").rename(out / "expected")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
