"""Language-model policies: any OpenAI-compatible endpoint, and a local Hugging Face checkpoint.

- :mod:`~hydroagent_hpc.agents.llm.models_file`: the models file (which endpoint, key variable, prices);
- :mod:`~hydroagent_hpc.agents.llm.client`: one robust chat-completion request (retries, limits, accounting);
- :mod:`~hydroagent_hpc.agents.llm.openai_api`: :class:`OpenAIAgent`, native or Hermes tool calls;
- :mod:`~hydroagent_hpc.agents.llm.hf_local`: :class:`HFLocalPolicy`, token-exact local generation;
- :mod:`~hydroagent_hpc.agents.llm.replay_server`: a loopback server replaying recorded responses.

Nothing is imported here at import time, so ``openai`` and ``torch`` stay optional.
"""
