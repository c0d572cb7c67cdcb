"""The GRPO step benchmark: the estimate's arithmetic by hand, the parts measured on the CPU, the command line.

The GPU figure itself (``python -m hydroagent_hpc.bench.train --gpu --grpo``) needs a CUDA device; here the
same code runs the tiny model on the CPU, and the estimate is checked against numbers worked out by hand.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from hydroagent_hpc.train.measure.grpo_throughput import EpisodeShape, GRPOStepParts, estimate_step

ROOT = Path(__file__).resolve().parents[1]


def _parts(**over) -> GRPOStepParts:
    base = dict(device="cpu", dtype="float32", params=1, prefill_tps=1000.0, decode_batch=2, decode_ctx=(100, 300),
                decode_s=(0.01, 0.03), train_seq_len=400, train_s_per_token=1e-3, peak_memory_mb=1.0,
                matmul_params=1000, layers=2, attn_width=10)
    return GRPOStepParts(**{**base, **over})


def test_the_estimate_adds_the_parts_as_the_formula_says():
    """2 episodes x 3 turns (prompt 100, turn 10, tool 90): contexts 100, 200, 300, so decode = 10 x (0.01 +
    0.02 + 0.03) s; prefill = 2 x (100 + 3 x 90) tokens at 1,000/s; train = 2 x 400 tokens x 1 ms (measured at
    400 tokens); simulation = 2 x 5 runs x 0.5 s on 2 slots, of which what outlasts generation adds."""
    shape = EpisodeShape(episodes=2, prompt=100, turn=10, tool=90, turns=3, sims_per_episode=5)
    assert shape.tokens == 400
    one = estimate_step(_parts(), shape, sim_s_per_run=0.5, sim_slots=2)
    assert one["decode_s"] == pytest.approx(0.6)
    assert one["prefill_s"] == pytest.approx(0.74)
    assert one["generate_s"] == pytest.approx(1.34)
    assert one["train_s"] == pytest.approx(0.8)
    assert one["simulate_s"] == pytest.approx(2.5)
    assert one["step_s"] == pytest.approx(1.34 + 0.8 + (2.5 - 1.34))
    two = estimate_step(_parts(), shape, gpus=2, engines=2, sim_s_per_run=0.5, sim_slots=2)
    assert two["prefill_s"] == pytest.approx(0.37) and two["decode_s"] == pytest.approx(0.6)  # decode: per engine
    assert two["train_s"] == pytest.approx(0.4)
    assert two["step_s"] == pytest.approx(0.97 + 0.4 + (2.5 - 0.97))
    fast_sims = estimate_step(_parts(), shape, sim_s_per_run=0.01, sim_slots=2)
    assert fast_sims["step_s"] == pytest.approx(1.34 + 0.8)  # hidden behind generation


def test_training_cost_scales_with_the_attention_term_beyond_the_measured_length():
    """flops_per_token = 6 N + 12 L width S: with N = 1,000, L = 2, width 10, 30,000 FLOPs at 100 tokens and
    54,000 at 200, so a token of a 200-token episode costs 1.8 times the one measured at 100."""
    p = _parts(train_seq_len=100)
    assert p.train_at(100) == pytest.approx(1e-3)
    assert p.train_at(200) == pytest.approx(1.8e-3)
    assert p.decode_at(200) == pytest.approx(0.02) and p.decode_at(500) == pytest.approx(0.05)
    noisy = _parts(decode_s=(0.02, 0.01))  # the longer context timed faster: taken as flat, not falling to 0
    assert noisy.decode_at(100) == noisy.decode_at(10_000) == pytest.approx(0.02)
    assert noisy.decode_at(50) == pytest.approx(0.02)


@pytest.mark.parametrize("field", ["episodes", "prompt", "turn", "tool", "turns"])
def test_an_episode_shape_below_one_token_names_its_field(field):
    with pytest.raises(ValueError, match=f"EpisodeShape.{field}=0"):
        EpisodeShape(**{field: 0})
    with pytest.raises(ValueError, match="sims_per_episode=-1"):
        EpisodeShape(sims_per_episode=-1)
    with pytest.raises(ValueError, match="at least 1"):
        estimate_step(_parts(), EpisodeShape(), gpus=0)


def _bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hydroagent_hpc.bench.train", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"})


@pytest.mark.slow
def test_the_grpo_benchmark_measures_the_tiny_model_on_the_cpu():
    """The real code paths (prefill, the rollout sampler's decode, a GRPO optimizer step with a reference
    model) on the tiny model: every part is a positive, finite measurement, the estimate is printed for the
    three layouts, and the Markdown says that a CPU run is not the GPU figure."""
    from hydroagent_hpc.bench.train import GRPO_LAYOUTS, grpo_markdown

    p = _bench("--grpo", "--json", "--turns", "4", "--sims-per-episode", "2")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    parts = r["parts"]
    assert parts["device"] == "cpu" and parts["params"] > 0
    for value in (parts["prefill_tps"], *parts["decode_s"], parts["train_s_per_token"]):
        assert math.isfinite(value) and value > 0
    assert r["shape"]["turns"] == 4 and r["shape"]["tokens"] == 1500 + 4 * 400
    assert [(e["gpus"], e["engines"]) for e in r["estimates"]] == list(GRPO_LAYOUTS)
    one, four = r["estimates"][0], r["estimates"][1]
    assert four["train_s"] == pytest.approx(one["train_s"] / 4)
    assert one["step_s"] >= one["generate_s"] + one["train_s"] - 1e-9
    md = grpo_markdown(r)
    assert "not a GPU figure" in md and "| 4 | 4 |" in md


def test_the_grpo_benchmark_refuses_clearly():
    from hydroagent_hpc.train.measure.throughput import cuda_device_count

    bad = _bench("--grpo", "--turns", "0")
    assert bad.returncode == 2 and "EpisodeShape.turns=0" in bad.stderr and "--turns" in bad.stderr
    if cuda_device_count():
        pytest.skip("this machine has CUDA: the refusal without one cannot be observed here")
    p = _bench("--gpu", "--grpo")
    assert p.returncode == 2 and "needs a CUDA device" in p.stderr and p.stdout == ""
