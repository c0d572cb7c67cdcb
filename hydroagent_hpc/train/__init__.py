"""Training: supervised fine-tuning and GRPO on the simulator's reward, read top to bottom.

- SFT: :mod:`~hydroagent_hpc.train.sft.data` (campaign stores -> weighted, token-exact
  trajectories), :mod:`~hydroagent_hpc.train.sft.config` (the strict SFT config),
  :mod:`~hydroagent_hpc.train.sft.trainer` (the trainer), :mod:`~hydroagent_hpc.train.checkpoint` (exact
  resume, shared with GRPO), :mod:`~hydroagent_hpc.train.distributed` (several processes: FSDP2
  sharding, all-reduces, signals agreed across ranks, gathered weights; shared with GRPO).
- GRPO (docs/grpo.md): :mod:`~hydroagent_hpc.train.generation.sampler` (batched, seeded, prefix-cached
  generation), :mod:`~hydroagent_hpc.train.generation.engine` (generation by an SGLang or vLLM server instead),
  :mod:`~hydroagent_hpc.train.generation.engine_process` (its launcher and the weight push after each step),
  :mod:`~hydroagent_hpc.train.generation.engine_server` (a loopback engine of our own, for tests and small
  models), :mod:`~hydroagent_hpc.train.generation.rollout` (one thread per episode, the cap on
  simulations in flight, shared runs), :mod:`~hydroagent_hpc.train.grpo.advantages`,
  :mod:`~hydroagent_hpc.train.grpo.loss`, :mod:`~hydroagent_hpc.train.grpo.config`,
  :mod:`~hydroagent_hpc.train.grpo.trainer` (the trainer) and :mod:`~hydroagent_hpc.train.grpo.launch`
  (its command line and MPI rank split).
- Cluster jobs: :mod:`~hydroagent_hpc.train.submit` (submitit); throughput:
  :mod:`~hydroagent_hpc.train.measure.throughput`.
- :mod:`~hydroagent_hpc.train.tiny` builds a tiny random Qwen3 causal LM, a byte-level BPE
  tokenizer trained in milliseconds on synthetic calibration text, and a Qwen-style chat template
  with Hermes tool calls, so tests exercise the real Hugging Face code paths offline on a CPU.

This package imports nothing at import time: ``torch``, ``tokenizers`` and ``transformers`` are
loaded only when a submodule that needs them is imported. Nothing in ``sim/``, ``env/`` or
``agents/`` imports it.
"""
