"""System and user prompts: basin facts, hemispheres, window, parameters, target, budget, length."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from hydroagent_hpc.env.prompts import (
    PRESETS,
    Budget,
    format_coordinates,
    format_timestep,
    render_messages,
    system_prompt,
    user_prompt,
)
from hydroagent_hpc.env.toolcalls import format_example, parse_message, tool_schemas
from hydroagent_hpc.params import PARAMS, TUNABLE
from hydroagent_hpc.types import Basin, ToolCall

CANONICAL = Basin(
    basin_id="02338660", name="New River at GA 100, near Corinth, GA", control="/secret/path/control.txt",
    area_km2=328.93, lat=33.2357, lon=-84.9876, timestep="1h", window_start="2018-07-01 00:00",
    window_end="2018-08-31 23:00", target_nse=0.8075, notes="climate: humid; terrain: piedmont")
SOUTH_EAST = Basin(
    basin_id="syn_sydney", name="Synthetic Parramatta twin", control="/x/control.txt", area_km2=3209.0,
    lat=-33.8688, lon=151.2093, timestep="15u", window_start="2019-03-30 00:00", window_end="2019-05-28 23:00",
    warmup_start="2019-03-01 00:00")

BUDGETS = [Budget(), Budget(protocol="rounds", wall_clock_s=7200.0, max_simulations=200),
           Budget(patience=None, stop_at_target=False, max_turns=50)]


def words(s: str) -> int:
    return len(s.split())


def test_coordinates_use_hemisphere_letters():
    assert format_coordinates(33.2357, -84.9876) == "33.24°N, 84.99°W"
    assert format_coordinates(-33.8688, 151.2093) == "33.87°S, 151.21°E"
    assert format_coordinates(0.0, 0.0) == "0.00°N, 0.00°E"


def test_timestep_words():
    assert format_timestep("1h") == "1 hour"
    assert format_timestep("15u") == "15 minutes"
    assert format_timestep("1d") == "1 day"
    assert format_timestep("weird") == "weird"


@pytest.mark.parametrize("preset", PRESETS)
def test_user_prompt_has_the_basin_facts(preset):
    u = user_prompt(CANONICAL, preset, Budget())
    for s in ("02338660", "New River at GA 100", "328.93 km²", "33.24°N, 84.99°W", "climate: humid",
              "2018-07-01 00:00", "2018-08-31 23:00", "1 hour", "0.8075", "50 tool calls", "5 evaluations"):
        assert s in u, s
    assert "-84.99" not in u and "°E" not in u
    assert "/secret/path" not in u and "control.txt" not in u
    assert "Warm-up: none" in u


@pytest.mark.parametrize("preset", PRESETS)
def test_southern_eastern_basin_and_warmup(preset):
    u = user_prompt(SOUTH_EAST, preset, Budget())
    assert "33.87°S, 151.21°E" in u and "°N" not in u and "°W" not in u
    assert "basin syn_sydney" in u and "3209 km²" in u and "15 minutes" in u
    assert "2019-03-01 00:00" in u and "not scored" in u
    assert "0.7" in u  # the basin's default target


@pytest.mark.parametrize("preset", PRESETS)
def test_every_tunable_parameter_with_bounds_and_fixed_ones(preset):
    u = user_prompt(CANONICAL, preset, Budget())
    for name in TUNABLE:
        p = PARAMS[name]
        assert re.search(rf"^- {name}: .*\[{re.escape(f'{p.lower:g}')}, {re.escape(f'{p.upper:g}')}\]", u, re.M), name
    assert "th: channel threshold on flow accumulation (cells); fixed at 10" in u
    assert "isu: initial interflow state (mm/s); fixed at 0" in u
    for preset_s in (system_prompt(preset, Budget()),):
        assert "th and isu are fixed" in preset_s


def test_budget_and_stop_rules_follow_the_budget():
    u = user_prompt(CANONICAL, "paper", Budget(protocol="rounds", wall_clock_s=7200, max_simulations=200,
                                               max_turns=None, target_nse=0.9))
    assert "20 rounds of up to 10 simulations" in u and "200 simulations" in u and "2 h" in u
    assert "0.9" in u and "0.8075" not in u and "5 rounds in a row" in u
    assert "tool calls" not in u
    r = user_prompt(CANONICAL, "released", Budget(patience=None, stop_at_target=False))
    assert "0.8075" in r and "in a row" not in r and "exceeds the target" not in r
    assert "The episode ends when the budget is used up" in r


def test_system_prompt_protocols():
    turns = system_prompt("paper", Budget())
    rounds = system_prompt("paper", Budget(protocol="rounds", candidates_per_round=8, max_rounds=12))
    assert "one candidate at a time" in turns
    assert "up to 8 candidate" in rounds and "12 rounds" in rounds and "closes the round" in rounds
    released = system_prompt("released", Budget())
    assert "diagnosis" in released and "one process at a time" in released
    assert "no metrics" in released
    assert "diagnostics" in turns and "running" not in released


@pytest.mark.parametrize("preset", PRESETS)
def test_system_prompt_example_is_the_rendered_call(preset):
    s = system_prompt(preset, Budget())
    assert format_example() in s
    m = parse_message(s)
    assert m.calls == [ToolCall("set_parameters", {"wm": 1.5, "alpha": 0.8})] and not m.failures
    for name in ("set_parameters", "run_simulation", "evaluate"):
        assert name in s


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("basin", [CANONICAL, SOUTH_EAST])
def test_word_limits(preset, budget, basin):
    assert words(system_prompt(preset, budget)) < 600
    assert words(user_prompt(basin, preset, budget)) < 400


def test_clip_wording_follows_the_budget():
    assert "clipped" in system_prompt("paper", Budget())
    assert "rejected" in system_prompt("paper", Budget(clip_out_of_bounds=False))


def test_render_messages():
    msgs = render_messages(CANONICAL, "paper", Budget())
    assert [m["role"] for m in msgs] == ["system", "user"]
    assert msgs[0]["content"] == system_prompt("paper", Budget())
    assert msgs[1]["content"] == user_prompt(CANONICAL, "paper", Budget())
    assert render_messages(CANONICAL, "paper", None) == msgs


def test_budget_coercion():
    assert Budget.coerce({"protocol": "rounds", "patience": None}) == Budget(protocol="rounds", patience=None)
    with pytest.raises(ValueError, match="unknown budget"):
        Budget.coerce({"max_turn": 50})
    cfg = SimpleNamespace(protocol="rounds", max_turns=50, max_rounds=20, candidates_per_round=10, target_nse=None,
                          stop_at_target=False, patience=None, wall_clock_s=None, max_simulations=None,
                          clip_out_of_bounds=True, observation="released", rewards=object())
    assert Budget.coerce(cfg) == Budget(protocol="rounds", stop_at_target=False, patience=None)
    with pytest.raises(ValueError):
        Budget(protocol="episodes")
    with pytest.raises(ValueError):
        Budget(max_rounds=0)


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown preset"):
        system_prompt("fancy", Budget())
    with pytest.raises(ValueError, match="unknown preset"):
        user_prompt(CANONICAL, "fancy", Budget())


def test_prompts_and_schemas_agree_on_parameter_descriptions():
    props = tool_schemas()[0]["function"]["parameters"]["properties"]
    u = user_prompt(CANONICAL, "paper", Budget())
    for name, prop in props.items():
        assert f"- {name}: {prop['description']}" in u
