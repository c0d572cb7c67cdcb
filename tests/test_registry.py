"""One registry per extension point, and a new agent kind added with one registration and nothing else.

The toy agent below lives only in this file: registering it is the whole change, and the campaign
loader, the campaign runner, the factory and the command line (``--kind`` choices, ``calibrate``)
all take it from the same table.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hydroagent_hpc.agents.factory import AGENT_KINDS, AgentKind, AgentOptionError, make_agent
from hydroagent_hpc.campaign import AgentSpec, load_campaign, run_campaign
from hydroagent_hpc.cli import build_parser, main
from hydroagent_hpc.config import PRESETS, EnvConfig, preset
from hydroagent_hpc.env.toolcalls import render_hermes
from hydroagent_hpc.errors import ConfigError, HydroAgentError
from hydroagent_hpc.hpc.pool import BACKENDS as POOL_BACKENDS
from hydroagent_hpc.hpc.pool import open_pool
from hydroagent_hpc.registry import DuplicateNameError, Registry, UnknownNameError
from hydroagent_hpc.sim import BACKENDS as SIM_BACKENDS
from hydroagent_hpc.sim import open_simulator
from hydroagent_hpc.store import load_episode, stored_ids
from hydroagent_hpc.types import ToolCall

# --------------------------------------------------------------------------- the Registry type


def test_register_by_call_and_by_decorator_in_order():
    reg: Registry[int] = Registry("widget", where="somewhere.py")
    assert reg.register("one", 1) == 1

    @reg.register("two")
    def two() -> int:
        return 2

    assert reg.names() == ("one", "two") and reg.lookup("one") == 1 and reg["two"] is two
    assert "one" in reg and "three" not in reg and 3 not in reg and len(reg) == 2 and list(reg) == ["one", "two"]
    with pytest.raises(DuplicateNameError, match="widget 'one' is already registered"):
        reg.register("one", 11)
    reg.register("one", 11, replace=True)
    assert reg["one"] == 11
    reg.unregister("one")
    assert reg.names() == ("two",)
    with pytest.raises(ValueError, match="non-empty word"):
        reg.register("a/b", 0)


def test_unknown_name_lists_the_valid_ones_and_the_fix():
    reg: Registry[int] = Registry("widget", where="somewhere.py")
    reg.register("alpha", 1)
    reg.register("beta", 2)
    with pytest.raises(UnknownNameError) as err:
        reg.lookup("gamma")
    assert isinstance(err.value, ConfigError) and isinstance(err.value, HydroAgentError)
    assert "unknown widget 'gamma'; choose one of: alpha, beta" in str(err.value)
    assert "register a new widget with one line in somewhere.py" in err.value.fix
    with pytest.raises(UnknownNameError, match=r"unknown widget \['x'\]"):
        reg.lookup(["x"])  # type: ignore[arg-type]  # an unhashable value from a parsed file


def test_each_extension_point_has_its_table():
    assert AGENT_KINDS.names() == ("heuristic", "dds", "sceua", "lhs", "random", "dream", "hybrid", "openai",
                                   "hf_local", "scripted")
    assert SIM_BACKENDS.names() == ("embedded", "ef5")
    assert POOL_BACKENDS.names() == ("serial", "processes", "mpi")
    assert PRESETS.names() == ("paper", "released") and all(PRESETS[n].preset == n for n in PRESETS)
    with pytest.raises(UnknownNameError, match="unknown simulator backend 'ef6'; choose one of: embedded, ef5"):
        open_simulator("control.txt", "ef6")
    with pytest.raises(UnknownNameError, match="unknown pool backend 'mpi-ish'; choose one of: serial, processes, mpi"):
        open_pool("mpi-ish")
    with pytest.raises(ConfigError, match="unknown preset 'paperr'; choose one of: paper, released"):
        preset("paperr")


def test_the_command_line_offers_what_the_tables_hold():
    sub = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    calibrate = {a.dest: a for a in sub["calibrate"]._actions}
    assert tuple(calibrate["kind"].choices) == AGENT_KINDS.names()
    assert tuple(calibrate["preset"].choices) == PRESETS.names()
    assert tuple(calibrate["backend"].choices) == SIM_BACKENDS.names()
    run = {a.dest: a for a in sub["campaign"]._subparsers._group_actions[0].choices["run"]._actions}
    assert tuple(run["pool"].choices) == ("auto", *POOL_BACKENDS.names())


@pytest.mark.parametrize("kind,options,where", [
    ("heuristic", {"colour": 1}, "colour: agent kind 'heuristic' takes no option 'colour'"),
    ("dds", {"rr": 0.3}, r"rr: agent kind 'dds' takes no option 'rr'; its options: initial, r, scale \(and backend\)"),
    ("openai", {}, "model: agent kind 'openai' needs option model"),
])
def test_options_are_checked_in_one_place(kind, options, where):
    with pytest.raises(AgentOptionError, match=where):
        make_agent(AgentSpec(kind, kind, options), 0, preset("paper"))


# --------------------------------------------------------------------------- a new agent kind, from a test


class ToyAgent:
    """Sets ``wm``, runs one simulation, evaluates it and stops: the smallest text policy."""

    def __init__(self, name: str, wm: float) -> None:
        self.name, self.wm, self.spoke = name, wm, False

    def act(self, messages: list[dict[str, str]]) -> str | None:
        if self.spoke:
            return None
        self.spoke = True
        calls = [ToolCall("set_parameters", {"wm": self.wm}), ToolCall("run_simulation", {}), ToolCall("evaluate", {})]
        return "".join(render_hermes(c) for c in calls)


def build_toy(options: dict[str, Any], *, name: str, seed: int, env: EnvConfig) -> ToyAgent:
    return ToyAgent(name, float(options.get("wm", 2.0)))


@pytest.fixture()
def toy_kind() -> Iterator[str]:
    AGENT_KINDS.register("toy", AgentKind(build_toy, ("wm",), help="a test's toy agent"))  # the one line
    try:
        yield "toy"
    finally:
        AGENT_KINDS.unregister("toy")
    assert "toy" not in AGENT_KINDS


def _campaign(tmp_path: Path, basin: Path, agents: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(f"name: toy\nbasins: [{basin}]\nagents:\n{agents}\nseeds: [0, 1]\n"
                    "env: {preset: paper, max_simulations: 5, max_turns: null, patience: null}\n")
    return path


def test_a_new_kind_runs_through_the_campaign_path(toy_kind, small_basin_dir, tmp_path):
    spec = load_campaign(_campaign(tmp_path, small_basin_dir, f"  - {{name: toy-a, kind: {toy_kind}, wm: 3.5}}"))
    out = tmp_path / "toy.h5"
    summary = run_campaign(spec, out, workers=1, progress=False)
    assert summary["failed"] == [] and sorted(stored_ids(out)) == ["toy/syn_small/toy-a/0", "toy/syn_small/toy-a/1"]
    ep = load_episode(out, "toy/syn_small/toy-a/0")
    assert ep.agent == "toy-a" and ep.counters["simulations"] == 1 and ep.stop_reason == "policy_stopped"
    assert ep.best_params is not None and ep.best_params["wm"] == pytest.approx(3.5)


def test_a_new_kinds_options_are_checked_when_the_campaign_is_read(toy_kind, small_basin_dir, tmp_path):
    path = _campaign(tmp_path, small_basin_dir, f"  - {{name: toy-a, kind: {toy_kind}}}\n"
                                                f"  - {{name: toy-b, kind: {toy_kind},\n      wn: 3.5}}")
    where = r"c\.yaml:6: agents\[1\]\.wn: agent kind 'toy' takes no option 'wn'; its options: wm \(and backend\)"
    with pytest.raises(ConfigError, match=where):
        load_campaign(path)
    with pytest.raises(ConfigError, match=r"c\.yaml:\d+: agents\[0\]\.kind: unknown kind 'oracle'; "
                                          r"use one of heuristic, .*, scripted, toy"):
        load_campaign(_campaign(tmp_path, small_basin_dir, "  - {name: x, kind: oracle}"))


def test_a_new_kind_is_a_command_line_choice(toy_kind, small_basin_dir, tmp_path, capsys):
    args = build_parser().parse_args(["calibrate", "--basin", str(small_basin_dir), "--agent", "mine", "--kind",
                                      toy_kind, "--out", "x.h5"])
    assert args.kind == toy_kind
    out = tmp_path / "one.h5"
    assert main(["-q", "calibrate", "--basin", str(small_basin_dir), "--agent", toy_kind, "--out", str(out),
                 "--max-simulations", "3"]) == 0
    assert "best NSE" in capsys.readouterr().out
    assert stored_ids(out) == [f"calibrate/syn_small/{toy_kind}/0"]


def test_an_unknown_kind_on_the_command_line_is_one_line(small_basin_dir, tmp_path, capsys):
    code = main(["calibrate", "--basin", str(small_basin_dir), "--agent", "oracle", "--out", str(tmp_path / "x.h5")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and not (tmp_path / "x.h5").exists()
    assert err.startswith("error: --agent 'oracle': unknown agent kind; use one of heuristic, dds")
    assert "; fix: --agent NAME --kind KIND for a free name; a new kind is one module and one line in " \
           "hydroagent_hpc/agents/factory.py" in err
