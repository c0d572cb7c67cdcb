"""A hybrid agent: a heuristic (or language-model) warm start handed to DDS for the rest.

The warm-start policy talks to the environment through the text protocol for the first
``warm_simulations`` simulations; its best parameter set and score (as the environment's
observations reported them) are then told to DDS as the starting centre, and DDS spends the
remaining budget through the direct tools. Both phases land in one episode record.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

from hydroagent_hpc.agents.base import Policy
from hydroagent_hpc.agents.heuristic import HeuristicHydrologist
from hydroagent_hpc.agents.optimizers.dds import DDS
from hydroagent_hpc.agents.optimizers.policy import OptimizerPolicy
from hydroagent_hpc.agents.optimizers.space import ParameterSpace
from hydroagent_hpc.env.toolcalls import render_tool_response

if TYPE_CHECKING:
    from hydroagent_hpc.env.environment import CalibrationEnv

log = logging.getLogger(__name__)

__all__ = ["HybridPolicy"]


class HybridPolicy:
    """Warm start (``warm_start``: "heuristic" or any text Policy object) then DDS."""

    def __init__(self, seed: int, budget: int, name: str = "hybrid", warm_start: Any = "heuristic",
                 warm_simulations: int = 50) -> None:
        if warm_simulations < 1 or warm_simulations >= budget:
            raise ValueError(f"warm_simulations={warm_simulations}: must be at least 1 and below the budget {budget}")
        self.seed, self.budget, self.name = seed, int(budget), name
        self.warm = HeuristicHydrologist(seed=seed) if warm_start == "heuristic" else warm_start
        if not isinstance(self.warm, Policy):
            raise ValueError("warm_start must be 'heuristic' or a text policy with act(messages)")
        self.warm_simulations = int(warm_simulations)
        self.usage: dict[str, Any] = {}

    def run(self, env: CalibrationEnv) -> None:
        messages = [dict(m) for m in env.messages]
        best, best_nse = None, -math.inf
        while not env.done and env.counters["simulations"] < self.warm_simulations:
            text = self.warm.act(messages)
            if text is None:
                break
            result = env.step(text)
            messages.append({"role": "assistant", "content": text})
            for obs in result.observations:
                messages.append({"role": "tool", "content": render_tool_response(obs)})
                nse = obs.get("NSE") if obs.get("status") == "ok" else None
                if isinstance(nse, (int, float)) and math.isfinite(nse) and nse > best_nse:
                    best_nse, best = float(nse), None  # the parameters come from the last set_parameters
            if best is None and best_nse > -math.inf:
                best = _last_params(env.turns, env.parameters.tunable)
        self.usage = dict(getattr(self.warm, "usage", {}) or {})
        if env.done:
            return
        remaining = self.budget - env.counters["simulations"]
        if remaining <= 0:
            return
        dds = DDS(self.seed, remaining, space=ParameterSpace.of(env.parameters, "linear"))
        if best is not None:
            dds.tell([best], [best_nse])
        log.info("%s: warm start reached NSE %.3f after %d simulations; DDS takes %d more", self.name, best_nse,
                 env.counters["simulations"], remaining)
        OptimizerPolicy(dds, name=self.name).run(env)


def _last_params(turns, names: tuple[str, ...]) -> dict[str, float] | None:
    """The tunable ``names`` as the most recent successful set_parameters observation showed them."""
    for t in reversed(turns):
        if t.tool == "set_parameters" and t.ok:
            shown = t.observation.get("params") or t.observation.get("validated_params")
            if isinstance(shown, dict):
                return {k: float(shown[k]) for k in names if k in shown}
    return None
