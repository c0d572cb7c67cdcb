"""One parameter record on the hot path (issue 31 item 4).

A parameter set is validated once, where it enters (a tool call, or a simulator's run from outside), and then
travels as a :class:`~hydroagent_hpc.params.ParamValues` that only validation makes; the kernels take one
float64 record whose field order is defined once (:data:`hydroagent_hpc.sim.record.NODE_FIELDS`) and checked
in the numba kernel (at import) and the C kernel (when the library loads).
"""

from __future__ import annotations

import importlib.util
import math
import re
import subprocess

import numpy as np
import pytest

from helpers.ckernel import needs_c
from hydroagent_hpc import params as params_mod
from hydroagent_hpc.config import preset
from hydroagent_hpc.env import toolcalls
from hydroagent_hpc.env.environment import CalibrationEnv
from hydroagent_hpc.params import ParamValues, check_values
from hydroagent_hpc.sim import embedded
from hydroagent_hpc.sim.basin import load_basin
from hydroagent_hpc.sim.record import N_FIELDS, NODE_FIELDS, NodeParams


# ----------------------------------------------------------------------------- one order, checked everywhere
def _swapped(names: tuple[str, ...], a: str, b: str) -> tuple[str, ...]:
    return tuple(b if n == a else a if n == b else n for n in names)


def test_the_numba_kernel_holds_the_same_order_and_refuses_another():
    """kernel.py writes the order out (numba's cache is keyed on that file) and compares it with NODE_FIELDS at
    import: the same source with two fields swapped does not import."""
    from hydroagent_hpc.sim import kernel

    assert kernel._NODE_FIELDS == NODE_FIELDS
    assert [kernel._WM, kernel._ALPHA0] == [NODE_FIELDS.index("wm"), NODE_FIELDS.index("alpha0")]
    src = open(kernel.__file__).read()
    literal = re.search(r"^_NODE_FIELDS = \((.*?)\)$", src, re.M | re.S)
    assert literal is not None
    swapped = literal.group(0).replace('"alpha", "beta"', '"beta", "alpha"')
    assert swapped != literal.group(0)
    spec = importlib.util.spec_from_loader("kernel_swapped", loader=None)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    with pytest.raises(ImportError, match="not hydroagent_hpc.sim.record.NODE_FIELDS"):
        exec(compile(src.replace(literal.group(0), swapped), "kernel_swapped.py", "exec"), module.__dict__)


@needs_c
def test_the_c_struct_matches_the_record_and_a_permuted_one_is_refused(tmp_path):
    """The loaded library's hak_node_params has NODE_FIELDS' names in order and the ctypes struct's size; a
    ctypes side or a C side with two fields swapped is refused when the library loads."""
    import ctypes

    from hydroagent_hpc.sim import ckernel

    lib = ckernel.load()
    ckernel.check_record(lib)  # the library in use agrees
    assert tuple(lib.hak_node_params_fields().decode().split()) == NODE_FIELDS
    assert lib.hak_node_params_size() == ctypes.sizeof(ckernel.NodeParamsStruct) == N_FIELDS * ctypes.sizeof(
        ctypes.c_void_p)
    assert [f[0] for f in ckernel.NodeParamsStruct._fields_] == list(NODE_FIELDS)
    with pytest.raises(ckernel.KernelRecordMismatch, match="hak_node_params"):  # ctypes permuted
        ckernel.check_record(lib, _swapped(NODE_FIELDS, "wm", "fc"))
    with pytest.raises(ckernel.KernelRecordMismatch, match="hak_node_params"):  # one field missing
        ckernel.check_record(lib, NODE_FIELDS[:-1])
    src = ckernel.SOURCE.read_text()
    assert "X(wm) X(b) X(im)" in src
    permuted = tmp_path / "permuted.c"
    permuted.write_text(src.replace("X(wm) X(b) X(im)", "X(b) X(wm) X(im)"))
    so = tmp_path / "permuted.so"
    cmd = [ckernel.compiler(), *ckernel.FLAGS, "-o", str(so), str(permuted), "-lm"]
    subprocess.run(cmd, check=True, capture_output=True)
    with pytest.raises(ckernel.KernelRecordMismatch, match=r"is \('b', 'wm'"):  # C permuted
        ckernel.declare(ctypes.CDLL(str(so)))


@needs_c
def test_a_record_of_the_wrong_shape_never_reaches_the_c_kernel():
    from hydroagent_hpc.sim import ckernel

    n = 3
    with pytest.raises(ValueError, match="parameter record has shape"):
        ckernel.run_kernel(np.ones((2, n)), np.zeros((2, n)), 1.0, np.ones((N_FIELDS - 1, n)), np.zeros(n, np.uint8),
                           np.zeros(n), np.zeros(n), np.array([-1, 0, 1]), np.ones(n), np.ones(n),
                           *(np.full(n, -1), np.full(n, -1), np.zeros(n), np.zeros(n)), np.array([0]),
                           np.ones((1, n)), -1)


def test_node_params_reads_its_rows_by_name():
    n = 4
    fields = {k: np.full(n, float(i)) for i, k in enumerate(NODE_FIELDS)}
    rec = NodeParams.of(np.zeros(n, bool), **fields)
    assert rec.values.shape == (N_FIELDS, n) and rec.values.flags.c_contiguous
    assert all(np.array_equal(getattr(rec, k), fields[k]) for k in NODE_FIELDS)
    with pytest.raises(ValueError, match="missing fields"):
        NodeParams.of(np.zeros(n, bool), **{k: v for k, v in fields.items() if k != "ir0"})
    with pytest.raises(AttributeError):
        _ = rec.th


# ----------------------------------------------------------------------------- validated once
def test_only_validation_makes_a_record_and_it_is_read_only():
    with pytest.raises(TypeError, match="only by validation"):
        ParamValues({"wm": float("nan")})
    rec = check_values({"WM": 2, "alpha": 1.5})
    assert isinstance(rec, ParamValues) and rec == {"wm": 2.0, "alpha": 1.5}
    assert check_values(rec) is rec  # trusted, not checked again
    with pytest.raises(TypeError, match="read-only"):
        rec["wm"] = float("nan")  # type: ignore[index]
    with pytest.raises(TypeError, match="read-only"):
        rec.update(wm=float("nan"))
    copy = {**rec, "wm": float("nan")}  # a changed copy is a plain dict, validated (and refused) again
    with pytest.raises(ValueError, match="wm must be finite"):
        check_values(copy)
    snow = check_values({"scf": 1.1}, snow=True)
    with pytest.raises(ValueError, match="a Snow-17 parameter: the task has no SNOW=SNOW17"):
        check_values(snow)  # a simulator without snow validates a snow record again, and refuses it


class _Counter:
    def __init__(self, fn):
        self.fn, self.n = fn, 0

    def __call__(self, *a, **k):
        self.n += 1
        return self.fn(*a, **k)


def test_a_tool_call_is_validated_once_and_the_run_trusts_the_record(small_basin_dir, small_sim, monkeypatch):
    """set_parameters then run_simulation: the call's arguments are checked once (validate_arguments makes the one
    record); the environment, the simulator's run and its result take that record without checking it again,
    and the kernel gets it."""
    env = CalibrationEnv(load_basin(small_basin_dir), small_sim, preset("paper", target_nse=0.999), agent="test")
    checks = _Counter(params_mod._check_values)
    made = _Counter(ParamValues._validated.__func__)  # type: ignore[attr-defined]
    validate = _Counter(toolcalls.validate_arguments)
    monkeypatch.setattr(params_mod, "_check_values", checks)
    monkeypatch.setattr(ParamValues, "_validated", classmethod(made))
    monkeypatch.setattr(toolcalls, "validate_arguments", validate)
    seen = []
    real = small_sim.node_params

    def node_params(p=None):
        seen.append(p)
        return real(p)

    monkeypatch.setattr(small_sim, "node_params", node_params)
    obs = env.set_parameters(wm=1.5, alpha0=0.4)
    assert obs["status"] == "ok" and (validate.n, made.n, checks.n) == (1, 1, 0)
    obs = env.run_simulation()
    assert obs["status"] == "ok", obs
    assert (made.n, checks.n) == (1, 0)  # nothing validated again on the way to the kernel
    assert len(seen) == 1 and seen[0] is env.params and isinstance(seen[0], ParamValues)
    assert env.sims[-1].params["wm"] == 1.5


def test_a_run_from_outside_is_validated_once_and_bad_values_never_reach_the_kernel(small_sim, monkeypatch):
    checks = _Counter(params_mod._check_values)
    monkeypatch.setattr(params_mod, "_check_values", checks)
    res = small_sim.run({"wm": 1.2, "alpha0": 0.5})
    assert checks.n == 1 and res.params["wm"] == 1.2
    batch = small_sim.run_batch([{"wm": 1.2}, {"wm": 0.9}])
    assert checks.n == 3 and [r.params["wm"] for r in batch] == [1.2, 0.9]
    rec = check_values({"wm": 1.2, "alpha0": 0.5})
    n = checks.n
    assert np.array_equal(small_sim.run(rec).discharge, res.discharge) and checks.n == n  # a record: no check

    def no_kernel():
        raise AssertionError("an unvalidated parameter set reached the kernel")

    monkeypatch.setattr(embedded, "kernel", no_kernel)
    for bad, msg in (({"wm": math.nan}, "wm must be finite"), ({"wm": "2"}, "wm must be a number"),
                     ({"bogus": 1.0}, "unknown parameter 'bogus'"), ({"scf": 1.0}, "Snow-17 parameter")):
        with pytest.raises(ValueError, match=msg):
            small_sim.run(bad)
        with pytest.raises(ValueError, match=msg):
            small_sim.run_batch([{"wm": 1.0}, bad])
