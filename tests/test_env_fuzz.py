"""At least 10,000 generated assistant messages through CalibrationEnv.step.

No exception escapes; every call that is not a valid tool call is a recorded parse failure;
the parameters are always 13 finite floats within bounds, and only numbers reach a rendered
control file.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hydroagent_hpc.config import preset
from hydroagent_hpc.env.environment import CalibrationEnv
from hydroagent_hpc.params import PARAM_NAMES, PARAMS
from hydroagent_hpc.sim.basin import load_basin
from hydroagent_hpc.sim.controlfile import parse_control, render_control

MESSAGES_PER_EXAMPLE = 4
EXAMPLES = 2_600  # x 4 messages = 10,400 messages

names = st.sampled_from(["set_parameters", "run_simulation", "evaluate", "Set_Parameters", "shell", "", "evaluate "])
keys = st.one_of(st.sampled_from(list(PARAM_NAMES) + ["WM", "wm_grid", "th", "isu", "__proto__", ""]),
                 st.text(max_size=12))
weird_numbers = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                          st.integers(min_value=-10**30, max_value=10**30),
                          st.sampled_from([1e308, -1e308, 1e-320, 0.0, -0.0]))
values = st.one_of(weird_numbers, st.text(max_size=20), st.booleans(), st.none(),
                   st.sampled_from(["1.5", "2.0\n[Task evil]\nSTYLE=CALI", "nan", "1e400", "0x10"]),
                   st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


def _dump(obj) -> str:
    try:
        return json.dumps(obj)
    except (ValueError, TypeError):
        return "{}"


call_json = st.builds(lambda n, a: _dump({"name": n, "arguments": a}), names, st.dictionaries(keys, values, max_size=5))
block = st.one_of(
    call_json.map(lambda j: f"<tool_call>\n{j}\n</tool_call>"),
    call_json.map(lambda j: f"<tool_call>{j[: max(1, len(j) // 2)]}</tool_call>"),  # truncated JSON
    st.text(max_size=60).map(lambda t: f"<tool_call>{t}</tool_call>"),
    st.sampled_from(["<tool_call>", "</tool_call>", '{"name": "evaluate", "arguments": {}}', "",
                     '<tool_call>{"name": "run_simulation", "arguments": "{}"}</tool_call>',
                     '<tool_call>{"name": "set_parameters", "arguments": {"wm": NaN}}</tool_call>',
                     '<tool_call>{"name": "set_parameters", "arguments": {"wm": 1, "wm": 2}}</tool_call>',
                     '<tool_call>[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]</tool_call>']),
)
message = st.lists(st.one_of(block, st.text(max_size=40)), max_size=6).map("".join)


@pytest.fixture(scope="module")
def env_and_control(small_basin_dir, small_sim):
    basin = load_basin(small_basin_dir)
    # No simulation budget limit on the episode but a short turn cap keeps resets frequent.
    env = CalibrationEnv(basin, small_sim, preset("paper", max_turns=40, target_nse=0.999, patience=None,
                                                  wall_clock_s=None))
    return env, parse_control(small_basin_dir / "control.txt")


@pytest.mark.slow
def test_ten_thousand_messages(env_and_control):
    env, cf = env_and_control
    seen = {"messages": 0, "parse_failures": 0, "calls": 0}

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
    @given(st.lists(message, min_size=MESSAGES_PER_EXAMPLE, max_size=MESSAGES_PER_EXAMPLE))
    def run(msgs):
        for text in msgs:
            if env.done:
                env.reset()
            n_before = len(env.turns)
            result = env.step(text)
            seen["messages"] += 1
            new = env.turns[n_before:]
            assert len(result.observations) == len(new) >= 1
            for turn, obs in zip(new, result.observations):
                assert turn.observation is obs
                if turn.kind == "parse_failure":
                    seen["parse_failures"] += 1
                    assert obs["error"] == "parse_failure" and turn.reward == pytest.approx(-0.5) and turn.error
                else:
                    seen["calls"] += 1
                    assert turn.tool in ("set_parameters", "run_simulation", "evaluate")
            assert list(env.params) == list(PARAM_NAMES)
            for k, v in env.params.items():
                assert type(v) is float and math.isfinite(v) and PARAMS[k].lower <= v <= PARAMS[k].upper, (k, v)
            text_cf = render_control(cf, overrides=env.params)
            for line in text_cf.splitlines():
                key, _, val = line.partition("=")
                if key.lower() in PARAMS:
                    float(val)  # only numbers on parameter lines

    run()
    assert seen["messages"] >= 10_000
    assert seen["parse_failures"] > 1000 and seen["calls"] > 100, seen
