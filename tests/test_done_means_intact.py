"""A damaged episode is never "done" (issue 32, item 1).

Every part of a stored episode carries a checksum (its record, turns, simulations, metrics,
discharge, the metric names and the basin series it uses). A campaign resumed into a store, a
merge of shards, a pipeline stage and a report must not take an episode for finished because its
record is intact while another of its parts is damaged.

The generated cases start from a real pipeline run folder (the smaller demo: synthetic basins and
the heuristic teacher campaign, six episodes) and damage one checksummed part of its
``campaign.h5``: a flipped bit at a random place inside the used bytes of each dataset, and values
overwritten with other plausible values (a row := another row of the same table, a span of a series
or of a string table := another span). Cases whose damage no checksum sees (bytes nothing uses) are
left out; for the rest the damaged (lost) episodes are what the current ``verify_store`` says.
Each case goes through six consumers, in a worker subprocess that imports the package under test
(the fast test runs its case in this process):

- ``resume_out``: ``run_campaign`` resumed into the damaged store;
- ``resume_skip``: ``run_campaign`` into a new shard that skips the episodes of the damaged store
  (a Slurm array task beside an earlier merge);
- ``report``: ``write_report`` of the damaged store;
- ``merge_shard``: ``merge_run`` of a run folder whose only shard is the damaged store;
- ``merge_merged``: ``merge_run`` of a run folder whose ``campaign.h5`` is the damaged store and whose
  shard is intact;
- ``pipeline``: the teacher stage's done check (``decide``) with its ``campaign.h5`` damaged in
  place (same size, same modification time: bit rot, or a copy with ``cp -p``), then
  ``run_pipeline(only="teacher")``.

A consumer passes when it either stops with an error that names a lost episode (and, for a resume,
the fix: ``hydroagent store salvage``, or setting the store aside when none of its episodes is
intact), or ends with an intact result that holds every episode (a rerun, or a merge from the
intact copies). It fails when it counts a damaged episode as done: a resume that
skips it, a report that says nothing, a merge or a stage that ends with the damaged file in place.

``python tests/test_done_means_intact.py measure ROOT`` runs the same cases against the package at
``ROOT`` (an older checkout) and prints the counts.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from helpers.cases import every_case

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
CONSUMERS = ("resume_out", "resume_skip", "report", "merge_shard", "merge_merged", "pipeline")
#: Dataset -> the checksummed part of an episode it holds.
PARTS = {"episodes/rows": "record", "episodes/text": "record", "turns/rows": "turns", "turns/text": "turns",
         "sims/rows": "sims", "sims/text": "sims", "metrics/rows": "metrics", "metrics/text": "metrics",
         "metric_keys/rows": "keys", "metric_keys/text": "keys", "series/discharge": "discharge",
         "basins/rows": "basin", "basins/text": "basin", "series/times": "basin series",
         "series/observed": "basin series", "series/warmup": "basin series"}


# ---------------------------------------------------------------------------------------------
# The run folder (built in a subprocess with the package under test) and the damage.


def build(work: Path) -> None:
    """``work/pipeline.yaml`` and ``work/run`` with the basins and teacher stages done."""
    from helpers.pipeline import smaller_demo, write
    from hydroagent_hpc.pipeline.runner import run_pipeline

    spec = write(work / "pipeline.yaml", smaller_demo())
    run_pipeline(spec, work / "run", only="basins")
    run_pipeline(spec, work / "run", only="teacher")


def _used_bytes(path: Path) -> dict[str, list[tuple[int, int]]]:
    """Per dataset: ``(byte offset, used bytes)`` of each chunk."""
    import h5py

    out: dict[str, list[tuple[int, int]]] = {}
    with h5py.File(path, "r") as f:
        for name in PARTS:
            ds = f[name]
            item, rows, per = ds.dtype.itemsize, ds.shape[0], ds.chunks[0]
            chunks = []
            for i in range(ds.id.get_num_chunks()):
                info = ds.id.get_chunk_info(i)
                used = max(0, min(per, rows - int(info.chunk_offset[0]))) * item
                if used:
                    chunks.append((int(info.byte_offset), used))
            out[name] = chunks
    return out


def _rows(path: Path, name: str) -> list[tuple[int, int]]:
    """``(byte offset, itemsize)`` of every row of dataset ``name``."""
    import h5py

    with h5py.File(path, "r") as f:
        ds = f[name]
        item, per = ds.dtype.itemsize, ds.chunks[0]
        return [(int(ds.id.get_chunk_info_by_coord(((r // per) * per,)).byte_offset) + (r % per) * item, item)
                for r in range(ds.shape[0])]


def generate_cases(pristine: Path, seed: int = 32, flips: int = 3, spans: int = 1) -> list[dict[str, Any]]:
    """Damage of each checksummed part: bit flips and overwritten values (``edits``: offset, bytes)."""
    rng = random.Random(seed)
    raw = pristine.read_bytes()
    used = _used_bytes(pristine)
    cases: list[dict[str, Any]] = []
    for name, part in PARTS.items():
        if not used[name]:
            continue
        for _ in range(flips):
            off, n = rng.choice(used[name])
            at = off + rng.randrange(n)
            cases.append({"part": part, "kind": "flip", "edits": [(at, [raw[at] ^ (1 << rng.randrange(8))])],
                          "where": f"{name} byte {at}"})
        if name.endswith("/rows"):
            places = _rows(pristine, name)
            if len(places) >= 2:
                a, b = rng.sample(range(len(places)), 2)
                (at, n), (src, _) = places[a], places[b]
                cases.append({"part": part, "kind": "overwrite-row", "edits": [(at, list(raw[src:src + n]))],
                              "where": f"{name} row {a} := row {b}"})
        else:
            off, n = used[name][0]
            for _ in range(spans):
                width = min(n // 2, rng.choice([1, 4, 8]))
                if width <= 0:
                    continue
                a, b = off + rng.randrange(0, n - width), off + rng.randrange(0, n - width)
                cases.append({"part": part, "kind": "overwrite-values", "edits": [(a, list(raw[b:b + width]))],
                              "where": f"{name} bytes {a}..{a + width} := {b}.."})
    return cases


def damage(pristine: Path, case: dict[str, Any], out: Path) -> None:
    """``out``: a copy of ``pristine`` with the case's edits, with the pristine file's size and times."""
    shutil.copyfile(pristine, out)
    with open(out, "r+b") as fh:
        for at, data in case["edits"]:
            fh.seek(at)
            fh.write(bytes(data))
    st = pristine.stat()
    os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))


def oracle(path: Path, expected: list[str]) -> dict[str, Any]:
    """What the current ``verify_store`` says: the lost episodes and the names a message may use."""
    from hydroagent_hpc.store import verify_store

    h = verify_store(path)
    lost = [eid for eid in expected if eid not in h.intact]
    return {"ok": h.ok, "lost": lost, "names": sorted(set(lost) | set(h.damaged))}


# ---------------------------------------------------------------------------------------------
# The worker: one damaged case through every consumer (package under test on sys.path).


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _attempt(fn: Any) -> dict[str, Any]:
    try:
        fn()
    except Exception as exc:
        return {"raised": type(exc).__name__, "message": str(exc)}
    return {"raised": None, "message": ""}


def consume(work: Path, case_dir: Path, damaged: Path) -> dict[str, Any]:
    """Run every consumer on ``damaged`` (files under ``case_dir``); what each one did."""
    from hydroagent_hpc.campaign import load_campaign, run_campaign
    from hydroagent_hpc.campaign.shards import merge_run
    from hydroagent_hpc.pipeline.runner import run_pipeline
    from hydroagent_hpc.pipeline.spec import load_pipeline
    from hydroagent_hpc.pipeline.stages import decide
    from hydroagent_hpc.report import write_report

    run = work / "run"
    spec = load_campaign(run / "teacher" / "campaign.yaml")
    shard = run / "teacher" / "shards" / "shard-0000-of-0001.h5"
    out: dict[str, Any] = {}

    resumed = case_dir / "resume_out.h5"
    shutil.copyfile(damaged, resumed)
    out["resume_out"] = _attempt(lambda: run_campaign(spec, resumed, progress=False))
    out["resume_skip"] = _attempt(lambda: run_campaign(spec, case_dir / "resume_skip.h5", progress=False,
                                                       skip_stores=[damaged]))
    handler = _Warnings()
    logging.getLogger().addHandler(handler)
    try:
        rep = _attempt(lambda: write_report(damaged, case_dir / "report", precip=False))
    finally:
        logging.getLogger().removeHandler(handler)
    md = case_dir / "report" / "report.md"
    rep.update(warnings=handler.lines, markdown=md.read_text() if md.exists() and not rep["raised"] else "")
    out["report"] = rep
    one = case_dir / "merge_shard"
    (one / "shards").mkdir(parents=True)
    shutil.copyfile(damaged, one / "shards" / shard.name)
    out["merge_shard"] = _attempt(lambda: merge_run(spec, one))
    two = case_dir / "merge_merged"
    (two / "shards").mkdir(parents=True)
    shutil.copyfile(damaged, two / "campaign.h5")
    shutil.copyfile(shard, two / "shards" / shard.name)
    out["merge_merged"] = _attempt(lambda: merge_run(spec, two))
    copy = case_dir / "run"
    shutil.copytree(run, copy, symlinks=True, ignore=shutil.ignore_patterns("basins"))
    os.symlink(run / "basins", copy / "basins")
    shutil.copy2(damaged, copy / "teacher" / "campaign.h5")  # the recorded size and time: not re-hashed
    pipe = load_pipeline(work / "pipeline.yaml")
    try:
        p = decide(pipe, copy, "teacher")
        plan: dict[str, Any] = {"raised": None, "message": "", "action": p.action, "why": p.why}
    except Exception as exc:
        plan = {"raised": type(exc).__name__, "message": str(exc), "action": "", "why": ""}
    plan["resume"] = _attempt(lambda: run_pipeline(work / "pipeline.yaml", copy, only="teacher"))
    out["pipeline"] = plan
    return out


def run_cases(work: Path) -> list[dict[str, Any]]:
    """What every consumer did with each case of ``work/cases.json``."""
    cases = json.loads((work / "cases.json").read_text())
    pristine = work / "run" / "teacher" / "campaign.h5"
    out = []
    for k, case in enumerate(cases):
        case_dir = work / f"case-{k}"
        case_dir.mkdir()
        damaged = case_dir / "damaged.h5"
        damage(pristine, case, damaged)
        out.append({"case": k, **consume(work, case_dir, damaged)})
    return out


def worker(work: Path) -> None:
    """:func:`run_cases` in a subprocess: one JSON line per case on stdout."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)  # the report's warnings are judged
    for got in run_cases(work):
        print(json.dumps(got), flush=True)


# ---------------------------------------------------------------------------------------------
# The parent: judging what each consumer did, with the current verify_store as the oracle.


def _names(text: str, truth: dict[str, Any]) -> bool:
    return any(n in text for n in truth["names"])


def judge(case_dir: Path, truth: dict[str, Any], got: dict[str, Any], expected: list[str]) -> dict[str, str]:
    """Consumer -> ``pass`` or the reason it failed."""
    from hydroagent_hpc.store import verify_store

    def whole(path: Path) -> bool:
        if not path.exists():
            return False
        h = verify_store(path)
        return h.ok and set(expected) <= set(h.intact)

    def stopped(r: dict[str, Any], fix: bool = False) -> bool:
        """Raised naming a lost episode (and, with ``fix``, saying to salvage the store, or to set it aside
        when none of its episodes is intact)."""
        said = not fix or "salvage" in r["message"] or "move it aside" in r["message"]
        return bool(r["raised"]) and _names(r["message"], truth) and said

    verdict: dict[str, str] = {}
    r = got["resume_out"]
    verdict["resume_out"] = ("pass" if stopped(r, fix=True) or (not r["raised"] and whole(case_dir / "resume_out.h5"))
                             else f"raised {r['raised']}: {r['message'][:200]}" if r["raised"] else
                             "resumed, counting the damaged episodes as done")
    r = got["resume_skip"]
    rerun = case_dir / "resume_skip.h5"
    redone = (not r["raised"] and rerun.exists()
              and set(truth["lost"]) <= set(verify_store(rerun).intact))
    verdict["resume_skip"] = ("pass" if stopped(r, fix=True) or redone else
                              f"raised {r['raised']}: {r['message'][:200]}" if r["raised"] else
                              "skipped the damaged episodes as done")
    r = got["report"]
    warned = _names(" ".join(r["warnings"]), truth) and _names(r["markdown"], truth)
    verdict["report"] = ("pass" if stopped(r) or (not r["raised"] and warned) else
                         f"raised {r['raised']}: {r['message'][:200]}" if r["raised"] else
                         "reported without naming the damaged episodes")
    for name in ("merge_shard", "merge_merged"):
        r = got[name]
        merged = case_dir / name / "campaign.h5"
        verdict[name] = ("pass" if stopped(r) or (not r["raised"] and whole(merged)) else
                         f"raised {r['raised']}: {r['message'][:200]}" if r["raised"] else
                         "merged, the damaged episodes counted as done")
    r = got["pipeline"]
    if r["raised"]:
        verdict["pipeline"] = f"done check raised {r['raised']}: {r['message'][:200]}"
    elif r["action"] == "skip" or not _names(r["why"], truth):
        verdict["pipeline"] = f"done check: {r['action']} ({r['why'][:120]})"
    else:
        res = r["resume"]
        ok = stopped(res) or (not res["raised"] and whole(case_dir / "run" / "teacher" / "campaign.h5"))
        verdict["pipeline"] = "pass" if ok else (f"resume raised {res['raised']}: {res['message'][:200]}"
                                                 if res["raised"] else "resumed stage left the damaged store")
    return verdict


def _env(root: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(TESTS)]), "HF_HUB_OFFLINE": "1"}


def _python(root: Path, work: Path, call: str, timeout: float) -> str:
    code = (f"import sys; sys.path[:0] = [{str(root)!r}, {str(TESTS)!r}]; from pathlib import Path; "
            f"import test_done_means_intact as d; d.{call}(Path({str(work)!r}))")
    proc = subprocess.run([sys.executable, "-c", code], env=_env(root), capture_output=True, text=True,
                          timeout=timeout, cwd=work)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def measure(root: Path | None, work: Path, select: Any = None, seed: int = 32) -> list[dict[str, Any]]:
    """Build the run folder and the cases, run them against the package at ``root`` (in subprocesses; None:
    in this process, with the package this test imports); one verdict per case."""
    from hydroagent_hpc.store import stored_ids

    if root is None:
        build(work)
    else:
        _python(root, work, "build", 600)
    pristine = work / "run" / "teacher" / "campaign.h5"
    expected = stored_ids(pristine)
    probe = work / "probe.h5"
    cases = []
    for case in generate_cases(pristine, seed):
        damage(pristine, case, probe)
        truth = oracle(probe, expected)
        if truth["ok"]:
            continue  # damage in bytes no checksum covers and no reader uses
        cases.append({**case, "truth": truth})
    if select is not None:
        cases = select(cases)
    (work / "cases.json").write_text(json.dumps(cases))
    if root is None:
        answers = run_cases(work)
    else:
        lines = _python(root, work, "worker", 60 * (10 + len(cases)))
        answers = [json.loads(line) for line in lines.splitlines() if line.startswith("{")]
    results = []
    for got in answers:
        case = cases[got["case"]]
        verdict = judge(work / f"case-{got['case']}", case["truth"], got, expected)
        results.append({"part": case["part"], "kind": case["kind"], "where": case["where"], "verdict": verdict})
    assert len(results) == len(cases), f"{len(results)} of {len(cases)} cases answered"
    return results


def tally(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Cases, and per consumer and per part how many fail."""
    failing = [r for r in results if any(v != "pass" for v in r["verdict"].values())]
    return {"cases": len(results), "consumer checks": len(results) * len(CONSUMERS),
            "failing cases": len(failing),
            "failing checks": sum(v != "pass" for r in results for v in r["verdict"].values()),
            "per consumer": {c: sum(r["verdict"][c] != "pass" for r in results) for c in CONSUMERS},
            "per part": dict(Counter(r["part"] for r in failing)),
            "cases per part": dict(Counter(r["part"] for r in results))}


def _failures(results: list[dict[str, Any]]) -> str:
    return "\n".join(f"{r['part']} {r['kind']} {r['where']}: {c}: {v}" for r in results
                     for c, v in r["verdict"].items() if v != "pass")


# ---------------------------------------------------------------------------------------------
# Damaging one part of one chosen episode of a store (for the tests that follow a single case).


def _place(path: Path, name: str, row: int) -> tuple[int, int]:
    """``(byte offset, itemsize)`` of row ``row`` of dataset ``name``."""
    import h5py

    with h5py.File(path, "r") as f:
        ds = f[name]
        per = ds.chunks[0]
        start = int(ds.id.get_chunk_info_by_coord(((row // per) * per,)).byte_offset)
        return start + (row % per) * ds.dtype.itemsize, ds.dtype.itemsize


def damage_episode(path: Path, position: int, part: str) -> None:
    """Damage one part of the ``position``-th committed episode in place: ``discharge`` (a value := 1.0),
    ``turns`` (a bit of its first turn row) or ``metric`` (a bit of its first metric row)."""
    import h5py

    with h5py.File(path, "r") as f:
        record = f["episodes/rows"][position]
        if part == "discharge":
            sims = f["sims/rows"][int(record["sim_start"]):int(record["sim_start"] + record["sim_count"])]
            first = next(s for s in sims if s["discharge_len"] > 0)
            name, row, edit = "series/discharge", int(first["discharge_start"]) + 1, None
        else:
            name, row, edit = f"{part}s/rows", int(record[f"{part}_start"]), 0x08
    at, size = _place(path, name, row)
    with open(path, "r+b") as fh:
        fh.seek(at)
        old = fh.read(size)
        fh.seek(at)
        fh.write(b"\x00\x00\x80\x3f" if edit is None else bytes([old[0] ^ edit]))


def _campaign(folder: Path, basin: Path, seeds: int = 3) -> Path:
    path = folder / "c.yaml"
    path.write_text(f"name: t\nbasins: [{basin}]\nagents:\n  - {{name: heuristic, kind: heuristic}}\n"
                    f"seeds: {list(range(seeds))}\nenv: {{preset: paper, max_simulations: 3, max_turns: null, "
                    f"patience: null, target_nse: 0.999}}\n")
    return path


# ---------------------------------------------------------------------------------------------
# The tests.


def _one_per_part(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first row or value overwrite (or else flip) of the turns."""
    chosen: dict[str, dict[str, Any]] = {}
    for c in cases:
        if c["part"] not in chosen or (c["kind"] != "flip" and chosen[c["part"]]["kind"] == "flip"):
            chosen[c["part"]] = c
    return [chosen["turns"]]


def test_a_damaged_turn_is_never_done(tmp_path: Path) -> None:
    """A generated case (a turn row overwritten by another) through every consumer, in this process."""
    results = measure(None, tmp_path, select=_one_per_part)
    assert [r["part"] for r in results] == ["turns"]
    assert not _failures(results), _failures(results)


def test_a_resume_into_a_store_with_damaged_discharge_stops_and_the_fix_reruns_only_it(
        tmp_path: Path, small_basin_dir: Path) -> None:
    from hydroagent_hpc.campaign import load_campaign, run_campaign
    from hydroagent_hpc.errors import one_line
    from hydroagent_hpc.store import CorruptStoreError, salvage, stored_ids, verify_store

    spec = load_campaign(_campaign(tmp_path, small_basin_dir))
    out = tmp_path / "c.h5"
    run_campaign(spec, out, progress=False)
    ids = stored_ids(out)
    damage_episode(out, 1, "discharge")
    before = out.read_bytes()
    with pytest.raises(CorruptStoreError) as info:
        run_campaign(spec, out, progress=False)
    line = one_line(info.value)
    assert f"{ids[1]!r} (its discharge fails its checksum)" in line and "2 committed episode(s) intact" in line, line
    assert f"hydroagent store salvage {tmp_path / 'c.damaged.h5'} {out}" in line, line
    assert out.read_bytes() == before and not (tmp_path / "c.h5.lock").exists()  # nothing rerun or appended
    aside = tmp_path / "c.damaged.h5"  # the fix, as the message gives it
    os.replace(out, aside)
    salvage(aside, out)
    again = run_campaign(spec, out, progress=False)
    assert again["ran"] == 1 and again["already_stored"] == 2
    h = verify_store(out)
    assert h.ok and sorted(h.intact) == sorted(ids)


def test_an_episode_damaged_in_another_store_runs_again(tmp_path: Path, small_basin_dir: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """A shard beside a merged file whose copy of an episode is damaged: the episode is not done."""
    from hydroagent_hpc.campaign import load_campaign, run_campaign
    from hydroagent_hpc.store import stored_ids, verify_store

    spec = load_campaign(_campaign(tmp_path, small_basin_dir))
    merged = tmp_path / "campaign.h5"
    run_campaign(spec, merged, progress=False)
    ids = stored_ids(merged)
    damage_episode(merged, 2, "turn")
    with caplog.at_level(logging.WARNING):
        r = run_campaign(spec, tmp_path / "shard.h5", skip_stores=[merged], progress=False)
    assert r["ran"] == 1 and r["already_stored"] == 2
    assert stored_ids(tmp_path / "shard.h5") == [ids[2]] and verify_store(tmp_path / "shard.h5").ok
    assert f"{ids[2]!r} (its turns rows fail their checksum" in caplog.text and "run again" in caplog.text


def test_a_merge_takes_intact_copies_and_names_an_episode_stored_only_damaged(
        tmp_path: Path, small_basin_dir: Path) -> None:
    from hydroagent_hpc.campaign import load_campaign, run_campaign
    from hydroagent_hpc.campaign.shards import IncompleteMergeError, merge_run, shard_path
    from hydroagent_hpc.store import MergeError, merge, stored_ids, verify_store

    spec = load_campaign(_campaign(tmp_path, small_basin_dir))
    run = tmp_path / "run"
    shard = shard_path(run, 0, 1)
    run_campaign(spec, shard, progress=False)
    ids = stored_ids(shard)
    damaged = tmp_path / "damaged.h5"
    shutil.copyfile(shard, damaged)
    damage_episode(damaged, 0, "metric")
    n = merge([damaged, shard], tmp_path / "m.h5", allow_duplicates=True)  # the damaged copy is left behind
    assert n == 3 and verify_store(tmp_path / "m.h5").ok and sorted(stored_ids(tmp_path / "m.h5")) == sorted(ids)
    with pytest.raises(MergeError, match=rf"(?s)1 episodes are stored only damaged \({ids[0]!r} \(its metrics rows "
                                         rf"fail their checksum, in {damaged}\).*fix: .*hydroagent store salvage"):
        merge([damaged], tmp_path / "m2.h5")
    assert not (tmp_path / "m2.h5").exists()
    assert merge([damaged], tmp_path / "m3.h5", skip_damaged=True) == 2
    # a run folder whose merged file holds the only copy of a damaged episode
    os.replace(damaged, run / "campaign.h5")
    shard.unlink()
    with pytest.raises(IncompleteMergeError, match=rf"1 of 3 episodes are in no shard yet.*stored only damaged: "
                                                   rf"{ids[0]!r} \(its metrics rows fail"):
        merge_run(spec, run)
    summary = merge_run(spec, run, allow_missing=True)
    assert summary["missing"] == 1 and ids[0] in summary["damaged"]
    assert sorted(stored_ids(run / "campaign.h5")) == sorted(ids[1:]) and verify_store(run / "campaign.h5").ok
    assert not verify_store(run / "campaign.damaged.h5").ok  # the only copy of the damaged episode is kept


def test_salvage_keeps_the_episodes_that_do_not_use_a_damaged_metric_name(tmp_path: Path) -> None:
    import dataclasses

    from helpers.store import basin_of, make_episode
    from hydroagent_hpc.store import EpisodeWriter, salvage, stored_ids, verify_store

    path = tmp_path / "s.h5"
    with EpisodeWriter(path) as w:
        for i in range(3):
            ep = make_episode(i, n_sims=2, n_steps=48)
            if i == 2:  # a metric name only this episode uses: the last metric_keys row
                sim = dataclasses.replace(ep.sims[0], metrics={**ep.sims[0].metrics, "only_here": 1.5})
                ep = dataclasses.replace(ep, sims=[sim, *ep.sims[1:]])
            w.write(ep, basin_of(i))
    import h5py

    with h5py.File(path, "r") as f:
        last = f["metric_keys/rows"].shape[0] - 1
    at, _ = _place(path, "metric_keys/rows", last)
    with open(path, "r+b") as fh:
        fh.seek(at)
        b = fh.read(1)
        fh.seek(at)
        fh.write(bytes([b[0] ^ 0x01]))
    h = verify_store(path)
    assert list(h.damaged) == ["ep-00002"] and h.intact == ("ep-00000", "ep-00001")
    salvage(path, tmp_path / "saved.h5")
    assert stored_ids(tmp_path / "saved.h5") == ["ep-00000", "ep-00001"] and verify_store(tmp_path / "saved.h5").ok


def one_flip_per_dataset(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The cases of a run without ``HYDROAGENT_CASES=all``: per damaged dataset, its first bit flip and every
    overwrite (about half of the generated cases; every part and every kind of damage still covered)."""
    seen: set[str] = set()
    kept = []
    for case in cases:
        dataset = case["where"].split(" ")[0]
        if case["kind"] == "flip":
            if dataset in seen:
                continue
            seen.add(dataset)
        kept.append(case)
    return kept


@pytest.mark.slow
def test_generated_damage_of_every_part_is_never_done(tmp_path: Path) -> None:
    results = measure(ROOT, tmp_path, select=None if every_case() else one_flip_per_dataset)
    counts = tally(results)
    print("done-means-intact cases:", json.dumps(counts))
    assert set(counts["cases per part"]) == set(PARTS.values()), counts
    assert counts["cases"] >= (40 if every_case() else 25), counts
    assert not _failures(results), _failures(results)


if __name__ == "__main__":  # python tests/test_done_means_intact.py measure ROOT
    if len(sys.argv) >= 3 and sys.argv[1] == "measure":
        logging.basicConfig(level=logging.ERROR)
        with tempfile.TemporaryDirectory(prefix="done-intact-") as tmp:
            res = measure(Path(sys.argv[2]).resolve(), Path(tmp))
        print(json.dumps(tally(res), indent=1))
        print(_failures(res))
    else:
        print(__doc__)
