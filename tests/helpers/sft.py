"""Short SFT data files for the trainer tests: real conversations, tokenised by the real builder.

:func:`short_trajectories` renders short calibration conversations (system, user, then 1-3 rounds
of a Hermes tool call and its tool response, ending with an assistant turn) with the tiny
tokenizer through :class:`~hydroagent_hpc.agents.llm.trajectory.TrajectoryBuilder` (no tools
block, so sequences are 60-250 tokens instead of the thousands of a stored episode).
:func:`write_sft_data` writes them in the ``train sft-data`` schema (same datasets and
attributes :class:`~hydroagent_hpc.train.sft.data.SFTDataset` reads).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from hydroagent_hpc.agents.llm.trajectory import Trajectory, TrajectoryBuilder
from hydroagent_hpc.env.toolcalls import render_hermes, render_tool_response
from hydroagent_hpc.train.sft.data import DATA_SCHEMA, DATA_VERSION
from hydroagent_hpc.types import ToolCall

_TEXT = ("The peaks are too low, so I lower wm.", "Timing is late; I raise alpha.", "Baseflow is too small.",
         "The fit improved; one more change.")


def short_trajectories(tokenizer: Any, n: int, seed: int = 0) -> list[Trajectory]:
    rng = np.random.default_rng(seed)
    builder = TrajectoryBuilder(tokenizer)
    out = []
    for i in range(n):
        msgs: list[dict[str, Any]] = [{"role": "system", "content": "You calibrate the CREST model."},
                                      {"role": "user", "content": f"Calibrate basin {i}."}]
        for _ in range(int(rng.integers(1, 4))):
            call = ToolCall("set_parameters", {"wm": round(float(rng.uniform(50, 300)), 1),
                                               "b": round(float(rng.uniform(1, 20)), 2)})
            msgs.append({"role": "assistant", "content": f"{rng.choice(_TEXT)}\n{render_hermes(call)}"})
            msgs.append({"role": "tool", "content": render_tool_response(
                {"status": "ok", "NSE": round(float(rng.normal(0.5, 0.2)), 3)})})
        msgs.append({"role": "assistant", "content": str(rng.choice(_TEXT))})
        out.append(builder.build(msgs))
    return out


def write_sft_data(path: Path, trajs: Sequence[Trajectory], weights: Sequence[float]) -> Path:
    """An SFT data file of ``trajs`` with per-example ``weights`` (schema of train/sft/data.py)."""
    lengths = np.array([len(t) for t in trajs], dtype=np.int64)
    n_spans = np.array([len(t.spans) for t in trajs], dtype=np.int64)
    string = h5py.string_dtype("utf-8")
    with h5py.File(path, "w") as f:
        f.attrs.update({"schema": DATA_SCHEMA, "schema_version": DATA_VERSION, "preset": "test", "tokenizer": "tiny",
                        "max_tokens": int(lengths.max()), "sources": json.dumps([]), "counts": json.dumps({})})
        f["input_ids"] = np.concatenate([t.input_ids for t in trajs]).astype(np.int32)
        f["assistant_mask"] = np.concatenate([t.assistant_mask for t in trajs]).astype(np.uint8)
        f["offsets"] = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        f["spans"] = np.concatenate([np.asarray(t.spans, dtype=np.int64).reshape(-1, 2) for t in trajs])
        f["span_offsets"] = np.concatenate([[0], np.cumsum(n_spans)]).astype(np.int64)
        f["weight"] = np.asarray(weights, dtype=np.float64)
        f["best_nse"] = np.full(len(trajs), 0.7)
        f["source"] = np.zeros(len(trajs), dtype=np.int32)
        for name in ("episode_id", "basin_id", "agent"):
            f.create_dataset(name, data=[f"{name}-{i}" for i in range(len(trajs))], dtype=string)
    return path
