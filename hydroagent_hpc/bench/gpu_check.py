"""``python -m hydroagent_hpc.bench.gpu_check``: the check to run first on a GPU (``make gpu-check``).

The checks live with the trainers they exercise, in :mod:`hydroagent_hpc.train.measure.gpu_check` (torch is
imported only under ``train/``); this module is the command's name among the benchmarks.
"""

from __future__ import annotations

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """:func:`hydroagent_hpc.train.measure.gpu_check.main` (imported here: importing this module loads no torch)."""
    from hydroagent_hpc.train.measure.gpu_check import main as run

    return run(argv)

if __name__ == "__main__":
    raise SystemExit(main())
