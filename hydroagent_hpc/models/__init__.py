"""Small Hugging Face models built on the spot (no hub, no downloads).

:mod:`hydroagent_hpc.models.tiny` builds a tiny random Qwen3 causal LM, a byte-level BPE
tokenizer trained in milliseconds on synthetic calibration text, and a Qwen-style chat template
with Hermes tool calls. Tests of the local policy, the SFT and the GRPO trainers use them so the
whole training/inference path runs offline on a CPU in seconds.

This package imports nothing at import time: ``torch``, ``tokenizers`` and ``transformers`` are
loaded only when :mod:`hydroagent_hpc.models.tiny` is imported.
"""
