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
    with pytest.raises(ConfigError, match=r"bad.yaml:1: protocol: 'marathon' is not one of turns, rounds"):
        load_config(bad)
    bad.write_text("preset: paperr\n")
    with pytest.raises(ConfigError, match="bad.yaml:1: preset: unknown preset 'paperr'"):
        load_config(bad)


def sets(n):
    """n distinct parameter sets."""
    return [{"wm": 1.0 + i / 8, "b": 1.0} for i in range(n)]


def test_ledger_paper_arithmetic():
    """The paper's constants as written (literal shaping: no novelty rule, no cap)."""
    led = RewardLedger(RewardConfig(shaping="literal"), target=0.7)
    p = sets(5)
    assert led.set_parameters(p[0], p[1]).reward == pytest.approx(0.02)
    assert led.simulation(True, p[1]).reward == pytest.approx(0.05)
    assert led.parse_failure().reward == pytest.approx(-0.5)
    pay, imp = led.evaluation(-17.0, p[1])  # a catastrophic first run: clipped change from 0
    assert imp and pay.reward == pytest.approx(-1.0) and pay.terms["unpaid_delta_nse_previous"] == pytest.approx(-17.0)
    pay, imp = led.evaluation(0.5, p[2])
    assert imp and pay.reward == pytest.approx(1.5)
    pay, imp = led.evaluation(0.4, p[3])
    assert not imp and pay.reward == 0.0
    pay, imp = led.evaluation(0.75, p[4])
    assert imp and pay.reward == pytest.approx(0.25)
    t = led.terminal()
    assert t.terms == {"best_nse_clipped": pytest.approx(0.75), "target_bonus": 0.5, "eval_bonus": pytest.approx(0.08),
                       "improve_bonus": pytest.approx(0.2)}
    assert t.reward == pytest.approx(0.75 + 0.5 + 0.08 + 0.2)


def test_ledger_released_terminal_only_and_empty():
    led = RewardLedger(PRESETS["released"].rewards, target=0.7)
    assert led.terminal().reward == -1.0
    p = sets(2)
    assert led.set_parameters(p[0], p[1]).reward == 0.0 and led.parse_failure().reward == 0.0
    pay, _ = led.evaluation(0.3, p[1])
    assert pay.reward == 0.0 and pay.terms["unpaid_delta_nse_previous"] == pytest.approx(0.3)
    pay, _ = led.evaluation(math.nan, p[1])  # zero-variance observations: no improvement, still counted
    assert led.n_eval == 2 and led.best == 0.3


def paid(pay):
    """The paid terms of a payment (keys without the unpaid_ prefix)."""
    return {k: v for k, v in pay.terms.items() if not k.startswith("unpaid_")}


def test_both_presets_default_to_safe_shaping():
    for name, cfg in PRESETS.items():
        assert cfg.rewards.shaping == "safe" and cfg.rewards.shaping_cap == 0.05, name  # issue 32's bound
        assert to_dict(cfg)["rewards"]["shaping"] == "safe"


UNPAID_SET = {"unpaid_set_parameters_ok": 0.02}


def test_safe_ledger_pays_novel_activity_once():
    """Novelty decides what counts at all: a call that is not novel is recorded unpaid and leaves the budget
    to the calls that are."""
    led = RewardLedger(RewardConfig(), target=0.7)
    p = sets(5)
    assert led.set_parameters(p[0], p[0]).terms == UNPAID_SET  # a no-op
    assert led.simulation(True, p[0]).reward == pytest.approx(0.05)  # the first run of a set
    assert led.simulation(True, p[0]).terms == {"unpaid_simulation_ok": 0.05}  # the same set again
    assert led.set_parameters(p[0], p[1]).reward == pytest.approx(0.02)  # the first change
    assert led.set_parameters(p[1], p[0]).terms == UNPAID_SET  # back to a set held before
    assert led.set_parameters(p[0], p[1]).terms == UNPAID_SET
    assert led.set_parameters(p[1], p[2]).terms == UNPAID_SET  # new, but no run since the paid one
    assert led.simulation(False, p[2]).terms == {"simulation_failed": 0.0}
    assert led.simulation(True, p[2]).terms == {"unpaid_simulation_ok": 0.05}  # p2 has run (and failed) before
    assert led.parse_failure().reward == pytest.approx(-0.5)  # penalties always
    pay = led.simulation(True, p[3])  # novel, but the per-turn part of the budget is spent: recorded as cut
    assert pay.reward == 0.0 and pay.terms == {"simulation_ok": 0.05, "shaping_cap": -0.05}
    assert led.shaping_paid == pytest.approx(0.07) == pytest.approx(led.turn_budget)
    led.evaluation(0.5, p[1])
    led.evaluation(0.5, p[1])  # a second fresh run of the same set, evaluated again
    assert led.n_eval == 2 and led.n_eval_paid == 1
    assert led.terminal().terms["eval_bonus"] == pytest.approx(0.02) and "shaping_cap" not in led.terminal().terms
    assert led.queued().reward == 0.0 and not led.set_paid_since_run  # a queued candidate counts as a run
    assert led.set_parameters(p[3], p[4]).terms == {"set_parameters_ok": 0.02, "shaping_cap": -0.02}


def ladder(led, n, start=0):
    """n set/run/evaluate cycles of new sets, each better than the last; the sum of what they paid per turn."""
    p = sets(start + n + 1)
    paid = 0.0
    for i in range(start, start + n):
        paid += led.set_parameters(p[i], p[i + 1]).reward + led.simulation(True, p[i + 1]).reward
        assert led.evaluation(0.1 + i / 100, p[i + 1])[1]
    return paid


def test_safe_ledger_budget():
    """B = b_min + epsilon over the four bonuses (b_min: what run, evaluate is paid), the first valid change
    and run paid per turn, the terminal evaluation and improvement bonuses paid from the rest."""
    paper, released = PRESETS["paper"].rewards, PRESETS["released"].rewards
    led = RewardLedger(paper, target=0.7)
    assert led.budget == pytest.approx(0.05 + 0.02 + 0.05) and led.turn_budget == pytest.approx(0.05 + 0.02)
    assert ladder(led, 6) == pytest.approx(0.07)  # the first cycle's set and run
    t = led.terminal()
    assert t.terms["eval_bonus"] == pytest.approx(0.12) and t.terms["improve_bonus"] == pytest.approx(0.5)
    assert t.terms["shaping_cap"] == pytest.approx(0.05 - 0.62)  # epsilon is left to evaluations and improvements
    assert t.reward == pytest.approx(sum(t.terms.values())) and led.terminal() == t  # pure
    # the direct route is paid in full: set, run, evaluate
    one = RewardLedger(paper, target=0.7)
    assert ladder(one, 1) == pytest.approx(0.07) and "shaping_cap" not in one.terminal().terms
    assert one.terminal().terms["eval_bonus"] == pytest.approx(0.02)
    # released pays no per-turn term: the budget is the first evaluation's bonus and epsilon
    rel = RewardLedger(released, target=0.7)
    assert rel.budget == pytest.approx(0.02 + 0.05) and ladder(rel, 7) == 0.0
    assert rel.terminal().terms["shaping_cap"] == pytest.approx(0.07 - (7 * 0.02 + 6 * 0.1))
    # the rounds protocol pays no run bonus, so its shortest episode is paid none and its budget counts none
    rounds = RewardLedger(paper, target=0.7, protocol="rounds")
    assert rounds.budget == pytest.approx(0.02 + 0.05) and rounds.turn_budget == pytest.approx(0.02)
    # epsilon 0: only what run, evaluate is paid (a set_parameters can be skipped: the per-turn part is one run)
    tight = RewardLedger(RewardConfig(shaping_cap=0.0), target=0.7)
    assert ladder(tight, 3) == pytest.approx(0.05) and tight.terminal().terms["shaping_cap"] == pytest.approx(
        0.02 - (3 * 0.02 + 2 * 0.1))
    # a negative constant is a cost, paid in full outside the budget
    cost = RewardLedger(RewardConfig(set_parameters_ok=-0.01, improve_bonus=-0.05), target=0.7)
    assert ladder(cost, 3) == pytest.approx(-0.01 + 0.05 - 0.01 - 0.01)
    assert cost.terminal().terms["improve_bonus"] == pytest.approx(-0.1) and "shaping_cap" not in cost.terminal().terms
    # literal shaping has no budget
    lit = RewardLedger(RewardConfig(shaping="literal", shaping_cap=0.1), target=0.7)
    assert lit.budget == math.inf and sum(lit.simulation(True, sets(1)[0]).reward for _ in range(5)) == pytest.approx(
        0.25)
    assert ladder(lit, 4, start=1) == pytest.approx(4 * 0.07)


def test_reward_config_refuses_bad_shaping(tmp_path):
    with pytest.raises(ConfigError, match=r"rewards.shaping: 'lax' is not one of safe, literal") as err:
        RewardConfig(shaping="lax")
    assert "use safe (the default) or literal" in str(err.value)
    with pytest.raises(ConfigError, match=r"rewards.shaping_cap: must be at least 0, got -0.1"):
        RewardConfig(shaping_cap=-0.1)
    with pytest.raises(ConfigError, match=r"rewards.simulation_failed: 0.1 pays for failing.*shaping: literal"):
        RewardConfig(simulation_failed=0.1)
    assert RewardConfig(simulation_failed=0.1, shaping="literal").simulation_failed == 0.1  # an ablation may
    for name in ("set_parameters_ok", "shaping_cap", "eval_bonus"):
        with pytest.raises(ConfigError, match=rf"rewards.{name}: expected a finite number, got nan"):
            RewardConfig(**{name: math.nan})
    with pytest.raises(ConfigError, match=r"rewards.delta_clip\[0\]: expected a finite number, got -inf"):
        RewardConfig(delta_clip=(-math.inf, 1.0))
    f = tmp_path / "env.yaml"
    f.write_text("preset: released\nrewards:\n  shaping: literal\n  shaping_cap: 0.5\n")
    cfg = load_config(f)
    assert cfg.rewards.shaping == "literal" and cfg.rewards.shaping_cap == 0.5 and cfg.rewards.per_turn is False
    f.write_text("preset: paper\nrewards:\n  shaping: sloppy\n")
    with pytest.raises(ConfigError, match=r"env.yaml:3: rewards.shaping: 'sloppy' is not one of safe, literal"):
        load_config(f)
