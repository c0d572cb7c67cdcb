"""``python -m hydroagent_hpc.train.grpo CONFIG --out RUN [--resume] [--pool threads|mpi] [--trainers T]``: GRPO's
one entry point, :func:`hydroagent_hpc.train.grpo.launch.main` (what ``slurm/grpo.sbatch`` runs on every rank, what
``hydroagent train submit grpo`` launches, under ``torchrun``/``accelerate launch``/``mpiexec`` as well). It splits
the MPI ranks before torch is loaded: only training ranks import the trainer."""

import sys

from hydroagent_hpc.train.grpo.launch import main

sys.exit(main())
