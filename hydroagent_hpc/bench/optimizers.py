"""Classic optimizers on synthetic basins: best NSE against simulations spent, and parameter recovery.

``python -m hydroagent_hpc.bench.optimizers --basins DIR [DIR ...]`` runs every optimizer
(:data:`~hydroagent_hpc.agents.optimizers.policy.OPTIMIZERS`) for each seed through
:func:`~hydroagent_hpc.env.episode.run_episode` on each basin (default: "turns" protocol, a
200-simulation budget, no patience or turn cap, target NSE 0.999 so nothing stops early) and
prints Markdown tables: the best NSE after 25/50/100/200 simulations (the environment's own
record, full precision), and the best run's parameters against the basin's hidden truth
(``truth.json``, read here after the episode, never by the agent), as the report's recovery error
(:func:`hydroagent_hpc.report.recovery.recovery_error`: mean |log10(best/truth)| over the tunable
multipliers; 0.3 is a factor of 2).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hydroagent_hpc.agents.optimizers.policy import OPTIMIZERS, make_optimizer_policy
from hydroagent_hpc.agents.optimizers.space import ParameterSpace, clean_score
from hydroagent_hpc.config import preset
from hydroagent_hpc.env.environment import CalibrationEnv
from hydroagent_hpc.env.episode import run_episode
from hydroagent_hpc.report.recovery import recovery_error
from hydroagent_hpc.sim.basin import load_basin
from hydroagent_hpc.sim.embedded import EmbeddedSimulator
from hydroagent_hpc.sim.synth.basins import read_truth
from hydroagent_hpc.types import Episode

__all__ = ["OptimizerRun", "best_trace", "run_optimizer", "main"]

CHECKPOINTS = (25, 50, 100, 200)


@dataclass
class OptimizerRun:
    basin: str
    optimizer: str
    seed: int
    trace: list[float]  # best NSE after each simulation
    best_params: dict[str, float] | None
    wall_s: float
    stop_reason: str
    extra: dict[str, float] = field(default_factory=dict)

    def best_after(self, n: int) -> float | None:
        return self.trace[min(n, len(self.trace)) - 1] if self.trace else None


def best_trace(ep: Episode) -> list[float]:
    """The running best NSE over the episode's simulations, in the order they ran."""
    out, best = [], -np.inf
    for rec in ep.sims:
        nse = clean_score(rec.metrics.get("NSE")) if rec.ok else -np.inf
        best = max(best, nse)
        out.append(best)
    return out


def run_optimizer(basin_dir: Path, sim, name: str, seed: int, budget: int, protocol: str = "turns",
                  **options) -> OptimizerRun:
    over = dict(protocol=protocol, max_turns=None, patience=None, target_nse=0.999, wall_clock_s=None)
    if protocol == "turns":
        over["max_simulations"] = budget
    else:
        over.update(candidates_per_round=10, max_rounds=-(-budget // 10))
    env = CalibrationEnv(load_basin(basin_dir), sim, preset("paper", **over), agent=name, seed=seed)
    policy = make_optimizer_policy(name, seed, budget, **options)
    t0 = time.perf_counter()
    ep = run_episode(policy, env)
    best = dict(ep.best_params) if ep.best_params is not None else None
    return OptimizerRun(basin_dir.name, name, seed, best_trace(ep), best, time.perf_counter() - t0, ep.stop_reason)


def _f(x: float | None) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{x:.3f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hydroagent_hpc.bench.optimizers", description=__doc__.splitlines()[0])
    ap.add_argument("--basins", nargs="+", required=True, help="synthetic basin folders (with truth.json)")
    ap.add_argument("--optimizers", default=",".join(OPTIMIZERS))
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--budget", type=int, default=200)
    ap.add_argument("--protocol", choices=("turns", "rounds"), default="turns")
    ap.add_argument("--scale", choices=("linear", "log"), default="log", help="the optimizers' parameter scale")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    out = sys.stdout.write
    names = [n for n in args.optimizers.split(",") if n]
    seeds = [int(s) for s in args.seeds.split(",") if s]
    checkpoints = [c for c in CHECKPOINTS if c <= args.budget] or [args.budget]
    space = ParameterSpace()
    for folder in map(Path, args.basins):
        truth = {k: v for k, v in read_truth(folder)["multipliers"].items() if k in space.names}
        sim = EmbeddedSimulator(folder / "control.txt")
        out(f"\n## {folder.name} ({args.protocol}, {args.scale} scale, budget {args.budget}, seeds {args.seeds})\n\n")
        out("| optimizer | seed | " + " | ".join(f"best@{c}" for c in checkpoints) +
            " | sims | wall s | recovery (mean abs log10) |\n")
        out("|---|---|" + "---|" * len(checkpoints) + "---|---|---|\n")
        best_of: dict[str, OptimizerRun] = {}
        for name in names:
            for seed in seeds:
                r = run_optimizer(folder, sim, name, seed, args.budget, args.protocol, scale=args.scale)
                if name not in best_of or r.trace[-1] > best_of[name].trace[-1]:
                    best_of[name] = r
                recovery = recovery_error(r.best_params, truth) if r.best_params else None
                out(f"| {name} | {seed} | " + " | ".join(_f(r.best_after(c)) for c in checkpoints) +
                    f" | {len(r.trace)} | {r.wall_s:.1f} | {_f(recovery)} |\n")
                sys.stdout.flush()
        out("\nBest run's parameters (best seed) against the truth:\n\n")
        out("| | " + " | ".join(space.names) + " |\n|---|" + "---|" * space.dim + "\n")
        out("| truth | " + " | ".join(f"{truth[n]:.3g}" for n in space.names) + " |\n")
        for name, r in best_of.items():
            bp = r.best_params or {}
            out(f"| {name} | " + " | ".join(f"{bp.get(n, float('nan')):.3g}" for n in space.names) + " |\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
