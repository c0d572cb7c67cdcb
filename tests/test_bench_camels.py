"""The CAMELS benchmark (``hydroagent_hpc.bench.camels``): the water-balance check, the rows over
seeds, and a tiny resumable run on the CAMELS test subset (12010000, two water years)."""

from __future__ import annotations

import json
from datetime import date

import numpy as np
import pytest

from conftest import CAMELS, require
from hydroagent_hpc.bench import camels as bench


def test_water_balance_closes_within_the_ke_range():
    wb = bench.water_balance([3.0] * 10, [2.0] * 10, [1.0] * 10)
    assert wb["status"] == "closes"
    assert wb["e_needed"] == pytest.approx(2.0) and wb["ke_needed"] == pytest.approx(1.0)
    assert (wb["e_floor"], wb["e_high"]) == pytest.approx((1.6, 2.4))
    assert wb["runoff_ratio"] == pytest.approx(1 / 3)
    assert wb["explanation"].startswith("closes")


def test_water_balance_runoff_above_precipitation():
    wb = bench.water_balance([1.0, 1.0], [2.0, 2.0], [1.5, 1.5])
    assert wb["status"] == "runoff_above_precipitation"
    assert "runoff above precipitation" in wb["explanation"] and "1.50" in wb["explanation"]


def test_water_balance_evaporation_below_the_ke_range():
    # wet every day: CREST evaporates KE*PET >= 0.8*2 = 1.6 mm/d, the gauge leaves only 0.5
    wb = bench.water_balance([5.0] * 4, [2.0] * 4, [4.5] * 4)
    assert wb["status"] == "evaporation_below_ke_range" and not wb["closes_with_dry_soil"]
    assert wb["e_floor"] == pytest.approx(1.6) and wb["ke_needed"] == pytest.approx(0.25)
    assert "evaporation below the KE range" in wb["explanation"] and "cannot close" in wb["explanation"]
    assert "24% short" in wb["explanation"]  # (1.6 - 0.5) / 4.5


def test_water_balance_evaporation_above_the_ke_range():
    wb = bench.water_balance([3.0] * 4, [1.0] * 4, [1.0] * 4)
    assert wb["status"] == "evaporation_above_ke_range"
    assert wb["e_high"] == pytest.approx(1.2)
    assert "80% above" in wb["explanation"]  # (2.0 - 1.2) / 1.0


def test_water_balance_dry_days_lower_the_floor_and_missing_days_drop_out():
    # a dry day evaporates at least its rain (0 here), a wet day KE*PET: floor = (0 + 1.6) / 2;
    # P - Q = 1.45 < 0.8 * PET: below the KE range, but a dry soil on the dry day can close it
    wb = bench.water_balance([0.0, 4.0, 9.0], [2.0, 2.0, 2.0], [0.1, 1.0, np.nan])
    assert wb["days"] == 2 and wb["e_floor"] == pytest.approx(0.8) and wb["wet_days"] == pytest.approx(0.5)
    assert wb["status"] == "evaporation_below_ke_range" and wb["closes_with_dry_soil"]
    assert "dry soil" in wb["explanation"] and "cannot close" not in wb["explanation"]
    with pytest.raises(ValueError, match="differ in length"):
        bench.water_balance([1.0], [1.0, 2.0], [0.5])
    with pytest.raises(ValueError, match="no day"):
        bench.water_balance([np.nan], [1.0], [0.5])


def _rec(label, method, seed, val, cal=0.5):
    return {"label": label, "method": method, "simulations": 200, "snow": method.endswith("snow17"), "seed": seed,
            "cal_nse": cal, "val_nse": val, "default_val_nse": 0.1, "val_period": "a..b", "seconds": 1.0,
            "best_params": {"ke": 0.8 + seed / 10}}


def test_aggregate_rows_over_seeds_and_medians_over_basins():
    recs = [_rec("a", "dds200", 0, 0.5), _rec("a", "dds200", 1, 0.7), _rec("a", "dds200", 2, 0.6),
            _rec("b", "dds200", 0, float("nan")), _rec("b", "dds200", 1, 0.2), _rec("a", "dds200+snow17", 0, 0.8)]
    rows = bench.aggregate(recs)
    assert [(r["label"], r["method"]) for r in rows] == [("a", "dds200"), ("b", "dds200"), ("a", "dds200+snow17")]
    a = rows[0]
    assert (a["val_nse_median"], a["val_nse_min"], a["val_nse_max"]) == pytest.approx((0.6, 0.5, 0.7))
    assert a["seeds"] == [0, 1, 2] and a["seconds"] == 3.0
    assert a["ke_median"] == pytest.approx(0.9) and a["scf_median"] is None
    assert rows[1]["val_nse_median"] == pytest.approx(0.2)  # a failed (NaN) seed is left out, not a zero
    assert bench.method_medians(rows) == pytest.approx({"dds200": 0.4, "dds200+snow17": 0.8})
    assert bench.common_basins(rows) == ["a"]  # b has no snow run
    assert bench.method_medians(rows, ["a"]) == pytest.approx({"dds200": 0.6, "dds200+snow17": 0.8})
    assert bench.method_name(2000, True) == "dds2000+snow17"


TINY = bench.Split("tiny", (date(1994, 10, 1), date(1995, 9, 30)), (date(1995, 10, 1), date(1996, 9, 30)), "test")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    require(CAMELS / "camels_us_nldas_sample")
    todo = [c for c in bench.cases(CAMELS) if c["label"] == "12010000"]
    out = tmp_path_factory.mktemp("camels_bench")
    res = bench.run_benchmark(todo, TINY, out, [3], [0, 1], [False, True], 30, command="test")
    return out, res


def test_tiny_run_writes_rows_report_and_figure(tiny_run):
    out, res = tiny_run
    assert [r["method"] for r in res["rows"]] == ["dds3", "dds3+snow17"]
    for r in res["rows"]:
        assert r["seeds"] == [0, 1] and r["val_period"] == "1995-10-01..1996-09-30"
        assert r["val_nse_min"] <= r["val_nse_median"] <= r["val_nse_max"]
    snow_params = res["runs"][-1]["best_params"]
    assert "scf" in snow_params and "scf" not in res["runs"][0]["best_params"]
    facts = res["basins"][0]
    assert facts["frac_snow"] == pytest.approx(0.0236, abs=1e-3)  # camels_clim.txt
    assert facts["attribute_source"]["aridity"] == "camels_attributes_v2.0"
    # the Naselle's NLDAS precipitation is below its runoff over these two years
    assert facts["water_balance"]["status"] == "runoff_above_precipitation"
    report = (out / "report.md").read_text()
    assert "| 12010000 |" in report and "runoff above precipitation" in report and "dds3+snow17" in report
    assert (out / "validation_nse.png").read_bytes()[:4] == b"\x89PNG"
    saved = json.loads((out / "results.json").read_text())
    assert saved["rows"] == json.loads(json.dumps(res["rows"]))
    assert len(list((out / "runs" / "12010000").glob("*/seed*.json"))) == 4


def test_a_rerun_reads_finished_runs_back(tiny_run, monkeypatch):
    out, res = tiny_run
    import hydroagent_hpc.campaign as campaign

    def no_run(task):
        raise AssertionError(f"{task.episode_id} was recomputed")

    monkeypatch.setattr(campaign, "run_task", no_run)
    todo = [c for c in bench.cases(CAMELS) if c["label"] == "12010000"]
    again = bench.run_benchmark(todo, TINY, out, [3], [0, 1], [False, True], 30)
    assert again["rows"] == res["rows"]
    # report only: a seed never run is listed, not computed
    partial = bench.run_benchmark(todo, TINY, out, [3], [0, 5], [True], 30, compute=False)
    assert partial["missing"] == [{"label": "12010000", "method": "dds3+snow17", "seed": 5}]
    assert partial["rows"][0]["seeds"] == [0]
    assert "Not run" in (out / "report.md").read_text()


def test_a_split_the_record_does_not_cover_is_reported(tmp_path, capsys):
    require(CAMELS / "camels_us_nldas_sample")
    assert bench.main(["--data", str(CAMELS), "--only", "12010000", "--split", "kratzert2019",
                       "--out", str(tmp_path)]) == 1
    assert "does not cover 1988-10-01" in capsys.readouterr().err
