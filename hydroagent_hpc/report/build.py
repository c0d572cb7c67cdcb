"""``write_report``: a campaign store -> ``report.md``, ``report.html``, ``figures/*.png``, ``tables/*.csv``.

The same store gives the same bytes: rows are sorted, figures carry no software or date
stamps, and the only times in the report are the episodes' own start times read from the file.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

import hydroagent_hpc.report.figures as fig
import hydroagent_hpc.report.published as pub
import hydroagent_hpc.report.recovery as rec
import hydroagent_hpc.report.tables as tab
from hydroagent_hpc.report.document import Block, Bullets, Figure, Heading, Paragraph, Table, to_html, to_markdown
from hydroagent_hpc.report.hydrograph import basin_precip, best_run_per_basin, file_stem, load_best_series
from hydroagent_hpc.report.results import CampaignResults, load_results
from hydroagent_hpc.report.sections import num, overview_blocks, summary_blocks

__all__ = ["Report", "write_report", "default_comparison"]

log = logging.getLogger(__name__)


@dataclass
class Report:
    """What :func:`write_report` wrote (paths inside ``out``) and what it had to leave out."""

    out: Path
    markdown: Path
    html: Path
    figures: list[Path] = field(default_factory=list)
    tables: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0


def default_comparison(summary: pd.DataFrame) -> tuple[str, str] | None:
    """The pair compared when none is given: the agent with the lowest panel-mean best NSE as the
    base and the one with the highest as the other (ties by name); None with one agent."""
    panel = tab.panel_table(summary)
    if len(panel) < 2:
        return None
    ranked = panel.assign(key=panel["panel_mean_nse"].fillna(-np.inf)).sort_values(["key", "agent"], kind="stable")
    base, other = ranked["agent"].iloc[0], ranked["agent"].iloc[-1]
    if base == other:  # pragma: no cover - two or more agents give two names
        return None
    return str(base), str(other)


class _Writer:
    """Collects blocks, figures and CSV tables under one output folder."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.blocks: list[Block] = []
        self.report = Report(out, out / "report.md", out / "report.html")
        for sub, pattern in (("figures", "*.png"), ("tables", "*.csv")):
            for stale in sorted((out / sub).glob(pattern)):
                stale.unlink()

    def csv(self, name: str, df: pd.DataFrame) -> str:
        path = self.out / "tables" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(path, index=False, lineterminator="\n")
        self.report.tables.append(path)
        return f"tables/{name}"

    def figure(self, name: str) -> Path:
        path = self.out / "figures" / name
        self.report.figures.append(path)
        return path

    def note(self, text: str) -> None:
        self.report.notes.append(text)
        log.info("%s", text)


def _running_best(w: _Writer, res: CampaignResults, colors: dict) -> None:
    curve = tab.curve_table(tab.running_best(res))
    w.blocks.append(Heading("Running best NSE against simulations", 2, "running-best"))
    w.blocks.append(Paragraph(
        "Best NSE among the first N simulations of each episode; the line is the median over seeds, the "
        "band runs from the worst to the best seed. An episode that stopped early keeps its final best. "
        f"NSE below {fig.NSE_FLOOR:g} is drawn at the panel's lower edge. Dashed: the basin's target NSE. "
        f"Data: `{w.csv('running_best.csv', curve)}`."))
    if curve.empty or not curve["median"].notna().any():
        w.blocks.append(Paragraph("No simulation has a finite NSE; nothing to draw."))
        return
    targets = {}
    if "target_nse" in res.basins.columns:
        targets = {str(b): float(t) for b, t in zip(res.basins["basin_id"], res.basins["target_nse"]) if pd.notna(t)}
    fig.running_best_figure(curve, targets, colors, w.figure("running_best.png"))
    w.blocks.append(Figure("figures/running_best.png", "Running-best NSE per basin (median over seeds, "
                                                       "band = range over seeds)"))
    checks = tab.checkpoint_table(curve)
    cols = [c for c in checks.columns if c.startswith("NSE@")]
    w.blocks.append(Table(("basin", "agent", *(c.replace("NSE@", "NSE after ") for c in cols)),
                          tuple((r["basin_id"], r["agent"], *(num(r[c]) for c in cols)) for _, r in checks.iterrows()),
                          ("l", "l", *("r",) * len(cols)),
                          caption=f"Median best NSE after N simulations (`{w.csv('checkpoints.csv', checks)}`):"))


def _hydrographs(w: _Writer, res: CampaignResults, best: pd.DataFrame, precip: bool) -> None:
    w.blocks.append(Heading("Best hydrograph per basin", 2, "hydrographs"))
    chosen = best_run_per_basin(best)
    controls = res.controls()
    rows, figures = [], []
    for r in chosen.to_dict("records"):
        basin = str(r["basin_id"])
        series = load_best_series(res.path, r["episode_id"], int(r["best_run"]))
        if series is None:
            w.note(f"{basin}: the best run ({r['episode_id']} run {r['best_run']}) has no stored discharge; "
                   "no hydrograph")
            continue
        rain, why = None, "not requested (--no-precip)"
        if precip and basin in controls:
            rain, why = basin_precip(controls[basin], series.times)
        elif precip:
            why = "the store does not name the basin's control file"
        if rain is None and precip:
            w.note(f"{basin}: precipitation not shown: {why}")
        metrics = (f"NSE {num(r['NSE'])} · KGE {num(r['KGE'])} · PBIAS {num(r['PBIAS'], '.1f', True)} % · "
                   f"peak error {num(r['peak_error_pct'], '.1f', True)} % · peak lag {_lag(r['peak_lag_h'])} · "
                   f"peak timing MAE {num(r['peak_timing_mae_h'], '.1f')} h")
        name = f"hydrograph_{file_stem(basin)}.png"
        fig.hydrograph_figure(series.times, series.observed, series.simulated, series.warmup, rain,
                              f"{basin}: best run {r['agent']}, seed {r['seed']}, run {r['best_run']}", metrics,
                              w.figure(name))
        figures.append(Figure(f"figures/{name}", f"{basin}: {metrics}"))
        rows.append({"basin_id": basin, "agent": r["agent"], "seed": r["seed"], "episode_id": r["episode_id"],
                     "run_id": int(r["best_run"]), **{k: r[k] for k in ("NSE", "KGE", "PBIAS", "peak_error_pct",
                                                                          "peak_lag_h", "peak_timing_mae_h")},
                     "precipitation": "shown" if rain is not None else why})
    table = pd.DataFrame(rows, columns=["basin_id", "agent", "seed", "episode_id", "run_id", "NSE", "KGE", "PBIAS",
                                        "peak_error_pct", "peak_lag_h", "peak_timing_mae_h", "precipitation"])
    w.blocks.append(Paragraph(
        "For each basin, the run with the highest NSE over all agents and seeds, against the observations; "
        "precipitation (basin mean upstream of the gauge, from the basin's forcing) hangs from the inverted "
        "right axis; the warm-up is shaded. Peak error = 100 (max sim - max obs) / max obs; peak lag = time of "
        "the simulated maximum minus the observed one (positive = late; the two maxima may belong to different "
        "events, so long windows show it in days); peak timing MAE = mean |lag| of the event peaks within 12 h "
        f"(at least 3 time steps, so 72 h for daily data). Data: `{w.csv('hydrographs.csv', table)}`."))
    w.blocks += figures
    if not rows:
        w.blocks.append(Paragraph("No basin has a best run with stored discharge."))


def _comparison(w: _Writer, best: pd.DataFrame, pair: tuple[str, str] | None) -> None:
    w.blocks.append(Heading("Comparison of two agents", 2, "comparison"))
    if pair is None:
        w.blocks.append(Paragraph("Only one agent in this store: no comparison (pass `--compare A B` with two)."))
        return
    base, other = pair
    comp = tab.comparison_table(best, base, other)
    labels = {k: label for k, label, _ in tab.COMPARE_METRICS}
    w.blocks.append(Paragraph(
        f"Agent **{other}** compared with agent **{base}** (the reference), on the best run of each episode, mean "
        f"over seeds, per basin both ran; change = 100 ({other} - {base}) / |{base}|. NSE and r: higher is better; "
        f"peak-ratio error and |lag|: lower is better. Bold: {other} is better. "
        f"Data: `{w.csv('comparison.csv', comp)}`."))
    rows = []
    for r in comp.to_dict("records"):
        cells = []
        for key, _, _ in tab.COMPARE_METRICS:
            spec = ".1f" if key == "abs_lag_h" else ".3f"
            text = (f"{num(r[f'{key}.base'], spec)} → {num(r[f'{key}.other'], spec)} "
                    f"({num(r[f'{key}.change_pct'], '.1f', True)} %)")
            cells.append(f"**{text}**" if r[f"{key}.better"] == other else text)
        rows.append((r["basin_id"], *cells))
    w.blocks.append(Table(("basin", *(labels[k] for k, _, _ in tab.COMPARE_METRICS)), tuple(rows)))
    if len(comp) > 1:
        fig.comparison_figure(comp, tab.COMPARE_METRICS, base, other, w.figure("comparison.png"))
        w.blocks.append(Figure("figures/comparison.png", f"Improvement of {other} over {base} per metric (%)"))


def _recovery(w: _Writer, res: CampaignResults, best: pd.DataFrame, colors: dict) -> None:
    w.blocks.append(Heading("Parameter recovery on synthetic basins", 2, "recovery"))
    truths, notes = rec.load_truths(res.controls(), res.basins)
    for note in notes:
        w.note(note)
    per_episode = rec.recovery_table(best, truths)
    if per_episode.empty:
        w.blocks.append(Paragraph("No basin of this store has a readable hidden truth (`truth.json` beside its "
                                  "control file): nothing to recover." + (" " + "; ".join(notes) if notes else "")))
        return
    summary = rec.recovery_summary(per_episode)
    w.csv("recovery.csv", per_episode)
    w.blocks.append(Paragraph(
        "The best run's multipliers against the hidden truth of each synthetic basin (`truth.json`, never shown "
        "to the agents): recovery error = mean |log10(best / truth)| over the 11 tunable multipliers (0 = exact, "
        "0.30 = a factor of 2 on average; `alpha0` and `im` floored at 1 % of their range). A good fit with a "
        f"poor recovery means the parameters are not identifiable from the hydrograph. Data: "
        f"`{w.csv('recovery_summary.csv', summary)}`, per episode `tables/recovery.csv`."))
    logs = [c for c in summary.columns if c.startswith("log10.")]
    rows = []
    for r in summary.to_dict("records"):
        worst = max(logs, key=lambda c: abs(r[c]) if np.isfinite(r[c]) else -1.0)
        rows.append((r["basin_id"], r["agent"], str(r["seeds"]), num(r["recovery_median"]), num(r["recovery_mean"]),
                     f"{worst.removeprefix('log10.')} ({num(r[worst], '.2f', True)})"))
    w.blocks.append(Table(("basin", "agent", "seeds", "recovery error (median)", "(mean)",
                           "farthest multiplier (median log10 ratio)"), tuple(rows), ("l", "l", "r", "r", "r", "l")))
    fig.recovery_figure(summary, colors, w.figure("recovery.png"))
    w.blocks.append(Figure("figures/recovery.png", "Median log10(best / truth) per multiplier; grey band: within a "
                                                   "factor of 2"))


def _published(w: _Writer, res: CampaignResults, summary: pd.DataFrame) -> None:
    w.blocks.append(Heading("Published numbers beside ours (published, not measured)", 2, "published"))
    try:
        published = pub.load_published()
    except (OSError, ValueError) as exc:
        w.note(f"published numbers not shown: {exc}")
        w.blocks.append(Paragraph(f"Published numbers not available: {exc}"))
        return
    matches = pub.match_gauges(res.basins, set(published["gauge_id"]))
    if not matches:
        w.blocks.append(Paragraph("No basin of this store is one of the paper's gauges (USGS ids such as 02338660) or "
                                  "a synthetic twin of one (`syn_<id>`): nothing to set beside ours."))
        return
    table = pub.published_table(summary, matches, published)
    twins = [m for m in matches if m.twin]
    text = ("Rows marked **published, not measured** are the HydroAgent paper's numbers (Li et al. 2026, "
            "arXiv 2605.17792: Fig. 2 = best NSE, mean over 4 seeds [rounds used of 20]; Table 1 = greedy ablation "
            "(EF5 launches); expert = a hydrologist with DREAM), from "
            f"`data/published/{pub.PUBLISHED_CSV.name}`; this project did not run them. Rows marked "
            "**measured here** are the mean best NSE over seeds from this store.")
    if twins:
        text += (" Columns labelled *twin of* are synthetic twins: their published values are the real gauge's, "
                 "measured on another basin with real forcing and observations, so they are **not comparable one "
                 "to one** with ours.")
    w.blocks.append(Paragraph(text + f" Data: `{w.csv('published.csv', table)}`."))
    cols = tuple(table.columns)
    w.blocks.append(Table(cols, tuple(tuple(str(v) for v in row) for row in table.itertuples(index=False)),
                          ("l", "l", "l", *("r",) * (len(cols) - 3))))


def _lag(hours: object) -> str:
    """The whole-window peak lag for a figure title: hours, or days once it exceeds 3 days."""
    try:
        h = float(hours)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        h = float("nan")
    if abs(h) > 72:
        return f"{num(h / 24.0, '.0f', True)} d"
    return f"{num(h, '.0f', True)} h"


def write_report(store: str | os.PathLike[str], out: str | os.PathLike[str], *, compare: tuple[str, str] | None = None,
                 allow_partial: bool = False, precip: bool = True) -> Report:
    """Write the report of ``store`` into the folder ``out`` (created; earlier figures and tables
    there are replaced) and return what was written.

    ``compare=(base, other)`` picks the two agents compared (default: :func:`default_comparison`).
    ``allow_partial`` reports a store a writer holds or left (otherwise ``StoreError``);
    ``precip=False`` skips reading each basin's forcing for the hydrographs.
    Raises ``ValueError`` for an unknown agent in ``compare``.
    """
    t0 = time.perf_counter()
    res = load_results(store, allow_partial=allow_partial)
    if compare is not None:
        unknown = [a for a in compare if a not in res.agents]
        if unknown or compare[0] == compare[1]:
            raise ValueError(f"--compare {compare[0]} {compare[1]}: give two different agents of this store "
                             f"({', '.join(res.agents)}); unknown: {', '.join(unknown) or 'none'}")
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    w = _Writer(out_dir)
    colors = fig.agent_colors(res.agents)
    summary = tab.summary_table(res)
    panel = tab.panel_table(summary)
    best = tab.best_runs(res)
    pair = compare if compare is not None else default_comparison(summary)
    w.blocks += overview_blocks(res)
    w.blocks += summary_blocks(summary, panel, w.csv("summary.csv", summary), w.csv("panel.csv", panel))
    w.csv("best_runs.csv", best)
    _running_best(w, res, colors)
    _hydrographs(w, res, best, precip)
    _comparison(w, best, pair)
    _recovery(w, res, best, colors)
    _published(w, res, summary)
    if w.report.notes:
        w.blocks.append(Heading("Notes", 2, "notes"))
        w.blocks.append(Bullets(tuple(w.report.notes)))
    title = f"Campaign report: {res.path.name}"
    w.report.markdown.write_text(to_markdown(w.blocks), encoding="utf-8")
    w.report.html.write_text(to_html(w.blocks, title, out_dir), encoding="utf-8")
    w.report.seconds = time.perf_counter() - t0
    log.debug("report of %s (%d episodes) in %s: %.2f s", res.path, len(res.episodes), out_dir, w.report.seconds)
    return w.report
