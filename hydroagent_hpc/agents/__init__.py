"""Policies that calibrate: one protocol (given the conversation so far, the next message).

The protocols are in :mod:`hydroagent_hpc.agents.base` (:class:`~hydroagent_hpc.agents.base.Policy`
for text agents, :class:`~hydroagent_hpc.agents.base.DirectPolicy` for optimizers); the agent kinds
a campaign can name are the one table :data:`hydroagent_hpc.agents.factory.AGENT_KINDS` (adding a
kind: ``docs/adding-an-agent.md``).
"""
