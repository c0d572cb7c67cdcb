"""What a calibrator that never reads its observations can reach: the ceiling of blind moves.

``python -m hydroagent_hpc.bench.blind --basins DIR [--stores EVAL.h5 ...]``

A policy whose tool calls do not depend on what the environment returned (an observation-blind
policy) makes the same moves on every basin. At the learning bench's budget (8 tool calls: two
evaluated simulations, docs/learning.md) its best NSE on a basin is the better of its two
parameter sets there, so the best such policy over a set of basins is found by scoring fixed
values: for a grid :math:`x_1..x_n` of one multiplier (``alpha0`` by default, the one the teacher
moves first), with :math:`N_{b}(x)` the NSE of the simulation with that value on basin ``b``,

* the best first guess: :math:`\\max_i \\frac1B\\sum_b N_b(x_i)`;
* the best blind pair: :math:`\\max_{i<j} \\frac1B\\sum_b \\max(N_b(x_i), N_b(x_j))`;
* the per-basin oracle over the grid: :math:`\\frac1B\\sum_b \\max_i N_b(x_i)` (what reading the basin
  could reach with one simulation of that multiplier).

A trained policy whose held-out NSE sits at or under the blind pair and whose moves are the same
on every basin (``moves``: the distinct sequences of simulated parameter sets in a store) has
learnt the teacher's format and its average move, not its reading of the hydrograph.

``reading`` measures the reading directly, against the teacher's first rule (agents/heuristic.py:
a simulated peak more than 10 % above the observed one asks for more overland storage, a raise of
``alpha0``; 10 % below, a lowering): over the episodes whose first evaluated simulation had
:math:`r = Q^{sim}_{peak} / Q^{obs}_{peak}` outside :math:`[0.9, 1.1]`, the share of high-peak
episodes whose second evaluated simulation raised ``alpha0`` (:math:`h`) and of low-peak ones that
lowered it (:math:`l`), and their mean :math:`(h + l) / 2`, a balanced accuracy: a blind policy
(the same move everywhere) scores at most 0.5, a policy that follows the rule 1.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import math
import sys
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hydroagent_hpc.agents.scripted import ScriptedPolicy
from hydroagent_hpc.config import preset
from hydroagent_hpc.env.environment import CalibrationEnv
from hydroagent_hpc.env.episode import run_episode
from hydroagent_hpc.params import PARAMS, spec_of
from hydroagent_hpc.sim.basin import load_basin
from hydroagent_hpc.sim.embedded import EmbeddedSimulator
from hydroagent_hpc.store import read_episodes, read_sims

__all__ = ["PARAM_COLUMNS", "blind_ceiling", "default_grid", "moves", "nse_table", "reading", "main"]

logger = logging.getLogger(__name__)

#: The multipliers a store's simulation rows hold (the 13 of the paper; Snow-17's sit in ``extra_params``).
PARAM_COLUMNS = tuple(PARAMS)


def nse_table(basins: Sequence[Path | str], param: str = "alpha0", grid: Sequence[float] = (),
              observation: str = "released") -> dict[float, np.ndarray]:
    """NSE per basin of one simulation with ``param`` set to each grid value (the others at their defaults),
    played through the environment (``paper`` preset) as set_parameters -> run_simulation -> evaluate."""
    values = list(grid) or default_grid(param)
    out: dict[float, list[float]] = {v: [] for v in values}
    cfg = preset("paper", max_simulations=1, max_turns=3, patience=None, stop_at_target=False,
                 wall_clock_s=None, observation=observation)
    for folder in map(Path, basins):
        basin = load_basin(folder)
        sim = EmbeddedSimulator(folder / "control.txt", cache_dir=False)
        for v in values:
            script = ScriptedPolicy([{"name": "set_parameters", "arguments": {param: v}},
                                     {"name": "run_simulation"}, {"name": "evaluate"}])
            ep = run_episode(script, CalibrationEnv(basin, sim, cfg, agent="blind", seed=0))
            out[v].append(ep.best_nse if ep.best_nse is not None and math.isfinite(ep.best_nse) else -1.0)
    return {v: np.asarray(n, dtype=float) for v, n in out.items()}


def default_grid(param: str, n: int = 16) -> list[float]:
    """``n`` values log-spaced over [max(lower, 0.1), min(upper, 2)] (3 significant digits)."""
    spec = spec_of(param)
    lo, hi = max(spec.lower, 0.1), min(spec.upper, 2.0)
    return [float(f"{x:.3g}") for x in np.exp(np.linspace(math.log(lo), math.log(hi), n))]


def blind_ceiling(table: dict[float, np.ndarray]) -> dict[str, Any]:
    """The best first guess, the best blind pair and the per-basin oracle of :func:`nse_table` (module doc)."""
    if not table:
        raise ValueError("blind_ceiling: an empty table (no grid values)")
    single = max(table, key=lambda v: float(table[v].mean()))
    pair = max(itertools.combinations(table, 2), key=lambda p: float(np.maximum(table[p[0]], table[p[1]]).mean()),
               default=(single, single))
    return {"best_single": single, "best_single_nse": float(table[single].mean()),
            "best_pair": list(pair), "best_pair_nse": float(np.maximum(table[pair[0]], table[pair[1]]).mean()),
            "oracle_nse": float(np.max(np.stack(list(table.values())), axis=0).mean()),
            "basins": int(len(next(iter(table.values()))))}


def moves(store: Path | str, agent: str | None = None, episode_ids: Collection[str] | None = None,
          evaluated_only: bool = True) -> dict[str, Any]:
    """The simulated parameter sets of each episode in ``store`` (of ``agent``, or the ``episode_ids``), in
    order, and how many distinct sequences there are: one sequence over every basin means the policy's
    moves did not depend on the basin."""
    if agent is not None and episode_ids is not None:
        raise ValueError("moves: give agent or episode_ids, not both")
    if episode_ids is None:
        eps = read_episodes(store)
        ids = list(eps[eps.agent == agent].episode_id if agent is not None else eps.episode_id)
    else:  # the caller has read and filtered the episodes already
        ids = list(episode_ids)
    sims = read_sims(store)
    sims = sims[sims.episode_id.isin(set(ids))].sort_values(["episode_id", "run_id"])
    if evaluated_only:
        sims = sims[sims.evaluated.astype(bool)]
    names = [c for c in PARAM_COLUMNS if c in sims.columns]
    seqs = {eid: tuple(tuple(round(float(x), 6) for x in row) for row in g[names].to_numpy())
            for eid, g in sims.groupby("episode_id")}
    seqs.update({eid: () for eid in ids if eid not in seqs})  # no evaluated simulation: the empty one
    return {"episodes": len(ids), "distinct_sequences": len(set(seqs.values())), "sequences": seqs}


def reading(store: Path | str, episode_ids: Collection[str] | None = None, param: str = "alpha0",
            band: float = 0.1) -> dict[str, Any]:
    """Whether the second evaluated move of ``param`` follows the first evaluation's peak ratio (module
    doc): ``high``/``raised``, ``low``/``lowered`` (counts) and ``reads`` = (raised/high + lowered/low) / 2
    (NaN when either kind of basin is missing), over the episodes given (all by default)."""
    sims = read_sims(store)
    if episode_ids is not None:
        sims = sims[sims.episode_id.isin(set(episode_ids))]
    if "peak_ratio" not in sims.columns or param not in sims.columns:
        return {"high": 0, "raised": 0, "low": 0, "lowered": 0, "reads": math.nan}
    sims = sims[sims.evaluated.astype(bool)].sort_values(["episode_id", "run_id"])
    counts = dict.fromkeys(("high", "raised", "low", "lowered"), 0)
    for _, g in sims.groupby("episode_id"):
        if len(g) < 2:
            continue
        r = float(g.peak_ratio.iloc[0])
        first, second = float(g[param].iloc[0]), float(g[param].iloc[1])
        if r > 1.0 + band:
            counts["high"] += 1
            counts["raised"] += second > first
        elif r < 1.0 - band:
            counts["low"] += 1
            counts["lowered"] += second < first
    reads = (counts["raised"] / counts["high"] + counts["lowered"] / counts["low"]) / 2 \
        if counts["high"] and counts["low"] else math.nan
    return {**counts, "reads": reads}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hydroagent_hpc.bench.blind", description=__doc__.split("\n")[0])
    ap.add_argument("--basins", type=Path, required=True, help="a folder of basin folders (e.g. BENCH/heldout/basins)")
    ap.add_argument("--param", default="alpha0")
    ap.add_argument("--stores", type=Path, nargs="*", default=[], help="evaluation stores whose moves to count")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    folders = sorted(p for p in args.basins.iterdir() if (p / "control.txt").is_file())
    if not folders:
        ap.error(f"--basins {args.basins}: no basin folders (each with a control.txt) in it")
    table = nse_table(folders, args.param)
    c = blind_ceiling(table)
    print(f"| {args.param} | mean NSE over {c['basins']} basins |\n|---|---|")
    for v, n in table.items():
        print(f"| {v:g} | {n.mean():.3f} |")
    print(f"\nbest first guess {args.param} = {c['best_single']:g}: {c['best_single_nse']:.3f}; "
          f"best blind pair {c['best_pair'][0]:g}, {c['best_pair'][1]:g}: {c['best_pair_nse']:.3f}; "
          f"per-basin oracle over the grid: {c['oracle_nse']:.3f}")
    for store in args.stores:
        for agent in sorted(set(read_episodes(store).agent)):
            m = moves(store, agent)
            print(f"{store} {agent}: {m['distinct_sequences']} distinct sequences of evaluated parameter sets "
                  f"over {m['episodes']} episodes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
