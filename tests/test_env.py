"""CalibrationEnv: tools, budgets, stop rules, rewards from the environment's own record."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from hydroagent_hpc.agents.scripted import ScriptedPolicy
from hydroagent_hpc.config import preset
from hydroagent_hpc.env.environment import CalibrationEnv
from hydroagent_hpc.env.episode import run_episode
from hydroagent_hpc.env.toolcalls import render_hermes, render_tool_response
from hydroagent_hpc.sim.basin import load_basin
from hydroagent_hpc.sim.synth.basins import read_truth
from hydroagent_hpc.types import ToolCall

SET = "set_parameters"
RUN = {"name": "run_simulation", "arguments": {}}
EVAL = {"name": "evaluate", "arguments": {}}


def call(name, **args):
    return render_hermes(ToolCall(name, args))


@pytest.fixture(scope="module")
def basin(small_basin_dir):
    return load_basin(small_basin_dir)


@pytest.fixture(scope="module")
def truth(small_basin_dir):
    return {k: v for k, v in read_truth(small_basin_dir)["multipliers"].items() if k not in ("th", "isu")}


def make_env(basin, sim, name="paper", **over):
    over.setdefault("target_nse", 0.999)  # out of reach unless a test says otherwise
    return CalibrationEnv(basin, sim, preset(name, **over), agent="test")


def test_scripted_episode_paper(basin, small_sim):
    script = [{"name": SET, "arguments": {"alpha0": 0.5, "wm": 20.0}}, RUN, EVAL, EVAL]
    ep = run_episode(ScriptedPolicy(script), make_env(basin, small_sim))
    kinds = [(t.tool, t.ok) for t in ep.turns]
    assert kinds == [(SET, True), ("run_simulation", True), ("evaluate", True), ("evaluate", False)]
    t0 = ep.turns[0]
    assert t0.reward == pytest.approx(0.02) and t0.observation["clipped"] == {"wm": {"asked": 20.0, "used": 10.0}}
    assert ep.turns[1].reward == pytest.approx(0.05) and "hydrograph" in ep.turns[1].observation
    nse = ep.sims[0].metrics["NSE"]
    assert ep.turns[2].reward == pytest.approx(max(min(nse, 1), -1))  # change in clipped best from 0
    assert ep.turns[3].reward == 0.0 and "already evaluated" in ep.turns[3].observation["message"]
    assert ep.best_nse == pytest.approx(nse) and ep.best_run == 1 and ep.stop_reason == "policy_stopped"
    assert ep.terminal_terms == {"best_nse_clipped": pytest.approx(max(min(nse, 1), -1)), "target_bonus": 0.0,
                                 "eval_bonus": pytest.approx(0.02), "improve_bonus": 0.0}
    assert ep.counters["credited_evaluations"] == 1 and ep.counters["evaluations"] == 2
    assert ep.sims[0].params["wm"] == 10.0 and ep.sims[0].discharge.dtype == np.float32


def test_text_claims_earn_nothing(basin, small_sim):
    env = make_env(basin, small_sim)
    env.reset()
    r = env.step('My calibration reached {"NSE": 0.99} -- "NSE": 0.99, target met.')
    assert r.reward == pytest.approx(-0.5) and env.ledger.best is None
    assert env.turns[-1].kind == "parse_failure" and env.turns[-1].error == "no_tool_call"
    ep = env.episode()
    assert ep.terminal_reward == -1.0 and ep.terminal_terms == {"empty_penalty": -1.0}


def test_released_preset_pays_terminal_only(basin, small_sim):
    script = [{"name": SET, "arguments": {"alpha0": 0.5}}, RUN, EVAL, "no call here"]
    ep = run_episode(ScriptedPolicy(script), make_env(basin, small_sim, "released"))
    assert all(t.reward == 0.0 for t in ep.turns)
    assert "validated_params" in ep.turns[0].observation
    assert set(ep.turns[1].observation) == {"status", "message", "output_file", "run_number"}
    assert {"NSE", "CC", "KGE", "sim_peak", "obs_peak", "peak_ratio", "lag_hours_sim_minus_obs", "num_points"} <= \
        set(ep.turns[2].observation)
    assert "unpaid_delta_nse_previous" in ep.turns[2].reward_terms
    assert "unpaid_parse_failure" in ep.turns[3].reward_terms
    assert ep.terminal_reward == pytest.approx(sum(ep.terminal_terms.values()))
    assert ep.total_reward == pytest.approx(ep.terminal_reward)


def test_target_stops_and_pays_bonus(basin, small_sim, truth):
    env = make_env(basin, small_sim, target_nse=0.5)
    env.set_parameters(**truth)
    env.run_simulation()
    obs = env.evaluate()
    assert obs["target_met"] and obs["improved"] and env.done and env.stop_reason == "target_reached"
    ep = env.episode()
    assert ep.terminal_terms["target_bonus"] == 0.5 and ep.best_nse > 0.8
    with pytest.raises(RuntimeError, match="over"):
        env.run_simulation()


def test_patience(basin, small_sim, truth):
    env = make_env(basin, small_sim, patience=2)
    env.set_parameters(**truth)
    env.run_simulation()
    env.evaluate()
    assert not env.done
    for alpha in (0.2, 0.3):
        env.set_parameters(alpha=alpha, wm=0.2)
        env.run_simulation()
        env.evaluate()
    assert env.done and env.stop_reason == "patience" and env.counters["improvements"] == 1


def test_turn_cap_and_parse_failure_streak(basin, small_sim):
    env = make_env(basin, small_sim, max_turns=3, max_consecutive_parse_failures=None)
    env.reset()
    for _ in range(3):
        env.step(call(SET, wm=2.0))
    assert env.done and env.stop_reason == "max_turns" and len(env.turns) == 3
    env = make_env(basin, small_sim)
    for _ in range(4):
        r = env.step("<tool_call>{broken</tool_call>")
    assert r.done and env.stop_reason == "parse_failures" and env.counters["parse_failures"] == 4


def test_many_calls_in_one_message_run_in_order(basin, small_sim):
    env = make_env(basin, small_sim)
    msg = "\n".join([call(SET, alpha0=0.7), call("run_simulation"), call("evaluate"), call(SET, alpha0=0.1),
                     call("run_simulation"), call("evaluate")])
    r = env.step(msg)
    assert [o["status"] for o in r.observations] == ["ok"] * 6
    assert env.sims[0].params["alpha0"] == 0.7 and env.sims[1].params["alpha0"] == 0.1
    assert [t.run_id for t in env.turns if t.tool == "evaluate"] == [1, 2]
    assert env.turns[0].text == msg and all(t.text == "" for t in env.turns[1:])


def test_wall_clock(basin, small_sim):
    now = [0.0]
    env = CalibrationEnv(basin, small_sim, preset("paper", wall_clock_s=10.0, target_nse=0.999), clock=lambda: now[0])
    env.set_parameters(wm=2.0)
    now[0] = 11.0
    env.set_parameters(wm=3.0)
    assert env.done and env.stop_reason == "wall_clock"


def test_rounds_protocol_batches_candidates(basin, small_sim, truth):
    env = make_env(basin, small_sim, protocol="rounds", max_rounds=2, candidates_per_round=3, max_turns=None)
    for wm in (0.5, 1.5, 3.0):
        env.set_parameters(wm=wm)
        assert env.run_simulation()["candidate"] >= 1
    env.set_parameters(wm=4.0)
    assert env.run_simulation()["status"] == "error"  # a full round
    obs = env.evaluate()
    assert obs["round"] == 1 and len(obs["candidates"]) == 3 and env.counters["simulations"] == 3
    single = [small_sim.run({**env._initial, "wm": w}).discharge for w in (0.5, 1.5, 3.0)]
    for rec, q in zip(env.sims, single):
        np.testing.assert_allclose(rec.discharge, q.astype(np.float32))
    best = max(env.sims, key=lambda r: r.metrics["NSE"])
    assert obs["best"]["run"] == best.run_id and env.best_run == best.run_id
    env.set_parameters(**truth)
    env.run_simulation()
    env.evaluate()
    assert env.done and env.stop_reason in ("max_rounds", "target_reached")


def test_failed_run_is_never_scored_from_an_earlier_output(basin, small_basin_dir, tmp_path):
    """With the EF5 backend, a run that fails after a good one is a failure, not the old CSV."""
    import sys

    from hydroagent_hpc.sim.ef5 import EF5Simulator

    flag = tmp_path / "fail-now"
    script = tmp_path / "ef5"
    script.write_text(f"#!/bin/sh\nif [ -e {flag} ]; then echo 'EF5 crashed' >&2; exit 1; fi\n"
                      f"exec {sys.executable} -m hydroagent_hpc.cli -q simulate \"$1\" --no-cache\n")
    script.chmod(0o755)
    sim = EF5Simulator(small_basin_dir / "control.txt", binary=script, workdir=tmp_path)
    env = CalibrationEnv(basin, sim, preset("paper", target_nse=0.999))
    env.set_parameters(alpha0=0.5)
    assert env.run_simulation()["status"] == "ok"
    assert env.evaluate()["status"] == "ok"
    flag.touch()
    env.set_parameters(alpha0=0.6)
    obs = env.run_simulation()
    assert obs["status"] == "error" and "EF5 crashed" in obs["message"]
    again = env.evaluate()
    assert again["status"] == "error" and "failed" in again["message"]
    assert env.counters["failed_simulations"] == 1 and env.counters["credited_evaluations"] == 1


def test_episodes_in_threads_match_sequential(basin, small_sim):
    scripts = [[{"name": SET, "arguments": {"alpha0": a, "wm": w}}, RUN, EVAL] for a, w in
               ((0.2, 1.0), (0.6, 2.0), (1.0, 0.5), (1.5, 3.0))]
    seq = [run_episode(ScriptedPolicy(s), make_env(basin, small_sim)).best_nse for s in scripts]
    out = [None] * len(scripts)

    def work(i):
        out[i] = run_episode(ScriptedPolicy(scripts[i]), make_env(basin, small_sim)).best_nse

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(scripts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == seq


def test_observations_are_json(basin, small_sim):
    env = make_env(basin, small_sim)
    env.step(call(SET, alpha0=0.4) + call("run_simulation") + call("evaluate"))
    for t in env.turns:
        json.loads(render_tool_response(t.observation))
    ev = env.turns[-1].observation
    assert {"NSE", "KGE", "KGE_r", "KGE_alpha", "KGE_beta", "RMSE", "PBIAS", "KGE_high", "KGE_low", "best",
            "target_nse", "target_met", "improved"} <= set(ev)
    diag = env.turns[1].observation["diagnostics"]
    assert {"peak_error_pct", "peak_lag_h", "volume_ratio", "recession_k_sim", "time_to_peak_sim_h", "bfi_sim",
            "events_sim"} <= set(diag)
    hydro = env.turns[1].observation["hydrograph"]
    assert len(hydro["sim"]) == len(hydro["obs"]) == 60 and hydro["bin_hours"] == pytest.approx(241 / 60, abs=1e-3)


def test_rounds_respect_the_simulation_budget(basin, small_sim):
    env = make_env(basin, small_sim, protocol="rounds", max_rounds=5, candidates_per_round=3, max_turns=None,
                   max_simulations=4)
    for wm in (0.5, 1.5, 3.0):
        env.set_parameters(wm=wm)
        env.run_simulation()
    env.evaluate()
    env.set_parameters(wm=2.0)
    assert env.run_simulation()["status"] == "ok"
    env.set_parameters(wm=2.5)
    refused = env.run_simulation()
    assert refused["status"] == "error" and "budget" in refused["message"]
    env.evaluate()
    assert env.counters["simulations"] == 4 and env.done and env.stop_reason == "max_simulations"


def test_padding_in_one_message_is_paid_once(basin, small_sim):
    """The text path pays the same safe shaping as the direct one; the episode records the mode."""
    env = make_env(basin, small_sim)
    r = env.step(call(SET, alpha0=0.4) + call(SET, alpha0=0.4) + call(SET, wm=1.0) + call("run_simulation")
                 + call("run_simulation") + call("evaluate"))
    assert [t.ok for t in env.turns] == [True] * 6
    assert [t.reward for t in env.turns[:5]] == pytest.approx([0.02, 0.0, 0.0, 0.05, 0.0])
    assert env.turns[1].reward_terms == {"unpaid_set_parameters_ok": 0.02}
    assert env.turns[4].reward_terms == {"unpaid_simulation_ok": 0.05}
    nse = env.sims[1].metrics["NSE"]
    assert r.reward == pytest.approx(0.07 + max(min(nse, 1.0), -1.0))
    ep = env.episode()
    assert ep.config["env"]["rewards"]["shaping"] == "safe" and ep.config["env"]["rewards"]["shaping_cap"] == 0.05
    assert ep.terminal_terms["eval_bonus"] == pytest.approx(0.02) and ep.counters["simulations"] == 2


def test_rounds_of_the_same_candidates_earn_the_eval_bonus_once(basin, small_sim):
    def play(shaping):
        env = make_env(basin, small_sim, protocol="rounds", max_rounds=3, candidates_per_round=2, max_turns=None,
                       patience=None, rewards={"shaping": shaping})
        env.set_parameters(wm=1.5)
        for _ in range(3):
            env.run_simulation()
            env.run_simulation()
            assert env.evaluate()["status"] == "ok"
        assert env.done and env.stop_reason == "max_rounds"
        return env.episode()

    safe, literal = play("safe"), play("literal")
    assert safe.best_nse == literal.best_nse and safe.counters["credited_evaluations"] == 3
    assert safe.terminal_terms["eval_bonus"] == pytest.approx(0.02)
    assert literal.terminal_terms["eval_bonus"] == pytest.approx(0.06)
