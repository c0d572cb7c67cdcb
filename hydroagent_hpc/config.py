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

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from hydroagent_hpc.errors import ConfigError
from hydroagent_hpc.registry import Registry
from hydroagent_hpc.yamlio import brief, load_strict, path_of

__all__ = ["RewardConfig", "EnvConfig", "PRESETS", "preset", "config_from_mapping", "load_config", "ConfigError",
           "to_dict"]

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_C = TypeVar("_C", bound="DataclassInstance")


@dataclass(frozen=True)
class RewardConfig:
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
    to the same result. "safe" pays ``set_parameters_ok`` only for a change to a parameter set
    not held before in the episode, and at most once between runs; ``simulation_ok`` only for
    the first run of a parameter set; counts a distinct parameter set once in n_eval; and caps
    the four bonuses together at ``shaping_cap`` per episode (a cut shows as a negative
    ``shaping_cap`` term). Penalties (``parse_failure``, ``simulation_failed``) must then be
    <= 0. "literal" pays the constants as written, uncapped: for ablations only.

    Epsilon: with "safe", a transcript whose best NSE is that of parameter set P earns at most
    ``shaping_cap`` (0.25) more than the direct transcript set P, run, evaluate, and farming at
    P itself (no-op sets, repeated runs, identical run/evaluate pairs) earns nothing over it
    (tests/test_rewards_farming.py; :mod:`hydroagent_hpc.env.rewards` has the argument).
    """

    per_turn: bool = True
    set_parameters_ok: float = 0.02
    simulation_ok: float = 0.05
    simulation_failed: float = 0.0
    parse_failure: float = -0.5
    delta_nse: str = "best"
    delta_clip: tuple[float, float] = (-1.0, 1.0)
    best_clip: tuple[float, float] = (-1.0, 1.0)
    target_bonus: float = 0.5
    eval_bonus: float = 0.02
    improve_bonus: float = 0.10
    empty_penalty: float = -1.0
    shaping: str = "safe"
    shaping_cap: float = 0.25

    def __post_init__(self) -> None:
        if self.delta_nse not in ("best", "previous", "off"):
            raise ConfigError(f"rewards.delta_nse={self.delta_nse!r}: use 'best', 'previous' or 'off'")
        if self.shaping not in ("safe", "literal"):
            raise ConfigError(f"rewards.shaping={self.shaping!r}: use 'safe' (the default) or 'literal' "
                              "(the constants as written, farmable; for ablations)")
        for f in fields(self):
            value = getattr(self, f.name)
            for v in value if isinstance(value, tuple) else (value,):
                if isinstance(v, float) and not math.isfinite(v):
                    raise ConfigError(f"rewards.{f.name}={value!r}: must be a finite number")
        for name in ("delta_clip", "best_clip"):
            lo, hi = getattr(self, name)
            if not lo < hi:
                raise ConfigError(f"rewards.{name}={getattr(self, name)!r}: needs low < high")
        if self.shaping_cap < 0:
            raise ConfigError(f"rewards.shaping_cap={self.shaping_cap!r}: must be >= 0 (0 pays no activity bonus)")
        if self.shaping == "safe":
            for name in ("parse_failure", "simulation_failed"):
                if getattr(self, name) > 0:
                    raise ConfigError(f"rewards.{name}={getattr(self, name)!r} pays for failing, which a policy can "
                                      f"farm; use a value <= 0, or rewards.shaping: literal for an ablation")


@dataclass(frozen=True)
class EnvConfig:
    """The calibration environment: protocol, budgets, stop rules, observations, rewards.

    ``protocol`` "turns": one parameter set per simulation, up to ``max_turns`` tool calls.
    "rounds": up to ``max_rounds`` rounds of up to ``candidates_per_round`` candidate
    simulations, a round ending at an evaluate (the frontier benchmark). ``patience`` counts
    credited evaluations (rounds) in a row without improvement. A ``None`` limit is off.
    """

    preset: str = "paper"
    protocol: str = "turns"
    max_turns: int | None = 50  # tool calls; None (off) suits the rounds protocol
    max_simulations: int | None = None
    max_rounds: int = 20
    candidates_per_round: int = 10
    target_nse: float | None = None  # None: the basin's own target
    stop_at_target: bool = True
    patience: int | None = 5
    wall_clock_s: float | None = 7200.0
    max_consecutive_parse_failures: int | None = 3  # the episode ends at the next one
    end_on_no_tool_call: bool = False
    observation: str = "paper"  # which observation keys: "paper" (full diagnostics) or "released"
    hydrograph_points: int = 60
    clip_out_of_bounds: bool = True  # False: out-of-bounds values make the call invalid
    simulation_timeout_s: float = 300.0
    max_message_chars: int = 200_000
    max_calls_per_message: int = 10
    rewards: RewardConfig = field(default_factory=RewardConfig)

    def __post_init__(self) -> None:
        if self.protocol not in ("turns", "rounds"):
            raise ConfigError(f"protocol={self.protocol!r}: use 'turns' or 'rounds'")
        if self.observation not in ("paper", "released"):
            raise ConfigError(f"observation={self.observation!r}: use 'paper' or 'released'")
        for name in ("max_turns", "max_rounds", "candidates_per_round", "hydrograph_points", "max_calls_per_message",
                     "max_message_chars"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)!r}: must be at least 1")
        for name in ("max_simulations", "patience", "max_consecutive_parse_failures"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise ConfigError(f"{name}={v!r}: must be >= 0 or null (off)")
        if self.wall_clock_s is not None and not 0 < self.wall_clock_s < math.inf:
            raise ConfigError(f"wall_clock_s={self.wall_clock_s!r}: must be positive and finite, or null (off)")
        if not 0 < self.simulation_timeout_s < math.inf:
            raise ConfigError(f"simulation_timeout_s={self.simulation_timeout_s!r}: must be positive and finite")
        if self.target_nse is not None and not -math.inf < self.target_nse <= 1.0:
            raise ConfigError(f"target_nse={self.target_nse!r}: must be a finite NSE of at most 1, or null "
                              "(the basin's own target)")


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
    return {str(k): json_ready(v) for k, v in dataclasses.asdict(cfg).items()}


def json_ready(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    return value


def _check_type(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _check_type(value, a, where)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if errors else f"{where}: bad value {value!r}")
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise ConfigError(f"{where}: expected a list of {len(args)} numbers, got {brief(value)}")
        return tuple(_check_type(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {brief(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected a whole number, got {brief(value)}")
        if not -2**63 <= value < 2**63:
            raise ConfigError(f"{where}: {brief(value)} is out of range (a whole number must fit in 64 bits)")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {brief(value)}")
        if not math.isfinite(value):
            raise ConfigError(f"{where}: expected a finite number, got {brief(value)}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected text, got {brief(value)}")
        return value
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return config_from_mapping(tp, value, where)
    return value


def config_from_mapping(cls: type[_C], data: Any, where: str = "", base: _C | None = None) -> _C:
    """Build dataclass ``cls`` from a mapping, strictly: unknown keys and wrong types are errors."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where or cls.__name__}: expected a mapping of keys, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    unknown = sorted((k for k in data if k not in known), key=str)
    if unknown:
        raise ConfigError(f"{where + '.' if where else ''}{unknown[0]}: unknown key; "
                          f"valid keys: {', '.join(sorted(known))}")
    values = {}
    for k, v in data.items():
        sub = f"{where}.{k}" if where else k
        if dataclasses.is_dataclass(hints[k]):
            values[k] = config_from_mapping(hints[k], v, sub, getattr(base, k) if base is not None else None)
        else:
            values[k] = _check_type(v, hints[k], sub)
    try:
        return replace(base, **values) if base is not None else cls(**values)
    except ConfigError as exc:  # a check across fields (__post_init__): prefix the path, once
        msg, tail = str(exc), where.rsplit(".", 1)[-1] + "."
        raise ConfigError(f"{where}.{msg[len(tail):] if msg.startswith(tail) else msg}" if where else msg) from None


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
    try:
        if not isinstance(name, str) or name not in PRESETS:
            raise ConfigError(f"preset: unknown preset {brief(name)}; choose one of: {', '.join(PRESETS)}")
        return config_from_mapping(EnvConfig, dict(data), base=preset(name))
    except ConfigError as exc:
        raise ConfigError(f"{doc.where(prefix + path_of(exc.message))}: {exc.message}", exc.fix) from None

