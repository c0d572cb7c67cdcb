"""A campaign's run folder on a cluster: one HDF5 shard per array task, merged into one file.

h5py from PyPI is a serial build, so every writer owns its file. A campaign split over ``n`` array
tasks (or submitit jobs) keeps this layout::

    RUN/
      run.json                       what was submitted, with the git commit (written once per submission)
      shards/shard-0003-of-0008.h5   array task 3 of 8 writes only here
      campaign.h5                    the merge: every episode of the campaign exactly once
      logs/                          scheduler and submitit logs

Array task ``i`` of ``n`` runs shard ``i`` of ``n`` (:func:`hydroagent_hpc.campaign.spec.shard_of`) and
skips episodes already in its own shard, in ``campaign.h5`` and in shards of an earlier
submission with another ``n``; so a requeued or resubmitted task resumes, and changing the array
size between submissions repeats nothing. Only an episode stored intact (every checksummed part)
counts as done: a task stops on a damaged shard of its own (``hydroagent store salvage`` is the
fix) and runs again an episode that ``campaign.h5`` or an older shard holds only damaged.
:func:`merge_run` checks that no episode sits in two shards of one submission, keeps the first
intact copy of an episode (a damaged copy is left behind, an episode stored only damaged is named
as missing), and replaces ``campaign.h5`` atomically: a killed merge is simply run again.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from hydroagent_hpc.campaign import CampaignSpec, expand, shard_of
from hydroagent_hpc.provenance import provenance
from hydroagent_hpc.store import MergeError

log = logging.getLogger(__name__)

__all__ = ["MERGED", "IncompleteMergeError", "run_status", "format_status", "shard_path", "parse_shard", "skip_stores",
           "list_shards", "merge_run", "write_run_record", "missing_episodes"]

MERGED = "campaign.h5"
_SHARD = re.compile(r"^shard-(\d{4,})-of-(\d{4,})\.h5$")


class IncompleteMergeError(MergeError):
    """Episodes of the campaign are in no shard yet (``missing`` lists their ids)."""

    def __init__(self, message: str, missing: list[str]) -> None:
        super().__init__(message)
        self.missing = missing


def parse_shard(text: str) -> tuple[int, int]:
    """``"3/8"`` -> ``(3, 8)``, strictly (0 <= index < count)."""
    index, sep, count = str(text).partition("/")
    if not sep or not index.strip().isdigit() or not count.strip().isdigit():
        raise ValueError(f"--shard {text!r}: expected INDEX/COUNT such as 3/8 (0-based index)")
    i, n = int(index), int(count)
    if n < 1 or i >= n:
        raise ValueError(f"--shard {text!r}: the index must be below the count (0 <= {i} < {n})")
    return i, n


def shard_path(run_dir: str | Path, index: int, count: int) -> Path:
    """``RUN/shards/shard-IIII-of-NNNN.h5``."""
    return Path(run_dir) / "shards" / f"shard-{index:04d}-of-{count:04d}.h5"


def list_shards(run_dir: str | Path) -> list[tuple[Path, int, int]]:
    """Every shard file of the run folder as ``(path, index, count)``, sorted by count then index."""
    folder = Path(run_dir) / "shards"
    found = []
    if folder.is_dir():
        for p in folder.iterdir():
            m = _SHARD.match(p.name)
            if m:
                found.append((p, int(m.group(1)), int(m.group(2))))
    return sorted(found, key=lambda t: (t[2], t[1]))


def skip_stores(run_dir: str | Path, count: int) -> list[Path]:
    """Stores whose episodes shard ``i`` of ``count`` must not run again.

    The merged file and the shards of submissions with another count; never the sibling shards
    of this submission, which other tasks are writing at this moment (and which hold other
    episodes by construction).
    """
    run_dir = Path(run_dir)
    out = [run_dir / MERGED] if (run_dir / MERGED).exists() else []
    out += [p for p, _, n in list_shards(run_dir) if n != count]
    return out


def missing_episodes(spec: CampaignSpec, store: str | Path) -> list[str]:
    """Episode ids of the campaign that ``store`` does not hold intact (all of them if it is absent)."""
    from hydroagent_hpc.store import verify_store

    have = set(verify_store(store).intact) if Path(store).exists() else set()
    return [t.episode_id for t in expand(spec) if t.episode_id not in have]


def merge_run(spec: CampaignSpec, run_dir: str | Path, allow_missing: bool = False) -> dict[str, Any]:
    """Merge ``RUN/campaign.h5`` and every shard into a new ``RUN/campaign.h5``; return a summary.

    Only an episode some file holds intact counts: every file is verified first, a damaged copy is
    left behind when another file holds the episode intact (a damaged ``campaign.h5`` is rebuilt
    from the shards' intact copies), and an episode stored only damaged counts as missing and is
    named. Raises :class:`~hydroagent_hpc.store.MergeError` when an episode sits in two shards of
    one submission, or when episodes are missing and ``allow_missing`` is false (nothing is
    replaced then; the shards stay, so resubmitting the campaign completes it).
    """
    from hydroagent_hpc.store import check_stores, merge_held

    run_dir = Path(run_dir)
    merged = run_dir / MERGED
    shards = list_shards(run_dir)
    expected = [t.episode_id for t in expand(spec)]
    wanted = set(expected)
    held = check_stores(([merged] if merged.exists() else []) + [p for p, _, _ in shards])
    by_count: dict[int, dict[str, Path]] = defaultdict(dict)
    holders: dict[str, int] = defaultdict(int)
    clashes = []
    for path, _, count in shards:
        health = held.health[path]
        for eid in (*health.intact, *health.damaged_ids):
            if eid in by_count[count]:
                clashes.append(f"{eid!r} in {by_count[count][eid].name} and {path.name}")
            by_count[count][eid] = path
            holders[eid] += 1
    if clashes:
        raise MergeError(f"{run_dir}: {len(clashes)} episodes are stored by two shards of one submission "
                         f"({'; '.join(clashes[:5])}); the shards overlap, which the array must never do - "
                         f"check that every task was given the same count")
    before_ok = merged.exists() and held.health[merged].ok
    before = set(held.health[merged].intact) if merged.exists() else set()
    present = set(held.intact)
    unexpected = sorted((present | set(held.damaged)) - wanted)
    if unexpected:
        raise MergeError(f"{run_dir}: {len(unexpected)} stored episodes are not in campaign {spec.name!r} "
                         f"(e.g. {unexpected[0]!r}); was the campaign file changed? Use a new run folder")
    missing = [eid for eid in expected if eid not in present]
    damaged = held.damaged_only(missing)
    if missing and not allow_missing:
        why = (f"; {len(damaged)} of them are stored only damaged: {held.describe(damaged)} (resubmitting runs "
               f"them again unless the damaged file is a shard of this submission: move that one aside and "
               f"salvage it first, `hydroagent store salvage`)" if damaged else "")
        raise IncompleteMergeError(f"{run_dir}: {len(missing)} of {len(expected)} episodes are in no shard yet "
                                   f"(e.g. {missing[0]!r}){why}; resubmit the same campaign to run them (finished "
                                   f"episodes are kept), or merge with --allow-missing for a partial file", missing)
    repeated = sum(1 for eid, k in holders.items() if k > 1 or eid in before)
    new = len(present - before)
    summary = {"run_dir": str(run_dir), "merged": str(merged), "episodes": len(present), "expected": len(expected),
               "missing": len(missing), "new": new, "shards": len(shards), "copies_skipped": repeated}
    if damaged:
        summary["damaged"] = {eid: f"{why} ({path})" for eid, places in damaged.items() for path, why in places[:1]}
    if not new and before_ok:
        log.info("merge: %s already holds every stored episode (%d)", merged, len(before))
        return summary
    aside = None
    if merged.exists() and not before_ok:
        health = held.health[merged]
        log.warning("merge: %s is damaged (%s); rebuilding it from the intact copies", merged, health.summary())
        if health.unnamed or any(eid not in present for eid in health.damaged_ids):  # its only copy: keep it
            aside = _free_name(run_dir / "campaign.damaged.h5")
    staging = run_dir / ".campaign-merging.h5"
    staging.unlink(missing_ok=True)
    merge_held(held, staging, allow_duplicates=True, skip_damaged=True)
    if aside is not None:
        os.replace(merged, aside)
        log.warning("merge: kept the damaged %s as %s (it held the only copy of what is damaged)", merged.name,
                    aside.name)
        summary["damaged_kept_as"] = str(aside)
    os.replace(staging, merged)
    log.info("merged %d shards into %s: %d of %d episodes (%d new)", len(shards), merged, len(present),
             len(expected), new)
    return summary


def _free_name(path: Path) -> Path:
    """``path``, or ``stem-2.suffix``, ``stem-3.suffix``... the first that does not exist."""
    k, out = 1, path
    while out.exists():
        k += 1
        out = path.with_name(f"{path.stem}-{k}{path.suffix}")
    return out


def write_run_record(run_dir: str | Path, record: dict[str, Any]) -> Path:
    """Write ``RUN/run.json`` (the submission with provenance), atomically; earlier ones are kept as run-N.json."""

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "run.json"
    if path.exists():
        k = 1
        while (run_dir / f"run-{k}.json").exists():
            k += 1
        os.replace(path, run_dir / f"run-{k}.json")
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({**record, "provenance": provenance()}, indent=2, default=str) + "\n")
    os.replace(tmp, path)
    return path


def run_status(spec: CampaignSpec, run_dir: str | Path) -> dict[str, Any]:
    """Progress of a run folder while it runs: episodes per shard, per agent, and what is missing.

    Reads the shards in SWMR mode without any lock, so it is safe beside the writing array tasks.
    A shard whose superblock is still marked open is being written (or its writer was killed).
    """
    import numpy as np

    from hydroagent_hpc.store import read_episodes
    from hydroagent_hpc.store.view import superblock_dirty

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"--run-dir {run_dir}: no such run folder (give the RUN_DIR the campaign was "
                                f"submitted with)")
    tasks = expand(spec)
    agent_of = {t.episode_id: t.agent.name for t in tasks}
    best: dict[str, float] = {}
    files = []
    # (file, its shard or None for the merged file, which holds the whole campaign)
    sources: list[tuple[Path, tuple[int, int] | None]] = []
    if (run_dir / MERGED).exists():
        sources.append((run_dir / MERGED, None))
    sources += [(path, (index, count)) for path, index, count in list_shards(run_dir)]
    for path, shard in sources:
        frame = read_episodes(path)
        ids = [str(e) for e in frame["episode_id"]]
        for eid, nse in zip(ids, frame["best_nse"]):
            if eid in agent_of:
                best[eid] = float(nse) if nse is not None and np.isfinite(nse) else float("nan")
        want = len(shard_of(tasks, shard))
        files.append({"file": path.name, "stored": len(ids), "expected": want,
                      "state": "open (writing, or its writer was killed)" if superblock_dirty(path) else "closed"})
    agents = []
    for name in dict.fromkeys(t.agent.name for t in tasks):
        mine = [t.episode_id for t in tasks if t.agent.name == name]
        got = [best[e] for e in mine if e in best]
        agents.append({"agent": name, "done": len(got), "expected": len(mine),
                       "median_best_nse": float(np.nanmedian(got)) if got and not np.all(np.isnan(got)) else None})
    missing = [t.episode_id for t in tasks if t.episode_id not in best]
    return {"campaign": spec.name, "run_dir": str(run_dir), "expected": len(tasks), "done": len(best),
            "missing": len(missing), "first_missing": missing[:5], "files": files, "agents": agents}


def format_status(status: dict[str, Any]) -> str:
    """The status as a few aligned lines for a terminal."""
    lines = [f"campaign {status['campaign']} in {status['run_dir']}: {status['done']} of {status['expected']} "
             f"episodes stored, {status['missing']} missing"]
    for f in status["files"]:
        lines.append(f"  {f['file']:<28} {f['stored']:>6} / {f['expected']:<6} {f['state']}")
    for a in status["agents"]:
        nse = "-" if a["median_best_nse"] is None else f"{a['median_best_nse']:.3f}"
        lines.append(f"  agent {a['agent']:<22} {a['done']:>6} / {a['expected']:<6} median best NSE {nse}")
    if status["first_missing"]:
        lines.append(f"  next missing: {', '.join(status['first_missing'])}")
    return "\n".join(lines)
