"""Measuring the trainers and the sampler (torch needed, so it lives under ``train/``), apart from them.

- :mod:`~hydroagent_hpc.train.measure.throughput`: timed full-parameter SFT steps, model FLOPs per
  token, MFU, random Qwen3-shaped models (``python -m hydroagent_hpc.bench.train``).
- :mod:`~hydroagent_hpc.train.measure.grpo_throughput`: the parts of a GRPO step (prefill, decode,
  one optimizer step) and the step they add up to (``python -m hydroagent_hpc.bench.train --grpo``).
- :mod:`~hydroagent_hpc.train.measure.sampling`: one decode step's sampling, before and after audit
  F13 (``python -m hydroagent_hpc.bench.sampler``).
- :mod:`~hydroagent_hpc.train.measure.trl_compare`: our SFT and GRPO losses beside TRL's on the same batch,
  speed and memory (``python -m hydroagent_hpc.bench.trl``, docs/trl.md).
- :mod:`~hydroagent_hpc.train.measure.gpu_check`: the check to run first on a GPU (``make gpu-check``,
  ``python -m hydroagent_hpc.bench.gpu_check``).

The commands are named among the benchmarks in ``hydroagent_hpc/bench/``, which import these modules
inside their functions, so importing a benchmark loads no torch. Nothing else of ``train/`` imports
this package (tests/test_architecture.py holds that).
"""
