"""The colocated layout's test pieces: the stand-in engines a run builds, and a tiny GRPO config file."""

from __future__ import annotations

from pathlib import Path

import pytest

from hydroagent_hpc.train.generation import colocated as colo
from hydroagent_hpc.train.generation.colocated_engines import EngineSpec, StandinEngine


def capture_standins(monkeypatch: pytest.MonkeyPatch) -> list[StandinEngine]:
    """The stand-in engines the trainer builds (the registry's factory, kept), in the order built."""
    made: list[StandinEngine] = []

    def factory(spec: EngineSpec) -> StandinEngine:
        made.append(StandinEngine(spec))
        return made[-1]

    monkeypatch.setitem(colo.BACKENDS, "standin", factory)
    return made


def grpo_config(tmp_path: Path, basins: Path, name: str, **extra: object) -> Path:
    """``tmp_path/name.yaml``: two basins (``b1``, ``b2``), K = 2, one prompt a step, 2 steps, 12 new tokens,
    two tool calls an episode; ``extra`` keys added or replaced (YAML text values)."""
    values: dict[str, object] = {"basins": f"[{basins / 'b1'}, {basins / 'b2'}]", "group_size": 2,
                                 "prompts_per_step": 1, "max_steps": 2, "max_new_tokens": 12, "lr": "1.0e-3",
                                 "generation_batch": 1, "env": "{max_turns: 2}", **extra}
    path = tmp_path / f"{name}.yaml"
    path.write_text("".join(f"{k}: {v}\n" for k, v in values.items()))
    return path
