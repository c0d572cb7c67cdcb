"""kill -9 at any moment of SFT or GRPO, then ``--resume``: no step repeated, none skipped.

The moments are generated, not chosen: an uninterrupted run of each trainer (the tiny offline Qwen3,
real HDF5 data, real basins and simulator for GRPO) is traced by ``tests/helpers/killpoints`` (loaded
as the child's ``sitecustomize``), which names every write the process makes: each metrics row
(CSV and HDF5), each file of each checkpoint, its manifest, the folder rename, the ``latest``
pointer, the episodes GRPO stores, the final model. Between two writes a process changes only its
memory, so a kill just before each of them reaches every state a kill at any moment can leave on
disk (during a step, during a checkpoint write, between the checkpoint and the metrics row, during
the pointer update, during the final save). Each case is a real child killed with a real SIGKILL
at its event, then a real ``--resume``; it passes when the run's own metric rows are steps 1..N,
each once (``metrics.csv``; for GRPO also ``metrics.h5``, and every episode stored once), and the final
weights are those of the uninterrupted run, bit for bit (a repeated or skipped step would move them).

By default a seeded sample of the cases runs (slow: about 15 s a case); ``HYDROAGENT_CASES=all``
runs every event of the trace (how the counts in docs/guarantees.md were measured).
"""

from __future__ import annotations

import csv
import logging
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from safetensors.torch import load_file  # noqa: E402

from helpers.cases import every_case  # noqa: E402
from helpers.sft import short_trajectories, write_sft_data  # noqa: E402
from hydroagent_hpc.train import tiny  # noqa: E402
from hydroagent_hpc.train.checkpoint import FAULT_ENV  # noqa: E402

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[1]
KILLPOINTS = ROOT / "tests" / "helpers" / "killpoints"
SAMPLE = 1  # sampled cases per trainer beside the 3 fixed ones (each ~35 s in CI), unless HYDROAGENT_CASES=all


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    for key in (FAULT_ENV, "HYDROAGENT_KILL_TRACE", "HYDROAGENT_KILL_AT"):
        env.pop(key, None)
    env.update(PYTHONPATH=os.pathsep.join([str(KILLPOINTS), str(ROOT)]), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1",
               **extra)
    return env


def _train(module: str, cfg: Path, out: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", module, str(cfg), "--out", str(out), *args], env=_env(**env),
                          capture_output=True, text=True, timeout=600, cwd=ROOT)


def _events(trace: Path) -> list[str]:
    """The writes of the traced run from its config record on (earlier ones are start-up, before the run
    folder holds anything)."""
    lines = [line.strip() for line in trace.read_text().splitlines() if line.strip()]
    first = next(i for i, line in enumerate(lines) if "config.yaml" in line)
    return lines[first:]


def _cases(events: list[str], always: tuple[str, ...], seed: int) -> list[str]:
    if every_case():
        return events
    fixed = [next(e for e in reversed(events) if e.startswith(a)) for a in always]  # each at its last occurrence
    rest = [e for e in events if e not in fixed]
    return fixed + random.Random(seed).sample(rest, min(SAMPLE, len(rest)))


def _steps_csv(run: Path) -> list[int]:
    with open(run / "metrics.csv", newline="") as fh:
        return [int(r["step"]) for r in csv.DictReader(fh)]


def _same_weights(a: Path, b: Path) -> bool:
    x, y = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def _verdict(run: Path, reference: Path, steps: int, grpo: bool) -> str | None:
    """What is wrong with a resumed run (None: every step once, the uninterrupted run's weights)."""
    rows = _steps_csv(run)
    if rows != list(range(1, steps + 1)):
        return f"metrics.csv steps {rows}"
    if grpo:
        import h5py

        from hydroagent_hpc.store import read_episodes

        with h5py.File(run / "metrics.h5", "r") as f:
            h5 = [int(s) for s in f["metrics/step"][:]]
            lengths = {f[f"metrics/{c}"].shape[0] for c in f["metrics"]}
        if h5 != list(range(1, steps + 1)) or lengths != {steps}:
            return f"metrics.h5 steps {h5} (column lengths {sorted(lengths)})"
        ids = list(read_episodes(run / "rollouts.h5").episode_id)
        want = sorted(read_episodes(reference / "rollouts.h5").episode_id)
        if sorted(ids) != want:
            return f"rollouts.h5 holds {len(ids)} episodes ({len(set(ids))} distinct), the run {len(want)}"
    if not _same_weights(run / "final", reference / "final"):
        return "final weights differ from the uninterrupted run's"
    return None


def kill_and_resume(module: str, cfg: Path, run: Path, event: str, reference: Path, steps: int,
                    grpo: bool) -> str | None:
    """One case: the run killed just before ``event``, resumed; what is wrong (None: nothing). ``run`` is named
    ``run`` as the traced run's folder was (events name the last two parts of a path)."""
    killed = _train(module, cfg, run, "--resume", HYDROAGENT_KILL_AT=event)
    if killed.returncode != -9:
        return f"not killed at {event} (exit {killed.returncode}): {killed.stderr[-300:]}"
    resumed = _train(module, cfg, run, "--resume")
    if resumed.returncode != 0:
        return f"resume failed (exit {resumed.returncode}): {resumed.stderr.strip().splitlines()[-1:]}"
    return _verdict(run, reference, steps, grpo)


# ---------------------------------------------------------------------------------------------
# SFT: 4 examples, micro-batch 1 x accumulation 2 (2 steps per epoch), 4 steps, a checkpoint every 2

SFT_STEPS = 4


@pytest.fixture(scope="module")
def sft_config(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("sft-kill")
    data = write_sft_data(tmp / "data.h5", short_trajectories(tiny.build_tiny_tokenizer(), 4, seed=1),
                          [1.0, 0.5, 0.8, 0.3])
    cfg = tmp / "sft.yaml"
    cfg.write_text(f"data: {data}\nmodel: tiny\nlr: 3.0e-3\nwarmup_steps: 1\nseed: 0\nmax_steps: {SFT_STEPS}\n"
                   "micro_batch_size: 1\ngrad_accum: 2\nsave_every: 2\n")
    return cfg


@pytest.fixture(scope="module")
def sft(sft_config: Path) -> dict[str, Any]:
    """The uninterrupted SFT run, traced."""
    tmp, cfg = sft_config.parent, sft_config
    done = _train("hydroagent_hpc.train.sft", cfg, tmp / "run", HYDROAGENT_KILL_TRACE=str(tmp / "trace"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert _steps_csv(tmp / "run") == list(range(1, SFT_STEPS + 1))
    return {"cfg": cfg, "reference": tmp / "run", "events": _events(tmp / "trace")}


def test_sft_resumes_after_a_kill_during_the_latest_pointer_update(sft_config, tmp_path):
    """The pointer of the second checkpoint is half updated (``latest.tmp`` written, not yet renamed):
    the resumed run goes back to step 2, drops the rows of steps 3-4 and trains them again, once."""
    run = tmp_path / "run"
    killed = _train("hydroagent_hpc.train.sft", sft_config, run,
                    HYDROAGENT_KILL_AT="replace:latest.tmp>checkpoints/latest#2")
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert (run / "checkpoints" / "latest.tmp").read_text().strip() == "step-4"
    assert _steps_csv(run) == [1, 2, 3, 4]  # the rows were written before the checkpoint
    resumed = _train("hydroagent_hpc.train.sft", sft_config, run, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed from" in resumed.stderr and "step-2 (step 2)" in resumed.stderr
    assert _steps_csv(run) == list(range(1, SFT_STEPS + 1))
    assert (run / "checkpoints" / "latest").read_text().strip() == f"step-{SFT_STEPS}"


@pytest.mark.slow
def test_sft_survives_a_kill_before_every_write(sft, tmp_path):
    cases = _cases(sft["events"], ("replace:step-", "open-a:run/metrics.csv", "open-w:step-"), seed=0)
    failed = {}
    for i, event in enumerate(cases):
        problem = kill_and_resume("hydroagent_hpc.train.sft", sft["cfg"], tmp_path / f"case{i}" / "run", event,
                                  sft["reference"], SFT_STEPS, grpo=False)
        if problem:
            failed[event] = problem
    log.info("SFT kill cases: %d of %d failed (%d events in the trace)", len(failed), len(cases), len(sft["events"]))
    assert not failed, f"{len(failed)} of {len(cases)} kill points: {failed}"


# ---------------------------------------------------------------------------------------------
# GRPO: two basins, K = 2, one prompt a step, 3 steps, a checkpoint every 2 (and at the end)

GRPO_STEPS = 3


@pytest.fixture(scope="module")
def grpo(grpo_basins: Path, tmp_path_factory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("grpo-kill")
    cfg = tmp / "grpo.yaml"
    cfg.write_text(f"basins: [{grpo_basins / 'b1'}, {grpo_basins / 'b2'}]\ngroup_size: 2\nprompts_per_step: 1\n"
                   f"max_steps: {GRPO_STEPS}\nmax_new_tokens: 12\nlr: 1.0e-3\ngeneration_batch: 1\n"
                   "env: {max_turns: 2}\nsave_every: 2\n")
    done = _train("hydroagent_hpc.train.grpo", cfg, tmp / "run", HYDROAGENT_KILL_TRACE=str(tmp / "trace"))
    assert done.returncode == 0, done.stderr[-3000:]
    return {"cfg": cfg, "reference": tmp / "run", "events": _events(tmp / "trace")}


@pytest.mark.slow
def test_grpo_survives_a_kill_before_every_write(grpo, tmp_path):
    cases = _cases(grpo["events"], ("h5flush:run/metrics.h5", "h5flush:run/rollouts.h5", "replace:latest.tmp>"),
                   seed=0)
    failed = {}
    for i, event in enumerate(cases):
        problem = kill_and_resume("hydroagent_hpc.train.grpo", grpo["cfg"], tmp_path / f"case{i}" / "run", event,
                                  grpo["reference"], GRPO_STEPS, grpo=True)
        if problem:
            failed[event] = problem
    log.info("GRPO kill cases: %d of %d failed (%d events in the trace)", len(failed), len(cases),
             len(grpo["events"]))
    assert not failed, f"{len(failed)} of {len(cases)} kill points: {failed}"
