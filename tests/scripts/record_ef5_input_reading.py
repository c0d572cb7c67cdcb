"""Record what the real EF5 does on the hand-made input-reading cases (``tests/helpers/tinycase.py``).

usage: HYDROAGENT_EF5=/path/to/ef5 python tests/scripts/record_ef5_input_reading.py

For every case in ``CASES`` it writes the case to a temporary folder, runs EF5 1.2.3 there (one
thread), copies EF5's ``ts.outlet.crest.csv`` to ``tests/data/ef5-input-reading/<case>.csv`` and
prints the cell EF5 placed the gauge in (from its log), which must equal the case's expected cell.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from helpers.tinycase import CASES, TIF_CASES, TIF_REFUSED, write_named_case, write_tif_case  # noqa: E402

log = logging.getLogger("record_ef5_input_reading")
OUT = ROOT / "tests" / "data" / "ef5-input-reading"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
GAUGE_LINE = re.compile(r"Gauge outlet \([^;]*; (\d+), (\d+)\)")


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    binary = os.environ.get("HYDROAGENT_EF5")
    if not binary:
        log.error("set HYDROAGENT_EF5 to the EF5 binary (../shared/scripts/build-ef5.sh builds one)")
        return 2
    OUT.mkdir(parents=True, exist_ok=True)
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, (_, _, cell) in CASES.items():
            control = write_named_case(name, Path(tmp) / name)
            proc = subprocess.run([binary, control.name], cwd=control.parent, capture_output=True, text=True,
                                  env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=120)
            m = GAUGE_LINE.search(proc.stdout + proc.stderr)
            got = (int(m.group(1)), int(m.group(2))) if m else None
            shutil.copyfile(control.parent / "output" / "ts.outlet.crest.csv", OUT / f"{name}.csv")
            log.info("%s: EF5 placed the gauge at %s (expected %s)", name, got, cell)
            bad += got != cell
        for name in (*TIF_CASES, *TIF_REFUSED):
            control = write_tif_case(name, Path(tmp) / name)
            proc = subprocess.run([binary, control.name], cwd=control.parent, capture_output=True, text=True,
                                  env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=120)
            text = ANSI.sub("", proc.stdout + proc.stderr)
            csv = control.parent / "output" / "ts.outlet.crest.csv"
            expect = TIF_REFUSED[name][3] if name in TIF_REFUSED else "ran"
            if expect == "ran":
                m = GAUGE_LINE.search(text)
                got = (int(m.group(1)), int(m.group(2))) if m else None
                shutil.copyfile(csv, OUT / f"{name}.csv")
                log.info("%s: EF5 ran (exit %d), gauge at %s", name, proc.returncode, got)
                bad += name in TIF_CASES and got != TIF_CASES[name][2]
            else:
                lines = [ln for ln in text.splitlines() if "ERROR" in ln or "terminate" in ln or "what()" in ln]
                (OUT / f"{name}.log").write_text("".join(ln + "\n" for ln in lines))
                log.info("%s: EF5 said %s (csv written: %s)", name, lines, csv.exists())
                bad += not any(expect in ln for ln in lines)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
