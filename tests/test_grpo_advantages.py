"""Group-relative advantages (train/grpo/advantages.py): every mode against numbers worked out by hand.

The fixed group below has four rollouts with 2, 1, 2 and 1 assistant turns::

    turn rewards  [[2, 1], [0], [1, 2], [0]]     terminal rewards  [4, 0, 3, 3]

- episode:  R = [2+1+4, 0+0, 1+2+3, 0+3] = [7, 0, 6, 3]; mean 16/4 = 4; deviations [3, -4, 2, -1];
  squares 9 + 16 + 4 + 1 = 30; sample variance 30/3 = 10; std sqrt(10).
- released: R = terminals = [4, 0, 3, 3]; mean 10/4 = 2.5; deviations [1.5, -2.5, 0.5, 0.5];
  squares 2.25 + 6.25 + 0.25 + 0.25 = 9; sample variance 9/3 = 3; std sqrt(3).
- turn, gamma 0.5 (the terminal joins the last turn's reward):
  rollout 0: r' = [2, 1+4] -> G = [2 + 0.5*5, 5] = [4.5, 5]; rollout 1: r' = [0+0] -> G = [0];
  rollout 2: r' = [1, 2+3] -> G = [1 + 0.5*5, 5] = [3.5, 5]; rollout 3: r' = [0+3] -> G = [3].
  Pooled [4.5, 5, 0, 3.5, 5, 3]: sum 21, mean 21/6 = 3.5; deviations [1, 1.5, -3.5, 0, 1.5, -0.5];
  squares 1 + 2.25 + 12.25 + 0 + 2.25 + 0.25 = 18; sample variance 18/5 = 3.6; std sqrt(3.6).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from hydroagent_hpc.train.grpo.advantages import (
    ADVANTAGE_MODES,
    group_advantages,
    group_normalise,
    reward_to_go,
    token_advantages,
)

EPS = 1e-6
TURN_REWARDS = [[2.0, 1.0], [0.0], [1.0, 2.0], [0.0]]
TERMINALS = [4.0, 0.0, 3.0, 3.0]


def _assert_per_turn(actual: list[np.ndarray], expected: list[list[float]], *, rtol: float = 1e-12) -> None:
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a.shape == (len(e),)
        np.testing.assert_allclose(a, e, rtol=rtol, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# group_normalise


def test_group_normalise_by_hand() -> None:
    # [1, 2, 3, 6]: mean 12/4 = 3, deviations [-2, -1, 0, 3], squares 4+1+0+9 = 14, sample std sqrt(14/3)
    s = math.sqrt(14 / 3)
    np.testing.assert_allclose(group_normalise([1, 2, 3, 6]), [-2 / (s + EPS), -1 / (s + EPS), 0.0, 3 / (s + EPS)],
                               rtol=1e-12)
    np.testing.assert_allclose(group_normalise([1, 2, 3, 6], eps=0.0), [-2 / s, -1 / s, 0.0, 3 / s], rtol=1e-12)
    # Dr. GRPO: centred only
    np.testing.assert_allclose(group_normalise([1, 2, 3, 6], std=False), [-2.0, -1.0, 0.0, 3.0], rtol=0, atol=0)


def test_group_normalise_equal_single_and_empty_give_exact_zeros() -> None:
    # 0.1 is not exact in binary: a computed mean could leave a residue, the result must not
    for std in (True, False):
        out = group_normalise([0.1, 0.1, 0.1], std=std)
        assert np.array_equal(out, np.zeros(3))
        assert np.array_equal(group_normalise([5.0], std=std), np.zeros(1))
    assert group_normalise([]).shape == (0,)


def test_group_normalise_shift_and_scale_invariance() -> None:
    r = np.array([0.3, -1.2, 2.5, 0.7, 0.7])
    base = group_normalise(r)
    np.testing.assert_allclose(group_normalise(r + 17.0), base, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(group_normalise(r - 3.0, std=False), group_normalise(r, std=False), atol=1e-12)
    # with std scaling, c*R gives the same advantages (up to eps/std, about 1e-6 here)
    for c in (0.01, 3.0, 250.0):
        np.testing.assert_allclose(group_normalise(c * r), base, rtol=1e-4)
        np.testing.assert_allclose(group_normalise(c * r, eps=0.0), group_normalise(r, eps=0.0), rtol=1e-12)


def test_group_normalise_rejects_non_finite_naming_the_index() -> None:
    with pytest.raises(ValueError, match="index 2"):
        group_normalise([1.0, 2.0, math.nan])
    with pytest.raises(ValueError, match="index 0"):
        group_normalise([math.inf, 2.0])
    with pytest.raises(ValueError, match="one-dimensional"):
        group_normalise([[1.0, 2.0]])


# ---------------------------------------------------------------------------------------------
# reward_to_go


def test_reward_to_go_by_hand() -> None:
    # rewards [1, 2, 3], terminal 4 -> r' = [1, 2, 3+4 = 7]
    # gamma 0.5: G2 = 7, G1 = 2 + 0.5*7 = 5.5, G0 = 1 + 0.5*5.5 = 3.75
    np.testing.assert_array_equal(reward_to_go([1, 2, 3], 4.0, 0.5), [3.75, 5.5, 7.0])
    # gamma 1: plain sums 10, 9, 7 (G0 is the episode return); gamma 0: r' itself
    np.testing.assert_array_equal(reward_to_go([1, 2, 3], 4.0, 1.0), [10.0, 9.0, 7.0])
    np.testing.assert_array_equal(reward_to_go([1, 2, 3], 4.0, 0.0), [1.0, 2.0, 7.0])
    # no turns: an empty array, the terminal has nowhere to go
    assert reward_to_go([], 4.0, 0.5).shape == (0,)


@pytest.mark.parametrize("gamma", [-0.1, 1.5, math.nan])
def test_reward_to_go_rejects_gamma_outside_unit_interval(gamma: float) -> None:
    with pytest.raises(ValueError, match="gamma"):
        reward_to_go([1.0], 0.0, gamma)


# ---------------------------------------------------------------------------------------------
# group_advantages: the three modes by hand


def test_episode_mode_by_hand() -> None:
    s = math.sqrt(10)
    out = group_advantages(TURN_REWARDS, TERMINALS, mode="episode")
    np.testing.assert_array_equal(out.returns, [7.0, 0.0, 6.0, 3.0])
    assert (out.mean, out.degenerate) == (4.0, False)
    assert out.std == pytest.approx(s, rel=1e-12)
    a = [3 / (s + EPS), -4 / (s + EPS), 2 / (s + EPS), -1 / (s + EPS)]
    _assert_per_turn(out.per_turn, [[a[0], a[0]], [a[1]], [a[2], a[2]], [a[3]]])


def test_released_mode_by_hand() -> None:
    s = math.sqrt(3)
    out = group_advantages(TURN_REWARDS, TERMINALS, mode="released")
    np.testing.assert_array_equal(out.returns, [4.0, 0.0, 3.0, 3.0])
    assert (out.mean, out.degenerate) == (2.5, False)
    assert out.std == pytest.approx(s, rel=1e-12)
    a = [1.5 / (s + EPS), -2.5 / (s + EPS), 0.5 / (s + EPS), 0.5 / (s + EPS)]
    _assert_per_turn(out.per_turn, [[a[0], a[0]], [a[1]], [a[2], a[2]], [a[3]]])


def test_turn_mode_by_hand() -> None:
    s = math.sqrt(3.6)
    out = group_advantages(TURN_REWARDS, TERMINALS, mode="turn", gamma=0.5)
    np.testing.assert_array_equal(out.returns, [4.5, 0.0, 3.5, 3.0])  # G_i0
    assert (out.mean, out.degenerate) == (3.5, False)
    assert out.std == pytest.approx(s, rel=1e-12)
    _assert_per_turn(out.per_turn, [[1 / (s + EPS), 1.5 / (s + EPS)], [-3.5 / (s + EPS)],
                                    [0.0, 1.5 / (s + EPS)], [-0.5 / (s + EPS)]])
    # centred only: the deviations themselves
    centred = group_advantages(TURN_REWARDS, TERMINALS, mode="turn", gamma=0.5, std=False)
    _assert_per_turn(centred.per_turn, [[1.0, 1.5], [-3.5], [0.0, 1.5], [-0.5]])


def test_rollout_without_turns() -> None:
    # turn mode: nothing to credit (terminal 9 is lost), the pool is [4.5, 5, 0, 3.5, 5, 3] as before
    turn = group_advantages([*TURN_REWARDS, []], [*TERMINALS, 9.0], mode="turn", gamma=0.5, std=False)
    _assert_per_turn(turn.per_turn, [[1.0, 1.5], [-3.5], [0.0, 1.5], [-0.5], []])
    assert math.isnan(turn.returns[4])
    # episode mode: R = 9 takes part in the group statistics, but there is no turn to put it on
    episode = group_advantages([*TURN_REWARDS, []], [*TERMINALS, 9.0], mode="episode", std=False)
    np.testing.assert_array_equal(episode.returns, [7.0, 0.0, 6.0, 3.0, 9.0])  # mean 25/5 = 5
    _assert_per_turn(episode.per_turn, [[2.0, 2.0], [-5.0], [1.0, 1.0], [-2.0], []])


def test_equal_returns_are_degenerate_with_exact_zeros() -> None:
    # binary-exact rewards composed differently but summing to the same return 0.75
    out = group_advantages([[0.25, 0.5], [0.75], []], [0.0, 0.0, 0.75], mode="episode")
    assert out.degenerate
    _assert_per_turn(out.per_turn, [[0.0, 0.0], [0.0], []], rtol=0)
    assert all(np.array_equal(a, np.zeros(a.size)) for a in out.per_turn)
    # turn mode, gamma 1: G = [1, 1], [1] -> all equal
    turn = group_advantages([[0.0, 1.0], [1.0]], [0.0, 0.0], mode="turn", gamma=1.0)
    assert turn.degenerate and all(not a.any() for a in turn.per_turn)
    # released: per-turn rewards differ, terminals equal -> degenerate
    assert group_advantages([[1.0], [5.0, -2.0]], [0.5, 0.5], mode="released").degenerate
    # a group of one rollout, and a turn-mode pool of one turn
    assert group_advantages([[1.0, 2.0]], [3.0], mode="episode").degenerate
    assert group_advantages([[1.0], []], [3.0, 1.0], mode="turn").degenerate
    assert not group_advantages(TURN_REWARDS, TERMINALS, mode="turn").degenerate


@pytest.mark.parametrize("mode", ADVANTAGE_MODES)
def test_shift_and_scale_change_nothing(mode: str) -> None:
    base = group_advantages(TURN_REWARDS, TERMINALS, mode=mode, gamma=1.0)
    # + c on every terminal reward adds c to every return (and, with gamma 1, to every G_ij)
    shifted = group_advantages(TURN_REWARDS, [z + 10.0 for z in TERMINALS], mode=mode, gamma=1.0)
    for a, b in zip(shifted.per_turn, base.per_turn):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    # c > 0 times every reward scales every return and every G_ij (any gamma)
    base = group_advantages(TURN_REWARDS, TERMINALS, mode=mode, gamma=0.5)
    scaled = group_advantages([[7.0 * x for x in r] for r in TURN_REWARDS], [7.0 * z for z in TERMINALS],
                              mode=mode, gamma=0.5)
    for a, b in zip(scaled.per_turn, base.per_turn):
        np.testing.assert_allclose(a, b, rtol=1e-5)


def test_one_turn_reward_moves_episode_and_turn_but_not_released() -> None:
    bumped = [[2.0, 2.0], [0.0], [1.0, 2.0], [0.0]]  # r_01: 1 -> 2
    # episode: R_0 7 -> 8, so rollout 0's advantages change
    before = group_advantages(TURN_REWARDS, TERMINALS, mode="episode")
    after = group_advantages(bumped, TERMINALS, mode="episode")
    assert after.returns[0] == 8.0 and after.per_turn[0][0] > before.per_turn[0][0]
    # released: the per-turn reward is dropped, nothing at all changes
    before = group_advantages(TURN_REWARDS, TERMINALS, mode="released")
    after = group_advantages(bumped, TERMINALS, mode="released")
    assert all(np.array_equal(a, b) for a, b in zip(after.per_turn, before.per_turn))
    assert np.array_equal(after.returns, before.returns)
    # turn, gamma 0.5, centred: +1 on the last turn of rollout 0 gives G_01 + 1 and G_00 + 0.5
    # (discounted), the pooled mean moves by 1.5/6 = 0.25, every other turn's advantage by -0.25
    before = group_advantages(TURN_REWARDS, TERMINALS, mode="turn", gamma=0.5, std=False)
    after = group_advantages(bumped, TERMINALS, mode="turn", gamma=0.5, std=False)
    diff = [a - b for a, b in zip(after.per_turn, before.per_turn)]
    _assert_per_turn(diff, [[0.5 - 0.25, 1.0 - 0.25], [-0.25], [-0.25, -0.25], [-0.25]])
    # +1 on the FIRST turn of rollout 0 moves only G_00 (a later turn's G never sees an earlier reward)
    first = group_advantages([[3.0, 1.0], [0.0], [1.0, 2.0], [0.0]], TERMINALS, mode="turn", gamma=0.5, std=False)
    diff = [a - b for a, b in zip(first.per_turn, before.per_turn)]
    _assert_per_turn(diff, [[1.0 - 1 / 6, -1 / 6], [-1 / 6], [-1 / 6, -1 / 6], [-1 / 6]])


def test_group_advantages_errors() -> None:
    with pytest.raises(ValueError, match="episode, turn, released"):
        group_advantages(TURN_REWARDS, TERMINALS, mode="per-token")
    with pytest.raises(ValueError, match="terminal rewards"):
        group_advantages(TURN_REWARDS, TERMINALS[:3], mode="episode")
    with pytest.raises(ValueError, match="at least one rollout"):
        group_advantages([], [], mode="episode")
    with pytest.raises(ValueError, match="gamma"):
        group_advantages(TURN_REWARDS, TERMINALS, mode="turn", gamma=1.01)
    with pytest.raises(ValueError, match="index 1"):
        group_advantages(TURN_REWARDS, [0.0, math.nan, 0.0, 0.0], mode="released")


# ---------------------------------------------------------------------------------------------
# token_advantages


def test_token_advantages_placement() -> None:
    out = token_advantages([0.5, -1.0], [(2, 4), (6, 9)], 10)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [0, 0, 0.5, 0.5, 0, 0, -1, -1, -1, 0])
    # adjacent spans, a span reaching the end, an empty span, numpy input
    out = token_advantages(np.array([1.0, 2.0, 3.0]), [(0, 2), (2, 2), (2, 5)], 5)
    np.testing.assert_array_equal(out, [1, 1, 3, 3, 3])
    assert token_advantages([], [], 3).tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize(("per_turn", "spans", "match"), [
    ([1.0], [(0, 2), (3, 4)], "2 spans for 1"),
    ([1.0, 2.0], [(0, 3), (2, 4)], "starts before"),
    ([1.0, 2.0], [(4, 6), (0, 2)], "starts before"),
    ([1.0], [(3, 11)], "inside"),
    ([1.0], [(-1, 2)], "inside"),
    ([1.0], [(5, 4)], "inside"),
    ([math.nan], [(0, 1)], "finite"),
])
def test_token_advantages_rejects_bad_spans(per_turn: list[float], spans: list[tuple[int, int]], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        token_advantages(per_turn, spans, 10)


def test_the_valid_baseline_ranks_moves_at_full_scale_and_keeps_format_mistakes_negative():
    """Six valid members whose moves differ and two that wrote a malformed call (-0.5 each, a lost
    simulation): with the whole group's statistics the malformed members set the scale and the valid
    members' spread shrinks; with the valid members' baseline their advantages are unit-scaled again,
    the malformed members stay the most negative (clipped), and the order of every member is kept."""
    returns = [1.00, 1.05, 1.10, 0.95, 1.00, 1.20, -0.2, -0.4]
    valid = [True] * 6 + [False] * 2
    turns = [[0.0] for _ in returns]
    plain = np.array([a[0] for a in group_advantages(turns, returns, mode="episode").per_turn])
    ranked = np.array([a[0] for a in group_advantages(turns, returns, mode="episode", baseline_members=valid,
                                                      clip=3.0).per_turn])
    v = np.array(returns[:6])
    assert ranked[:6] == pytest.approx((v - v.mean()) / (v.std(ddof=1) + 1e-6))  # the valid members' own scale
    assert ranked[:6].std(ddof=1) > 2 * plain[:6].std(ddof=1)  # the moves' ranking, no longer compressed
    assert np.all(ranked[6:] == -3.0)  # the format mistakes: negative, clipped
    assert list(np.argsort(ranked[:6])) == list(np.argsort(plain[:6])) and ranked[6:].max() < ranked[:6].min()
    # the same in turn credit: the valid members' pooled reward-to-go sets the scale
    per_turn = group_advantages([[0.02, 0.0]] * 6 + [[-0.5, 0.0]] * 2, returns, mode="turn",
                                baseline_members=valid, clip=3.0).per_turn
    pooled = np.concatenate([[r + 0.02, r] for r in returns[:6]])
    assert np.concatenate(per_turn[:6]) == pytest.approx((pooled - pooled.mean()) / (pooled.std(ddof=1) + 1e-6))
    assert all(np.all(a <= 0) for a in per_turn[6:])


def test_the_valid_baseline_falls_back_to_the_group_and_defaults_change_nothing():
    returns = [1.0, 1.0, 0.2, 0.5]
    turns = [[0.0]] * 4
    plain = group_advantages(turns, returns, mode="episode").per_turn
    # one valid member, or valid members all equal: the group's own statistics
    for valid in ([True, False, False, False], [True, True, False, False]):
        got = group_advantages(turns, returns, mode="episode", baseline_members=valid).per_turn
        assert all(np.array_equal(a, b) for a, b in zip(got, plain))
    # every member valid and no clip: exactly the paper's advantages
    got = group_advantages(turns, returns, mode="episode", baseline_members=[True] * 4).per_turn
    assert all(np.array_equal(a, b) for a, b in zip(got, plain))
    clipped = group_advantages(turns, returns, mode="episode", clip=0.5).per_turn
    assert max(abs(float(a[0])) for a in clipped) == 0.5
    with pytest.raises(ValueError, match="baseline flags"):
        group_advantages(turns, returns, mode="episode", baseline_members=[True])
    with pytest.raises(ValueError, match="clip"):
        group_advantages(turns, returns, mode="episode", clip=-1.0)
