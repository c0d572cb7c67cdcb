"""The trajectory builder the trainers use: :mod:`hydroagent_hpc.agents.llm.trajectory`, re-exported.

The builder lives in ``agents/llm`` so the local policy (:class:`HFLocalPolicy`) and the trainers
share one implementation without ``agents`` importing ``train`` (training code may import the
agents; never the reverse). SFT data (:mod:`hydroagent_hpc.train.sft_data`) and GRPO build their
sequences with it, so training ids are the ids a policy sees at inference time.
"""

from hydroagent_hpc.agents.llm.trajectory import (
                                                  END_TOKEN,
                                                  TemplatePrefixError,
                                                  Trajectory,
                                                  TrajectoryBuilder,
                                                  TrajectoryError,
                                                  common_prefix,
)

__all__ = ["Trajectory", "TrajectoryBuilder", "TrajectoryError", "TemplatePrefixError", "common_prefix",
           "END_TOKEN"]
