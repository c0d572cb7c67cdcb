"""The HydroAgent paper's published numbers, beside ours where a basin is one of its gauges.

The numbers live in ``data/published/hydroagent_paper.csv`` (its header names the source: the
paper's Figure 2, Table 1 and the human-expert reference, as transcribed in the project's
reference notes). They are **published, not measured**: this module only looks them up.

A basin matches a paper gauge when its id is the gauge's USGS id (a real gauge), or when it is a
synthetic twin: ``Basin.paper_gauge_id`` names the gauge and ``Basin.synthetic`` is true, or the
id is ``syn_<gauge id>``. For a twin, the published value is the real gauge's, not comparable one
to one (another basin, other forcing, a generated "observed" series).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from hydroagent_hpc.report.results import is_true

__all__ = ["PUBLISHED_CSV", "GaugeMatch", "load_published", "match_gauges", "published_table"]

log = logging.getLogger(__name__)

PUBLISHED_CSV = Path(__file__).resolve().parents[2] / "data" / "published" / "hydroagent_paper.csv"

_SOURCE_LABEL = {"expert": "expert reference", "figure2": "Fig. 2", "table1": "Table 1"}
_TWIN = re.compile(r"^syn_(\d{8})$")


@dataclass(frozen=True)
class GaugeMatch:
    """A basin of ours and the paper gauge it stands for; ``twin`` when it is a synthetic twin."""

    basin_id: str
    gauge_id: str
    twin: bool

    @property
    def label(self) -> str:
        return f"{self.basin_id} (twin of {self.gauge_id})" if self.twin else self.basin_id


def load_published(path: Path = PUBLISHED_CSV) -> pd.DataFrame:
    """The published rows: ``source, model, gauge_id`` (8-digit strings), ``best_nse,
    rounds_used, sims, turns, parse_failures, note``. Raises ``FileNotFoundError`` if missing."""
    df = pd.read_csv(path, comment="#", dtype={"gauge_id": str, "source": str, "model": str, "note": str})
    bad = df[~df["gauge_id"].str.fullmatch(r"\d{8}")]
    if len(bad):
        raise ValueError(f"{path}: gauge ids must be 8-digit strings; bad rows: {bad['gauge_id'].tolist()}")
    return df


def match_gauges(basins: pd.DataFrame, gauge_ids: set[str]) -> list[GaugeMatch]:
    """Basins of ours that are paper gauges or their synthetic twins, sorted by basin id."""
    out = []
    for rec in basins.to_dict("records"):
        basin_id = str(rec["basin_id"])
        paper = rec.get("paper_gauge_id")
        synthetic = is_true(rec.get("synthetic"))
        twin = _TWIN.match(basin_id)
        if basin_id in gauge_ids and not synthetic:
            out.append(GaugeMatch(basin_id, basin_id, False))
        elif isinstance(paper, str) and paper in gauge_ids and (synthetic or basin_id != paper):
            out.append(GaugeMatch(basin_id, paper, True))
        elif twin and twin.group(1) in gauge_ids:
            out.append(GaugeMatch(basin_id, twin.group(1), True))
    return sorted(out, key=lambda m: m.basin_id)


def _published_cell(row: pd.Series) -> str:
    nse = row["best_nse"]
    text = f"{nse:.3f}" if abs(nse) < 10 else f"{nse:.2f}"
    if pd.notna(row.get("rounds_used")):
        text += f" [{int(row['rounds_used'])} rounds]"
    if pd.notna(row.get("sims")):
        text += f" ({int(row['sims'])} sims)"
    return text


def published_table(summary: pd.DataFrame, matches: list[GaugeMatch], published: pd.DataFrame) -> pd.DataFrame:
    """Rows: our agents (mean best NSE over seeds, "measured here") then every published model
    ("published, not measured"); one column per matched basin, labelled with its gauge.

    Columns: ``kind, source, model``, then one per match (:attr:`GaugeMatch.label`), text cells.
    """
    cols = [m.label for m in matches]
    rows = []
    ours = summary.set_index(["agent", "basin_id"])["best_nse_mean"]
    for agent in sorted(summary["agent"].unique().tolist()):
        cells = {}
        for m in matches:
            v = ours.get((agent, m.basin_id))
            cells[m.label] = "" if v is None or pd.isna(v) else f"{v:.3f}"
        rows.append({"kind": "measured here", "source": "this store", "model": agent, **cells})
    wanted = {m.gauge_id for m in matches}
    pub = published[published["gauge_id"].isin(wanted)]
    order = {"expert": 0, "figure2": 1, "table1": 2}
    keys = pub[["source", "model"]].drop_duplicates()
    keys = keys.assign(o=keys["source"].map(order).fillna(9)).sort_values(["o", "model"], kind="stable")
    for source, model in zip(keys["source"], keys["model"]):
        sel = pub[(pub["source"] == source) & (pub["model"] == model)].set_index("gauge_id")
        cells = {m.label: (_published_cell(sel.loc[m.gauge_id]) if m.gauge_id in sel.index else "") for m in matches}
        rows.append({"kind": "published, not measured", "source": _SOURCE_LABEL.get(source, source),
                     "model": model, **cells})
    return pd.DataFrame(rows, columns=["kind", "source", "model", *cols])
