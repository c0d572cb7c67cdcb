"""The learning bench (bench/learning.py) runs the real recipe end to end at toy sizes, scores every
row on the same held-out basins, and resumes: a rerun runs nothing, a changed recipe is refused, and
more ablation cells extend a finished bench."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from hydroagent_hpc.bench.learning import QUICK, _data, _parser, basin_gain, plan_from, run, units

TOY = dataclasses.replace(QUICK, heldout=1, teach=1, max_turns=2, max_simulations=1, sft_steps=2, grpo_steps=1,
                          max_new_tokens=16, ablation=0)


def test_the_gain_per_basin_averages_the_cells_then_the_basins_every_cell_played():
    sft = ({"a": 0.1, "b": 0.5, "c": 0.2}, {"a": 0.2, "b": 0.4, "c": 0.0, "x": 0.9})
    grpo = ({"a": 0.3, "b": 0.5, "c": 0.5}, {"a": 0.2, "b": 0.6, "c": 0.3})
    # per basin over the two cells: a (0.2 + 0.0) / 2, b (0.0 + 0.2) / 2, c (0.3 + 0.3) / 2; x: one cell only
    g = [0.1, 0.1, 0.3]
    mean = sum(g) / 3
    se = (sum((x - mean) ** 2 for x in g) / 2) ** 0.5 / 3 ** 0.5
    assert basin_gain(list(zip(sft, grpo))) == pytest.approx({"mean": mean, "se": se, "basins": 3})
    empty = basin_gain([])
    assert empty["basins"] == 0 and empty["mean"] != empty["mean"] and empty["se"] != empty["se"]  # NaN


@pytest.mark.slow
def test_the_bench_scores_every_row_and_resumes(tmp_path):
    out = tmp_path / "bench"
    result = run(out, TOY, jobs=2, progress=False)
    rows = {r["row"]: r for r in result["rows"]}
    assert list(rows)[:8] == ["Base", "SFT", "SFT+GRPO", "heuristic", "DDS", "random", "DDS (every simulation)",
                              "random (every simulation)"]
    blind = list(rows)[8:]  # what a policy making the same moves on every basin reaches (bench/blind.py)
    assert [b.split(" (")[0] for b in blind] == ["blind: best first guess", "blind: best fixed pair"]
    assert rows[blind[0]]["best_nse"] <= rows[blind[1]]["best_nse"] and rows[blind[1]]["n"] == 16
    assert all(0.0 < rows[r]["distinct_moves"] <= 1.0 for r in ("SFT", "heuristic", "random"))
    assert rows["random (every simulation)"]["sims"] == TOY.max_simulations  # calls enough for every simulation
    for name in ("SFT", "SFT+GRPO", "Base"):
        assert rows[name]["n"] == 1 and rows[name]["sims"] <= TOY.max_simulations
    assert rows["heuristic"]["valid_calls"] == 1.0 and rows["heuristic"]["sims"] >= 1
    assert result["units_done"] == result["units"] == len(units(TOY))
    curves = (out / "tables" / "curves.csv").read_text().splitlines()
    assert curves[0].startswith("step,reward,reward_sd,valid_calls") and [r.split(",")[0] for r in curves[1:]] == \
        ["0", "1"]  # validated before the first step and after the last
    report = (out / "report.md").read_text()
    assert "| SFT+GRPO | 1 model x data seeds |" in report and "## Goals" in report
    assert "degenerate_share" in (out / "tables" / "signal.csv").read_text()
    gain = result["basin_gain"]  # one held-out basin: the paired gain, and no standard error
    assert gain["basins"] == 1 and gain["mean"] == pytest.approx(rows["SFT+GRPO"]["best_nse"] - rows["SFT"]["best_nse"])
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("done.json")}
    run(out, TOY, jobs=2, progress=False)  # everything done: nothing runs again
    assert {p: p.stat().st_mtime_ns for p in out.rglob("done.json")} == stamps
    with pytest.raises(SystemExit, match=r"other settings \(grpo_lr\)"):
        run(out, dataclasses.replace(TOY, grpo_lr=1e-3), jobs=1, progress=False)
    # one ablation cell more: the same SFT, two more GRPO runs (turn, released) and their evaluations
    extended = run(out, dataclasses.replace(TOY, ablation=1), jobs=2, progress=False)
    assert [r["row"] for r in extended["ablation"]] == ["SFT (the same cells)", "GRPO episode", "GRPO turn",
                                                        "GRPO released"]
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    assert json.loads((out / "plan.json").read_text())["ablation"] == 1


def test_the_command_line_sets_every_plan_field_and_a_quoting_teacher_reaches_the_data(tmp_path):
    """A flag per BenchPlan field (booleans as --x / --no-x); --teacher-quote gives teacher data whose
    diagnoses quote the observation's values (``NSE=0.8125``), the default does not."""
    assert plan_from(_parser().parse_args([])) == type(QUICK)()
    assert plan_from(_parser().parse_args(["--teacher-quote", "--k", "4", "--data-seeds", "3", "4"])) == \
        dataclasses.replace(type(QUICK)(), teacher_quote=True, k=4, data_seeds=(3, 4))
    assert plan_from(_parser().parse_args(["--quick", "--no-teacher-quote"])) == QUICK
    from hydroagent_hpc.store.frames import read_turns

    said = {}
    for quote in (False, True):
        folder = tmp_path / f"data-{quote}"
        folder.mkdir()
        plan = dataclasses.replace(TOY, max_turns=4, max_simulations=2, teacher_quote=quote)
        _data(tmp_path, plan, folder, 0)
        said[quote] = [t for t in read_turns(folder / "teacher.h5").text if isinstance(t, str) and "NSE" in t]
    assert said[True] and all("NSE=" in t for t in said[True])
    assert said[False] and not any("NSE=" in t for t in said[False])


CHILD = """
import os, sys, time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from hydroagent_hpc.bench.learning import _worker
if __name__ == "__main__":
    pool = ProcessPoolExecutor(1, mp_context=get_context("spawn"), initializer=_worker, initargs=(1,))
    print(pool.submit(os.getpid).result(), flush=True)
    pool.submit(time.sleep, 120)
    time.sleep(120)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_bench_leaves_no_worker_running(tmp_path):
    """A bench killed mid-unit (SIGKILL: no cleanup runs) takes its worker with it, instead of leaving it
    training on and holding its run's store lock against the next run."""
    worker, alive = _kill_bench(tmp_path, CHILD)
    assert not alive, f"worker {worker} outlived the killed bench: {alive}"


STOPPING = """
import os, signal, sys, time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from hydroagent_hpc.bench.learning import _orphan_exit, _worker

def stops_on_sigterm():  # what the trainers do: catch SIGTERM, checkpoint, stop, return
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    with open(sys.argv[2], "a") as fh:
        fh.write("ready\\n")
    print(os.getpid(), flush=True)
    while not stop:
        time.sleep(0.05)
    with open(sys.argv[2], "a") as fh:  # the test's trace of how far the worker came
        fh.write(f"SIGTERM caught; returning; parent {os.getppid()}\\n")
    return "stopped"

def unit():
    return _orphan_exit(stops_on_sigterm) if sys.argv[1] == "guarded" else stops_on_sigterm()

if __name__ == "__main__":
    pool = ProcessPoolExecutor(1, mp_context=get_context("spawn"), initializer=_worker, initargs=(1,))
    pool.submit(unit)
    if sys.argv[3:] == ["leader-exits"]:  # the main thread dies first, another thread of the bench lives on
        import ctypes, threading
        threading.Thread(target=time.sleep, args=(120,)).start()
        while not (os.path.exists(sys.argv[2]) and "ready" in open(sys.argv[2]).read()):
            time.sleep(0.05)
        ctypes.CDLL(None).pthread_exit(None)
    time.sleep(120)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_worker_whose_unit_stops_on_the_bench_death_ends_too(tmp_path):
    """The trainers catch the SIGTERM a dying bench sends its workers (to checkpoint and stop), so the unit
    returns; the worker then ends rather than waiting for ever to hand the result to a parent that is gone."""
    trace = tmp_path / "trace.txt"
    worker, alive = _kill_bench(tmp_path, STOPPING, "guarded", str(trace))  # "plain" (no _orphan_exit): it stays
    assert not alive, (f"worker {worker} outlived the killed bench after its unit stopped: {alive}; its trace: "
                       f"{trace.read_text() if trace.exists() else 'none'}")


def test_a_worker_ends_when_the_bench_main_thread_dies_before_the_rest_of_it(tmp_path):
    """The parent-death signal comes when the worker's parent *thread* dies, and the worker goes first to
    another thread of the same process, so its unit can stop and return while ``getppid()`` is still the
    bench's (three full CI runs here: a SIGKILLed bench's threads die one by one). Made certain: the bench's
    main thread exits (``pthread_exit``) while another of its threads lives on, and the worker must end."""
    trace = tmp_path / "trace.txt"
    worker, alive = _kill_bench(tmp_path, STOPPING, "guarded", str(trace), "leader-exits", kill=False)
    assert not alive, (f"worker {worker} outlived its bench's main thread: {alive}; its trace: "
                       f"{trace.read_text() if trace.exists() else 'none'}")


def _kill_bench(tmp_path, source: str, *args: str, kill: bool = True) -> tuple[int, str]:
    """Run ``source`` as a bench process that prints its worker's pid, SIGKILL it, and give the worker 60 s to
    end: ``(pid, "")``, or the still running worker's state and parent (``/proc/PID/status``; the bench's pid
    beside them), for the failure's message. A worker still running is then killed, so a failing test leaves
    none. (One CI run on two loaded cores found the guarded worker alive after 20 s; not reproduced.)"""
    script = tmp_path / "bench_parent.py"
    script.write_text(source)
    parent = subprocess.Popen([sys.executable, str(script), *args], stdout=subprocess.PIPE, text=True)
    worker = int(parent.stdout.readline())
    if kill:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and _running(worker):
        time.sleep(0.1)
    alive = ""
    if _running(worker):
        with open(f"/proc/{worker}/status") as fh:
            alive = "; ".join(line.strip() for line in fh
                              if line.startswith(("State:", "PPid:", "SigCgt:", "SigPnd:", "ShdPnd:", "SigBlk:")))
        for what in ("wchan", "syscall"):
            with contextlib.suppress(OSError), open(f"/proc/{worker}/{what}") as fh:
                alive += f"; {what}: {fh.read().strip()}"
        alive += f"; the bench was {parent.pid}"
        os.kill(worker, signal.SIGKILL)
    parent.kill()
    parent.wait()
    return worker, alive


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
