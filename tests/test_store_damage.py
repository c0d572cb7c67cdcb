"""A damaged store never hangs and never lies (issue 13, item 2).

Generated damage on a real store written by ``EpisodeWriter``: truncations at many offsets, byte
flips at random places inside every dataset's used bytes and in the HDF5 metadata, and whole
rows (records, strings, series values) overwritten with other plausible rows. Every case is read
back through every public reader in a worker *subprocess* with a per-case timeout, because a hang
inside HDF5 cannot be interrupted from Python. A case's outcome is the worst of:

- ``hang``: the reader did not return within the timeout;
- ``lie``: a reader returned data that differs from what was written, without an error (fewer
  episodes, a changed value);
- ``crash``: an exception that is not one of the store's errors (a traceback for the user);
- ``error``: a :class:`StoreError` with a one-line message (what the fixed code must do when
  the damage touches something a result depends on);
- ``true``: every reader returned exactly what was written (damage in bytes nothing uses).

The harness only uses the public API, so it also measures older code: ``python
tests/test_store_damage.py measure ROOT`` runs the same cases against the package at ``ROOT``
and prints the counts per kind and outcome.
"""

from __future__ import annotations

import json
import os
import random
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

N_EPISODES = 4
CASE_TIMEOUT_S = 20.0
SEVERITY = {"true": 0, "error": 1, "crash": 2, "lie": 3, "hang": 4}


# ---------------------------------------------------------------------------------------------
# Building the store and generating damage (runs in a subprocess with the package under test).


def build_store(path: Path) -> None:
    from helpers.store import basin_of, make_episode
    from hydroagent_hpc.store import EpisodeWriter

    with EpisodeWriter(path) as w:
        for i in range(N_EPISODES):
            w.write(make_episode(i, n_sims=3, n_steps=240), basin_of(i))


def dataset_extents(path: Path) -> dict[str, list[tuple[int, int, int]]]:
    """Per dataset: ``(byte offset, used bytes, first row)`` of each chunk (used = rows it holds)."""
    import h5py

    out: dict[str, list[tuple[int, int, int]]] = {}
    with h5py.File(path, "r") as f:
        def visit(name: str, obj: Any) -> None:
            if not isinstance(obj, h5py.Dataset):
                return
            item, rows, per = obj.dtype.itemsize, obj.shape[0], obj.chunks[0]
            chunks = []
            for i in range(obj.id.get_num_chunks()):
                info = obj.id.get_chunk_info(i)
                first = int(info.chunk_offset[0])
                used = max(0, min(per, rows - first)) * item
                if used:
                    chunks.append((int(info.byte_offset), used, first))
            out[name] = chunks
        f.visititems(visit)
    return out


def row_places(path: Path, name: str) -> list[tuple[int, int]]:
    """``(byte offset, itemsize)`` of every row of dataset ``name``."""
    import h5py

    with h5py.File(path, "r") as f:
        ds = f[name]
        item, per = ds.dtype.itemsize, ds.chunks[0]
        places = []
        for r in range(ds.shape[0]):
            info = ds.id.get_chunk_info_by_coord(((r // per) * per,))
            places.append((int(info.byte_offset) + (r % per) * item, item))
    return places


def generate_cases(pristine: Path, seed: int, n_trunc: int, n_flip: int, n_meta: int) -> list[dict[str, Any]]:
    """Damage cases for ``pristine``: dicts with ``kind`` and ``edits`` (offset, bytes) or ``size``."""
    rng = random.Random(seed)
    size = pristine.stat().st_size
    extents = dataset_extents(pristine)
    data_start = min(off for chunks in extents.values() for off, _, _ in chunks)
    cases: list[dict[str, Any]] = []
    # Truncations: inside the superblock, the metadata, every dataset's used bytes, and near the end.
    cuts = {0, 7, 30, size - 1, size - 4096, data_start // 2}
    used = [(off, n) for chunks in extents.values() for off, n, _ in chunks]
    for off, n in used:
        cuts.add(off + n // 2)
    while len(cuts) < n_trunc:
        cuts.add(rng.randrange(0, size))
    for cut in sorted(cuts)[:max(n_trunc, len(cuts))]:
        cases.append({"kind": "truncate", "size": cut, "where": f"{cut} of {size} bytes"})
    raw = pristine.read_bytes()
    # Byte flips inside used bytes of every dataset (each dataset at least once), then anywhere used.
    names = sorted(n for n, chunks in extents.items() if chunks)
    picks = [(name, rng.choice(extents[name])) for name in names]
    while len(picks) < n_flip:
        name = rng.choice(names)
        picks.append((name, rng.choice(extents[name])))
    for name, (off, n, _) in picks:
        at = off + rng.randrange(n)
        bit = 1 << rng.randrange(8)
        cases.append({"kind": "flip", "edits": [(at, [raw[at] ^ bit])], "where": f"{name} byte {at}"})
    # Flips in the HDF5 metadata (superblock, object headers, chunk indexes) before the first chunk.
    for _ in range(n_meta):
        at = rng.randrange(0, data_start)
        cases.append({"kind": "flip-metadata", "edits": [(at, [raw[at] ^ (1 << rng.randrange(8))])],
                      "where": f"metadata byte {at}"})
    # Whole rows overwritten with another plausible row of the same table (a stale or misplaced write).
    for name in ("sims/rows", "turns/rows", "metrics/rows", "episodes/rows", "basins/rows", "metric_keys/rows"):
        places = row_places(pristine, name)
        for _ in range(3 if len(places) > 2 else 1):
            if len(places) < 2:
                break
            a, b = rng.sample(range(len(places)), 2)
            (at, n), (src, _) = places[a], places[b]
            if raw[at:at + n] == raw[src:src + n]:
                continue
            cases.append({"kind": "overwrite-row", "edits": [(at, list(raw[src:src + n]))],
                          "where": f"{name} row {a} := row {b}"})
    # Series and strings overwritten: discharge, observed and text spans replaced by other values.
    for name in ("series/discharge", "series/observed", "series/times", "sims/text", "turns/text",
                 "episodes/text", "metrics/text"):
        chunks = extents.get(name) or []
        if not chunks:
            continue
        off, n, _ = chunks[0]
        for _ in range(2):
            width = min(n // 2, rng.choice([4, 8, 64]))
            if width <= 0:
                continue
            a = off + rng.randrange(0, n - width)
            b = off + rng.randrange(0, n - width)
            if raw[a:a + width] == raw[b:b + width]:
                continue
            cases.append({"kind": "overwrite-values", "edits": [(a, list(raw[b:b + width]))],
                          "where": f"{name} bytes {a}..{a + width} := {b}.."})
    return cases


def damage(pristine: Path, case: dict[str, Any], out: Path) -> None:
    shutil.copyfile(pristine, out)
    with open(out, "r+b") as fh:
        if case["kind"] == "truncate":
            fh.truncate(case["size"])
        for at, data in case.get("edits", []):
            fh.seek(at)
            fh.write(bytes(data))


# ---------------------------------------------------------------------------------------------
# Probing one damaged file: every reader, compared with what was written.


def snapshot(path: Path) -> dict[str, Any]:
    """Everything the public readers return, in a comparable form."""
    from hydroagent_hpc.store import (
        iter_episodes,
        read_basins,
        read_episodes,
        read_series,
        read_sims,
        read_turns,
        stored_ids,
    )

    out: dict[str, Any] = {"ids": list(stored_ids(path))}
    for name, fn in (("episodes", read_episodes), ("sims", read_sims), ("turns", read_turns), ("basins", read_basins)):
        out[name] = fn(path)
    out["series"] = {eid: read_series(path, eid) for eid in out["ids"]}
    out["loaded"] = {ep.episode_id: ep for ep in iter_episodes(path)}
    return out


def same(a: Any, b: Any) -> bool:
    """Deep equality for frames, arrays, dataclasses (NaN equal to NaN)."""
    import dataclasses
    import math

    import numpy as np
    import pandas as pd

    if isinstance(a, pd.DataFrame):
        if not isinstance(b, pd.DataFrame):
            return False
        try:
            pd.testing.assert_frame_equal(a, b, check_exact=True)
            return True
        except AssertionError:
            return False
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
                and bool(np.array_equal(a, b, equal_nan=a.dtype.kind == "f")))
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return type(a) is type(b) and all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, tuple) and hasattr(a, "_fields"):
        return type(a) is type(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and bool(a == b)


def probe(path: Path, truth: dict[str, Any]) -> dict[str, Any]:
    """Outcome of reading ``path`` with every reader: true, error, crash or lie (and the message)."""
    from hydroagent_hpc.store import StoreError

    try:
        got = snapshot(path)
    except StoreError as exc:
        return {"outcome": "error", "type": type(exc).__name__, "message": str(exc)}
    except Exception as exc:
        return {"outcome": "crash", "type": type(exc).__name__, "message": str(exc)[:300]}
    for key in truth:
        if not same(truth[key], got[key]):
            return {"outcome": "lie", "type": "", "message": f"{key} differs from what was written"}
    return {"outcome": "true", "type": "", "message": ""}


def verify_outcome(path: Path) -> dict[str, Any]:
    """What ``verify_store`` says (new API; absent in older code)."""
    try:
        from hydroagent_hpc.store import verify_store
    except ImportError:
        return {}
    try:
        h = verify_store(path)
    except Exception as exc:
        return {"verify": "raised", "verify_error": f"{type(exc).__name__}: {exc}"[:300]}
    return {"verify": "ok" if h.ok else "damaged", "intact": len(h.intact), "damaged": len(h.damaged)}


def worker(workdir: Path, start: int) -> None:
    """Probe cases ``start..`` of ``workdir/cases.json``; one JSON line per case on stdout."""
    cases = json.loads((workdir / "cases.json").read_text())
    pristine = workdir / "pristine.h5"
    truth = snapshot(pristine)
    for k in range(start, len(cases)):
        target = workdir / f"case-{k}.h5"
        damage(pristine, cases[k], target)
        print(json.dumps({"case": k, "started": True}), flush=True)
        result = probe(target, truth)
        result.update(verify_outcome(target))
        target.unlink(missing_ok=True)
        print(json.dumps({"case": k, **result}), flush=True)


# ---------------------------------------------------------------------------------------------
# The parent: prepare in a subprocess, run workers, restart after a hang.


def _env(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(TESTS)])
    return env


def prepare(root: Path, workdir: Path, seed: int, n_trunc: int, n_flip: int, n_meta: int) -> int:
    code = (f"import sys; sys.path[:0] = [{str(root)!r}, {str(TESTS)!r}]; from pathlib import Path; "
            f"import test_store_damage as d; w = Path({str(workdir)!r}); d.build_store(w / 'pristine.h5'); "
            f"import json; cases = d.generate_cases(w / 'pristine.h5', {seed}, {n_trunc}, {n_flip}, {n_meta}); "
            f"(w / 'cases.json').write_text(json.dumps(cases)); print(len(cases))")
    out = subprocess.run([sys.executable, "-c", code], env=_env(root), capture_output=True, text=True, timeout=300,
                         cwd=workdir)
    assert out.returncode == 0, out.stderr[-3000:]
    return int(out.stdout.strip().splitlines()[-1])


def run_cases(root: Path, workdir: Path, n_cases: int, timeout_s: float = CASE_TIMEOUT_S) -> list[dict[str, Any]]:
    """Every case's result; a case that does not finish within ``timeout_s`` is a ``hang``."""
    results: dict[int, dict[str, Any]] = {}
    start = 0
    cases = json.loads((workdir / "cases.json").read_text())
    while start < n_cases:
        code = (f"import sys; sys.path[:0] = [{str(root)!r}, {str(TESTS)!r}]; from pathlib import Path; "
                f"import test_store_damage as d; d.worker(Path({str(workdir)!r}), {start})")
        proc = subprocess.Popen([sys.executable, "-c", code], env=_env(root), stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True, cwd=workdir)
        assert proc.stdout is not None
        current, deadline = None, time.monotonic() + 120  # startup and the pristine snapshot
        try:
            while True:
                ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
                if not ready:  # the case in progress hangs (or the worker cannot start)
                    proc.kill()
                    proc.wait()
                    k = start if current is None else current
                    results[k] = {"case": k, "outcome": "hang", "type": "", "message": f"no answer in {timeout_s} s"}
                    start = k + 1
                    break
                line = proc.stdout.readline()
                if not line:
                    proc.wait()
                    k = start if current is None else current
                    if k < n_cases and k not in results:
                        results[k] = {"case": k, "outcome": "crash", "type": "exit",
                                      "message": f"worker exited with {proc.returncode}"}
                    start = max(start, k + 1)
                    break
                msg = json.loads(line)
                if msg.get("started"):
                    current, deadline = msg["case"], time.monotonic() + timeout_s
                    continue
                results[msg["case"]] = msg
                start = msg["case"] + 1
                current, deadline = None, time.monotonic() + timeout_s
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return [{**cases[k], **results[k]} for k in range(n_cases)]


def tally(results: list[dict[str, Any]]) -> dict[str, Counter[str]]:
    out: dict[str, Counter[str]] = {}
    for r in results:
        out.setdefault(r["kind"], Counter())[r["outcome"]] += 1
    return out


def measure(root: Path, seed: int = 13, n_trunc: int = 40, n_flip: int = 80, n_meta: int = 20,
            timeout_s: float = CASE_TIMEOUT_S) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="store-damage-") as tmp:
        work = Path(tmp)
        n = prepare(root, work, seed, n_trunc, n_flip, n_meta)
        return run_cases(root, work, n, timeout_s)


# ---------------------------------------------------------------------------------------------
# The tests.


@pytest.mark.slow
def test_generated_damage_never_hangs_never_lies(tmp_path: Path) -> None:
    n = prepare(ROOT, tmp_path, seed=13, n_trunc=24, n_flip=40, n_meta=12)
    assert n >= 90, n  # truncations, flips in every dataset and the metadata, overwritten rows and values
    results = run_cases(ROOT, tmp_path, n)
    counts = tally(results)
    print("store damage cases:", {k: dict(v) for k, v in counts.items()})
    bad = [r for r in results if r["outcome"] in ("hang", "lie", "crash")]
    assert not bad, "\n".join(f"{r['kind']} {r['where']}: {r['outcome']} {r['type']} {r['message']}" for r in bad[:10])
    for r in results:
        where = f"{r['kind']} {r['where']}"
        assert r.get("verify") in ("ok", "damaged"), f"{where}: verify_store {r.get('verify_error')}"
        if r["outcome"] == "error":
            assert "\n" not in r["message"] and str(tmp_path) in r["message"], f"{where}: {r['message']!r}"
            if r["type"] == "CorruptStoreError":
                assert "intact" in r["message"] and "hydroagent store verify" in r["message"], where
                assert r["verify"] == "damaged", f"{where}: the reader refused it but verify found nothing"
        else:  # every reader returned exactly what was written: the damage hit no byte in use
            assert r["verify"] == "ok" and r["intact"] == N_EPISODES, f"{where}: {r}"
    # Truncation always loses data; every overwritten row or value is something a result depends on.
    for r in results:
        if r["kind"] in ("truncate", "overwrite-row", "overwrite-values"):
            assert r["outcome"] == "error", f"{r['kind']} {r['where']}: {r['outcome']}"
    assert counts["flip"]["error"] >= 0.8 * sum(counts["flip"].values())


def _damaged_copy(tmp_path: Path, name: str) -> tuple[Path, list[str]]:
    """A store of 4 episodes with episode 1's discharge overwritten (a plausible but wrong series)."""
    sys.path.insert(0, str(TESTS))
    path = tmp_path / name
    build_store(path)
    places = row_places(path, "series/discharge")
    from hydroagent_hpc.store import read_sims, stored_ids

    ids = stored_ids(path)
    sims = read_sims(path)
    first = int(sims.loc[sims["episode_id"] == ids[1], "n_steps"].dropna().iloc[0])
    offset = sum(int(n) for n in sims.loc[sims["episode_id"] == ids[0], "n_steps"].dropna())
    at, item = places[offset + first // 2]
    with open(path, "r+b") as fh:
        fh.seek(at)
        fh.write(b"\x00\x00\x80\x3f" * 4)  # 1.0f, four times: plausible discharge values
    return path, ids


def test_overwritten_discharge_is_named_and_the_rest_is_intact(tmp_path: Path) -> None:
    from hydroagent_hpc.errors import HydroAgentError
    from hydroagent_hpc.store import (
        CorruptStoreError,
        StoreError,
        load_episode,
        read_episodes,
        read_series,
        salvage,
        stored_ids,
        verify_store,
    )

    path, ids = _damaged_copy(tmp_path, "q.h5")
    assert issubclass(CorruptStoreError, StoreError) and issubclass(CorruptStoreError, HydroAgentError)
    assert stored_ids(path) == ids and len(read_episodes(path)) == 4  # episode records are intact
    with pytest.raises(CorruptStoreError) as info:
        read_series(path, ids[1])
    msg = str(info.value)
    assert "\n" not in msg and f"{ids[1]!r} (its discharge fails its checksum)" in msg, msg
    assert "3 committed episode(s) intact" in msg and repr(ids[0]) in msg, msg
    assert info.value.damaged == (ids[1],) and info.value.intact == (ids[0], ids[2], ids[3])
    load_episode(path, ids[0])  # the intact episodes still load
    with pytest.raises(CorruptStoreError, match="discharge fails its checksum"):
        load_episode(path, ids[1])
    health = verify_store(path)
    assert not health.ok and health.damaged == {ids[1]: "its discharge fails its checksum"}
    assert health.intact == (ids[0], ids[2], ids[3])
    out = tmp_path / "saved.h5"
    assert salvage(path, out).damaged == health.damaged
    assert stored_ids(out) == [ids[0], ids[2], ids[3]] and verify_store(out).ok


def test_cli_store_verify_lists_damage_and_exits_nonzero(tmp_path: Path) -> None:
    good = tmp_path / "good.h5"
    sys.path.insert(0, str(TESTS))
    build_store(good)
    bad, ids = _damaged_copy(tmp_path, "bad.h5")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "hydroagent_hpc.cli", "store", *args], env=_env(ROOT),
                              capture_output=True, text=True, timeout=120)

    ok = cli("verify", str(good))
    assert ok.returncode == 0, ok.stderr
    assert f"intact: {N_EPISODES} of {N_EPISODES} committed episodes" in ok.stdout
    res = cli("verify", str(bad))
    assert res.returncode == 1, (res.stdout, res.stderr)
    assert f"DAMAGED {ids[1]}: its discharge fails its checksum" in res.stdout, res.stdout
    assert all(f"intact  {i}" in res.stdout for i in (ids[0], ids[2], ids[3])), res.stdout
    assert "Traceback" not in res.stderr
    as_json = cli("verify", "--json", str(bad))
    report = json.loads(as_json.stdout)
    assert as_json.returncode == 1 and report["damaged"] == {ids[1]: "its discharge fails its checksum"}
    saved = tmp_path / "saved.h5"
    res = cli("salvage", str(bad), str(saved))
    assert res.returncode == 0 and "copied 3 intact episodes" in res.stdout, (res.stdout, res.stderr)
    assert cli("verify", str(saved)).returncode == 0
    cut = tmp_path / "cut.h5"
    shutil.copyfile(good, cut)
    os.truncate(cut, good.stat().st_size // 2)
    res = cli("verify", str(cut))
    assert res.returncode == 1 and "truncated" in res.stdout and "Traceback" not in res.stderr, res
    res = cli("verify", str(tmp_path / "missing.h5"))
    assert res.returncode == 2 and "missing.h5" in res.stderr


def test_campaign_resume_refuses_a_damaged_store(tmp_path: Path) -> None:
    """``stored_ids`` (what a resumed campaign skips) and the writer fail clearly, never rerun or skip."""
    from hydroagent_hpc.store import CorruptStoreError, EpisodeWriter, stored_ids

    sys.path.insert(0, str(TESTS))
    path = tmp_path / "resume.h5"
    build_store(path)
    places = row_places(path, "episodes/rows")
    at, item = places[2]
    with open(path, "r+b") as fh:
        fh.seek(at + 3)
        byte = fh.read(1)
        fh.seek(at + 3)
        fh.write(bytes([byte[0] ^ 0x10]))
    for call in (lambda: stored_ids(path), lambda: EpisodeWriter(path)):
        with pytest.raises(CorruptStoreError, match=r"1 episode\(s\) damaged: record 2 .*fails its checksum.*3 "
                                                    r"committed episode\(s\) intact"):
            call()
    assert not (tmp_path / "resume.h5.lock").exists()


def test_truncated_store_fails_fast_in_a_subprocess(tmp_path: Path) -> None:
    """The exact report of issue 13: a truncated store made every reader wait forever."""
    sys.path.insert(0, str(TESTS))
    path = tmp_path / "cut.h5"
    build_store(path)
    size = path.stat().st_size
    code = ("import sys; from hydroagent_hpc.store import stored_ids, StoreError\n"
            "try:\n    stored_ids(sys.argv[1])\nexcept StoreError as e:\n    print(type(e).__name__, e)\n")
    for cut in (size // 20, size // 2, size - 100):
        os.truncate(path, cut)
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, "-c", code, str(path)], env=_env(ROOT), capture_output=True, text=True,
                             timeout=60)
        assert time.monotonic() - t0 < 30 and out.returncode == 0, out.stderr
        assert out.stdout.startswith("CorruptStoreError") and f"{cut:,} of its {size:,} bytes" in out.stdout


def test_campaign_run_stops_on_a_damaged_store(tmp_path: Path, small_basin_dir: Path) -> None:
    """``hydroagent campaign run`` into a damaged store: one line, exit 2, nothing rerun or written."""
    from hydroagent_hpc.store import stored_ids

    cfile = tmp_path / "c.yaml"
    cfile.write_text(f"name: t\nbasins: [{small_basin_dir}]\nagents:\n  - {{name: heuristic, kind: heuristic}}\n"
                     "seeds: [0, 1, 2]\nenv: {preset: paper, max_simulations: 4, max_turns: null, patience: null, "
                     "target_nse: 0.99}\n")
    out = tmp_path / "c.h5"
    cmd = [sys.executable, "-m", "hydroagent_hpc.cli", "-q", "campaign", "run", str(cfile), "--out", str(out),
           "--no-progress", "--limit", "2"]
    first = subprocess.run(cmd, env=_env(ROOT), capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    ids = stored_ids(out)
    assert len(ids) == 2
    at, item = row_places(out, "episodes/rows")[1]
    with open(out, "r+b") as fh:  # one flipped bit in the second episode's record
        fh.seek(at + item // 2)
        b = fh.read(1)
        fh.seek(at + item // 2)
        fh.write(bytes([b[0] ^ 0x04]))
    before = out.read_bytes()
    again = subprocess.run(cmd[:-2], env=_env(ROOT), capture_output=True, text=True, timeout=300)
    assert again.returncode == 2, (again.stdout, again.stderr)
    lines = [ln for ln in again.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "damaged store" in lines[0] and "record 1" in lines[0], again.stderr
    assert f"1 committed episode(s) intact ({ids[0]!r})" in lines[0], lines[0]
    assert out.read_bytes() == before  # nothing rerun, nothing appended


def test_schema_1_stores_are_refused_clearly(tmp_path: Path) -> None:
    import h5py

    from hydroagent_hpc.store import EpisodeWriter, SchemaError, read_episodes

    sys.path.insert(0, str(TESTS))
    path = tmp_path / "v1.h5"
    build_store(path)
    with h5py.File(path, "r+") as f:
        f.attrs["schema_version"] = 1
    for call in (lambda: read_episodes(path), lambda: EpisodeWriter(path)):
        with pytest.raises(SchemaError, match=r"v1.h5: episode store schema version 1 .older.*carry no checksums.*"
                                              r"reads version 2"):
            call()


if __name__ == "__main__":  # python tests/test_store_damage.py measure ROOT [timeout_s]
    if len(sys.argv) >= 3 and sys.argv[1] == "measure":
        timeout = float(sys.argv[3]) if len(sys.argv) > 3 else CASE_TIMEOUT_S
        res = measure(Path(sys.argv[2]).resolve(), timeout_s=timeout)
        print(json.dumps({k: dict(v) for k, v in tally(res).items()}, indent=1))
        print("total", len(res), dict(Counter(r["outcome"] for r in res)))
        for r in res:
            if r["outcome"] in ("hang", "lie", "crash"):
                print(r["kind"], r["where"], r["outcome"], r["type"], r["message"][:150])
    else:
        print(__doc__)
