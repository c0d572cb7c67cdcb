"""The explicit seams: Simulator, Pool, Policy/DirectPolicy protocols, and one error base.

Real parts throughout: the embedded engine on the session's small basin, the EF5 backend with a
real executable file as its binary, real pools, real episodes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hydroagent_hpc.agents.base import DirectPolicy, MetersUsage, Policy, StopsWithReason
from hydroagent_hpc.agents.factory import AgentOptionError
from hydroagent_hpc.agents.heuristic import HeuristicHydrologist
from hydroagent_hpc.agents.llm.client import LLMError, LLMRequestError
from hydroagent_hpc.agents.llm.models_file import MissingAPIKeyError
from hydroagent_hpc.agents.optimizers.policy import make_optimizer_policy
from hydroagent_hpc.campaign import CampaignNotReadyError
from hydroagent_hpc.campaign.shards import IncompleteMergeError
from hydroagent_hpc.config import preset
from hydroagent_hpc.env.environment import CalibrationEnv
from hydroagent_hpc.env.episode import run_episode
from hydroagent_hpc.env.toolcalls import render_hermes
from hydroagent_hpc.errors import ConfigError, HydroAgentError, UsageError, one_line
from hydroagent_hpc.hpc.mpi import MPIPool
from hydroagent_hpc.hpc.pool import Pool, PoolError, ProcessPool, SerialPool, open_pool
from hydroagent_hpc.registry import UnknownNameError
from hydroagent_hpc.sim import Simulator, open_simulator
from hydroagent_hpc.sim.basin import load_basin
from hydroagent_hpc.sim.errors import ControlFileError, InputError, SimulationError
from hydroagent_hpc.store import MergeError, StoreError
from hydroagent_hpc.types import ToolCall

CFG = preset("paper", max_simulations=4, max_turns=None, patience=None, target_nse=0.999, wall_clock_s=None)


@pytest.fixture(scope="module")
def basin(small_basin_dir):
    return load_basin(small_basin_dir)


def test_both_simulator_backends_follow_the_protocol(small_basin_dir, tmp_path):
    binary = tmp_path / "ef5"
    binary.write_text("#!/bin/sh\nexit 0\n")
    binary.chmod(0o755)
    control = small_basin_dir / "control.txt"
    embedded = open_simulator(control, "embedded", cache_dir=False)
    ef5 = open_simulator(control, "ef5", binary=binary, workdir=tmp_path)
    for sim in (embedded, ef5):
        assert isinstance(sim, Simulator)
    assert ef5.base_params == embedded.base_params  # the same control file, read by both backends


def test_the_environment_takes_only_a_simulator(basin, small_sim):
    class RunOnly:  # no base_params, no run_batch
        def run(self, params: Any = None) -> None: ...

    with pytest.raises(TypeError, match="RunOnly is not a Simulator"):
        CalibrationEnv(basin, RunOnly(), CFG)  # type: ignore[arg-type]
    assert isinstance(small_sim, Simulator) and CalibrationEnv(basin, small_sim, CFG).sim is small_sim


def test_every_pool_follows_the_protocol():
    with open_pool("serial") as serial, ProcessPool(workers=1) as processes:
        pools: list[object] = [serial, processes, MPIPool(executor=None, workers=1)]
        assert all(isinstance(p, Pool) for p in pools) and [p.backend for p in pools] == ["serial", "processes", "mpi"]
        assert [r.value for r in serial.map(abs, [-1, 2])] == [1, 2]
    assert not isinstance(object(), Pool)
    with pytest.raises(PoolError, match="workers=0: need at least 1"):
        ProcessPool(workers=0)
    assert isinstance(SerialPool(), Pool)


class Both:
    """Has ``act`` and ``run``: the text protocol wins (as before), ``run`` is never called."""

    name = "both"

    def __init__(self) -> None:
        self.acted = self.ran = 0

    def act(self, messages: list[dict[str, str]]) -> str | None:
        self.acted += 1
        if self.acted > 1:
            return None
        return "".join(render_hermes(ToolCall(n, {})) for n in ("run_simulation", "evaluate"))

    def run(self, env: CalibrationEnv) -> None:
        self.ran += 1


class Quitter:
    """A text policy that stops at once, says why, and reports its usage."""

    name = "quitter"
    stop_reason = "nothing_to_say"
    usage = {"prompt_tokens": 3}

    def act(self, messages: list[dict[str, str]]) -> str | None:
        return None


def test_run_episode_dispatches_on_the_protocols(basin, small_sim):
    both = Both()
    assert isinstance(both, Policy) and isinstance(both, DirectPolicy)
    ep = run_episode(both, CalibrationEnv(basin, small_sim, CFG))
    assert both.acted == 2 and both.ran == 0 and ep.counters["simulations"] == 1
    assert ep.stop_reason == "policy_stopped" and ep.usage == {}

    direct = make_optimizer_policy("random", 0, 4)
    assert isinstance(direct, DirectPolicy) and not isinstance(direct, Policy)
    ep = run_episode(direct, CalibrationEnv(basin, small_sim, CFG))
    assert ep.counters["simulations"] == 4 and all(t.text == "" for t in ep.turns)

    quitter = Quitter()
    assert isinstance(quitter, StopsWithReason) and isinstance(quitter, MetersUsage)
    ep = run_episode(quitter, CalibrationEnv(basin, small_sim, CFG))
    assert ep.stop_reason == "nothing_to_say" and ep.usage == {"prompt_tokens": 3} and ep.turns == []

    with pytest.raises(TypeError, match="needs a Policy .* or a DirectPolicy .*; got object"):
        run_episode(object(), CalibrationEnv(basin, small_sim, CFG))  # type: ignore[arg-type]


def test_the_episode_keeps_the_observed_series_of_the_first_run(basin, small_sim):
    ep = run_episode(HeuristicHydrologist(seed=0), CalibrationEnv(basin, small_sim, CFG))
    ref = small_sim.run()
    assert ep.counters["simulations"] >= 1
    np.testing.assert_array_equal(ep.times, ref.times)
    np.testing.assert_array_equal(ep.observed, np.asarray(ref.observed, dtype=np.float64))
    np.testing.assert_array_equal(ep.warmup, ref.warmup)
    assert [t.ok for t in ep.turns if t.tool == "run_simulation"][:1] == [True]


@pytest.mark.parametrize("cls,code", [
    (ConfigError, 2), (UsageError, 2), (UnknownNameError, 2), (AgentOptionError, 2), (CampaignNotReadyError, 2),
    (InputError, 2), (ControlFileError, 2), (SimulationError, 2), (StoreError, 2), (MergeError, 1),
    (IncompleteMergeError, 1), (PoolError, 2), (MissingAPIKeyError, 2), (LLMError, 1),
    (LLMRequestError, 1),
])
def test_every_deliberate_error_is_a_hydroagent_error(cls, code):
    assert issubclass(cls, HydroAgentError) and cls.exit_code == code


def test_one_line():
    assert one_line(HydroAgentError("bad value", fix="give a number")) == "bad value; fix: give a number"
    wrapped = ConfigError("c.yaml:3: " + str(HydroAgentError("x: no", fix="yes")))
    assert one_line(wrapped) == "c.yaml:3: x: no; fix: yes"
    assert one_line(ValueError("")) == "ValueError"
    assert one_line(LLMRequestError("gave up after 3 attempts", kind="timeout", attempts=3)) == \
        "gave up after 3 attempts"


def test_the_cli_prints_an_error_on_one_line(tmp_path: Path, capsys):
    from hydroagent_hpc.cli import main

    bad = tmp_path / "c.yaml"
    bad.write_text("name: c\nbasins: [b]\nagents:\n  - {kind: heuristic, colour: red}\n")
    assert main(["campaign", "run", str(bad), "--out", str(tmp_path / "o.h5")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {bad}:4: agents[0].colour: "
                                                   f"agent kind 'heuristic' takes no option 'colour'")
    assert "; fix: remove 'colour'" in err
