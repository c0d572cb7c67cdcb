"""The report's first sections as blocks: the overview of the store and the summary tables.

Numbers are rounded here, for reading; the CSV files keep full precision.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from hydroagent_hpc.report.document import Block, Heading, Paragraph, Table
from hydroagent_hpc.report.results import CampaignResults
from hydroagent_hpc.store import SCHEMA_VERSION

__all__ = ["num", "overview_blocks", "summary_blocks"]


def num(v: object, spec: str = ".3f", signed: bool = False) -> str:
    """A number for a table cell; "–" for None, NaN and infinities."""
    try:
        x = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return "–"
    if not np.isfinite(x):
        return "–"
    return format(x, ("+" if signed else "") + spec)


def _join(values: list[str], limit: int = 12) -> str:
    values = [v for v in values if v]
    if len(values) > limit:
        return ", ".join(values[:limit]) + f", ... ({len(values)} in all)"
    return ", ".join(values) or "–"


def _provenance(texts: pd.Series) -> tuple[list[str], list[str]]:
    commits, versions = set(), set()
    for text in texts.dropna().unique().tolist():
        try:
            prov = json.loads(text)
        except (TypeError, ValueError):
            continue
        if isinstance(prov, dict):
            if prov.get("git_commit"):
                commits.add(str(prov["git_commit"]))
            if prov.get("hydroagent_hpc"):
                versions.add(str(prov["hydroagent_hpc"]))
    return sorted(commits), sorted(versions)


def overview_blocks(res: CampaignResults) -> list[Block]:
    """Title, a partial-store and a damaged-store warning where they apply, and the overview table."""
    eps, info = res.episodes, res.info
    blocks: list[Block] = [Heading(f"Campaign report: {res.path.name}", 1)]
    if res.partial:
        blocks.append(Paragraph(
            f"**Partial store**: a writer has `{res.path.name}` open or was killed before closing it. This report "
            f"shows the {len(eps)} episodes committed when it was read; the campaign may add more."))
    if res.damage:
        blocks.append(Paragraph(
            f"**Damaged store**: {res.damage}. These episodes are not finished ones; the tables below use only "
            f"parts that check out. `hydroagent store verify {res.path.name}` lists the damage and "
            f"`hydroagent store salvage {res.path.name} NEW.h5` copies the intact episodes (rerun the campaign "
            f"into NEW.h5 to redo the rest)."))
    cells = eps.groupby(["agent", "basin_id"]).size()
    seeds = sorted(eps["seed"].unique().tolist())
    started = eps["started_utc"].dropna().astype(str)
    started = started[started != ""]
    commits, versions = _provenance(eps["provenance"]) if "provenance" in eps.columns else ([], [])
    tokens = pd.to_numeric(eps.get("usage.total_tokens", pd.Series(dtype=float)), errors="coerce")
    cost = pd.to_numeric(eps.get("usage.cost_usd", pd.Series(dtype=float)), errors="coerce")
    orphans = sum(info.orphan_rows.values()) + info.uncommitted_episode_rows
    rows = [
        ("store", f"`{res.path.name}`, {info.size_bytes / 1e6:.1f} MB, schema version {SCHEMA_VERSION}, "
                  + ("closed cleanly" if info.closed_cleanly else "**partial** (open or left by a killed writer)")),
        ("episodes", f"{len(eps)} ({len(res.sims)} simulations)"),
        ("agents", _join(res.agents)),
        ("basins", _join(res.basin_ids)),
        ("seeds", f"{len(seeds)} distinct ({_join([str(s) for s in seeds], 8)}); episodes per agent and basin: "
                  f"{cells.min()}" + (f" to {cells.max()} (unequal)" if cells.max() != cells.min() else "")),
        ("preset / protocol", f"{_join(sorted(eps['preset'].astype(str).unique()))} / "
                              f"{_join(sorted(eps['protocol'].astype(str).unique()))}"),
        ("episodes started (UTC)", f"{started.min()} to {started.max()}" if len(started) else "–"),
        ("code", f"hydroagent_hpc {_join(versions, 4)}; git {_join(commits, 4)}"),
        ("wall time", f"{eps['wall_time_s'].sum() / 3600:.2f} h in all episodes"),
    ]
    if tokens.notna().any() or cost.notna().any():
        rows.append(("LLM usage", f"{num(tokens.sum(min_count=1), ',.0f')} tokens, "
                                  f"{num(cost.sum(min_count=1), ',.2f')} USD (where recorded)"))
    if orphans:
        rows.append(("orphan rows", f"{orphans} (left by interrupted writes; not part of any episode)"))
    blocks.append(Table(("item", "value"), tuple(rows)))
    return blocks


def _stat(mean: float, std: float) -> str:
    return num(mean) + (f" ± {num(std)}" if np.isfinite(std) else "")


def summary_blocks(summary: pd.DataFrame, panel: pd.DataFrame, summary_csv: str, panel_csv: str) -> list[Block]:
    """The per agent and basin table (Table 1 and Figure 2 of the paper as one) and the panel table."""
    def has(col: str) -> bool:
        return col in summary.columns and summary[col].notna().any() and bool((summary[col].fillna(0) != 0).any())

    rounds = has("rounds_mean")
    usage = [(c, label, spec)
             for c, label, spec in (("tokens_mean", "tokens", ",.0f"), ("cost_usd_mean", "cost USD", ".4f")) if has(c)]
    head = ("basin", "agent", "seeds", "best NSE mean ± std", "band", "min – max", "target hits", "sims", "turns",
            *(("rounds",) if rounds else ()), "parse fail", "wall s", *(label for _, label, _ in usage), "stop reasons")
    rows = []
    for r in summary.to_dict("records"):
        target = f"{int(r['target_hits'])}/{r['episodes']}" if np.isfinite(r["target_nse"]) else "–"
        cells = [r["basin_id"], r["agent"], str(r["seeds"]), _stat(r["best_nse_mean"], r["best_nse_std"]),
                 r["band"] if not r["no_nse"] else f"{r['band']} ({r['no_nse']} without NSE)",
                 f"{num(r['best_nse_min'])} – {num(r['best_nse_max'])}", target, num(r["sims_mean"], ".1f"),
                 num(r["turns_mean"], ".1f"), *((num(r["rounds_mean"], ".1f"),) if rounds else ()),
                 num(r["parse_failures_mean"], ".2f"), num(r["wall_time_s_mean"], ".1f"),
                 *(num(r[c], spec) for c, _, spec in usage), r["stop_reasons"]]
        rows.append(tuple(cells))
    align = tuple("l" if h in ("basin", "agent", "band", "stop reasons") else "r" for h in head)
    blocks: list[Block] = [
        Heading("Best NSE per agent and basin", 2, "summary"),
        Paragraph("Each episode's best NSE (its own record), mean ± sample standard deviation over seeds; "
                  "band = Moriasi et al. (2015) rating of the mean (very good > 0.80, good > 0.70, satisfactory "
                  "> 0.50, else unsatisfactory); target hits = episodes whose best NSE reached the basin's target; "
                  "sims, turns, parse failures, wall time (and rounds, tokens and cost where recorded) are means "
                  f"per episode. Data: `{summary_csv}`."),
        Table(head, tuple(rows), align),
    ]
    prow = [(r["agent"], str(r["basins"]), num(r["panel_mean_nse"]), num(r["panel_median_nse"]), r["band"],
             num(r["sims_mean"], ".1f"), num(r["parse_failures_mean"], ".2f"))
            for r in panel.to_dict("records")]
    blocks.append(Table(("agent", "basins", "panel mean NSE", "panel median NSE", "band (mean)", "sims",
                         "parse fail"), tuple(prow), ("l", "r", "r", "r", "l", "r", "r"),
                        caption=f"Panel statistics over basins of the per-basin mean best NSE (`{panel_csv}`):"))
    return blocks
