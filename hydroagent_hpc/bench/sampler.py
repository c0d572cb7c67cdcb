"""``python -m hydroagent_hpc.bench.sampler``: one decode step's sampling, before and after audit F13.

The measurement lives under ``train/``, in :mod:`hydroagent_hpc.train.measure.sampling` (torch is
imported only under ``train/``); this module is the command's name among the benchmarks.
"""

from __future__ import annotations

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """:func:`hydroagent_hpc.train.measure.sampling.main` (imported here: importing this module loads no torch)."""
    from hydroagent_hpc.train.measure.sampling import main as run

    return run(argv)

if __name__ == "__main__":
    raise SystemExit(main())
