"""The per-step diagnostics of whether GRPO can move the policy (``grpo.learning_signal``)."""

from __future__ import annotations

import numpy as np
import pytest

from hydroagent_hpc.train.grpo.trainer import _Sequence, learning_signal


def test_token_sign_shares_count_only_trained_tokens_of_each_turn():
    # two turns: tokens 2-4 (advantage +1.5, 3 tokens) and 6-7 (-0.5, 2 tokens); a third sequence all 0
    a = _Sequence(list(range(10)), [0, 0, 1, 1, 1, 0, 1, 1, 0, 0], [(2, 5), (6, 8)], [], np.array([1.5, -0.5]))
    b = _Sequence(list(range(6)), [0, 1, 1, 1, 0, 0], [(1, 4)], [], np.array([0.0]))
    sig = learning_signal([a, b], np.array([1.5, -0.5, 0.0]), degenerate=1, groups=4)
    assert sig["tokens_adv_pos"] == pytest.approx(3 / 8)
    assert sig["tokens_adv_neg"] == pytest.approx(2 / 8)
    assert sig["tokens_adv_zero"] == pytest.approx(3 / 8)
    assert sig["degenerate_share"] == 0.25
    assert sig["adv_p50"] == 0.0 and sig["adv_p10"] < 0 < sig["adv_p90"]


def test_an_empty_step_reports_no_shares_rather_than_a_division_by_zero():
    sig = learning_signal([], np.zeros(0), degenerate=2, groups=2)
    assert sig["degenerate_share"] == 1.0
    assert all(np.isnan(sig[k]) for k in ("tokens_adv_pos", "tokens_adv_neg", "tokens_adv_zero", "adv_p50"))
