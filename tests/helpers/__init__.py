"""Helpers shared by several test modules (test modules never import each other).

- :mod:`helpers.hpc`: a small campaign file, the job environment, and comparisons of stored
  episodes across backends (serial, processes, MPI, Slurm).
- :mod:`helpers.waiting`: wait for a condition with a deadline instead of sleeping a fixed time.
- :mod:`helpers.pipeline`: the demo pipeline file cut to seconds (tests/test_pipeline*.py).
- :mod:`helpers.series`: synthetic hourly hydrographs for the metric tests.

``tests/`` is on ``sys.path`` when pytest runs (rootdir conftest, no ``__init__.py`` in tests/),
so test modules write ``from helpers.hpc import write_campaign``.
"""
