"""Size limits the simulator checks BEFORE it allocates, and how to raise them.

A grid header or a control file can ask for any size: a 2 KB GeoTIFF can declare 200,000 x
200,000 cells (149 GiB as float32), a one-second TIMESTEP over three years asks for 94 million
steps. So sizes are estimated from the headers and the task first, and refused beyond these
limits with an error that names the file, the size and the variable that raises the limit:

``HYDROAGENT_MAX_CELLS`` (default 50,000,000)
    Cells of any one grid (rows x columns), checked on the header before the values are read.
    CONUS at 1 km is about 13 million cells.
``HYDROAGENT_MAX_STEPS`` (default 5,000,000)
    Time steps of a task, counted from TIME_BEGIN, TIME_END and TIMESTEP before the step list is
    built. Ten years of 1-minute steps is 5.3 million; 100 years hourly is 876,600.
``HYDROAGENT_MAX_MEMORY_MB`` (default: half of this machine's physical memory)
    Estimated bytes the engine holds for a task (forcing [steps x basin cells] for rain and PET,
    per-gauge outputs, step times), checked after the river network is traced and before any
    forcing file is read; a grid read is checked against it too (8 bytes a cell).

An empty variable means the default. A value that is not a positive whole number (a positive
number for the memory limit) is itself an error naming the variable.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from hydroagent_hpc.sim.errors import InputError

__all__ = ["Limits", "current_limits", "DEFAULT_MAX_CELLS", "DEFAULT_MAX_STEPS"]

DEFAULT_MAX_CELLS = 50_000_000
DEFAULT_MAX_STEPS = 5_000_000


@dataclass(frozen=True)
class Limits:
    """The limits in force: cells per grid, steps per task, megabytes per loaded task."""

    max_cells: int
    max_steps: int
    max_memory_mb: float

    def check_cells(self, nrows: int, ncols: int, where: str) -> None:
        """Refuse a grid of ``nrows x ncols`` beyond the cell or memory limit (``where``: file and key)."""
        cells = nrows * ncols
        if cells > self.max_cells:
            raise InputError(f"{where}: the header declares {nrows:,} rows x {ncols:,} columns = {cells:,} cells, "
                             f"more than the limit of {self.max_cells:,} cells",
                             fix="check the header (a corrupt or hostile file?), or raise the limit with "
                                 f"HYDROAGENT_MAX_CELLS={cells} if the grid is really this large")
        self.check_memory(cells * 8, f"{where}: reading {cells:,} cells")

    def check_steps(self, steps: int, where: str) -> None:
        """Refuse a window of ``steps`` time steps beyond the step limit."""
        if steps > self.max_steps:
            raise InputError(f"{where}: {steps:,} steps exceed the limit of {self.max_steps:,} steps",
                             fix="shorten the window or lengthen TIMESTEP, or raise the limit with "
                                 f"HYDROAGENT_MAX_STEPS={steps}")

    def check_memory(self, nbytes: float, what: str) -> None:
        """Refuse an allocation estimate beyond the memory limit."""
        mb = nbytes / 2**20
        if mb > self.max_memory_mb:
            raise InputError(f"{what} needs about {mb:,.1f} MB, more than the limit of {self.max_memory_mb:,.1f} MB",
                             fix="shorten the window, coarsen the grid or split the basin, or raise the limit with "
                                 f"HYDROAGENT_MAX_MEMORY_MB={math.ceil(mb)}")


def _physical_mb() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    except (ValueError, OSError, AttributeError):
        return 16 * 1024.0


def _env_number(name: str, default: float, integer: bool) -> float:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    kind = "a positive whole number" if integer else "a positive number"
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        raise InputError(f"{name}={text!r} is not {kind}", fix=f"set {name} to {kind}, or unset it for the "
                         "default (see hydroagent_hpc/sim/limits.py)") from None
    if not math.isfinite(value) or value <= 0:
        raise InputError(f"{name}={text!r} is not {kind}", fix=f"set {name} to {kind}, or unset it for the default")
    return value


def current_limits() -> Limits:
    """The limits from the environment (read on every call, so a test or a job can change them)."""
    return Limits(int(_env_number("HYDROAGENT_MAX_CELLS", DEFAULT_MAX_CELLS, True)),
                  int(_env_number("HYDROAGENT_MAX_STEPS", DEFAULT_MAX_STEPS, True)),
                  float(_env_number("HYDROAGENT_MAX_MEMORY_MB", _physical_mb() / 2, False)))
