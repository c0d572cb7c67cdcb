"""The ``engine`` section of a GRPO config: which inference server generates, and how it is reached.

Light on purpose (no torch, no HTTP): the GRPO config, the pipeline file and the memory plan check it
without loading the engine client (:mod:`hydroagent_hpc.train.generation.engine`, whose API classes follow
:data:`ENGINE_API_RELOAD`). ``docs/grpo.md`` ("Generation by an engine") has the walk-through.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

from hydroagent_hpc.settings import MAX_TIMEOUT_S, Settings, invalid, setting

__all__ = ["EngineSettings", "ENGINE_API_RELOAD", "parse_gpus"]

#: The engine APIs a GRPO run can drive, and whether each loads new weights from a folder while it
#: runs (SGLang's ``/update_weights_from_disk``) or must be restarted on each checkpoint (vLLM).
ENGINE_API_RELOAD: dict[str, bool] = {"sglang": True, "vllm": False}

_GPU_ID = re.compile(r"\d+|(GPU|MIG)-[0-9A-Za-z/-]+")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_gpus(value: Any) -> tuple[str, ...]:
    """``engine.gpus`` as ``CUDA_VISIBLE_DEVICES`` entries: a list of device ids or UUIDs, or one
    comma-separated string (``[3]``, ``[2, 3]``, ``"2,3"``, ``["GPU-8f1c..."]``)."""
    items = value.split(",") if isinstance(value, str) else value if isinstance(value, (list, tuple)) else [value]
    out = []
    for item in items:
        text = str(item).strip() if isinstance(item, (int, str)) and not isinstance(item, bool) else None
        if not text or not _GPU_ID.fullmatch(text):
            raise invalid((), f"{value!r} is not a list of GPU ids",
                          "e.g. gpus: [3] or gpus: '2,3' (CUDA device ids or GPU-... UUIDs for the engine)")
        out.append(text)
    if not out or len(set(out)) != len(out):
        raise invalid((), f"{value!r} names no GPU or one GPU twice", "list each engine GPU once")
    return tuple(out)


@dataclass(frozen=True)
class EngineSettings(Settings):
    """The ``engine`` mapping of a GRPO config (``generator: engine``), and how a client reaches a server.

    A GRPO run also needs ``launch`` for an API that cannot reload weights while it runs (vLLM):
    :meth:`hydroagent_hpc.train.grpo.config.GRPOConfig.check` asks for it.
    """

    section: ClassVar[str] = "engine"

    api: str = setting(choices=tuple(ENGINE_API_RELOAD), help="the server's API: sglang or vllm")
    url: str = setting(nonempty=True, help="the server's base URL, e.g. http://node12:30000 (without /v1)",
                       fix="e.g. http://127.0.0.1:30000 (the server's base URL, without /v1)")
    launch: tuple[str, ...] | None = setting(
        None, nonempty=True, help="the argument list that starts the server ({model}: the weights folder, "
                                  "{api_key}: the key); null: a server someone else started",
        fix="e.g. [python, -m, sglang.launch_server, --model-path, '{model}', --port, '30000']")
    api_key_env: str | None = setting(None, nonempty=True, help="the environment variable that holds the API key "
                                                                "(never the key itself)")
    model_name: str | None = setting(None, nonempty=True, help="vLLM's served model name (null: the first of "
                                                               "/v1/models)")
    timeout_s: float = setting(600.0, gt=0, le=MAX_TIMEOUT_S, help="seconds one generation request may take")
    start_timeout_s: float = setting(900.0, gt=0, le=MAX_TIMEOUT_S,
                                     help="seconds a launched server may take to answer /health")
    weights_dir: str | None = setting(None, path=True, nonempty=True,
                                      help="where pushed weights are written; the engine must see it (null: "
                                           "RUN/engine-weights)")
    gpus: tuple[str, ...] | None = setting(
        None, convert=parse_gpus, help="CUDA_VISIBLE_DEVICES entries of a launched engine (null: the visible GPUs "
                                       "after the trainers')")

    def check(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise invalid("url", f"expected an http(s) URL, got {self.url!r}",
                          "e.g. http://127.0.0.1:30000 (the server's base URL, without /v1)")
        if self.launch is not None:
            if not all(self.launch):
                raise invalid("launch", "holds an empty argument")
            if not any("{model}" in a for a in self.launch):
                raise invalid("launch", "no {model} argument", "write {model} where the server takes its model folder")
        if self.api_key_env is not None and not _ENV_NAME.fullmatch(self.api_key_env):
            raise invalid("api_key_env", f"{self.api_key_env!r} is not a variable name",
                          "name the environment variable that holds the key, never the key itself")

    @property
    def base(self) -> str:
        return self.url.rstrip("/")
