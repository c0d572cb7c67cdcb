"""Classic optimizers (DDS, SCE-UA, DREAM, LHS, random): ask/tell contract, algorithms, episodes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hydroagent_hpc.agents.base import DirectPolicy
from hydroagent_hpc.agents.optimizers.dds import DDS, dds_initial_count, dds_perturb, dds_probability
from hydroagent_hpc.agents.optimizers.dream import DREAM, nse_log_likelihood
from hydroagent_hpc.agents.optimizers.policy import (
    OPTIMIZERS,
    OptimizerPolicy,
    make_optimizer,
    make_optimizer_policy,
    simulation_budget,
)
from hydroagent_hpc.agents.optimizers.sampling import LatinHypercubeSearch
from hydroagent_hpc.agents.optimizers.sceua import SCEUA, trapezoidal_probabilities
from hydroagent_hpc.agents.optimizers.space import ParameterSpace, clean_score, reflect
from hydroagent_hpc.config import preset
from hydroagent_hpc.env.environment import CalibrationEnv
from hydroagent_hpc.env.episode import run_episode
from hydroagent_hpc.params import PARAMS, TUNABLE
from hydroagent_hpc.sim.basin import load_basin
from hydroagent_hpc.sim.errors import HydroAgentError

SPACE = ParameterSpace()
NAMES = tuple(OPTIMIZERS)


def sphere(seed: int = 0, low: float = 0.1, high: float = 0.9):
    """A shifted sphere in the unit cube, as a score to maximise (0 at the optimum)."""
    target = np.random.default_rng(1000 + seed).uniform(low, high, SPACE.dim)

    def score(params) -> float:
        return -float(np.sum((SPACE.to_unit(params) - target) ** 2))

    return score, target


def drive(opt, score, evaluations: int, batch: int = 1) -> list[list[dict]]:
    """Ask/tell ``evaluations`` points in batches; returns every batch asked."""
    asked, n = [], 0
    while n < evaluations:
        cands = opt.ask(min(batch, evaluations - n))
        assert cands, "an optimizer must propose while nothing is pending"
        opt.tell(cands, [score(c) for c in cands])
        asked.append(cands)
        n += len(cands)
    return asked


# ---------------------------------------------------------------------- space and shared contract
def test_space_maps_the_tunable_box():
    assert SPACE.names == TUNABLE and SPACE.dim == 11 and "th" not in SPACE.names and "isu" not in SPACE.names
    lo, hi = SPACE.to_params(np.zeros(11)), SPACE.to_params(np.ones(11))
    assert all(lo[n] == PARAMS[n].lower and hi[n] == PARAMS[n].upper for n in TUNABLE)
    u = np.linspace(0.0, 1.0, 11)
    np.testing.assert_allclose(SPACE.to_unit(SPACE.to_params(u)), u, atol=1e-12)
    with pytest.raises(ValueError, match="lacks"):
        SPACE.to_unit({"wm": 1.0})
    with pytest.raises(ValueError, match="not a tunable"):
        ParameterSpace(("wm", "th"))
    assert [clean_score(x) for x in (0.5, None, "x", math.nan, math.inf, -math.inf)] == [0.5] + [-math.inf] * 5


def test_log_scaled_space():
    log = ParameterSpace.log_scaled()
    assert log.log_names == ("wm", "fc", "iwu", "under", "leaki", "alpha", "beta")
    mid = log.to_params(np.full(11, 0.5))
    assert mid["wm"] == pytest.approx(1.0) and mid["iwu"] == pytest.approx(math.sqrt(10.0))  # geometric midpoints
    assert mid["ke"] == pytest.approx(1.0) and mid["b"] == pytest.approx(1.5, rel=1e-5)  # linear ones
    u = np.random.default_rng(0).random((50, 11))
    for row in u:
        p = log.to_params(row)
        assert all(PARAMS[k].lower <= v <= PARAMS[k].upper for k, v in p.items())
        np.testing.assert_allclose(log.to_unit(p), row, atol=1e-9)
    with pytest.raises(ValueError, match="lower bound > 0"):
        ParameterSpace(log_names=("im",))
    opt = make_optimizer("dds", 0, 50)  # the factory's default scale
    assert opt.space.log_names == log.log_names and all(tuple(c) == TUNABLE for c in opt.ask(3))
    assert make_optimizer("dds", 0, 50, scale="linear").space.log_names == ()
    with pytest.raises(ValueError, match="scale="):
        make_optimizer("dds", 0, 50, scale="sqrt")


@given(st.lists(st.floats(-3.0, 4.0), min_size=1, max_size=20))
@settings(max_examples=200, deadline=None)
def test_reflect_stays_in_the_box_and_mirrors(values):
    u = np.array(values)
    out = reflect(u)
    assert np.all((out >= 0.0) & (out <= 1.0))
    inside = (u >= 0) & (u <= 1)
    np.testing.assert_array_equal(out[inside], u[inside])
    for x, y in zip(u, out):
        if -1.0 <= x < 0.0:
            assert y == pytest.approx(-x)
        elif 1.0 < x <= 2.0:
            assert y == pytest.approx(2.0 - x)
        elif x < -1.0:
            assert y == 0.0  # reflected from below past the top: set to the lower bound (DDS)
        elif x > 2.0:
            assert y == 1.0


@pytest.mark.parametrize("name", NAMES)
def test_asks_are_complete_in_bounds_and_deterministic(name):
    score, _ = sphere(3, low=0.0, high=0.05)  # optimum at a corner: many proposals hit the bounds
    runs = []
    for seed in (5, 5, 6):
        opt = make_optimizer(name, seed, 120)
        runs.append(drive(opt, score, 120, batch=7))
    for batches in runs:
        for cands in batches:
            for c in cands:
                assert tuple(c) == TUNABLE
                assert all(PARAMS[k].lower <= v <= PARAMS[k].upper and isinstance(v, float) for k, v in c.items())
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


@pytest.mark.parametrize("name", NAMES)
def test_failed_scores_are_the_worst(name):
    opt = make_optimizer(name, 1, 60)
    assert opt.best == (None, -math.inf)
    bad = [math.nan, None, math.inf, -math.inf]
    n = 0
    while n < 60:
        cands = opt.ask(4)
        opt.tell(cands, [bad[(n + i) % 4] if (n + i) % 3 else -float(i + n) for i in range(len(cands))])
        n += len(cands)
    params, best = opt.best
    assert best == 0.0 and params is not None  # the only finite scores were -i-n; the best is 0 at n=0, i=0
    everything_fails = make_optimizer(name, 1, 30)
    drive(everything_fails, lambda c: math.nan, 30, batch=3)
    assert everything_fails.best == (None, -math.inf) and len(everything_fails.ask(2)) >= 1


def test_contract_errors():
    opt = make_optimizer("random", 0, 10)
    with pytest.raises(ValueError, match="2 scores"):
        opt.tell(opt.ask(1), [0.1, 0.2])
    with pytest.raises(ValueError, match=">= 0"):
        opt.ask(-1)
    with pytest.raises(ValueError, match="at least 1"):
        make_optimizer("dds", 0, 0)
    with pytest.raises(ValueError, match="unknown optimizer 'cmaes'"):
        make_optimizer("cmaes", 0, 10)
    assert opt.ask(0) == []


# ---------------------------------------------------------------------- DDS
def test_dds_probability_schedule():
    m = 200
    assert dds_probability(1, m) == 1.0 and dds_probability(m, m) == 0.0 and dds_probability(2 * m, m) == 0.0
    assert dds_probability(20, m) == pytest.approx(1 - math.log(20) / math.log(200))
    ps = [dds_probability(i, m) for i in range(1, m + 1)]
    assert all(a > b for a, b in zip(ps, ps[1:]))
    assert dds_probability(1, 1) == 0.0
    assert dds_initial_count(200) == 5 and dds_initial_count(4000) == 20 and dds_initial_count(3) == 3


def test_dds_perturbation_dimensions_and_reflection():
    rng = np.random.default_rng(0)
    center = np.full(11, 0.5)
    for _ in range(200):  # P = 0: exactly one dimension moves
        new = dds_perturb(center, 0.0, 0.2, rng)
        assert np.count_nonzero(new != center) == 1
    moved = [np.count_nonzero(dds_perturb(center, 1.0, 0.2, rng) != center) for _ in range(50)]
    assert min(moved) == 11
    edge = np.zeros(11)
    for _ in range(200):  # from the lower bound, a step downwards is mirrored, never clipped to 0
        new = dds_perturb(edge, 1.0, 0.2, rng)
        assert np.all((new >= 0) & (new <= 1))
    counts = [np.count_nonzero(dds_perturb(center, 0.5, 0.2, rng) != center) for _ in range(2000)]
    assert np.mean(counts) == pytest.approx(0.5 * 11 + 0.5 ** 11, abs=0.2)


def test_dds_initialisation_then_greedy_steps():
    score, _ = sphere(1)
    opt = DDS(0, 200)
    first = opt.ask(5)  # i0 = max(5, 0.005*200) random points
    opt.tell(first, [score(c) for c in first])
    best_init = max(first, key=score)
    assert opt.best[0] == best_init and opt.iteration == 6
    step = opt.ask(1)[0]
    u_new, u_best = SPACE.to_unit(step), SPACE.to_unit(best_init)
    assert np.any(np.isclose(u_new, u_best))  # P(6) = 0.66: some dimensions keep the centre's value
    opt.tell([step], [score(best_init) - 1.0])  # worse: the centre stays
    assert opt.best[0] == best_init


@pytest.mark.parametrize("batch", [1, 10])
def test_dds_converges_on_a_sphere(batch):
    dists = []
    for seed in range(3):
        score, _ = sphere(seed)
        opt = DDS(seed, 300)
        drive(opt, score, 300, batch)
        dists.append(math.sqrt(-opt.best[1]))
    assert max(dists) < 0.2, dists  # a random point is about 1.1 away


def test_dds_warm_start_initial_points_and_told_history():
    score, target = sphere(2)
    good = SPACE.to_params(np.clip(target + 0.05, 0, 1))
    opt = DDS(0, 50, initial=[good])
    assert opt.ask(1) == [good]  # evaluated first, instead of the random initialisation
    opt.tell([good], [score(good)])
    assert opt.best[0] == good and opt.iteration == 2
    nxt = opt.ask(3)
    assert all(c != good for c in nxt)

    told = DDS(0, 50, r=0.01)  # a warm start evaluated elsewhere: tell it before any ask
    told.tell([good], [score(good)])
    assert told.n_told == 0 and told.iteration == 1 and told.best == (good, score(good))
    near = told.ask(4)
    assert all(np.max(np.abs(SPACE.to_unit(c) - SPACE.to_unit(good))) < 0.1 for c in near)
    told.tell(near, [score(c) for c in near])
    drive(told, score, 46, batch=1)
    assert told.best[1] >= score(good)


# ---------------------------------------------------------------------- SCE-UA
def test_sceua_defaults_and_trapezoid():
    opt = SCEUA(0, 200)
    assert (opt.p, opt.m, opt.q, opt.beta, opt.s) == (2, 23, 12, 23, 46)
    p = trapezoidal_probabilities(23)
    assert p.sum() == pytest.approx(1.0) and p[0] == pytest.approx(2 / 24) and np.all(np.diff(p) < 0)
    with pytest.raises(ValueError, match="q <= m"):
        SCEUA(0, 100, points_per_complex=5)


def test_sceua_sample_partition_and_shuffles():
    score, _ = sphere(4)
    opt = SCEUA(0, 600)
    drive(opt, score, 46)
    assert opt.complexes is not None and sorted(i for c in opt.complexes for i in c) == list(range(46))
    f = opt.F
    assert f[opt.complexes[0][0]] == f.max()  # the best point heads complex 1 (index 0)
    drive(opt, score, 554)
    assert opt.shuffles >= 3 and opt.pending == 0


@pytest.mark.parametrize("batch", [1, 10])
def test_sceua_converges_and_fills_batches(batch):
    dists = []
    for seed in range(3):
        score, _ = sphere(seed)
        opt = SCEUA(seed, 500)
        asked = drive(opt, score, 500, batch)
        assert all(len(a) == batch for a in asked)
        dists.append(math.sqrt(-opt.best[1]))
    assert max(dists) < 0.2, dists


def test_sceua_warm_start_joins_the_sample():
    score, target = sphere(5)
    good = SPACE.to_params(target)
    opt = SCEUA(0, 100)
    opt.tell([good], [score(good)])
    drive(opt, score, 45)
    assert opt.complexes is not None and opt.complexes[0][0] == 0  # the warm start, best, heads complex 1
    assert opt.best[1] == pytest.approx(0.0, abs=1e-12)


# ---------------------------------------------------------------------- DREAM
def test_nse_log_likelihood():
    assert nse_log_likelihood(0.0, 50) == 0.0
    assert nse_log_likelihood(0.9, 50) == pytest.approx(-25 * math.log(0.1))
    assert nse_log_likelihood(math.nan) == -math.inf and math.isfinite(nse_log_likelihood(1.0))
    assert nse_log_likelihood(0.8) > nse_log_likelihood(0.7) > nse_log_likelihood(-3.0)


def test_dream_batch_size_does_not_change_the_chains():
    score, _ = sphere(6)
    a, b = DREAM(3, 200), DREAM(3, 200)
    drive(a, score, 200, batch=1)
    drive(b, score, 200, batch=10)
    np.testing.assert_array_equal(a.X, b.X)
    assert a.best == b.best and a.generation == 18  # 10 initial states + 19 generations (0-based)


def test_dream_samples_towards_the_optimum():
    score, _ = sphere(7)
    opt = DREAM(0, 1500)
    drive(opt, score, 1500, batch=10)
    assert 0.05 < opt.acceptance_rate < 0.9
    assert math.sqrt(-opt.best[1]) < 0.35
    assert opt.p_cr.sum() == pytest.approx(1.0) and opt.p_cr.min() > 0
    lhs = LatinHypercubeSearch(0, 1500)
    drive(lhs, score, 1500, batch=10)
    assert opt.best[1] > lhs.best[1]


def test_dream_batch_comes_back_short_at_a_generation_end():
    opt = DREAM(0, 100, chains=5)
    assert len(opt.ask(8)) == 5  # the initial states; the next generation needs their scores


# ---------------------------------------------------------------------- sampling
def test_latin_hypercube_is_stratified():
    opt = LatinHypercubeSearch(0, 40)
    u = np.array([SPACE.to_unit(c) for c in opt.ask(40)])
    for j in range(11):
        assert sorted(np.floor(u[:, j] * 40).astype(int)) == list(range(40))
    assert len(opt.ask(5)) == 5  # past the budget: a fresh design


# ---------------------------------------------------------------------- policy and environment
def test_simulation_budget():
    assert simulation_budget(preset("paper", max_simulations=30, max_turns=None)) == 30
    assert simulation_budget(preset("paper")) == 16  # 50 turns, 3 per simulation
    assert simulation_budget(preset("paper", max_turns=None)) is None
    rounds = preset("paper", protocol="rounds", max_turns=None)
    assert simulation_budget(rounds) == 200
    # 25 turns: a full round of 10 (21 calls), then one candidate (2 calls) and its evaluate
    assert simulation_budget(preset("paper", protocol="rounds", max_turns=25, candidates_per_round=10)) == 11


@pytest.fixture(scope="module")
def basin(small_basin_dir):
    return load_basin(small_basin_dir)


@pytest.fixture(scope="module")
def default_nse(small_sim):
    from hydroagent_hpc.env.observations import evaluate_run

    return evaluate_run(small_sim.run({}))["NSE"]


TURNS = dict(max_simulations=30, max_turns=None, patience=None, target_nse=0.999)
ROUNDS = dict(protocol="rounds", max_rounds=3, candidates_per_round=10, max_turns=None, patience=None,
              target_nse=0.999)


def episode(basin, sim, name, seed=0, budget=30, **config):
    env = CalibrationEnv(basin, sim, preset("paper", **config), agent=name, seed=seed)
    policy = make_optimizer_policy(name, seed, budget)
    assert isinstance(policy, DirectPolicy) and policy.name == name
    return run_episode(policy, env)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("config", [TURNS, ROUNDS], ids=["turns", "rounds"])
def test_policy_episode_improves_within_budget(basin, small_sim, default_nse, name, config):
    ep = episode(basin, small_sim, name, **config)
    assert ep.counters["simulations"] <= 30 and ep.counters["simulations"] >= 25
    assert ep.best_nse > default_nse + 0.5
    assert not ep.stop_reason.startswith("policy_error")
    assert ep.counters["parse_failures"] == 0 and ep.counters["clipped_values"] == 0
    for rec in ep.sims:
        assert all(PARAMS[k].lower <= v <= PARAMS[k].upper for k, v in rec.params.items())
    if config is TURNS:
        assert ep.counters["credited_evaluations"] == ep.counters["simulations"]
    else:
        assert ep.counters["rounds"] == 3


def test_policy_episodes_are_deterministic(basin, small_sim):
    a = episode(basin, small_sim, "dds", seed=11, **ROUNDS)
    b = episode(basin, small_sim, "dds", seed=11, **ROUNDS)
    c = episode(basin, small_sim, "dds", seed=12, **ROUNDS)
    assert [r.params for r in a.sims] == [r.params for r in b.sims] and a.best_nse == b.best_nse
    assert [r.params for r in a.sims] != [r.params for r in c.sims]


def test_policy_stops_at_the_smaller_budget(basin, small_sim):
    ep = episode(basin, small_sim, "random", budget=7, **TURNS)
    assert ep.counters["simulations"] == 7 and ep.stop_reason == "policy_stopped"
    env = CalibrationEnv(basin, small_sim, preset("paper", max_turns=10, patience=None, target_nse=0.999))
    ep = run_episode(make_optimizer_policy("dds", 0, 100), env)
    assert ep.counters["simulations"] == 3  # 10 turns: 3 full set/run/evaluate triples


def test_rounds_policy_respects_simulation_and_turn_caps(basin, small_sim):
    capped = dict(ROUNDS, max_simulations=25)
    ep = episode(basin, small_sim, "dds", budget=100, **capped)
    assert ep.counters["simulations"] == 25 and ep.counters["rounds"] == 3  # the last round holds 5
    turns = dict(ROUNDS, max_turns=25)
    ep = episode(basin, small_sim, "sceua", budget=100, **turns)
    assert ep.counters["simulations"] == 11 and ep.counters["rounds"] == 2 and ep.stop_reason == "policy_stopped"


class FlakySim:
    """The small basin's simulator, failing whenever wm > 5 (as a broken EF5 run would)."""

    def __init__(self, sim) -> None:
        self.sim = sim
        self.base_params = sim.base_params

    def run(self, params):
        if params.get("wm", 1.0) > 5.0:
            raise HydroAgentError("wm too large for this test")
        return self.sim.run(params)

    def run_batch(self, sets):
        return [self.run(p) for p in sets]


@pytest.mark.parametrize("config", [TURNS, ROUNDS], ids=["turns", "rounds"])
def test_failed_runs_are_failed_candidates(basin, small_sim, config):
    env = CalibrationEnv(basin, FlakySim(small_sim), preset("paper", **config))
    opt = make_optimizer("random", 4, 30)
    ep = run_episode(OptimizerPolicy(opt), env)
    failed = ep.counters["failed_simulations"]
    assert failed > 0 and ep.counters["simulations"] == 30
    assert sum(1 for s in opt.scores if s == -math.inf) == failed
    assert opt.best[1] == pytest.approx(ep.best_nse, abs=1e-4)  # observations round NSE to 4 decimals
