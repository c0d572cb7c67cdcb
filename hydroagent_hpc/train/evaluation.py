"""Batched greedy evaluation of a policy checkpoint: the GRPO validation path as a function.

:func:`evaluate_policy` plays one greedy episode per basin and seed with the trainer's own rollout
machinery (:func:`hydroagent_hpc.train.grpo.trainer.play_episodes`: all episodes' model turns batched, the prompt
prefix cached across turns, identical parameter sets on a basin simulated once) and stores them as
ordinary episodes (agent ``agent``, episode id ``{agent}/{basin}/{seed}``) in an episode store that
``hydroagent report`` and the campaign tools read. Episodes already in the store are not played
again, so an interrupted evaluation resumes.

It plays exactly what an ``hf_local`` agent would (the same chat template, tool schemas, stop
tokens, context handling and parser: :class:`~hydroagent_hpc.train.generation.rollout.RolloutPolicy`), with
the environment built from ``preset`` and ``env`` as a campaign builds it; it is several times
faster on a CPU because a campaign's ``hf_local`` agent re-reads the whole conversation on every
turn and generates for one episode at a time (docs/grpo.md, "Evaluation").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from hydroagent_hpc.sim import open_simulator
from hydroagent_hpc.sim.basin import load_basin
from hydroagent_hpc.train.grpo.config import grpo_config_from_mapping

log = logging.getLogger(__name__)

__all__ = ["evaluate_policy"]


def evaluate_policy(model: str | Path, basins: Sequence[str | Path], store: str | Path, *, agent: str,
                    seeds: Sequence[int] = (0,), preset: str = "paper", env: Mapping[str, Any] | None = None,
                    max_new_tokens: int = 512, max_context_tokens: int = 8192, generation_batch: int = 64,
                    simulator: str = "embedded") -> dict[str, Any]:
    """Play ``model`` greedily on every basin x seed not yet in ``store``; returns counts and the wall time."""
    from hydroagent_hpc.train.generation.rollout import RolloutSpec
    from hydroagent_hpc.train.grpo.trainer import EpisodeStore, load_policy, play_episodes

    t0 = time.perf_counter()
    dirs = [str(Path(b).resolve()) for b in basins]
    config = grpo_config_from_mapping({"basins": dirs, "model": str(model), "preset": preset, "env": dict(env or {}),
                                       "max_new_tokens": max_new_tokens, "max_context_tokens": max_context_tokens,
                                       "generation_batch": generation_batch, "simulator": simulator,
                                       "dtype": "fp32" if not torch.cuda.is_available() else "auto"})
    loaded = {d: load_basin(d) for d in dirs}
    episodes = EpisodeStore(Path(store))
    episodes.basins = loaded
    try:
        specs = [RolloutSpec(g, 0, d, int(seed), f"{agent}/{loaded[d].basin_id}/{int(seed)}")
                 for g, (d, seed) in enumerate((d, s) for d in dirs for s in seeds)]
        todo = [s for s in specs if not episodes.writer.has(s.episode_id)]
        if todo:
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            policy, tokenizer = load_policy(config, device)
            policy.config.use_cache = True
            sims = {d: open_simulator(Path(d) / "control.txt", simulator) for d in {s.basin_dir for s in todo}}
            rollouts, _ = play_episodes(config, policy, tokenizer, todo, sims, loaded, greedy=True, agent=agent)
            episodes.write(rollouts)
    finally:
        episodes.close()
    wall = time.perf_counter() - t0
    log.info("%s: %d episodes played, %d already stored, %.1f s", agent, len(todo), len(specs) - len(todo), wall)
    return {"episodes": len(specs), "played": len(todo), "wall_s": wall}
