"""The HDF5 episode store: round trips, readers, resume, merge and crash safety (killed writers).

Episodes come from a small deterministic factory (``make_episode(i)``), so a child process can
write them and the test can rebuild exactly what it wrote.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hydroagent_hpc.params import PARAM_NAMES
from hydroagent_hpc.store import (
    SCHEMA_VERSION,
    DuplicateEpisodeError,
    EpisodeNotFoundError,
    EpisodeWriter,
    MergeError,
    SchemaError,
    StoreLockedError,
    inspect_store,
    iter_episodes,
    load_episode,
    merge,
    read_basins,
    read_episodes,
    read_series,
    read_sims,
    read_turns,
    stored_ids,
)
from hydroagent_hpc.types import Episode

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

from helpers.store import (  # noqa: E402
    CRASH_SIZES,
    N_BASINS,
    UNICODE,
    assert_episode_equal,
    basin_of,
    episode_id,
    make_episode,
)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    path = tmp_path / "campaign.h5"
    with EpisodeWriter(path) as w:
        for i in range(6):
            w.write(make_episode(i), basin_of(i))
    return path


def test_round_trip_field_by_field(store: Path) -> None:
    for i in range(6):
        assert_episode_equal(make_episode(i), load_episode(store, episode_id(i)))
    got = list(iter_episodes(store, batch_size=4))
    assert [e.episode_id for e in got] == [episode_id(i) for i in range(6)]
    for i, e in enumerate(got):
        assert_episode_equal(make_episode(i), e)


def test_edge_episodes_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "edge.h5"
    bare = Episode(episode_id="bare", basin_id="x", agent="a", preset="p", protocol="q", seed=0, config={})
    no_sims = make_episode(1, n_sims=0, n_turns=3)
    no_turns = make_episode(2, n_sims=2, n_turns=0)
    big = make_episode(3)
    big.turns[0].text = UNICODE * 20000  # ~1 MB of text
    big.turns[1].observation = {"blob": "x" * 300_000, "nan": math.nan, "inf": -math.inf}
    f64 = make_episode(4, n_sims=1)
    f64.sims[0].discharge = f64.sims[0].discharge.astype(np.float64) + 1e-9  # stored as float32
    with EpisodeWriter(path) as w:
        for ep in (bare, no_sims, no_turns, big, f64):
            w.write(ep)
    for ep in (bare, no_sims, no_turns, big):
        assert_episode_equal(ep, load_episode(path, ep.episode_id))
    q = load_episode(path, f64.episode_id).sims[0].discharge
    assert q.dtype == np.float32 and np.allclose(q, f64.sims[0].discharge, rtol=1e-6)
    assert len(read_turns(path).query("episode_id == 'bare'")) == 0
    s = read_series(path, "bare")
    assert s.times is None and s.observed is None and s.discharge.shape == (0, 0) and s.run_ids == ()


def test_read_episodes_frame(store: Path) -> None:
    df = read_episodes(store)
    assert len(df) == 6 and list(df["episode_id"]) == [episode_id(i) for i in range(6)]
    for col in ("episode_id", "basin_id", "agent", "preset", "protocol", "seed", "best_nse", "best_run",
                "stop_reason", "terminal_reward", "total_reward", "wall_time_s", "n_turns", "n_sims",
                "counters.turns", "counters.parse_failures", "usage.tokens.prompt", "usage.cost_usd", "usage.model",
                "terminal_terms.best_nse", "config", "provenance", "best_params"):
        assert col in df.columns, col
    assert df["seed"].dtype == np.int64 and df["best_nse"].dtype == np.float64
    assert str(df["best_run"].dtype) == "Int64" and df["best_run"].isna().sum() == 1  # episode 3
    assert np.isnan(df.loc[3, "best_nse"])
    eps = [make_episode(i) for i in range(6)]
    assert np.allclose(df["total_reward"], [e.total_reward for e in eps])
    assert list(df["usage.tokens.prompt"]) == [1000 + i for i in range(6)]
    assert list(df["n_sims"]) == [3] * 6


def test_read_sims_frame(store: Path) -> None:
    df = read_sims(store)
    eps = [make_episode(i) for i in range(6)]
    assert len(df) == sum(len(e.sims) for e in eps)
    assert list(df.columns[:7]) == ["episode_id", "run_id", "ok", "error", "wall_time_s", "evaluated", "round"]
    assert all(p in df.columns for p in PARAM_NAMES)
    assert df["ok"].dtype == bool and str(df["round"].dtype) == "Int64"
    assert df["NSE"].dtype == np.float64 and str(df["n_points"].dtype) == "Int64"
    assert str(df["flagged"].dtype) == "boolean" and df["bfi_passes"].dtype.name == "Int64"
    row = df[(df.episode_id == episode_id(0)) & (df.run_id == 0)].iloc[0]
    src = eps[0].sims[0]
    assert row["NSE"] == src.metrics["NSE"] and np.isnan(row["logNSE"]) and row["nse_band"] == "unsatisfactory"
    assert row["reasons"] == {"logNSE": "too few points"} and np.isnan(row["missing"])  # all-None: NaN
    for p in PARAM_NAMES:
        assert (row[p] == src.params[p]) if p in src.params else np.isnan(row[p])
    failed = df[(df.episode_id == episode_id(1)) & (df.run_id == 1)].iloc[0]
    assert not failed["ok"] and failed["error"] == "EF5 exited with 139" and pd.isna(failed["n_steps"])
    assert np.isnan(failed["NSE"])
    assert df.loc[df.run_id == 2, "extra_params"].map(lambda s: s == '{"custom_knob":3}').all()


def test_read_turns_frame(store: Path) -> None:
    df = read_turns(store)
    assert len(df) == 6 * 7
    assert list(df.columns) == ["episode_id", "index", "message_index", "kind", "tool", "arguments", "observation",
                                "reward", "reward_terms", "ok", "error", "run_id", "text", "started_s", "duration_s"]
    t0 = make_episode(0).turns[0]
    r = df.iloc[0]
    assert r["text"] == t0.text and r["tool"] == t0.tool and r["reward"] == t0.reward
    assert str(df["run_id"].dtype) == "Int64" and pd.api.types.is_string_dtype(df["text"])
    pf = df[df.kind == "parse_failure"]
    assert pf["arguments"].isna().all() and pf["tool"].isna().all() and (pf["error"] != "").all()


def test_series_and_basins(store: Path) -> None:
    ep = make_episode(4)
    s = read_series(store, ep.episode_id)
    assert s.run_ids == (0, 1, 2) and s.discharge.shape == (3, 1440) and s.discharge.dtype == np.float32
    assert np.array_equal(s.times, ep.times) and s.times.dtype == np.dtype("datetime64[m]")
    assert np.array_equal(s.observed, ep.observed, equal_nan=True) and np.array_equal(s.warmup, ep.warmup)
    one = read_series(store, ep.episode_id, run_id=2)
    assert np.array_equal(one.discharge, ep.sims[2].discharge) and one.run_ids == (2,)
    with pytest.raises(KeyError):
        read_series(store, episode_id(1), run_id=1)  # the failed run kept no discharge
    b = read_basins(store)
    assert len(b) == N_BASINS and list(b["n_episodes"]) == [2, 2, 2]
    assert list(b["basin_id"]) == [f"0233866{k}" for k in range(N_BASINS)]
    assert b.loc[1, "notes"] == UNICODE and b.loc[0, "paper_gauge_id"] == "02338660"
    assert (b["n_steps"] == 1440).all() and (b["n_warmup"] == 240).all()
    assert b.loc[0, "start"] == np.datetime64("2020-01-01T01:00")


def test_observed_stored_once_per_basin(tmp_path: Path) -> None:
    path = tmp_path / "many.h5"
    with EpisodeWriter(path) as w:
        for i in range(30):
            w.write(make_episode(i, n_sims=1, n_turns=1), basin_of(i))
    with h5py.File(path, "r") as f:
        assert f["series/observed"].shape == (N_BASINS * 1440,)
        assert f["series/times"].shape == (N_BASINS * 1440,)
        assert f["basins/rows"].shape == (N_BASINS,)
    # Without a Basin the same series makes a second record (its digest includes the Basin fields).
    with EpisodeWriter(path) as w:
        w.write(make_episode(30, n_sims=1, n_turns=1))
    assert len(read_basins(path)) == N_BASINS + 1


def test_resume_and_duplicates(tmp_path: Path) -> None:
    path = tmp_path / "resume.h5"
    with EpisodeWriter(path) as w:
        for i in range(3):
            w.write(make_episode(i))
        assert w.has(episode_id(2)) and not w.has(episode_id(3)) and len(w) == 3
        with pytest.raises(DuplicateEpisodeError, match="already stored"):
            w.write(make_episode(1))
        w.write(make_episode(3))  # the writer still works after the refused write
    with EpisodeWriter(path, durable=True) as w:  # fsync after each commit
        assert w.stored_ids == [episode_id(i) for i in range(4)]
        with pytest.raises(DuplicateEpisodeError):
            w.write(make_episode(0))
        for i in range(6):
            if not w.has(episode_id(i)):
                w.write(make_episode(i))
    assert stored_ids(path) == [episode_id(i) for i in range(6)]
    info = inspect_store(path)
    assert info.closed_cleanly and info.episodes == 6 and not any(info.orphan_rows.values())


def test_failed_write_leaves_no_trace(tmp_path: Path) -> None:
    path = tmp_path / "bad.h5"
    bad = make_episode(1)
    bad.config = {"not json": object()}
    no_index = make_episode(3)
    no_index.turns[0].index = None
    bad_param = make_episode(4)
    bad_param.sims[0].params = {"wm": "wet"}
    with EpisodeWriter(path) as w:
        w.write(make_episode(0))
        with pytest.raises(TypeError, match="ep-00001: config: cannot store as JSON"):
            w.write(bad)
        with pytest.raises(ValueError, match="episode ep-00003: turns.index may not be None"):
            w.write(no_index)
        with pytest.raises(TypeError, match="ep-00004 sim 0: parameter wm must be a number"):
            w.write(bad_param)
        with pytest.raises(ValueError, match="basin '02338661' is not the episode's basin '02338660'"):
            w.write(make_episode(3), basin_of(1))
        w.write(make_episode(2))
    assert stored_ids(path) == [episode_id(0), episode_id(2)]
    assert not any(inspect_store(path).orphan_rows.values())


def test_io_error_at_commit_leaves_orphans_that_merge_drops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hydroagent_hpc.store.writer import Appender
    path = tmp_path / "io.h5"
    original, failures = Appender._append, []

    def failing(self: Appender, name: str, *args: object) -> None:
        if name == "episodes/rows" and failures:
            failures.clear()
            raise OSError(28, "No space left on device (simulated)")
        original(self, name, *args)

    monkeypatch.setattr(Appender, "_append", failing)
    with EpisodeWriter(path) as w:
        w.write(make_episode(0))
        failures.append(True)  # the next commit record fails
        with pytest.raises(OSError, match="No space"):
            w.write(make_episode(1))
        assert not w.has(episode_id(1))
        w.write(make_episode(2))
        w.write(make_episode(1))  # the retry succeeds
    assert stored_ids(path) == [episode_id(0), episode_id(2), episode_id(1)]
    info = inspect_store(path)
    assert info.orphan_rows["turns"] == 7 and info.orphan_rows["sims"] == 3
    for i in range(3):
        assert_episode_equal(make_episode(i), load_episode(path, episode_id(i)))
    assert merge([path], tmp_path / "merged.h5") == 3
    assert not any(inspect_store(tmp_path / "merged.h5").orphan_rows.values())


_ANY_TEXT = st.text(st.characters(blacklist_categories=()), max_size=30)  # surrogates and controls too
_METRIC_VALUES = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-2 ** 70, 2 ** 70),
                           st.booleans(), st.none(), _ANY_TEXT,
                           st.dictionaries(_ANY_TEXT, st.one_of(st.integers(-10, 10), _ANY_TEXT), max_size=3))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(metrics=st.dictionaries(_ANY_TEXT, _METRIC_VALUES, max_size=8), text=_ANY_TEXT,
       args=st.dictionaries(_ANY_TEXT, st.one_of(st.floats(allow_nan=False), _ANY_TEXT), max_size=4))
@example(metrics={"\ud800": "\udfff"}, text="\ud800", args={"x": "\udc80"})  # lone surrogates (pyarrow refuses them)
def test_any_values_round_trip(tmp_path: Path, metrics: dict, text: str, args: dict) -> None:
    ep = make_episode(0, n_sims=1, n_steps=16, n_turns=1)
    ep.episode_id = f"h-{len(list(tmp_path.glob('*.h5')))}"
    ep.sims[0].metrics = metrics
    ep.turns[0].text, ep.turns[0].arguments, ep.stop_reason = text, args, text
    path = tmp_path / f"{ep.episode_id}.h5"
    with EpisodeWriter(path) as w:
        w.write(ep)
    assert_episode_equal(ep, load_episode(path, ep.episode_id))
    assert read_turns(path).loc[0, "text"] == text


def test_foreign_and_versioned_files(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign.h5"
    with h5py.File(foreign, "w") as f:
        f["x"] = np.arange(3)
    for call in (lambda: read_episodes(foreign), lambda: EpisodeWriter(foreign)):
        with pytest.raises(SchemaError, match=r"foreign\.h5.*schema_version.*new file"):
            call()
    assert not (tmp_path / "foreign.h5.lock").exists()
    old = tmp_path / "old.h5"
    with EpisodeWriter(old) as w:
        w.write(make_episode(0))
    with h5py.File(old, "r+") as f:
        f.attrs["schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(SchemaError, match=f"old.h5: episode store schema version {SCHEMA_VERSION + 1} .newer"):
        stored_ids(old)
    text = tmp_path / "notes.h5"
    text.write_text("not hdf5")
    with pytest.raises(SchemaError, match="not an HDF5 file"):
        read_sims(text)
    with pytest.raises(FileNotFoundError):
        read_turns(tmp_path / "missing.h5")
    good = tmp_path / "good.h5"
    with EpisodeWriter(good) as w:
        w.write(make_episode(0))
    with pytest.raises(EpisodeNotFoundError, match="good.h5: no committed episode 'nope'"):
        load_episode(good, "nope")


def test_one_writer_per_file_and_live_readers(tmp_path: Path) -> None:
    path = tmp_path / "live.h5"
    with EpisodeWriter(path) as w:
        w.write(make_episode(0))
        with pytest.raises(StoreLockedError, match="one writer per file|One writer per file"):
            EpisodeWriter(path)
        # A reader in another process sees committed episodes while the writer is open.
        code = ("import sys; from hydroagent_hpc.store import stored_ids; "
                "print(','.join(stored_ids(sys.argv[1])))")
        out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True)
        assert out.stdout.strip() == episode_id(0)
        w.write(make_episode(1))
        assert stored_ids(path) == [episode_id(0), episode_id(1)]
        assert not inspect_store(path).closed_cleanly  # open for writing
    assert inspect_store(path).closed_cleanly and not (tmp_path / "live.h5.lock").exists()


READER = """
import sys, time
sys.path.insert(0, {tests!r})
from helpers.store import make_episode, episode_id, assert_episode_equal
from hydroagent_hpc.store import load_episode, read_sims, read_turns, stored_ids
print("ready", flush=True)
polls, seen, deadline = 0, 0, time.time() + 240
while seen < {n} and time.time() < deadline:
    try:
        ids = stored_ids({path!r})
    except FileNotFoundError:
        continue
    assert ids == [episode_id(i) for i in range(len(ids))], ids
    sims, turns = read_sims({path!r}), read_turns({path!r})
    assert set(ids) <= set(sims.episode_id), "a committed episode without its simulations"
    assert (sims.groupby("episode_id").size() == 2).all() and (turns.groupby("episode_id").size() == 5).all()
    if ids:
        assert_episode_equal(make_episode(len(ids) - 1, n_sims=2), load_episode({path!r}, ids[-1]))
    if len(ids) > seen:
        print("seen", len(ids), flush=True)  # the writer waits for this every few episodes
    polls, seen = polls + 1, len(ids)
print(polls, seen)
"""


def test_reader_follows_live_writer(tmp_path: Path) -> None:
    path, n = tmp_path / "live.h5", 150
    with EpisodeWriter(path) as w:
        reader = subprocess.Popen([sys.executable, "-c", READER.format(tests=str(TESTS), path=str(path), n=n)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert reader.stdout.readline().strip() == "ready"
        synced = 0
        for i in range(n):
            w.write(make_episode(i, n_sims=2))
            if i % 10 == 9:  # wait (an event, not a sleep) until the reader has seen this episode
                line = ""
                while not line.startswith("seen") or int(line.split()[1]) < i + 1:
                    line = reader.stdout.readline()
                    assert line, f"the reader stopped before seeing episode {i}: {reader.stderr.read()}"
                synced += 1
    # Read the rest through the same text wrapper that readline() used: communicate() reads the raw pipe
    # and would miss a final line already buffered by readline().
    out, err = reader.stdout.read(), reader.stderr.read()
    assert reader.wait(timeout=90) == 0, err
    polls, seen = map(int, out.splitlines()[-1].split())
    assert seen == n and polls >= 2 and synced == n // 10  # it read while episodes were being written


def test_merge_exactly_once(tmp_path: Path) -> None:
    shards = [tmp_path / f"rank{r}.h5" for r in range(3)]
    for r, shard in enumerate(shards):
        with EpisodeWriter(shard) as w:
            for i in range(r, 12, 3):
                w.write(make_episode(i, n_sims=2), basin_of(i))
    dest = tmp_path / "all.h5"
    expected = [episode_id(i) for i in range(12)]
    assert merge(shards, dest, expected=expected) == 12
    assert sorted(stored_ids(dest)) == expected
    for e in iter_episodes(dest):
        assert_episode_equal(make_episode(int(e.episode_id[3:]), n_sims=2), e)
    assert len(read_basins(dest)) == N_BASINS
    with pytest.raises(MergeError, match="exists"):
        merge(shards, dest)
    with pytest.raises(MergeError, match=r"1 expected episodes are in no shard \('ep-00012'\)"):
        merge(shards, tmp_path / "x.h5", expected=expected + [episode_id(12)])
    with pytest.raises(MergeError, match="not expected"):
        merge(shards, tmp_path / "x.h5", expected=expected[1:])
    with EpisodeWriter(shards[0]) as w:  # a rerun wrote episode 1 into the wrong shard as well
        w.write(make_episode(1, n_sims=2))
    with pytest.raises(MergeError, match=r"1 episodes are stored more than once \('ep-00001'"):
        merge(shards, tmp_path / "x.h5")
    assert not (tmp_path / "x.h5").exists()
    assert merge(shards, tmp_path / "x.h5", allow_duplicates=True) == 12


# ---------------------------------------------------------------------------------------------
# Crash safety: writers killed with SIGKILL at random moments and at chosen points of a write.

CHILD = """
import os, signal, sys
sys.path.insert(0, {tests!r})
import h5py
from helpers.store import make_episode, episode_id, basin_of, CRASH_SIZES
from hydroagent_hpc.store import EpisodeWriter
from hydroagent_hpc.store.writer import Appender

def kill_at(target, nth):  # SIGKILL ourselves just before the nth call of target
    cls, name = {{"append": (Appender, "_append"), "flush": (h5py.File, "flush"),
                  "resize": (h5py.Dataset, "resize")}}[target]
    original, calls = getattr(cls, name), [0]
    def patched(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] == nth:
            os.kill(os.getpid(), signal.SIGKILL)
        return original(self, *args, **kwargs)
    setattr(cls, name, patched)

plan = {plan!r}
if plan and plan[0] == "open":  # during start-up: creation or recovery of the file
    kill_at(*plan[1:])
with EpisodeWriter({path!r}) as w:
    print("open", len(w), flush=True)
    if plan and plan[0] == "write":
        kill_at(*plan[1:])
    for i in range({n}):
        if not w.has(episode_id(i)):
            w.write(make_episode(i, **CRASH_SIZES), basin_of(i))
print("done", flush=True)
"""


def _child(path: Path, n: int, plan: tuple[str, str, int] | None = None) -> subprocess.Popen:
    code = CHILD.format(tests=str(TESTS), path=str(path), n=n, plan=plan)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)


def _check_committed(path: Path, compare: bool) -> int:
    """Every listed episode is complete and equal to what the writer wrote; ids are a prefix, once each."""
    ids = stored_ids(path)
    assert ids == [episode_id(i) for i in range(len(ids))]
    if compare:
        for i, e in enumerate(iter_episodes(path)):
            assert_episode_equal(make_episode(i, **CRASH_SIZES), e)
    frames = read_episodes(path), read_sims(path), read_turns(path)
    assert len(frames[0]) == len(ids)
    assert len(frames[1]) == CRASH_SIZES["n_sims"] * len(ids) and len(frames[2]) == CRASH_SIZES["n_turns"] * len(ids)
    return len(ids)


@pytest.mark.slow
def test_killed_writers_lose_only_the_episode_in_flight(tmp_path: Path) -> None:
    path = tmp_path / "crash.h5"
    total = 600
    rng = np.random.default_rng(20260101)
    # None: SIGKILL from outside after a random delay. Otherwise SIGKILL from inside just before
    # the n-th call of a step. Per episode a writer makes 11 Appender._append calls (16 with a new
    # basin; the last is the commit record), about 8 dataset resizes, and 2 flushes (data, commit).
    plan: list[tuple[str, str, int] | None] = [
        ("write", "flush", 40), ("write", "append", 11 * 5 + 11), ("write", "append", 11 * 3 + 6),
        ("write", "flush", 8), None, ("write", "flush", 7), ("write", "resize", 29), ("open", "resize", 10),
        None, None, ("open", "flush", 1), None, None, None]
    counts = []
    for k, step in enumerate(plan):
        before = counts[-1] if counts else 0
        child = _child(path, total, step)
        if step is None:
            if k % 4 == 2:  # may land during start-up, creation or recovery
                time.sleep(float(rng.uniform(0.2, 0.6)))
            else:
                assert child.stdout.readline().startswith("open")
                time.sleep(float(rng.uniform(0.02, 0.25)))
            child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
        assert child.returncode == -signal.SIGKILL, (k, step, child.stderr.read())
        info = inspect_store(path) if path.exists() else None
        counts.append(_check_committed(path, compare=k % 5 == 0))
        print(f"kill {k} {step}: {counts[-1]} episodes, {info and sum(info.orphan_rows.values())} orphan rows")
        assert info is not None and not info.closed_cleanly
        if step == ("write", "append", 11 * 5 + 11):  # killed after the data flush, before the commit
            assert counts[-1] == before + 5 and sum(info.orphan_rows.values()) > 0  # on disk, invisible
        if step is not None and step[:2] == ("write", "flush"):
            done = (step[2] - 1) // 2  # episodes whose commit flush ran
            assert counts[-1] - before in (done, done + 1), (step, before, counts[-1])
        if step is not None and step[0] == "open":
            assert counts[-1] == before  # killed while recovering: the old file is untouched
    assert counts == sorted(counts) and 0 < counts[-1] < total
    # A final, uninterrupted run completes the campaign: every episode exactly once, all correct.
    child = _child(path, total)
    _, err = child.communicate(timeout=120)
    assert child.returncode == 0, err
    assert _check_committed(path, compare=True) == total
    info = inspect_store(path)
    assert info.closed_cleanly and not list(tmp_path.glob(".crash.h5.*")) and not (tmp_path / "crash.h5.lock").exists()
    # Recovery copies the file byte for byte: each kill may leave one episode's rows as orphans.
    assert info.orphan_rows["turns"] <= len(plan) * CRASH_SIZES["n_turns"]
    assert info.orphan_rows["sims"] <= len(plan) * CRASH_SIZES["n_sims"]


# ---------------------------------------------------------------------------------------------
# Speed (numbers printed with -s; bounds generous for slow CI machines).


@pytest.mark.slow
def test_write_and_read_speed(tmp_path: Path) -> None:
    path = tmp_path / "speed.h5"
    big = make_episode(0, n_sims=200, n_steps=2160)
    eps = [make_episode(i, n_sims=20, n_steps=2160) for i in range(1, 101)]
    with EpisodeWriter(path) as w:
        t0 = time.perf_counter()
        w.write(big)
        t_big = time.perf_counter() - t0
        t0 = time.perf_counter()
        for ep in eps:
            w.write(ep)
        t_100 = time.perf_counter() - t0
    t0 = time.perf_counter()
    df = read_episodes(path)
    t_ep = time.perf_counter() - t0
    t0 = time.perf_counter()
    sims = read_sims(path)
    t_sims = time.perf_counter() - t0
    assert len(df) == 101 and len(sims) == 200 + 2000
    print(f"\nstore: 200 sims x 2160 steps {t_big:.3f} s; 100 episodes x 20 sims {t_100:.2f} s; "
          f"file {path.stat().st_size / 1e6:.1f} MB; read_episodes {t_ep * 1e3:.0f} ms; "
          f"read_sims {t_sims * 1e3:.0f} ms")
    assert t_big < 1.0 and t_100 < 10.0


def test_a_store_built_by_merge_or_salvage_is_complete_or_absent(tmp_path):
    """merge and salvage build their output under a temporary name: a failure while filling it leaves
    neither the output nor the temporary file behind, and the lock is released for the next try."""
    from hydroagent_hpc.store.merge import _build_atomically

    out = tmp_path / "merged.h5"

    def fail(f, tmp):
        f.attrs["partial"] = 1
        raise RuntimeError("shard unreadable halfway")

    with pytest.raises(RuntimeError, match="halfway"):
        _build_atomically(out, fail)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    assert _build_atomically(out, lambda f, tmp: 7) == 7 and out.is_file()
