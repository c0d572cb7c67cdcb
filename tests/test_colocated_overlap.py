"""Colocated with one step of overlap (issue 33, item 2, option (b) of docs/colocated.md): the engines stay
awake beside the trainer (``colocated.awake_while_training``), step n+1's rollouts decode on them while step
n trains, and the new weights are synced after the rollouts' thread is joined.

On CPU with the stand-in engine (``train/generation/colocated_engines.py``), which journals its calls and
refuses a control call (a bucket, the checksum, sleep, wake) while a turn is in flight on it. What is
checked: on-policy, awake trains bit for bit what asleep trains; one step stale, step n's rollouts were
sampled by the weights synced after max(n - 2, 0) optimizer steps; no engine syncs while a turn is in flight
on it and none sleeps or wakes; the refusals of the config, the stand-in and the memory plan (the paper's
Qwen3-4B on 4 x H100-80GB: fits, with the plan's share 0.32 of each GPU)."""

from __future__ import annotations

import csv
import dataclasses
import json
import threading
from pathlib import Path

import pytest
import torch

from helpers.colocated import capture_standins, grpo_config
from hydroagent_hpc.errors import ConfigError
from hydroagent_hpc.train.generation import colocated as colo
from hydroagent_hpc.train.generation.colocated import weight_buckets
from hydroagent_hpc.train.generation.colocated_engines import EngineOrderError, EngineSpec, StandinEngine
from hydroagent_hpc.train.generation.sampler import Sampling
from hydroagent_hpc.train.grpo.config import load_grpo_config
from hydroagent_hpc.train.grpo.trainer import train_grpo

ROOT = Path(__file__).resolve().parents[1]
CONTROL = ("wake", "sleep", "update", "synced", "checksum")


@pytest.fixture(scope="module")
def basins(grpo_basins: Path) -> Path:
    return grpo_basins  # tests/conftest.py


def _config(tmp_path: Path, basins: Path, name: str, *, awake: bool, **extra: object) -> Path:
    """One tool call an episode, the stand-in engines awake while training or not."""
    return grpo_config(tmp_path, basins, name, env="{max_turns: 1}", generator="colocated",
                       colocated=f"{{backend: standin, bucket_mb: 1, awake_while_training: {str(awake).lower()}}}",
                       **extra)


def _rows(run: Path) -> list[dict[str, str]]:
    with open(run / "metrics.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def _versions(run: Path) -> dict[str, int]:
    from hydroagent_hpc.store import read_episodes

    eps = read_episodes(run / "rollouts.h5")
    return {e: json.loads(p)["policy_version"] for e, p in zip(eps.episode_id, eps.provenance)}


# --------------------------------------------------------------------------------------------- (d) refusals


def test_overlap_with_colocated_needs_the_engines_awake_and_truncated_importance_weights(basins, tmp_path):
    stale = {"max_staleness": 1, "tis_cap": 2.0}
    with pytest.raises(ConfigError, match=r"colocated\.yaml:\d+: max_staleness: 1 with generator: colocated.*sleep.*\n"
                                          r"  fix: set colocated\.awake_while_training: true"):
        load_grpo_config(_config(tmp_path, basins, "colocated", awake=False, **stale))
    cfg = load_grpo_config(_config(tmp_path, basins, "awake", awake=True, **stale))
    assert cfg.colocated is not None and cfg.colocated.awake_while_training and cfg.max_staleness == 1
    with pytest.raises(ConfigError, match=r"max_staleness: 1 trains on rollouts sampled by older weights.*\n"
                                          r"  fix: set tis_cap: 2\.0"):
        load_grpo_config(_config(tmp_path, basins, "awake", awake=True, max_staleness=1))
    # awake on-policy is a config of its own (no sleep, no wake; the memory plan counts both)
    assert load_grpo_config(_config(tmp_path, basins, "awake0", awake=True)).max_staleness == 0


def test_the_standin_refuses_a_sync_while_a_turn_is_in_flight(tiny, stops):
    model, tok = tiny
    stop, _ = stops
    greedy = Sampling(max_new_tokens=4, greedy=True)
    engine = StandinEngine(EngineSpec(index=0, model=model, model_path=None, device=torch.device("cpu"),
                                      dtype=torch.float32, memory_fraction=0.5, context_tokens=512, seed=0,
                                      pad_id=int(tok.pad_token_id), max_batch=2))
    buckets = list(weight_buckets(model, 2**40, torch.float32))
    for bucket, last in buckets:
        engine.update_weights(bucket, last=last)
    ids = tok("Calibrate.", add_special_tokens=False)["input_ids"]
    engine.generate(ids, None, greedy, stop)  # builds the batching server
    server = engine._servers[greedy]
    release, started = threading.Event(), threading.Event()
    real = server.generate

    def held(*args, **kwargs):  # a turn that stays in flight until released
        started.set()
        release.wait(30)
        return real(*args, **kwargs)

    server.generate = held
    turn = threading.Thread(target=engine.generate, args=(ids, None, greedy, stop))
    turn.start()
    try:
        assert started.wait(30) and engine.in_flight == 1
        for call, name in ((lambda: engine.update_weights(buckets[0][0], last=True), "update_weights"),
                           (lambda: engine.checksum("lm_head.weight"), "checksum"),
                           (engine.sleep, "sleep")):
            with pytest.raises(EngineOrderError, match=rf"{name} while 1 generate call\(s\) are in flight"):
                call()
    finally:
        release.set()
        turn.join(30)
    assert engine.in_flight == 0
    engine.update_weights(buckets[0][0], last=True)  # the turn answered: the sync may start
    events = [e for _, e in engine.journal]
    assert events[-4:] == ["generate", "generated", "update", "synced"]
    engine.close()


def test_the_memory_plan_counts_the_awake_engine_beside_the_training():
    """The paper's GRPO config (data/train/grpo-qwen3-4b.yaml: Qwen3-4B, 8 x 4 rollouts of up to 32,768
    tokens, checkpointing, FSDP2) colocated with the engines awake while training: on 4 x H100-80GB it fits
    with the plan's share 0.32 of each GPU (the engine's 7.5 GiB of weights and a 17.7 GiB KV pool, 3 of its
    8 rollouts at full context, beside a 48.6 GiB training peak); a memory_fraction of 0.5 does not (the
    fix names 0.31), and neither does one H100 (the fix names 3 GPUs)."""
    from hydroagent_hpc.train.generation.colocated_config import ColocatedSettings
    from hydroagent_hpc.train.memory_plan import (
        QWEN3_4B_INSTRUCT_2507,
        GiB,
        MemoryPlanError,
        check_plan,
        colocated_memory_fraction,
        gpu_named,
        plan_grpo,
    )

    q, h100 = QWEN3_4B_INSTRUCT_2507, gpu_named("H100-80GB")
    paper = load_grpo_config(ROOT / "data/train/grpo-qwen3-4b.yaml")

    def colocated(awake: bool, fraction: float | None = None, staleness: int = 1):
        return dataclasses.replace(paper, generator="colocated", engine=None, max_staleness=staleness,
                                   colocated=ColocatedSettings(awake_while_training=awake, memory_fraction=fraction))

    awake = check_plan(plan_grpo(colocated(True), world=4, gpu="H100-80GB", shape=q))
    phase = awake.phase("training beside the awake engine")
    training = awake.training
    assert phase is not None and phase.fits and awake.worst is phase
    engine = {t.name: t.bytes for t in phase.resident if t.name.startswith("engine")}
    # the trainer's weights, gradients, AdamW state and activations, and the engine's weights, pool and workspace
    assert {t.name for t in training.resident} <= {t.name for t in phase.resident}
    assert phase.moments == training.moments and phase.peak > training.peak + sum(engine.values())
    share = colocated_memory_fraction(colocated(True), world=4, total_bytes=h100.total, shape=q)
    assert share == pytest.approx(0.316, abs=0.005)
    assert engine["engine KV pool (bf16, awake)"] == int(share * h100.total) - 2 * q.params
    assert engine["engine KV pool (bf16, awake)"] / GiB == pytest.approx(17.7, abs=0.1)
    # asleep the engine gets more (it shares the GPU with the trainer's resident state only)
    assert colocated_memory_fraction(colocated(False, staleness=0), world=4, total_bytes=h100.total,
                                     shape=q) > share + 0.4
    # a share too large for the training peak: refused, naming the largest that fits and the other fixes
    with pytest.raises(MemoryPlanError, match=r"training beside the awake engine phase peaks at") as err:
        check_plan(plan_grpo(colocated(True, 0.5), world=4, gpu="H100-80GB", shape=q))
    msg = str(err.value)
    assert "a smaller colocated.memory_fraction: 0.31" in msg
    assert "colocated.awake_while_training: false and max_staleness: 0" in msg
    assert check_plan(plan_grpo(colocated(True, 0.31), world=4, gpu="H100-80GB", shape=q)).fits
    # one H100 cannot hold the training and an engine: more GPUs
    with pytest.raises(MemoryPlanError, match=r"more GPUs: 3 trainers, each with its engine awake"):
        check_plan(plan_grpo(colocated(True), world=1, gpu="H100-80GB", shape=q))
    # without the setting the plan has no such phase (the engine sleeps while training)
    assert plan_grpo(colocated(False, staleness=0), world=4, gpu="H100-80GB",
                     shape=q).phase("training beside the awake engine") is None


# --------------------------------------------------------------------------------------------- the trainer


class _HeldEngine(StandinEngine):
    """A stand-in whose turns, decoded while a step trains, answer only once the trainer joins the rollouts
    thread (``gate``, set by ``RolloutsAhead.wait``): decoding that outlasts the optimisation, as on a GPU,
    so a sync that does not wait for the join finds turns in flight."""

    def __init__(self, spec: EngineSpec, gate: threading.Event) -> None:
        super().__init__(spec)
        self.gate = gate

    def _server(self, sampling, stop_ids, ids):
        server, gate = super()._server(sampling, stop_ids, ids), self.gate

        class Held:
            def generate(self, *args, **kwargs):
                sample = server.generate(*args, **kwargs)
                gate.wait(30)
                return sample

        return Held()


@pytest.fixture(scope="module")
def stale_run(basins, tmp_path_factory):
    """Three steps, one step stale, the engine awake while training (the stand-in's journal kept)."""
    from hydroagent_hpc.train.grpo import trainer
    from hydroagent_hpc.train.grpo.overlap import RolloutsAhead

    tmp = tmp_path_factory.mktemp("colocated-stale")
    made: list[StandinEngine] = []
    gate = threading.Event()
    gate.set()
    optimise, join = trainer._optimizer_step, RolloutsAhead.wait

    def optimising(*args, **kwargs):
        gate.clear()  # the next step's turns decoded from here on answer at the join
        return optimise(*args, **kwargs)

    def joined(self):
        gate.set()
        return join(self)

    def factory(spec: EngineSpec) -> StandinEngine:
        made.append(_HeldEngine(spec, gate))
        return made[-1]

    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(colo.BACKENDS, "standin", factory)
        mp.setattr(trainer, "_optimizer_step", optimising)
        mp.setattr(RolloutsAhead, "wait", joined)
        cfg = load_grpo_config(_config(tmp, basins, "stale", awake=True, max_steps=3, max_staleness=1, tis_cap=2.0))
        summary = train_grpo(cfg, tmp / "run")
    (engine,) = made
    return summary, tmp / "run", engine


@pytest.mark.slow
def test_one_step_stale_rollouts_come_from_the_weights_synced_two_steps_back(stale_run):
    summary, run, engine = stale_run
    assert summary["steps"] == 3 and summary["stopped"] is None
    rows = _rows(run)
    assert [int(r["staleness"]) for r in rows] == [0, 1, 1]
    versions = _versions(run)
    assert len(versions) == 3 * 2
    # step n's rollouts were sampled by the weights synced after max(n - 2, 0) optimizer steps
    assert all(v == max(int(e.split("-s")[1][:5]) - 2, 0) for e, v in versions.items()), versions
    assert float(rows[0]["logprob_mismatch_max"]) < 1e-4  # step 1: on-policy
    for r in rows[1:]:
        assert float(r["logprob_mismatch_max"]) > 1e-4 and float(r["tis_ratio_max"]) > 1.0, r
    assert len(engine.syncs) == 4  # before step 1, after steps 1, 2 and 3
    assert not list((run / "overlap").iterdir())


@pytest.mark.slow
def test_no_sync_while_a_turn_is_in_flight_and_no_sleep_or_wake(stale_run):
    _, _, engine = stale_run
    in_flight, at_control, between = 0, [], []
    trained = False
    for who, event in engine.journal:
        if event == "generate":
            in_flight += 1
        elif event == "generated":
            in_flight -= 1
            if trained:
                between.append(event)
        elif event in CONTROL:
            at_control.append((event, in_flight))
            trained = False
        elif (who, event) == ("trainer", "train"):
            trained = True
    assert in_flight == 0
    assert all(n == 0 for _, n in at_control), at_control  # every bucket, checksum: nothing in flight
    assert not {e for e, _ in at_control} & {"sleep", "wake"}  # awake from construction to close
    assert [e for e, _ in at_control].count("synced") == 4
    # the next step's turns were answered after the trainer started optimising, before the sync that followed
    assert len(between) == 2 * 2


@pytest.mark.slow
def test_awake_on_policy_trains_exactly_what_asleep_trains(basins, tmp_path, monkeypatch):
    """``max_staleness: 0``: the engines only skip their sleep and wake, so every metric and the final weights
    equal the sleeping layout's bit for bit (one-row batches, the stand-in samples in fp32)."""
    from safetensors.torch import load_file

    made = capture_standins(monkeypatch)
    runs = {}
    for awake in (False, True):
        name = "awake" if awake else "asleep"
        cfg = load_grpo_config(_config(tmp_path, basins, name, awake=awake, temperature=1.2, seed=1))
        assert train_grpo(cfg, tmp_path / name)["steps"] == 2
        runs[name] = _rows(tmp_path / name)
    times = {"generation_s", "simulation_s", "training_s", "step_s", "weight_sync_s"}
    for a, b in zip(runs["asleep"], runs["awake"], strict=True):
        assert {k: v for k, v in a.items() if k not in times} == {k: v for k, v in b.items() if k not in times}
    final = {n: load_file(tmp_path / n / "final" / "model.safetensors") for n in ("asleep", "awake")}
    assert all(torch.equal(final["asleep"][k], final["awake"][k]) for k in final["asleep"])
    asleep, awake = ([e for _, e in m.journal if e in ("sleep", "wake", "synced")] for m in made)
    assert asleep == ["synced", "sleep", "wake", "synced", "sleep", "wake", "synced"]
    assert awake == ["synced", "synced", "synced"]
