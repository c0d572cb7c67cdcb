"""The EF5 binary backend: the same API as the embedded engine, backed by a real ``ef5`` process.

Each run renders the control file with the run's multipliers (numbers only, absolute paths),
creates a fresh run folder (EF5 does not create its OUTPUT folder and crashes at the end without
it), runs ``[binary, "control.txt"]`` there as an argument list (never a shell string) in its
own process group with a timeout, and parses EF5's CSV. A non-zero exit, a timeout, a missing,
partial or non-finite output each raise :class:`SimulationError` carrying the tail of EF5's
output; because every run has its own folder, a failed run can never return an earlier run's
output. The run folder's ``output`` is also its STATES folder, so concurrent runs never write
each other's state grids; the task's initial state grids (every grid stamped TIME_BEGIN) are
copied into it first, so EF5 starts from them exactly as it would in the task's own STATES folder.

The binary comes from ``binary=``, else ``$HYDROAGENT_EF5``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from hydroagent_hpc.params import PARAM_NAMES, SNOW_NAMES, check_values
from hydroagent_hpc.sim.controlfile import ControlFile, parse_control, render_control
from hydroagent_hpc.sim.errors import InputError, SimulationError
from hydroagent_hpc.sim.forcing import step_times
from hydroagent_hpc.sim.outputs import read_ts_csv, ts_filename
from hydroagent_hpc.types import GaugeSeries, SimulationResult

log = logging.getLogger(__name__)

__all__ = ["EF5Simulator", "find_ef5", "sweep_stale_runs"]

_TAIL = 2000


def find_ef5(binary: str | Path | None = None) -> Path:
    """The EF5 executable to use, checked to exist and be executable."""
    name = binary or os.environ.get("HYDROAGENT_EF5")
    if not name:
        raise InputError("no EF5 binary configured", fix="set HYDROAGENT_EF5=/path/to/ef5 or pass --ef5 PATH")
    path = Path(name)
    if not path.is_absolute():
        found = shutil.which(str(name))
        path = Path(found) if found else path.resolve()
    if not path.is_file() or not os.access(path, os.X_OK):
        raise InputError(f"EF5 binary {name} is not an executable file", fix="point HYDROAGENT_EF5 at the compiled ef5")
    return path


class EF5Simulator:
    """Runs a control file's task with the external EF5 binary; ``run(params)`` like the embedded one."""

    backend = "ef5"

    def __init__(self, control: str | Path | ControlFile, task: str | None = None, binary: str | Path | None = None,
                 timeout_s: float = 600.0, workdir: str | Path | None = None, keep_runs: bool = False) -> None:
        self.control = control if isinstance(control, ControlFile) else parse_control(control)
        self.task = self.control.task(task)
        self.binary = find_ef5(binary)
        self.timeout_s = float(timeout_s)
        self.workdir = Path(workdir) if workdir else None
        self.keep_runs = keep_runs
        cf, tk = self.control, self.task
        self.steps = step_times(tk.time_begin, tk.time_end, tk.timestep)
        warm = tk.time_warmend or tk.time_begin
        self.expected_rows = sum(1 for t in self.steps if t >= warm)
        self.gauges = [g for g in cf.basins[tk.basin] if cf.gauges[g].outputts]
        if not self.gauges:
            raise InputError(f"basin {tk.basin!r} has no gauge with OUTPUTTS on", fix="set OUTPUTTS=TRUE on a gauge")
        self.primary = next((g for g in self.gauges if cf.gauges[g].obs is not None), self.gauges[0])
        self.last_run_dir: Path | None = None
        sweep_stale_runs(self.workdir or Path(tempfile.gettempdir()))

    @property
    def has_snow(self) -> bool:
        """Whether the task runs Snow-17 (SNOW=SNOW17): its parameters are then calibratable too."""
        return bool(self.task.snow)

    @property
    def base_params(self) -> dict[str, float]:
        cf, tk = self.control, self.task
        out: dict[str, float] = {}
        names = [tk.param_set, tk.routing_param_set or tk.param_set]
        if tk.snow_param_set:
            names.append(tk.snow_param_set)
        for ps in (cf.param_sets[n] for n in names):
            vals = ps.values.get(self.primary) or next(iter(ps.values.values()), {})
            out.update(vals)
        return {k: out[k] for k in (*PARAM_NAMES, *SNOW_NAMES) if k in out}

    def run(self, params: Mapping[str, float] | None = None,
            copy_outputs_to: str | Path | None = None) -> SimulationResult:
        """Run EF5 once; ``copy_outputs_to`` also copies EF5's own output files there (after checks)."""
        over = check_values(params or {}, "run parameters", snow=bool(self.task.snow))
        run_dir = Path(tempfile.mkdtemp(prefix=f"ef5-run-{os.getpid()}-", dir=self.workdir))
        self.last_run_dir = run_dir
        try:
            out = run_dir / "output"
            out.mkdir()
            self._stage_initial_states(out)
            (run_dir / "control.txt").write_text(render_control(self.control, self.task.name, over, out))
            t0 = time.perf_counter()
            log_text = self._execute(run_dir)
            wall = time.perf_counter() - t0
            result = self._parse(out, over, wall, log_text)
            if copy_outputs_to is not None:
                dest = Path(copy_outputs_to)
                dest.mkdir(parents=True, exist_ok=True)
                for f in out.iterdir():
                    if f.is_file():
                        tmp = dest / f".{f.name}.part"
                        shutil.copyfile(f, tmp)
                        os.replace(tmp, dest / f.name)
            return result
        finally:
            if not self.keep_runs:
                shutil.rmtree(run_dir, ignore_errors=True)

    def run_batch(self, param_sets: Sequence[Mapping[str, float] | None],
                  workers: int | None = None) -> list[SimulationResult]:
        """Run several parameter sets as concurrent EF5 processes (one per core by default)."""
        workers = workers or max(1, os.cpu_count() or 1)
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(self.run, param_sets))

    def _stage_initial_states(self, out: Path) -> None:
        """Copy the task's initial state grids into the run's STATES folder (``out``), if it has any."""
        tk = self.task
        if tk.states is None:
            return
        stamp = f"{tk.time_begin:%Y%m%d_%H%M}"
        for src in tk.states.glob(f"*_{stamp}.tif"):  # CREST, KW and (with snow) Snow-17 state grids
            if src.is_file():
                shutil.copyfile(src, out / src.name)

    def _execute(self, run_dir: Path) -> str:
        logf = run_dir / "ef5.log"
        with open(logf, "wb") as fh:
            proc = subprocess.Popen([str(self.binary), "control.txt"], cwd=run_dir, stdout=fh, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                rc = proc.wait(timeout=self.timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                raise SimulationError(f"EF5 did not finish within {self.timeout_s:g} s; output tail:\n{_tail(logf)}",
                                      fix="raise the timeout or use a smaller basin/window") from None
        if rc != 0:
            what = f"signal {-rc}" if rc < 0 else f"exit status {rc}"
            raise SimulationError(f"EF5 failed with {what}; output tail:\n{_tail(logf)}",
                                  fix="read the EF5 messages above (inputs, paths, parameter grids)")
        return _tail(logf)

    def _parse(self, out: Path, over: Mapping[str, float], wall: float, log_text: str) -> SimulationResult:
        series = {}
        times = None
        for g in self.gauges:
            try:
                data = read_ts_csv(out / ts_filename(g))
            except SimulationError as exc:
                raise SimulationError(f"{exc.message}; EF5 output tail:\n{log_text}", fix=exc.fix) from None
            if data["times"].size != self.expected_rows:
                raise SimulationError(f"{ts_filename(g)} has {data['times'].size} rows, expected {self.expected_rows} "
                                      f"(partial output); EF5 output tail:\n{log_text}", fix="treat the run as failed")
            times = data["times"]
            series[g] = GaugeSeries(data["discharge"], data["observed"], data["precip"], data["pet"], data["sm"],
                                    data["fast_flow"] / 1000.0, data["slow_flow"] / 1000.0,
                                    data.get("temperature"), data.get("swe"))
        assert times is not None  # __init__ refuses a task without an output gauge
        missing = 0
        rj = out / "results.json"
        if rj.exists():
            try:
                missing = int(json.loads(rj.read_text()).get("missingQPE", 0))
            except (ValueError, TypeError):
                log.warning("unreadable %s", rj)
        params = {**self.base_params, **over}
        return SimulationResult(times, self.primary, series, np.zeros(times.size, dtype=bool), params, wall,
                                missing, 0, self.backend, {"log_tail": log_text[-500:]})


def sweep_stale_runs(folder: Path) -> int:
    """Remove run folders left by processes that died (a crash skips their ``finally``).

    Run folders are named ``ef5-run-<pid>-*``; a folder whose pid no longer exists is removed.
    Returns how many were removed.
    """
    removed = 0
    try:
        entries = list(Path(folder).glob("ef5-run-*-*"))
    except OSError:
        return 0
    for d in entries:
        try:
            pid = int(d.name.split("-")[2])
        except (IndexError, ValueError):
            continue
        if pid == os.getpid() or _alive(pid):
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed += 1
    if removed:
        log.info("removed %d stale EF5 run folder(s) in %s", removed, folder)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    proc.wait()


def _tail(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-_TAIL:].decode(errors="replace")
