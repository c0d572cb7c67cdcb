"""Snow-17 parameters are calibratable only on a basin whose task runs Snow-17.

The environment derives the basin's parameter set from the simulator; validation, prompts, tool
schemas, the heuristic agent and the optimizers take it from there. A snow-free basin sees
exactly the paper's 13 multipliers (11 tunable).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from hydroagent_hpc.agents.heuristic import HeuristicHydrologist
from hydroagent_hpc.agents.optimizers.policy import make_optimizer_policy
from hydroagent_hpc.agents.optimizers.space import ParameterSpace
from hydroagent_hpc.config import preset
from hydroagent_hpc.env.environment import CalibrationEnv
from hydroagent_hpc.env.episode import run_episode
from hydroagent_hpc.env.prompts import system_prompt, user_prompt
from hydroagent_hpc.env.toolcalls import tool_schemas, validate_arguments
from hydroagent_hpc.params import CREST_SET, SNOW17_SET, SNOW_NAMES, SNOW_PARAMS, TUNABLE, parameter_set_of
from hydroagent_hpc.sim.basin import load_basin
from hydroagent_hpc.sim.embedded import EmbeddedSimulator
from hydroagent_hpc.sim.synth.snow import SnowCase, make_snow_case
from hydroagent_hpc.types import ToolCall


@pytest.fixture(scope="module")
def snow_dir(tmp_path_factory):
    control = make_snow_case(tmp_path_factory.mktemp("snowcal") / "snow_cal",
                             SnowCase("snow_cal", seed=21, window_days=8, warmup_days=2))
    return control.parent


@pytest.fixture(scope="module")
def snow_sim(snow_dir):
    return EmbeddedSimulator(snow_dir / "control.txt", cache_dir=False)


def env_of(folder, sim, **over):
    over.setdefault("target_nse", 0.999)
    over.setdefault("patience", None)
    return CalibrationEnv(load_basin(folder), sim, preset("paper", **over), agent="test")


def test_parameter_set_follows_the_simulator(snow_sim, small_sim):
    assert snow_sim.has_snow and parameter_set_of(snow_sim) is SNOW17_SET
    assert not small_sim.has_snow and parameter_set_of(small_sim) is CREST_SET
    assert CREST_SET.tunable == TUNABLE and len(CREST_SET.names) == 13
    assert SNOW17_SET.tunable == TUNABLE + SNOW_NAMES and len(SNOW17_SET.tunable) == 19
    assert SNOW17_SET.fixed == CREST_SET.fixed == ("th", "isu")


def test_snow_basin_sets_and_simulates_snow_parameters(snow_dir, snow_sim):
    env = env_of(snow_dir, snow_sim)
    assert env.parameters.snow
    assert {k: env.params[k] for k in SNOW_NAMES} == pytest.approx(snow_sim.base_snow_params)
    obs = env.set_parameters(scf=1.4, mfmax=1.8, mbase=-0.5, wm=2.0)
    assert obs["status"] == "ok"
    shown = obs["params"]
    assert shown["scf"] == 1.4 and shown["mfmax"] == 1.8 and shown["mbase"] == -0.5 and shown["wm"] == 2.0
    assert set(shown) == set(SNOW17_SET.names)
    run = env.run_simulation()
    assert run["status"] == "ok"
    got = env.sims[-1].discharge
    want = snow_sim.run({"scf": 1.4, "mfmax": 1.8, "mbase": -0.5, "wm": 2.0}).discharge
    default = snow_sim.run({"wm": 2.0}).discharge
    np.testing.assert_allclose(got, np.asarray(want, dtype=np.float32), rtol=1e-6)
    assert float(np.max(np.abs(np.asarray(want) - np.asarray(default)))) > 1e-3  # the snow values mattered
    ev = env.evaluate()
    assert ev["status"] == "ok" and math.isfinite(ev["NSE"])


def test_snow_basin_refuses_bad_snow_values(snow_dir, snow_sim):
    env = env_of(snow_dir, snow_sim, clip_out_of_bounds=False)
    obs = env.set_parameters(scf=3.0)
    assert obs["status"] == "error" and obs["reason"] == "out_of_bounds"
    assert "scf=3 is outside its bounds [0.7, 1.6]" in obs["detail"]
    obs = env.set_parameters(tipm=float("nan"))
    assert obs["reason"] == "not_finite" and "tipm must be finite; use a value within [0.01, 1]" in obs["detail"]
    obs = env.set_parameters(snowfactor=1.0)
    assert obs["reason"] == "unknown_parameter" and "scf [0.7, 1.6]" in obs["detail"]
    assert env.params["scf"] == pytest.approx(snow_sim.base_snow_params["scf"])  # nothing applied
    clipped = env_of(snow_dir, snow_sim).set_parameters(scf=3.0)
    assert clipped["status"] == "ok" and clipped["clipped"] == {"scf": {"asked": 3.0, "used": 1.6}}


def test_snow_free_basin_refuses_snow_parameters(small_basin_dir, small_sim):
    env = env_of(small_basin_dir, small_sim)
    assert not env.parameters.snow and set(env.params) == set(CREST_SET.names)
    obs = env.set_parameters(scf=1.2, wm=2.0)
    assert obs["status"] == "error" and obs["reason"] == "unknown_parameter"
    assert "\"scf\" is a Snow-17 parameter, but this basin has no snow model" in obs["detail"]
    assert "SNOW=SNOW17" in obs["detail"] and "Nothing was changed" in obs["detail"]
    assert env.params["wm"] == small_sim.base_params["wm"]
    v = validate_arguments(ToolCall("set_parameters", {"mfmax": 1.0}), {})
    assert not v.ok and "Snow-17" in v.detail and "mfmax" not in v.params
    with pytest.raises(ValueError, match="uadj is a Snow-17 parameter, but this basin has no snow model"):
        CREST_SET.check({"uadj": 0.05})
    with pytest.raises(ValueError, match=r"mbase=2 is outside its bounds \[-1, 1\]"):
        SNOW17_SET.check({"mbase": 2})
    assert SNOW17_SET.check({"mbase": -1, "scf": 1.1}) == {"mbase": -1.0, "scf": 1.1}


def test_prompts_and_schemas_list_snow_parameters_only_for_a_snow_basin(snow_dir, snow_sim, small_basin_dir,
                                                                        small_sim):
    snowy = env_of(snow_dir, snow_sim)
    plain = env_of(small_basin_dir, small_sim)
    s_sys, s_user = (m["content"] for m in snowy.messages)
    p_sys, p_user = (m["content"] for m in plain.messages)
    assert "Snow-17" in s_sys and "scf" in s_sys
    assert "Snow-17 parameters" in s_user
    for n in SNOW_NAMES:
        assert f"- {n}: {SNOW_PARAMS[n].meaning}" in s_user
    assert "Snow-17" not in p_sys + p_user and not any(f"- {n}:" in p_user for n in SNOW_NAMES)
    # a snow-free basin's prompt is what the module constant gave before
    assert p_sys == system_prompt("paper", plain._budget())
    assert p_user == user_prompt(plain.basin, "paper", plain._budget())
    props = tool_schemas()[0]["function"]["parameters"]["properties"]
    snow_props = tool_schemas(parameters=SNOW17_SET)[0]["function"]["parameters"]["properties"]
    assert tuple(props) == TUNABLE and tuple(snow_props) == TUNABLE + SNOW_NAMES
    assert "Snow-17" in tool_schemas(parameters=SNOW17_SET)[0]["function"]["description"]
    assert "Snow-17" not in tool_schemas()[0]["function"]["description"]


def test_dds_searches_19_dimensions_on_a_snow_basin_and_improves(snow_dir, snow_sim):
    from hydroagent_hpc.env.observations import evaluate_run

    default_nse = float(evaluate_run(snow_sim.run())["NSE"])
    env = env_of(snow_dir, snow_sim, max_simulations=40, max_turns=None, stop_at_target=False)
    policy = make_optimizer_policy("dds", seed=3, budget=40)
    assert policy.optimizer.space.dim == 11
    ep = run_episode(policy, env)
    assert policy.optimizer.space.dim == 19 and policy.optimizer.space.names == TUNABLE + SNOW_NAMES
    assert ep.counters["simulations"] == 40
    assert len({round(s.params["scf"], 6) for s in ep.sims}) > 5  # the snow parameters are searched
    assert ep.best_nse is not None and ep.best_nse > default_nse + 0.05
    assert ep.best_params is not None and set(SNOW_NAMES) <= set(ep.best_params)


def test_dds_on_a_snow_free_basin_keeps_the_paper_space(small_basin_dir, small_sim):
    env = env_of(small_basin_dir, small_sim, max_simulations=3)
    policy = make_optimizer_policy("dds", seed=1, budget=3)
    run_episode(policy, env)
    assert policy.optimizer.space.names == TUNABLE
    assert ParameterSpace.of(CREST_SET).names == ParameterSpace.log_scaled().names == TUNABLE
    assert ParameterSpace.of(CREST_SET).log_names == ParameterSpace.log_scaled().log_names


def test_heuristic_learns_the_snow_parameters_from_the_environment(snow_dir, snow_sim):
    env = env_of(snow_dir, snow_sim, max_simulations=25, max_turns=None)
    agent = HeuristicHydrologist(seed=2)
    ep = run_episode(agent, env)
    assert agent._names == TUNABLE + SNOW_NAMES
    assert all(t.ok for t in ep.turns if t.tool == "set_parameters")
    moved = {k for s in ep.sims for k in SNOW_NAMES if s.params[k] != pytest.approx(snow_sim.base_snow_params[k])}
    assert moved, "the heuristic never moved a snow parameter"


def test_native_llm_agent_gets_the_snow_tools_on_a_snow_basin(snow_dir, snow_sim):
    """run_episode tells the agent the basin's set; a snow-free basin's tools are test_openai_agent's."""
    pytest.importorskip("openai")
    from pathlib import Path

    from hydroagent_hpc.agents.llm.models_file import get_model
    from hydroagent_hpc.agents.llm.openai_api import OpenAIAgent, with_changes
    from hydroagent_hpc.agents.llm.replay_server import ReplayServer

    recorded = Path(__file__).resolve().parent / "data" / "recorded" / "native_episode.json"
    with ReplayServer(recorded) as srv:
        spec = with_changes(get_model("replay"), base_url=srv.base_url, timeout_s=5.0, max_retries=2,
                            backoff_base_s=0.01, backoff_max_s=0.05)
        agent = OpenAIAgent(spec, seed=5)
        assert tuple(agent._tools[0]["function"]["parameters"]["properties"]) == TUNABLE
        ep = run_episode(agent, env_of(snow_dir, snow_sim, end_on_no_tool_call=True))
        tools = srv.requests[0].body["tools"]
    assert tuple(tools[0]["function"]["parameters"]["properties"]) == TUNABLE + SNOW_NAMES
    assert tools == tool_schemas(parameters=SNOW17_SET)
    assert ep.turns[0].tool == "set_parameters" and ep.turns[0].ok


def test_a_snow_episode_round_trips_through_the_store(snow_dir, snow_sim, tmp_path):
    from hydroagent_hpc.store.frames import load_episode, read_sims
    from hydroagent_hpc.store.writer import EpisodeWriter

    env = env_of(snow_dir, snow_sim, max_simulations=4, max_turns=None)
    ep = run_episode(make_optimizer_policy("random", seed=4, budget=4), env)
    with EpisodeWriter(tmp_path / "snow.h5") as w:
        w.write(ep, env.basin)
    back = load_episode(tmp_path / "snow.h5", ep.episode_id)
    assert [s.params for s in back.sims] == [s.params for s in ep.sims]
    assert all(set(SNOW_NAMES) <= set(s.params) for s in back.sims)
    assert back.best_params == ep.best_params
    assert len(read_sims(tmp_path / "snow.h5")) == 4


def test_sft_data_renders_a_snow_episode_with_the_snow_prompt_and_tools(snow_dir, snow_sim, small_basin_dir,
                                                                          small_sim):
    pytest.importorskip("torch")
    from hydroagent_hpc.train.sft.data import episode_messages, episode_tools

    snowy = run_episode(HeuristicHydrologist(seed=1), env_of(snow_dir, snow_sim, max_simulations=3, max_turns=None))
    plain = run_episode(HeuristicHydrologist(seed=1), env_of(small_basin_dir, small_sim, max_simulations=2))
    assert snowy.config["snow17"] is True and "snow17" not in plain.config
    msgs = episode_messages(snowy)
    assert "Snow-17" in msgs[0]["content"]
    assert "Snow-17 parameters" in msgs[1]["content"]
    assert tuple(episode_tools(snowy)[0]["function"]["parameters"]["properties"]) == TUNABLE + SNOW_NAMES
    assert episode_tools(plain) == tool_schemas()
    assert "Snow-17" not in episode_messages(plain)[0]["content"]


def test_hybrid_hands_the_snow_parameters_to_dds(snow_dir, snow_sim):
    from hydroagent_hpc.agents.hybrid import HybridPolicy

    env = env_of(snow_dir, snow_sim, max_simulations=14, max_turns=None)
    ep = run_episode(HybridPolicy(seed=2, budget=14, warm_simulations=4), env)
    assert ep.counters["simulations"] == 14
    dds_sims = ep.sims[4:]
    assert len({round(s.params["tipm"], 6) for s in dds_sims}) > 2  # DDS moves the snow parameters too
    assert all(t.ok for t in ep.turns if t.tool == "set_parameters")
