"""The whole recipe as one reproducible pipeline (issue 18): basins -> base policy -> teacher campaign ->
SFT data -> SFT -> GRPO -> evaluation campaign -> report.

- :mod:`~hydroagent_hpc.pipeline.spec`: the strict pipeline file (``data/pipelines/*.yaml``);
- :mod:`~hydroagent_hpc.pipeline.state`: checksums and the per-stage records in the run folder;
- :mod:`~hydroagent_hpc.pipeline.stages`: what each stage reads, writes and does (skip, resume, fresh);
- :mod:`~hydroagent_hpc.pipeline.runner`: ``hydroagent pipeline run`` and ``pipeline status``;
- :mod:`~hydroagent_hpc.pipeline.submit`: ``hydroagent pipeline submit``, the stages as Slurm jobs
  chained with ``afterok`` through submitit;
- :mod:`~hydroagent_hpc.pipeline.report`: the report (Table 1, NSE against simulations, training curves).

It sits on top of campaign/, train/ and report/ and reuses them: campaigns and trainers resume from
their run folders, so the pipeline only decides which stage runs and records what it read and wrote.
"""

from hydroagent_hpc.pipeline.spec import STAGES, PipelineSpec, load_pipeline
from hydroagent_hpc.pipeline.state import PipelineError

__all__ = ["STAGES", "PipelineError", "PipelineSpec", "load_pipeline"]
