"""hydroagent-hpc: train and benchmark LLM agents that calibrate the CREST/EF5 hydrologic model."""

__version__ = "0.1.0"
