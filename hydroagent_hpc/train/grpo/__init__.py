"""GRPO with the simulator as the verifier (docs/grpo.md).

- :mod:`~hydroagent_hpc.train.grpo.config`: the GRPO config (strict YAML; every key documented there).
- :mod:`~hydroagent_hpc.train.grpo.advantages`: group-relative advantages, per episode and per turn.
- :mod:`~hydroagent_hpc.train.grpo.loss`: the clipped policy loss, KL to the reference, chunked log-probs.
- :mod:`~hydroagent_hpc.train.grpo.trainer`: the trainer (rollouts through
  :mod:`hydroagent_hpc.train.generation`, the step, checkpoints).
- :mod:`~hydroagent_hpc.train.grpo.launch`: the command line and the MPI rank split, run as
  ``python -m hydroagent_hpc.train.grpo CONFIG --out RUN [--resume]`` (``__main__.py``), the one
  entry point; ``hydroagent train grpo`` calls the same :func:`~hydroagent_hpc.train.grpo.launch.run`.

Importing this package loads nothing (MPI simulation ranks import it and never load torch); the
trainer, the loss and the advantages load torch when imported.
"""
