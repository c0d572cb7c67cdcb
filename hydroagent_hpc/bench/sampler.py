"""``python -m hydroagent_hpc.bench.sampler``: one decode step's sampling, before and after audit F13.

The measurement lives beside the sampler, in :mod:`hydroagent_hpc.train.sampler_bench` (torch is
imported only under ``train/``); this module is the command's name among the benchmarks.
"""

from __future__ import annotations

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """:func:`hydroagent_hpc.train.sampler_bench.main` (imported here, so that importing this module loads no torch)."""
    from hydroagent_hpc.train.sampler_bench import main as run

    return run(argv)

if __name__ == "__main__":
    raise SystemExit(main())
