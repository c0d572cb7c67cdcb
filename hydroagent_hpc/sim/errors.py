"""Errors the simulator raises for bad input and failed runs.

Every message names what is wrong, where (file and line when there is one) and the fix, so the
command line can print it without a traceback.
"""

from __future__ import annotations

from hydroagent_hpc.errors import HydroAgentError

__all__ = ["HydroAgentError", "InputError", "ControlFileError", "SimulationError"]


class InputError(HydroAgentError):
    """A grid, forcing file, observation file or parameter value that cannot be used."""


class ControlFileError(InputError):
    """A control-file problem, located at ``path:line`` and naming the section and key."""

    def __init__(self, message: str, path: str = "", line: int = 0, key: str = "", fix: str = "") -> None:
        where = f"{path}:{line}: " if path and line else (f"{path}: " if path else "")
        self.path, self.line, self.key = path, line, key
        super().__init__(f"{where}{message}", fix=fix)


class SimulationError(HydroAgentError):
    """A run that failed: the simulator (embedded or EF5) produced no valid output."""
