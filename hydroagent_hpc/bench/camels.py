"""``python -m hydroagent_hpc.bench.camels``: DDS on real CAMELS-US basins, calibration and validation NSE.

Basins: the 8 of ``shared/data/camels_us_nldas_sample`` (NLDAS forcing, Priestley-Taylor PET)
and the two of ``shared/data/camels_us_model_output`` (their PRCP, TAIR and PET columns), both
with the full ``camels_attributes_v2.0`` tables of ``camels_us_nh_testdata``.

**Splits** (``--split``):

* ``wy1994`` (default): calibration on water years 1994-2003 (1993-10-01..2003-09-30) after a
  365-day warm-up, validation on 2003-10-01..2013-09-30 (or the end of the record) as the
  continuation of one long run from the same start, so the validation inherits the calibrated
  model's states. The NLDAS sample starts on 1993-09-29, so the warm-up before it repeats the
  following year (``spinup="repeat"``, counted in basin.json). Every basin of the sample is
  covered, which is why it is the default.
* ``kratzert2019``: the published split of Kratzert et al. (2019, HESS 23, 5089-5110), from the
  CAMELS benchmark models of Newman et al. (2017): calibration 1999-10-01..2008-09-30,
  validation 1989-10-01..1999-09-30 (before the calibration, so it is a separate run with its
  own 365-day warm-up). Only basins whose record covers 1988-10-01..2008-09-30 take part
  (01022500, 01031500, 13331500 here); the NLDAS sample's other seven start in 1993 and are
  listed as not covered.

**Methods**: DDS (:mod:`hydroagent_hpc.agents.optimizers.dds`) through the calibration
environment (``campaign.run_task``, paper preset with no target stop, no patience, no turn or
wall-clock cap) at each budget of ``--simulations`` and each seed of ``--seeds``; ``--snow``
``off`` (CREST alone, 11 multipliers), ``on`` (Snow-17 in front of CREST, 19 parameters) or
``both``. Calibration NSE is the episode's best; the best parameters then run on the validation
basin (:func:`hydroagent_hpc.metrics.evaluate` on its scored days). For 01031500 and 13331500
the published SAC-SMA + Snow-17 simulation (``MOD_RUN``, Newman et al. 2015, calibration run 05)
is scored against ``OBS_RUN`` on the same validation days.

**Per basin**: snow fraction, aridity and runoff ratio from the CAMELS attribute tables (else
computed from the forcing and flow, and marked so), and :func:`water_balance`: whether the
observed runoff can be reached by CREST's evaporation at all over the benchmark period.

**Output** under ``--out``: ``runs/<basin>/<method>/seed<k>.json`` (one file per finished run:
a rerun reads them back instead of recomputing, so a killed run continues), ``results.json``,
``report.md`` and ``validation_nse.png``. The generated basin folders go to ``basins/``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from hydroagent_hpc.campaign import AgentSpec, Task, run_task
from hydroagent_hpc.config import preset
from hydroagent_hpc.datasets.units import m3s_to_mm_per_day
from hydroagent_hpc.sim.embedded import EmbeddedSimulator

ROOT = Path(__file__).resolve().parents[2]
MODEL_OUTPUT_GAUGES = ("01031500", "13331500")
KE_RANGE = (0.8, 1.2)  # the KE multiplier's bounds (hydroagent_hpc.params), on a-priori KE = 1


@dataclass(frozen=True)
class Split:
    """A calibration and a validation period (first and last scored day, inclusive)."""

    name: str
    cal: tuple[date, date]
    val: tuple[date, date]
    source: str

    @property
    def val_continues(self) -> bool:
        """The validation follows the calibration: one run from the calibration's warm-up on."""
        return self.val[0] > self.cal[1]

    def describe(self) -> str:
        return f"calibration {self.cal[0]}..{self.cal[1]}, validation {self.val[0]}..{self.val[1]} ({self.source})"


SPLITS = {
    "wy1994": Split("wy1994", (date(1993, 10, 1), date(2003, 9, 30)), (date(2003, 10, 1), date(2013, 9, 30)),
                    "this benchmark: water years 1994-2003 / 2004-2013, the span every basin of the NLDAS "
                    "sample covers"),
    "kratzert2019": Split("kratzert2019", (date(1999, 10, 1), date(2008, 9, 30)),
                          (date(1989, 10, 1), date(1999, 9, 30)),
                          "Kratzert et al. 2019 / Newman et al. 2017 CAMELS benchmark split"),
}


def _shared() -> Path:
    return Path(os.environ.get("HYDROAGENT_SHARED", ROOT.parent / "shared")) / "data"


# ---------------------------------------------------------------------------------------------
# water balance


def water_balance(p_mm_d: Sequence[float] | np.ndarray, pet_mm_d: Sequence[float] | np.ndarray,
                  q_mm_d: Sequence[float] | np.ndarray,
                  ke_range: tuple[float, float] = KE_RANGE) -> dict[str, Any]:
    """Can CREST's evaporation close this basin's long-term water balance? Pure; daily series in mm/d.

    Over the days given (all three series finite; storage change neglected) the basin must
    evaporate ``E = mean(P) - mean(Q)``, which is ``KE_needed = E / mean(PET)`` times its PET.
    CREST evaporates ``KE*PET`` on every wet day (``P > KE*PET``) and ``P + (KE*PET - P)*W/WM``
    on a drier one, so with KE within ``ke_range = (lo, hi)``:

    * ``runoff_above_precipitation``: ``Q > P``; no evaporation closes it.
    * ``evaporation_below_ke_range``: ``E < lo*PET``. CREST reaches it only through a soil that
      is dry on the dry days; ``e_floor = mean(min(P, lo*PET))`` is what a bone-dry soil gives.
      Below the floor it cannot close at all (``closes_with_dry_soil`` False) and the simulated
      runoff is short by at least ``(e_floor - E) / Q``; above it the calibration must keep the
      soil small or dry (WM down), which also changes the runoff's timing.
    * ``evaporation_above_ke_range``: ``E > hi*PET``; the simulated runoff is too high by at
      least ``(E - hi*PET) / Q``.
    * ``closes``: otherwise.

    Returns ``{"status", "explanation", "p", "pet", "q", "e_needed", "ke_needed", "e_floor",
    "e_high", "closes_with_dry_soil", "wet_days", "runoff_ratio", "days"}`` (``wet_days``: the
    share of days with ``P > lo*PET``); ``explanation`` is one line.
    """
    p, e, q = (np.asarray(x, dtype=float) for x in (p_mm_d, pet_mm_d, q_mm_d))
    if not p.shape == e.shape == q.shape:
        raise ValueError(f"the series differ in length: P {p.shape}, PET {e.shape}, Q {q.shape}")
    ok = np.isfinite(p) & np.isfinite(e) & np.isfinite(q)
    if not ok.any():
        raise ValueError("no day has P, PET and Q all finite")
    p, e, q = p[ok], e[ok], q[ok]
    lo, hi = ke_range
    pm, em, qm = float(p.mean()), float(e.mean()), float(q.mean())
    need = pm - qm
    floor = float(np.minimum(p, lo * e).mean())
    high = hi * em
    ke_needed = need / em if em > 0 else float("inf")
    out = {"p": pm, "pet": em, "q": qm, "e_needed": need, "ke_needed": ke_needed, "e_floor": floor, "e_high": high,
           "closes_with_dry_soil": floor <= need, "wet_days": float(np.mean(p > lo * e)),
           "runoff_ratio": qm / pm if pm > 0 else float("nan"), "days": int(ok.sum())}
    if qm > pm:
        status = "runoff_above_precipitation"
        text = (f"runoff above precipitation: Q {qm:.2f} > P {pm:.2f} mm/d (ratio {qm / pm:.2f}); no evaporation "
                "closes it (precipitation undercatch, groundwater or inter-basin inflow, or the drainage area)")
    elif need < lo * em:
        status = "evaporation_below_ke_range"
        text = (f"evaporation below the KE range: P - Q = {need:.2f} mm/d is {ke_needed:.2f} x PET {em:.2f}, "
                f"under KE {lo}; CREST evaporates {lo} x PET on wet days ({out['wet_days']:.0%} of days)")
        if floor > need:
            text += (f" and at least {floor:.2f} mm/d even with a bone-dry soil: cannot close, simulated runoff "
                     f"at least {(floor - need) / qm:.0%} short")
        else:
            text += f", so only a small, often dry soil closes it (a bone-dry soil gives {floor:.2f} mm/d)"
    elif need > high:
        status = "evaporation_above_ke_range"
        text = (f"evaporation above the KE range: P - Q = {need:.2f} mm/d is {ke_needed:.2f} x PET {em:.2f}, over "
                f"KE {hi}: simulated runoff at least {(need - high) / qm:.0%} above the observed" if qm > 0 else
                f"evaporation above the KE range: P - Q = {need:.2f} mm/d > {hi} x PET {em:.2f}")
    else:
        status = "closes"
        text = f"closes: P - Q = {need:.2f} mm/d is {ke_needed:.2f} x PET {em:.2f}, within KE {lo}-{hi}"
    return {"status": status, "explanation": text, **out}


# ---------------------------------------------------------------------------------------------
# basins


def cases(data: Path) -> list[dict]:
    """The benchmark's basins under ``data`` (the shared data folder): one dict per basin."""
    sample = data / "camels_us_nldas_sample"
    out = []
    # the full CAMELS attribute tables (the sample's own subset lacks 01022500)
    attrs = data / "camels_us_nh_testdata" / "camels_attributes_v2.0"
    attr_dir = str(attrs) if attrs.is_dir() else None
    if (sample / "basins.txt").is_file():
        for gid in (sample / "basins.txt").read_text().split():
            out.append({"label": gid, "gauge": gid, "root": str(sample), "forcing": "nldas",
                        "attributes": attr_dir or str(sample / "camels_attributes_v2.0")})
    mo = data / "camels_us_model_output"
    if attr_dir:
        for gid in MODEL_OUTPUT_GAUGES:
            if (mo / gid).is_dir():
                out.append({"label": gid, "gauge": gid, "root": str(mo), "forcing": "model_output",
                            "attributes": attr_dir})
    return out


def _inputs(case: dict):
    from hydroagent_hpc.datasets.camels_basin import load_camels_inputs

    return load_camels_inputs(case["root"], case["gauge"], case["forcing"], case.get("attributes"))


def _records(case: dict) -> tuple[Any, np.ndarray, Any, Any, Any, np.datetime64]:
    """Forcing, PET, flow, attributes, model output (or None) and the last day with all of them."""
    from hydroagent_hpc.datasets import model_output

    f, pet_values, _, flow, attrs = _inputs(case)
    last = min(f.dates[-1], flow.dates[np.isfinite(flow.q_cfs)][-1])
    mo = None
    if case["forcing"] == "model_output":
        mo = model_output.read_model_output(model_output.find_model_output_file(case["root"], case["gauge"]))
        last = min(last, mo.dates[-1])
    return f, pet_values, flow, attrs, mo, last


def coverage(case: dict, split: Split, warmup: int) -> str | None:
    """None when the record covers ``split`` (a validation after the calibration may end early);
    else why not. The warm-up before the first scored day may repeat a year only in ``wy1994``."""
    f, _, flow, _, _, last = _records(case)
    first = max(f.dates[0], flow.dates[np.isfinite(flow.q_cfs)][0])
    start = min(split.cal[0], split.val[0])
    need_from = start if split.name == "wy1994" else start - timedelta(days=warmup)
    need_to = split.val[0] if split.val_continues else max(split.cal[1], split.val[1])
    if first > np.datetime64(need_from, "D") or last < np.datetime64(need_to, "D"):
        return f"record {first}..{last} does not cover {need_from}..{need_to}"
    return None


def basin_facts(case: dict, split: Split) -> dict[str, Any]:
    """Attributes (CAMELS tables, else computed) and the water balance over the benchmark period."""

    f, pet_values, flow, attrs, mo, last = _records(case)
    a = min(split.cal[0], split.val[0])
    b = min(np.datetime64(max(split.cal[1], split.val[1]), "D"), last)
    fw = (f.dates >= np.datetime64(a, "D")) & (f.dates <= b)
    area = attrs.area_km2 if attrs is not None and attrs.area_km2 else f.area_km2
    q_by_day = dict(zip(flow.dates.tolist(), m3s_to_mm_per_day(flow.q_m3s, area).tolist()))
    q = np.array([q_by_day.get(d, np.nan) for d in f.dates[fw].tolist()], dtype=float)
    wb = water_balance(f.prcp[fw], pet_values[fw], q)
    t = (np.asarray(f.tmax, float)[fw] + np.asarray(f.tmin, float)[fw]) / 2.0
    p = np.asarray(f.prcp, float)[fw]
    computed = {"frac_snow": float(p[t < 0].sum() / p.sum()) if np.isfinite(t).all() and p.sum() > 0 else None,
                "aridity": wb["pet"] / wb["p"] if wb["p"] > 0 else None, "runoff_ratio": wb["runoff_ratio"]}
    facts: dict[str, Any] = {"label": case["label"], "gauge": case["gauge"],
                             "name": attrs.name if attrs is not None and attrs.name else case["gauge"],
                             "forcing": case["forcing"], "area_km2": area, "period": f"{a}..{b}"}
    src = {}
    for key in ("frac_snow", "aridity", "runoff_ratio"):
        v = getattr(attrs, key, None) if attrs is not None else None
        facts[key] = v if v is not None else computed[key]
        src[key] = "camels_attributes_v2.0" if v is not None else "computed from the forcing and flow"
        facts[f"{key}_period"] = computed[key]
    facts["attribute_source"] = src
    facts["water_balance"] = wb
    fd = f.dates[fw]
    for part, (c0, c1) in (("cal", split.cal), ("val", split.val)):
        pw = (fd >= np.datetime64(c0, "D")) & (fd <= np.datetime64(c1, "D"))
        facts[f"water_balance_{part}"] = water_balance(f.prcp[fw][pw], pet_values[fw][pw], q[pw])
    if mo is not None:
        from hydroagent_hpc.datasets import model_output

        v_last = min(np.datetime64(split.val[1], "D"), last).astype(date)
        facts["sacsma_val_nse"] = model_output.reference_nse(mo, split.val[0], v_last, flow)["nse"]
        facts["sacsma_cal_nse"] = model_output.reference_nse(mo, split.cal[0], split.cal[1], flow)["nse"]
    return facts


# ---------------------------------------------------------------------------------------------
# runs


def method_name(simulations: int, snow: bool) -> str:
    return f"dds{simulations}" + ("+snow17" if snow else "")


def _scores(basin_dir: Path, params) -> dict[str, Any]:
    """NSE, KGE, PBIAS (%, positive = too much water) and scored days of one run of ``basin_dir``."""
    from hydroagent_hpc.metrics import evaluate

    s = EmbeddedSimulator(basin_dir / "control.txt")
    r = s.run(params)
    m = evaluate(r.observed, r.discharge, r.times, mask=r.evaluation_mask())
    return {"nse": float(m["NSE"]), "kge": float(m["KGE"]), "pbias": float(m["PBIAS"]), "n": int(m["n_points"])}


def _write_basin(folder: Path, case: dict, first: date, last: date, warmup: int, snow: bool) -> None:
    """Write the basin unless ``folder`` already holds the same request (basin.json's generator)."""
    from hydroagent_hpc.datasets.camels_basin import WRITER_VERSION, write_camels_basin

    want = {"start": str(first), "end": str(last), "warmup_days": warmup, "snow": snow, "version": WRITER_VERSION,
            "forcing": case["forcing"], "gauge_id": case["gauge"]}
    try:
        have = json.loads((folder / "basin.json").read_text())["generator"]
        if all(have.get(k) == v for k, v in want.items()):
            return
    except (OSError, ValueError, KeyError):
        pass
    write_camels_basin(folder, root=case["root"], gauge_id=case["gauge"], forcing=case["forcing"],
                       attributes=case.get("attributes"), start=first, end=last, warmup_days=warmup,
                       spinup="repeat", snow=snow)


def basin_pair(case: dict, split: Split, out: Path, warmup: int, snow: bool,
               write: bool = True) -> tuple[Path, Path, str]:
    """The calibration and validation basin folders (written if needed) and the validation period."""
    tag = f"{case['label']}_{split.name}" + ("_snow" if snow else "")
    cal_dir, val_dir = out / "basins" / f"{tag}_cal", out / "basins" / f"{tag}_val"
    if not write:
        return cal_dir, val_dir, ""
    *_, last = _records(case)
    v_last = min(np.datetime64(split.val[1], "D"), last).astype(date)
    _write_basin(cal_dir, case, split.cal[0], split.cal[1], warmup, snow)
    if split.val_continues:
        _write_basin(val_dir, case, split.val[0], v_last, (split.val[0] - split.cal[0]).days + warmup, snow)
    else:
        _write_basin(val_dir, case, split.val[0], v_last, warmup, snow)
    return cal_dir, val_dir, f"{split.val[0]}..{v_last}"


def run_path(out: Path, label: str, method: str, seed: int) -> Path:
    return out / "runs" / label / method / f"seed{seed}.json"


def run_one(case: dict, split: Split, out: Path, simulations: int, snow: bool, seed: int, warmup: int,
            compute: bool = True) -> dict | None:
    """One DDS calibration and its validation; read back from ``out/runs`` when already done
    (when not, None without ``compute``)."""

    method = method_name(simulations, snow)
    path = run_path(out, case["label"], method, seed)
    key = {"split": split.name, "label": case["label"], "method": method, "simulations": simulations, "snow": snow,
           "seed": seed, "warmup_days": warmup}
    if path.is_file():
        try:
            rec = json.loads(path.read_text())
            if rec.get("key") == key:
                val_dir = basin_pair(case, split, out, warmup, snow, write=False)[1]
                if "val_pbias" not in rec and (val_dir / "control.txt").is_file():  # a record of an earlier version
                    sc = _scores(val_dir, rec["best_params"])
                    rec.update(val_kge=sc["kge"], val_pbias=sc["pbias"])
                    _save_record(path, rec)
                rec["resumed"] = True
                return rec
        except ValueError:
            pass
    if not compute:
        return None
    t0 = time.perf_counter()
    cal_dir, val_dir, val_period = basin_pair(case, split, out, warmup, snow)
    env = replace(preset("paper"), max_simulations=simulations, max_turns=None, patience=None, stop_at_target=False,
                  wall_clock_s=None)
    ep = run_task(Task(f"camels/{case['label']}/{method}/{seed}", str(cal_dir), AgentSpec("dds", "dds", {}), seed,
                       env))
    best = dict(ep.best_params or {})
    sc = _scores(val_dir, best)
    rec = {"key": key, "label": case["label"], "method": method, "simulations": int(ep.counters.get("simulations", 0)),
           "snow": snow, "seed": seed, "cal_nse": ep.best_nse, "val_nse": sc["nse"], "val_kge": sc["kge"],
           "val_pbias": sc["pbias"], "default_val_nse": _scores(val_dir, None)["nse"], "val_days": sc["n"],
           "val_period": val_period, "best_params": best, "seconds": round(time.perf_counter() - t0, 1)}
    _save_record(path, rec)
    rec["resumed"] = False
    return rec


def _save_record(path: Path, rec: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({k: v for k, v in rec.items() if k != "resumed"}, indent=1) + "\n")
    tmp.replace(path)


def _finite(values: Iterable[Any]) -> list[float]:
    return [float(v) for v in values if v is not None and np.isfinite(v)]


def _median(values: Iterable[Any]) -> float | None:
    v = _finite(values)
    return float(np.median(v)) if v else None


def aggregate(records: Iterable[dict]) -> list[dict]:
    """One row per (basin, method): median, min and max over seeds of the validation NSE (and the
    median calibration NSE, default-parameter validation NSE, seeds and seconds), in input order."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        groups.setdefault((r["label"], r["method"]), []).append(r)
    rows = []
    for (label, method), rs in groups.items():
        val = _finite(r["val_nse"] for r in rs)
        cal = _finite(r["cal_nse"] for r in rs)
        rows.append({"label": label, "method": method, "simulations": rs[0]["simulations"], "snow": rs[0]["snow"],
                     "seeds": sorted(r["seed"] for r in rs),
                     "val_nse_median": float(np.median(val)) if val else None,
                     "val_nse_min": min(val) if val else None, "val_nse_max": max(val) if val else None,
                     "cal_nse_median": float(np.median(cal)) if cal else None,
                     "val_kge_median": _median(r.get("val_kge") for r in rs),
                     "val_pbias_median": _median(r.get("val_pbias") for r in rs),
                     **{f"{k}_median": _median(r.get("best_params", {}).get(k) for r in rs)
                        for k in ("ke", "wm", "scf")},
                     "default_val_nse": rs[0]["default_val_nse"], "val_period": rs[0]["val_period"],
                     "seconds": round(sum(r["seconds"] for r in rs), 1)})
    return rows


def method_medians(rows: Iterable[dict], labels: Iterable[str] | None = None) -> dict[str, float | None]:
    """The median over basins (all, or only ``labels``) of each method's per-basin median validation NSE."""
    keep = None if labels is None else set(labels)
    by: dict[str, list[float]] = {}
    for r in rows:
        if keep is None or r["label"] in keep:
            by.setdefault(r["method"], []).extend(_finite([r["val_nse_median"]]))
    return {m: (float(np.median(v)) if v else None) for m, v in by.items()}


def common_basins(rows: Iterable[dict]) -> list[str]:
    """The basins that have a validation NSE for every method (in first-seen order)."""
    rows = list(rows)
    methods = {r["method"] for r in rows}
    have: dict[str, set[str]] = {}
    for r in rows:
        if r["val_nse_median"] is not None:
            have.setdefault(r["label"], set()).add(r["method"])
    return [lab for lab, ms in have.items() if ms == methods]


# ---------------------------------------------------------------------------------------------
# report


def _f(x: Any, spec: str = ".3f") -> str:
    return "n/a" if x is None or not np.isfinite(x) else format(x, spec)


def nse_figure(results: dict, path: Path) -> None:
    """Validation NSE per basin (x) and method (marker at the median over seeds, bar from the
    worst to the best seed); SAC-SMA's published series as a black star where the basin has it."""
    from hydroagent_hpc.report.figures import NSE_FLOOR, new_figure, save_figure, style

    rows, facts = results["rows"], results["basins"]
    labels = [b["label"] for b in facts]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    sx = [i for i, b in enumerate(facts) if b.get("sacsma_val_nse") is not None]
    slots = len(methods) + (1 if sx else 0)  # SAC-SMA in a slot of its own, right of the methods
    width = 0.8 / max(slots, 1)
    with style():
        import matplotlib

        fig = new_figure(max(6.0, 0.9 * len(labels) + 2.0), 4.6)
        ax = fig.subplots()
        cmap = matplotlib.colormaps["tab10"]
        for j, m in enumerate(methods):
            xs, med, lo, hi = [], [], [], []
            for i, lab in enumerate(labels):
                r = next((r for r in rows if r["label"] == lab and r["method"] == m), None)
                if r is None or r["val_nse_median"] is None:
                    continue
                xs.append(i - 0.4 + width * (j + 0.5))
                med.append(max(r["val_nse_median"], NSE_FLOOR))
                lo.append(max(r["val_nse_min"], NSE_FLOOR))
                hi.append(max(r["val_nse_max"], NSE_FLOOR))
            med_a, lo_a, hi_a = np.array(med), np.array(lo), np.array(hi)
            ax.errorbar(xs, med_a, yerr=[med_a - lo_a, hi_a - med_a], fmt="o", ms=5, capsize=2, color=cmap(j % 10),
                        label=m)
        if sx:
            ax.plot([i - 0.4 + width * (len(methods) + 0.5) for i in sx],
                    [max(facts[i]["sacsma_val_nse"], NSE_FLOOR) for i in sx], "*", color="black", ms=11,
                    label="SAC-SMA (published)")
        ax.axhline(0.0, color="grey", lw=0.8)
        ax.set_xticks(range(len(labels)), [f"{b['label']}\nsnow {_f(b['frac_snow'], '.2f')}" for b in facts])
        shown = [max(v, NSE_FLOOR) for r in rows for v in (r["val_nse_min"],) if v is not None]
        shown += [max(b["sacsma_val_nse"], NSE_FLOOR) for b in facts if b.get("sacsma_val_nse") is not None]
        ax.set_ylim(min([0.0, *shown]) - 0.05, 1.0)
        ax.set_ylabel(f"validation NSE (below {NSE_FLOOR} drawn at {NSE_FLOOR})")
        ax.set_xlim(-0.5, len(labels) - 0.5)
        ax.set_title(f"CAMELS-US validation NSE (split {results['split']['name']}; median and range over seeds)")
        fig.legend(loc="outside lower center", ncol=min(len(methods) + 1, 5))
        save_figure(fig, path)


def report_blocks(results: dict) -> list:
    """The report as :mod:`hydroagent_hpc.report.document` blocks."""
    from hydroagent_hpc.report.document import Bullets, Figure, Heading, Paragraph, Table

    sp, rows, facts = results["split"], results["rows"], results["basins"]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    cell = {(r["label"], r["method"]): r for r in rows}
    blocks: list = [Heading("CAMELS-US benchmark: DDS on CREST/EF5", 1),
                    Paragraph(f"Command: `{results['command']}`. Split **{sp['name']}**: {sp['describe']}."),
                    Paragraph(results["split_note"])]
    if results["not_covered"]:
        blocks.append(Bullets(tuple(f"{k}: left out, {v}" for k, v in results["not_covered"].items())))
    if results.get("missing"):
        by: dict[str, dict[str, list[str]]] = {}
        for m in results["missing"]:
            by.setdefault(m["method"], {}).setdefault(m["label"], []).append(str(m["seed"]))
        blocks.append(Paragraph("Not run (left out of every table and median; drop `--report-only` to run them): "
                                + "; ".join(f"{m} " + ", ".join(f"{lab} (seed {'/'.join(s)})" for lab, s in d.items())
                                            for m, d in by.items()) + "."))
    blocks.append(Heading("Median validation NSE over basins", 2))
    med = results["method_medians"]
    common = common_basins(rows)
    paired = method_medians(rows, common)
    blocks.append(Table(("method", "median val NSE", "basins", f"median on the {len(common)} basins every method has"),
                        tuple((m, _f(med.get(m)), str(sum(1 for r in rows if r["method"] == m)), _f(paired.get(m)))
                              for m in methods),
                        align=("l", "r", "r", "r"),
                        caption=f"the common basins: {', '.join(common) or 'none'}"))
    blocks.append(Heading("Validation NSE per basin and method", 2))
    cols = ("basin", "name", "snow frac", "aridity", "runoff ratio", *methods, "SAC-SMA")
    body = []
    for b in facts:
        cells = []
        for m in methods:
            r = cell.get((b["label"], m))
            if r is None or r["val_nse_median"] is None:
                cells.append("")
            elif len(r["seeds"]) > 1:
                cells.append(f"{_f(r['val_nse_median'])} [{_f(r['val_nse_min'])}, {_f(r['val_nse_max'])}]")
            else:
                cells.append(_f(r["val_nse_median"]))
        body.append((b["label"], str(b["name"]), _f(b["frac_snow"], ".2f"), _f(b["aridity"], ".2f"),
                     _f(b["runoff_ratio"], ".2f"), *cells, _f(b.get("sacsma_val_nse"))))
    blocks.append(Table(cols, tuple(body), align=("l", "l", "r", "r", "r", *("r",) * len(methods), "r"),
                        caption="median [min, max] over seeds; snow fraction, aridity (PET/P) and runoff ratio "
                                "from camels_attributes_v2.0 (whole CAMELS record)"))
    blocks.append(Figure("validation_nse.png", "validation NSE per basin and method (median, range over seeds); "
                                               "black star: the published SAC-SMA + Snow-17 series on the same days"))
    blocks.append(Heading("Water balance over the benchmark period", 2))
    wb_rows = []
    for b in facts:
        w, wc, wv = b["water_balance"], b.get("water_balance_cal"), b.get("water_balance_val")
        text = w["explanation"]
        for part, wp in (("calibration", wc), ("validation", wv)):
            if wp and wp["status"] != w["status"]:
                text += f"; {part} alone: {wp['explanation']}"
        wb_rows.append((b["label"], b["forcing"], _f(w["p"], ".2f"), _f(w["pet"], ".2f"), _f(w["q"], ".2f"),
                        _f(w["runoff_ratio"], ".2f"), _f(wc["runoff_ratio"] if wc else None, ".2f"),
                        _f(wv["runoff_ratio"] if wv else None, ".2f"),
                        _f(w["ke_needed"], ".2f"), text))
    blocks.append(Table(("basin", "forcing", "P mm/d", "PET mm/d", "Q mm/d", "Q/P", "Q/P cal", "Q/P val",
                         "KE needed", "explanation"),
                        tuple(wb_rows), align=("l", "l", "r", "r", "r", "r", "r", "r", "r", "l"),
                        caption="over the benchmark's days with flow; PET as the model sees it (NLDAS: "
                                "Priestley-Taylor computed here; model output: its PET column); KE needed: "
                                "(P - Q) / PET, against KE's bounds 0.8-1.2 (hydroagent_hpc.bench.camels."
                                "water_balance); with Snow-17 the snowfall correction SCF (0.7-1.6) also scales "
                                "the snowfall part of P"))
    blocks.append(Heading("Every row", 2))
    full = []
    for r in rows:
        full.append((r["label"], r["method"], str(len(r["seeds"])), _f(r["cal_nse_median"]), _f(r["val_nse_median"]),
                     _f(r["val_nse_min"]), _f(r["val_nse_max"]), _f(r.get("val_kge_median")),
                     _f(r.get("val_pbias_median"), ".1f"), _f(r.get("ke_median"), ".2f"), _f(r.get("wm_median"), ".2f"),
                     _f(r.get("scf_median"), ".2f"), _f(r["default_val_nse"]), r["val_period"],
                     _f(r["seconds"], ".0f")))
    blocks.append(Table(("basin", "method", "seeds", "cal NSE (median)", "val NSE median", "min", "max", "val KGE",
                         "val PBIAS %", "KE", "WM", "SCF", "val NSE defaults", "validation days", "s"), tuple(full),
                        align=("l", "l", "r", "r", "r", "r", "r", "r", "r", "r", "r", "r", "r", "l", "r"),
                        caption="KGE and PBIAS (positive: simulation too high): medians over seeds of the "
                                "validation run; KE (bounds 0.8-1.2), WM (0.1-10) and SCF (Snow-17's snowfall "
                                "correction, 0.7-1.6): medians of the best parameters; s: seconds of all seeds"))
    return blocks


def write_outputs(results: dict, out: Path) -> None:
    """``results.json``, ``report.md`` and ``validation_nse.png`` in ``out``."""
    from hydroagent_hpc.report.document import to_markdown

    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    if results["rows"]:
        nse_figure(results, out / "validation_nse.png")
    (out / "report.md").write_text(to_markdown(report_blocks(results)))


# ---------------------------------------------------------------------------------------------
# main


def run_benchmark(todo: list[dict], split: Split, out: Path, simulations: Sequence[int], seeds: Sequence[int],
                  snow_modes: Sequence[bool], warmup: int, seeds_by_budget: Mapping[int, Sequence[int]] | None = None,
                  command: str = "", log=None, compute: bool = True) -> dict:
    """Every (basin, method, seed) of ``todo``; writes the outputs after each basin (so a partial
    run has a report). ``seeds_by_budget`` overrides ``seeds`` for a budget. Without ``compute``
    only the finished runs are read back; the others are listed under ``missing``."""
    out.mkdir(parents=True, exist_ok=True)
    not_covered, facts, records, missing = {}, [], [], []
    t0 = time.perf_counter()
    results: dict[str, Any] = {}
    for case in todo:
        why = coverage(case, split, warmup)
        if why:
            not_covered[case["label"]] = why
            continue
        facts.append(basin_facts(case, split))
        for snow in snow_modes:
            for n in simulations:
                for seed in (seeds_by_budget or {}).get(n, seeds):
                    rec = run_one(case, split, out, n, snow, seed, warmup, compute)
                    if rec is None:
                        missing.append({"label": case["label"], "method": method_name(n, snow), "seed": seed})
                        continue
                    records.append(rec)
                    if log:
                        how = "read back" if rec["resumed"] else f"{rec['seconds']} s"
                        log(f"{case['label']} {rec['method']} seed {seed}: cal {_f(rec['cal_nse'])} "
                            f"val {_f(rec['val_nse'])} ({how})")
        rows = aggregate(records)
        results = {"command": command, "split": {"name": split.name, "calibration": [str(d) for d in split.cal],
                                                 "validation": [str(d) for d in split.val],
                                                 "describe": split.describe()},
                   "split_note": SPLIT_NOTE, "simulations": list(simulations), "seeds": list(seeds),
                   "seeds_by_budget": {str(k): list(v) for k, v in (seeds_by_budget or {}).items()},
                   "snow": [bool(s) for s in snow_modes], "warmup_days": warmup, "not_covered": not_covered,
                   "missing": missing,
                   "basins": facts, "rows": rows, "method_medians": method_medians(rows),
                   "runs": [{k: v for k, v in r.items() if k not in ("key", "resumed")} for r in records],
                   "wall_s_this_invocation": round(time.perf_counter() - t0, 1)}
        write_outputs(results, out)
    if not results:
        results = {"not_covered": not_covered, "rows": []}
    return results


SPLIT_NOTE = ("Which split: the published CAMELS split (Kratzert et al. 2019, from the Newman et al. 2017 "
              "benchmark: calibration WY2000-2008, validation WY1990-1999) needs records from 1988-10-01 (with a "
              "year of warm-up); the NLDAS sample starts on 1993-09-29 for 7 of its 8 basins, so only 01022500, "
              "01031500 and 13331500 can run it (`--split kratzert2019`). The default split, used for all 10 basins, "
              "calibrates on WY1994-2003 and validates on WY2004-2013 (13331500's file ends 2010-12-31). The "
              "published SAC-SMA series (Newman et al. 2015, calibration run 05) was calibrated by its authors on "
              "their own period; it is scored here on exactly the same validation days as DDS.")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hydroagent_hpc.bench.camels", description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(_shared()), help="the shared data folder (default ../shared/data)")
    ap.add_argument("--out", default=str(ROOT / "results" / "camels_benchmark"))
    ap.add_argument("--split", choices=sorted(SPLITS), default="wy1994")
    ap.add_argument("--simulations", type=int, nargs="+", default=[200], help="DDS budgets (default 200)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--seeds-at", nargs="*", default=[], metavar="BUDGET=S1,S2",
                    help="other seeds for one budget, e.g. 2000=0 (default: --seeds for every budget)")
    ap.add_argument("--snow", choices=("off", "on", "both"), default="off", help="Snow-17 in front of CREST")
    ap.add_argument("--warmup-days", type=int, default=365)
    ap.add_argument("--only", nargs="*", help="basin labels to run, in this order (default: all)")
    ap.add_argument("--report-only", action="store_true",
                    help="run nothing: the report from the finished runs under --out, the others listed as not run")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    data, out = Path(args.data), Path(args.out)
    todo = cases(data)
    if args.only:  # in the order given
        todo = [c for label in args.only for c in todo if c["label"] == label]
    if not todo:
        print(f"no CAMELS data under {data}: nothing to measure", file=sys.stderr)
        return 1
    by_budget = {}
    for item in args.seeds_at:
        k, _, v = item.partition("=")
        by_budget[int(k)] = [int(s) for s in v.split(",") if s]
    snow_modes = {"off": [False], "on": [True], "both": [False, True]}[args.snow]
    command = "python -m hydroagent_hpc.bench.camels " + " ".join(argv if argv is not None else sys.argv[1:])
    t0 = time.perf_counter()
    res = run_benchmark(todo, SPLITS[args.split], out, args.simulations, args.seeds, snow_modes, args.warmup_days,
                        by_budget, command, log=lambda s: print(s, flush=True), compute=not args.report_only)
    if not res["rows"]:
        print(f"no basin covers split {args.split}: {res['not_covered']}", file=sys.stderr)
        return 1
    print("\n" + (out / "report.md").read_text())
    print(f"wall time {time.perf_counter() - t0:.0f} s; report: {out / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
