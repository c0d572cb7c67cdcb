"""Training: supervised fine-tuning and GRPO on the simulator's reward, by job.

- :mod:`hydroagent_hpc.train.sft`: SFT's :mod:`~hydroagent_hpc.train.sft.config` (the strict SFT
  config), :mod:`~hydroagent_hpc.train.sft.data` (campaign stores -> weighted, token-exact
  trajectories) and :mod:`~hydroagent_hpc.train.sft.trainer`; ``python -m hydroagent_hpc.train.sft``.
- :mod:`hydroagent_hpc.train.grpo` (docs/grpo.md): GRPO's :mod:`~hydroagent_hpc.train.grpo.config`,
  :mod:`~hydroagent_hpc.train.grpo.advantages`, :mod:`~hydroagent_hpc.train.grpo.loss`,
  :mod:`~hydroagent_hpc.train.grpo.trainer` and :mod:`~hydroagent_hpc.train.grpo.launch` (its command
  line and MPI rank split); ``python -m hydroagent_hpc.train.grpo`` is its one entry point.
- :mod:`hydroagent_hpc.train.generation`: policy -> episodes, apart from the trainers (the in-process
  sampler, SGLang/vLLM engines and their weight push, a loopback engine, rollouts, run coalescing).
- :mod:`hydroagent_hpc.train.measure`: throughput of SFT and GRPO steps, the sampler's benchmark and
  the GPU check (the commands are named in ``hydroagent_hpc/bench/``).
- Shared by both trainers, here: :mod:`~hydroagent_hpc.train.checkpoint` (exact resume),
  :mod:`~hydroagent_hpc.train.distributed` (FSDP2 sharding, all-reduces, signals agreed across ranks,
  gathered weights), :mod:`~hydroagent_hpc.train.rundir` (run folder, config record, metrics.csv),
  :mod:`~hydroagent_hpc.train.signals`, :mod:`~hydroagent_hpc.train.memory_plan` (GPU memory of a
  run), :mod:`~hydroagent_hpc.train.submit` (requeueable cluster jobs, submitit),
  :mod:`~hydroagent_hpc.train.evaluation` (batched greedy evaluation of a checkpoint) and
  :mod:`~hydroagent_hpc.train.tiny`: a tiny random Qwen3 causal LM, a byte-level BPE tokenizer
  trained in milliseconds on synthetic calibration text, and a Qwen-style chat template with Hermes
  tool calls, so tests exercise the real Hugging Face code paths offline on a CPU.

This package imports nothing at import time (nor do its subpackages): ``torch``, ``tokenizers`` and
``transformers`` are loaded only when a module that needs them is imported. Nothing in ``sim/``,
``env/`` or ``agents/`` imports it. tests/test_architecture.py holds the directions inside it:
generation imports no trainer, SFT and GRPO not each other, nothing imports measure.
"""
