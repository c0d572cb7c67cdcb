"""The GRPO step timeline (train/grpo/timeline.py): recorded by a real tiny GRPO run, read, drawn, resumed.

* A real run (the tiny offline Qwen3 on CPU, the real environment and simulator, 2 steps): every step
  has rank 0's generate / train / forward / backward / optimizer / decode spans, nested and inside the
  step's wall time, agreeing with the step's own timings in metrics.csv; each rollout's lane holds one
  ``gpu_wait`` + ``decode`` pair per model turn; ``hydroagent train timeline`` writes the PNG and prints
  the utilisation, whose phases and idle time add up to the wall time.
* The simulation side with real slots, the real run coalescer and the embedded simulator in threads:
  waits end when a slot is taken, holds never overlap on a slot, a batched member's wait ends at its
  batch's hold.
* The file's resume rule (lines after the checkpoint and a cut line dropped) on crafted files, and
  (slow) a real run killed after its step-2 line and resumed: every step once.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers.paths import pythonpath
from hydroagent_hpc.train.grpo import timeline
from hydroagent_hpc.train.grpo.timeline import parse_steps, read_timeline, trim, utilisation

ROOT = Path(__file__).resolve().parents[1]
INNER = {"decode": ("generate", "validate"), "forward": ("train",), "backward": ("train",), "optimizer": ("train",)}


def _config(basins: Path, folder: Path, **extra: object) -> Path:
    values: dict[str, object] = {"basins": f"[{basins / 'b1'}, {basins / 'b2'}]", "group_size": 2,
                                 "prompts_per_step": 1, "max_steps": 2, "max_new_tokens": 8, "lr": "1.0e-3",
                                 "generation_batch": 2, "env": "{max_turns: 2}", **extra}
    path = folder / "grpo.yaml"
    path.write_text("".join(f"{k}: {v}\n" for k, v in values.items()))
    return path


@pytest.fixture(scope="module")
def run(grpo_basins: Path, tmp_path_factory) -> Path:
    """Two steps of the tiny random model (about 10 s on 2 idle cores): its model turns are parse failures,
    so it simulates nothing (the simulation side is tested below with real slots and the simulator)."""
    from hydroagent_hpc.train.grpo.config import load_grpo_config
    from hydroagent_hpc.train.grpo.trainer import train_grpo

    folder = tmp_path_factory.mktemp("grpo-timeline")
    summary = train_grpo(load_grpo_config(_config(grpo_basins, folder, kl_coef=0.0)), folder / "run")
    assert summary["steps"] == 2
    return folder / "run"


def _spans(record: dict, lane: str) -> list[tuple[str, float, float, int]]:
    names = [x["name"] for x in record["lanes"]]
    return [(p, a, b, d) for i, p, a, b, d in record["spans"] if names[i] == lane]


def _metrics(run: Path) -> list[dict[str, str]]:
    with open(run / "metrics.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def check_rank_lane(record: dict, lane: str = "rank 0") -> dict[str, float]:
    """The invariants of a rank lane in one step; returns the seconds per phase."""
    wall = record["wall_s"]
    spans = _spans(record, lane)
    top = sorted((a, b, p) for p, a, b, d in spans if d == 0)
    inner = [(p, a, b) for p, a, b, d in spans if d == 1]
    assert all(d in (0, 1) for *_, d in spans)
    for a, b, p in top:
        assert 0 <= a < b <= wall + 1e-6, (p, a, b, wall)
    for (_, b0, p0), (a1, _, p1) in zip(top, top[1:]):
        assert b0 <= a1 + 1e-6, f"{p0} and {p1} overlap on {lane}"
    for p, a, b in inner:  # each depth-1 span inside a depth-0 span of its kind
        assert any(pa in INNER[p] and a0 - 1e-6 <= a and b <= b0 + 1e-6 for a0, b0, pa in top), (p, a, b)
    seconds: dict[str, float] = {}
    for p, a, b, _ in spans:
        seconds[p] = seconds.get(p, 0.0) + b - a
    assert sum(b - a for a, b, _ in top) <= wall + 1e-6
    # the parts of a phase add up to no more than the phase
    assert sum(seconds.get(p, 0.0) for p in ("forward", "backward", "optimizer")) <= seconds.get("train", 0.0) + 1e-6
    assert seconds.get("decode", 0.0) <= seconds.get("generate", 0.0) + seconds.get("validate", 0.0) + 1e-6
    return seconds


def test_every_step_records_its_phases_nested_within_its_wall_time(run):
    records = read_timeline(run)
    rows = _metrics(run)
    assert [r["step"] for r in records] == [1, 2] == [int(r["step"]) for r in rows]
    for record, row in zip(records, rows):
        assert record["v"] == timeline.VERSION
        seconds = check_rank_lane(record)
        for phase in ("generate", "decode", "train", "forward", "backward", "optimizer"):
            assert seconds.get(phase, 0.0) > 0, f"step {record['step']}: no {phase} span"
        # the spans agree with the trainer's own clocks for the step (metrics.csv)
        assert seconds["train"] == pytest.approx(float(row["training_s"]), rel=0.05, abs=0.02)
        assert seconds["decode"] == pytest.approx(float(row["generation_s"]), rel=0.05, abs=0.02)
        assert record["wall_s"] >= float(row["step_s"]) - 0.01
        # one forward and one backward pass per trained sequence (kl_coef 0: no reference pass), each
        # backward after its forward, then the optimizer step: the order, not a share of the wall time
        # (a bound on the untimed share failed on a loaded machine)
        parts = [p for _, p in sorted((a, p) for p, a, b, d in _spans(record, "rank 0")
                                      if p in ("forward", "backward", "optimizer"))]
        assert parts == ["forward", "backward"] * int(row["trainable"]) + ["optimizer"], parts
        assert int(row["trainable"]) > 0


def test_each_rollout_lane_has_a_wait_and_a_decode_span_per_model_turn(run):
    from hydroagent_hpc.store import read_episodes

    eps = read_episodes(run / "rollouts.h5").set_index("episode_id")
    for record in read_timeline(run):
        lanes = [x["name"] for x in record["lanes"] if x["kind"] == "rollout"]
        assert lanes == ["grpo g0-k0", "grpo g0-k1"]
        batches = [(a, b) for p, a, b, d in _spans(record, "rank 0") if p == "decode"]
        for lane in lanes:
            g, k = lane.split()[1].split("-")
            turns = int(eps.loc[f"grpo-s{record['step']:05d}-{g}-{k}", "usage.turns"])
            spans = sorted(_spans(record, lane), key=lambda s: s[1])
            assert [p for p, *_ in spans] == ["gpu_wait", "decode"] * turns, spans
            for (_, _, b0, _), (_, a1, _, _) in zip(spans, spans[1:]):
                assert b0 <= a1 + 1e-6  # a rollout does one thing at a time
            for p, a, b, _ in spans:
                assert 0 <= a < b <= record["wall_s"]
                if p == "decode":  # its turn was decoded inside one of the sampler's batches
                    assert any(a0 - 1e-6 <= a and b <= b1 + 0.05 for a0, b1 in batches), (a, b, batches)


def test_the_command_draws_the_png_and_prints_the_utilisation(run, tmp_path, capsys):
    from hydroagent_hpc.cli import main

    png = tmp_path / "t.png"
    assert main(["train", "timeline", str(run), "--out", str(png), "--steps", "2:2"]) == 0
    out = capsys.readouterr().out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert "steps 2-2 (1 step(s)" in out and "rank 0 (cpu)" in out and "grpo g0-k1" in out
    assert main(["train", "timeline", str(run), "--json"]) == 0
    table = json.loads(capsys.readouterr().out)
    assert Path(table["png"]) == run / "timeline.png" and (run / "timeline.png").is_file()
    assert table["steps"] == [1, 2]
    rank = table["lanes"]["rank 0"]["seconds"]
    top = sum(rank.get(p, 0.0) for p in timeline.RANK_PHASES)
    assert top + rank["idle"] == pytest.approx(table["wall_s"], rel=1e-6)
    assert rank["train"] > 0.3 * table["wall_s"] and rank["idle"] < 0.2 * table["wall_s"]
    # a range with no recorded step, and a bad range, are refused in one line each
    assert main(["train", "timeline", str(run), "--steps", "5:9"]) == 2
    assert "no step in 5:9 (steps 1-2 recorded)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "timeline", str(run), "--steps", "9:5"])
    assert main(["train", "timeline", str(tmp_path)]) == 2
    assert "no step timeline here" in capsys.readouterr().err


def test_step_ranges_parse():
    assert parse_steps("3:8") == (3, 8) and parse_steps("3:") == (3, None) and parse_steps(":8") == (None, 8)
    assert parse_steps("5") == (5, 5)
    for bad in ("", ":", "a:b", "8:3", "3-8"):
        with pytest.raises(ValueError):
            parse_steps(bad)


def _record(step: int) -> dict:
    return {"v": 1, "step": step, "start": 100.0 + step, "wall_s": 1.0,
            "lanes": [{"name": "rank 0", "kind": "rank", "device": "cpu", "start": 0.0, "end": 1.0}],
            "spans": [[0, "train", 0.1, 0.9, 0]]}


def test_a_resume_drops_the_lines_after_its_checkpoint_and_a_cut_line(tmp_path):
    path = tmp_path / timeline.FILE_NAME
    lines = [json.dumps(_record(s)) + "\n" for s in (1, 2, 3)]
    path.write_text("".join(lines) + '{"v": 1, "step": 4, "sta')  # the kill cut step 4's line
    assert trim(path, 2) == 2
    assert path.read_text() == "".join(lines[:2])
    assert trim(path, 2) == 0 and path.read_text() == "".join(lines[:2])  # nothing to drop: left alone
    assert trim(path, 0) == 2 and path.read_text() == ""  # a start from scratch
    # a reader skips a damaged line and keeps the last record of a step
    path.write_text(lines[0] + "garbage\n" + json.dumps({**_record(1), "wall_s": 2.0}) + "\n")
    assert [r["wall_s"] for r in read_timeline(path)] == [2.0]


def _sim_threads(simulator, n: int, slots=None, waiting=None) -> None:
    """``n`` rollouts simulate at once; with ``slots`` and ``waiting``, the test holds a slot until
    ``waiting()`` says all ``n`` wait for one (so that they certainly meet at the slot)."""
    start = threading.Barrier(n)

    def go() -> None:
        start.wait()
        simulator[threading.current_thread().name].run({"wm": 1.0 + 0.01 * int(threading.current_thread().name)})

    threads = [threading.Thread(target=go, name=str(i)) for i in range(n)]
    if slots is None:
        for t in threads:
            t.start()
    else:
        with slots.slot() as use:
            use.runs = 0  # the test's hold runs nothing
            for t in threads:
                t.start()
            deadline = time.monotonic() + 60
            while waiting() < n:
                assert time.monotonic() < deadline, f"{waiting()} of {n} rollouts wait for the slot after 60 s"
                time.sleep(0.002)
    for t in threads:
        t.join()


@pytest.mark.parametrize("sim_batch", [1, 8], ids=["alone", "coalesced"])
def test_simulation_waits_end_when_a_slot_is_taken(small_sim, small_basin_dir, tmp_path, sim_batch):
    """Four rollouts simulate at once on one slot through the trainer's path (RolloutSimulator, the run
    coalescer, the embedded simulator): the slot's holds never overlap; each rollout's wait ends at a hold's
    start and its run ends after that hold; without batching the waits follow one another exactly."""
    from hydroagent_hpc.train.generation.coalesce import RunCoalescer
    from hydroagent_hpc.train.generation.rollout import RolloutSimulator, RolloutSpec

    with timeline.recording(tmp_path, resumed_step=0):
        slots = timeline.timed_slots(1)
        coalescer = RunCoalescer(slots, sim_batch) if sim_batch > 1 else None
        sims = {str(i): timeline.rollout_simulator(
            RolloutSpec(0, i, str(small_basin_dir), i, f"e{i}"),
            RolloutSimulator(small_sim, slots, None, str(small_basin_dir), None, coalescer), "grpo")
            for i in range(4)}
        timeline.begin_step(1)
        if coalescer is None:
            _sim_threads(sims, 4)
        else:  # the test holds the slot until all four wait, so that they meet there whatever the timing
            _sim_threads(sims, 4, slots, coalescer.waiting)
        record = timeline.end_step()
    assert record is not None and read_timeline(tmp_path)[0] == json.loads(json.dumps(record))
    holds = sorted((a, b) for p, a, b, _ in _spans(record, "sim slot 0"))
    assert holds and all(b0 <= a1 for (_, b0), (a1, _) in zip(holds, holds[1:]))
    if coalescer is not None:
        holds = holds[1:]  # the first is the test's own
    assert slots.stats()["runs"] == 4
    waits = []
    for k in range(4):
        spans = {p: (a, b) for p, a, b, _ in _spans(record, f"grpo g0-k{k}")}
        assert "simulate" in spans
        run_start, run_end = spans["simulate"]
        assert any(abs(run_start - a) < 1e-5 and b <= run_end + 1e-5 for a, b in holds), (k, spans, holds)
        waits.append(spans.get("sim_wait", (run_start, run_start)))
    if sim_batch == 1:  # one run per hold: the k-th rollout in line waited for the k holds before its own
        assert len(holds) == 4
        ends = sorted(b for _, b in waits)
        assert ends == pytest.approx([a for a, _ in holds], abs=1e-5)
    else:  # the four waited together on one slot: the leader ran them all in one hold
        assert len(holds) == 1
    assert sum(b - a for a, b in waits) > 0


@pytest.mark.slow
def test_a_killed_run_resumes_with_every_step_once(grpo_basins, caller, tmp_path):
    """The calling policy (it simulates), 2 steps, a checkpoint after step 1 (SIGUSR1), killed after step 2's
    line was written and before a checkpoint, a cut line appended as a kill mid-write leaves one; the resumed
    run keeps step 1's line as it was and writes step 2's once more (about 60 s)."""
    from hydroagent_hpc.store import read_episodes
    from hydroagent_hpc.train.checkpoint import FAULT_ENV

    cfg = _config(grpo_basins, tmp_path, model=caller, group_size=4, max_new_tokens=18, temperature=1.2,
                  lr="1.0e-5", seed=1, kl_coef=0.0, generation_batch=4, max_simulations_in_flight=1)
    out = tmp_path / "run"

    def module(*args: str, faults: str = "") -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, PYTHONPATH=pythonpath(), HF_HUB_OFFLINE="1")
        env.pop(FAULT_ENV, None)
        if faults:
            env[FAULT_ENV] = faults
        return subprocess.run([sys.executable, "-m", "hydroagent_hpc.train.grpo", str(cfg), "--out", str(out), *args],
                              env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)

    killed = module(faults="usr1:1,kill:2")
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert (out / "checkpoints" / "latest").read_text().strip() == "step-1"
    before = (out / timeline.FILE_NAME).read_bytes().split(b"\n")
    assert [json.loads(x)["step"] for x in before if x] == [1, 2]
    with open(out / timeline.FILE_NAME, "ab") as fh:
        fh.write(b'{"v":1,"step":3,"start":')
    resumed = module("--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = (out / timeline.FILE_NAME).read_bytes().split(b"\n")
    assert after[0] == before[0] and after[-1] == b""
    records = read_timeline(out)
    assert [r["step"] for r in records] == [1, 2]
    assert records[1]["start"] > json.loads(before[1])["start"]  # step 2 is the resumed run's
    # the simulations the episodes made are on their lanes, one simulate span per simulator call
    eps = read_episodes(out / "rollouts.h5").set_index("episode_id")
    simulated = 0
    for record in records:
        check_rank_lane(record)
        for lane in (x["name"] for x in record["lanes"] if x["kind"] == "rollout"):
            g, k = lane.split()[1].split("-")
            ep = eps.loc[f"grpo-s{record['step']:05d}-{g}-{k}"]
            sims = [s for s in _spans(record, lane) if s[0] == "simulate"]
            assert len(sims) == int(ep["counters.simulations"]) + int(ep["counters.failed_simulations"]), lane
            simulated += len(sims)
        table = utilisation([record])
        assert ("sim slot 0" in table["lanes"]) == any(x["kind"] == "slot" for x in record["lanes"])
    assert simulated > 0
