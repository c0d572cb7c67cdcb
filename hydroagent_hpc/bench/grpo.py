"""GRPO rollouts and steps on the CPU: ``python -m hydroagent_hpc.bench.grpo [--quick]``.

Two measurements, each with its baseline in the same run:

1. **Asynchronous vs lock-step rollouts.** One rollout batch: the four demo basins (327 to
   1,204 cells, 2,160 hourly steps; mixed sizes on purpose) x K rollouts, played twice by
   :func:`~hydroagent_hpc.train.generation.rollout.run_rollouts` with the same seeds: as the engine runs
   them (one thread per episode, no waiting on each other) and behind a
   :class:`~hydroagent_hpc.train.generation.rollout.TurnGate` (every rollout waits for all others at
   every turn, the schedule of trainers that step rollouts together). Workload per turn: the
   tiny Qwen3 decodes the turn through the generation server (real batched, prefix-cached decode
   steps), forced to emit the next call of a scripted calibration plan (set_parameters with
   seeded random multipliers, run_simulation, evaluate), so every rollout really simulates; a
   random tiny model would only write parse failures and never simulate.
   Reported: wall time of the batch, the speed-up, and how busy the simulation slots were
   (simulation seconds / (wall x slots), slots = min(cap, CPU cores)).
2. **Step breakdown.** A real ``train_grpo`` step of the tiny model (fp32, CPU) on small
   synthetic basins: seconds in generation, simulation and training per step.

No GPU figure comes from here; a GPU variant (Qwen3-4B shape, 4 prompts x K=8) is still to be
written and run where a GPU is lent.
"""

from __future__ import annotations

import argparse
import csv
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from hydroagent_hpc.agents.llm.hf_local import HFLocalPolicy
from hydroagent_hpc.config import preset
from hydroagent_hpc.env.toolcalls import render_hermes
from hydroagent_hpc.params import PARAMS
from hydroagent_hpc.sim import open_simulator
from hydroagent_hpc.sim.basin import load_basin
from hydroagent_hpc.train.grpo.config import grpo_config_from_mapping
from hydroagent_hpc.types import ToolCall

__all__ = ["schedule_comparison", "step_breakdown", "markdown", "main"]

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[2]


def _plan(seed: int, turns: int) -> list[Any]:
    rng = np.random.default_rng(seed)
    calls: list[ToolCall] = []
    while len(calls) < turns:
        values = {n: round(float(rng.uniform(max(PARAMS[n].lower, 0.5 * PARAMS[n].default),
                                            min(PARAMS[n].upper, 1.5 * PARAMS[n].default))), 4)
                  for n in ("wm", "b", "ke", "under")}  # within half and 1.5 times the default, in bounds
        calls += [ToolCall("set_parameters", values), ToolCall("run_simulation", {}), ToolCall("evaluate", {})]
    return calls[:turns]


def _scripted_policy_class() -> Any:
    from hydroagent_hpc.train.generation.rollout import RolloutPolicy

    class ScriptedTurns(RolloutPolicy):
        """Decodes the plan's next call through the shared server (forced ids: the decode steps and
        their cost are real, the text is the plan's), so the environment gets a valid call."""

        plan: list[Any] = []

        def _generate(self, ids: list[int], seed: int | None) -> list[int]:
            text = render_hermes(self.plan[len(self.trace) % len(self.plan)]) + "<|im_end|>"
            forced = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            t0 = time.perf_counter()
            sample = self.server.generate(ids, seed, key=id(self), forced=forced)
            self.generation_wait_s += time.perf_counter() - t0
            self.sample_logprobs += sample.logprobs
            return list(sample.ids)

    return ScriptedTurns


def schedule_comparison(basin_dirs: list[Path], k: int = 8, turns: int = 12, max_new_tokens: int = 128,
                        cap: int = 32) -> list[dict[str, Any]]:
    """Play one rollout batch asynchronously and in lock-step (same seeds); one row each."""
    from hydroagent_hpc.env.environment import CalibrationEnv
    from hydroagent_hpc.train.generation.rollout import RolloutSpec, SharedRuns, SimulationSlots, run_rollouts
    from hydroagent_hpc.train.generation.sampler import BatchedSampler, GenerationServer, Sampling
    from hydroagent_hpc.train.tiny import build_tiny

    model, tok = build_tiny(seed=0)
    model.eval()
    probe = HFLocalPolicy(model, tok)
    sampling = Sampling(max_new_tokens=max_new_tokens)
    dirs = [str(d) for d in basin_dirs]
    basins = {d: load_basin(d) for d in dirs}
    sims = {d: open_simulator(Path(d) / "control.txt") for d in dirs}
    for d in dirs:  # compile and warm every basin once, outside the timings
        sims[d].run(None)
    specs = [RolloutSpec(g, m, d, 1000 * g + m, f"b{g}-{m}") for g, d in enumerate(dirs) for m in range(k)]
    env_config = preset("paper", max_turns=turns, patience=None, stop_at_target=False)
    scripted = _scripted_policy_class()
    cores = os.cpu_count() or 1
    rows: list[dict[str, Any]] = []
    for schedule in ("async", "lockstep"):
        slots = SimulationSlots(cap)
        with GenerationServer(BatchedSampler(model, probe.stop_ids, probe.pad_id, sampling)) as server:
            def make_policy(spec: Any, server: Any = server) -> Any:
                p = scripted(model, tok, server, sampling, seed=spec.seed, max_context_tokens=32768)
                p.plan = _plan(spec.seed, turns)
                return p

            t0 = time.perf_counter()
            out = run_rollouts(specs, env_factory=lambda s, sim: CalibrationEnv(
                basins[s.basin_dir], sim, env_config, agent="bench", seed=s.seed, episode_id=s.episode_id),
                simulators=sims, policy_factory=make_policy, slots=slots, shared=SharedRuns(),
                lockstep=schedule == "lockstep")
            wall = time.perf_counter() - t0
            stats = dict(server.stats)
        errors = [r.error for r in out if r.error]
        sims_done = sum(r.episode.counters.get("simulations", 0) for r in out if r.episode is not None)
        failures = sum(t.kind == "parse_failure" for r in out if r.episode is not None for t in r.episode.turns)
        if failures:  # the workload must be the plan's valid calls, or the comparison measures nothing
            raise RuntimeError(f"{failures} parse failures in the scripted workload (max_new_tokens "
                               f"{max_new_tokens} too small for a call?)")
        n_slots = min(cap, cores)
        rows.append({"schedule": schedule, "rollouts": len(out), "errors": len(errors), "simulations": sims_done,
                     "wall_s": wall, "simulation_s": slots.busy_s, "slot_busy": slots.busy_s / (wall * n_slots),
                     "slots": n_slots, "generation_s": stats["busy_s"], "batches": stats["batches"],
                     "mean_batch": stats["rows"] / max(1, stats["batches"]), "peak_in_flight": slots.peak})
    rows[0]["speedup"] = float(rows[1]["wall_s"]) / float(rows[0]["wall_s"])
    return rows


def step_breakdown(workdir: Path, steps: int = 2) -> list[dict[str, Any]]:
    """A real ``train_grpo`` run of the tiny model; the per-step time split from its metrics."""
    from hydroagent_hpc.sim.synth.basins import synthesize_basin
    from hydroagent_hpc.train.grpo.trainer import train_grpo

    names = []
    for i, name in enumerate(("syn_g1", "syn_g2")):
        folder = workdir / "basins" / name
        if not (folder / "control.txt").exists():
            synthesize_basin(folder, name=name, area_km2=80.0, window_days=10, warmup_days=3, seed=60 + i,
                             start="2021-07-01")
        names.append(str(folder))
    config = grpo_config_from_mapping({"basins": names, "group_size": 4, "prompts_per_step": 2, "max_steps": steps,
                                       "max_new_tokens": 32, "lr": 1e-5, "env": {"max_turns": 4}})
    train_grpo(config, workdir / "run", resume=False)
    with open(workdir / "run" / "metrics.csv", newline="") as fh:
        return [{k: float(v) for k, v in r.items() if k != "stop_reasons"} for r in csv.DictReader(fh)]


def markdown(schedule: list[dict[str, Any]], steps: list[dict[str, Any]]) -> str:
    lines = ["| schedule | rollouts | simulations | wall s | speed-up | simulation s | slots busy | "
             "generation s | batches (mean rows) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in schedule:
        lines.append(f"| {r['schedule']} | {r['rollouts']} | {r['simulations']} | {r['wall_s']:.1f} | "
                     f"{r.get('speedup', 1.0):.2f}x | {r['simulation_s']:.1f} | {r['slot_busy']:.0%} of "
                     f"{r['slots']} | {r['generation_s']:.1f} | {r['batches']} ({r['mean_batch']:.1f}) |")
    lines += ["", "Speed-up: lock-step wall / asynchronous wall, same rollouts and seeds in the same run.", "",
              "| GRPO step | rollouts | generation s | simulation s | training s | step s | tokens |",
              "|---|---|---|---|---|---|---|"]
    for r in steps:
        lines.append(f"| {int(r['step'])} | {int(r['rollouts'])} | {r['generation_s']:.1f} | {r['simulation_s']:.1f} "
                     f"| {r['training_s']:.1f} | {r['step_s']:.1f} | {int(r['tokens'])} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hydroagent_hpc.bench.grpo",
                                 description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--basins", default=str(ROOT / "results" / "demo" / "basins"),
                    help="where the demo basins are (built if missing)")
    ap.add_argument("--k", type=int, default=8, help="rollouts per basin (default 8)")
    ap.add_argument("--turns", type=int, default=12, help="tool calls per rollout (default 12)")
    ap.add_argument("--quick", action="store_true", help="K=4, 6 turns, 1 GRPO step (the make bench section)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from hydroagent_hpc.sim.synth.basins import build_demo_basins

    dirs = [c.parent for c in build_demo_basins(args.basins)]
    k, turns, steps = (4, 6, 1) if args.quick else (args.k, args.turns, 2)
    schedule = schedule_comparison(dirs, k=k, turns=turns)
    with tempfile.TemporaryDirectory(prefix="hydroagent-bench-grpo-") as tmp:
        breakdown = step_breakdown(Path(tmp), steps=steps)
    sys.stdout.write(markdown(schedule, breakdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
