"""Shaping rewards cannot be farmed (issue 13, item 5).

Real CalibrationEnv episodes on the small synthetic basin, driven through the direct tool
interface. A transcript reaches some best NSE; its *direct* counterpart sets that best
parameter set, runs it and evaluates it, nothing else. Farming is any activity that is paid
without reaching a better result:

* padding: set_parameters calls that change nothing (or change and change back),
* spamming: repeated run_simulation of the same parameters, never evaluated,
* repeating: identical run/evaluate pairs,
* sandbagging: a ladder of deliberately worse parameter sets climbing to the best.

Properties (``shaping: safe``, both presets): farming at the best parameter set earns nothing
(excess <= 1e-9); no generated transcript earns more than its direct counterpart by more than
``RewardConfig.shaping_cap`` (the documented epsilon). ``shaping: literal`` keeps the paper's
and the released code's constants for ablations, and the farms the issue names still pay
there, so the ablation measures what it claims to.

``python tests/test_rewards_farming.py --examples 100`` measures the largest excess the
generator finds per preset, shaping mode and farming class (it builds its own small basin);
``--shaping none`` measures a tree that has no ``shaping`` option (the code before the fix).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, target
from hypothesis import strategies as st

from hydroagent_hpc.config import EnvConfig, preset
from hydroagent_hpc.env.environment import CalibrationEnv
from hydroagent_hpc.params import PARAMS, TUNABLE
from hydroagent_hpc.sim.basin import load_basin
from hydroagent_hpc.sim.synth.basins import read_truth
from hydroagent_hpc.types import Basin, Episode

TOL = 1e-9  # float summation noise; the safe properties are exact up to this

PREFIX_MAX = 40  # farming calls before the reached set is set, run and evaluated (max_turns is 50)
Step = tuple[str, Mapping[str, float]]  # ("set", values) | ("run", {}) | ("eval", {})


# ---------------------------------------------------------------------------- transcripts
def lerp(a: Mapping[str, float], b: Mapping[str, float], t: float) -> dict[str, float]:
    """The parameter set a + t (b - a), clipped to the bounds (the environment would clip too)."""
    out = {}
    for k in TUNABLE:
        v = a[k] + t * (b[k] - a[k])
        out[k] = min(max(v, PARAMS[k].lower), PARAMS[k].upper)
    return out


def direct(params: Mapping[str, float]) -> list[Step]:
    return [("set", dict(params)), ("run", {}), ("eval", {})]


@dataclass(frozen=True)
class Recipe:
    """What a generated transcript is made of (kept for the failure report)."""

    quality: float  # where the reached set lies between the start (0) and the truth (1)
    before: tuple[tuple[Any, ...], ...]
    after: tuple[tuple[Any, ...], ...]
    target_nse: float


def _block(kind: str, n: int, current: Mapping[str, float], goal: Mapping[str, float],
           other: Mapping[str, float]) -> list[Step]:
    """One farming block played from state ``current``; it leaves the state as it found it,
    except a ladder, which ends one rung below ``goal`` (see :func:`_after`)."""
    if kind == "noop":  # padding: set values the parameters already have
        names = [TUNABLE[(n * 7 + i) % len(TUNABLE)] for i in range(1 + n % 3)]
        return [("set", {k: current[k] for k in names})] * n
    if kind == "roundtrip":  # padding that changes the state and changes it back
        steps: list[Step] = []
        for i in range(n):
            steps += [("set", lerp(current, other, (i + 1) / (n + 1))), ("set", dict(current))]
        return steps
    if kind == "spam":
        return [("run", {})] * n
    if kind == "repeat":
        return [("run", {}), ("eval", {})] * n
    if kind == "stale":  # evaluates with no fresh run
        return [("eval", {})] * n
    if kind == "ladder":  # sandbagging: worse sets first, each better than the last
        steps = []
        for i in range(n):
            steps += direct(lerp(other, goal, i / n))
        return steps
    raise ValueError(kind)


def _after(kind: str, n: int, current: Mapping[str, float], goal: Mapping[str, float],
           other: Mapping[str, float]) -> dict[str, float]:
    """The parameter state after a block."""
    return lerp(other, goal, (n - 1) / n) if kind == "ladder" else dict(current)


def build(recipe: Recipe, start: Mapping[str, float], truth: Mapping[str, float],
          bad: Mapping[str, float]) -> tuple[list[Step], dict[str, float]]:
    """The transcript of ``recipe`` and the parameter set it means to reach."""
    goal = lerp(start, truth, recipe.quality)
    steps: list[Step] = []
    state = dict(start)
    for kind, n in recipe.before:
        block = _block(kind, n, state, goal, bad)
        if len(steps) + len(block) > PREFIX_MAX:
            continue  # keep the direct part inside both presets' 50-call episode
        steps += block
        state = _after(kind, n, state, goal, bad)
    steps += direct(goal)
    state = dict(goal)
    for kind, n in recipe.after:
        steps += _block(kind, n, state, goal, bad)
        state = _after(kind, n, state, goal, bad)
    return steps, goal


SAME_STATE = ("noop", "spam", "repeat", "stale")  # farming that never leaves the reached set
ANY = SAME_STATE + ("roundtrip", "ladder")
CLASSES = {"padding": ("noop", "roundtrip"), "spamming": ("spam",), "repeating": ("repeat", "stale"),
           "sandbagging": ("ladder",), "mixed": ANY}


def recipes(before: Sequence[str], after: Sequence[str], max_blocks: int = 3) -> st.SearchStrategy[Recipe]:
    def blocks(kinds: Sequence[str]) -> st.SearchStrategy[tuple[tuple[Any, ...], ...]]:
        one = st.tuples(st.sampled_from(list(kinds)), st.integers(1, 8))
        return st.lists(one, max_size=max_blocks).map(tuple)

    return st.builds(Recipe, quality=st.sampled_from([0.25, 0.6, 0.85, 1.0]), before=blocks(before),
                     after=blocks(after), target_nse=st.sampled_from([0.999, 0.6]))


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
        else:
            env.evaluate()
    return env.episode()


class Judge:
    """Plays a transcript and its direct counterpart; keeps the largest excess per label."""

    def __init__(self, basin: Basin, sim: Any) -> None:
        self.basin, self.sim = basin, sim
        self.largest: dict[str, float] = {}

    def excess(self, cfg: EnvConfig, steps: Sequence[Step], label: str = "") -> tuple[float, Episode, Episode]:
        ep = play(self.basin, self.sim, cfg, steps)
        assert ep.best_params is not None, "every generated transcript reaches a credited evaluation"
        ref = play(self.basin, self.sim, cfg, direct({k: ep.best_params[k] for k in TUNABLE}))
        assert ref.best_nse == ep.best_nse, "the direct counterpart reaches the same best NSE"
        gain = ep.total_reward - ref.total_reward
        label = f"{cfg.preset}/{getattr(cfg.rewards, 'shaping', 'unfixed')}{'/' + label if label else ''}"
        self.largest[label] = max(self.largest.get(label, -math.inf), gain)
        return gain, ep, ref


BONUSES = ("set_parameters_ok", "simulation_ok", "eval_bonus", "improve_bonus", "shaping_cap")


def shaping_of(ep: Episode) -> float:
    """The activity bonuses an episode was paid (the cap's cuts included)."""
    terms = [t.reward_terms for t in ep.turns] + [ep.terminal_terms]
    return sum(v for tt in terms for k, v in tt.items() if k in BONUSES)


def config(name: str, shaping: str | None, target_nse: float) -> EnvConfig:
    rewards = {} if shaping is None else {"rewards": {"shaping": shaping}}
    return preset(name, target_nse=target_nse, **rewards)


@pytest.fixture(scope="module")
def basin(small_basin_dir: Path) -> Basin:
    return load_basin(small_basin_dir)


@pytest.fixture(scope="module")
def points(small_basin_dir: Path, small_sim: Any) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
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
    gain, ep, ref = judge.excess(config(name, None, recipe.target_nse), steps)
    target(gain, label=f"same-state excess {name}")
    assert gain <= TOL, (f"{name}: {recipe} earned {gain:+.6f} more than the direct transcript "
                         f"({ep.total_reward:.6f} vs {ref.total_reward:.6f})")


@pytest.mark.parametrize("name", ["paper", "released"])
@FAST
@given(recipe=recipes(before=ANY, after=ANY))
def test_no_farming_beats_the_direct_transcript_by_more_than_epsilon(name: str, recipe: Recipe, judge: Judge,
                                                                    points: Any) -> None:
    steps, _ = build(recipe, *points)
    cfg = config(name, None, recipe.target_nse)
    gain, ep, ref = judge.excess(cfg, steps)
    target(gain, label=f"excess {name}")
    eps = cfg.rewards.shaping_cap
    assert gain <= eps + TOL, (f"{name}: {recipe} earned {gain:+.6f} more than the direct transcript, "
                               f"over epsilon {eps} ({ep.total_reward:.6f} vs {ref.total_reward:.6f})")
    assert gain <= eps - shaping_of(ref) + TOL  # the tighter bound: what the cap leaves over the direct's bonuses
    assert shaping_of(ep) <= eps + TOL


# ---------------------------------------------------------------------------- the issue's farms
def total(basin: Basin, sim: Any, cfg: EnvConfig, steps: Sequence[Step]) -> float:
    return play(basin, sim, cfg, steps).total_reward


@pytest.mark.parametrize("shaping", ["safe", "literal"])
def test_the_farms_the_issue_names(shaping: str, basin: Basin, small_sim: Any, points: Any) -> None:
    """The four farms of issue 13: paid as written under literal shaping (the ablation), not under safe."""
    start, truth, bad = points
    goal = lerp(start, truth, 0.85)
    paper = config("paper", shaping, 0.999)
    released = config("released", shaping, 0.999)
    rw = paper.rewards
    literal = shaping == "literal"
    run_alone = total(basin, small_sim, paper, [("run", {})])
    padded = total(basin, small_sim, paper, [("set", {"wm": start["wm"]})] * 47 + [("run", {})])
    assert padded - run_alone == pytest.approx(47 * rw.set_parameters_ok if literal else 0.0)
    spammed = total(basin, small_sim, paper, [("run", {})] * 50)
    assert spammed == pytest.approx(rw.empty_penalty + (50 if literal else 1) * rw.simulation_ok)
    straight = total(basin, small_sim, released, direct(goal))
    pairs = total(basin, small_sim, released, direct(goal) + [("run", {}), ("eval", {})] * 10)
    assert pairs - straight == pytest.approx(10 * rw.eval_bonus if literal else 0.0)
    ladder = [step for i in range(6) for step in direct(lerp(bad, goal, i / 6))] + direct(goal)
    ep = play(basin, small_sim, released, ladder)
    assert ep.best_params is not None and ep.best_nse == play(basin, small_sim, released, direct(goal)).best_nse
    gain = ep.total_reward - straight
    if literal:
        improvements = ep.counters["improvements"]
        assert improvements >= 3
        assert gain == pytest.approx(6 * rw.eval_bonus + (improvements - 1) * rw.improve_bonus)
    else:
        assert 0.0 < gain <= rw.shaping_cap - rw.eval_bonus + TOL


# ---------------------------------------------------------------------------- main: measure
def measure(examples: int, shapings: Sequence[str | None]) -> dict[str, float]:
    """The largest excess the generator finds per preset and shaping mode."""
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

    def search_class(name: str, shaping: str | None, cls: str, kinds: tuple[str, ...]) -> None:
        # one search per (preset, shaping, class); its own scope binds them (not the loop's variables)
        @settings(max_examples=examples, deadline=None, database=None, derandomize=True)
        @given(recipe=recipes(before=kinds, after=kinds, max_blocks=4))
        def search(recipe: Recipe) -> None:
            steps, _ = build(recipe, *pts)
            gain, _, _ = judge.excess(config(name, shaping, recipe.target_nse), steps, cls)
            target(gain)

        search()

    for name in ("paper", "released"):
        for shaping in shapings:
            for cls, kinds in CLASSES.items():
                search_class(name, shaping, cls, kinds)
    return judge.largest


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=200)
    ap.add_argument("--shaping", nargs="*", default=["safe", "literal"], help="'none' = the preset's default")
    a = ap.parse_args()
    found = measure(a.examples, [None if s == "none" else s for s in a.shaping])
    for label, value in sorted(found.items()):
        print(f"{label:32s} largest excess over the direct transcript: {value:+.4f}")
