"""Generation for GRPO and evaluation: turning a policy into episodes, apart from the trainers.

- :mod:`~hydroagent_hpc.train.generation.sampler`: batched, seeded, prefix-cached generation in
  process (the generation server the rollouts call).
- :mod:`~hydroagent_hpc.train.generation.engine_config`: the ``engine`` section of a GRPO config
  (no torch); :mod:`~hydroagent_hpc.train.generation.engine`: generation by an SGLang or vLLM
  server instead; :mod:`~hydroagent_hpc.train.generation.engine_process`: its launcher and the
  weight push after each step; :mod:`~hydroagent_hpc.train.generation.engine_server`: a loopback
  engine of our own, for tests and small models.
- :mod:`~hydroagent_hpc.train.generation.rollout`: one thread per episode, the cap on simulations
  in flight, shared runs; :mod:`~hydroagent_hpc.train.generation.coalesce`: a basin's queued
  simulations run as one batched call.

Nothing here imports a trainer (tests/test_architecture.py holds that).
"""
