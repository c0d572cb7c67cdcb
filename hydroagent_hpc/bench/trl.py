"""``python -m hydroagent_hpc.bench.trl``: our SFT and GRPO losses, speed and memory beside TRL's.

The measurement lives under ``train/``, in :mod:`hydroagent_hpc.train.measure.trl_compare` (torch and
TRL are imported only under ``train/``; its ``COMMAND_DOC`` describes the command, docs/trl.md the
results); this module is the command's name among the benchmarks.
"""

from __future__ import annotations

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """:func:`hydroagent_hpc.train.measure.trl_compare.main` (imported here: importing this module loads no torch)."""
    from hydroagent_hpc.train.measure.trl_compare import main as run

    return run(argv)


if __name__ == "__main__":
    raise SystemExit(main())
