"""The C kernel: ``crest_kernel.c`` compiled once per machine and loaded with ctypes.

The same computation as :mod:`hydroagent_hpc.sim.kernel` (numba), bit for bit, with two gains
for a drop-in simulator: a process loads a shared library in milliseconds instead of importing
numba and loading its cache (~0.7 s), and C's ``float``/``double`` arithmetic is EF5's own.

Building: the first use compiles ``crest_kernel.c`` with ``$CC`` (default ``cc``) and
``-O2 -ffp-contract=off -fno-fast-math -march=native`` (without ``-march=native`` where the
compiler refuses it) into ``<cache>/ckernel-<hash>.so``. The hash covers the source, the flags, the
compiler's file (its resolved path, size, inode and modification time: nothing is run to find the
library) and this CPU's model and feature flags, so nodes of different CPU types that share a cache
folder (a home directory on a cluster) each build their own library and never
load one built for instructions they lack. ``<cache>`` is the forcing cache's folder,
:func:`hydroagent_hpc.sim.cache.cache_root`. It writes a temporary file and renames it, so pool
workers and MPI ranks that start together never load half a library. :func:`load` raises
:class:`CKernelUnavailable` (with the compiler's message) when no compiler works; the kernel
selector (:mod:`hydroagent_hpc.sim.kernels`) then falls back to numba.

``-march=native`` only widens the vectorised powers and the vector code around them: the float
power (:func:`fpow_array`, 8 lanes with AVX-512, 4 with AVX2 and FMA) and, with AVX-512, register
tables for it and a vectorised double power (:func:`dpow_array`, bit for bit the C library's
``pow``; elsewhere it calls ``pow``). Their results are exact whatever the width, so a run gives the
same bits on every machine. Nothing else may fuse or reorder operations (``-ffp-contract=off``).

The library releases nothing to Python while it runs (ctypes drops the GIL for the call), so
several members of a batch can run on several threads.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from hydroagent_hpc.errors import HydroAgentError
from hydroagent_hpc.sim.cache import cache_root
from hydroagent_hpc.sim.record import N_FIELDS, NODE_FIELDS

__all__ = ["SOURCE", "FLAGS", "CKernelUnavailable", "KernelRecordMismatch", "NodeParamsStruct", "load",
           "compiler", "declare", "using_library", "library_path", "interflow_targets", "run_kernel",
           "run_batch_kernel", "fpow_array", "dpow_array", "fpow_lanes", "check_record"]

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("crest_kernel.c")
FLAGS = ("-O2", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math", "-std=c99", "-Wno-psabi")
NATIVE = "-march=native"  # added when the compiler accepts it (see the module doc)

_LIB: ctypes.CDLL | None = None
_F64 = np.ctypeslib.ndpointer(np.float64, flags="C_CONTIGUOUS")
_I64 = np.ctypeslib.ndpointer(np.int64, flags="C_CONTIGUOUS")
_U8 = np.ctypeslib.ndpointer(np.uint8, flags="C_CONTIGUOUS")
_L, _D = ctypes.c_long, ctypes.c_double


class CKernelUnavailable(HydroAgentError, RuntimeError):
    """No C compiler could build the kernel (or the built library would not load)."""


class KernelRecordMismatch(HydroAgentError, RuntimeError):
    """The library's parameter record (``hak_node_params``) is not :data:`~hydroagent_hpc.sim.record.NODE_FIELDS`:
    a programming error, never a reason to fall back to numba quietly."""


def _struct(names: tuple[str, ...]) -> type[ctypes.Structure]:
    """The ``ctypes.Structure`` of the C ``hak_node_params``: one pointer per field, in ``names``' order."""
    return type("NodeParamsStruct", (ctypes.Structure,), {"_fields_": [(k, ctypes.c_void_p) for k in names]})


#: ``hak_node_params`` as ctypes sees it, generated from :data:`~hydroagent_hpc.sim.record.NODE_FIELDS`.
NodeParamsStruct = _struct(NODE_FIELDS)


def check_record(lib: ctypes.CDLL, names: tuple[str, ...] = NODE_FIELDS) -> None:
    """Refuse a library whose parameter record differs from ``names`` (field names in order, struct size)."""
    if not hasattr(lib, "hak_node_params_fields"):
        raise KernelRecordMismatch("C kernel: the library has no parameter record (hak_node_params_fields); it was "
                                   "built from a source older than hydroagent_hpc.sim.record",
                                   fix="build it from the current crest_kernel.c")
    lib.hak_node_params_fields.restype = ctypes.c_char_p
    lib.hak_node_params_fields.argtypes = []
    lib.hak_node_params_size.restype = ctypes.c_long
    lib.hak_node_params_size.argtypes = []
    c_names = tuple(lib.hak_node_params_fields().decode().split())
    c_size = int(lib.hak_node_params_size())
    py_size = ctypes.sizeof(_struct(names))
    if c_names != tuple(names) or c_size != py_size:
        raise KernelRecordMismatch(f"C kernel: its parameter record hak_node_params is {c_names} ({c_size} bytes), "
                                   f"Python's is {tuple(names)} ({py_size} bytes)",
                                   fix="list the fields of HAK_NODE_FIELDS in crest_kernel.c in the order of "
                                       "hydroagent_hpc.sim.record.NODE_FIELDS")


def compiler() -> str:
    """The C compiler the kernel is built with: ``$CC``, else ``cc`` (a command, found on ``PATH``)."""
    return os.environ.get("CC") or "cc"


def library_path(cache: Path | None = None) -> Path:
    """Where the library for this source, these flags and this compiler lives (built or not).

    Nothing is run to find it: the compiler is known by its resolved path and its file's identity
    (size, inode, modification time), which an upgrade changes, so a process start pays no
    ``cc --version`` (a few milliseconds of a drop-in run)."""
    h = hashlib.blake2b(digest_size=12)
    for part in (SOURCE.read_bytes(), " ".join((*FLAGS, NATIVE)).encode(), _compiler_identity().encode(),
                 _cpu_identity().encode()):
        h.update(part)
    return (cache or cache_root()) / f"ckernel-{h.hexdigest()}.so"


def _compiler_identity() -> str:
    """``$CC`` resolved on ``PATH`` to its file, with that file's size, inode and modification time."""
    cc = compiler()
    found = shutil.which(cc)
    if found is None:
        raise CKernelUnavailable(f"C kernel: the compiler {cc!r} cannot be run (not found on PATH)",
                                 fix="install a C compiler (gcc or clang) or set CC; the numba kernel is used "
                                     "meanwhile")
    real = os.path.realpath(found)
    try:
        st = os.stat(real)
    except OSError as exc:
        raise CKernelUnavailable(f"C kernel: the compiler {cc!r} ({real}) cannot be read ({exc})",
                                 fix="install a C compiler (gcc or clang) or set CC; the numba kernel is used "
                                     "meanwhile") from None
    return f"{real}|{st.st_size}|{st.st_ino}|{st.st_mtime_ns}"


def _cpu_identity() -> str:
    """This CPU's model and feature flags (Linux ``/proc/cpuinfo``; elsewhere what ``platform`` knows;
    ``platform.processor()`` runs ``uname -p`` on Linux, so it is asked only where there is no cpuinfo)."""
    import platform

    keep = ("model name", "flags", "features", "cpu part", "cpu implementer")
    try:
        lines = Path("/proc/cpuinfo").read_text().split("\n\n", 1)[0].splitlines()
    except OSError:
        lines = []
    found = [ln.strip() for ln in lines if ln.split(":", 1)[0].strip().lower() in keep]
    return "\n".join([platform.machine(), *(found or [platform.processor()])])


def _build(target: Path) -> None:
    import subprocess  # here, not at the top: a drop-in start that finds the library built never needs them
    import tempfile

    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=target.name + ".", suffix=".tmp", dir=target.parent)
    os.close(fd)
    cmd = [compiler(), *FLAGS, NATIVE, "-o", tmp, str(SOURCE), "-lm"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:  # a compiler without -march=native (some clang targets): the portable build
            log.info("the C kernel builds without %s (%s)", NATIVE, proc.stderr.strip()[-200:])
            cmd.remove(NATIVE)
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise CKernelUnavailable(f"C kernel: {' '.join(cmd)} failed: {proc.stderr.strip()[-600:]}",
                                     fix="install a working C compiler or set CC; HYDROAGENT_KERNEL=numba uses the "
                                         "numba kernel")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def declare(lib: ctypes.CDLL) -> None:
    """Check the library's parameter record (:func:`check_record`) and set the argument and result types of its
    functions: what :func:`load` does to the library it builds, for a library built elsewhere (another source or
    other flags: a benchmark's or a test's build, used with :func:`using_library`)."""
    check_record(lib)
    lib.hak_interflow_targets.restype = None
    lib.hak_interflow_targets.argtypes = [_L, _I64, _F64, _F64, _F64, _U8, _D, _I64, _I64, _F64, _F64]
    lib.hak_run.restype = ctypes.c_int
    args: list[Any] = ([_L, _L, _L, _F64, _F64, _D, ctypes.POINTER(NodeParamsStruct), _U8, _F64, _F64, _I64, _F64,
                        _F64, _I64, _I64, _F64, _F64, _I64, _F64, _L] + [_F64] * 8)
    lib.hak_run.argtypes = args
    lib.hak_run_batch.restype = ctypes.c_int
    lib.hak_run_batch.argtypes = [_L, *args]
    lib.hak_fpow_array.restype = None
    lib.hak_fpow_array.argtypes = [_L, _F64, _F64, np.ctypeslib.ndpointer(np.float32, flags="C_CONTIGUOUS")]
    lib.hak_fpow_lanes.restype = ctypes.c_int
    lib.hak_fpow_lanes.argtypes = []
    if hasattr(lib, "hak_dpow_array"):  # not in builds of older sources (bench.kernel_ab loads those too)
        lib.hak_dpow_array.restype = None
        lib.hak_dpow_array.argtypes = [_L, _F64, _F64, _F64]


def load(cache: Path | None = None) -> ctypes.CDLL:
    """The compiled kernel (built on first use; see the module doc)."""
    global _LIB
    if _LIB is not None:
        return _LIB
    path = library_path(cache)
    if not path.exists():
        log.info("compiling the C kernel into %s", path)
        _build(path)
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        raise CKernelUnavailable(f"C kernel: {path} does not load ({exc})",
                                 fix=f"delete {path} to rebuild it, or set HYDROAGENT_KERNEL=numba") from None
    declare(lib)
    _LIB = lib
    return lib


@contextmanager
def using_library(lib: ctypes.CDLL) -> Iterator[ctypes.CDLL]:
    """Run the block's kernel calls (this module's functions, on every thread) on ``lib``, a library
    :func:`declare` has checked, instead of the one :func:`load` builds; the previous one is back after it."""
    global _LIB
    saved = _LIB
    _LIB = lib
    try:
        yield lib
    finally:
        _LIB = saved


def _f64(a: Any) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float64)


def _i64(a: Any) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.int64)


def _u8(a: Any) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.bool_).view(np.uint8)


def interflow_targets(down, dx, slope, under, channel, step_seconds):
    """:func:`hydroagent_hpc.sim.kernel.interflow_targets`, in C."""
    lib = load()
    n = int(np.asarray(down).size)
    t0, t1 = np.empty(n, np.int64), np.empty(n, np.int64)
    s0, s1 = np.empty(n), np.empty(n)
    lib.hak_interflow_targets(n, _i64(down), _f64(dx), _f64(slope), _f64(under), _u8(channel), float(step_seconds),
                              t0, t1, s0, s1)
    return t0, t1, s0, s1


def _record(par: Any, n: int, k_sets: int | None = None) -> tuple[Any, np.ndarray]:
    """The C struct of a parameter record [len(NODE_FIELDS), n] (or [len(NODE_FIELDS), K, n] for a batch) and the
    array it points into (keep it alive for the call)."""
    values = _f64(par)
    want = (N_FIELDS, n) if k_sets is None else (N_FIELDS, k_sets, n)
    if values.shape != want:
        raise ValueError(f"C kernel: the parameter record has shape {values.shape}, expected {want} "
                         f"(rows: {', '.join(NODE_FIELDS)})")
    block = values.itemsize * n * (k_sets or 1)
    return ctypes.byref(NodeParamsStruct(*(values.ctypes.data + f * block for f in range(N_FIELDS)))), values


def run_kernel(precip, pet, dt_hours, par, channel, pq0, po0, down, dx, area, t0, t1, s0, s1, gauge_nodes, weights,
               state_step):
    """:func:`hydroagent_hpc.sim.kernel.run_kernel`, in C (same arguments, same results)."""
    lib = load()
    precip, pet = _f64(precip), _f64(pet)
    nt, n = precip.shape
    gauge_nodes = _i64(gauge_nodes)
    ng = gauge_nodes.size
    rec, _keep = _record(par, n)
    outs = [np.empty((nt, ng)) for _ in range(4)]
    states = [np.empty(n) for _ in range(4)]
    rc = lib.hak_run(nt, n, ng, precip, pet, float(dt_hours), rec, _u8(channel), _f64(pq0), _f64(po0), _i64(down),
                     _f64(dx), _f64(area), _i64(t0), _i64(t1), _f64(s0), _f64(s1), gauge_nodes, _f64(weights),
                     int(state_step), *outs, *states)
    _check_rc(rc, n)
    return (*outs, *states)


def _check_rc(rc: int, n: int) -> None:
    if rc == -2:
        raise ValueError("C kernel: the network is not in routing order (every cell's downstream cell and interflow "
                         "targets must come before it)")
    if rc == -3:
        raise ValueError("C kernel: an interflow target is not downstream of its source on the hillslope (targets "
                         "come from interflow_targets)")
    if rc != 0:
        raise MemoryError(f"C kernel: out of memory for {n} cells")


def run_batch_kernel(precip, pet, dt_hours, par, channel, pq0, po0, down, dx, area, t0, t1, s0, s1, gauge_nodes,
                     weights):
    """K parameter sets on one network in one call (``hak_run_batch``): the members' solves of each routing
    level run together, so small basins fill the vectorised power's lanes. ``par`` is the batch record
    [len(NODE_FIELDS), K, n]; the interflow targets have a leading axis K; ``channel`` is one [n] array shared by
    every member (members whose channel cells differ go in separate calls). Returns discharge, soil moisture,
    fast and slow excess, each [K, T, G]; each member's values are bit for bit those of :func:`run_kernel` on its
    own."""
    lib = load()
    precip, pet = _f64(precip), _f64(pet)
    nt, n = precip.shape
    k_sets = int(np.asarray(par).shape[1])
    gauge_nodes = _i64(gauge_nodes)
    ng = gauge_nodes.size
    rec, _keep = _record(par, n, k_sets)
    outs = [np.empty((k_sets, nt, ng)) for _ in range(4)]
    states = [np.empty((k_sets, n)) for _ in range(4)]
    rc = lib.hak_run_batch(k_sets, nt, n, ng, precip, pet, float(dt_hours), rec, _u8(channel), _f64(pq0), _f64(po0),
                           _i64(down), _f64(dx), _f64(area), _i64(t0), _i64(t1), _f64(s0), _f64(s1), gauge_nodes,
                           _f64(weights), -1, *outs, *states)
    _check_rc(rc, n)
    return tuple(outs)


def fpow_array(x: Any, y: Any) -> np.ndarray:
    """``float32(float64(x) ** float64(y))`` elementwise, by the kernel's vectorised power (bit for bit)."""
    x, y = np.broadcast_arrays(_f64(x), _f64(y))
    x, y = _f64(x).ravel(), _f64(y).ravel()
    out = np.empty(x.size, np.float32)
    load().hak_fpow_array(x.size, x, y, out)
    return out


def dpow_array(x: Any, y: Any) -> np.ndarray:
    """``float64(x) ** float64(y)`` elementwise, by the kernel's vectorised double power: bit for bit the C
    library's ``pow`` (the water balance's infiltration powers go through it)."""
    x, y = np.broadcast_arrays(_f64(x), _f64(y))
    x, y = _f64(x).ravel(), _f64(y).ravel()
    out = np.empty(x.size)
    load().hak_dpow_array(x.size, x, y, out)
    return out


def fpow_lanes() -> int:
    """How many powers the built library computes at once (0: each by ``pow``)."""
    return int(load().hak_fpow_lanes())
