"""Campaigns: strict files, expansion, resume after a kill, serial == parallel, requirements."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.waiting import wait_until
from hydroagent_hpc.campaign import CampaignNotReadyError, expand, load_campaign, run_campaign
from hydroagent_hpc.errors import ConfigError
from hydroagent_hpc.store import read_episodes, read_sims, stored_ids

ROOT = Path(__file__).resolve().parents[1]


def _write(tmp_path: Path, basin: Path, agents: str, seeds: str = "[0, 1]", extra: str = "") -> Path:
    p = tmp_path / "c.yaml"
    p.write_text(f"name: t\nbasins: [{basin}]\nagents:\n{agents}\nseeds: {seeds}\n"
                 "env: {preset: paper, max_simulations: 12, max_turns: null, patience: null, target_nse: 0.99}\n"
                 + extra)
    return p


HEUR = "  - {name: heuristic, kind: heuristic}\n  - {name: slow, kind: heuristic, step0: 0.2}"


def test_expand_and_strictness(tmp_path, small_basin_dir):
    spec = load_campaign(_write(tmp_path, small_basin_dir, HEUR))
    ids = [t.episode_id for t in expand(spec)]
    assert ids == ["t/syn_small/heuristic/0", "t/syn_small/heuristic/1", "t/syn_small/slow/0", "t/syn_small/slow/1"]
    assert spec.env.max_simulations == 12 and spec.env.patience is None
    bad = _write(tmp_path, small_basin_dir, HEUR, extra="colour: red\n")
    with pytest.raises(ConfigError, match=r"c.yaml:\d+: colour: unknown key"):
        load_campaign(bad)
    bad = _write(tmp_path, small_basin_dir, "  - {name: x, kind: oracle}")
    with pytest.raises(ConfigError, match=r"c.yaml:4: agents\[0\]\.kind: unknown kind 'oracle'"):
        load_campaign(bad)
    bad = _write(tmp_path, small_basin_dir, HEUR).read_text().replace("max_simulations: 12", "max_simulations: many")
    (tmp_path / "d.yaml").write_text(bad)
    with pytest.raises(ConfigError, match=r"d.yaml:\d+: env.max_simulations: expected a whole number, got 'many'"):
        load_campaign(tmp_path / "d.yaml")


def test_serial_and_parallel_agree_and_resume(tmp_path, small_basin_dir):
    spec = load_campaign(_write(tmp_path, small_basin_dir, HEUR))
    a = run_campaign(spec, tmp_path / "serial.h5", workers=1, progress=False)
    b = run_campaign(spec, tmp_path / "par.h5", workers=2, progress=False)
    assert a["ran"] == b["ran"] == 4 and not a["failed"]
    ea = read_episodes(tmp_path / "serial.h5").set_index("episode_id").sort_index()
    eb = read_episodes(tmp_path / "par.h5").set_index("episode_id").sort_index()
    assert list(ea.index) == list(eb.index)
    assert (ea["best_nse"] == eb["best_nse"]).all()
    again = run_campaign(spec, tmp_path / "serial.h5", workers=1, progress=False)
    assert again["ran"] == 0 and again["already_stored"] == 4


def test_killed_campaign_resumes_without_repeats(tmp_path, small_basin_dir):
    agents = "\n".join(f"  - {{name: h{i}, kind: heuristic, step0: {0.2 + 0.1 * i}}}" for i in range(4))
    cfile = _write(tmp_path, small_basin_dir, agents, seeds="[0, 1]")
    out = tmp_path / "kill.h5"
    cmd = [sys.executable, "-m", "hydroagent_hpc.cli", "-q", "campaign", "run", str(cfile), "--out", str(out),
           "--no-progress"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:  # the store may not exist yet, or be mid-creation at the instant it is read: that is "not yet"
        # a fixed 20 ms poll: the whole campaign takes about a second once started, so a backed-off
        # poll could miss the window in which 2..7 episodes are stored
        wait_until(lambda: out.exists() and len(stored_ids(out)) >= 2, 120, "two stored episodes",
                   interval=0.02, max_interval=0.02, ignore=(Exception,))
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    first = stored_ids(out)
    assert 2 <= len(first) < 8
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    final = stored_ids(out)
    assert sorted(final) == sorted(t.episode_id for t in expand(load_campaign(cfile))) and len(set(final)) == 8
    assert final[: len(first)] == first  # nothing stored before the kill was lost or rewritten
    sims = read_sims(out)
    assert sims.groupby("episode_id").size().le(12).all()


def test_paper_frontier_says_what_is_missing(monkeypatch):
    for var in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GEMINI_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    spec = load_campaign(ROOT / "data" / "campaigns" / "paper_frontier.yaml")
    assert len(spec.agents) == 9 and len(spec.basins) == 4 and spec.seeds == (0, 1, 2, 3)
    assert spec.env.protocol == "rounds" and spec.env.max_rounds == 20 and spec.env.candidates_per_round == 10
    with pytest.raises(CampaignNotReadyError) as ei:
        run_campaign(spec, "/nonexistent/never.h5", progress=False)
    msg = str(ei.value)
    assert "ANTHROPIC_API_KEY" in msg and "GEMINI_API_KEY" in msg and "02338660" in msg and "control.txt" in msg


def test_a_changed_basin_file_stops_the_campaign_before_it_starts(tmp_path, small_basin_dir):
    import shutil

    basin = tmp_path / "syn_small"
    shutil.copytree(small_basin_dir, basin)
    assert (basin / "manifest.json").exists()
    spec = load_campaign(_write(tmp_path, basin, HEUR))
    obs = next(p for p in basin.rglob("*.csv") if "obs" in p.name.lower())
    obs.write_text(obs.read_text().replace("\n", "\n", 1) + "\n")  # one extra byte
    with pytest.raises(CampaignNotReadyError,
                       match=rf"(?s)cannot start:.*{obs.name}.*changed after the basin was prepared"):
        run_campaign(spec, tmp_path / "x.h5", progress=False)
    assert not (tmp_path / "x.h5").exists()


def test_a_campaign_built_in_code_is_checked_as_one_read_from_a_file(small_basin_dir):
    from hydroagent_hpc.campaign import AgentSpec, CampaignSpec
    from hydroagent_hpc.config import preset

    good = CampaignSpec(name="c", basins=(str(small_basin_dir),), agents=(AgentSpec("h", "heuristic"),),
                        env=preset("released"))
    assert good.seeds == (0,) and good.agents[0].seeds is None and good.env.observation == "released"
    with pytest.raises(ConfigError, match=r"^agents\[0\]\.colour: agent kind 'heuristic' takes no option") as err:
        CampaignSpec(name="c", basins=(str(small_basin_dir),), agents=(AgentSpec("h", "heuristic", {"colour": 1}),))
    assert err.value.at == ("agents", 0, "colour") and "remove 'colour'" in err.value.fix
    with pytest.raises(ConfigError, match=r"^seeds\[0\]: must be at least 0, got -1"):
        CampaignSpec(name="c", basins=(str(small_basin_dir),), agents=(AgentSpec("h", "heuristic"),), seeds=(-1,))
    with pytest.raises(ConfigError, match=r"^name: 'a b' must be a non-empty word"):
        AgentSpec("a b", "heuristic")
