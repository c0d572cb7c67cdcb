"""Group-relative advantages for GRPO from per-turn and terminal rewards (docs/rl-notes.md, sections 4-5).

A group is the ``K`` rollouts (episodes) of one prompt. Rollout ``i`` has assistant turns
``j = 0 .. n_i - 1`` with per-turn rewards ``r_ij`` and a terminal reward ``z_i`` (the episode's
final score). :func:`group_advantages` turns them into one advantage per assistant turn, in one of
:data:`ADVANTAGE_MODES`; :func:`token_advantages` then writes those onto the tokens of the turns.

Modes, with ``norm(x) = (x - mean x) / (std x + eps)`` over the group (``std`` the *sample*
standard deviation, ddof=1, as verl and TRL; without std normalisation ``norm(x) = x - mean x``,
Dr. GRPO):

``episode`` (the HydroAgent paper; OpenRLHF and SkyRL GRPO)
    ``R_i = sum_j r_ij + z_i``, ``A_i = norm(R)_i``; every turn of rollout ``i`` gets ``A_i``.

``turn`` (reward-to-go; Kevin, arXiv 2507.11948, used ``gamma = 0.4``)
    ``G_ij = sum_{k >= j} gamma^(k - j) r'_ik`` with ``r'_ik = r_ik`` except that the last turn
    also carries the terminal reward, ``r'_i,n_i-1 = r_i,n_i-1 + z_i`` (:func:`reward_to_go`).
    Baseline and scale are pooled over *all* turns of *all* rollouts of the group:
    ``mu = mean_{i,j} G_ij``, ``sigma = sample std_{i,j} G_ij``, ``A_ij = (G_ij - mu) / (sigma + eps)``.
    The baseline is one constant per group, so it does not depend on when each rollout stopped;
    normalising per turn index instead is biased when the policy decides the episode length
    (verl RFC #7244).

``released`` (what the authors' released code effectively trained, verl 0.5 multi-turn)
    Per-turn rewards are dropped: ``R_i = z_i``, ``A_i = norm(R)_i`` on every turn of rollout ``i``.

**Baseline members** (``baseline_members``, ours). By default the baseline and scale are taken over
the whole group. With a mask of *valid* members (rollouts without a parse failure), ``mu`` and
``sigma`` are taken over the valid members' values only and applied to every member, then clipped to
``[-clip, clip]``. The motivation is measured (docs/learning.md): after SFT a group is typically six
valid members whose moves differ (the best beats the median by ~0.1 NSE) and one or two that wrote a
malformed call; their -0.5 penalties set the group's standard deviation (0.6 against 0.22 among the
valid members), so the valid members' advantages, where the moves are ranked, shrink threefold while
the format mistakes take the largest gradients. Taking the scale from the valid members restores the
ranking of moves; the malformed members still get a negative advantage (clipped). With fewer than two
valid members, or valid values all equal, the whole group's statistics are used. The constant baseline
keeps the estimator unbiased; only its variance changes.

A group whose returns are all equal (or that has a single return) gets exact zero advantages and
no policy gradient; :attr:`GroupAdvantages.degenerate` flags it so the trainer can log the share of
such groups. numpy only: nothing here imports torch.
"""

from __future__ import annotations

import logging
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["ADVANTAGE_MODES", "GroupAdvantages", "group_normalise", "episode_returns", "reward_to_go",
           "group_advantages", "token_advantages"]

logger = logging.getLogger(__name__)

#: The ways per-turn and terminal rewards become advantages (module docstring).
ADVANTAGE_MODES = ("episode", "turn", "released")


def _finite_1d(values: ArrayLike, what: str) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{what} must be one-dimensional, got shape {arr.shape}")
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        raise ValueError(f"{what} must be finite: index {int(bad[0])} is {arr[bad[0]]!r}")
    return arr


def _stats(values: np.ndarray) -> tuple[float, float]:
    """``(mean, sample std)``; ``(0, 0)`` for no values and std 0 for a single value."""
    if values.size == 0:
        return 0.0, 0.0
    mean = float(values.mean())
    std = float(values.std(ddof=1)) if values.size > 1 else 0.0
    return mean, std


def _all_equal(values: np.ndarray) -> bool:
    return values.size <= 1 or bool(np.all(values == values[0]))


def _subset_stats(values: np.ndarray, members: np.ndarray | None) -> tuple[float, float] | None:
    """``(mean, sample std)`` over ``values[members]``; None when the subset cannot give a scale (fewer
    than two values, or all equal), so the caller falls back to the whole group."""
    if members is None:
        return None
    sub = values[members]
    if sub.size < 2 or _all_equal(sub):
        return None
    return _stats(sub)


def _normalise_with(values: np.ndarray, members: np.ndarray | None, *, std: bool, eps: float,
                    clip: float) -> np.ndarray:
    """:func:`group_normalise` of ``values``, with the baseline and scale from ``members`` when given."""
    stats = _subset_stats(values, members)
    if stats is None:
        out = group_normalise(values, std=std, eps=eps)
    else:
        mean, sd = stats
        out = (values - mean) / (sd + eps) if std else values - mean
    return np.clip(out, -clip, clip) if clip > 0 else out


def group_normalise(returns: ArrayLike, *, std: bool = True, eps: float = 1e-6) -> np.ndarray:
    """Group-normalised advantages ``A_i = (R_i - mean R) / (std R + eps)``.

    ``std R`` is the sample standard deviation (ddof=1), as in verl's GRPO estimator and TRL. With
    ``std=False`` the returns are only centred, ``A_i = R_i - mean R`` (Dr. GRPO). A group of one
    return, and a group whose returns are all equal, get exact zeros (no floating-point residue
    from the mean). An empty group gives an empty array.

    Reference: Shao, Z. et al. (2024), DeepSeekMath, arXiv 2402.03300, section 4.1.2 (outcome supervision);
    Liu, Z. et al. (2025), Understanding R1-Zero-Like Training, arXiv 2503.20783 (no std scaling).

    Raises:
        ValueError: ``returns`` is not one-dimensional or holds a non-finite value (its index is
            named), or ``eps`` is negative.
    """
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps!r}")
    r = _finite_1d(returns, "returns")
    if _all_equal(r):
        return np.zeros_like(r)
    mean, sd = _stats(r)
    centred = r - mean
    return centred / (sd + eps) if std else centred


def episode_returns(turn_rewards: Sequence[Sequence[float]], terminals: Sequence[float]) -> np.ndarray:
    """Episode returns ``R_i = sum_k r_ik + z_i`` (per-turn rewards plus the terminal reward).

    Raises:
        ValueError: the number of reward lists differs from the number of terminal rewards.
    """
    if len(turn_rewards) != len(terminals):
        raise ValueError(f"{len(turn_rewards)} lists of turn rewards but {len(terminals)} terminal rewards")
    return np.array([math.fsum(float(x) for x in r) + float(z) for r, z in zip(turn_rewards, terminals)],
                    dtype=np.float64)


def reward_to_go(turn_rewards: Sequence[float], terminal: float, gamma: float) -> np.ndarray:
    """Discounted reward-to-go per turn, ``G_j = sum_{k >= j} gamma^(k - j) r_k``.

    The terminal reward is added to the last turn's reward first, so ``G_0 = sum_k gamma^k r_k +
    gamma^(n-1) z`` and, with ``gamma = 1``, ``G_0`` is the episode return. An episode with no turns
    gives an empty array and its terminal reward is lost: there is no turn to credit it to, and the
    caller decides what such an episode means. ``gamma = 0`` gives ``G_j = r_j`` (``0^0 = 1``).

    Reference: Sutton, R. S. & Barto, A. G. (2018), Reinforcement Learning: An Introduction, 2nd ed.,
    eq. 3.8; per turn in multi-turn LLM RL: Baronio, C. et al. (2025), Kevin, arXiv 2507.11948.

    Raises:
        ValueError: ``gamma`` is outside [0, 1], or a reward is not finite.
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma!r}")
    r = _finite_1d(list(turn_rewards), "turn rewards")
    if not math.isfinite(terminal):
        raise ValueError(f"terminal reward must be finite, got {terminal!r}")
    if r.size == 0:
        return r
    r[-1] += terminal
    g = np.empty_like(r)
    running = 0.0
    for j in range(r.size - 1, -1, -1):
        running = r[j] + gamma * running
        g[j] = running
    return g


@dataclass(frozen=True)
class GroupAdvantages:
    """The advantages of one group and the statistics behind them.

    Attributes:
        per_turn: for rollout ``i``, the advantage of each of its assistant turns (length ``n_i``;
            empty for a rollout without turns).
        returns: the scalar return of each rollout: the episode return (``episode``), the terminal
            reward (``released``) or ``G_i0`` (``turn``; NaN for a rollout without turns, which has none).
        degenerate: every normalised value in the group was equal (or there was at most one), so all
            advantages are zero and the group gives no policy gradient. Worth logging as a share.
        mean: the baseline subtracted (mean of the returns, or of the pooled ``G_ij`` in ``turn`` mode).
        std: the sample standard deviation of the same values (0 for fewer than two), reported also
            when ``std=False`` and it did not scale anything.
    """

    per_turn: list[np.ndarray]
    returns: np.ndarray
    degenerate: bool
    mean: float
    std: float


def group_advantages(turn_rewards: Sequence[Sequence[float]], terminals: Sequence[float], *, mode: str,
                     gamma: float = 1.0, std: bool = True, eps: float = 1e-6,
                     baseline_members: Sequence[bool] | None = None, clip: float = 0.0) -> GroupAdvantages:
    """Per-turn advantages of one group of rollouts in ``mode`` (formulas in the module docstring).

    ``turn_rewards[i]`` are the rewards of rollout ``i``'s assistant turns, ``terminals[i]`` its
    terminal reward. ``gamma`` is used by the ``turn`` mode only (it must lie in [0, 1] in every mode);
    ``std`` and ``eps`` are those of :func:`group_normalise`. ``baseline_members[i]``: whether rollout
    ``i`` is one of the members the baseline and scale are taken from (None: all; module docstring);
    ``clip > 0`` clips every advantage to ``[-clip, clip]`` (0: no clip).

    Reference: Shao, Z. et al. (2024), DeepSeekMath, arXiv 2402.03300, section 4.1.2;
    docs/rl-notes.md sections 4-5.

    Raises:
        ValueError: an unknown ``mode`` (the modes are listed), no rollouts, a different number of
            reward lists and terminal rewards, ``gamma`` outside [0, 1], or a non-finite reward.
    """
    if mode not in ADVANTAGE_MODES:
        raise ValueError(f"unknown advantage mode {mode!r}; the modes are {', '.join(ADVANTAGE_MODES)}")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma!r}")
    if len(turn_rewards) != len(terminals):
        raise ValueError(f"{len(turn_rewards)} lists of turn rewards but {len(terminals)} terminal rewards")
    if len(terminals) == 0:
        raise ValueError("a group needs at least one rollout")
    if not clip >= 0:
        raise ValueError(f"clip must be >= 0, got {clip!r}")
    if baseline_members is not None and len(baseline_members) != len(terminals):
        raise ValueError(f"{len(baseline_members)} baseline flags for {len(terminals)} rollouts")
    n_turns = [len(r) for r in turn_rewards]
    chosen = None if baseline_members is None else np.asarray(baseline_members, dtype=bool)

    if mode == "turn":
        to_go = [reward_to_go(r, float(z), gamma) for r, z in zip(turn_rewards, terminals)]
        pooled = np.concatenate(to_go) if to_go else np.zeros(0)
        turn_members = None if chosen is None else np.repeat(chosen, n_turns)
        adv = (group_normalise(pooled, std=std, eps=eps) if _all_equal(pooled)
               else _normalise_with(pooled, turn_members, std=std, eps=eps, clip=clip))
        bounds = np.cumsum([0, *n_turns])
        per_turn = [adv[bounds[i]:bounds[i + 1]] for i in range(len(n_turns))]
        returns = np.array([g[0] if g.size else math.nan for g in to_go], dtype=np.float64)
        values = pooled
    else:
        if mode == "episode":
            returns = episode_returns(turn_rewards, terminals)
        else:  # released: the per-turn rewards are dropped
            returns = np.asarray(terminals, dtype=np.float64).copy()
        per_episode = (group_normalise(returns, std=std, eps=eps) if _all_equal(returns)
                       else _normalise_with(returns, chosen, std=std, eps=eps, clip=clip))
        per_turn = [np.full(n, a, dtype=np.float64) for n, a in zip(n_turns, per_episode)]
        values = returns

    degenerate = _all_equal(values)
    mean, sd = _stats(values)
    if degenerate:
        logger.debug("degenerate group (%s mode, %d values, all equal): zero advantages", mode, values.size)
    return GroupAdvantages(per_turn=per_turn, returns=returns, degenerate=degenerate, mean=mean, std=sd)


def token_advantages(per_turn: Sequence[float] | np.ndarray, spans: Sequence[tuple[int, int]],
                     length: int) -> np.ndarray:
    """A float32 array of ``length`` zeros with ``per_turn[j]`` on tokens ``[start_j, end_j)`` of turn ``j``.

    ``spans`` are the token spans of the assistant turns in the episode's token sequence (half
    open), in order. An empty span (``start == end``) is allowed and writes nothing. Every token
    outside the spans (prompt, tool results, padding) gets 0; the loss mask decides which count.

    Raises:
        ValueError: ``len(spans) != len(per_turn)``, a span outside ``[0, length]``, with
            ``end < start``, or starting before the previous one ends; a non-finite advantage.
    """
    length = operator.index(length)
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length}")
    values = _finite_1d(per_turn, "per-turn advantages")
    if len(spans) != values.size:
        raise ValueError(f"{len(spans)} spans for {values.size} per-turn advantages")
    out = np.zeros(length, dtype=np.float32)
    previous_end = 0
    for j, span in enumerate(spans):
        start, end = (operator.index(x) for x in span)
        if not 0 <= start <= end <= length:
            raise ValueError(f"span {j} [{start}, {end}) is not inside [0, {length}] with start <= end")
        if start < previous_end:
            raise ValueError(f"span {j} [{start}, {end}) starts before span {j - 1} ends at {previous_end}")
        out[start:end] = values[j]
        previous_end = end
    return out
