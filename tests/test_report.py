"""Reports: values against independent computations from the store, determinism, HTML, errors, CLI."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import warnings
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest

from hydroagent_hpc.bench.report import synthetic_campaign
from hydroagent_hpc.params import PARAMS, TUNABLE
from hydroagent_hpc.report import write_report
from hydroagent_hpc.report.published import PUBLISHED_CSV
from hydroagent_hpc.store import EpisodeWriter, SchemaError, StoreError, read_episodes, read_sims

ROOT = Path(__file__).resolve().parents[1]
HYDROAGENT = ROOT / ".venv" / "bin" / "hydroagent"
AGENTS = ("base", "tuned", "llm")


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """3 agents x 3 basins (twins of paper gauges, with truth.json) x 3 seeds x 6 simulations."""
    root = tmp_path_factory.mktemp("report_store")
    return synthetic_campaign(root / "c.h5", agents=AGENTS, n_basins=3, seeds=3, sims=6, steps=300, warmup=48,
                              truth_root=root / "basins")


@pytest.fixture(scope="module")
def report(store, tmp_path_factory):
    return write_report(store, tmp_path_factory.mktemp("report_out") / "r", compare=("base", "llm"))


def _csv(report, name: str) -> pd.DataFrame:
    return pd.read_csv(report.out / "tables" / name, dtype={"basin_id": str})


def _band(v: float) -> str:  # Moriasi et al. (2015), written out independently of metrics.nse_band
    return "very good" if v > 0.8 else "good" if v > 0.7 else "satisfactory" if v > 0.5 else "unsatisfactory"


def test_summary_equals_independent_computation(store, report):
    eps = read_episodes(store)
    got = _csv(report, "summary.csv").set_index(["agent", "basin_id"])
    assert len(got) == 9 and list(got.index) == sorted(got.index, key=lambda k: (k[1], k[0]))
    for (agent, basin), g in eps.groupby(["agent", "basin_id"]):
        row = got.loc[(agent, basin)]
        v = g["best_nse"].to_numpy(float)
        assert row["best_nse_mean"] == pytest.approx(v.mean(), abs=1e-12)
        assert row["best_nse_std"] == pytest.approx(v.std(ddof=1), abs=1e-12)
        assert row["band"] == _band(v.mean())
        assert row["seeds"] == 3 and row["sims_mean"] == 6 and row["turns_mean"] == 12
        assert row["parse_failures_mean"] == pytest.approx(g["counters.parse_failures"].mean())
        assert row["wall_time_s_mean"] == pytest.approx(g["wall_time_s"].mean())
        assert row["stop_reasons"] == "max_simulations: 3"
        target = 0.8075 if basin == "syn_02338660" else 0.7
        assert row["target_hits"] == int((v >= target).sum())
        if agent == "llm":
            assert row["tokens_mean"] == pytest.approx(g["usage.total_tokens"].mean())
            assert row["cost_usd_total"] == pytest.approx(g["usage.cost_usd"].sum())
        else:
            assert math.isnan(row["tokens_mean"]) and math.isnan(row["cost_usd_total"])
    panel = _csv(report, "panel.csv").set_index("agent")
    per_basin = eps.groupby(["agent", "basin_id"])["best_nse"].mean()
    for agent in AGENTS:
        assert panel.loc[agent, "panel_mean_nse"] == pytest.approx(per_basin.loc[agent].mean(), abs=1e-12)
        assert panel.loc[agent, "panel_median_nse"] == pytest.approx(per_basin.loc[agent].median(), abs=1e-12)
    md = report.markdown.read_text()
    assert "| syn_02338660 | llm | 3 |" in md and "panel mean NSE" in md and "Moriasi" in md


def test_running_best_equals_a_per_episode_loop(store, report):
    eps = read_episodes(store).set_index("episode_id")
    sims = read_sims(store)
    curves: dict[tuple[str, str], list[np.ndarray]] = {}
    for eid, s in sims.groupby("episode_id"):
        nse = s.sort_values("run_id")["NSE"].to_numpy(float)
        curves.setdefault((eps.loc[eid, "agent"], eps.loc[eid, "basin_id"]), []).append(np.maximum.accumulate(nse))
        assert np.maximum.accumulate(nse)[-1] == pytest.approx(eps.loc[eid, "best_nse"])
    got = _csv(report, "running_best.csv").set_index(["agent", "basin_id", "n"])
    checks = _csv(report, "checkpoints.csv").set_index(["agent", "basin_id"])
    assert list(checks.columns) == ["NSE@6"]
    for (agent, basin), runs in curves.items():
        arr = np.array(runs)
        for n in range(1, 7):
            assert got.loc[(agent, basin, n), "median"] == pytest.approx(np.median(arr[:, n - 1]), abs=1e-12)
            assert got.loc[(agent, basin, n), "max"] == pytest.approx(arr[:, n - 1].max(), abs=1e-12)
        assert checks.loc[(agent, basin), "NSE@6"] == pytest.approx(np.median(arr[:, -1]), abs=1e-12)


def test_comparison_and_recovery_equal_independent_computation(store, report):
    eps = read_episodes(store)
    sims = read_sims(store)
    best = eps.merge(sims, left_on=["episode_id", "best_run"], right_on=["episode_id", "run_id"])
    comp = _csv(report, "comparison.csv").set_index("basin_id")
    assert list(comp.index) == ["syn_01403060", "syn_02338660", "syn_06279500", "panel mean"]
    for basin in comp.index[:-1]:
        a = best[(best.agent == "base") & (best.basin_id == basin)]
        b = best[(best.agent == "llm") & (best.basin_id == basin)]
        for key, va, vb in (("NSE", a["NSE"].mean(), b["NSE"].mean()),
                            ("abs_lag_h", a["peak_lag_h"].abs().mean(), b["peak_lag_h"].abs().mean()),
                            ("peak_ratio_error", (a["peak_ratio"] - 1).abs().mean(),
                             (b["peak_ratio"] - 1).abs().mean())):
            assert comp.loc[basin, f"{key}.base"] == pytest.approx(va, abs=1e-12)
            assert comp.loc[basin, f"{key}.other"] == pytest.approx(vb, abs=1e-12)
            if va != 0:
                assert comp.loc[basin, f"{key}.change_pct"] == pytest.approx(100 * (vb - va) / abs(va), abs=1e-9)
        assert comp.loc[basin, "NSE.better"] == "llm"  # the synthetic llm agent converges higher
    rec = _csv(report, "recovery.csv").set_index("episode_id")
    assert len(rec) == len(eps)
    for r in best.itertuples():
        truth = json.loads((store.parent / "basins" / r.basin_id / "truth.json").read_text())["multipliers"]
        errs = []
        for k in TUNABLE:
            floor = 0.01 * (PARAMS[k].upper - PARAMS[k].lower)
            errs.append(abs(math.log10(max(getattr(r, k), floor) / max(truth[k], floor))))
        assert rec.loc[r.episode_id, "recovery_error"] == pytest.approx(np.mean(errs), abs=1e-12)
    assert (report.out / "figures" / "recovery.png").is_file() and (report.out / "figures" / "comparison.png").is_file()


def test_published_numbers_are_labelled_and_match_the_data_file(report):
    head = [line for line in PUBLISHED_CSV.read_text().splitlines() if line.startswith("#")]
    assert "PUBLISHED, NOT MEASURED" in head[0]
    assert all(s in " ".join(head) for s in ("Source:", "arXiv 2605.17792", "reference-implementation.md"))
    data = pd.read_csv(PUBLISHED_CSV, comment="#", dtype={"gauge_id": str})
    table = _csv(report, "published.csv")
    assert list(table.columns[3:]) == [f"syn_{g} (twin of {g})" for g in ("01403060", "02338660", "06279500")]
    assert set(table["kind"]) == {"measured here", "published, not measured"}
    assert sorted(table.loc[table["kind"] == "measured here", "model"]) == sorted(AGENTS)
    hydro = table[(table["model"] == "HydroAgent-4B")].iloc[0]
    want = data[(data.model == "HydroAgent-4B") & (data.gauge_id == "02338660")].iloc[0]
    assert hydro["syn_02338660 (twin of 02338660)"] == f"{want.best_nse:.3f} [{int(want.rounds_used)} rounds]"
    expert = table[table["model"] == "Human expert (DREAM)"].iloc[0]
    assert expert["kind"] == "published, not measured" and expert["syn_06279500 (twin of 06279500)"] == "0.010"
    md = report.markdown.read_text()
    assert "published, not measured" in md and "not comparable one to one" in md


def test_same_store_same_bytes_and_html_is_self_contained(store, report, tmp_path):
    again = write_report(store, tmp_path / "again", compare=("base", "llm"))
    names = sorted(p.relative_to(report.out).as_posix() for p in report.out.rglob("*") if p.is_file())
    assert names == sorted(p.relative_to(again.out).as_posix() for p in again.out.rglob("*") if p.is_file())
    assert {"report.md", "report.html", "figures/running_best.png", "tables/summary.csv"} <= set(names)
    assert sum(n.startswith("figures/hydrograph_") for n in names) == 3
    for name in names:
        assert (report.out / name).read_bytes() == (again.out / name).read_bytes(), name
    png = (report.out / "figures" / "running_best.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and b"Software" not in png and b"matplotlib" not in png.lower()
    page = report.html.read_text()
    srcs = re.findall(r"""(?:src|href)\s*=\s*["']([^"']*)""", page, flags=re.I)
    assert srcs and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert len(srcs) == len(report.figures) and "<link" not in page and "<script" not in page
    assert "http://" not in page and "https://" not in page
    # a second report into the same folder replaces what was there, stale figures included
    (again.out / "figures" / "hydrograph_stale.png").write_bytes(b"old")
    write_report(store, again.out, compare=("base", "llm"))
    assert not (again.out / "figures" / "hydrograph_stale.png").exists()
    assert (again.out / "report.md").read_bytes() == report.markdown.read_bytes()


def test_default_comparison_and_a_single_agent(store, tmp_path):
    rep = write_report(store, tmp_path / "d", precip=False)
    assert "Agent **llm** compared with agent **base**" in rep.markdown.read_text()  # lowest vs highest panel mean
    with pytest.raises(ValueError, match="unknown: nope"):
        write_report(store, tmp_path / "e", compare=("base", "nope"))
    one = synthetic_campaign(tmp_path / "one.h5", agents=("solo",), n_basins=1, seeds=2, sims=3, steps=100, warmup=10)
    rep = write_report(one, tmp_path / "f")
    md = rep.markdown.read_text()
    assert "Only one agent in this store: no comparison" in md
    assert "has a readable hidden truth" in md and "| syn_02338660 | solo | 2 |" in md


def test_errors_for_missing_foreign_older_empty_and_partial_files(store, tmp_path):
    with pytest.raises(FileNotFoundError, match="no such episode store"):
        write_report(tmp_path / "missing.h5", tmp_path / "o")
    text = tmp_path / "notes.h5"
    text.write_text("not hdf5")
    with pytest.raises(SchemaError, match="not an HDF5 file"):
        write_report(text, tmp_path / "o")
    foreign = tmp_path / "foreign.h5"
    with h5py.File(foreign, "w") as f:
        f["x"] = np.arange(3)
    with pytest.raises(SchemaError, match="not an episode store"):
        write_report(foreign, tmp_path / "o")
    older = tmp_path / "older.h5"
    with h5py.File(older, "w") as f:
        f.attrs["schema"], f.attrs["schema_version"] = "hydroagent_hpc.episode_store", 0
    with pytest.raises(SchemaError, match="version 0 .older"):
        write_report(older, tmp_path / "o")
    empty = tmp_path / "empty.h5"
    EpisodeWriter(empty).close()
    with pytest.raises(StoreError, match="no committed episodes"):
        write_report(empty, tmp_path / "o")
    with pytest.raises(StoreError, match="is a folder"):
        write_report(tmp_path, tmp_path / "o")
    partial = tmp_path / "partial.h5"
    synthetic_campaign(partial, agents=("a", "b"), n_basins=1, seeds=1, sims=3, steps=100, warmup=10)
    from hydroagent_hpc.store import load_episode

    episode = load_episode(partial, "bench/syn_02338660/a/0")
    episode.episode_id = "bench/syn_02338660/a/late"
    w = EpisodeWriter(partial)  # a campaign still writing: the file is open, not closed cleanly
    try:
        w.write(episode)
        with pytest.raises(StoreError, match=r"partial store.*3 episodes committed.*--partial"):
            write_report(partial, tmp_path / "o")
        rep = write_report(partial, tmp_path / "p", allow_partial=True, precip=False)
        assert "**Partial store**" in rep.markdown.read_text()
    finally:
        w.close()
    assert not (tmp_path / "o").exists()  # no error above left an output folder behind


def _cli(*args: str) -> subprocess.CompletedProcess:
    exe = [str(HYDROAGENT)] if HYDROAGENT.exists() else [sys.executable, "-m", "hydroagent_hpc.cli"]
    return subprocess.run([*exe, *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_cli_end_to_end(store, report, tmp_path):
    out = tmp_path / "cli"
    done = _cli("report", str(store), "--out", str(out), "--compare", "base", "llm")
    assert done.returncode == 0, done.stderr
    assert f"{out / 'report.md'}" in done.stdout and "report.html" in done.stdout
    assert (out / "report.md").read_bytes() == report.markdown.read_bytes()
    assert (out / "report.html").read_bytes() == report.html.read_bytes()
    empty = tmp_path / "empty.h5"
    EpisodeWriter(empty).close()
    bad = _cli("report", str(empty), "--out", str(tmp_path / "x"))
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and "no committed episodes" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr
    bad = _cli("report", str(ROOT / "README.md"))
    assert bad.returncode == 2 and "not an HDF5 file" in bad.stderr and "Traceback" not in bad.stderr


def test_episodes_without_a_scored_run(tmp_path):
    """An agent whose every simulation failed: counted, banded "undefined", no curve, no crash."""
    from hydroagent_hpc.store import load_episode

    path = synthetic_campaign(tmp_path / "b.h5", agents=("ok",), n_basins=1, seeds=1, sims=3, steps=100, warmup=10)
    ep = load_episode(path, "bench/syn_02338660/ok/0")
    ep.episode_id, ep.agent, ep.best_nse, ep.best_run, ep.best_params = "broken/0", "broken", None, None, None
    for s in ep.sims:
        s.ok, s.error, s.metrics, s.discharge = False, "EF5 exited with 139", {}, None
    with EpisodeWriter(path) as w:
        w.write(ep)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        rep = write_report(path, tmp_path / "r")
    summary = pd.read_csv(rep.out / "tables" / "summary.csv").set_index("agent")
    assert summary.loc["broken", "no_nse"] == 1 and summary.loc["broken", "band"] == "undefined"
    assert math.isnan(summary.loc["broken", "best_nse_mean"]) and summary.loc["ok", "no_nse"] == 0
    curve = pd.read_csv(rep.out / "tables" / "running_best.csv")
    assert (curve.loc[curve.agent == "broken", "seeds"] == 0).all()
    assert "undefined (1 without NSE)" in rep.markdown.read_text()



def test_gauge_matching_real_twin_and_none():
    from hydroagent_hpc.report.published import load_published, match_gauges

    ids = set(load_published()["gauge_id"])
    assert {"02338660", "01403060", "06279500", "07144100"} <= ids
    basins = pd.DataFrame({"basin_id": ["02338660", "syn_01403060", "my_twin", "06279500x", "11383500"],
                           "paper_gauge_id": [None, None, "07144100", None, None],
                           "synthetic": [False, None, True, None, False]})
    got = [(m.basin_id, m.gauge_id, m.twin, m.label) for m in match_gauges(basins, ids)]
    assert got == [("02338660", "02338660", False, "02338660"),
                   ("my_twin", "07144100", True, "my_twin (twin of 07144100)"),
                   ("syn_01403060", "01403060", True, "syn_01403060 (twin of 01403060)")]
