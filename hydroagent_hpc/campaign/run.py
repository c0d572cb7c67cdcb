"""Run a campaign's episodes through a simulation pool into one HDF5 store, resumably.

``run_campaign`` expands a :class:`~hydroagent_hpc.campaign.spec.CampaignSpec`, keeps one shard
when asked, skips episodes already stored (here or in other stores), runs the rest on a pool
(:mod:`hydroagent_hpc.hpc`: serial, local processes or MPI ranks) and writes each episode the
moment it finishes with the single writer in this process; a killed run loses only the episodes
in flight.

A failure that no retry and no later episode can heal (a :class:`~hydroagent_hpc.errors.CannotHealError`:
a refused API key, an unknown model, a missing key, a model that does not load) is not recorded as an
episode: the task hands back a :class:`Stopped` instead, and ``run_campaign`` stops at once with a
:class:`CampaignStoppedError` (one line naming the model and the fix), whatever the pool: the
episodes in flight are abandoned (local workers killed; MPI ranks finish the one they hold and get no
more), nothing more is written, and everything stored before is kept for the rerun after the fix.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydroagent_hpc.agents.factory import make_agent
from hydroagent_hpc.campaign.spec import CampaignSpec, Task, ensure_ready, expand, shard_of
from hydroagent_hpc.errors import CannotHealError, HydroAgentError, one_line, tracebacks_wanted
from hydroagent_hpc.hpc.pool import open_pool
from hydroagent_hpc.sim import open_simulator
from hydroagent_hpc.sim.basin import load_basin
from hydroagent_hpc.sim.kernels import set_threads
from hydroagent_hpc.types import Episode

if TYPE_CHECKING:  # the pool and simulator modules load when a campaign runs, not when this one is imported
    from hydroagent_hpc.hpc.pool import Pool
    from hydroagent_hpc.sim import Simulator

log = logging.getLogger(__name__)

__all__ = ["run_task", "run_or_stop", "run_campaign", "worker_init", "Stopped", "CampaignStoppedError"]


_SIMS: dict[str, Simulator] = {}


def _simulator(basin_dir: str, backend: str = "embedded") -> Simulator:
    """One simulator per basin per process (loading is the expensive part)."""
    key = f"{backend}:{Path(basin_dir).resolve()}"
    if key not in _SIMS:

        _SIMS[key] = open_simulator(Path(basin_dir) / "control.txt", backend)
    return _SIMS[key]


def run_task(task: Task) -> Episode:
    """Run one episode (in this process)."""
    from hydroagent_hpc.env.environment import CalibrationEnv
    from hydroagent_hpc.env.episode import run_episode

    basin = load_basin(task.basin_dir)
    sim = _simulator(task.basin_dir, str(task.agent.options.get("backend", "embedded")))
    env = CalibrationEnv(basin, sim, task.env, agent=task.agent.name, seed=task.seed, episode_id=task.episode_id)
    try:
        policy = make_agent(task.agent, task.seed, task.env)
    except ImportError as exc:  # a package the agent needs: no episode of it can run
        raise CannotHealError(f"agent {task.agent.name!r} (kind {task.agent.kind}) cannot be built: {one_line(exc)}",
                              "install the package named, then rerun") from exc
    return run_episode(policy, env)


@dataclass(frozen=True)
class Stopped:
    """What a pool task hands back instead of an episode when it met a failure that cannot heal.

    A plain value (the error's one line and exit status), so it travels from any worker process or
    MPI rank unchanged; :func:`run_campaign` turns it into a :class:`CampaignStoppedError`.
    """

    episode_id: str
    agent: str
    message: str
    exit_code: int


class CampaignStoppedError(HydroAgentError):
    """A campaign stopped at once by a failure that cannot heal; the message names the model and the fix."""

    exit_code = 1

    def __init__(self, campaign: str, stopped: Stopped) -> None:
        super().__init__(f"campaign {campaign!r} stopped at episode {stopped.episode_id} (agent {stopped.agent!r}): "
                         f"{stopped.message}")
        self.stopped = stopped
        self.exit_code = stopped.exit_code


def run_or_stop(task: Task) -> Episode | Stopped:
    """:func:`run_task`, with a failure that cannot heal handed back as :class:`Stopped` (what a campaign's
    pool runs)."""
    try:
        return run_task(task)
    except CannotHealError as exc:
        return Stopped(task.episode_id, task.agent.name, one_line(exc), exc.exit_code)


def worker_init() -> None:
    """Prepare a pool worker process: one kernel thread (the pool is the parallelism), quiet logs."""

    set_threads(1)
    logging.getLogger().setLevel(logging.WARNING)


def run_campaign(spec: CampaignSpec, out: str | Path, workers: int = 1, progress: bool = True,
                 limit: int | None = None, *, pool: Pool | None = None, shard: tuple[int, int] | None = None,
                 skip_stores: Iterable[str | Path] = (), timeout_s: float | None = None) -> dict[str, Any]:
    """Run every episode (of ``shard``) not yet in ``out`` or in ``skip_stores``; returns counts and timings.

    ``pool`` is an open simulation pool (:mod:`hydroagent_hpc.hpc`); without one, a serial pool
    (``workers`` = 1) or a local process pool of ``workers`` is opened here. ``timeout_s`` caps
    one episode (process and MPI pools); an episode that fails or times out is listed in
    ``failed`` and stays missing, so a rerun tries it again. A failure that cannot heal raises
    :class:`CampaignStoppedError` at once (see the module's doc).
    """
    from hydroagent_hpc.store import EpisodeWriter, done_ids

    ensure_ready(spec)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tasks = shard_of(expand(spec), shard)
    # done: stored intact (every checksummed part) in out or a skip store; a damaged out stops the run with
    # the damage named, an episode stored only damaged elsewhere runs again (store.done_ids)
    done = done_ids(out, skip_stores, {t.episode_id for t in tasks})
    todo = [t for t in tasks if t.episode_id not in done]
    stored = len(tasks) - len(todo)
    deferred = 0
    if limit is not None:
        deferred = max(0, len(todo) - limit)
        todo = todo[:limit]
    own_pool = pool is None
    if pool is None:
        pool = open_pool("serial" if workers <= 1 else "processes", workers, timeout_s=timeout_s,
                         initializer=worker_init)
    where = "" if shard is None else f" (shard {shard[0]} of {shard[1]})"
    log.info("campaign %s%s: %d episodes, %d already stored, %d to run on the %s pool with %d worker(s)", spec.name,
             where, len(tasks), stored, len(todo), pool.backend, pool.workers)
    t0 = time.perf_counter()
    bar = _progress(len(todo), spec.name, progress)
    failed: list[str] = []
    try:  # a basin that fails to load still closes the bar and the pool opened here
        basins = {b: load_basin(b) for b in {t.basin_dir for t in todo}}
        with EpisodeWriter(out) as writer:
            results = pool.map(run_or_stop, todo, ordered=False)
            for r in results:
                task = todo[r.index]
                bar.update(1)
                if r.ok and isinstance(r.value, Stopped):  # no later episode can heal it: stop, record nothing
                    getattr(results, "close", lambda: None)()  # abandon the episodes in flight now
                    raise CampaignStoppedError(spec.name, r.value)
                if not r.ok:
                    error = r.error if tracebacks_wanted() else (r.error.splitlines() or [""])[0]
                    log.error("episode %s failed: %s", task.episode_id, error)
                    failed.append(task.episode_id)
                    continue
                ep = r.value
                writer.write(ep, basins[task.basin_dir])
                nse = ep.best_nse if ep.best_nse is None else round(ep.best_nse, 3)
                bar.set_postfix_str(f"{ep.agent} {Path(ep.basin_id).name} NSE {nse}")
    finally:
        bar.close()
        if own_pool:
            pool.close()
    return {"episodes": len(tasks), "ran": len(todo) - len(failed), "already_stored": stored, "deferred": deferred,
            "failed": failed, "wall_s": round(time.perf_counter() - t0, 2), "out": str(out),
            "pool": pool.backend, "workers": pool.workers}


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def set_postfix_str(self, s: str) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(total: int, name: str, enabled: bool):
    if not enabled:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, desc=f"campaign {name}", unit="episode", dynamic_ncols=True)
