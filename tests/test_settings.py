"""The one config mechanism (hydroagent_hpc/settings.py): types, limits, presets, paths, file:line, CLI, docs."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

from hydroagent_hpc.errors import ConfigError
from hydroagent_hpc.settings import (
    Settings,
    add_arguments,
    arguments_given,
    dump,
    from_mapping,
    invalid,
    load_file,
    markdown,
    reference,
    setting,
)


@dataclass(frozen=True)
class Inner(Settings):
    section: ClassVar[str] = "inner"

    url: str = setting("http://x", nonempty=True, help="a URL")
    timeout_s: float = setting(600.0, gt=0, help="seconds")


@dataclass(frozen=True)
class Demo(Settings):
    basins: tuple[str, ...] = setting(path=True, nonempty=True, unique=True, help="basin folders",
                                      fix="list the training basin folders")
    preset: str = setting("paper", choices=("paper", "released"), help="the recipe")
    model: str = setting("tiny", path=True, keep=("tiny",), help="tiny or a folder")
    lr: float = setting(1e-6, gt=0, source="paper", help="learning rate")
    top_p: float = setting(0.95, gt=0, le=1, help="nucleus")
    group_size: int = setting(8, ge=1, presets={"released": 6}, source="paper, released", help="K")
    fsdp: bool | str = setting("auto", choices=(True, False, "auto"), help="sharding")
    norm_length: int | None = setting(None, ge=1, help="norm")
    clip: tuple[float, float] = setting((-1.0, 1.0), help="low, high")
    inner: Inner = setting(factory=Inner, help="a section")

    def check(self) -> None:
        if self.clip[0] >= self.clip[1]:
            raise invalid("clip", f"{list(self.clip)} needs low < high")


def _load(tmp_path: Path, text: str) -> Demo:
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return load_file(Demo, p)


def test_a_file_loads_with_types_presets_and_paths(tmp_path):
    c = _load(tmp_path, "basins: [a, /abs/b]\npreset: released\nlr: 2\nmodel: tiny\ninner: {timeout_s: 5}\n")
    assert c.basins == (str((tmp_path / "a").resolve()), "/abs/b")
    assert c.group_size == 6 and c.preset == "released"  # the preset's default for a key not given
    assert c.lr == 2.0 and type(c.lr) is float and c.model == "tiny"
    assert c.inner == Inner(timeout_s=5.0)
    assert _load(tmp_path, "basins: [a]\ngroup_size: 3\npreset: released\n").group_size == 3  # given wins
    assert dump(c)["basins"] == list(c.basins) and dump(c)["inner"] == {"url": "http://x", "timeout_s": 5.0}


@pytest.mark.parametrize("text, line, words", [
    ("basins: [a]\nlrr: 1\n", 2, "lrr: unknown key; valid keys: basins, clip"),
    ("basins: [a]\nlr: 1e-6\n", 2, "lr: expected a number, got '1e-6'"),
    ("basins: [a]\nlr: 0\n", 2, "lr: must be positive, got 0"),
    ("basins: [a]\nlr: .nan\n", 2, "lr: expected a finite number, got nan"),
    ("basins: [a]\ntop_p: 1.5\n", 2, "top_p: must be at most 1, got 1.5"),
    ("basins: [a]\ngroup_size: 0\n", 2, "group_size: must be at least 1, got 0"),
    ("basins: [a]\ngroup_size: true\n", 2, "group_size: expected a whole number, got True"),
    ("basins: [a]\n\npreset: papr\n", 3, "preset: 'papr' is not one of paper, released"),
    ("basins: [a]\nfsdp: maybe\n", 2, "fsdp: 'maybe' is not one of true, false, auto"),
    ("basins: [/a, /b,\n  /a]\n", 2, "basins[2]: '/a' is listed twice"),  # the item's own line
    ("basins: []\n", 1, "basins: must not be empty"),
    ("preset: paper\n", None, "basins: missing"),  # the whole document: no line to name
    ("basins: [a]\nclip: [1, 0]\n", 2, "clip: [1.0, 0.0] needs low < high"),
    ("basins: [a]\nclip: [0]\n", 2, "clip: expected a list of 2 values"),
    ("basins: [a]\ninner:\n  timeout_s: -1\n", 3, "inner.timeout_s: must be positive, got -1"),
    ("basins: [a]\ninner:\n  urll: x\n", 3, "inner.urll: unknown key"),
    ("basins: [a]\ninner: 3\n", 2, "inner: expected a mapping of settings, got 3"),
])
def test_every_refusal_names_file_line_key_and_value(tmp_path, text, line, words):
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, text)
    assert f"c.yaml{f':{line}' if line else ''}: {words}" in str(err.value)


def test_a_missing_key_says_the_fields_fix(tmp_path):
    with pytest.raises(ConfigError, match="fix: list the training basin folders"):
        _load(tmp_path, "preset: paper\n")


def test_configs_built_in_code_are_checked_too():
    with pytest.raises(ConfigError, match=r"^lr: must be positive, got 0"):
        Demo(basins=("a",), lr=0.0)
    with pytest.raises(ConfigError, match=r"^inner.timeout_s: must be positive"):  # the section names itself
        Inner(timeout_s=0.0)
    assert Demo(basins=["a"]).basins == ("a",)  # type: ignore[arg-type]  # lists become tuples
    assert Demo(basins=("a",), lr=1).lr == 1.0  # type: ignore[arg-type]


def test_a_section_inside_another_document_is_placed_by_its_path(tmp_path):
    p = tmp_path / "pipeline.yaml"
    p.write_text("name: x\ngrpo:\n  basins: [a]\n  lr: -1\n")
    from hydroagent_hpc.yamlio import load_strict

    doc = load_strict(p)
    with pytest.raises(ConfigError, match=r"pipeline.yaml:4: grpo.lr: must be positive"):
        from_mapping(Demo, doc.data["grpo"], at=("grpo",), where=doc.where)
    with pytest.raises(ConfigError) as err:  # no place known: the caller gets the full path
        from_mapping(Demo, {"basins": ["a"], "lr": -1}, at=("grpo",))
    assert err.value.at == ("grpo", "lr") and str(err.value).startswith("grpo.lr: must be positive")


def test_command_line_options_come_from_the_same_fields():
    ap = argparse.ArgumentParser()
    names = ("lr", "group_size", "norm_length", "preset")
    add_arguments(ap, Demo, names)
    args = ap.parse_args(["--lr", "3e-4", "--norm-length", "null", "--preset", "released"])
    # null sets an optional key to null; an option not typed is absent
    assert arguments_given(args, names) == {"lr": 3e-4, "norm_length": None, "preset": "released"}
    assert arguments_given(ap.parse_args(["--lr", "3e-4"]), names) == {"lr": 3e-4}
    help_text = ap.format_help()
    assert "learning rate (> 0; default 1e-06)" in help_text.replace("\n", " ").replace("  ", " ")
    for bad in (["--lr", "0"], ["--group-size", "1.5"], ["--preset", "papr"]):
        with pytest.raises(SystemExit):
            ap.parse_args(bad)


def test_the_reference_lists_every_key_with_limits_source_and_help():
    rows = {r["key"]: r for r in reference(Demo)}
    assert rows["lr"]["limits"] == "> 0" and rows["lr"]["source"] == "paper"
    assert rows["group_size"]["default"] == "8; released: 6"
    assert rows["basins"]["default"] == "(required)" and rows["inner.timeout_s"]["type"] == "number"
    assert "| `top_p` | number | 0.95 | > 0, <= 1 | ours | nucleus |" in markdown(Demo, "Demo")


def test_the_configuration_reference_in_docs_is_the_one_the_fields_give():
    """docs/configuration.md is `hydroagent config reference`'s output: a field's help, default or limits
    changed without regenerating it fails here."""
    from hydroagent_hpc.cli.config import reference_text, sections

    doc = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
    assert doc.read_text(encoding="utf-8") == reference_text(), (
        "docs/configuration.md is stale: run `hydroagent config reference --out docs/configuration.md`")
    text = reference_text()
    for _, cls in sections():  # every configuration's every key is in it
        for row in reference(cls):
            assert f"| `{row['key']}` |" in text


def test_a_wrong_type_carries_the_fields_fix(tmp_path):
    """A value of the wrong type is refused with the field's own fix, as a value out of its limits is."""
    p = tmp_path / "c.yaml"
    p.write_text("basins: {a: 1}\n")
    with pytest.raises(ConfigError, match=r"c.yaml:1: basins: expected a list.*\n  fix: list the training basin"):
        load_file(Demo, p)


def test_command_line_values_replace_the_files_and_are_checked_as_the_files_are(tmp_path, monkeypatch):
    p = tmp_path / "conf" / "c.yaml"
    p.parent.mkdir()
    p.write_text("basins: [a, b]\nlr: 1.0e-3\nmodel: m\n")
    monkeypatch.chdir(tmp_path)
    c = load_file(Demo, p, overrides={"lr": 2e-3, "model": "here", "preset": "released"})
    assert c.lr == 2e-3 and c.preset == "released" and c.group_size == 6  # the preset given picks its defaults
    assert c.model == str(tmp_path / "here")  # a path typed in a shell joins the current folder ...
    assert c.basins == (str(p.parent / "a"), str(p.parent / "b"))  # ... one in the file joins the file's
    with pytest.raises(ConfigError) as err:
        load_file(Demo, p, overrides={"lr": 0.0})
    assert "command line (--lr)" in str(err.value) and "c.yaml" not in str(err.value)
    with pytest.raises(ConfigError, match=r"c\.yaml:2: lr"):  # the file's own value still names its line
        (p.write_text("basins: [a]\nlr: -1\n"), load_file(Demo, p, overrides={"top_p": 0.5}))


def test_option_names_are_the_fields_that_hold_values():
    from hydroagent_hpc.settings import option_names

    assert option_names(Demo) == ("basins", "preset", "model", "lr", "top_p", "group_size", "fsdp", "norm_length",
                                  "clip")
    ap = argparse.ArgumentParser()
    add_arguments(ap, Demo, ("fsdp",))
    assert arguments_given(ap.parse_args(["--fsdp", "false"]), ("fsdp",)) == {"fsdp": False}
