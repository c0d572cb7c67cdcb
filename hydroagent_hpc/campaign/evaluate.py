"""``hydroagent train eval CHECKPOINT_OR_URL --basins ... --budget N --out STORE.h5``: a trained policy (or
any model behind an OpenAI-compatible endpoint) evaluated as an ordinary campaign.

Composition, nothing new underneath: one campaign (:mod:`hydroagent_hpc.campaign.spec`) with one agent
on the given basins and seeds, run into an episode store by :func:`~hydroagent_hpc.campaign.run.run_campaign`
(so it resumes: stored episodes are not played again), then a table of the store's episodes.

- A local folder (a ``save_pretrained`` checkpoint such as a run's ``final/``: it must hold
  ``config.json``) plays as an ``hf_local`` agent with ``greedy: true`` (the pipeline's evaluation
  stage does the same; docs/pipeline.md).
- An ``http://`` or ``https://`` base URL plays as an ``openai`` agent: the models-file entry
  ``model_entry`` (default ``hydroagent-local``, Hermes text, for our own checkpoints served by vLLM or
  SGLang; ``vllm-qwen3-4b`` for native calls) with its ``base_url`` replaced and ``temperature: 0``.
- The budget rules are the campaign's: the environment preset (``paper`` or ``released``) with
  ``max_simulations`` = ``budget`` (and ``max_turns`` when given), as ``hydroagent calibrate`` and
  campaign files set them.

The summary has one row per episode (basin, seed, best NSE, simulations, turns, parse failures,
reward, stop reason) and the mean and median best NSE over the episodes that scored one;
:func:`summary_values` gives the same as numbers (what ``--report-to`` sends to TensorBoard and W&B).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydroagent_hpc.campaign.run import run_campaign
from hydroagent_hpc.campaign.spec import CampaignSpec, campaign_from_mapping
from hydroagent_hpc.config import PRESETS
from hydroagent_hpc.errors import UsageError
from hydroagent_hpc.store import read_episodes, read_turns

__all__ = ["DEFAULT_ENTRY", "evaluation_agent", "evaluation_campaign", "summary_rows", "summary_values",
           "format_summary", "evaluate"]

#: The models-file entry an evaluation of a URL uses by default (data/models.yaml: our checkpoints, Hermes text).
DEFAULT_ENTRY = "hydroagent-local"


def _is_url(target: str) -> bool:
    return target.startswith(("http://", "https://"))


def evaluation_agent(target: str, *, name: str = "eval", model_entry: str = DEFAULT_ENTRY,
                     max_new_tokens: int | None = None, max_context_tokens: int | None = None) -> dict[str, Any]:
    """The campaign's agent entry for ``target`` (a checkpoint folder or a base URL; see the module doc)."""
    if _is_url(target):
        agent: dict[str, Any] = {"name": name, "kind": "openai", "model": model_entry, "base_url": target,
                                 "temperature": 0.0}
        if max_new_tokens is not None:
            agent["max_tokens"] = int(max_new_tokens)
        return agent
    folder = Path(target).expanduser()
    if not (folder / "config.json").is_file():
        what = "no such folder" if not folder.exists() else "a folder without config.json"
        raise UsageError(f"CHECKPOINT_OR_URL {target}: {what}; neither a checkpoint folder nor an http(s) URL",
                         "give a save_pretrained folder (a run's final/) or an OpenAI-compatible base URL "
                         "(http://HOST:PORT/v1)")
    agent = {"name": name, "kind": "hf_local", "path": str(folder.resolve()), "greedy": True}
    if max_new_tokens is not None:
        agent["max_new_tokens"] = int(max_new_tokens)
    if max_context_tokens is not None:
        agent["max_context_tokens"] = int(max_context_tokens)
    return agent


def evaluation_campaign(target: str, basins: Sequence[str | Path], *, budget: int, preset: str = "paper",
                        seeds: Sequence[int] = (0,), max_turns: int | None = None, name: str = "eval",
                        model_entry: str = DEFAULT_ENTRY, max_new_tokens: int | None = None,
                        max_context_tokens: int | None = None) -> CampaignSpec:
    """The evaluation campaign (checked as a campaign file is: one-line errors naming the key)."""
    if preset not in PRESETS:
        raise UsageError(f"--preset {preset!r}: unknown", f"use one of {', '.join(PRESETS)}")
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise UsageError(f"--budget {budget!r}: must be a whole number >= 1 (simulations per episode)")
    env: dict[str, Any] = {"preset": preset, "max_simulations": int(budget)}
    if max_turns is not None:
        env["max_turns"] = int(max_turns)
    agent = evaluation_agent(target, name=name, model_entry=model_entry, max_new_tokens=max_new_tokens,
                             max_context_tokens=max_context_tokens)
    data = {"name": name, "description": f"hydroagent train eval {target}",
            "basins": [str(Path(b).resolve()) for b in basins], "agents": [agent], "seeds": [int(s) for s in seeds],
            "env": env}
    return campaign_from_mapping(data, source="train eval")


def summary_rows(store: str | Path, agent: str | None = None) -> list[dict[str, Any]]:
    """One row per stored episode (of ``agent`` when given): basin, seed, best NSE, simulations, turns,
    parse failures, stop reason, in basin and seed order."""
    df = read_episodes(store)
    if agent is not None:
        df = df[df["agent"] == agent]
    rows = []
    for d in df.sort_values(["basin_id", "seed"]).to_dict("records"):  # itertuples renames counters.turns
        nse = d.get("best_nse")
        rows.append({"episode_id": d["episode_id"], "basin": d["basin_id"], "seed": int(d["seed"]),
                     "best_nse": None if nse is None or not math.isfinite(float(nse)) else float(nse),
                     "simulations": int(d.get("n_sims", 0)), "turns": int(d.get("counters.turns", 0) or 0),
                     "parse_failures": int(d.get("counters.parse_failures", 0) or 0),
                     "reward": float(d.get("total_reward", math.nan)), "stop": str(d.get("stop_reason", ""))})
    return rows


def summary_values(store: str | Path, rows: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """The evaluation's summary as numbers, over the episodes ``rows`` (:func:`summary_rows`) of ``store``:
    ``episodes``, ``scored`` (episodes with a best NSE), ``best_nse_mean`` and ``best_nse_median`` (over the
    scored ones), ``valid_calls`` (share of the assistant messages, read from the turns, without a parse
    failure; the report's definition), ``simulations``, ``parse_failures`` and ``reward`` (means per
    episode), and ``best_nse/<basin>`` (mean over the basin's scored seeds). None where there is nothing to average."""
    scored = [r["best_nse"] for r in rows if r["best_nse"] is not None]
    n = len(rows)
    out: dict[str, float | None] = {
        "episodes": float(n), "scored": float(len(scored)),
        "best_nse_mean": statistics.fmean(scored) if scored else None,
        "best_nse_median": float(statistics.median(scored)) if scored else None,
        "simulations": statistics.fmean(r["simulations"] for r in rows) if n else None,
        "parse_failures": statistics.fmean(r["parse_failures"] for r in rows) if n else None,
        "reward": statistics.fmean(r["reward"] for r in rows) if n else None,
        "valid_calls": None}
    ids = {r["episode_id"] for r in rows}
    turns = read_turns(store) if ids else None
    if turns is not None and len(turns):
        turns = turns[turns["episode_id"].isin(ids)]
        messages = turns.groupby("episode_id").message_index.nunique().sum()
        failed = turns[turns["kind"] == "parse_failure"].groupby("episode_id").message_index.nunique().sum()
        out["valid_calls"] = float(1 - failed / messages) if messages else None
    for basin in sorted({r["basin"] for r in rows}):
        values = [r["best_nse"] for r in rows if r["basin"] == basin and r["best_nse"] is not None]
        out[f"best_nse/{basin}"] = statistics.fmean(values) if values else None
    return out


def format_summary(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as a fixed-width table, with the mean and median best NSE below."""
    head = ("basin", "seed", "best NSE", "sims", "turns", "parse fail", "stop")
    body = [(r["basin"], str(r["seed"]), "-" if r["best_nse"] is None else f"{r['best_nse']:.4f}",
             str(r["simulations"]), str(r["turns"]), str(r["parse_failures"]), r["stop"]) for r in rows]
    widths = [max(len(c) for c in col) for col in zip(head, *body)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in (head, *body)]
    scored = [r["best_nse"] for r in rows if r["best_nse"] is not None]
    if scored:
        lines.append(f"{len(rows)} episodes, {len(scored)} scored: best NSE mean {statistics.fmean(scored):.4f}, "
                     f"median {statistics.median(scored):.4f}")
    else:
        lines.append(f"{len(rows)} episodes, none scored an NSE")
    return "\n".join(lines) + "\n"


def evaluate(target: str, basins: Sequence[str | Path], out: str | Path, *, budget: int, preset: str = "paper",
             seeds: Sequence[int] = (0,), max_turns: int | None = None, name: str = "eval",
             model_entry: str = DEFAULT_ENTRY, max_new_tokens: int | None = None,
             max_context_tokens: int | None = None, workers: int = 1) -> dict[str, Any]:
    """Run the evaluation campaign into ``out`` and return the campaign's counts with the summary ``rows``."""
    spec = evaluation_campaign(target, basins, budget=budget, preset=preset, seeds=seeds, max_turns=max_turns,
                               name=name, model_entry=model_entry, max_new_tokens=max_new_tokens,
                               max_context_tokens=max_context_tokens)
    counts = run_campaign(spec, out, workers=workers, progress=False)
    rows = summary_rows(out, agent=name)
    return {**counts, "out": str(out), "rows": rows, "summary": summary_values(out, rows)}
