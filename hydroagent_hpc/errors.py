"""The one error base of the toolkit, and the exit status each kind of error maps to.

Every error raised on purpose (bad input, a store that cannot be read, a campaign that cannot run,
a failed simulation, an unusable models file) derives from :class:`HydroAgentError`, so the
``hydroagent`` command has one error path: it prints the message (which names what is wrong, where,
and the fix) on one line and exits with :attr:`HydroAgentError.exit_code`, without a traceback.
"""

from __future__ import annotations

import os

__all__ = ["HydroAgentError", "ConfigError", "UsageError", "CannotHealError", "one_line", "DEBUG_ENV",
           "tracebacks_wanted"]

#: Set to "1" by ``hydroagent --debug`` (and inherited by its worker processes and MPI ranks): errors are then
#: logged with their tracebacks. Without it a log shows each error as its one line.
DEBUG_ENV = "HYDROAGENT_DEBUG"


def tracebacks_wanted() -> bool:
    """Whether logs should carry tracebacks (``hydroagent --debug``, or :data:`DEBUG_ENV` set to 1)."""
    return os.environ.get(DEBUG_ENV, "") == "1"


class HydroAgentError(Exception):
    """Base class of the errors the ``hydroagent`` command prints as one clear message.

    ``fix`` (optional) is printed on a second line as ``fix: ...``. ``exit_code`` is the status the
    command exits with: 2 for input and usage errors (the default), 1 for a run that could not
    complete (an incomplete merge, say).
    """

    exit_code: int = 2

    def __init__(self, message: str = "", fix: str = "") -> None:
        self.message = message
        self.fix = fix
        super().__init__(f"{message}" + (f"\n  fix: {fix}" if fix else ""))


def one_line(exc: BaseException) -> str:
    """The error's message (with its fix, and any message it wraps) as one line for the command line.

    Line breaks become "; " (``"... \n  fix: ..."`` reads ``"...; fix: ..."``), so a log or a
    terminal shows each error as exactly one line.
    """
    lines = [line.strip() for line in str(exc).splitlines()]
    return "; ".join(line for line in lines if line) or type(exc).__name__


class ConfigError(HydroAgentError, ValueError):
    """A configuration value that cannot be used; the message names where and how to fix it.

    ``at`` is the key path the error is about (``("grpo", "lr")``), ``problem`` the message without the
    key and place, and ``located`` whether the message already starts with ``FILE:LINE``
    (:mod:`hydroagent_hpc.settings` fills them).
    """

    at: tuple[str | int, ...] = ()
    problem: str | None = None
    located: bool = False


class UsageError(HydroAgentError, ValueError):
    """A command-line argument that cannot be used; the message names the option."""


class CannotHealError(HydroAgentError):
    """A failure that no retry and no later episode can heal: a hosted model that refuses the key (HTTP
    401/403) or does not know the model (404, "model not found"), a missing API key, a model that does
    not load, a missing package.

    An episode that meets one does not end as a "policy_error" episode: the error leaves the episode,
    and a campaign stops at once (:mod:`hydroagent_hpc.campaign.run`), printing this one line, which
    names the model and the fix. Transient failures (429, 5xx, timeouts) are not of this class.
    """
