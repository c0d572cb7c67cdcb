"""Our SFT and GRPO losses against TRL 1.16's on the same batch (train/measure/trl_compare.py, bench/trl.py).

Real parts: the tiny offline Qwen3 and its tokenizer, conversations tokenised by our trajectory builder,
our SFT trainer (``train_sft`` on a real data file) and TRL's ``SFTTrainer.train()`` / ``GRPOTrainer``.
"""

from __future__ import annotations

import math
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from helpers.threads import one_torch_thread  # noqa: E402, F401  (autouse fixture)
from hydroagent_hpc.train.measure import trl_compare as tc  # noqa: E402
from hydroagent_hpc.train.tiny import build_tiny  # noqa: E402

RTOL = tc.RTOL




@pytest.fixture(scope="module")
def tiny():
    return build_tiny(seed=0)


@pytest.fixture(scope="module")
def items(tiny):
    return tc.unit_items(tc.calibration_trajectories(tiny[1], 4, seed=1))


@pytest.fixture(scope="module")
def trl_two_steps(tiny, items, tmp_path_factory):
    model, tok = tiny
    return tc.trl_sft_run(model, items, tok, tmp_path_factory.mktemp("trl"), steps=2)


def test_our_sft_trainer_and_trls_give_the_same_loss_and_grad_norm_step_by_step(items, trl_two_steps, tmp_path):
    data = tc.write_unit_data(tmp_path / "data.h5", items)
    ours = tc.our_sft_run(data, tmp_path, len(items), steps=2)
    assert len(ours["loss"]) == len(trl_two_steps["loss"]) == 2
    for key in ("loss", "grad_norm"):  # step 1: the same weights; step 2: after one AdamW step each
        for a, b, tol in zip(ours[key], trl_two_steps[key], (RTOL, tc.DRIFT_RTOL), strict=True):
            assert math.isclose(a, b, rel_tol=tol), (key, ours[key], trl_two_steps[key])
    assert ours["loss"][1] < ours["loss"][0]  # a step was taken, on both sides alike
    assert ours["tokens"] == trl_two_steps["tokens"]


def test_our_loss_function_matches_trl_and_a_changed_one_does_not(tiny, items, trl_two_steps):
    model, tok = tiny
    trl_loss, trl_norm = trl_two_steps["loss"][0], trl_two_steps["grad_norm"][0]
    loss, norm = tc.our_sft_step(model, items, int(tok.pad_token_id), "trainer")
    assert math.isclose(loss, trl_loss, rel_tol=RTOL) and math.isclose(norm, trl_norm, rel_tol=RTOL)
    for variant in ("per-sequence", "no-mask"):
        loss, norm = tc.our_sft_step(model, items, int(tok.pad_token_id), variant)
        assert not math.isclose(loss, trl_loss, rel_tol=RTOL), variant
        assert not math.isclose(norm, trl_norm, rel_tol=1e-3), variant


@pytest.mark.parametrize("aggregation", sorted(tc.GRPO_PAIRS))
def test_one_grpo_loss_on_a_fixed_multi_turn_batch_is_trls(tiny, aggregation, tmp_path):
    model, tok = tiny
    batch = tc.grpo_batch(model, tok, k=4)
    assert 0 < int(batch.tool_mask.sum()) < int(batch.completion_mask.sum())  # tool responses are masked
    ours = tc.our_grpo_loss(model, batch, aggregation)
    theirs = tc.trl_grpo_loss(model, tok, batch, tc.GRPO_PAIRS[aggregation], tmp_path)
    assert math.isclose(ours[0], theirs[0], rel_tol=RTOL, abs_tol=1e-7), (ours, theirs)
    assert math.isclose(ours[1], theirs[1], rel_tol=RTOL), (ours, theirs)
    other = next(a for a in tc.GRPO_PAIRS if a != aggregation)  # the other normalisation is not TRL's here
    changed = tc.our_grpo_loss(model, batch, other)
    assert not math.isclose(changed[1], theirs[1], rel_tol=1e-3)
