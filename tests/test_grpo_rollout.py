"""The GRPO rollout engine: batched sampler, generation server, simulation slots, shared runs,
and whole rollouts of the tiny offline Qwen3 through real environments and the real simulator."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from hydroagent_hpc.agents.llm.hf_local import HFLocalPolicy
from hydroagent_hpc.config import preset
from hydroagent_hpc.env.environment import CalibrationEnv
from hydroagent_hpc.errors import HydroAgentError
from hydroagent_hpc.sim import open_simulator
from hydroagent_hpc.sim.basin import load_basin
from hydroagent_hpc.sim.synth.basins import synthesize_basin
from hydroagent_hpc.train.generation.rollout import (
    RolloutPolicy,
    RolloutSimulator,
    RolloutSpec,
    SharedRuns,
    SimulationSlots,
    assistant_spans,
    run_rollouts,
)
from hydroagent_hpc.train.generation.sampler import BatchedSampler, GenerationServer, Sampling, _filter
from hydroagent_hpc.train.tiny import build_tiny


@pytest.fixture(scope="module")
def tiny():
    return build_tiny(seed=0)


@pytest.fixture(scope="module")
def ids_of(tiny):
    model, tok = tiny
    probe = HFLocalPolicy(model, tok)
    return probe.stop_ids, probe.pad_id


@pytest.fixture(scope="module")
def basin_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("grpo") / "syn_r"
    synthesize_basin(d, name="syn_r", area_km2=80.0, window_days=6, warmup_days=2, seed=3, start="2021-07-01")
    return d


def _prompt(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


# ----------------------------------------------------------------------------------------- sampler


def test_top_p_keeps_the_smallest_set_reaching_p_and_renormalises():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    out = _filter(torch.log(probs), Sampling(temperature=1.0, top_p=0.8))
    # mass above each id: 0, 0.5, 0.8, 0.95 -> ids with mass-above < 0.8 are kept: the first two
    assert torch.allclose(out, torch.tensor([[0.625, 0.375, 0.0, 0.0]]), atol=1e-6)
    top1 = _filter(torch.log(probs), Sampling(temperature=1.0, top_p=0.3))
    assert torch.equal(top1 > 0, torch.tensor([[True, False, False, False]]))
    k2 = _filter(torch.log(probs), Sampling(temperature=1.0, top_p=1.0, top_k=2))
    assert torch.allclose(k2, torch.tensor([[0.625, 0.375, 0.0, 0.0]]), atol=1e-6)


def test_a_rows_sample_does_not_depend_on_its_batch_and_logprobs_match_the_model(tiny, ids_of):
    model, tok = tiny
    stop, pad = ids_of
    sampler = BatchedSampler(model, stop, pad, Sampling(max_new_tokens=20))
    a = _prompt(tok, "<|im_start|>user\nCalibrate the CREST model.<|im_end|>\n<|im_start|>assistant\n")
    b = _prompt(tok, "<|im_start|>user\nThe simulated peaks are too low.<|im_end|>\n<|im_start|>assistant\n")
    alone = sampler.sample([a], [11])[0]
    together = sampler.sample([b, a, b], [5, 11, 6])
    assert together[1].ids == alone.ids
    assert together[0].ids != together[2].ids or together[0].ids == []  # different seeds, different draws
    # each sampled token's log-prob is the model's own, as the trainer recomputes it
    seq = torch.tensor([a + alone.ids])
    with torch.no_grad():
        lp = torch.log_softmax(model(seq).logits.float(), -1)[0, :-1].gather(-1, seq[0, 1:, None])[:, 0]
    assert np.allclose(lp[len(a) - 1:].numpy(), alone.logprobs, atol=1e-5)


def test_rows_stop_at_their_first_stop_id_and_keep_it(tiny, ids_of):
    model, tok = tiny
    stop, pad = ids_of
    # seeds chosen so that two rows stop mid-batch (after 24 and 29 tokens) and two run to the cap: each row
    # draws its own stream, so 40 new tokens show both cases in a fifth of the time 200 tokens took
    sampler = BatchedSampler(model, stop, pad, Sampling(max_new_tokens=40))
    out = sampler.sample([_prompt(tok, "hello")] * 4, [12, 1, 43, 2])
    for s in out:
        assert len(s.ids) == len(s.logprobs)
        hits = [i for i, t in enumerate(s.ids) if t in stop]
        assert hits == [] and len(s.ids) == 40 or hits == [len(s.ids) - 1]
    lengths = [len(s.ids) for s in out]
    assert min(lengths) < 40 and max(lengths) == 40, lengths  # both a stopped row and a row that ran to the cap


def test_the_server_batches_waiting_requests_and_answers_each(tiny, ids_of):
    model, tok = tiny
    stop, pad = ids_of
    sampler = BatchedSampler(model, stop, pad, Sampling(max_new_tokens=8))
    prompt = _prompt(tok, "Calibrate")
    expected = sampler.sample([prompt] * 6, list(range(6)))
    results: dict[int, list[int]] = {}
    with GenerationServer(sampler, linger_s=0.2) as server:
        threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, server.generate(prompt, i).ids))
                   for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert [results[i] for i in range(6)] == [e.ids for e in expected]
    assert server.stats["rows"] == 6 and server.stats["batches"] < 6


def test_a_failing_batch_fails_every_waiting_request_instead_of_hanging(tiny, ids_of):
    model, _ = tiny
    stop, pad = ids_of
    with GenerationServer(BatchedSampler(model, stop, pad, Sampling(max_new_tokens=4))) as server:
        with pytest.raises(ValueError, match="empty prompt"):
            server.generate([], 0)


# --------------------------------------------------------------------------- simulations


def test_slots_bound_simulations_in_flight_and_shared_runs_simulate_once(basin_dir):
    inner = open_simulator(basin_dir / "control.txt")
    slots = SimulationSlots(2)
    shared = SharedRuns()
    seen: list[int] = []
    lock = threading.Lock()

    class Spy:  # the real simulator, recording how many runs overlap
        base_params = inner.base_params
        active = 0

        def run(self, params=None):
            with lock:
                Spy.active += 1
                seen.append(Spy.active)
            try:
                return inner.run(params)
            finally:
                with lock:
                    Spy.active -= 1

        def run_batch(self, sets):
            return [self.run(p) for p in sets]

    sim = RolloutSimulator(Spy(), slots, shared, "b")
    params = [{"wm": 0.5 + 0.1 * (i % 4)} for i in range(12)]  # 4 distinct sets, each asked 3 times
    out: dict[int, object] = {}
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, sim.run(params[i]))) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max(seen) <= 2 and slots.peak <= 2 and slots.in_flight == 0
    assert slots.runs == 4 and shared.misses == 4 and shared.hits == 8
    for i in range(12):
        assert out[i] is out[i % 4]  # the same result object is shared


def test_a_failing_simulation_reaches_every_rollout_that_asked_for_it():
    shared = SharedRuns()
    calls = []

    def boom():
        calls.append(1)
        raise HydroAgentError("simulator crashed", "x")

    for _ in range(3):
        with pytest.raises(HydroAgentError, match="crashed"):
            shared.get_or_run(("b", ()), boom)
    assert len(calls) == 1


def test_assistant_spans_are_the_runs_of_ones():
    assert assistant_spans([0, 1, 1, 0, 0, 1, 0, 1]) == [(1, 3), (5, 6), (7, 8)]
    assert assistant_spans([0, 0]) == []


# --------------------------------------------------------------------------- whole rollouts


def _rollouts(tiny, ids_of, basin_dir, specs, *, sims=None, policy_factory=None, env=None, max_new=24):
    model, tok = tiny
    stop, pad = ids_of
    sampling = Sampling(max_new_tokens=max_new)
    basin = load_basin(basin_dir)
    cfg = env or preset("paper", max_turns=3)
    sims = sims or {str(basin_dir): open_simulator(basin_dir / "control.txt")}
    with GenerationServer(BatchedSampler(model, stop, pad, sampling)) as server:
        return run_rollouts(
            specs, env_factory=lambda s, sim: CalibrationEnv(basin, sim, cfg, agent="grpo", seed=s.seed,
                                                             episode_id=s.episode_id),
            simulators=sims, slots=SimulationSlots(4), shared=SharedRuns(),
            policy_factory=policy_factory or (lambda s: RolloutPolicy(model, tok, server, sampling, seed=s.seed,
                                                                      max_context_tokens=8192)))


def test_rollouts_are_token_exact_and_rewards_come_from_the_ledger(tiny, ids_of, basin_dir):
    specs = [RolloutSpec(g, k, str(basin_dir), 100 * g + k, f"e{g}{k}") for g in range(2) for k in range(2)]
    out = _rollouts(tiny, ids_of, basin_dir, specs)
    _, tok = tiny
    assert [r.spec for r in out] == specs
    for r in out:
        assert r.error is None and r.trainable and r.episode is not None
        assert len(r.ids) == len(r.mask)
        sampled = [i for i, m in zip(r.ids, r.mask) if m]
        assert len(sampled) == len(r.sample_logprobs)
        # every sampled span decodes to the assistant message the environment received
        texts = [t.text for t in r.episode.turns if t.text] or []
        assert len(r.spans) == len({t.message_index for t in r.episode.turns})
        for (a, b), text in zip(r.spans, texts):
            decoded = tok.decode(r.ids[a:b], skip_special_tokens=False)
            assert decoded.removesuffix("<|im_end|>") == text
        # rewards: per message, exactly the ledger's payments; the total is the episode's
        assert sum(r.turn_rewards) + r.terminal == pytest.approx(r.episode.total_reward)
        assert r.terminal == pytest.approx(r.episode.terminal_reward)


def test_a_rollout_that_fails_outside_the_loop_is_recorded_and_the_batch_goes_on(tiny, ids_of, basin_dir):
    model, tok = tiny
    stop, pad = ids_of
    sampling = Sampling(max_new_tokens=16)
    specs = [RolloutSpec(0, k, str(basin_dir), k, f"f{k}") for k in range(2)]
    basin = load_basin(basin_dir)
    with GenerationServer(BatchedSampler(model, stop, pad, sampling)) as server:
        def factory(spec):
            if spec.member == 1:
                raise RuntimeError("no policy for you")
            return RolloutPolicy(model, tok, server, sampling, seed=spec.seed, max_context_tokens=8192)

        out = run_rollouts(specs, env_factory=lambda s, sim: CalibrationEnv(basin, sim, preset("paper", max_turns=2),
                                                                           seed=s.seed, episode_id=s.episode_id),
                           simulators={str(basin_dir): open_simulator(basin_dir / "control.txt")},
                           policy_factory=factory, slots=SimulationSlots(2))
    assert out[0].error is None and out[0].trainable
    assert out[1].episode is None and not out[1].trainable and "no policy for you" in (out[1].error or "")


def test_the_lockstep_gate_holds_every_turn_until_all_live_rollouts_finished_the_last():
    from hydroagent_hpc.train.generation.rollout import TurnGate

    gate = TurnGate(4)
    events: list[tuple[str, int, int]] = []
    lock = threading.Lock()
    rng = np.random.default_rng(0)
    delays = rng.uniform(0, 0.01, size=(4, 5))
    turns = [5, 2, 5, 3]  # two rollouts end early and leave the gate

    def rollout(i: int) -> None:
        try:
            for t in range(turns[i]):
                if t:
                    gate.arrive_and_wait()
                with lock:
                    events.append(("start", i, t))
                threading.Event().wait(delays[i, t])
                with lock:
                    events.append(("end", i, t))
        finally:
            gate.leave()

    threads = [threading.Thread(target=rollout, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=10)
    assert not any(th.is_alive() for th in threads)
    pos = {e: n for n, e in enumerate(events)}
    for t in range(1, 5):
        starts = [pos[("start", i, t)] for i in range(4) if turns[i] > t]
        ends = [pos[("end", i, t - 1)] for i in range(4) if turns[i] > t - 1]
        assert max(ends) < min(starts)


def test_the_prefix_cache_samples_what_a_full_prefill_samples(tiny, ids_of):
    model, tok = tiny
    stop, pad = ids_of
    sampling = Sampling(max_new_tokens=12)
    cached = BatchedSampler(model, stop, pad, sampling, prefix_cache=True)
    plain = BatchedSampler(model, stop, pad, sampling)
    seqs = [_prompt(tok, "<|im_start|>user\nCalibrate the CREST model.<|im_end|>\n<|im_start|>assistant\n"),
            _prompt(tok, "<|im_start|>user\nBaseflow is too small.<|im_end|>\n<|im_start|>assistant\n")]
    tool = _prompt(tok, "<|im_end|>\n<|im_start|>user\n<tool_response>\n{\"status\":\"ok\"}\n</tool_response>"
                        "<|im_end|>\n<|im_start|>assistant\n")
    for turn in range(3):  # three turns of two rollouts; the cached rows feed only their new ids
        a = cached.sample(seqs, [10 + turn, 20 + turn], keys=["r0", "r1"])
        b = plain.sample(seqs, [10 + turn, 20 + turn])
        for x, y in zip(a, b):
            assert x.ids == y.ids
            assert np.allclose(x.logprobs, y.logprobs, atol=1e-5)
        seqs = [s + x.ids + tool for s, x in zip(seqs, a)]
    assert cached.stats["prefix_hits"] == 4 and cached.stats["prefix_tokens"] > 0
    # a sequence that does not extend its cached prefix is prefilled in full, not mixed up
    other = cached.sample([seqs[1][:5]], [1], keys=["r0"])[0]
    assert other.ids == plain.sample([seqs[1][:5]], [1])[0].ids and cached.stats["prefix_misses"] == 1


def test_forced_rows_emit_their_ids_with_the_models_logprobs_beside_sampled_rows(tiny, ids_of):
    model, tok = tiny
    stop, pad = ids_of
    sampler = BatchedSampler(model, stop, pad, Sampling(max_new_tokens=30))
    prompt = _prompt(tok, "<|im_start|>user\nCalibrate.<|im_end|>\n<|im_start|>assistant\n")
    call = _prompt(tok, '<tool_call>\n{"name": "evaluate", "arguments": {}}\n</tool_call><|im_end|>')
    forced, free = sampler.sample([prompt, prompt], [1, 2], forced=[call, None])
    end = next(i for i, t in enumerate(call) if t in stop)  # </tool_call> stops the turn, as in sampling
    assert forced.ids == call[:end + 1] and end < len(call) - 1
    call = forced.ids
    assert free.ids == sampler.sample([prompt], [2])[0].ids  # the free row is unaffected
    seq = torch.tensor([prompt + call])
    with torch.no_grad():
        lp = torch.log_softmax(model(seq).logits.float(), -1)[0, :-1].gather(-1, seq[0, 1:, None])[:, 0]
    assert np.allclose(lp[len(prompt) - 1:].numpy(), forced.logprobs, atol=1e-5)
