"""Two builds of the C kernel, side by side: ``python -m hydroagent_hpc.bench.kernel_ab --old REV CONTROL...``.

For work on ``hydroagent_hpc/sim/crest_kernel.c``: builds the old source (a file, or a git revision of the
kernel's file, e.g. ``HEAD``) and the new one (default: the working tree's) with the library's own flags,
captures the kernel's arguments of one run of each control file (the same calibration-like multipliers as
the simulator benchmark), then calls both builds on them alternately, ``--repeats`` times each, in this one
process. Reported per case: the minimum time of each build (other processes only ever slow a repeat down),
old / new, and whether every output (discharge, soil moisture, excesses, states) is bit for bit the same.
``--batch K`` does the same for a batch of K varied parameter sets (``run_batch``, one thread).

The outputs must be identical: a kernel change that moves a bit is a fidelity change, not a speed-up, and is
reported as such (exit status 1).
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hydroagent_hpc.bench.simulator import typical_params
from hydroagent_hpc.sim import ckernel, kernels
from hydroagent_hpc.sim.embedded import EmbeddedSimulator

__all__ = ["ABRow", "build", "compare", "main"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ABRow:
    case: str
    cells: int
    steps: int
    old_s: float
    new_s: float
    identical: bool

    @property
    def speedup(self) -> float:
        return self.old_s / self.new_s


def _source(spec: str, workdir: Path) -> Path:
    """``spec`` as a source file: a path to a file, else a git revision of the kernel's file."""

    path = Path(spec)
    if path.is_file():
        return path
    root = ckernel.SOURCE.parents[2]
    rel = ckernel.SOURCE.relative_to(root).as_posix()
    proc = subprocess.run(["git", "-C", str(root), "show", f"{spec}:{rel}"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"kernel_ab: {spec!r} is neither a file nor a git revision with {rel}: "
                         f"{proc.stderr.strip()}")
    out = workdir / f"{spec.replace('/', '_')}.c"
    out.write_text(proc.stdout)
    return out


def build(source: Path, out: Path) -> ctypes.CDLL:
    """Compile ``source`` as the library is compiled (same compiler and flags) and load it."""

    cmd = [ckernel.compiler(), *ckernel.FLAGS, ckernel.NATIVE, "-o", str(out), str(source), "-lm"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"kernel_ab: {' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    lib = ctypes.CDLL(str(out))
    ckernel.declare(lib)
    return lib


def _capture(control: Path, batch: int) -> tuple[Any, list[tuple[Any, ...]]]:
    """The simulator of ``control`` and the kernel arguments of one run (or one batch of ``batch`` sets)."""

    sim = EmbeddedSimulator(control, cache_dir=False)
    params = typical_params(control)
    name = "run_batch_kernel" if batch else "run_kernel"
    real: Callable[..., Any] = getattr(ckernel, name)
    calls: list[tuple[Any, ...]] = []

    def record(*args: Any) -> Any:
        calls.append(args)
        return real(*args)

    setattr(ckernel, name, record)
    try:
        with kernels.using("c"):
            if batch:
                rng = np.random.default_rng(0)
                sets = [{k: v * float(rng.uniform(0.9, 1.1)) if k in ("wm", "alpha", "beta", "under") else v
                         for k, v in params.items()} for _ in range(batch)]
                sim.run_batch(sets)
            else:
                sim.run(params)
    finally:
        setattr(ckernel, name, real)
    return sim, calls


def compare(old: ctypes.CDLL, new: ctypes.CDLL, control: Path, repeats: int = 7, batch: int = 0) -> ABRow:
    """Time both builds on the captured arguments of ``control``, alternating; check the outputs' bits."""

    sim, calls = _capture(control, batch)
    fn = ckernel.run_batch_kernel if batch else ckernel.run_kernel
    times: dict[str, list[float]] = {"old": [], "new": []}
    outs: dict[str, list[Any]] = {}
    with kernels.thread_cap(1):
        for _ in range(repeats):
            for key, lib in (("old", old), ("new", new)):
                with ckernel.using_library(lib):
                    t0 = time.perf_counter()
                    outs[key] = [fn(*args) for args in calls]
                    times[key].append(time.perf_counter() - t0)
    same = all(np.array_equal(a, b, equal_nan=True) for o, n in zip(outs["old"], outs["new"], strict=True)
               for a, b in zip(o, n, strict=True))
    return ABRow(control.parent.name, sim.net.n, len(sim.steps), min(times["old"]), min(times["new"]), same)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hydroagent_hpc.bench.kernel_ab", description=__doc__.split("\n\n")[0])
    ap.add_argument("controls", nargs="+", type=Path, help="EF5 control files to run")
    ap.add_argument("--old", required=True, help="the old kernel: a C file or a git revision (e.g. HEAD)")
    ap.add_argument("--new", default=str(ckernel.SOURCE), help="the new kernel (default: the working tree's)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--batch", type=int, default=0, help="K > 0: a batch of K varied parameter sets per case")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    with tempfile.TemporaryDirectory(prefix="hydroagent-kernel-ab-") as tmp:
        work = Path(tmp)
        old = build(_source(args.old, work), work / "old.so")
        new = build(_source(args.new, work), work / "new.so")
        what = f"batch of {args.batch}, 1 thread" if args.batch else "one run"
        sys.stdout.write(f"| case | cells | steps | old s | new s | old / new | identical ({what}) |\n"
                         "|---|---|---|---|---|---|---|\n")
        ok = True
        for control in args.controls:
            row = compare(old, new, control, args.repeats, args.batch)
            ok &= row.identical
            sys.stdout.write(f"| {row.case} | {row.cells} | {row.steps} | {row.old_s:.4f} | {row.new_s:.4f} | "
                             f"{row.speedup:.2f} | {'yes' if row.identical else 'NO'} |\n")
            sys.stdout.flush()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
