"""Run under ``mpiexec -n N``: GRPO rollouts whose simulations run on the worker ranks.

``python grpo_mpi_rollouts.py BASIN_DIR LIMIT``: rank 0 plays 4 rollouts of a policy that writes
valid calls (set_parameters with a per-rollout wm, run_simulation, evaluate; its ids are the
tokenised text, not samples) with the simulations on the other ranks behind a cap of LIMIT, then
the same rollouts with the simulations in its own threads, and prints one JSON line: per rollout
the NSE of each evaluate both ways, the peak in flight and the shared-run counts.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from hydroagent_hpc.config import preset
from hydroagent_hpc.env.environment import CalibrationEnv
from hydroagent_hpc.env.toolcalls import render_hermes
from hydroagent_hpc.hpc.mpi import mpi_pool
from hydroagent_hpc.sim import open_simulator
from hydroagent_hpc.sim.basin import load_basin
from hydroagent_hpc.train.generation.rollout import (
    RemoteRunner,
    RolloutPolicy,
    RolloutSpec,
    SharedRuns,
    SimulationSlots,
    run_rollouts,
)
from hydroagent_hpc.train.generation.sampler import BatchedSampler, GenerationServer, Sampling
from hydroagent_hpc.types import ToolCall


class WritesCalls(RolloutPolicy):
    """Writes a fixed plan of calls: the engine, not the model, is under test."""

    def __init__(self, *args: Any, wm: float, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.plan = [ToolCall("set_parameters", {"wm": wm}), ToolCall("run_simulation", {}),
                     ToolCall("evaluate", {})] * 2

    def _generate(self, ids: list[int], seed: int | None) -> list[int]:
        k = len(self.trace)
        text = render_hermes(self.plan[k % len(self.plan)]) + "<|im_end|>"
        out = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        self.sample_logprobs += [0.0] * len(out)
        return list(out)


def main() -> None:
    basin_dir, limit = sys.argv[1], int(sys.argv[2])
    with mpi_pool(max_in_flight=limit, timeout_s=120) as pool:
        if pool is None:
            return
        from hydroagent_hpc.train.tiny import build_tiny

        model, tok = build_tiny(seed=0)
        basin = load_basin(basin_dir)
        sims = {basin_dir: open_simulator(f"{basin_dir}/control.txt")}
        sampling = Sampling(max_new_tokens=64)
        specs = [RolloutSpec(0, k, basin_dir, k, f"m{k}") for k in range(4)]
        wms = [0.6, 0.8, 0.6, 1.2]  # two rollouts share a parameter set
        out: dict[str, Any] = {}
        for where, runner in (("mpi", RemoteRunner(pool)), ("local", None)):
            slots, shared = SimulationSlots(limit), SharedRuns()
            with GenerationServer(BatchedSampler(model, [tok.convert_tokens_to_ids("<|im_end|>")], 0,
                                                 sampling)) as server:
                rollouts = run_rollouts(
                    specs, env_factory=lambda s, sim: CalibrationEnv(basin, sim, preset("paper", max_turns=6),
                                                                     seed=s.seed, episode_id=s.episode_id),
                    simulators=sims, slots=slots, shared=shared, runner=runner,
                    policy_factory=lambda s: WritesCalls(model, tok, server, sampling, seed=s.seed,
                                                         max_context_tokens=32768, wm=wms[s.member]))
            out[where] = {"nse": [[t.observation.get("NSE") for t in r.episode.turns if t.tool == "evaluate"]
                                  for r in rollouts if r.episode is not None],
                          "errors": [r.error for r in rollouts], "peak": slots.peak, "runs": slots.runs,
                          "hits": shared.hits, "misses": shared.misses}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
