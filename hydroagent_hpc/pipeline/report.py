"""The pipeline's report: ``RUN/report/report.md`` and ``report.html`` (+ ``figures/``, ``tables/``).

First table: the paper's Table 1 layout (Li et al. 2026, Table 1: per held-out basin, each method's
best NSE, simulations used, turns and parse failures) for the trained policies (base, SFT, GRPO)
and the references, read from the evaluation campaign's store; then the NSE-against-simulations
figure of every policy, the training curves (SFT loss, GRPO reward and its parts per step), and the
wall time of each stage from the run's records. The evaluation campaign's full report (hydrographs,
comparison, parameter recovery, published numbers) is written beside it in ``report/campaign/``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from hydroagent_hpc.pipeline.spec import POLICIES, STAGES, PipelineSpec
from hydroagent_hpc.pipeline.state import PipelineStateError, read_record
from hydroagent_hpc.report import figures as fig
from hydroagent_hpc.report import tables as tab
from hydroagent_hpc.report.document import Block, Figure, Heading, Paragraph, Table, to_html, to_markdown
from hydroagent_hpc.report.results import load_results
from hydroagent_hpc.report.sections import num
from hydroagent_hpc.report.training import read_metrics, training_figure

log = logging.getLogger(__name__)

__all__ = ["table1", "overall", "in_words", "write_pipeline_report", "format_table1"]

#: The best NSE an episode without a scored simulation counts as in the overall means (the floor of the
#: paper's clipped terminal term), so a policy that never simulates cannot look better by having no score.
UNSCORED_NSE = -1.0

_LABELS = {"base": "Base", "sft": "SFT-only", "grpo": "SFT+GRPO"}


def table1(summary: pd.DataFrame, basin_order: list[str], agent_order: list[str]) -> pd.DataFrame:
    """Table 1's rows from :func:`hydroagent_hpc.report.tables.summary_table`: ``basin, method, agent,
    seeds, best_nse, best_nse_std, sims, turns, parse_failures`` (means over seeds)."""
    rank_b = {b: i for i, b in enumerate(basin_order)}
    rank_a = {a: i for i, a in enumerate(agent_order)}
    s = summary.copy()
    s["_b"] = s["basin_id"].map(lambda b: rank_b.get(b, len(rank_b)))
    s["_a"] = s["agent"].map(lambda a: rank_a.get(a, len(rank_a)))
    s = s.sort_values(["_b", "basin_id", "_a", "agent"], kind="stable")
    return pd.DataFrame({"basin": s["basin_id"].to_numpy(), "method": [_LABELS.get(a, a) for a in s["agent"]],
                         "agent": s["agent"].to_numpy(), "seeds": s["seeds"].to_numpy(),
                         "best_nse": s["best_nse_mean"].to_numpy(float),
                         "best_nse_std": s["best_nse_std"].to_numpy(float),
                         "sims": s["sims_mean"].to_numpy(float), "turns": s["turns_mean"].to_numpy(float),
                         "parse_failures": s["parse_failures_mean"].to_numpy(float)}).reset_index(drop=True)


def overall(episodes: pd.DataFrame, turns: pd.DataFrame, agent_order: list[str]) -> pd.DataFrame:
    """One row per agent over every held-out basin: ``agent, method, episodes, seeds, best_nse`` (the
    mean over seeds of each seed's mean over basins; an episode without a scored simulation counts
    :data:`UNSCORED_NSE`), ``best_nse_sd`` (sample std over seeds), ``unscored`` (such episodes),
    ``valid_calls`` (share of assistant messages, read from ``turns``, without a parse failure: a
    message with several malformed calls counts once), ``sims``, ``parse_failures`` and ``reward``
    (means per episode)."""
    per_message = turns.groupby("episode_id").message_index.nunique()
    failed = turns[turns["kind"] == "parse_failure"].groupby("episode_id").message_index.nunique()
    rows = []
    for agent in [a for a in agent_order if a in set(episodes["agent"])]:
        eps = episodes[episodes["agent"] == agent]
        nse = pd.to_numeric(eps["best_nse"], errors="coerce").astype(float)
        per_seed = nse.fillna(UNSCORED_NSE).groupby(eps["seed"]).mean()
        ids = eps["episode_id"]
        messages = int(per_message.reindex(ids).fillna(0).sum())
        failed_messages = int(failed.reindex(ids).fillna(0).sum())
        failures = pd.to_numeric(eps.get("counters.parse_failures", 0), errors="coerce").fillna(0)
        rows.append({"agent": agent, "method": _LABELS.get(agent, agent), "episodes": len(eps),
                     "seeds": int(per_seed.size), "best_nse": float(per_seed.mean()),
                     "best_nse_sd": float(per_seed.std(ddof=1)) if per_seed.size > 1 else float("nan"),
                     "unscored": int(nse.isna().sum()),
                     "valid_calls": float(1 - failed_messages / messages) if messages else float("nan"),
                     "sims": float(pd.to_numeric(eps["n_sims"]).mean()), "parse_failures": float(failures.mean()),
                     "reward": float(pd.to_numeric(eps["total_reward"]).mean())})
    return pd.DataFrame(rows)


def in_words(ov: pd.DataFrame, basins: int) -> str:
    """What the overall table shows, in one or two sentences (the trained policies against the references)."""
    by = {r["agent"]: r for r in ov.to_dict("records")}

    def nse(agent: str) -> str:
        return f"{by[agent]['best_nse']:.3f}"

    parts = []
    if "grpo" in by and "sft" in by:
        g, s = by["grpo"], by["sft"]
        diff = g["best_nse"] - s["best_nse"]
        verdict = ("the same as SFT" if abs(diff) < 5e-4 else
                   f"{'above' if diff > 0 else 'below'} SFT by {abs(diff):.3f}")
        parts.append(f"On {basins} held-out basins SFT+GRPO reaches a mean best NSE of {nse('grpo')}, {verdict} "
                     f"({nse('sft')}); {g['valid_calls']:.0%} of its messages are valid tool calls (SFT "
                     f"{s['valid_calls']:.0%}, Base {by['base']['valid_calls']:.0%})." if "base" in by else
                     f"On {basins} held-out basins SFT+GRPO reaches a mean best NSE of {nse('grpo')}, {verdict} "
                     f"({nse('sft')}); {g['valid_calls']:.0%} of its messages are valid tool calls.")
    refs = [a for a in by if a not in _LABELS]
    if refs:
        lead = "grpo" if "grpo" in by else "sft" if "sft" in by else None
        ref_text = ", ".join(f"{a} {nse(a)}" for a in refs)
        sims = ", ".join(sorted({f"{by[a]['sims']:.1f}" for a in refs}))
        if lead is not None:
            beaten = [a for a in refs if by[lead]["best_nse"] > by[a]["best_nse"]]
            parts.append(f"At the same budget ({sims} simulations per episode) the references score {ref_text}: "
                         f"{_LABELS[lead]} is above {', '.join(beaten) if beaten else 'none of them'}.")
        else:
            parts.append(f"The references score {ref_text}.")
    return " ".join(parts)


def _overall_rows(ov: pd.DataFrame) -> tuple[tuple[str, ...], ...]:
    rows = []
    for r in ov.to_dict("records"):
        nse = _cell(r["best_nse"], ".3f") + (f" ± {r['best_nse_sd']:.3f}" if np.isfinite(r["best_nse_sd"]) else "")
        rows.append((r["method"], str(r["episodes"]), str(r["seeds"]), nse, _cell(r["valid_calls"], ".0%"),
                     _cell(r["sims"], ".1f"), _cell(r["parse_failures"], ".2f"), _cell(r["reward"], ".2f")))
    return tuple(rows)


OVERALL_COLUMNS = ("Method", "Episodes", "Seeds", "Best NSE", "Valid calls", "Sims", "Parse fail", "Reward")


def _cell(v: float, spec: str) -> str:
    return "n/a" if not np.isfinite(v) else format(v, spec)


def _rows(t1: pd.DataFrame) -> tuple[tuple[str, ...], ...]:
    rows = []
    last = None
    for r in t1.to_dict("records"):
        nse = _cell(r["best_nse"], ".2f")
        if r["seeds"] > 1 and np.isfinite(r["best_nse_std"]):
            nse += f" ± {r['best_nse_std']:.2f}"
        rows.append((r["basin"] if r["basin"] != last else "", r["method"], nse, _cell(r["sims"], ".1f"),
                     _cell(r["turns"], ".1f"), _cell(r["parse_failures"], ".1f")))
        last = r["basin"]
    return tuple(rows)


TABLE1_COLUMNS = ("Basin", "Method", "Best NSE", "Sims", "Turns", "Parse fail")


def format_table1(t1: pd.DataFrame) -> str:
    """Table 1 as Markdown (what the README and the closing note quote)."""
    return to_markdown([Table(TABLE1_COLUMNS, _rows(t1), ("l", "l", "r", "r", "r", "r"))]).strip()


def _stage_rows(run_dir: Path) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for stage in STAGES:
        try:
            rec = read_record(run_dir, stage) or {}
        except PipelineStateError as exc:
            rows.append((stage, "damaged", "", "", exc.message))
            continue
        wall = rec.get("wall_s")
        rows.append((stage, str(rec.get("status", "not started")), "" if wall is None else f"{wall:.1f}",
                     str(rec.get("attempts", "")), str(rec.get("why", ""))))
    return rows


def write_pipeline_report(spec: PipelineSpec, run_dir: Path) -> dict[str, Any]:
    """Write ``RUN/report/`` (see the module docstring); returns what it wrote and Table 1's rows."""
    from hydroagent_hpc.report import write_report

    out = run_dir / "report"
    store = run_dir / "evaluation" / "campaign.h5"
    res = load_results(store)
    summary = tab.summary_table(res)
    heldout = [b.name for b in spec.group("heldout")]
    refs = [str(a.get("name", a.get("kind"))) for a in spec.evaluation.agents]
    agents = [p for p in POLICIES if p in spec.policies] + refs
    t1 = table1(summary, heldout, agents)
    (out / "tables").mkdir(parents=True, exist_ok=True)
    t1.to_csv(out / "tables" / "table1.csv", index=False, lineterminator="\n")
    env = res.episodes
    budget = spec.evaluation.env
    from hydroagent_hpc.store import read_turns

    ov = overall(res.episodes, read_turns(store), agents)
    ov.to_csv(out / "tables" / "overall.csv", index=False, lineterminator="\n")
    words = in_words(ov, len(heldout))
    blocks: list[Block] = [
        Heading(f"Pipeline {spec.name}: the whole recipe", 1, "top"),
        Paragraph(f"Base policy `{spec.model}`; SFT on the teacher campaign's episodes, GRPO from the "
                  f"{spec.grpo['init'].upper() if spec.grpo['init'] == 'sft' else 'base'} policy; evaluated on "
                  f"{len(heldout)} held-out basins ({', '.join(heldout)}) with seeds "
                  f"{', '.join(str(s) for s in spec.evaluation.seeds)}, every policy under the same environment "
                  f"(`{dict(budget) or 'preset defaults'}`). {len(env)} episodes in `evaluation/campaign.h5`."),
        Heading("Overall: every held-out basin", 2, "overall"),
        Paragraph(words),
        Table(OVERALL_COLUMNS, _overall_rows(ov), ("l", "r", "r", "r", "r", "r", "r", "r"),
              caption="Per method over every held-out basin: best NSE is the mean over seeds of each seed's mean "
                      f"over basins (± sample std over seeds; an episode without a scored simulation counts "
                      f"{UNSCORED_NSE:g}); valid calls = share of assistant messages that were not parse failures; "
                      "sims, parse failures and reward per episode. A greedy policy plays one seed (the same "
                      "episode whatever the seed). Data: `tables/overall.csv`."),
        Heading("Table 1: best NSE per policy and basin", 2, "table1"),
        Table(TABLE1_COLUMNS, _rows(t1), ("l", "l", "r", "r", "r", "r"),
              caption="The paper's Table 1 layout (Li et al. 2026): best NSE (mean ± std over seeds), simulations "
                      "used, tool-call turns and parse failures (rejected malformed calls), mean per episode. "
                      "Data: `tables/table1.csv`."),
    ]
    curve = tab.curve_table(tab.running_best(res))
    curve.to_csv(out / "tables" / "running_best.csv", index=False, lineterminator="\n")
    blocks.append(Heading("Best NSE against simulations", 2, "nse-vs-sims"))
    if curve.empty or not curve["median"].notna().any():
        blocks.append(Paragraph("No simulation of the evaluation has a finite NSE; nothing to draw."))
    else:
        targets = {}
        if "target_nse" in res.basins.columns:
            targets = {str(b): float(t) for b, t in zip(res.basins["basin_id"], res.basins["target_nse"])
                       if pd.notna(t)}
        fig.running_best_figure(curve, targets, fig.agent_colors(res.agents), out / "figures" / "nse_vs_sims.png")
        blocks.append(Figure("figures/nse_vs_sims.png", "Running-best NSE against simulations, every policy "
                                                        "(median over seeds; band = range over seeds)"))
    sft = read_metrics(run_dir / "sft" / "run" / "metrics.csv")
    grpo = read_metrics(run_dir / "grpo" / "run" / "metrics.csv")
    training_figure(sft, grpo, out / "figures" / "training.png")
    notes = []
    if sft is not None:
        notes.append(f"SFT: {len(sft)} logged steps, loss {num(sft['loss'].iloc[0])} → {num(sft['loss'].iloc[-1])}.")
    if grpo is not None:
        notes.append(f"GRPO: {len(grpo)} steps, mean reward {num(grpo['reward_mean'].iloc[0])} → "
                     f"{num(grpo['reward_mean'].iloc[-1])}, parse failures per rollout "
                     f"{num(grpo['parse_failures_mean'].iloc[0], '.2f')} → "
                     f"{num(grpo['parse_failures_mean'].iloc[-1], '.2f')}.")
    blocks += [Heading("Training curves", 2, "training"),
               Paragraph(" ".join(notes) + " Data: `sft/run/metrics.csv`, `grpo/run/metrics.csv`."),
               Figure("figures/training.png", "SFT loss per step; GRPO reward per step with its per-turn and "
                                              "terminal parts; best NSE and parse failures of the GRPO rollouts")]
    blocks += [Heading("Stages", 2, "stages"),
               Table(("stage", "status", "wall s (last attempt)", "attempts", "why it ran"),
                     tuple(_stage_rows(run_dir)),
                     ("l", "l", "r", "r", "l"), caption="From `RUN/<stage>/stage.json` (the report's own row is "
                                                        "still running while it is written).")]
    compare = tuple(spec.report.get("compare") or ())
    pair = compare if len(compare) == 2 else (("base", "grpo") if {"base", "grpo"} <= set(res.agents) else None)
    campaign = write_report(store, out / "campaign", compare=pair)
    blocks.append(Paragraph("The evaluation campaign's full report (hydrographs, agent comparison, parameter "
                            "recovery, published numbers): `campaign/report.md`, `campaign/report.html`."))
    html = to_html(blocks, f"Pipeline {spec.name}", out)
    for name, text in (("report.md", to_markdown(blocks)), ("report.html", html)):
        tmp = out / f".{name}.tmp"
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, out / name)  # never half a report
    log.info("pipeline report: %s", out / "report.md")
    return {"markdown": str(out / "report.md"), "html": str(out / "report.html"),
            "campaign_report": str(campaign.markdown), "table1": t1.to_dict("records"),
            "overall": ov.to_dict("records"), "in_words": words}
