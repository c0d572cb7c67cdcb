"""The C kernel against the numba kernel: bit-identical results, backend choice, a light process.

Both kernels implement EF5's CREST water balance and kinematic-wave routing with the same
float/double roundings (hydroagent_hpc/sim/crest_kernel.c, hydroagent_hpc/sim/kernel.py), so every
output array must be equal bit for bit, on generated cases that cover hourly and daily steps,
warm-up, missing forcing, initial states, states saved mid-run and multipliers at their bounds.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers.ckernel import needs_c
from helpers.paths import pythonpath
from hydroagent_hpc.errors import ConfigError
from hydroagent_hpc.sim import kernels
from hydroagent_hpc.sim.embedded import EmbeddedSimulator
from hydroagent_hpc.sim.record import NodeParams
from hydroagent_hpc.sim.synth.cases import draw_case, write_case

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "data" / "ef5-reference"




def _record(channel, **fields) -> np.ndarray:
    """A parameter record [len(NODE_FIELDS), n] of named per-node arrays (UNDER, which only interflow_targets
    reads, defaults to 1)."""
    return NodeParams.of(channel, **{"under": np.ones(np.asarray(channel).size), **fields}).values


def _both(sim: EmbeddedSimulator, params: dict[str, float] | None):
    out = {}
    for name in ("c", "numba"):
        with kernels.using(name):
            out[name] = sim.run(params, keep_states=sim.task.states is not None)
    return out["c"], out["numba"]


def _assert_identical(a, b) -> None:
    assert list(a.gauges) == list(b.gauges)
    for g in a.gauges:
        for field in dataclasses.fields(a.gauges[g]):
            x, y = getattr(a.gauges[g], field.name), getattr(b.gauges[g], field.name)
            if isinstance(x, np.ndarray):
                assert np.array_equal(x, y, equal_nan=True), f"{g}.{field.name}"
    sa, sb = a.info.get("states"), b.info.get("states")
    assert (sa is None) == (sb is None)
    for k in sa or {}:
        assert np.array_equal(sa[k], sb[k]), f"state {k}"


@needs_c
@pytest.mark.parametrize("seed", range(8))
def test_c_kernel_equals_numba_on_generated_cases(tmp_path, seed):
    spec = draw_case(seed)
    sim = EmbeddedSimulator(write_case(spec, tmp_path / "case"), cache_dir=False)
    c, nb = _both(sim, dict(spec.params))
    _assert_identical(c, nb)
    assert np.all(np.isfinite(c.discharge))


@needs_c
@pytest.mark.parametrize("control", sorted(p.relative_to(GOLDEN).as_posix() for p in GOLDEN.glob("*/control*.txt")))
def test_c_kernel_equals_numba_on_golden_cases(control):
    sim = EmbeddedSimulator(GOLDEN / control, cache_dir=False)
    _assert_identical(*_both(sim, None))


def _float_midpoints(rng, n):
    """Doubles exactly halfway between two adjacent floats (where rounding to float is a tie)."""
    f = rng.uniform(1e-3, 1e3, n).astype(np.float32)
    up = np.nextafter(f, np.float32(np.inf))
    return (f.astype(np.float64) + up.astype(np.float64)) / 2.0


@needs_c
def test_vectorised_power_equals_the_double_power_rounded_to_float():
    """fpow_array is exact: bit for bit float32(pow(x, y)) (libm's pow, through math.pow), on the
    arguments routing sees, on ties and near-ties where the fast value must fall back to pow, and on
    every special value (zero, negative, subnormal, huge, inf, nan, |y| beyond the fast range)."""
    import ctypes
    import ctypes.util

    from hydroagent_hpc.sim import ckernel

    rng = np.random.default_rng(7)
    n = 60_000
    flows = np.exp(rng.uniform(-25, 14, n)).astype(np.float32).astype(np.float64)
    x = np.concatenate([
        flows, flows,                                   # Q^beta and ((Q_in + Q_old)/2)^(beta - 1)
        np.exp(rng.uniform(-700, 700, 5000)),           # the whole double range
        _float_midpoints(rng, 3000), _float_midpoints(rng, 3000) ** 2, np.sqrt(_float_midpoints(rng, 3000)),
        [0.0, -0.0, -1.0, -2.5, 5e-324, 2.2e-308, 1e308, np.inf, -np.inf, np.nan, 1.0, 2.0, 4.0, 0.25],
    ])
    betas = rng.uniform(0.3, 1.5, n).astype(np.float32).astype(np.float64)
    y = np.concatenate([
        betas, betas - 1.0, rng.uniform(-3, 3, 5000),
        np.ones(3000), np.full(3000, 0.5), np.full(3000, 2.0),
        [0.6, 0.6, 0.6, -0.4, 0.6, 0.6, -1.0, 0.6, 0.6, 0.6, 1e6, 0.5, 0.5, 17.0],
    ])
    got = ckernel.fpow_array(x, y)
    libm = ctypes.CDLL(ctypes.util.find_library("m"))  # the C library's own pow, overflow and domain included
    libm.pow.restype = ctypes.c_double
    libm.pow.argtypes = [ctypes.c_double, ctypes.c_double]
    with np.errstate(over="ignore", invalid="ignore"):
        want = np.array([libm.pow(a, b) for a, b in zip(x.tolist(), y.tolist())]).astype(np.float32)
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    bad = np.flatnonzero(~same)
    assert bad.size == 0, [(x[i], y[i], got[i], want[i]) for i in bad[:5]]
    assert ckernel.fpow_lanes() in (0, 4, 8)


@needs_c
def test_vectorised_double_power_equals_the_c_librarys_pow():
    """dpow_array is bit for bit the C library's pow (which the numba kernel and EF5 call), on the water balance's
    arguments (x in (0, 1], y = 1 + b as a float), on exact results and exact midpoints between doubles (where the
    fast value must give way to pow), over the whole range, and on special values."""
    import ctypes
    import ctypes.util

    from hydroagent_hpc.sim import ckernel

    rng = np.random.default_rng(8)
    n = 40_000
    short = np.floor(rng.uniform(2**26, 2**27, n)) / 2**26           # 27-bit mantissas: their squares are exact
    x = np.concatenate([                                              # or exact midpoints between two doubles
        rng.uniform(0, 1, n), 1 - rng.exponential(1e-6, n), short, short**2,
        np.exp(rng.uniform(-700, 700, 5000)), np.exp(rng.uniform(-40, 40, 5000)),
        [0.0, -0.0, -1.0, -2.5, 5e-324, 2.2e-308, 1e308, np.inf, -np.inf, np.nan, 1.0, 2.0, 4.0, 0.25, 0.5],
    ])
    y = np.concatenate([
        (1 + rng.uniform(0.01, 3.0, 2 * n)).astype(np.float32), np.full(n, 2.0), np.full(n, 0.5),
        rng.uniform(-16, 16, 5000), rng.uniform(-3, 3, 5000),
        [1.5, 1.5, 2.0, 0.5, 1.5, 1.5, 1.5, 1.5, 1.5, 1.5, 1.5, 0.5, 0.5, 3.0, 17.0],
    ]).astype(np.float64)
    got = ckernel.dpow_array(x, y)
    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    libm.pow.restype = ctypes.c_double
    libm.pow.argtypes = [ctypes.c_double, ctypes.c_double]
    want = np.array([libm.pow(a, b) for a, b in zip(x.tolist(), y.tolist())])
    same = (got.view(np.uint64) == want.view(np.uint64)) | (np.isnan(got) & np.isnan(want))
    bad = np.flatnonzero(~same)
    assert bad.size == 0, [(x[i].hex(), y[i].hex(), got[i].hex(), want[i].hex()) for i in bad[:5]]


@needs_c
def test_c_kernel_refuses_a_network_out_of_routing_order():
    """Cell 0 draining into cell 1 breaks the upstream-last order the level schedule relies on."""
    from hydroagent_hpc.sim import ckernel

    n, nt = 2, 3
    z = np.zeros(n)
    one = np.ones(n)
    channel = np.array([0, 1], np.uint8)
    par = _record(channel, wm=one * 100, b=one * 0.3, im=z, ke=one, fc=one * 0.5, w0=one * 50, leaki=one * 0.1,
                  alpha=one, beta=one * 0.6, alpha0=one, ir0=z)
    args = (np.ones((nt, n)), np.zeros((nt, n)), 1.0, par, channel, z, z, np.array([1, -1]), one * 1000, one * 1e6,
            np.array([-1, -1]), np.array([-1, -1]), z, z, np.array([1]), np.array([[0.0, 1.0]]), -1)
    with pytest.raises(ValueError, match="routing order"):
        ckernel.run_kernel(*args)
    ok = list(args)
    ok[7] = np.array([-1, 0])  # cell 1 drains into cell 0: fine
    q = ckernel.run_kernel(*ok)[0]
    assert q.shape == (nt, 1) and np.all(np.isfinite(q))


@needs_c
def test_c_batch_equals_single_runs_and_numba_batch(tmp_path, monkeypatch):
    monkeypatch.setattr(kernels, "_THREADS", None)  # restored after the test
    spec = draw_case(3)
    sim = EmbeddedSimulator(write_case(spec, tmp_path / "case"), cache_dir=False)
    rng = np.random.default_rng(0)
    sets = [{**spec.params, "wm": float(rng.uniform(0.5, 2.0)), "alpha": float(rng.uniform(0.5, 2.0))}
            for _ in range(5)]
    with kernels.using("c"):
        singles = [sim.run(p) for p in sets]
        kernels.set_threads(2)
        try:
            threaded = sim.run_batch(sets)
        finally:
            kernels.set_threads(1)
        serial = sim.run_batch(sets)
    with kernels.using("numba"):
        numba_batch = sim.run_batch(sets)
    for one, a, b, c in zip(singles, threaded, serial, numba_batch):
        for r in (a, b, c):
            _assert_identical(one, r)


@needs_c
@pytest.mark.parametrize("seed", [1, 5])
def test_c_batch_of_nine_varied_members_equals_their_own_runs(tmp_path, monkeypatch, seed):
    """Nine members (more than the power's lanes) drawn across the bounds of every tunable multiplier, so their
    interflow targets, leaks and flows all differ, solved level by level together in one ``hak_run_batch``
    call: each member is bit for bit its own run (the numba kernel's, cell by cell)."""
    from hydroagent_hpc.params import PARAMS, TUNABLE

    monkeypatch.setattr(kernels, "_THREADS", None)
    spec = draw_case(seed)
    sim = EmbeddedSimulator(write_case(spec, tmp_path / "case"), cache_dir=False)
    rng = np.random.default_rng(seed)
    sets = [{name: float(rng.uniform(PARAMS[name].lower, PARAMS[name].upper)) for name in TUNABLE if name != "iwu"}
            for _ in range(9)]
    kernels.set_threads(1)
    with kernels.using("c"):
        batch = sim.run_batch(sets)
    with kernels.using("numba"):
        singles = [sim.run(p) for p in sets]
    for one, member in zip(singles, batch):
        _assert_identical(one, member)
    assert len({float(r.discharge.sum()) for r in batch}) == len(sets)  # the members really differ


@needs_c
def test_c_batch_groups_members_whose_channel_cells_differ(tmp_path, monkeypatch):
    """Members share one call only when their channel cells agree; a member with other channel cells (another
    threshold) runs in its own call, and the results come back in the members' order."""
    from hydroagent_hpc.sim import ckernel

    monkeypatch.setattr(kernels, "_THREADS", None)
    sim = EmbeddedSimulator(write_case(draw_case(2), tmp_path / "case"), cache_dir=False)
    nps = [sim.node_params({"alpha": a, "under": u}) for a, u in ((0.5, 1.0), (2.0, 3.0), (1.0, 0.3))]
    channels = [np.asarray(p.channel, dtype=bool).copy() for p in nps]
    fac = np.asarray(sim.net.fac)
    channels[1] = fac >= np.quantile(fac, 0.5)  # many more channel cells for the middle member
    step_s = sim.dt_hours * 3600.0
    tgs = [ckernel.interflow_targets(sim.net.down, sim.net.dx, sim.net.slope, p.under, ch, step_s)
           for p, ch in zip(nps, channels)]
    pq0, po0 = sim._flow_states()
    common = (sim.net.down, sim.net.dx, sim.net.area)
    batch_args = (sim.precip, sim.pet, sim.dt_hours, np.stack([p.values for p in nps], axis=1), np.stack(channels),
                  pq0, po0, *common, *(np.stack([t[j] for t in tgs]) for j in range(4)), sim.net.gauge_nodes,
                  sim.weights)
    kernels.set_threads(1)
    with kernels.using("c") as kern:
        got = kern.run_batch_kernel(*batch_args)
    for k, p in enumerate(nps):
        want = ckernel.run_kernel(sim.precip, sim.pet, sim.dt_hours, p.values, channels[k], pq0, po0, *common,
                                  *tgs[k], sim.net.gauge_nodes, sim.weights, -1)
        for j in range(4):
            assert np.array_equal(got[j][k], want[j]), (k, j)
    assert not np.array_equal(got[0][0], got[0][1])


@needs_c
def test_c_kernel_refuses_an_interflow_target_off_the_hillslope_path():
    """A leak is computed with its source's overland solve, so its target must lie downstream on the hillslope
    (as interflow_targets finds it); a target beside the source is refused, not silently mis-ordered."""
    from hydroagent_hpc.sim import ckernel

    n, nt = 3, 2
    z, one = np.zeros(n), np.ones(n)
    down = np.array([-1, 0, 0])  # cells 1 and 2 both drain into the outlet: the same overland level
    channel = np.array([1, 0, 0], np.uint8)
    par = _record(channel, wm=one * 100, b=one * 0.3, im=z, ke=one, fc=one * 0.5, w0=one * 50, leaki=one * 0.1,
                  alpha=one, beta=one * 0.6, alpha0=one, ir0=z)
    args = [np.ones((nt, n)), np.zeros((nt, n)), 1.0, par, channel, z, z, down, one * 1000, one * 1e6,
            np.array([-1, 0, 0]), np.array([-1, -1, -1]), np.array([0.0, 1.0, 1.0]), z, np.array([0]),
            np.array([[1.0, 0.0, 0.0]]), -1]
    assert np.all(np.isfinite(ckernel.run_kernel(*args)[0]))
    args[10] = np.array([-1, 0, 1])  # cell 2 leaks onto cell 1, which is not downstream of it
    with pytest.raises(ValueError, match="interflow target"):
        ckernel.run_kernel(*args)


@needs_c
@pytest.mark.parametrize("define, lanes", [
    ("-DFPOW_W=0", 0),            # a CPU without AVX2 and FMA: scalar solves, libm's pow
    ("-DFPOW_W=4", 4),            # AVX2's 4 lanes, with the table-free power
    ("-DFPOW_NO_TABLES", None),   # the native lanes with the table-free power (what AVX2 machines run)
])
def test_every_build_variant_gives_the_same_bits(tmp_path, monkeypatch, define, lanes):
    """The library built as other CPUs get it and the native build (vectorised solves and power where the CPU has
    them; with AVX-512 the power from register tables) agree bit for bit: the power on routing-like and wide
    arguments, one run and a batch."""
    import ctypes
    import subprocess

    from hydroagent_hpc.sim import ckernel

    monkeypatch.setattr(kernels, "_THREADS", 1)
    lib_path = tmp_path / "variant.so"
    cmd = [ckernel.compiler(), *ckernel.FLAGS, ckernel.NATIVE, define, "-o", str(lib_path),
           str(ckernel.SOURCE), "-lm"]
    subprocess.run(cmd, check=True, capture_output=True)
    variant = ctypes.CDLL(str(lib_path))
    ckernel.declare(variant)
    assert variant.hak_fpow_lanes() == (ckernel.load().hak_fpow_lanes() if lanes is None else lanes)
    rng = np.random.default_rng(12)
    x = np.concatenate([np.exp(rng.uniform(-25, 14, 40_000)), np.exp(rng.uniform(-700, 700, 5_000)), [0.0, 1.0]])
    y = np.concatenate([rng.uniform(-0.7, 1.5, 40_000), rng.uniform(-16, 16, 5_000), [0.6, 0.6]])
    native = ckernel.fpow_array(x, y)
    other = np.empty(x.size, np.float32)
    variant.hak_fpow_array(x.size, x, y, other)
    assert np.array_equal(native.view(np.uint32), other.view(np.uint32))
    xd, yd = rng.uniform(0, 1, 20_000), (1 + rng.uniform(0.01, 3.0, 20_000)).astype(np.float32).astype(np.float64)
    other_d = np.empty(xd.size)
    variant.hak_dpow_array(xd.size, xd, yd, other_d)
    assert np.array_equal(ckernel.dpow_array(xd, yd).view(np.uint64), other_d.view(np.uint64))
    spec = draw_case(4)
    sim = EmbeddedSimulator(write_case(spec, tmp_path / "case"), cache_dir=False)
    rng = np.random.default_rng(4)
    sets = [{**spec.params, "alpha0": float(rng.uniform(0.2, 3.0)), "beta": float(rng.uniform(0.3, 2.0))}
            for _ in range(3)]
    out = {}
    with kernels.using("c"):
        for name, lib in (("native", ckernel.load()), ("variant", variant)):
            with ckernel.using_library(lib):
                out[name] = [sim.run(sets[0], keep_states=sim.task.states is not None), *sim.run_batch(sets)]
    for a, b in zip(out["native"], out["variant"]):
        _assert_identical(a, b)


def test_unknown_kernel_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("HYDROAGENT_KERNEL", "fortran")
    monkeypatch.setattr(kernels, "_CHOSEN", None)
    with pytest.raises(ConfigError, match="(?s)HYDROAGENT_KERNEL=.fortran.*auto, c, numba"):
        kernels.kernel()


def test_auto_falls_back_to_numba_without_a_compiler(tmp_path, monkeypatch, caplog):
    from hydroagent_hpc.sim import ckernel

    monkeypatch.setenv("HYDROAGENT_KERNEL", "auto")
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("HYDROAGENT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(kernels, "_CHOSEN", None)
    monkeypatch.setattr(ckernel, "_LIB", None)
    with caplog.at_level("WARNING"):
        assert kernels.kernel().name == "numba"
    assert "no-such-compiler" in caplog.text and "numba" in caplog.text
    monkeypatch.setenv("HYDROAGENT_KERNEL", "c")
    monkeypatch.setattr(kernels, "_CHOSEN", None)
    with pytest.raises(ckernel.CKernelUnavailable, match="cannot be run"):
        kernels.kernel()


def test_a_broken_compiler_is_reported_and_leaves_no_library(tmp_path, monkeypatch):
    from hydroagent_hpc.sim import ckernel

    fake = tmp_path / "cc"
    fake.write_text("#!/bin/sh\nif [ \"$1\" = --version ]; then echo fakecc 1.0; exit 0; fi\n"
                    "echo 'fakecc: error: no space left' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    monkeypatch.setattr(ckernel, "_LIB", None)
    with pytest.raises(ckernel.CKernelUnavailable, match="no space left"):
        ckernel.load(tmp_path / "cache")
    assert not list((tmp_path / "cache").glob("*.so")) and not list((tmp_path / "cache").glob("*.tmp"))


def test_library_path_runs_nothing_and_follows_the_compiler_file(tmp_path, monkeypatch):
    """Finding the built library runs no program (a drop-in start pays no ``cc --version``), and a
    changed compiler file (an upgrade) names a different library."""
    from hydroagent_hpc.sim import ckernel

    marker = tmp_path / "ran"
    fake = tmp_path / "cc"
    fake.write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    first = ckernel.library_path(tmp_path / "cache")
    assert ckernel.library_path(tmp_path / "cache") == first
    assert not marker.exists()
    fake.write_text(f"#!/bin/sh\ntouch {marker}\nexit 2\n")  # an upgraded compiler: another file
    os.utime(fake, ns=(1, 1))
    assert ckernel.library_path(tmp_path / "cache") != first
    assert not marker.exists()


@needs_c
def test_simulate_process_does_not_import_numba(tmp_path):
    """The drop-in command with the C kernel starts without numba (its import costs ~0.7 s)."""
    control = GOLDEN / "dendritic" / "control_a.txt"
    code = ("import sys\nfrom hydroagent_hpc.cli import main\n"
            f"rc = main(['-q', 'simulate', {str(control)!r}, '--output', {str(tmp_path / 'out')!r}, '--no-cache'])\n"
            "assert rc == 0, rc\nprint('numba' in sys.modules)\n")
    env = {**os.environ, "HYDROAGENT_KERNEL": "c", "PYTHONPATH": pythonpath()}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "False"
    assert (tmp_path / "out").is_dir()


@needs_c
def test_a_repeat_simulate_process_imports_only_what_it_needs(tmp_path):
    """With the caches warm, the drop-in command loads no TIFF reader (parameter grids cached), starts no
    program (the library is found by the compiler file's identity), imports no numba, and asks numpy's
    OpenBLAS for one thread unless the user chose."""
    import shutil

    src = tmp_path / "dendritic"
    shutil.copytree(GOLDEN / "dendritic", src, ignore=shutil.ignore_patterns("expected_*"))
    control_text = (src / "control_a.txt").read_text()
    assert "TIME_STATE=" in control_text
    (src / "control_a.txt").write_text(control_text.replace("TIME_STATE=", "#TIME_STATE="))  # no state grids
    code = ("import sys, os\nsys.argv = ['hydroagent', '-q', 'simulate', sys.argv[1], '--output', sys.argv[2]]\n"
            "from hydroagent_hpc.cli import main\nrc = main()\nassert rc == 0, rc\n"
            "print(sorted(m for m in ('tifffile', 'subprocess', 'numba') if m in sys.modules), "
            "os.environ.get('OPENBLAS_NUM_THREADS'))\n")
    env = {**os.environ, "HYDROAGENT_KERNEL": "c", "PYTHONPATH": pythonpath(),
           "HYDROAGENT_CACHE": str(tmp_path / "cache")}
    env.pop("OPENBLAS_NUM_THREADS", None)
    control = str(src / "control_a.txt")

    def run(extra: dict[str, str]) -> str:
        proc = subprocess.run([sys.executable, "-c", code, control, str(tmp_path / "out")], capture_output=True,
                              text=True, env={**env, **extra}, timeout=300)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip().splitlines()[-1]

    first = run({})
    assert "tifffile" in first  # the first start reads the parameter grids
    assert run({}) == "[] 1"
    assert run({"OPENBLAS_NUM_THREADS": "3"}).endswith(" 3")


def _random_network_args(rng: np.random.Generator, n: int, nt: int, channel_share: float):
    """Kernel arguments for a random network of n cells in routing order (each cell drains to a lower index or
    out), random channel cells, parameters, states and forcing, gauges anywhere (hillslope cells too)."""
    from hydroagent_hpc.sim import kernel

    down = np.array([-1 if i == 0 or rng.random() < 0.05 else int(rng.integers(0, i)) for i in range(n)], np.int64)
    channel = (rng.random(n) < channel_share).astype(np.uint8)
    dx = rng.uniform(500.0, 1500.0, n)
    area = rng.uniform(0.2, 1.5, n) * 1e6
    slope = rng.uniform(0.001, 0.2, n)
    under = rng.uniform(0.5, 5.0, n)
    precip = np.where(rng.random((nt, n)) < 0.3, rng.exponential(4.0, (nt, n)), 0.0)
    pet = rng.uniform(0.0, 0.4, (nt, n))

    def member():
        p = {"wm": rng.uniform(50, 300, n), "b": rng.uniform(0.05, 2.0, n), "im": rng.uniform(0, 0.2, n),
             "ke": rng.uniform(0.5, 1.5, n), "fc": rng.uniform(0.5, 50, n), "w0": rng.uniform(0, 300, n),
             "leaki": rng.uniform(0, 0.5, n), "alpha": rng.uniform(0.1, 3.0, n), "beta": rng.uniform(0.3, 1.0, n),
             "alpha0": np.where(rng.random(n) < 0.1, 0.0, rng.uniform(0.1, 3.0, n)), "ir0": rng.uniform(0, 5, n)}
        tg = kernel.interflow_targets(down, dx, slope, under * rng.uniform(0.5, 2.0), channel.astype(np.bool_), 3600.0)
        return p, tg

    ng = int(rng.integers(1, 4))
    gauges = rng.choice(n, size=min(ng, n), replace=False).astype(np.int64)
    weights = np.where(rng.random((gauges.size, n)) < 0.7, area, 0.0)
    weights /= np.maximum(weights.sum(axis=1, keepdims=True), 1.0)
    pq0, po0 = rng.uniform(0, 3, n), rng.uniform(0, 1, n)
    return precip, pet, member, channel, pq0, po0, down, dx, area, gauges, weights


@needs_c
@pytest.mark.parametrize("seed", range(12))
def test_c_kernel_equals_numba_on_random_small_networks(seed, monkeypatch):
    """Any network in routing order, down to one cell, with no channel cells or nothing but channel cells, gauges
    on hillslope cells, states kept after any step, members with their own interflow targets: the C kernel's run
    and batch (the routing state in slot arrays, a level of every member solved in place) give numba's bits."""
    from hydroagent_hpc.sim import ckernel, kernel

    monkeypatch.setattr(kernels, "_THREADS", 1)
    rng = np.random.default_rng(1000 + seed)
    n = [1, 2, 5, 17, 40, 90][seed % 6]
    nt = int(rng.integers(1, 40))
    share = [0.0, 1.0, 0.3, 0.6][seed % 4]
    precip, pet, member, channel, pq0, po0, down, dx, area, gauges, weights = _random_network_args(rng, n, nt, share)
    members = [member() for _ in range(3)]
    for p, (t0, t1, s0, s1) in members[:1]:
        for state_step in (-1, 0, nt // 2):
            args = (precip, pet, 1.0, _record(channel, **p), channel, pq0, po0, down, dx, area, t0, t1, s0, s1, gauges,
                    weights, state_step)
            got = ckernel.run_kernel(*args)
            want = kernel.run_kernel(*args[:4], channel.astype(np.bool_), *args[5:])
            for a, b in zip(got, want, strict=True):
                assert np.array_equal(a, b, equal_nan=True)
    par = np.stack([_record(channel, **m[0]) for m in members], axis=1)
    tg = [np.stack([m[1][j] for m in members]) for j in range(4)]
    got = ckernel.run_batch_kernel(precip, pet, 1.0, par, channel, pq0, po0, down, dx, area, *tg, gauges, weights)
    for k, (p, (t0, t1, s0, s1)) in enumerate(members):
        want = kernel.run_kernel(precip, pet, 1.0, _record(channel, **p), channel.astype(np.bool_), pq0, po0, down,
                                 dx, area, t0, t1, s0, s1, gauges, weights, -1)
        for j in range(4):
            assert np.array_equal(got[j][k], want[j], equal_nan=True), (k, j)
