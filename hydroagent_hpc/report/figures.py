"""The report's figures: matplotlib's object API on the Agg canvas (no pyplot, no display).

Every figure is drawn under matplotlib's default style (a user's ``matplotlibrc`` changes
nothing) and saved as PNG without the "Software" text chunk, so the same tables give the same
bytes. Each function takes the tables it draws and a file path, and returns nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib
import matplotlib.style
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from hydroagent_hpc.params import TUNABLE

__all__ = ["agent_colors", "running_best_figure", "comparison_figure", "recovery_figure", "hydrograph_figure",
           "NSE_FLOOR", "new_figure", "save_figure", "style"]

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType  # matplotlib >= 3.9; annotations only

log = logging.getLogger(__name__)

#: Running-best panels show NSE from this value up (lower values are drawn at the edge).
NSE_FLOOR = -1.0
DPI = 100
_RC: dict[RcKeyType, Any] = {"font.size": 9, "axes.titlesize": 10, "legend.fontsize": 8, "axes.grid": True,
                             "grid.alpha": 0.3, "svg.hashsalt": "hydroagent", "figure.max_open_warning": 0}


@contextmanager
def style() -> Iterator[None]:
    """The house style of every figure (matplotlib's defaults, small fonts, a light grid) for the ``with`` block."""
    with matplotlib.style.context("default"), matplotlib.rc_context(_RC):
        yield


def new_figure(width: float, height: float) -> Figure:
    """A figure of ``width`` x ``height`` inches on the Agg canvas (no pyplot, no global state)."""
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig: Figure, path: Path) -> None:
    """Write ``fig`` as a PNG at :data:`DPI` (parent folders made; no timestamp, so a rerun writes the same bytes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=DPI, metadata={"Software": None})
    log.debug("wrote %s", path)


def agent_colors(agents: list[str]) -> dict[str, tuple[float, ...]]:
    """A fixed colour per agent (tab10 in sorted order, then tab20), the same in every figure."""
    names = sorted(agents)
    cmap = matplotlib.colormaps["tab10" if len(names) <= 10 else "tab20"]
    return {a: tuple(cmap(i % cmap.N)) for i, a in enumerate(names)}


def _grid(n: int, max_cols: int = 3) -> tuple[int, int]:
    cols = 2 if n == 4 and max_cols >= 2 else min(max(n, 1), max_cols)
    return (n + cols - 1) // cols, cols


def running_best_figure(curve: pd.DataFrame, targets: dict[str, float], colors: dict[str, tuple[float, ...]],
                        path: Path) -> None:
    """Running-best NSE against simulations: one panel per basin, one line per agent (median over
    seeds), shaded from the worst to the best seed; the basin's target NSE dashed."""
    basins = sorted(curve["basin_id"].unique().tolist())
    rows, cols = _grid(len(basins))
    with style():
        fig = new_figure(4.2 * cols, 3.0 * rows + 0.4)
        axes = fig.subplots(rows, cols, squeeze=False)
        for ax in axes.flat[len(basins):]:
            ax.set_visible(False)
        for ax, basin in zip(axes.flat, basins):
            cell = curve[curve["basin_id"] == basin]
            lo = 1.0
            for agent, c in cell.groupby("agent", sort=True):
                n = c["n"].to_numpy(float)
                med = c["median"].to_numpy(float)
                ax.plot(n, np.maximum(med, NSE_FLOOR), color=colors[agent], lw=1.5, label=agent)
                ax.fill_between(n, np.maximum(c["min"].to_numpy(float), NSE_FLOOR),
                                np.maximum(c["max"].to_numpy(float), NSE_FLOOR), color=colors[agent], alpha=0.18, lw=0)
                finite = c["min"].to_numpy(float)
                finite = finite[np.isfinite(finite)]
                if finite.size:
                    lo = min(lo, float(finite.min()))
            target = targets.get(basin)
            if target is not None and np.isfinite(target):
                ax.axhline(target, color="0.3", ls="--", lw=0.9, label=f"target {target:g}")
            bottom = max(NSE_FLOOR, lo - 0.05) if lo < 1.0 else 0.0
            ax.set_ylim(bottom, 1.0)
            ax.set_xlim(1, max(float(cell["n"].max()), 2.0))
            ax.set_title(basin)
            ax.set_xlabel("simulations")
            ax.set_ylabel("best NSE so far")
        handles, labels = axes.flat[0].get_legend_handles_labels()
        seen = dict(zip(labels, handles))
        fig.legend([seen[k] for k in sorted(colors) if k in seen], [k for k in sorted(colors) if k in seen],
                   loc="outside upper center", ncols=min(len(colors), 6), frameon=False)
        save_figure(fig, path)


def comparison_figure(comp: pd.DataFrame, metrics: tuple[tuple[str, str, bool], ...], base: str, other: str,
                      path: Path, clip: float = 200.0) -> None:
    """Improvement of ``other`` over ``base`` in percent per metric (positive = ``other`` better:
    higher NSE and r, lower peak-ratio error and |lag|), one bar per basin and the panel mean;
    bars beyond +-``clip`` are cut and labelled with their value."""
    labels = comp["basin_id"].astype(str).tolist()
    with style():
        fig = new_figure(max(6.0, 1.6 * len(metrics) + 0.25 * len(labels) * len(metrics)), 3.6)
        ax = fig.subplots()
        width = 0.8 / max(len(labels), 1)
        cmap = matplotlib.colormaps["tab20" if len(labels) > 10 else "tab10"]
        for j, basin in enumerate(labels):
            vals = []
            for key, _, higher in metrics:
                v = float(comp[f"{key}.change_pct"].iloc[j])
                vals.append(v if higher else -v)
            x = np.arange(len(metrics)) + (j - (len(labels) - 1) / 2) * width
            shown = np.clip(np.nan_to_num(np.asarray(vals), nan=0.0), -clip, clip)
            color = "0.25" if basin == "panel mean" else cmap(j % cmap.N)
            ax.bar(x, shown, width * 0.95, color=color, label=basin)
            for xi, v, s in zip(x, vals, shown):
                if not np.isfinite(v):
                    ax.text(xi, 0, "n/a", ha="center", va="bottom", fontsize=6, rotation=90)
                elif abs(v) > clip:
                    ax.text(xi, s, f"{v:+.0f}%", ha="center", va="bottom" if s > 0 else "top", fontsize=6)
        ax.axhline(0, color="0.2", lw=0.8)
        ax.set_xticks(np.arange(len(metrics)), [label for _, label, _ in metrics])
        ax.set_ylabel(f"improvement of {other} over {base} (%)")
        ax.set_title(f"{other} vs {base}: relative change of the best run's metrics (positive = {other} better)")
        ax.legend(loc="upper left", ncols=1 if len(labels) < 8 else 2, frameon=False)
        save_figure(fig, path)


def recovery_figure(summary: pd.DataFrame, colors: dict[str, tuple[float, ...]], path: Path) -> None:
    """Median log10(best/truth) of each tunable multiplier per agent, one panel per synthetic
    basin; the band is "within a factor of 2"."""
    basins = sorted(summary["basin_id"].unique().tolist())
    rows, cols = _grid(len(basins), 2)
    with style():
        fig = new_figure(5.6 * cols, 2.9 * rows + 0.4)
        axes = fig.subplots(rows, cols, squeeze=False)
        for ax in axes.flat[len(basins):]:
            ax.set_visible(False)
        x = np.arange(len(TUNABLE))
        for ax, basin in zip(axes.flat, basins):
            cell = summary[summary["basin_id"] == basin]
            agents = cell["agent"].tolist()
            ax.axhspan(-np.log10(2), np.log10(2), color="0.85", lw=0)
            ax.axhline(0, color="0.3", lw=0.8)
            for i, agent in enumerate(agents):
                vals = cell[cell["agent"] == agent][[f"log10.{k}" for k in TUNABLE]].to_numpy(float)[0]
                off = (i - (len(agents) - 1) / 2) * 0.8 / max(len(agents), 1)
                ax.plot(x + off, vals, "o", ms=4, color=colors[agent], label=agent)
            ax.set_xticks(x, list(TUNABLE), rotation=45)
            ax.set_ylabel("log10(best / truth)")
            ax.set_title(basin)
            lim = max(0.5, float(np.nanmax(np.abs(cell[[f"log10.{k}" for k in TUNABLE]].to_numpy(float)),
                                           initial=0.0)) * 1.1)
            ax.set_ylim(-lim, lim)
        handles, labels = axes.flat[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside upper center", ncols=min(len(labels), 6), frameon=False)
        save_figure(fig, path)


def hydrograph_figure(times: np.ndarray, observed: np.ndarray, simulated: np.ndarray, warmup: np.ndarray | None,
                      precip: np.ndarray | None, title: str, subtitle: str, path: Path) -> None:
    """Observed (black) and simulated (red) discharge; precipitation (light blue) hanging from an
    inverted top axis; warm-up steps shaded."""
    obs = np.where(np.isfinite(observed) & (observed > -998.0), observed, np.nan)
    with style():
        fig = new_figure(10.0, 4.4)
        ax = fig.subplots()
        if warmup is not None and warmup.any():
            ax.fill_between(times, 0, 1, where=warmup, step="post", color="0.88", lw=0,
                            transform=ax.get_xaxis_transform(), label="warm-up (not scored)")
        ax.plot(times, obs, color="black", lw=1.0, label="observed")
        ax.plot(times, simulated, color="tab:red", lw=1.1, label="simulated (best run)")
        top = np.nanmax(np.concatenate([obs[np.isfinite(obs)], simulated[np.isfinite(simulated)], [1e-6]]))
        ax.set_ylim(0, top * 1.45)
        ax.set_ylabel("discharge (m³/s)")
        ax.set_xlim(times[0], times[-1])
        handles, labels = ax.get_legend_handles_labels()
        if precip is not None:
            ax2 = ax.twinx()
            p = np.where(np.isfinite(precip), precip, 0.0)
            # one step polygon, not a bar per step: thousands of bar patches take seconds to draw
            ax2.fill_between(times, 0, p, step="pre", color="#6baed6", alpha=0.85, lw=0, label="precipitation")
            ax2.set_ylim(max(float(p.max()), 1e-3) * 2.5, 0)
            ax2.set_ylabel("basin-mean precipitation (mm/h)")
            ax2.grid(False)
            h2, l2 = ax2.get_legend_handles_labels()
            handles, labels = handles + h2, labels + l2
        ax.legend(handles, labels, loc="center right", frameon=True, framealpha=0.85)
        ax.set_title(f"{title}\n{subtitle}")
        save_figure(fig, path)
