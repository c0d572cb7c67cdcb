"""Presets, strict config files, and the reward ledger's arithmetic."""

from __future__ import annotations

import math

import pytest

from hydroagent_hpc.config import PRESETS, ConfigError, RewardConfig, load_config, to_dict
from hydroagent_hpc.env.rewards import RewardLedger


def test_presets_differ_where_the_paper_and_the_code_differ():
    p, r = PRESETS["paper"], PRESETS["released"]
    assert p.rewards.per_turn and not r.rewards.per_turn
    assert p.rewards.delta_nse == "best" and r.rewards.delta_nse == "previous"
    assert p.stop_at_target and not r.stop_at_target and p.patience == 5 and r.patience is None
    assert p.observation == "paper" and r.observation == "released"
    assert to_dict(p)["rewards"]["delta_clip"] == [-1.0, 1.0]


def test_yaml_is_strict(tmp_path):
    good = tmp_path / "env.yaml"
    good.write_text("preset: released\nmax_turns: 30\nrewards:\n  parse_failure: -1.0\n")
    cfg = load_config(good)
    assert cfg.preset == "released" and cfg.max_turns == 30 and cfg.rewards.parse_failure == -1.0
    assert cfg.rewards.per_turn is False  # the rest of the preset is kept
    bad = tmp_path / "bad.yaml"
    bad.write_text("preset: paper\nmax_turns: 30\nrewards:\n  parse_failur: -1.0\n")
    with pytest.raises(ConfigError,
                       match=r"bad.yaml:4: rewards.parse_failur: unknown key; valid keys: .*parse_failure"):
        load_config(bad)
    bad.write_text("max_turns: fifty\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:1: max_turns: expected a whole number"):
        load_config(bad)
    bad.write_text("protocol: marathon\n")
    with pytest.raises(ConfigError, match="protocol='marathon'"):
        load_config(bad)
    bad.write_text("preset: paperr\n")
    with pytest.raises(ConfigError, match="unknown preset 'paperr'"):
        load_config(bad)


def test_ledger_paper_arithmetic():
    led = RewardLedger(RewardConfig(), target=0.7)
    assert led.set_parameters().reward == pytest.approx(0.02)
    assert led.simulation(True).reward == pytest.approx(0.05)
    assert led.parse_failure().reward == pytest.approx(-0.5)
    pay, imp = led.evaluation(-17.0)  # a catastrophic first run: clipped change from 0
    assert imp and pay.reward == pytest.approx(-1.0) and pay.terms["unpaid_delta_nse_previous"] == pytest.approx(-17.0)
    pay, imp = led.evaluation(0.5)
    assert imp and pay.reward == pytest.approx(1.5)
    pay, imp = led.evaluation(0.4)
    assert not imp and pay.reward == 0.0
    pay, imp = led.evaluation(0.75)
    assert imp and pay.reward == pytest.approx(0.25)
    t = led.terminal()
    assert t.terms == {"best_nse_clipped": pytest.approx(0.75), "target_bonus": 0.5, "eval_bonus": pytest.approx(0.08),
                       "improve_bonus": pytest.approx(0.2)}
    assert t.reward == pytest.approx(0.75 + 0.5 + 0.08 + 0.2)


def test_ledger_released_terminal_only_and_empty():
    led = RewardLedger(PRESETS["released"].rewards, target=0.7)
    assert led.terminal().reward == -1.0
    assert led.set_parameters().reward == 0.0 and led.parse_failure().reward == 0.0
    pay, _ = led.evaluation(0.3)
    assert pay.reward == 0.0 and pay.terms["unpaid_delta_nse_previous"] == pytest.approx(0.3)
    pay, _ = led.evaluation(math.nan)  # zero-variance observations: no improvement, still counted
    assert led.n_eval == 2 and led.best == 0.3
