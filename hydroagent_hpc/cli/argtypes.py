"""``type=`` functions for the command's numeric options: a bad value is an argparse usage error.

argparse turns the :class:`argparse.ArgumentTypeError` these raise into ``hydroagent SUBCOMMAND: error:
argument --OPTION: MESSAGE`` and exit status 2, before any command runs, so a negative worker count,
a NaN timeout or a seed the store cannot hold never starts work.
"""

from __future__ import annotations

import argparse
import math

__all__ = ["positive_int", "nonnegative_int", "seed", "positive_float", "probability", "nse_target", "SEED_RANGE"]

#: The seeds numpy's generators and the store's int64 column accept; the same bound as
#: :data:`hydroagent_hpc.campaign.spec.SEED_RANGE` (not imported: the command starts without the campaign code).
SEED_RANGE = (0, 2**63 - 1)


def _int(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r}: give a finite number")
    return value


def positive_int(text: str) -> int:
    """A whole number of at least 1 (workers, jobs, CPUs, minutes, cells)."""
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def nonnegative_int(text: str) -> int:
    """A whole number of at least 0 (days, limits; 0 where the option's help says what it means)."""
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} must be 0 or more")
    return value


def probability(text: str) -> float:
    """A probability: a finite number from 0 to 1 (0 where the option's help says it turns a feature off)."""
    value = _float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{value:g} is not a probability; give a number from 0 to 1")
    return value


def seed(text: str) -> int:
    """A seed the random generators and the store accept: 0 to 2**63 - 1."""
    value = _int(text)
    lo, hi = SEED_RANGE
    if not lo <= value <= hi:
        raise argparse.ArgumentTypeError(f"{value} is out of range; seeds are whole numbers from {lo} to {hi}")
    return value


def positive_float(text: str) -> float:
    """A finite number above 0 (seconds, areas, sizes)."""
    value = _float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value:g} must be above 0")
    return value


def nse_target(text: str) -> float:
    """A finite NSE target of at most 1 (NSE cannot exceed 1)."""
    value = _float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"{value:g}: an NSE is at most 1")
    return value
