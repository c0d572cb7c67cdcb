"""Training: supervised fine-tuning and GRPO on the simulator's reward (arriving with issues 14-15).

What is here now: :mod:`hydroagent_hpc.train.tiny` builds a tiny random Qwen3 causal LM, a
byte-level BPE tokenizer trained in milliseconds on synthetic calibration text, and a Qwen-style
chat template with Hermes tool calls, so tests of the local policy and the trainers exercise the
real Hugging Face code paths offline on a CPU in seconds.

This package imports nothing at import time: ``torch``, ``tokenizers`` and ``transformers`` are
loaded only when a submodule is imported. Nothing in ``sim/``, ``env/`` or ``agents/`` imports it.
"""
