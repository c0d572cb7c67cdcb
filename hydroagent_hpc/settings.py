"""One way to configure: typed settings that carry their limits, help and source, and one strict loader.

Every configuration of the toolkit (the environment and its rewards, SFT, GRPO and its engine, the
Slurm site, ...) is a frozen dataclass deriving from :class:`Settings` whose fields are declared with
:func:`setting`::

    @dataclass(frozen=True)
    class SFTConfig(Settings):
        lr: float = setting(1e-5, gt=0, help="peak learning rate", source="paper")

A field's Python type is its type in the file; :func:`setting` adds the limits (``ge``, ``gt``, ``le``,
``lt``, ``choices``, ``nonempty``, ``unique``), whether it names a file (``path``: a relative value
joins the config file's folder), its default for each preset (``presets``), its help text, where
its value comes from (``source``: the paper, the authors' released code, or ours) and the fix printed
with an error about it. From these, and nothing else:

- :class:`Settings.__post_init__` checks every value (built in code or read from a file) and then the
  class's own cross-field rules (:meth:`Settings.check`), so a config that exists is a valid one;
- :func:`from_mapping` / :func:`load_file` read a mapping or a strict YAML file
  (:func:`hydroagent_hpc.yamlio.load_strict`) into the dataclass, nested sections included, and every
  refusal is a :class:`~hydroagent_hpc.errors.ConfigError` that names ``FILE:LINE``, the dotted key,
  the bad value and the fix;
- :func:`dump` writes it back as JSON-ready data (into every run folder);
- :func:`add_arguments` / :func:`arguments_given` make command-line options of chosen fields, with the
  same help, limits and checks;
- :func:`reference` / :func:`markdown` list every key for the documentation (``docs/configuration.md``
  is generated from them, and a test keeps it so).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from hydroagent_hpc.errors import ConfigError
from hydroagent_hpc.yamlio import brief, load_strict, path_of

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = ["Setting", "Settings", "setting", "invalid", "from_mapping", "load_file", "dump", "reference", "markdown",
           "add_arguments", "arguments_given", "option_names", "Where", "KeyPath", "SOURCES", "dotted",
           "MAX_TIMEOUT_S", "LR_FIX"]

#: Where a setting's value comes from: the HydroAgent paper, the authors' released code, or this toolkit.
SOURCES = ("paper", "released", "paper, released", "ours")
#: A key path in a document: ``("grpo", "engine", "url")``, ``("basins", 3)``.
KeyPath = tuple[str | int, ...]
#: The longest timeout any setting takes, in seconds (about 115 days): a longer one overflows Python's
#: ``timedelta`` (the process group's collective timeout) and the socket timeouts of an HTTP client.
MAX_TIMEOUT_S = 1e7
#: The fix of every learning rate's limits (above 0, at most 1): an AdamW step moves each weight by up
#: to about lr, so an lr of 1 or more wipes out a model whose weights are ~0.02 in one step.
LR_FIX = "give a learning rate above 0 and at most 1 (fine-tuning uses about 1.0e-6 to 1.0e-3)"
#: ``where(path) -> "FILE:LINE"`` (or just the source when no line is known).
Where = Callable[[KeyPath], str]

_C = TypeVar("_C", bound="DataclassInstance")
_NUMBER_FIX = "write numbers like 1.0e-5 (PyYAML reads 1e-5 without a dot as text)"


@dataclass(frozen=True)
class Setting:
    """What a field knows about itself besides its type and default (see :func:`setting`)."""

    help: str
    source: str = "ours"
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: tuple[Any, ...] = ()
    nonempty: bool = False
    unique: bool = False
    path: bool = False
    keep: tuple[str, ...] = ()
    presets: Mapping[str, Any] = field(default_factory=dict)
    fix: str = ""
    convert: Callable[[Any], Any] | None = None
    flag: str = ""

    def limits(self) -> str:
        """The limits in words (``"> 0"``, ``"0 to 1"``, ``"one of a, b"``), "" when there are none."""
        parts = []
        if self.choices:
            parts.append("one of " + ", ".join(_show(c) for c in self.choices))
        lo = f">= {_num(self.ge)}" if self.ge is not None else f"> {_num(self.gt)}" if self.gt is not None else ""
        hi = f"<= {_num(self.le)}" if self.le is not None else f"< {_num(self.lt)}" if self.lt is not None else ""
        parts += [p for p in (lo, hi) if p]
        if self.nonempty:
            parts.append("not empty")
        if self.unique:
            parts.append("no repeats")
        return ", ".join(parts)


def setting(default: Any = MISSING, *, help: str, factory: Callable[[], Any] | None = None, source: str = "ours",
            ge: float | None = None, gt: float | None = None, le: float | None = None, lt: float | None = None,
            choices: Sequence[Any] = (), nonempty: bool = False, unique: bool = False, path: bool = False,
            keep: Sequence[str] = (), presets: Mapping[str, Any] | None = None, fix: str = "",
            convert: Callable[[Any], Any] | None = None, flag: str = "") -> Any:
    """A dataclass field with its limits, help text and source (no ``default``: the key is required).

    ``convert`` (optional) turns what a file may hold into the field's type (``"2,3"`` -> ``("2", "3")``)
    before the type and limits are checked; it raises :func:`invalid` with an empty path for a value
    it refuses. ``flag``: the command-line option when it is not ``--`` + the name in kebab case.
    """
    if source not in SOURCES:
        raise ValueError(f"source={source!r}: use one of {SOURCES}")
    spec = Setting(help=help, source=source, ge=ge, gt=gt, le=le, lt=lt, choices=tuple(choices), nonempty=nonempty,
                   unique=unique, path=path, keep=tuple(keep), presets=dict(presets or {}), fix=fix,
                   convert=convert, flag=flag)
    if factory is not None:
        return field(default_factory=factory, metadata={"setting": spec})
    return field(default=default, metadata={"setting": spec})


def dotted(path: Sequence[str | int]) -> str:
    """``("env", "rewards", "delta_clip", 0)`` -> ``"env.rewards.delta_clip[0]"``."""
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def invalid(at: str | Sequence[str | int], problem: str, fix: str = "") -> ConfigError:
    """The error for key ``at`` (a name or a path within the config) with ``problem`` and ``fix``.

    Raise it from :meth:`Settings.check`; a loader turns ``at`` into ``FILE:LINE: dotted.key``.
    """
    path: KeyPath = (at,) if isinstance(at, str) else tuple(at)
    exc = ConfigError(f"{dotted(path)}: {problem}" if path else problem, fix)
    exc.at, exc.problem = path, problem
    return exc


class Settings:
    """Base of every configuration dataclass: values checked on construction (types, limits, :meth:`check`).

    ``section`` (optional) prefixes the key in messages about a config built in code
    (``rewards.shaping: ...``); a loader uses the key's path in the file instead.
    """

    section: ClassVar[str] = ""

    def __post_init__(self) -> None:
        hints = _hints(type(self))
        for f in fields(self):  # type: ignore[arg-type]
            if not f.init:
                continue
            value = getattr(self, f.name)
            try:
                spec = f.metadata.get("setting")
                checked = value
                if spec is not None and spec.convert is not None and value is not None:
                    try:
                        checked = spec.convert(value)
                    except ConfigError as exc:
                        raise invalid((f.name, *exc.at), exc.problem or exc.message, exc.fix) from None
                try:
                    checked = _coerce(checked, hints[f.name], (f.name,))
                except ConfigError as exc:  # a wrong type: the field's own fix when the error has none
                    if exc.fix or spec is None or not spec.fix:
                        raise
                    raise invalid(exc.at, exc.problem or exc.message, spec.fix) from None
                if spec is not None:
                    _check_limits(checked, spec, (f.name,))
            except ConfigError as exc:
                raise self._prefixed(exc) from None
            if checked is not value:
                object.__setattr__(self, f.name, checked)
        try:
            self.check()
        except ConfigError as exc:
            raise self._prefixed(exc) from None

    def check(self) -> None:
        """Rules across fields; raise :func:`invalid` naming the key. Nothing by default."""

    def _prefixed(self, exc: ConfigError) -> ConfigError:
        if not self.section or exc.located or exc.problem is None:
            return exc
        out = invalid((self.section, *exc.at), exc.problem, exc.fix)
        out.at = exc.at  # the path stays relative to this config
        return out


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _num(x: float | None) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def _show(value: Any) -> str:
    if value is True or value is False:
        return str(value).lower()
    if value is None:
        return "null"
    return str(value)


def _coerce(value: Any, tp: Any, at: KeyPath) -> Any:
    """``value`` as type ``tp`` (lists become tuples, whole numbers floats where a float is wanted);
    raises :func:`invalid` at ``at``. Nested settings given as a mapping are built from it."""
    origin = typing.get_origin(tp)
    if tp is Any or tp is object:
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            raise invalid(at, "must not be null", "")
        errors: list[ConfigError] = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, at)
            except ConfigError as exc:
                errors.append(exc)
        raise errors[0]
    if origin is typing.Literal:
        if value not in typing.get_args(tp):
            raise invalid(at, f"{brief(value)} is not one of {', '.join(_show(a) for a in typing.get_args(tp))}")
        return value
    if origin is tuple or origin is list:
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise invalid(at, f"expected a list, got {brief(value)}")
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise invalid(at, f"expected a list of {len(args)} values, got {brief(value)}")
            items = [_coerce(v, a, (*at, i)) for i, (v, a) in enumerate(zip(value, args))]
        else:
            item = args[0] if args else Any
            items = [_coerce(v, item, (*at, i)) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin in (dict, Mapping) or tp in (dict, Mapping) or origin is typing.get_origin(Mapping[str, Any]):
        if not isinstance(value, Mapping):
            raise invalid(at, f"expected a mapping, got {brief(value)}")
        for k in value:
            if not isinstance(k, str):
                raise invalid(at, f"keys must be text, got {brief(k)}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise invalid(at, f"expected true or false, got {brief(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise invalid(at, f"expected a whole number, got {brief(value)}")
        if not -2**63 <= value < 2**63:
            raise invalid(at, f"{brief(value)} is out of range (a whole number must fit in 64 bits)")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise invalid(at, f"expected a number, got {brief(value)}", _NUMBER_FIX if isinstance(value, str) else "")
        if not math.isfinite(value):
            raise invalid(at, f"expected a finite number, got {brief(value)}")
        return value if type(value) is float else float(value)
    if tp is str:
        if not isinstance(value, str):
            raise invalid(at, f"expected text, got {brief(value)}")
        return value
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if isinstance(value, Mapping):
            return from_mapping(tp, value, at=at)
        raise invalid(at, f"expected a mapping of settings, got {brief(value)}")
    if isinstance(tp, type) and not isinstance(value, tp):
        raise invalid(at, f"expected {tp.__name__}, got {brief(value)}")
    return value


def _check_limits(value: Any, spec: Setting, at: KeyPath) -> None:
    if value is None:
        return
    if spec.nonempty and isinstance(value, (str, tuple, list, Mapping)) and not value:
        raise invalid(at, "must not be empty", spec.fix)
    if isinstance(value, (tuple, list)):
        if spec.unique:
            seen: set[Any] = set()
            for i, v in enumerate(value):
                if v in seen:
                    raise invalid((*at, i), f"{brief(v)} is listed twice", spec.fix or "list each once")
                seen.add(v)
        for i, v in enumerate(value):
            _check_scalar(v, spec, (*at, i))
    else:
        _check_scalar(value, spec, at)


def _check_scalar(value: Any, spec: Setting, at: KeyPath) -> None:
    if spec.choices and not any(value is c or (value == c and type(value) is type(c)) for c in spec.choices):
        raise invalid(at, f"{brief(value)} is not one of {', '.join(_show(c) for c in spec.choices)}", spec.fix)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    if spec.ge is not None and not value >= spec.ge:
        raise invalid(at, f"must be at least {_num(spec.ge)}, got {_num(value)}", spec.fix)
    if spec.gt is not None and not value > spec.gt:
        word = "positive" if spec.gt == 0 else f"greater than {_num(spec.gt)}"
        raise invalid(at, f"must be {word}, got {_num(value)}", spec.fix)
    if spec.le is not None and not value <= spec.le:
        raise invalid(at, f"must be at most {_num(spec.le)}, got {_num(value)}", spec.fix)
    if spec.lt is not None and not value < spec.lt:
        raise invalid(at, f"must be below {_num(spec.lt)}, got {_num(value)}", spec.fix)


def _spec(f: dataclasses.Field[Any]) -> Setting | None:
    spec = f.metadata.get("setting")
    return spec if isinstance(spec, Setting) else None


def _located(exc: ConfigError, where: Where, at: KeyPath) -> ConfigError:
    """``exc`` (about a key relative to ``at``) as ``FILE:LINE: dotted.key: problem``."""
    if exc.located:
        return exc
    rel, problem = exc.at, exc.problem
    if problem is None:  # an error raised with a message only: take the key path it starts with
        rel = path_of(exc.message)
        full = (*at, *rel)
        text = f"{dotted(at)}.{exc.message}" if at and rel else (f"{dotted(at)}: {exc.message}" if at else exc.message)
    else:
        full = (*at, *(rel or ()))
        text = f"{dotted(full)}: {problem}" if full else problem
    place = where(full)
    out = ConfigError(f"{place}: {text}" if place else text, exc.fix)
    out.at, out.problem, out.located = full, problem or exc.message, True
    return out


def from_mapping(cls: type[_C], data: Any, *, at: KeyPath = (), where: Where | None = None,
                 base_dir: str | Path | None = None, base: _C | None = None, source: str = "") -> _C:
    """Build settings ``cls`` from ``data`` (a parsed mapping), strictly.

    ``at``: the mapping's key path in its document. ``where(path)`` -> ``"FILE:LINE"`` for errors
    (default: ``source``; with neither, the error carries its full key path in ``at`` for the caller
    to place). ``base_dir``: the folder that relative ``path`` settings join. ``base``: an instance
    whose values stand for the keys not given (a preset). Keys not given take the preset's default
    (``setting(presets=...)``) when ``cls`` has a ``preset`` field, else the field's default.
    """
    w: Where = where or (lambda path: source)
    if not isinstance(data, Mapping):
        what = "an empty section" if data is None else brief(data)
        raise _located(invalid((), f"expected a mapping of settings, got {what}"), w, at)
    known = {f.name: f for f in fields(cls) if f.init}
    hints = _hints(cls)
    for key in data:
        if key not in known:
            raise _located(invalid((str(key),), f"unknown key; valid keys: {', '.join(sorted(known))}"), w, at)
    values: dict[str, Any] = {}
    try:
        for key, value in data.items():
            f, tp = known[key], hints[key]
            spec = _spec(f)
            if spec is not None and spec.path and base_dir is not None:
                value = _resolve(value, spec, Path(base_dir))
            inner = _dataclass_of(tp)
            if inner is not None and isinstance(value, Mapping):
                value = from_mapping(inner, value, at=(*at, key), where=w, base_dir=base_dir,
                                     base=getattr(base, key, None) if base is not None else None)
            values[key] = value
        preset = values.get("preset", getattr(base, "preset", None))
        for name, f in known.items():
            if name in values:
                continue
            spec = _spec(f)
            if spec is not None and isinstance(preset, str) and preset in spec.presets and base is None:
                values[name] = spec.presets[preset]
            elif base is None and f.default is MISSING and f.default_factory is MISSING:
                fix = spec.fix if spec is not None else ""
                raise invalid((), f"{name}: missing", fix or f"add '{name}: ...'")
        return replace(base, **values) if base is not None else cls(**values)
    except ConfigError as exc:
        raise _located(exc, w, at) from None


def _dataclass_of(tp: Any) -> type | None:
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return tp
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if isinstance(a, type) and dataclasses.is_dataclass(a)]
        return inner[0] if len(inner) == 1 else None
    return None


def _resolve(value: Any, spec: Setting, base_dir: Path) -> Any:
    def one(v: Any) -> Any:
        if not isinstance(v, str) or not v or "\0" in v or v in spec.keep or Path(v).is_absolute():
            return v
        return str((base_dir / v).resolve())
    if isinstance(value, (list, tuple)):
        return type(value)(one(v) for v in value)
    return one(value)


def load_file(cls: type[_C], path: str | Path, *, what: str = "config file", at: KeyPath = (),
              base: _C | None = None, overrides: Mapping[str, Any] | None = None) -> _C:
    """Read ``cls`` from the strict YAML file ``path`` (or its section ``at``); relative paths join its folder.

    ``overrides``: values given on the command line (:func:`arguments_given`), by field name; they
    replace the file's and go through the same checks, an error naming the option instead of a line
    (``command line (--lr)``), and a relative path among them joins the current folder, as a shell
    user means it.
    """
    doc = load_strict(path, what=what)
    data: Any = doc.data
    for key in at:
        data = data.get(key, {}) if isinstance(data, Mapping) else {}
    data = {} if data is None else data
    where: Where = doc.where
    if overrides:
        if not isinstance(data, Mapping):  # the loader names the file's own problem
            return from_mapping(cls, data, at=at, where=doc.where, base_dir=Path(path).resolve().parent, base=base)
        specs = {f.name: _spec(f) for f in fields(cls)}
        given = {}
        for name, value in overrides.items():
            spec = specs.get(name)
            given[name] = _resolve(value, spec, Path.cwd()) if spec is not None and spec.path else value
        data = {**data, **given}
        n = len(at)

        def where(key_path: KeyPath) -> str:
            if len(key_path) > n and key_path[n] in given:
                name = str(key_path[n])
                return f"command line ({_option(name, '', specs.get(name))})"
            return doc.where(key_path)
    return from_mapping(cls, data, at=at, where=where, base_dir=Path(path).resolve().parent, base=base)


def option_names(cls: type, exclude: Sequence[str] = ()) -> tuple[str, ...]:
    """The fields of ``cls`` that can be given as command-line options (:func:`add_arguments`): those
    holding a number, text, true/false or a list of them (not nested sections or mappings)."""
    hints = _hints(cls)
    scalar = (bool, int, float, str, type(None))

    def simple(tp: Any) -> bool:
        origin = typing.get_origin(tp)
        if origin is typing.Literal:
            return True
        if origin in (typing.Union, types.UnionType):
            return all(simple(a) for a in typing.get_args(tp))
        if origin is tuple:
            return all(a is Ellipsis or a in scalar for a in typing.get_args(tp))
        return tp in scalar

    return tuple(f.name for f in fields(cls) if f.init and f.name not in exclude and simple(hints[f.name]))


def dump(obj: Any) -> Any:
    """Settings (or any value in them) as JSON-ready data: dataclasses as dicts, tuples as lists."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: dump(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): dump(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [dump(v) for v in obj]
    return obj


# --- documentation -------------------------------------------------------------------------------------


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        name = " or ".join(_type_name(a) for a in args)
        return f"{name} or null" if len(args) < len(typing.get_args(tp)) else name
    if origin in (tuple, list):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin in (dict, Mapping) or tp in (dict, Mapping) or origin is typing.get_origin(Mapping[str, Any]):
        return "mapping"
    if origin is typing.Literal:
        return "text"
    names = {bool: "true/false", int: "whole number", float: "number", str: "text"}
    if tp in names:
        return names[tp]
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return "section"
    return getattr(tp, "__name__", str(tp))


def reference(cls: type) -> list[dict[str, str]]:
    """One row per key of ``cls``: key, type, default, limits, source, help (nested sections flattened)."""
    rows: list[dict[str, str]] = []
    hints = _hints(cls)
    for f in fields(cls):
        if not f.init:
            continue
        spec = _spec(f)
        tp = hints[f.name]
        if f.default is not MISSING:
            default = "(required)" if f.default is MISSING else _show(dump(f.default))
        elif f.default_factory is not MISSING:
            made = f.default_factory()
            default = "(section)" if dataclasses.is_dataclass(made) else _show(dump(made))
        else:
            default = "(required)"
        if spec is not None and spec.presets:
            default += "; " + ", ".join(f"{k}: {_show(v)}" for k, v in spec.presets.items())
        rows.append({"key": f.name, "type": _type_name(tp), "default": default,
                     "limits": spec.limits() if spec else "", "source": spec.source if spec else "ours",
                     "help": spec.help if spec else ""})
        inner = _dataclass_of(tp)
        if inner is not None:
            rows += [{**r, "key": f"{f.name}.{r['key']}"} for r in reference(inner)]
    return rows


def markdown(cls: type, title: str) -> str:
    """A Markdown table of :func:`reference` under a heading."""
    lines = [f"## {title}", "", "| key | type | default | limits | source | meaning |", "|---|---|---|---|---|---|"]
    for r in reference(cls):
        cells = [f"`{r['key']}`", r["type"], r["default"].replace("|", "\\|"), r["limits"].replace("|", "\\|"),
                 r["source"], r["help"].replace("|", "\\|")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# --- command line --------------------------------------------------------------------------------------


def _option(name: str, prefix: str, spec: Setting | None = None) -> str:
    if spec is not None and spec.flag:
        return spec.flag
    return f"--{prefix}{name.replace('_', '-')}"


def add_arguments(parser: argparse.ArgumentParser | Any, cls: type, names: Sequence[str], *, prefix: str = "",
                  defaults: Mapping[str, Any] | None = None) -> None:
    """Add ``--name`` options for the fields ``names`` of ``cls``: help text, limits and checks from the field.

    A value given on the command line goes through the same checks as one from a file; a field left
    out is not set at all (``argparse.SUPPRESS``), so :func:`arguments_given` returns only what the user
    typed (``--name null`` included). ``true`` / ``false`` fields become ``--name`` / ``--no-name``.
    """
    known = {f.name: f for f in fields(cls)}
    hints = _hints(cls)
    for name in names:
        f, tp = known[name], hints[name]
        spec = _spec(f)
        helptext = spec.help if spec else name
        limits = ", ".join(x for x in (spec.limits() if spec else "").split(", ")
                           if x not in ("not empty", "no repeats"))
        shown = (defaults or {}).get(name, f.default if f.default is not MISSING else None)
        shown = None if shown == () else shown
        extra = "; ".join(x for x in (limits, f"default {_show(shown)}" if shown is not None else "") if x)
        full = f"{helptext} ({extra})" if extra else helptext
        dest = f"{prefix.replace('-', '_')}{name}"
        flag = _option(name, prefix, spec)
        if tp is bool:
            parser.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                                help=full)
            continue
        if typing.get_origin(tp) is tuple:  # a list: the option repeats (--module a --module b)
            item: Any = typing.get_args(tp)[0]

            def parse_item(text: str, _item: Any = item) -> Any:
                return _from_text(text, _item)

            parser.add_argument(flag, dest=dest, action="append", default=argparse.SUPPRESS,
                                metavar=name.upper().rstrip("S"),
                                type=parse_item, help=f"{full} (repeat for several)")
            continue

        def parse(text: str, _tp: Any = tp, _spec: Setting | None = spec, _name: str = name) -> Any:
            value = _from_text(text, _tp)
            try:
                value = _coerce(value, _tp, (_name,))
                if _spec is not None:
                    _check_limits(value, _spec, (_name,))
            except ConfigError as exc:
                raise argparse.ArgumentTypeError(exc.problem or str(exc)) from None
            return value

        parse.__name__ = _type_name(tp)
        choices = spec.choices if spec and spec.choices and all(isinstance(c, str) for c in spec.choices) else None
        parser.add_argument(flag, dest=dest, type=parse, default=argparse.SUPPRESS, help=full,
                            metavar=("{" + ",".join(choices) + "}") if choices else name.upper())


def _from_text(text: str, tp: Any) -> Any:
    """A command-line word as the value a YAML file would hold (``null`` -> None, numbers as numbers)."""
    if text in ("null", "none", "None"):
        return None
    args = set(typing.get_args(tp)) | {tp}
    if bool in args and text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        if kind in args:
            try:
                return kind(text)
            except ValueError:
                pass
    return text


def arguments_given(args: argparse.Namespace, names: Sequence[str], *, prefix: str = "") -> dict[str, Any]:
    """The options of :func:`add_arguments` the user gave, by field name (``--key null`` gives None, which
    sets an optional key to null; an option not typed is absent)."""
    out = {}
    for name in names:
        dest = f"{prefix.replace('-', '_')}{name}"
        if hasattr(args, dest):
            value = getattr(args, dest)
            out[name] = tuple(value) if isinstance(value, list) else value
    return out
