"""The GRPO run configuration: one strict YAML file -> a frozen :class:`GRPOConfig`.

Example (``basins`` is required; every other key has a default, and ``preset`` chooses the
defaults of the recipe keys)::

    preset: paper                    # paper | released (docs/reference-implementation.md section 7)
    model: ../results/sft/final      # the initial policy: an SFT checkpoint (paper) or the base (released)
    basins: [../basins/syn_a, ../basins/syn_b]     # training prompts (basin folders)
    validation_basins: [../basins/syn_heldout]     # held out: validated on, never trained on
    group_size: 8                    # K rollouts per prompt
    prompts_per_step: 4
    max_steps: 100
    env: {max_turns: 50, max_simulations: 50}      # EnvConfig overrides on top of the preset

Recipe keys and their preset defaults (a key given in the file always wins):

=====================  ==============  ==================
key                    paper           released
=====================  ==============  ==================
group_size             8               6
kl_coef                0.2             0.05
advantage              episode         released
=====================  ==============  ==================

``tis_cap`` (default 0 = off): truncated importance weights ``min(p_trainer / p_generator, cap)`` on
each token's advantage, for generators whose numbers differ from the trainer's.

Generation (``docs/grpo.md``, "Generation by an engine"):

=====================  ==============================================================================
key                    meaning
=====================  ==============================================================================
generator              ``local`` (default: in-process transformers) or ``engine`` (an HTTP server)
engine.api             ``sglang`` or ``vllm`` (:data:`hydroagent_hpc.train.engine.ENGINE_APIS`)
engine.url             the server's base URL, e.g. ``http://node12:30000`` (required)
engine.launch          null (a server you started) or the argument list that starts one; ``{model}``
                       is replaced by the weights folder (required in it), ``{api_key}`` by the key.
                       ``vllm`` needs it: the trainer restarts vLLM on each new checkpoint
engine.api_key_env     the environment variable holding the API key (null: no key); the key itself
                       is never written to the config, the logs or the run folder
engine.model_name      vLLM's served model name (null: the first of ``/v1/models``)
engine.timeout_s       seconds one generation request may take (600)
engine.start_timeout_s seconds a launched server may take to answer ``/health`` (900)
engine.weights_dir     where the pushed weights are written; the engine must see it (null:
                       ``RUN/engine-weights``)
engine.gpus            the launched engine's ``CUDA_VISIBLE_DEVICES`` entries (null: the visible GPUs
                       after the first T, T = the trainer processes on the node)
=====================  ==============================================================================

Several training processes (``torchrun``/``accelerate launch``; ``docs/grpo.md``, "Several GPUs"):

=======================  ============================================================================
key                      meaning
=======================  ============================================================================
fsdp                     ``auto`` (default: FSDP2 whenever there is more than one process), ``true``
                         (the same; with one process it trains a plain module), ``false`` (DDP: every
                         rank holds the whole model)
activation_checkpointing recompute each decoder layer's activations in the backward pass (false; the
                         paper configs turn it on: without it a 21.5k-token Qwen3-4B episode keeps
                         ~130 GiB of activations, and the memory plan refuses such a config on a GPU)
collective_timeout_s     how long a rank may wait in a collective (10800 s). Ranks 1..W-1 wait in a
                         broadcast while rank 0 plays a step's rollouts (minutes to tens of minutes);
                         NCCL's own default of 10 minutes would kill them (gpu-audit F4)
=======================  ============================================================================

With more than one process the policy is trained on every rank but only rank 0 generates, so
``generator: engine`` is required (checked by :func:`load_grpo_config` when ``world_size`` > 1).

Both: lr 1e-6 with ``warmup_steps`` linear warm-up then constant, weight decay 0, gradient clip
1.0, entropy 0.01, clip 0.2 / 0.2, ``token-mean`` aggregation, temperature 1.0, top-p 0.95,
at most 32 simulations in flight (``max_simulations_in_flight``), and ``sim_batch: 8``: up to 8
runs of one basin that wait for a simulation slot at the same moment (a GRPO group's members) run
as one batched call in one slot (:mod:`hydroagent_hpc.train.coalesce`; results bit-identical to
single runs; 1 runs every simulation alone). Unknown keys, wrong types and out-of-range values are refused
with the file and line of the key; relative paths are resolved against the config file's folder.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydroagent_hpc.errors import ConfigError
from hydroagent_hpc.yamlio import brief, load_strict

__all__ = ["GRPOConfig", "GRPOConfigError", "load_grpo_config", "grpo_config_from_mapping", "check_world_size",
           "PRESET_DEFAULTS"]

ADVANTAGES = ("episode", "turn", "released")
AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")

#: The recipe keys whose defaults depend on the preset.
PRESET_DEFAULTS: dict[str, dict[str, Any]] = {
    "paper": {"group_size": 8, "kl_coef": 0.2, "advantage": "episode"},
    "released": {"group_size": 6, "kl_coef": 0.05, "advantage": "released"},
}


class GRPOConfigError(ConfigError):
    """A GRPO config that cannot be used (names the file:line and the fix)."""


@dataclass(frozen=True)
class GRPOConfig:
    """Everything that decides a GRPO run (written, resolved, into ``RUN_DIR/config.yaml``)."""

    basins: tuple[str, ...]
    preset: str = "paper"
    model: str = "tiny"
    validation_basins: tuple[str, ...] = ()
    env: dict[str, Any] = field(default_factory=dict)
    group_size: int = 8
    prompts_per_step: int = 4
    max_steps: int = 10
    advantage: str = "episode"
    gamma: float = 1.0
    std_normalise: bool = True
    lr: float = 1e-6
    warmup_steps: int = 0
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    clip_low: float = 0.2
    clip_high: float = 0.2
    tis_cap: float = 0.0
    kl_coef: float = 0.2
    entropy_coef: float = 0.01
    aggregation: str = "token-mean"
    norm_length: int | None = None
    temperature: float = 1.0
    top_p: float = 0.95
    top_k: int = 0
    max_new_tokens: int = 512
    max_context_tokens: int = 8192
    max_simulations_in_flight: int = 32
    sim_batch: int = 8
    share_runs: bool = True
    generation_batch: int = 64
    prefix_cache: bool = True
    logprob_chunk: int = 1024
    seed: int = 0
    dtype: str = "auto"
    save_every: int = 0
    keep_checkpoints: int = 2
    validate_every: int = 0
    simulator: str = "embedded"
    generator: str = "local"
    engine: dict[str, Any] | None = None
    fsdp: bool | str = "auto"
    activation_checkpointing: bool = False
    collective_timeout_s: float = 10800.0

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["basins"], d["validation_basins"] = list(self.basins), list(self.validation_basins)
        return d


_INT = {"group_size": 1, "prompts_per_step": 1, "max_steps": 1, "warmup_steps": 0, "top_k": 0, "max_new_tokens": 1,
        "max_context_tokens": 2, "max_simulations_in_flight": 1, "generation_batch": 1, "logprob_chunk": 1,
        "seed": None, "save_every": 0, "keep_checkpoints": 0, "validate_every": 0, "norm_length": 1}
_FLOAT = ("gamma", "lr", "weight_decay", "max_grad_norm", "clip_low", "clip_high", "kl_coef", "entropy_coef",
          "temperature", "top_p", "tis_cap", "collective_timeout_s")
_BOOL = ("std_normalise", "share_runs", "prefix_cache", "activation_checkpointing")
_CHOICES = {"preset": tuple(PRESET_DEFAULTS), "advantage": ADVANTAGES, "aggregation": AGGREGATIONS,
            "dtype": ("auto", "bf16", "fp32"), "generator": ("local", "engine")}


def _check(data: dict[str, Any], where: Any) -> dict[str, Any]:
    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    out: dict[str, Any] = {}
    for key, value in data.items():
        at = where(key)
        if key not in fields:
            raise GRPOConfigError(f"{at}: {key}: unknown key", f"use one of {', '.join(sorted(fields))}")
        if key in ("basins", "validation_basins"):
            if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
                raise GRPOConfigError(f"{at}: {key}: expected a list of basin folders, got {brief(value)}")
            if len(set(value)) != len(value):
                raise GRPOConfigError(f"{at}: {key}: lists a basin twice")
            value = tuple(value)
        elif key in ("model", "simulator"):
            if not isinstance(value, str) or not value:
                raise GRPOConfigError(f"{at}: {key}: expected a name or path, got {brief(value)}")
        elif key == "env":
            if not isinstance(value, dict):
                raise GRPOConfigError(f"{at}: env: expected a mapping of environment settings, got {brief(value)}")
        elif key == "engine":
            value = _check_engine(value, at)
        elif key == "fsdp":
            if value not in (True, False, "auto"):
                raise GRPOConfigError(f"{at}: fsdp: expected auto, true or false, got {brief(value)}")
        elif key == "sim_batch":
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise GRPOConfigError(f"{at}: sim_batch: expected a whole number of at least 1, got {brief(value)}",
                                      "give the most queued runs of one basin to gather into one batched call "
                                      "(8, a GRPO group; 1 runs every simulation alone)")
        elif key in _INT:
            if value is None and key == "norm_length":
                pass
            elif isinstance(value, bool) or not isinstance(value, int):
                raise GRPOConfigError(f"{at}: {key}: expected a whole number, got {brief(value)}")
            elif (least := _INT[key]) is not None and value < least:
                raise GRPOConfigError(f"{at}: {key}: must be at least {least}, got {value}")
        elif key in _FLOAT:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise GRPOConfigError(f"{at}: {key}: expected a number, got {brief(value)}",
                                      "write numbers like 1.0e-6 (PyYAML reads 1e-6 without a dot as text)")
            value = float(value)
            if value != value or value in (float("inf"), float("-inf")) or value < 0:
                raise GRPOConfigError(f"{at}: {key}: must be a finite number >= 0, got {value}")
            if key in ("lr", "max_grad_norm", "temperature", "top_p", "collective_timeout_s") and value <= 0:
                raise GRPOConfigError(f"{at}: {key}: must be positive, got {value}")
            if key == "top_p" and value > 1:
                raise GRPOConfigError(f"{at}: top_p: must be at most 1, got {value}")
            if key == "gamma" and value > 1:
                raise GRPOConfigError(f"{at}: gamma: must be in [0, 1], got {value}")
            if key in ("clip_low",) and value >= 1:
                raise GRPOConfigError(f"{at}: clip_low: must be below 1, got {value}")
        elif key in _BOOL:
            if not isinstance(value, bool):
                raise GRPOConfigError(f"{at}: {key}: expected true or false, got {brief(value)}")
        elif key in _CHOICES:
            if value not in _CHOICES[key]:
                raise GRPOConfigError(f"{at}: {key}: {brief(value)} is not one of {', '.join(_CHOICES[key])}")
        out[key] = value
    if not out.get("basins"):
        raise GRPOConfigError(f"{where('basins' if 'basins' in out else None)}: basins: missing or empty",
                              "list the training basin folders (made by `hydroagent basin synth` or from-camels)")
    overlap = set(out["basins"]) & set(out.get("validation_basins", ()))
    if overlap:
        raise GRPOConfigError(f"{where('validation_basins')}: validation_basins: {sorted(overlap)} are also "
                              f"training basins", "validate on held-out basins only")
    if out.get("generator") == "engine" and not out.get("engine"):
        raise GRPOConfigError(f"{where('generator')}: generator: engine needs an engine mapping",
                              "add engine: {api: sglang, url: http://HOST:PORT} (docs/grpo.md)")
    if out.get("engine") and out.get("generator", "local") != "engine":
        raise GRPOConfigError(f"{where('engine')}: engine: given, but generator is local",
                              "set generator: engine, or remove the engine mapping")
    if out.get("aggregation") == "seq-mean-token-sum-norm" and out.get("norm_length") is None:
        raise GRPOConfigError(f"{where('aggregation')}: seq-mean-token-sum-norm needs norm_length",
                              "set norm_length to the episode token budget (e.g. max_context_tokens)")
    return out


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _check_engine(value: Any, at: str) -> dict[str, Any] | None:
    """The ``engine`` mapping, checked (see the table in the module doc)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise GRPOConfigError(f"{at}: engine: expected a mapping (api, url, ...), got {brief(value)}")
    from hydroagent_hpc.train.engine import ENGINE_APIS, ENGINE_KEYS

    for key in value:
        if key not in ENGINE_KEYS:
            raise GRPOConfigError(f"{at}: engine.{key}: unknown key", f"use one of {', '.join(ENGINE_KEYS)}")
    api = value.get("api")
    if not isinstance(api, str) or api not in ENGINE_APIS:
        raise GRPOConfigError(f"{at}: engine.api: {brief(api)} is not one of {', '.join(ENGINE_APIS.names())}")
    url = value.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise GRPOConfigError(f"{at}: engine.url: expected an http(s) URL, got {brief(url)}",
                              "e.g. http://127.0.0.1:30000 (the server's base URL, without /v1)")
    launch = value.get("launch")
    if launch is not None:
        if not isinstance(launch, list) or not launch or not all(isinstance(a, str) and a for a in launch):
            raise GRPOConfigError(f"{at}: engine.launch: expected a list of arguments, got {brief(launch)}",
                                  "e.g. [python, -m, sglang.launch_server, --model-path, '{model}', --port, '30000']")
        if not any("{model}" in a for a in launch):
            raise GRPOConfigError(f"{at}: engine.launch: no {{model}} argument",
                                  "write {model} where the server takes its model folder")
    elif not ENGINE_APIS[api].live_reload:
        raise GRPOConfigError(f"{at}: engine: api {api} cannot reload weights from disk while it runs",
                              "give engine.launch so the trainer restarts the engine on each new checkpoint")
    for key in ("api_key_env", "model_name", "weights_dir"):
        v = value.get(key)
        if v is not None and (not isinstance(v, str) or not v):
            raise GRPOConfigError(f"{at}: engine.{key}: expected a name or null, got {brief(v)}")
    if value.get("api_key_env") is not None and not _ENV_NAME.fullmatch(value["api_key_env"]):
        raise GRPOConfigError(f"{at}: engine.api_key_env: {brief(value['api_key_env'])} is not a variable name",
                              "name the environment variable that holds the key, never the key itself")
    if value.get("gpus") is not None:
        from hydroagent_hpc.train.engine import EngineError, parse_gpus

        try:
            parse_gpus(value["gpus"])
        except EngineError as exc:
            raise GRPOConfigError(f"{at}: {exc.message}", exc.fix) from None
    for key in ("timeout_s", "start_timeout_s"):
        v = value.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0):
            raise GRPOConfigError(f"{at}: engine.{key}: expected a positive number of seconds, got {brief(v)}")
    return dict(value)


def check_world_size(config: GRPOConfig, world_size: int, where: str = "<config>") -> None:
    """Refuse what does not work with ``world_size`` training processes (``where``: the file:line).

    With more than one process the policy's parameters are sharded (FSDP2) or replicated (DDP) and
    every forward pass of a sharded model is a collective of all ranks. Only rank 0 plays the
    rollouts, so in-process generation (``generator: local``) would need the other ranks to follow
    every one of rank 0's decoding steps; generation goes to an engine instead.
    """
    if world_size > 1 and config.generator != "engine":
        raise GRPOConfigError(f"{where}: generator: {config.generator} with {world_size} training processes: only "
                              f"rank 0 plays the rollouts, and in-process generation with a sharded policy would "
                              f"need every rank in every decoding step",
                              "set generator: engine (an SGLang/vLLM server, or our engine_server; docs/grpo.md), "
                              "or train with one process")


def grpo_config_from_mapping(data: Any, *, source: str = "<config>", base_dir: Path | None = None,
                             where: Any = None, world_size: int = 1) -> GRPOConfig:
    """A :class:`GRPOConfig` from a parsed mapping (preset defaults filled, paths resolved, and
    :func:`check_world_size` for ``world_size`` training processes)."""
    if not isinstance(data, dict):
        raise GRPOConfigError(f"{source}: expected a mapping of settings, got {brief(data)}")
    where = where or (lambda key: source)
    values = _check(data, where)
    preset = values.get("preset", "paper")
    for key, default in PRESET_DEFAULTS[preset].items():
        values.setdefault(key, default)
    if base_dir is not None:
        def resolve(v: str) -> str:
            return v if Path(v).is_absolute() else str((base_dir / v).resolve())
        values["basins"] = tuple(resolve(v) for v in values["basins"])
        values["validation_basins"] = tuple(resolve(v) for v in values.get("validation_basins", ()))
        if values.get("model", "tiny") != "tiny":
            values["model"] = resolve(values["model"])
        if values.get("engine") and values["engine"].get("weights_dir"):
            values["engine"] = {**values["engine"], "weights_dir": resolve(values["engine"]["weights_dir"])}
    _check_env(values.get("env", {}), preset, where)
    config = GRPOConfig(**values)
    check_world_size(config, world_size, where("generator" if "generator" in values else None))
    return config


def _check_env(env: dict[str, Any], preset: str, where: Any) -> None:
    from hydroagent_hpc.config import preset as make_env

    try:
        make_env(preset, **env)
    except (TypeError, ValueError) as exc:
        raise GRPOConfigError(f"{where('env')}: env: {exc}", "use the keys of EnvConfig (docs/guarantees.md)") \
            from None


def load_grpo_config(path: str | Path, world_size: int = 1) -> GRPOConfig:
    """Read a GRPO config file strictly (unknown keys, bad types and values name the file:line);
    ``world_size``: the number of training processes it will run with (:func:`check_world_size`)."""
    doc = load_strict(path, error=GRPOConfigError, what="GRPO config")
    p = Path(path)
    return grpo_config_from_mapping(doc.data, source=doc.source, base_dir=p.resolve().parent,
                                    where=lambda key: doc.where([key]) if key else doc.source, world_size=world_size)
