"""Supervised fine-tuning on teacher trajectories.

- :mod:`~hydroagent_hpc.train.sft.data`: campaign stores -> weighted, token-exact trajectories
  (``hydroagent train sft-data``).
- :mod:`~hydroagent_hpc.train.sft.config`: the SFT config (strict YAML; every key documented there).
- :mod:`~hydroagent_hpc.train.sft.trainer`: the trainer (``hydroagent train sft``,
  ``python -m hydroagent_hpc.train.sft CONFIG --out RUN_DIR [--resume]``).

Importing this package loads nothing: its modules load torch and transformers when imported.
"""
