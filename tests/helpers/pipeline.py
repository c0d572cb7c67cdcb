"""The demo pipeline cut to seconds, shared by tests/test_pipeline.py and tests/test_pipeline_slurm.py."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "data" / "pipelines" / "demo.yaml"


def smaller_demo() -> dict:
    """demo.yaml with every budget cut to seconds (the structure and the keys are the shipped file's)."""
    d = yaml.safe_load(DEMO.read_text())
    for b in d["basins"]["train"] + d["basins"]["heldout"]:
        b.update(window_days=5, warmup_days=1)
    d["basins"]["train"] = d["basins"]["train"][:2]
    d["basins"]["heldout"] = d["basins"]["heldout"][:1]
    d["teacher"].update(seeds=[0, 1, 2])
    d["teacher"]["env"]["max_simulations"] = 2
    d["sft"].update(max_steps=4, save_every=1, log_every=1, warmup_steps=0)
    d["grpo"].update(max_steps=1, group_size=2, prompts_per_step=1, max_new_tokens=48)
    d["grpo"].setdefault("env", {})["max_turns"] = 2  # the demo's other env keys (its observation) stay
    d["evaluation"].update(seeds=[0], references=[{"name": "heuristic", "kind": "heuristic"}])
    d["evaluation"]["policy"]["max_new_tokens"] = 48
    d["evaluation"]["env"]["max_turns"] = 3
    return d


def write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
