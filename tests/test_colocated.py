"""The colocated layout (``generator: colocated``) on CPU with stand-in engines (issue 33, items 1 and 4).

The stand-in engine (``train/generation/colocated.py``, :class:`StandinEngine`) is a real engine of our
own: the tiny offline Qwen3 copied from the trainer's architecture, weights only from the syncs, our
sampler behind a batching server, and the real engines' call order enforced (generate or update while
asleep, wake twice, generate before a complete sync are errors). Two "ranks" are two generators in this
process, the second reached through its real socket service. What is checked: which engine wakes when,
that the trainer never optimises while an engine holds its memory, that every engine receives every
bucket once per sync with the trainer's checksum, that a group stays on one engine, that an engine
failing mid-rollout fails its rollouts only (and all of them failing stops with one line), and, through
the real trainer, that ``backend: standin`` trains exactly what ``generator: local`` trains.
"""

from __future__ import annotations

import csv
import logging
from pathlib import Path

import pytest
import torch

from helpers.colocated import capture_standins, grpo_config
from hydroagent_hpc.errors import CannotHealError, ConfigError
from hydroagent_hpc.train.generation.colocated import (
    ColocatedGenerator,
    EngineService,
    assign_groups,
    checksum_name,
    weight_buckets,
)
from hydroagent_hpc.train.generation.colocated_engines import (
    ColocatedError,
    EngineLostError,
    EngineOrderError,
    EngineSpec,
    StandinEngine,
    WeightSyncError,
    tensor_digest,
)
from hydroagent_hpc.train.generation.sampler import Sampling
from hydroagent_hpc.train.grpo.config import grpo_config_from_mapping, load_grpo_config
from hydroagent_hpc.train.grpo.trainer import play_episodes, rollout_seed, train_grpo

GREEDY = Sampling(max_new_tokens=8, greedy=True)
#: Bytes per bucket in these tests: the tiny Qwen3's 0.85 M fp32 parameters go in 5 or so buckets.
BUCKET = 2**19


@pytest.fixture(scope="module")
def basins(grpo_basins: Path) -> Path:
    return grpo_basins  # tests/conftest.py


def _spec(model, tok, index: int = 0, journal=None) -> EngineSpec:
    return EngineSpec(index=index, model=model, model_path=None, device=torch.device("cpu"), dtype=torch.float32,
                      memory_fraction=0.5, context_tokens=4096, seed=0, pad_id=int(tok.pad_token_id), max_batch=4,
                      journal=journal if journal is not None else [])


def _sync_by_hand(engine: StandinEngine, model, bucket_bytes: int = BUCKET) -> None:
    for bucket, last in weight_buckets(model, bucket_bytes, torch.float32):
        engine.update_weights(bucket, last=last)


def _prompt(tok) -> list[int]:
    return tok("<|im_start|>user\nCalibrate the basin.<|im_end|>\n<|im_start|>assistant\n",
               add_special_tokens=False)["input_ids"]


def test_weight_buckets_hold_every_parameter_once_in_order(tiny):
    model, _ = tiny
    names = [n for n, _ in model.named_parameters()]
    buckets = list(weight_buckets(model, BUCKET, torch.bfloat16))
    assert len(buckets) >= 3
    assert [n for b, _ in buckets for n, _ in b] == names
    assert [last for _, last in buckets] == [False] * (len(buckets) - 1) + [True]
    for bucket, last in buckets:
        size = sum(t.numel() * t.element_size() for _, t in bucket)
        assert all(t.dtype == torch.bfloat16 for _, t in bucket)
        assert last or size >= BUCKET  # only the last is short
        assert size - bucket[-1][1].numel() * bucket[-1][1].element_size() < BUCKET  # closed at the first crossing
    # one bucket when it is large enough; the values are the model's (cast)
    ((whole, last),) = list(weight_buckets(model, 2**40, torch.float32))
    assert last and all(torch.equal(t, dict(model.named_parameters())[n]) for n, t in whole)
    assert checksum_name(names) == "model.layers.3.mlp.down_proj.weight"
    assert assign_groups([0, 0, 1, 1, 2, 2, 3], [0, 1]) == {0: 0, 1: 1, 2: 0, 3: 1}
    assert assign_groups([5, 5, 2], [1]) == {5: 1, 2: 1}


def test_the_standin_refuses_every_call_the_real_engines_refuse(tiny, stops):
    model, tok = tiny
    stop, _ = stops
    journal: list[tuple[str, str]] = []
    engine = StandinEngine(_spec(model, tok, journal=journal))
    assert engine.holds_memory  # awake from construction, as SGLang's Engine and vLLM's LLM
    with pytest.raises(EngineOrderError, match="before a complete weight sync"):
        engine.generate(_prompt(tok), None, GREEDY, stop)
    with pytest.raises(EngineOrderError, match="wake while awake"):
        engine.wake()
    # a sync that misses a bucket, or sends one twice, is refused at its last bucket
    buckets = list(weight_buckets(model, BUCKET, torch.float32))
    for bucket, _ in buckets[:-2]:
        engine.update_weights(bucket, last=False)
    with pytest.raises(EngineOrderError, match="every parameter once"):
        engine.update_weights(buckets[-1][0], last=True)
    for bucket, _ in [*buckets[:-1], buckets[0]]:
        engine.update_weights(bucket, last=False)
    with pytest.raises(EngineOrderError, match="x2"):
        engine.update_weights(buckets[-1][0], last=True)
    _sync_by_hand(engine, model)
    name = checksum_name([n for n, _ in model.named_parameters()])
    assert engine.checksum(name) == tensor_digest(dict(model.named_parameters())[name])
    sample = engine.generate(_prompt(tok), None, GREEDY, stop)
    assert sample.ids and len(sample.logprobs) == len(sample.ids)
    engine.sleep()
    assert not engine.holds_memory
    for call in (lambda: engine.sleep(), lambda: engine.generate(_prompt(tok), None, GREEDY, stop),
                 lambda: engine.update_weights(buckets[0][0], last=False), lambda: engine.checksum(name)):
        with pytest.raises(EngineOrderError, match="while asleep"):
            call()
    engine.wake()  # awake again, but the weights must come again before anything is sampled
    with pytest.raises(EngineOrderError, match="before a complete weight sync"):
        engine.generate(_prompt(tok), None, GREEDY, stop)
    _sync_by_hand(engine, model)
    assert engine.generate(_prompt(tok), None, GREEDY, stop).ids == sample.ids
    engine.close()
    assert [e for _, e in journal if e not in ("update",)] == ["synced", "checksum", "generate", "generated", "sleep",
                                                                "wake", "synced", "generate", "generated"]


@pytest.fixture
def pair(tiny):
    """Two generators as ranks 0 and 1 of one run: rank 1's stand-in reached through its socket service."""
    model, tok = tiny
    journal: list[tuple[str, str]] = []
    one = ColocatedGenerator(StandinEngine(_spec(model, tok, 1, journal)), bucket_bytes=BUCKET, dtype=torch.float32,
                             rank=1, journal=journal)
    key = b"k" * 32
    one.service = EngineService(one.local, key, host="127.0.0.1")
    zero = ColocatedGenerator(StandinEngine(_spec(model, tok, 0, journal)), bucket_bytes=BUCKET, dtype=torch.float32,
                              rank=0, remotes=[one.service.address], authkey=key, journal=journal)
    yield zero, one
    zero.close()
    one.close()


def _perturbed(model, seed: int = 5):
    import copy

    other = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return other


def test_every_engine_gets_every_bucket_once_per_sync_and_the_trainers_checksum(tiny, pair):
    model, _ = tiny
    zero, one = pair
    for step, weights in enumerate((model, _perturbed(model), _perturbed(model, 7))):
        for gen in (zero, one):
            if step:
                gen.sleep()
                gen.check_released()  # asleep: the trainer may optimise
            assert gen.sync(weights, step) >= 0
            engine = gen.local.engine
            names = [n for b, _ in weight_buckets(weights, BUCKET, torch.float32) for n, _ in b]
            assert engine.syncs[-1] == [[n for n, _ in b] for b, _ in weight_buckets(weights, BUCKET, torch.float32)]
            assert sorted(n for b in engine.syncs[-1] for n in b) == sorted(names)
            probe = checksum_name(names)
            assert gen.checked == tensor_digest(dict(weights.named_parameters())[probe])
        assert len(zero.local.engine.syncs) == len(one.local.engine.syncs) == step + 1
    # an engine holding other weights than the trainer's is caught by the checksum
    engine = zero.local.engine
    real = engine.checksum

    def stale(name: str) -> str:
        return real(name)[::-1]

    engine.checksum = stale
    zero.sleep()
    with pytest.raises(WeightSyncError, match=r"checksum .* the trainer's is"):
        zero.sync(model, 9)


def test_the_trainer_never_optimises_while_an_engine_holds_memory(tiny, pair):
    model, _ = tiny
    zero, _ = pair
    zero.sync(model, 0)
    with pytest.raises(ColocatedError, match="holds its memory while the trainer optimises"):
        zero.check_released()
    zero.sleep()
    zero.check_released()
    events = [e for who, e in zero.journal if who in ("standin:0", "trainer") and e != "update"]
    assert events == ["synced", "checksum", "sleep", "train"]


def _specs(basins: Path, groups: int, k: int, step: int = 1):
    from hydroagent_hpc.train.generation.rollout import RolloutSpec

    names = ["b1", "b2"]
    return [RolloutSpec(g, m, str(basins / names[g % 2]), rollout_seed(0, step, g, m), f"t-s{step}-g{g}-k{m}")
            for g in range(groups) for m in range(k)]


def _play(model, tok, basins, specs, generator, **extra):
    from hydroagent_hpc.sim import open_simulator
    from hydroagent_hpc.sim.basin import load_basin

    dirs = sorted({s.basin_dir for s in specs})
    config = grpo_config_from_mapping({"basins": dirs, "group_size": 2, "max_new_tokens": 8, "generation_batch": 4,
                                       "env": {"max_turns": 2}, "generator": "colocated",
                                       "colocated": {"backend": "standin"}, **extra})
    sims = {d: open_simulator(Path(d) / "control.txt") for d in dirs}
    return play_episodes(config, model, tok, specs, sims, {d: load_basin(d) for d in dirs}, generator=generator)


def _first_prompts(model, tok, basins: Path) -> dict[str, list[int]]:
    """Each basin's first prompt as the rollouts render it."""
    from hydroagent_hpc.agents.llm.hf_local import HFLocalPolicy
    from hydroagent_hpc.config import preset
    from hydroagent_hpc.env.environment import CalibrationEnv
    from hydroagent_hpc.sim import open_simulator
    from hydroagent_hpc.sim.basin import load_basin

    probe = HFLocalPolicy(model, tok)
    out = {}
    for name in ("b1", "b2"):
        d = basins / name
        env = CalibrationEnv(load_basin(d), open_simulator(d / "control.txt"), preset("paper", max_turns=2))
        out[name] = probe.builder.encode(probe.render(env.reset()))
    return out


def test_a_group_stays_on_one_engine_and_the_groups_spread_over_the_engines(tiny, pair, basins):
    model, tok = tiny
    zero, one = pair
    for gen in (zero, one):
        gen.sync(model, 0)
    rollouts, stats = _play(model, tok, basins, _specs(basins, groups=2, k=2), zero)
    assert all(r.error is None and r.trainable for r in rollouts)
    heads = _first_prompts(model, tok, basins)
    seen = {}
    for gen in (zero, one):
        requests = gen.local.engine.requests
        assert requests, f"{gen.local.name} served nothing"
        seen[gen.local.name] = {b for ids in requests for b, head in heads.items() if ids[:len(head)] == head}
        assert all(any(ids[:len(h)] == h for h in heads.values()) for ids in requests)
    # group 0 (b1) on engine 0, group 1 (b2) on rank 1's engine: every turn of a group on its engine
    assert seen == {"standin:0": {"b1"}, "standin:1": {"b2"}}
    assert stats["rows"] == sum(len(g.local.engine.requests) for g in (zero, one))


def test_an_engine_failing_mid_rollout_fails_its_rollouts_and_the_step_goes_on(tiny, pair, basins, caplog):
    model, tok = tiny
    zero, one = pair
    for gen in (zero, one):
        gen.sync(model, 0)
    one.local.engine.fail_after = 1  # rank 1's scheduler dies after its first turn
    caplog.set_level(logging.ERROR)
    rollouts, _ = _play(model, tok, basins, _specs(basins, groups=2, k=2), zero)
    lost = [r for r in rollouts if r.spec.group == 1]
    assert all(not r.trainable and "EngineLostError" in (r.error or "") for r in lost)
    assert all(r.error is None and r.trainable for r in rollouts if r.spec.group == 0)
    assert "colocated engine rank1 failed" in caplog.text
    assert zero.alive == ["standin:0"] and not one.local.alive  # both ranks know
    # the next step: every group on the engine left
    zero.sleep()
    one.sleep()
    zero.sync(model, 1)
    one.sync(model, 1)  # a lost engine is left out of the sync; its rank still takes part in the gathers
    before = len(zero.local.engine.requests)
    rollouts, _ = _play(model, tok, basins, _specs(basins, groups=2, k=2, step=2), zero)
    assert all(r.trainable for r in rollouts) and len(zero.local.engine.requests) > before
    # none left: the step stops with one line naming every failure
    zero.local.engine.fail_after = 0
    _play(model, tok, basins, _specs(basins, groups=1, k=1, step=3), zero)
    with pytest.raises(EngineLostError, match="every colocated engine has failed") as err:
        _play(model, tok, basins, _specs(basins, groups=1, k=1, step=4), zero)
    assert isinstance(err.value, CannotHealError) and "\n" not in err.value.message


def test_the_colocated_settings_are_checked_strictly(basins, tmp_path):
    base = {"basins": [str(basins / "b1")]}
    cfg = grpo_config_from_mapping({**base, "generator": "colocated"}, world_size=4)  # several trainers: allowed
    assert cfg.colocated is None
    cfg = grpo_config_from_mapping({**base, "generator": "colocated",
                                    "colocated": {"backend": "vllm", "memory_fraction": 0.4, "bucket_mb": 64}})
    assert cfg.colocated is not None and cfg.colocated.bucket_mb == 64
    path = tmp_path / "grpo.yaml"
    for text, wanted in [("colocated: {backend: standin}\n", "colocated.*given, but generator is local"),
                         ("generator: colocated\ncolocated: {backend: trt}\n", "colocated.backend"),
                         ("generator: colocated\ncolocated: {memory_fraction: 1.5}\n", "memory_fraction"),
                         ("generator: colocated\ncolocated: {bucket_mb: 0}\n", "bucket_mb")]:
        path.write_text(f"basins: [{basins / 'b1'}]\n" + text)
        with pytest.raises(ConfigError, match=wanted) as err:
            load_grpo_config(path)
        assert f"{path}:" in str(err.value)


def test_the_memory_plan_gives_the_engine_what_the_trainer_leaves(basins):
    from hydroagent_hpc.train.memory_plan import (
        QWEN3_4B_INSTRUCT_2507,
        check_plan,
        colocated_memory_fraction,
        gpu_named,
        plan_grpo,
    )

    cfg = grpo_config_from_mapping({"basins": [str(basins / "b1")], "generator": "colocated", "group_size": 8,
                                    "max_context_tokens": 32768, "activation_checkpointing": True,
                                    "colocated": {"backend": "sglang"}})
    h100 = gpu_named("H100-80GB")
    one = colocated_memory_fraction(cfg, world=1, total_bytes=h100.total, shape=QWEN3_4B_INSTRUCT_2507)
    four = colocated_memory_fraction(cfg, world=4, total_bytes=h100.total, shape=QWEN3_4B_INSTRUCT_2507)
    # one trainer keeps 4 N + 8 N + 2 N = 56 GB beside its engine; four shard it to 14 GB each
    n = QWEN3_4B_INSTRUCT_2507.params
    assert four > one > 0.05
    assert four == pytest.approx((h100.total * 0.95 - 14 * n / 4 - 512 * 2**20 - 1.5 * 2**30) / h100.total)
    plan = check_plan(plan_grpo(cfg, world=4, gpu="H100-80GB", shape=QWEN3_4B_INSTRUCT_2507))
    phase = plan.phase("colocated generation")
    assert phase is not None and phase.fits and plan.engine is None
    assert not any(p.name == "generation" for p in plan.phases)


def _rows(run: Path) -> list[dict[str, str]]:
    with open(run / "metrics.csv", newline="") as fh:
        return list(csv.DictReader(fh))


COLOCATED = {"generator": "colocated", "colocated": "{backend: standin, bucket_mb: 1}"}


def test_a_grpo_step_wakes_syncs_generates_sleeps_then_trains(basins, tmp_path, monkeypatch):
    made = capture_standins(monkeypatch)
    cfg = load_grpo_config(grpo_config(tmp_path, basins, "c", max_steps=1, env="{max_turns: 1}", **COLOCATED))
    summary = train_grpo(cfg, tmp_path / "run")
    assert summary["steps"] == 1 and summary["stopped"] is None
    (engine,) = made
    events = [e for _, e in engine.journal if e not in ("update", "generate", "generated")]
    # construction (awake), the first sync, the rollouts, sleep before training, wake and sync after it
    assert events == ["synced", "checksum", "sleep", "train", "wake", "synced", "checksum"]
    # every turn answered before the engine sleeps and the trainer optimises
    assert engine.journal.index(("trainer", "train")) > max(i for i, (_, e) in enumerate(engine.journal)
                                                            if e == "generated")
    assert engine.generated > 0 and engine.closed
    assert len(engine.syncs) == 2 and all(len(s) >= 2 for s in engine.syncs)  # 1 MiB buckets: several per sync
    (row,) = _rows(tmp_path / "run")
    assert float(row["weight_sync_s"]) > 0 and float(row["generation_s"]) > 0


def test_an_engine_left_awake_stops_the_optimisation(basins, tmp_path, monkeypatch):
    capture_standins(monkeypatch)
    monkeypatch.setattr(ColocatedGenerator, "sleep", lambda self: None)  # a trainer that forgets to release
    cfg = load_grpo_config(grpo_config(tmp_path, basins, "c", max_steps=1, env="{max_turns: 1}", **COLOCATED))
    with pytest.raises(ColocatedError, match="holds its memory while the trainer optimises"):
        train_grpo(cfg, tmp_path / "run")


@pytest.mark.slow
def test_colocated_standin_trains_exactly_what_local_trains(basins, caller, tmp_path, monkeypatch):
    """Same seeds, one-row batches (``generation_batch: 1``, so batching cannot change the rounding): the
    stand-in samples from an fp32 copy holding the synced weights, so every rollout, reward, loss part
    and the final weights equal the in-process generator's bit for bit."""
    from safetensors.torch import load_file

    made = capture_standins(monkeypatch)
    # the resume test's recipe (tests/test_grpo_train.py RESUME_RUN): both steps' groups earn different rewards
    common = {"model": caller, "group_size": 4, "max_new_tokens": 18, "temperature": 1.2, "lr": "1.0e-5", "seed": 1,
              "validation_basins": f"[{basins / 'v1'}]", "validate_every": 1}
    runs = {}
    for name, extra in (("local", {}), ("colocated", COLOCATED)):
        cfg = load_grpo_config(grpo_config(tmp_path, basins, name, **common, **extra))
        assert train_grpo(cfg, tmp_path / name)["steps"] == 2
        runs[name] = _rows(tmp_path / name)
    compared = ("reward_mean", "reward_std", "terminal_mean", "best_nse_mean", "trainable", "degenerate_groups",
                "adv_abs_max", "loss", "pg", "kl", "entropy", "grad_norm", "tokens", "logprob_mismatch_max",
                "val_reward_mean")
    for a, b in zip(runs["local"], runs["colocated"]):
        assert {k: a[k] for k in compared} == {k: b[k] for k in compared}
    assert all(float(r["adv_abs_max"]) > 0 for r in runs["local"])  # rewards differed in a group: a policy gradient
    # the engine's log-probs are the trainer's up to the rounding of cached against whole-sequence scoring
    assert all(float(r["logprob_mismatch_max"]) < 1e-4 for r in runs["colocated"])
    final = {n: load_file(tmp_path / n / "final" / "model.safetensors") for n in ("local", "colocated")}
    assert all(torch.equal(final["local"][k], final["colocated"][k]) for k in final["local"])
    (engine,) = made
    assert len(engine.syncs) == 3  # before step 1, after steps 1 and 2
