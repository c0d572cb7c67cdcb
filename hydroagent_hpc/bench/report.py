"""Report benchmark: ``write_report`` over a store of 1,000 episodes, against plain reads of it.

The store is synthetic (:func:`synthetic_campaign`): 4 agents x 5 basins x 50 seeds, 20
simulations each with the full set of ``metrics.evaluate`` metrics and a 70-day hourly discharge
series, so the reads cost what a real campaign's do. Each row is timed in the same run as its
named baseline and reported as a ratio: ``read_episodes`` alone (what any report must read),
and ``read_episodes + read_sims`` (every table the report reads). Goal: a few seconds.

``python -m hydroagent_hpc.bench.report [--episodes N]`` prints the Markdown table alone.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from hydroagent_hpc.bench.timing import median_seconds
from hydroagent_hpc.metrics import evaluate
from hydroagent_hpc.params import DEFAULTS, PARAMS, TUNABLE
from hydroagent_hpc.store import EpisodeWriter, read_episodes, read_sims
from hydroagent_hpc.types import Basin, Episode, SimRecord

__all__ = ["synthetic_campaign", "run", "main", "AGENTS", "BASINS"]

logger = logging.getLogger(__name__)

AGENTS = ("base", "tuned", "dds", "llm")
#: Four synthetic twins of the paper's held-out gauges, then generic basins.
BASINS = ("syn_02338660", "syn_01403060", "syn_06279500", "syn_07144100")


def _basin_ids(n: int) -> list[str]:
    return [*BASINS[:n], *(f"basin_{i:02d}" for i in range(len(BASINS), n))]


def _series(k: int, steps: int, warmup: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1000 + k)
    t = np.arange(steps, dtype=float)
    q = np.full(steps, 2.0 + k)
    for peak, height in zip(rng.uniform(0.05, 0.95, 6) * steps, rng.uniform(20.0, 150.0, 6)):
        q += height * np.where(t >= peak, np.exp(-0.03 * (t - peak)), np.exp(-0.5 * ((t - peak) / 4.0) ** 2))
    times = np.datetime64("2021-05-01T01:00", "m") + np.arange(steps).astype("timedelta64[h]").astype("timedelta64[m]")
    return times, np.round(q, 3), np.arange(steps) < warmup


def _truth(basin_id: str) -> dict[str, float]:
    rng = np.random.default_rng(sum(map(ord, basin_id)))
    return {k: float(np.clip(DEFAULTS[k] * np.exp(rng.normal(0, 0.4)), PARAMS[k].lower, PARAMS[k].upper))
            if k in TUNABLE else float(DEFAULTS[k]) for k in PARAMS}


def synthetic_campaign(path: Path, agents: tuple[str, ...] = AGENTS, n_basins: int = 5, seeds: int = 50,
                       sims: int = 20, steps: int = 1680, warmup: int = 240, truth_root: Path | None = None) -> Path:
    """Write a store of ``len(agents) * n_basins * seeds`` episodes; deterministic in its arguments.

    Agent ``i`` converges faster and higher than agent ``i - 1``; the agent named ``llm`` records
    tokens and cost. With ``truth_root``, each basin gets a folder there with a ``truth.json``
    (as a synthetic basin's), named by the store as the folder of its control file.
    """
    ids = _basin_ids(n_basins)
    basins = []
    for k, basin_id in enumerate(ids):
        folder = (truth_root / basin_id) if truth_root is not None else Path("/nonexistent") / basin_id
        if truth_root is not None:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "truth.json").write_text(json.dumps({"basin": basin_id, "multipliers": _truth(basin_id)}))
        twin = basin_id.removeprefix("syn_") if basin_id.startswith("syn_") else None
        basins.append(Basin(basin_id, basin_id, str(folder / "control.txt"), 300.0 + 100 * k, 35.0, -90.0, "1h",
                            "2021-05-11 00:00", "2021-07-10 00:00", "2021-05-01 00:00",
                            0.8075 if twin == "02338660" else 0.7, twin, twin is not None))
    template = {}
    with EpisodeWriter(path) as w:
        for k, basin in enumerate(basins):
            times, obs, warm = _series(k, steps, warmup)
            base_sim = np.roll(obs, 2) * 0.9
            template = evaluate(obs, base_sim, times, mask=~warm)
            truth = _truth(basin.basin_id)
            for a, agent in enumerate(agents):
                for seed in range(seeds):
                    w.write(_episode(basin, agent, a, seed, sims, times, obs, warm, template, truth), basin)
    return path


def _episode(basin: Basin, agent: str, a: int, seed: int, sims: int, times: np.ndarray, obs: np.ndarray,
             warm: np.ndarray, template: dict[str, Any], truth: dict[str, float]) -> Episode:
    rng = np.random.default_rng([a, seed, sum(map(ord, basin.basin_id))])
    ceiling = 0.55 + 0.1 * a + rng.normal(0, 0.05)
    records, best, best_run = [], -np.inf, None
    for j in range(sims):
        nse = min(0.99, float(ceiling - (ceiling + 1.5) * np.exp(-(j + 1) * (0.1 + 0.08 * a)) + rng.normal(0, 0.03)))
        params = {k: float(np.clip(truth[k] * np.exp(rng.normal(0, 0.6 / (1 + a + 0.1 * j))),
                                   PARAMS[k].lower, PARAMS[k].upper)) if k in TUNABLE else truth[k] for k in PARAMS}
        m = dict(template)
        m.update({"NSE": nse, "KGE": nse - 0.05, "KGE_r": float(np.sqrt(max(0.0, (nse + 1) / 2))),
                  "peak_ratio": float(1 + rng.normal(0, 0.3 / (1 + a))), "peak_lag_h": float(rng.integers(-6, 7)),
                  "nse_band": "good" if nse > 0.7 else "unsatisfactory"})
        m["peak_error_pct"] = 100 * (m["peak_ratio"] - 1)
        q = (obs * (1 + rng.normal(0, 0.1)) + rng.normal(0, 0.5, obs.size)).astype(np.float32)
        records.append(SimRecord(j, params, True, None, m, 0.05, evaluated=True, round=None, discharge=q))
        if nse > best:
            best, best_run = nse, j
    usage = ({"model": "synthetic", "prompt_tokens": 4000 * sims, "completion_tokens": 300 * sims,
              "total_tokens": 4300 * sims, "cost_usd": 0.001 * sims} if agent == "llm" else {})
    return Episode(
        episode_id=f"bench/{basin.basin_id}/{agent}/{seed}", basin_id=basin.basin_id, agent=agent, preset="paper",
        protocol="turns", seed=seed, config={"env": {"max_simulations": sims}}, sims=records,
        best_nse=float(best), best_run=best_run,
        best_params=dict(records[best_run].params) if best_run is not None else None,
        stop_reason="max_simulations", counters={"turns": 2 * sims, "parse_failures": seed % 3 if agent == "llm" else 0,
                                                 "simulations": sims, "rounds": 0},
        wall_time_s=0.05 * sims, started_utc=f"2021-01-01T00:{seed % 60:02d}:00+00:00",
        provenance={"hydroagent_hpc": "bench", "git_commit": "synthetic"}, usage=usage,
        times=times, observed=obs, warmup=warm)


def run(episodes: int = 1000, repeats: int = 3, workdir: Path | None = None) -> list[dict[str, Any]]:
    """Time a report over a synthetic store of about ``episodes`` episodes against its reads."""
    from hydroagent_hpc.report import write_report

    seeds = max(1, round(episodes / (len(AGENTS) * 5)))
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        store = synthetic_campaign(root / "bench.h5", seeds=seeds, truth_root=root / "basins")
        write_s = time.perf_counter() - t0
        n = len(AGENTS) * 5 * seeds
        read_s = median_seconds(lambda: read_episodes(store), repeats)
        reads_s = median_seconds(lambda: (read_episodes(store), read_sims(store)), repeats)
        report_s = median_seconds(lambda: write_report(store, root / "report", precip=False), repeats)
        size_mb = store.stat().st_size / 1e6
    common = {"episodes": n, "simulations": n * 20, "store_mb": size_mb, "write_s": write_s}
    return [
        {"name": "write_report (all figures, HTML)", "baseline": "read_episodes", "seconds": report_s,
         "baseline_s": read_s, "ratio_vs_baseline": report_s / read_s, **common},
        {"name": "write_report (all figures, HTML)", "baseline": "read_episodes + read_sims", "seconds": report_s,
         "baseline_s": reads_s, "ratio_vs_baseline": report_s / reads_s, **common},
    ]


def markdown(rows: list[dict[str, Any]]) -> str:
    """The rows as the Markdown table ``make bench`` prints."""
    out = ["| benchmark | episodes | simulations | s | baseline | baseline s | ratio vs baseline |",
           "|---|---|---|---|---|---|---|"]
    out += [f"| {r['name']} | {r['episodes']} | {r['simulations']} | {r['seconds']:.2f} | {r['baseline']} | "
            f"{r['baseline_s']:.3f} | {r['ratio_vs_baseline']:.1f} |" for r in rows]
    if rows:
        out.append(f"\nStore: {rows[0]['store_mb']:.0f} MB, written in {rows[0]['write_s']:.1f} s (not timed above).")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hydroagent_hpc.bench.report", description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    sys.stdout.write(markdown(run(args.episodes, args.repeats)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
