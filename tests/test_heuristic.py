"""The heuristic hydrologist: text protocol, determinism, and that it actually calibrates."""

from __future__ import annotations

import pytest

from hydroagent_hpc.agents.heuristic import HeuristicHydrologist
from hydroagent_hpc.config import preset
from hydroagent_hpc.env.environment import CalibrationEnv
from hydroagent_hpc.env.episode import run_episode
from hydroagent_hpc.env.toolcalls import parse_message
from hydroagent_hpc.sim.basin import load_basin


@pytest.fixture(scope="module")
def basin(small_basin_dir):
    return load_basin(small_basin_dir)


def _episode(basin, sim, seed=0, name="paper", **over):
    cfg = preset(name, max_simulations=over.pop("max_simulations", 60), max_turns=None, patience=None,
                 target_nse=0.999, wall_clock_s=None, **over)
    return run_episode(HeuristicHydrologist(seed=seed), CalibrationEnv(basin, sim, cfg, agent="heuristic", seed=seed))


def test_calibrates_and_speaks_the_tool_format(basin, small_sim):
    ep = _episode(basin, small_sim)
    assert ep.counters["parse_failures"] == 0 and ep.counters["simulations"] >= 10
    first = ep.sims[0].metrics["NSE"]
    assert ep.best_nse > max(first, 0.5) and ep.best_nse > 0.8
    for t in ep.turns:
        if t.text:  # every message: a diagnosis, then exactly one call
            parsed = parse_message(t.text)
            assert len(parsed.calls) == 1 and not parsed.failures and parsed.text.strip()
    assert [t.tool for t in ep.turns[:3]] == ["set_parameters", "run_simulation", "evaluate"]


def test_deterministic_for_a_seed(basin, small_sim):
    a = _episode(basin, small_sim, seed=3, max_simulations=15)
    b = _episode(basin, small_sim, seed=3, max_simulations=15)
    assert [s.params for s in a.sims] == [s.params for s in b.sims]
    assert [t.text for t in a.turns] == [t.text for t in b.turns]


def test_works_with_released_observations(basin, small_sim):
    ep = _episode(basin, small_sim, name="released", max_simulations=25)
    assert ep.counters["parse_failures"] == 0 and ep.best_nse is not None and ep.best_nse > ep.sims[0].metrics["NSE"]


def _run(basin, sim, agent, max_simulations=12, **over):
    cfg = preset("paper", max_simulations=max_simulations, max_turns=None, patience=None, target_nse=0.999,
                 wall_clock_s=None, **over)
    return run_episode(agent, CalibrationEnv(basin, sim, cfg, agent="heuristic", seed=0))


def test_overshoot_teacher_noise_asks_past_bounds_and_carries_on(basin, small_sim):
    """overshoot=1: every move after the first evaluation asks past a bound; the environment clips it and
    the hydrologist goes on from the clipped value; overshoot=0 leaves the episode unchanged."""

    from hydroagent_hpc.params import spec_of

    plain = _run(basin, small_sim, HeuristicHydrologist(seed=0))
    assert [t.text for t in _run(basin, small_sim, HeuristicHydrologist(seed=0, overshoot=0.0)).turns] == \
        [t.text for t in plain.turns]
    noisy = _run(basin, small_sim, HeuristicHydrologist(seed=0, overshoot=1.0))
    sets = [t for t in noisy.turns if t.tool == "set_parameters"][1:]
    assert sets and noisy.counters["parse_failures"] == 0 and noisy.counters["simulations"] == 12
    for t in sets:
        asked = parse_message(t.text).calls[0].arguments
        outside = [k for k, v in asked.items() if not spec_of(k).lower <= v <= spec_of(k).upper]
        assert len(outside) == 1, asked
        assert "clipped" in t.observation  # the environment said so
    with pytest.raises(ValueError, match="overshoot"):
        HeuristicHydrologist(overshoot=1.5)


def test_digits_rounds_what_the_teacher_sets(basin, small_sim):
    ep = _run(basin, small_sim, HeuristicHydrologist(seed=0, digits=3))
    for t in ep.turns:
        if t.tool == "set_parameters":
            for v in parse_message(t.text).calls[0].arguments.values():
                assert float(f"{v:.3g}") == v, v
    assert ep.counters["parse_failures"] == 0 and ep.best_nse > ep.sims[0].metrics["NSE"]
    with pytest.raises(ValueError, match="digits"):
        HeuristicHydrologist(digits=0)


def test_partial_sends_only_what_changes(basin, small_sim):
    """partial: each set_parameters call holds only the values that differ from what the environment
    holds; the search (the parameters simulated) is the one without it."""
    full = _run(basin, small_sim, HeuristicHydrologist(seed=0, digits=3, overshoot=0.3))
    part = _run(basin, small_sim, HeuristicHydrologist(seed=0, digits=3, overshoot=0.3, partial=True))
    assert [s.params for s in part.sims] == [s.params for s in full.sims]
    assert part.counters["parse_failures"] == 0 and part.best_nse == full.best_nse
    sets = [t for t in part.turns if t.tool == "set_parameters"]
    held = None
    for t in sets:
        asked = parse_message(t.text).calls[0].arguments
        assert 1 <= len(asked) <= 3, asked
        if held is not None:  # nothing re-sent that the environment already holds
            assert all(held[k] != v for k, v in asked.items()), (held, asked)
        held = t.observation["params"]
    assert parse_message(sets[0].text).calls[0].arguments == {"alpha0": 0.5}
    with pytest.raises(ValueError, match="partial"):
        HeuristicHydrologist(partial="yes")  # type: ignore[arg-type]


def test_explore_draws_moves_the_diagnosis_would_not_make(basin, small_sim):
    """explore=p: that share of the moves is drawn uniformly (teacher data whose moves vary, so a student
    samples moves GRPO can rank); explore=0 leaves the episode unchanged; seeds draw different moves."""
    plain = _run(basin, small_sim, HeuristicHydrologist(seed=0))
    assert [t.text for t in _run(basin, small_sim, HeuristicHydrologist(seed=0, explore=0.0)).turns] == \
        [t.text for t in plain.turns]

    def moves(ep):
        return [t.text.split("\n")[0] for t in ep.turns if t.tool == "set_parameters"][1:]

    drawn = [_run(basin, small_sim, HeuristicHydrologist(seed=s, explore=1.0)) for s in (0, 1)]
    for ep in drawn:
        assert ep.counters["parse_failures"] == 0 and ep.counters["simulations"] == 12
        assert moves(ep) and all("to see how the fit responds" in m for m in moves(ep))
    assert [s.params for s in drawn[0].sims] != [s.params for s in drawn[1].sims]
    assert not any("to see how the fit responds" in m for m in moves(plain))
    half = _run(basin, small_sim, HeuristicHydrologist(seed=0, explore=0.5))
    share = sum("to see how the fit responds" in m for m in moves(half)) / len(moves(half))
    assert 0.1 < share < 0.9, share
    for bad in (1.5, -0.1, True):
        with pytest.raises(ValueError, match="explore"):
            HeuristicHydrologist(explore=bad)  # type: ignore[arg-type]


def test_explore_start_draws_the_first_guess(basin, small_sim):
    """explore_start=1: the first call's alpha0 is drawn (log-uniform on [0.1, 1.5]), differently per seed;
    0 keeps the episode; the draws leave the moves' own exploration stream alone."""
    plain = _run(basin, small_sim, HeuristicHydrologist(seed=0), max_simulations=3)
    assert [t.text for t in _run(basin, small_sim, HeuristicHydrologist(seed=0, explore_start=0.0),
                                 max_simulations=3).turns] == [t.text for t in plain.turns]
    firsts = [_run(basin, small_sim, HeuristicHydrologist(seed=s, explore_start=1.0, digits=3), max_simulations=3)
              .sims[0].params["alpha0"] for s in range(6)]
    assert plain.sims[0].params["alpha0"] == 0.5
    assert all(0.1 <= v <= 1.5 and float(f"{v:.3g}") == v for v in firsts) and len(set(firsts)) == 6, firsts
    with pytest.raises(ValueError, match="explore_start"):
        HeuristicHydrologist(explore_start=2.0)


@pytest.mark.parametrize("observation", ["released", "paper"])
def test_quote_copies_the_values_a_move_acts_on_and_changes_no_move(basin, small_sim, observation):
    """quote=True: each diagnosis quotes the observed value it acts on exactly as the observation spells
    it (``peak_ratio=1.2685``, ``NSE=0.8125``), so a student can copy it; the moves stay those of quote=False."""
    import json

    plain = _run(basin, small_sim, HeuristicHydrologist(seed=0), max_simulations=6, observation=observation)
    quoted = _run(basin, small_sim, HeuristicHydrologist(seed=0, quote=True), max_simulations=6,
                  observation=observation)
    assert [s.params for s in quoted.sims] == [s.params for s in plain.sims]
    assert not any("=" in (t.text or "").split("<tool_call>")[0] for t in plain.turns[1:])
    shown: dict = {}  # what the agent has read so far (diagnostics of the run, then the evaluation)
    copied = 0
    for t in quoted.turns:
        if t.tool == "set_parameters" and shown:
            head = t.text.split("<tool_call>")[0]
            assert head.startswith(f"NSE={json.dumps(shown['NSE'])} "), head
            for quote in head.split()[1:]:
                if "=" in quote:  # key=value: the value as the observation spelled it
                    key, value = quote.rstrip(":").split("=")
                    assert json.dumps(shown[key]) == value, (quote, shown.get(key))
                    copied += 1
        if t.tool == "run_simulation" and isinstance(t.observation, dict):
            shown = dict(t.observation.get("diagnostics") or {})
        if t.tool == "evaluate" and isinstance(t.observation, dict):
            shown.update(t.observation)
    assert copied >= 1  # at least one diagnosis quoted its reading
    with pytest.raises(ValueError, match="quote"):
        HeuristicHydrologist(quote="yes")  # type: ignore[arg-type]
