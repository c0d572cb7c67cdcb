"""Shaping rewards cannot be farmed (issue 13, item 5; issue 32, item 3: the bound is 0.05).

Real CalibrationEnv episodes on the small synthetic basin, driven through the direct tool
interface (and the text interface for messages without a tool call). A transcript reaches some
best NSE; its *direct* counterpart sets that best parameter set, runs it and evaluates it,
nothing else. Farming is any activity that is paid without reaching a better result. The
generator plays blocks of these patterns before and after the direct part:

* padding: set_parameters calls that change nothing, change and change back, or set new sets
  that are never run,
* spamming: repeated run_simulation of the same parameters, or of new sets never evaluated,
* repeating: identical run/evaluate pairs, evaluates with no fresh run,
* oscillating: run/evaluate pairs alternating between two sets,
* sandbagging: a ladder of deliberately worse parameter sets climbing to the best, of any length,
* exploring: other sets evaluated, worse ones after the best,
* invalid-then-valid: invalid set_parameters calls and messages without a tool call,

and ends either where the policy stops or by padding to the 50-call cap. A seeded local search
(:func:`search`) mutates transcripts (insert, delete, duplicate, ladders, jumps between points)
and keeps the one with the largest excess.

Properties (``shaping: safe``, both presets): farming at the best parameter set earns nothing
(excess <= 1e-9); no generated or searched transcript earns more than its direct counterpart
by more than EPSILON = 0.05 (the issue's bound, and ``RewardConfig.shaping_cap``'s default).
``shaping: literal`` keeps the paper's and the released code's constants for ablations, and
the farms still pay there, so the ablation measures what it claims to.

``python tests/test_rewards_farming.py --cases 40 --search 300`` measures the largest excess
per preset, shaping mode and pattern, and counts the generated cases over EPSILON (it builds
its own small basin; run it with ``PYTHONPATH=<tree>`` to measure another tree's code).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, target
from hypothesis import strategies as st

from hydroagent_hpc.config import EnvConfig, RewardConfig, preset
from hydroagent_hpc.env.environment import CalibrationEnv
from hydroagent_hpc.params import PARAMS, TUNABLE
from hydroagent_hpc.sim.basin import load_basin
from hydroagent_hpc.sim.synth.basins import read_truth
from hydroagent_hpc.types import Basin, Episode

EPSILON = 0.05  # issue 32, item 3: the most any transcript may earn over the direct one with safe shaping
TOL = 1e-9  # float summation noise; the safe properties are exact up to this
MAX_TURNS = 50  # both presets
PREFIX_MAX = 40  # farming calls before the reached set is set, run and evaluated
PARSE_STREAK = 3  # both presets end an episode at the 4th parse failure in a row

Params = dict[str, float]
Step = tuple[str, Mapping[str, float]]  # ("set", values) | ("run", {}) | ("eval", {}) | ("bad", {}) | ("text", {})


# ---------------------------------------------------------------------------- transcripts
def lerp(a: Mapping[str, float], b: Mapping[str, float], t: float) -> Params:
    """The parameter set a + t (b - a), clipped to the bounds (the environment would clip too)."""
    out = {}
    for k in TUNABLE:
        v = a[k] + t * (b[k] - a[k])
        out[k] = min(max(v, PARAMS[k].lower), PARAMS[k].upper)
    return out


def direct(params: Mapping[str, float]) -> list[Step]:
    return [("set", dict(params)), ("run", {}), ("eval", {})]


def _noop(current: Mapping[str, float], n: int) -> Step:
    names = [TUNABLE[(n * 7 + i) % len(TUNABLE)] for i in range(1 + n % 3)]
    return ("set", {k: current[k] for k in names})


def _block(kind: str, n: int, current: Params, goal: Params, other: Params) -> tuple[list[Step], Params]:
    """One farming block of ``n`` repetitions played from the parameter state ``current``: its steps and the
    state it leaves. A ladder ends one rung below ``goal``; the other blocks end where they started or at a
    set no better than ``current``."""
    if kind == "noop":  # padding: set values the parameters already have
        return [_noop(current, n)] * n, current
    if kind == "roundtrip":  # padding that changes the state and changes it back
        steps: list[Step] = []
        for i in range(n):
            steps += [("set", lerp(current, other, (i + 1) / (n + 1))), ("set", dict(current))]
        return steps, current
    if kind == "unrun":  # new sets, never run, then back
        return [("set", lerp(current, other, (i + 1) / (n + 1))) for i in range(n)] + [("set", dict(current))], current
    if kind == "spam":
        return [("run", {})] * n, current
    if kind == "unevaluated":  # new sets run, never evaluated, then back
        steps = []
        for i in range(n):
            steps += [("set", lerp(current, other, (i + 1) / (n + 1))), ("run", {})]
        return steps + [("set", dict(current))], current
    if kind == "repeat":
        return [("run", {}), ("eval", {})] * n, current
    if kind == "stale":  # evaluates with no fresh run
        return [("eval", {})] * n, current
    if kind == "oscillate":  # run/evaluate pairs alternating between two sets
        away = lerp(current, other, 0.5)
        steps = []
        for i in range(n):
            steps += direct(away if i % 2 == 0 else current)
        return steps, current if n % 2 == 0 else away
    if kind == "ladder":  # sandbagging: worse sets first, each better than the last
        steps = []
        for i in range(n):
            steps += direct(lerp(other, goal, i / n))
        return steps, lerp(other, goal, (n - 1) / n)
    if kind == "explore":  # other sets between the poor one and the current one, in no order
        steps = []
        for i in range(n):
            steps += direct(lerp(other, current, ((i + 1) * 0.618) % 1.0))
        return steps + [("set", dict(current))], current
    if kind == "descend":  # worse and worse sets (after the best: the patience rule may end the episode)
        steps = []
        for i in range(n):
            steps += direct(lerp(current, other, (i + 1) / n))
        return steps, lerp(current, other, 1.0)
    if kind == "invalid":  # invalid set_parameters calls (an unknown parameter): parse failures
        return [("bad", {})] * n, current
    if kind == "text":  # messages without a tool call: parse failures
        return [("text", {})] * n, current
    raise ValueError(kind)


SAME_STATE = ("noop", "spam", "repeat", "stale", "invalid", "text")  # farming that never leaves the reached set
CLASSES: dict[str, tuple[str, ...]] = {
    "padding": ("noop", "roundtrip", "unrun"),
    "spamming": ("spam", "unevaluated"),
    "repeating": ("repeat", "stale"),
    "oscillating": ("oscillate",),
    "sandbagging": ("ladder",),
    "exploring": ("explore", "descend"),
    "invalid-then-valid": ("invalid", "text"),
}
ANY = tuple(k for kinds in CLASSES.values() for k in kinds)
CLASSES["mixed"] = ANY
PARSE_KINDS = ("invalid", "text")


@dataclass(frozen=True)
class Recipe:
    """What a generated transcript is made of (kept for the failure report)."""

    quality: float  # where the reached set lies between the start (0: the start itself) and the truth (1)
    before: tuple[tuple[Any, ...], ...]
    after: tuple[tuple[Any, ...], ...]
    target_nse: float
    end: str = "stop"  # stop: the policy stops; cap: no-op calls up to the 50-call cap


def build(recipe: Recipe, start: Mapping[str, float], truth: Mapping[str, float],
          bad: Mapping[str, float]) -> tuple[list[Step], Params]:
    """The transcript of ``recipe`` and the parameter set it means to reach."""
    goal = lerp(start, truth, recipe.quality)
    steps: list[Step] = []
    state, streak = dict(start), 0

    def add(kind: str, n: int, room: int) -> None:
        nonlocal steps, state, streak
        block, after = _block(kind, n, state, goal, dict(bad))
        run = streak + n if kind in PARSE_KINDS else 0
        if len(steps) + len(block) > room or run > PARSE_STREAK:
            return  # keep the direct part inside the 50-call episode, and the episode alive
        steps += block
        state, streak = after, run

    for kind, n in recipe.before:
        add(kind, n, PREFIX_MAX)
    steps += direct(goal)
    state, streak = dict(goal), 0
    for kind, n in recipe.after:
        add(kind, n, 10 * MAX_TURNS)
    if recipe.end == "cap":
        steps += [_noop(state, 1)] * max(0, MAX_TURNS - len(steps))
    return steps, goal


def recipes(before: Sequence[str], after: Sequence[str], max_blocks: int = 3,
            max_n: int = 8) -> st.SearchStrategy[Recipe]:
    def blocks(kinds: Sequence[str]) -> st.SearchStrategy[tuple[tuple[Any, ...], ...]]:
        one = st.tuples(st.sampled_from(list(kinds)), st.integers(1, max_n))
        return st.lists(one, max_size=max_blocks).map(tuple)

    return st.builds(Recipe, quality=st.sampled_from([0.0, 0.25, 0.6, 0.85, 1.0]), before=blocks(before),
                     after=blocks(after), target_nse=st.sampled_from([0.999, 0.6]),
                     end=st.sampled_from(["stop", "cap"]))


def random_recipe(rng: random.Random, kinds: Sequence[str], max_blocks: int = 4, max_n: int = 13) -> Recipe:
    """A recipe drawn from ``rng`` (the measurement's generator: the same cases for any tree)."""
    def blocks() -> tuple[tuple[Any, ...], ...]:
        return tuple((rng.choice(list(kinds)), rng.randint(1, max_n)) for _ in range(rng.randint(0, max_blocks)))

    return Recipe(quality=rng.choice([0.0, 0.25, 0.6, 0.85, 1.0]), before=blocks(), after=blocks(),
                  target_nse=rng.choice([0.999, 0.6]), end=rng.choice(["stop", "cap"]))


# ---------------------------------------------------------------------------- episodes
def play(basin: Basin, sim: Any, cfg: EnvConfig, steps: Sequence[Step]) -> Episode:
    env = CalibrationEnv(basin, sim, cfg, agent="farming-test")
    for tool, values in steps:
        if env.done:
            break
        if tool == "set":
            env.set_parameters(**values)
        elif tool == "run":
            env.run_simulation()
        elif tool == "eval":
            env.evaluate()
        elif tool == "bad":
            env.set_parameters(no_such_parameter=1.0)
        else:
            env.step("The parameters look reasonable; I will think about it.")
    return env.episode()


@dataclass
class Judge:
    """Plays a transcript and its direct counterpart; keeps the largest excess and the cases over
    EPSILON per label."""

    basin: Basin
    sim: Any
    largest: dict[str, float] = field(default_factory=dict)
    cases: dict[str, int] = field(default_factory=dict)
    over: dict[str, int] = field(default_factory=dict)

    def excess(self, cfg: EnvConfig, steps: Sequence[Step],
               label: str = "") -> tuple[float, Episode, Episode] | None:
        """The excess of ``steps`` over its direct counterpart; None when it credits no evaluation."""
        ep = play(self.basin, self.sim, cfg, steps)
        if ep.best_params is None:
            return None
        ref = play(self.basin, self.sim, cfg, direct({k: ep.best_params[k] for k in TUNABLE}))
        assert ref.best_nse == ep.best_nse, "the direct counterpart reaches the same best NSE"
        gain = ep.total_reward - ref.total_reward
        if label:
            self.largest[label] = max(self.largest.get(label, -math.inf), gain)
            self.cases[label] = self.cases.get(label, 0) + 1
            self.over[label] = self.over.get(label, 0) + (gain > EPSILON + TOL)
        return gain, ep, ref


BONUSES = ("set_parameters_ok", "simulation_ok", "eval_bonus", "improve_bonus", "shaping_cap")


def shaping_of(ep: Episode) -> float:
    """The activity bonuses an episode was paid (the budget's cuts included)."""
    terms = [t.reward_terms for t in ep.turns] + [ep.terminal_terms]
    return sum(v for tt in terms for k, v in tt.items() if k in BONUSES)


def budget_of(cfg: EnvConfig) -> float:
    """B = b_min + shaping_cap as docs/guarantees.md states it: b_min is what run, evaluate is paid."""
    rw: RewardConfig = cfg.rewards
    runs_paid = rw.per_turn and cfg.protocol == "turns"
    return (max(0.0, rw.simulation_ok) if runs_paid else 0.0) + max(0.0, rw.eval_bonus) + rw.shaping_cap


def config(name: str, shaping: str | None, target_nse: float, protocol: str = "turns") -> EnvConfig:
    rewards = {} if shaping is None else {"rewards": {"shaping": shaping}}
    return preset(name, target_nse=target_nse, protocol=protocol, **rewards)


# ---------------------------------------------------------------------------- the search
def pool_of(start: Params, truth: Params, bad: Params, rng: random.Random, n_random: int = 6) -> list[Params]:
    """Parameter sets the search jumps between: the start, the truth, a poor set, corners, points between
    them and a few uniform random ones."""
    lower = {k: PARAMS[k].lower for k in TUNABLE}
    upper = {k: PARAMS[k].upper for k in TUNABLE}
    pool = [start, truth, bad, lower, upper]
    pool += [lerp(start, truth, q) for q in (0.25, 0.5, 0.85)] + [lerp(bad, truth, q) for q in (0.25, 0.5, 0.75)]
    pool += [{k: rng.uniform(PARAMS[k].lower, PARAMS[k].upper) for k in TUNABLE} for _ in range(n_random)]
    return [dict(p) for p in pool]


def mutate(steps: Sequence[Step], rng: random.Random, pool: Sequence[Params]) -> list[Step]:
    """One random edit of a transcript: insert a call, a direct block or a ladder; delete or duplicate a
    stretch; move a set to another point."""
    out = list(steps)
    at = rng.randint(0, len(out))
    move = rng.randrange(7)
    if move == 0:
        out.insert(at, rng.choice([("run", {}), ("eval", {}), ("bad", {}), ("text", {}),
                                   ("set", rng.choice(pool))]))
    elif move == 1:
        out[at:at] = direct(rng.choice(pool))
    elif move == 2:
        a, b, n = rng.choice(pool), rng.choice(pool), rng.randint(2, 12)
        out[at:at] = [s for i in range(n) for s in direct(lerp(a, b, i / n))]
    elif move == 3 and out:
        i = rng.randrange(len(out))
        del out[i:i + rng.randint(1, 4)]
    elif move == 4 and out:
        i = rng.randrange(len(out))
        j = min(len(out), i + rng.randint(1, 9))
        out[j:j] = out[i:j]
    elif move == 5:
        sets = [i for i, (tool, _) in enumerate(out) if tool == "set"]
        if sets:
            i = rng.choice(sets)
            out[i] = ("set", lerp(out[i][1] if len(out[i][1]) == len(TUNABLE) else rng.choice(pool),
                                  rng.choice(pool), rng.choice([0.1, 0.5, 1.0])))
    else:
        out[at:at] = [("run", {}), ("eval", {})] * rng.randint(1, 4)
    return out[: MAX_TURNS + 5]


def search(judge: Judge, cfg: EnvConfig, seeds: Sequence[Sequence[Step]], pool: Sequence[Params],
           iterations: int, rng: random.Random, label: str = "") -> tuple[float, list[Step]]:
    """Hill climbing on the excess from the best seed: a mutation is kept when it earns at least as much."""
    best_gain, best = -math.inf, list(seeds[0])
    for seed in seeds:
        got = judge.excess(cfg, seed, label)
        if got is not None and got[0] > best_gain:
            best_gain, best = got[0], list(seed)
    for _ in range(iterations):
        cand = mutate(best, rng, pool)
        got = judge.excess(cfg, cand, label)
        if got is not None and got[0] >= best_gain:
            best_gain, best = got[0], cand
    return best_gain, best


def seeds_of(start: Params, truth: Params, bad: Params) -> list[list[Step]]:
    """The search's starting transcripts: the direct ones, and the ladders that paid most before."""
    goal = lerp(start, truth, 0.85)
    ladder7 = [s for i in range(6) for s in direct(lerp(bad, goal, i / 6))] + direct(goal)
    # a ladder to the start itself, from the poor set (the rungs near it are worse than the start): its direct
    # transcript is run, evaluate, without a set_parameters, the case where the bound is tight
    to_start = [s for t in (0.0, 0.04, 0.08, 0.12) for s in direct(lerp(bad, start, t))] + direct(start)
    return [direct(goal), [("run", {}), ("eval", {})], ladder7, to_start]


# ---------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def basin(small_basin_dir: Path) -> Basin:
    return load_basin(small_basin_dir)


@pytest.fixture(scope="module")
def points(small_basin_dir: Path, small_sim: Any) -> tuple[Params, Params, Params]:
    """(start, truth, bad): the initial parameters, the synthetic truth and a poor but valid set."""
    start = {k: float(v) for k, v in small_sim.base_params.items() if k in TUNABLE}
    truth = {k: float(v) for k, v in read_truth(small_basin_dir)["multipliers"].items() if k in TUNABLE}
    bad = lerp(start, {k: PARAMS[k].upper for k in TUNABLE}, 0.6)
    return start, truth, bad


@pytest.fixture(scope="module")
def judge(basin: Basin, small_sim: Any) -> Judge:
    return Judge(basin, small_sim)


FAST = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


# ---------------------------------------------------------------------------- properties
@pytest.mark.parametrize("name", ["paper", "released"])
@FAST
@given(recipe=recipes(before=("noop",), after=SAME_STATE))
def test_farming_the_reached_set_earns_nothing(name: str, recipe: Recipe, judge: Judge, points: Any) -> None:
    steps, _ = build(recipe, *points)
    got = judge.excess(config(name, None, recipe.target_nse), steps)
    assert got is not None, "the direct part is always played"
    gain, ep, ref = got
    target(gain, label=f"same-state excess {name}")
    assert gain <= TOL, (f"{name}: {recipe} earned {gain:+.6f} more than the direct transcript "
                         f"({ep.total_reward:.6f} vs {ref.total_reward:.6f})")


@pytest.mark.parametrize("name", ["paper", "released"])
@settings(FAST, max_examples=40)
@given(recipe=recipes(before=ANY, after=ANY, max_n=13))
def test_no_transcript_beats_the_direct_one_by_more_than_epsilon(name: str, recipe: Recipe, judge: Judge,
                                                                 points: Any) -> None:
    steps, _ = build(recipe, *points)
    cfg = config(name, None, recipe.target_nse)
    got = judge.excess(cfg, steps)
    assert got is not None, "the direct part is always played"
    gain, ep, ref = got
    target(gain, label=f"excess {name}")
    assert gain <= EPSILON + TOL, (f"{name}: {recipe} earned {gain:+.6f} more than the direct transcript, "
                                   f"over {EPSILON} ({ep.total_reward:.6f} vs {ref.total_reward:.6f})")
    assert gain <= cfg.rewards.shaping_cap + TOL  # the configured epsilon is the documented one
    assert shaping_of(ep) <= budget_of(cfg) + TOL  # the budget B holds for the bonuses alone
    assert gain <= budget_of(cfg) - shaping_of(ref) + TOL  # the tighter bound: what B leaves over the direct's


@pytest.mark.parametrize("name", ["paper", "released"])
def test_a_search_over_transcripts_finds_no_excess_over_epsilon(name: str, judge: Judge, points: Any) -> None:
    """A seeded local search from the ladders that paid most before (the issue's ladder of seven earned +0.11
    in released) climbs no higher than EPSILON, and finds the bound where it is tight (a ladder whose best is
    the start, which the direct transcript reaches without a set_parameters)."""
    start, truth, bad = points
    rng = random.Random(f"farming-{name}")
    cfg = config(name, None, 0.999)
    gain, best = search(judge, cfg, seeds_of(start, truth, bad), pool_of(start, truth, bad, rng), 25, rng)
    assert gain <= EPSILON + TOL, f"{name}: the search found {gain:+.6f} over the direct transcript with {best}"
    assert gain >= EPSILON - TOL, f"{name}: the search found only {gain:+.6f}: the tight case is gone"


@pytest.mark.parametrize("name", ["paper", "released"])
@settings(FAST, max_examples=15)
@given(recipe=recipes(before=ANY, after=ANY, max_n=13))
def test_the_rounds_protocol_keeps_the_bound(name: str, recipe: Recipe, judge: Judge, points: Any) -> None:
    """The rounds protocol pays no run bonus; its budget counts none either."""
    steps, _ = build(recipe, *points)
    cfg = config(name, None, recipe.target_nse, protocol="rounds")
    got = judge.excess(cfg, steps)
    if got is None:
        return  # a round's candidates all lost to an earlier best: nothing credited to compare
    gain, ep, ref = got
    target(gain, label=f"rounds excess {name}")
    assert gain <= EPSILON + TOL, f"{name}/rounds: {recipe} earned {gain:+.6f} more than the direct transcript"


# ---------------------------------------------------------------------------- the issue's farms
def total(basin: Basin, sim: Any, cfg: EnvConfig, steps: Sequence[Step]) -> float:
    return play(basin, sim, cfg, steps).total_reward


@pytest.mark.parametrize("shaping", ["safe", "literal"])
def test_the_farms_the_issues_name(shaping: str, basin: Basin, small_sim: Any, points: Any) -> None:
    """The four farms of issue 13 and the ladder of issue 32: paid as written under literal shaping (the
    ablation), within EPSILON under safe, where the first valid change and run are still paid."""
    start, truth, bad = points
    goal = lerp(start, truth, 0.85)
    paper = config("paper", shaping, 0.999)
    released = config("released", shaping, 0.999)
    rw = paper.rewards
    literal = shaping == "literal"
    run_alone = total(basin, small_sim, paper, [("run", {})])
    assert run_alone == pytest.approx(rw.empty_penalty + rw.simulation_ok)  # a valid run is worth its bonus
    padded = total(basin, small_sim, paper, [("set", {"wm": start["wm"]})] * 47 + [("run", {})])
    assert padded - run_alone == pytest.approx(47 * rw.set_parameters_ok if literal else 0.0)
    spammed = total(basin, small_sim, paper, [("run", {})] * 50)
    assert spammed == pytest.approx(rw.empty_penalty + (50 if literal else 1) * rw.simulation_ok)
    changed = total(basin, small_sim, paper, [("set", goal), ("run", {})])
    assert changed - run_alone == pytest.approx(rw.set_parameters_ok)  # a valid change is worth its bonus
    straight = total(basin, small_sim, released, direct(goal))
    pairs = total(basin, small_sim, released, direct(goal) + [("run", {}), ("eval", {})] * 10)
    assert pairs - straight == pytest.approx(10 * rw.eval_bonus if literal else 0.0)
    ladder = [step for i in range(6) for step in direct(lerp(bad, goal, i / 6))] + direct(goal)
    for cfg in (paper, released):
        ep = play(basin, small_sim, cfg, ladder)
        ref = play(basin, small_sim, cfg, direct(goal))
        assert ep.best_params is not None and ep.best_nse == ref.best_nse
        gain = ep.total_reward - ref.total_reward
        if literal:
            improvements = ep.counters["improvements"]
            assert improvements >= 3
            per_rung = rw.eval_bonus + (rw.set_parameters_ok + rw.simulation_ok if cfg.rewards.per_turn else 0.0)
            assert gain == pytest.approx(6 * per_rung + (improvements - 1) * rw.improve_bonus)
        else:
            assert 0.0 < gain <= EPSILON + TOL, (cfg.preset, gain)


# ---------------------------------------------------------------------------- main: measure
def measure(cases: int, iterations: int, shapings: Sequence[str | None],
            protocols: Sequence[str] = ("turns",)) -> Judge:
    """The largest excess per preset, shaping mode, protocol and pattern, and the cases over EPSILON."""
    import tempfile

    from hydroagent_hpc.sim.embedded import EmbeddedSimulator
    from hydroagent_hpc.sim.synth.basins import synthesize_basin

    control = synthesize_basin(Path(tempfile.mkdtemp()) / "syn_small", name="syn_small", area_km2=80.0,
                               window_days=10, warmup_days=3, seed=7, start="2021-07-01")
    sim = EmbeddedSimulator(control, cache_dir=False)
    start = {k: float(v) for k, v in sim.base_params.items() if k in TUNABLE}
    truth = {k: float(v) for k, v in read_truth(control.parent)["multipliers"].items() if k in TUNABLE}
    pts = (start, truth, lerp(start, {k: PARAMS[k].upper for k in TUNABLE}, 0.6))
    judge = Judge(load_basin(control.parent), sim)
    for protocol in protocols:
        for name in ("paper", "released"):
            for shaping in shapings:
                mode = shaping or "default"
                for cls, kinds in CLASSES.items():
                    rng = random.Random(f"{cls}-{name}")  # the same cases whatever the tree
                    for _ in range(cases):
                        recipe = random_recipe(rng, kinds)
                        steps, _ = build(recipe, *pts)
                        judge.excess(config(name, shaping, recipe.target_nse, protocol), steps,
                                     f"{protocol}|{name}|{mode}|{cls}")
                if iterations:
                    rng = random.Random(f"search-{name}")
                    search(judge, config(name, shaping, 0.999, protocol), seeds_of(*pts),
                           pool_of(*pts, rng=rng), iterations, rng, f"{protocol}|{name}|{mode}|search")
    return judge


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=40, help="generated recipes per preset and pattern")
    ap.add_argument("--search", type=int, default=300, help="search iterations per preset")
    ap.add_argument("--shaping", nargs="*", default=["safe", "literal"], help="'none' = the preset's default")
    ap.add_argument("--protocol", nargs="*", default=["turns"], choices=["turns", "rounds"])
    a = ap.parse_args()
    j = measure(a.cases, a.search, [None if s == "none" else s for s in a.shaping], a.protocol)
    rows: dict[tuple[str, str, str], dict[str, str]] = {}
    for label in j.largest:
        protocol, name, mode, cls = label.split("|")
        rows.setdefault((protocol, mode, cls), {})[name] = (f"{j.largest[label]:+.3f} ({j.over[label]}/"
                                                            f"{j.cases[label]} over {EPSILON})")
    print("largest excess over the direct transcript (cases over EPSILON / cases that credit an evaluation)")
    print("| protocol | shaping | pattern | paper | released |")
    print("|---|---|---|---|---|")
    for (protocol, mode, cls), by in rows.items():
        print(f"| {protocol} | {mode} | {cls} | {by.get('paper', '')} | {by.get('released', '')} |")
