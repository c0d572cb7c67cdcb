"""Campaigns: agents x basins x seeds under one protocol, run into one HDF5 store, resumably.

- :mod:`~hydroagent_hpc.campaign.spec`: the strict campaign file and its expansion into episodes;
- :mod:`~hydroagent_hpc.campaign.run`: running the episodes on a pool into one store;
- :mod:`~hydroagent_hpc.campaign.shards`: one store per Slurm array task, and the exact merge;
- :mod:`~hydroagent_hpc.campaign.submit`: choosing the pool, and submitting to Slurm via submitit.
"""

from hydroagent_hpc.campaign.run import run_campaign, run_task, worker_init
from hydroagent_hpc.campaign.spec import (
                                          AGENT_KINDS,
                                          AgentSpec,
                                          CampaignNotReadyError,
                                          CampaignSpec,
                                          Task,
                                          campaign_from_mapping,
                                          check_requirements,
                                          ensure_ready,
                                          expand,
                                          load_campaign,
                                          shard_of,
)

__all__ = ["AGENT_KINDS", "AgentSpec", "CampaignNotReadyError", "CampaignSpec", "Task", "campaign_from_mapping",
           "check_requirements", "ensure_ready", "expand", "load_campaign", "shard_of", "run_campaign", "run_task",
           "worker_init"]
