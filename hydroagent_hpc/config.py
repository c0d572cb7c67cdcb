"""Typed, strict configuration: the calibration environment, its rewards, and the two presets.

``paper`` is the recipe as the HydroAgent paper states it; ``released`` is what the authors'
released code does (docs/reference-implementation.md sections 5, 8 and 12). Every constant lives in
a preset; nothing is hard-coded in the environment. Defects are fixed in both presets: rewards
come from the environment's record, an evaluate is credited only after a fresh successful run,
failed runs are failures, clipping is reported.

YAML files are read strictly: an unknown key, a wrong type or a bad value fails with the file,
the line, the dotted key and the fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

from hydroagent_hpc.errors import ConfigError
from hydroagent_hpc.registry import Registry
from hydroagent_hpc.settings import Settings, dump, from_mapping, invalid, setting
from hydroagent_hpc.yamlio import brief, load_strict

__all__ = ["RewardConfig", "EnvConfig", "PRESETS", "preset", "load_config", "ConfigError", "to_dict"]

_FARMABLE = "a policy can farm it; use a value <= 0, or rewards.shaping: literal for an ablation"


@dataclass(frozen=True)
class RewardConfig(Settings):
    """Reward constants. Per-turn terms are paid only when ``per_turn`` is on.

    Per turn: ``set_parameters_ok`` for a valid set_parameters, ``simulation_ok`` for a
    successful run, ``simulation_failed`` for a failed one, ``parse_failure`` for a turn that
    could not be parsed or validated, and on a credited evaluate the change in NSE named by
    ``delta_nse``: "best" = clip(best after) - clip(best before) (the paper), "previous" =
    NSE - previous credited NSE, 0 for the first (the released code), or "off". Both variants
    are always recorded; the unpaid one under an ``unpaid_`` key.

    Terminal (both presets): with no credited evaluation ``empty_penalty``; otherwise
    clip(best, *best_clip) + ``target_bonus``·[best > target] + ``eval_bonus``·n_eval +
    ``improve_bonus``·max(0, n_improve - 1).

    Shaping (``shaping``, default "safe" in both presets; recorded in every episode's config).
    Taken literally, the four activity bonuses (``set_parameters_ok``, ``simulation_ok``,
    ``eval_bonus``, ``improve_bonus``) pay for activity: no-op set_parameters, repeated runs,
    repeated run/evaluate pairs and worse-then-better ladders all earn more than going straight
    to the same result. "safe" counts only novel activity (a change to a parameter set not held
    before, at most once between runs; the first run of a set; distinct sets in n_eval) and
    gives the four bonuses a per-episode budget ``B = b_min + shaping_cap``, where ``b_min`` is
    what the shortest successful episode (run, evaluate) is paid: ``simulation_ok`` (when runs
    are paid per turn) + ``eval_bonus``. Per turn, the first valid change and the first
    successful run are paid (``simulation_ok + min(set_parameters_ok, shaping_cap)``); the
    terminal evaluation and improvement bonuses get the rest of B. A cut shows as a negative
    ``shaping_cap`` term. Penalties (``parse_failure``, ``simulation_failed``) must then be
    <= 0. "literal" pays the constants as written, with no budget: farmable, for ablations only.

    Epsilon: with "safe", a transcript whose best NSE is that of parameter set P earns at most
    ``shaping_cap`` (0.05) more than the direct transcript set P, run, evaluate, and farming at
    P itself (no-op sets, repeated runs, identical run/evaluate pairs) earns nothing over it
    (:mod:`hydroagent_hpc.env.rewards` has the formula and the argument;
    tests/test_rewards_farming.py and docs/guarantees.md the measured largest excess).
    """

    section: ClassVar[str] = "rewards"

    per_turn: bool = setting(True, source="paper", help="pay the per-turn terms (the released code pays the "
                                                        "terminal score only)")
    set_parameters_ok: float = setting(0.02, source="paper", help="reward of a valid set_parameters")
    simulation_ok: float = setting(0.05, source="paper", help="reward of a successful simulation")
    simulation_failed: float = setting(0.0, source="released", help="reward of a failed simulation (released: -0.5)")
    parse_failure: float = setting(-0.5, source="paper", help="reward of a turn that could not be parsed or validated")
    delta_nse: str = setting("best", source="paper, released", choices=("best", "previous", "off"),
                             help="the NSE change paid on a credited evaluate: best (paper), previous (released) "
                                  "or off")
    delta_clip: tuple[float, float] = setting((-1.0, 1.0), help="clip of the NSE change (low, high)")
    best_clip: tuple[float, float] = setting((-1.0, 1.0), source="paper, released",
                                             help="clip of the best NSE in the terminal score (low, high)")
    target_bonus: float = setting(0.5, source="paper, released", help="terminal bonus for a best NSE above the target")
    eval_bonus: float = setting(0.02, source="paper, released", help="terminal bonus per credited evaluation")
    improve_bonus: float = setting(0.10, source="paper, released",
                                   help="terminal bonus per improvement after the first")
    empty_penalty: float = setting(-1.0, source="paper", help="terminal score of an episode with no credited "
                                                              "evaluation")
    shaping: str = setting("safe", choices=("safe", "literal"),
                           fix="use safe (the default) or literal (the constants as written, farmable; for "
                               "ablations)",
                           help="safe: activity bonuses paid once per new parameter set, within a budget "
                                "(farming earns at most shaping_cap); literal: as written (farmable)")
    shaping_cap: float = setting(0.05, ge=0, help="epsilon of safe shaping: the most a transcript's activity bonuses "
                                                  "may exceed those of the shortest successful episode (run, "
                                                  "evaluate); 0 pays those alone")

    def check(self) -> None:
        for name in ("delta_clip", "best_clip"):
            lo, hi = getattr(self, name)
            if not lo < hi:
                raise invalid(name, f"{list(getattr(self, name))} needs low < high")
        if self.shaping == "safe":
            for name in ("parse_failure", "simulation_failed"):
                if getattr(self, name) > 0:
                    raise invalid(name, f"{getattr(self, name)!r} pays for failing, which {_FARMABLE}")


@dataclass(frozen=True)
class EnvConfig(Settings):
    """The calibration environment: protocol, budgets, stop rules, observations, rewards.

    ``protocol`` "turns": one parameter set per simulation, up to ``max_turns`` tool calls.
    "rounds": up to ``max_rounds`` rounds of up to ``candidates_per_round`` candidate
    simulations, a round ending at an evaluate (the frontier benchmark). ``patience`` counts
    credited evaluations (rounds) in a row without improvement. A ``None`` limit is off.
    """

    preset: str = setting("paper", help="the preset these settings start from (paper or released)")
    protocol: str = setting("turns", source="paper", choices=("turns", "rounds"),
                            help="turns: one parameter set per simulation; rounds: rounds of candidate simulations "
                                 "(the frontier benchmark)")
    max_turns: int | None = setting(50, ge=1, source="paper", help="tool calls per episode (null: off, for rounds)")
    max_simulations: int | None = setting(None, ge=0, source="paper", help="simulations per episode (null: off)")
    max_rounds: int = setting(20, ge=1, source="paper", help="rounds per episode (rounds protocol)")
    candidates_per_round: int = setting(10, ge=1, source="paper", help="candidate simulations per round")
    target_nse: float | None = setting(None, le=1.0, source="paper",
                                       help="the NSE that ends an episode (null: the basin's own target)")
    stop_at_target: bool = setting(True, source="paper", help="end the episode when the best NSE reaches the target")
    patience: int | None = setting(5, ge=0, source="paper", help="credited evaluations in a row without improvement "
                                                                 "that end the episode (null: off)")
    wall_clock_s: float | None = setting(7200.0, gt=0, source="paper", help="seconds an episode may take (null: off)")
    max_consecutive_parse_failures: int | None = setting(3, ge=0, help="parse failures in a row after which the "
                                                                       "episode ends at the next one (null: off)")
    end_on_no_tool_call: bool = setting(False, help="end the episode at a message without a tool call")
    observation: str = setting("paper", choices=("paper", "released"),
                               help="observation keys: paper (full diagnostics) or released (the released code's)")
    hydrograph_points: int = setting(60, ge=1, help="points of the compact hydrograph in an observation")
    clip_out_of_bounds: bool = setting(True, help="clip out-of-bounds multipliers (false: such a call is invalid)")
    simulation_timeout_s: float = setting(300.0, gt=0, help="seconds one simulation may take")
    max_message_chars: int = setting(200_000, ge=1, help="longest model message read")
    max_calls_per_message: int = setting(10, ge=1, help="most tool calls read from one message")
    rewards: RewardConfig = setting(factory=RewardConfig, help="the reward constants")


#: The named environment configurations (``preset: NAME`` in config and campaign files, ``--preset``).
PRESETS: Registry[EnvConfig] = Registry("preset", where="hydroagent_hpc/config.py")
PRESETS.register("paper", EnvConfig(preset="paper"))
PRESETS.register("released", EnvConfig(
    preset="released", stop_at_target=False, patience=None, wall_clock_s=None, observation="released",
    rewards=RewardConfig(per_turn=False, delta_nse="previous", simulation_failed=-0.5),
))


def preset(name: str, **overrides: Any) -> EnvConfig:
    """A preset with optional overrides (``rewards`` may be a mapping of reward overrides).

    An unknown name raises :class:`~hydroagent_hpc.registry.UnknownNameError` (a
    :class:`ConfigError`) listing the presets of :data:`PRESETS`.
    """
    base = PRESETS.lookup(name)
    if "rewards" in overrides and isinstance(overrides["rewards"], Mapping):
        overrides["rewards"] = replace(base.rewards, **overrides["rewards"])
    return replace(base, **overrides)


def to_dict(cfg: Any) -> dict[str, Any]:
    """A JSON-ready dict of a config dataclass (tuples become lists)."""
    out: dict[str, Any] = dump(cfg)
    return out


def load_config(path: str | Path, key: str | None = None) -> EnvConfig:
    """Read an environment config from YAML: ``preset: NAME`` plus overrides, strictly.

    Errors name the file and line of the offending key (:mod:`hydroagent_hpc.yamlio`: duplicate keys,
    alias bombs and deep nesting are refused while reading).
    """
    doc = load_strict(path, what="config file")
    data = {} if doc.data is None else doc.data
    prefix: tuple[str, ...] = ()
    if key is not None:
        data = data.get(key, {}) if isinstance(data, Mapping) else {}
        prefix = (key,)
    if not isinstance(data, Mapping):
        raise ConfigError(f"{doc.where(prefix)}: the top level must be a mapping of keys, got {type(data).__name__}")
    name = data.get("preset", "paper")
    if not isinstance(name, str) or name not in PRESETS:
        raise ConfigError(f"{doc.where((*prefix, 'preset'))}: preset: unknown preset {brief(name)}; choose one of: "
                          f"{', '.join(PRESETS)}")
    return from_mapping(EnvConfig, dict(data), at=prefix, where=doc.where, base=preset(name))

