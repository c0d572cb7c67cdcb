"""``python -m hydroagent_hpc.train.sft CONFIG --out RUN_DIR [--resume]``: :func:`hydroagent_hpc.train.sft.launch.main`
(what ``slurm/sft.sbatch`` and ``hydroagent train submit sft`` launch, under ``accelerate launch`` for several GPUs)."""

import sys

from hydroagent_hpc.train.sft.launch import main

sys.exit(main())
