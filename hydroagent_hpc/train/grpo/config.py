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
generator              ``local`` (default: in-process transformers), ``engine`` (an HTTP server) or
                       ``colocated`` (an engine inside every trainer process; ``docs/colocated.md``:
                       ``colocated.backend`` sglang, vllm or standin, ``colocated.memory_fraction``,
                       ``colocated.bucket_mb``, ``colocated.awake_while_training``: needed by
                       ``max_staleness: 1``)
engine.api             ``sglang`` or ``vllm`` (:data:`hydroagent_hpc.train.generation.engine.ENGINE_APIS`)
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
``generator: engine`` or ``colocated`` is required (checked by :func:`load_grpo_config` when ``world_size`` > 1).

Both: lr 1e-6 with ``warmup_steps`` linear warm-up then constant, weight decay 0, gradient clip
1.0, entropy 0.01, clip 0.2 / 0.2, ``token-mean`` aggregation, temperature 1.0, top-p 0.95,
at most 32 simulations in flight (``max_simulations_in_flight``), and ``sim_batch: 8``: up to 8
runs of one basin that wait for a simulation slot at the same moment (a GRPO group's members) run
as one batched call in one slot (:mod:`hydroagent_hpc.train.generation.coalesce`; results bit-identical to
single runs; 1 runs every simulation alone). Unknown keys, wrong types and out-of-range values are refused
with the file and line of the key; relative paths are resolved against the config file's folder.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydroagent_hpc.config import EnvConfig, preset
from hydroagent_hpc.errors import ConfigError
from hydroagent_hpc.settings import (
    LR_FIX,
    MAX_TIMEOUT_S,
    KeyPath,
    Settings,
    Where,
    dump,
    from_mapping,
    invalid,
    load_file,
    setting,
)
from hydroagent_hpc.train.generation.colocated_config import ColocatedSettings
from hydroagent_hpc.train.generation.engine_config import ENGINE_API_RELOAD, EngineSettings
from hydroagent_hpc.train.grpo.decisions import PG_TOKENS
from hydroagent_hpc.train.live import report_to_setting, run_name_setting, wandb_project_setting
from hydroagent_hpc.yamlio import load_strict

__all__ = ["GRPOConfig", "load_grpo_config", "grpo_config_from_mapping", "check_world_size", "PRESET_DEFAULTS",
           "ADVANTAGES", "AGGREGATIONS"]

ADVANTAGES = ("episode", "turn", "released")
#: Whose returns set a group's baseline and scale (train/grpo/advantages.py, baseline members).
BASELINES = ("group", "valid", "valid_only")
#: Who samples the rollouts: the trainer's own model, an external server, or an engine in every trainer process.
GENERATORS = ("local", "engine", "colocated")
AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
#: The most episodes one step may play (group_size x prompts_per_step): every one is held in memory.
MAX_ROLLOUTS_PER_STEP = 65536

#: The recipe keys whose defaults depend on the preset (docs/reference-implementation.md section 7).
PRESET_DEFAULTS: dict[str, dict[str, Any]] = {
    "paper": {"group_size": 8, "kl_coef": 0.2, "advantage": "episode"},
    "released": {"group_size": 6, "kl_coef": 0.05, "advantage": "released"},
}


def _by_preset(key: str) -> dict[str, Any]:
    return {name: values[key] for name, values in PRESET_DEFAULTS.items()}


@dataclass(frozen=True)
class GRPOConfig(Settings):
    """Everything that decides a GRPO run (written, resolved, into ``RUN_DIR/config.yaml``)."""

    basins: tuple[str, ...] = setting(path=True, nonempty=True, unique=True, help="training basin folders (prompts)",
                                      fix="list the training basin folders (made by `hydroagent basin synth` or "
                                          "from-camels)")
    preset: str = setting("paper", choices=tuple(PRESET_DEFAULTS), source="paper, released",
                          help="the recipe whose defaults fill the keys not given: paper or released")
    model: str = setting("tiny", path=True, keep=("tiny",), nonempty=True,
                         help="the initial policy: an SFT checkpoint (paper), the base model (released) or tiny")
    validation_basins: tuple[str, ...] = setting((), path=True, unique=True,
                                                 help="held-out basins validated on, never trained on")
    env: dict[str, Any] = setting(factory=dict, help="environment settings on top of the preset (EnvConfig keys)")
    group_size: int = setting(8, ge=1, presets=_by_preset("group_size"), source="paper, released",
                              help="K rollouts per prompt")
    prompts_per_step: int = setting(4, ge=1, source="paper", help="prompts (basins) per optimizer step")
    max_steps: int = setting(10, ge=1, help="optimizer steps")
    advantage: str = setting("episode", choices=ADVANTAGES, presets=_by_preset("advantage"), source="paper, released",
                             help="credit: episode (group-normalised return), turn (per-turn rewards) or released "
                                  "(terminal score only)")
    gamma: float = setting(1.0, ge=0, le=1, help="discount of later rewards in the turn credit")
    std_normalise: bool = setting(True, source="paper", help="divide advantages by the group's standard deviation")
    baseline: str = setting("group", choices=BASELINES, source="ours",
                            help="members the advantage's baseline and scale come from: group (all, the paper's), "
                                 "valid (rollouts without a parse failure; docs/learning.md) or valid_only (the "
                                 "same, and rollouts with a parse failure get no advantage)")
    adv_clip: float = setting(0.0, ge=0, source="ours", help="clip every advantage to [-adv_clip, adv_clip] (0: off)")
    pg_tokens: str = setting("all", choices=PG_TOKENS, source="ours",
                             help="sampled tokens the policy gradient is taken on: all (the paper's) or arguments (the "
                                  "tool calls' arguments, the moves; every sampled token keeps the KL and entropy "
                                  "terms; docs/learning.md)")
    lr: float = setting(1e-6, gt=0, le=1, source="paper", help="learning rate (linear warm-up, then constant)",
                        fix=LR_FIX)
    warmup_steps: int = setting(0, ge=0, help="steps of linear warm-up")
    weight_decay: float = setting(0.0, ge=0, le=1, help="AdamW weight decay",
                                  fix="give a decay from 0 to 1 (0.0 is the paper's; 0.01 to 0.1 are usual)")
    max_grad_norm: float = setting(1.0, gt=0, source="paper, released", help="gradient clip (global L2 norm)")
    clip_low: float = setting(0.2, ge=0, lt=1, source="paper, released", help="PPO ratio clip below 1")
    clip_high: float = setting(0.2, ge=0, source="paper, released", help="PPO ratio clip above 1")
    tis_cap: float = setting(0.0, ge=0, help="truncated importance weights min(p_trainer / p_generator, cap) on "
                                             "each token's advantage (0: off)")
    max_staleness: int = setting(0, ge=0, le=1, source="ours",
                                 help="0: on-policy (the paper's and released's); 1: the next step's rollouts are "
                                      "played while this step trains, by the weights one step older (needs tis_cap; "
                                      "colocated also colocated.awake_while_training)",
                                 fix="give 0 (on-policy) or 1 (one step of overlap; docs/grpo.md)")
    kl_coef: float = setting(0.2, ge=0, presets=_by_preset("kl_coef"), source="paper, released",
                             help="weight of the KL penalty to the reference policy")
    entropy_coef: float = setting(0.01, ge=0, source="paper", help="weight of the entropy bonus")
    aggregation: str = setting("token-mean", choices=AGGREGATIONS, source="paper, released",
                               help="how token losses are averaged")
    norm_length: int | None = setting(None, ge=1, help="the token budget seq-mean-token-sum-norm divides by")
    temperature: float = setting(1.0, gt=0, source="paper", help="sampling temperature of the rollouts")
    top_p: float = setting(0.95, gt=0, le=1, source="paper", help="nucleus sampling of the rollouts")
    top_k: int = setting(0, ge=0, help="top-k sampling (0: off)")
    max_new_tokens: int = setting(512, ge=1, help="tokens one model turn may generate")
    max_context_tokens: int = setting(8192, ge=2, help="tokens an episode may hold (it ends there)")
    max_simulations_in_flight: int = setting(32, ge=1, source="paper", help="simulations running at once")
    sim_batch: int = setting(8, ge=1, help="queued runs of one basin gathered into one batched call (1: each alone)",
                             fix="give the most queued runs of one basin to gather into one batched call (8, a GRPO "
                                 "group; 1 runs every simulation alone)")
    share_runs: bool = setting(True, help="members of a group that set the same parameters share one simulation")
    generation_batch: int = setting(64, ge=1, help="sequences decoded together (local generator)")
    prefix_cache: bool = setting(True, help="reuse the key/value cache of an episode's earlier turns")
    logprob_chunk: int = setting(1024, ge=1, help="tokens per chunk when scoring log-probs")
    seed: int = setting(0, ge=0, help="seed of sampling and of the tiny model")
    dtype: str = setting("auto", choices=("auto", "bf16", "fp32"), source="paper",
                         help="auto: bf16 compute on CUDA, fp32 on CPU; or bf16 / fp32")
    save_every: int = setting(0, ge=0, help="checkpoint every N steps (0: only on a signal and at the end)")
    keep_checkpoints: int = setting(2, ge=0, help="checkpoints kept")
    validate_every: int = setting(0, ge=0, help="greedy episodes on the validation basins every N steps (0: off)")
    simulator: str = setting("embedded", nonempty=True, help="the simulator backend")
    generator: str = setting("local", choices=GENERATORS,
                             help="local (in-process transformers), engine (an SGLang/vLLM server) or colocated (an "
                                  "engine inside every trainer process, asleep while it trains)")
    engine: EngineSettings | None = setting(None, help="the inference server (generator: engine)")
    colocated: ColocatedSettings | None = setting(None, help="the engine in every trainer process (generator: "
                                                             "colocated; null: its defaults)")
    fsdp: bool | str = setting("auto", choices=(True, False, "auto"), source="paper",
                               help="FSDP2 sharding: auto (with more than one process), true or false (DDP)")
    activation_checkpointing: bool = setting(False, help="recompute each decoder layer's activations in the backward "
                                                         "pass (the paper configs turn it on)")
    collective_timeout_s: float = setting(10800.0, gt=0, le=MAX_TIMEOUT_S,
                                          help="how long a rank may wait in a collective (NCCL's own 10 minutes would "
                                               "kill ranks waiting for rollouts)")
    report_to: tuple[str, ...] = report_to_setting()
    wandb_project: str = wandb_project_setting()
    run_name: str | None = run_name_setting()

    def check(self) -> None:
        overlap = set(self.basins) & set(self.validation_basins)
        if overlap:
            raise invalid("validation_basins", f"{sorted(overlap)} are also training basins",
                          "validate on held-out basins only")
        if self.generator == "engine" and self.engine is None:
            raise invalid("generator", "engine needs an engine mapping",
                          "add engine: {api: sglang, url: http://HOST:PORT} (docs/grpo.md)")
        if self.engine is not None and self.generator != "engine":
            raise invalid("engine", f"given, but generator is {self.generator}",
                          "set generator: engine, or remove the engine mapping")
        if self.colocated is not None and self.generator != "colocated":
            raise invalid("colocated", f"given, but generator is {self.generator}",
                          "set generator: colocated, or remove the colocated mapping")
        if self.engine is not None and self.engine.launch is None and not ENGINE_API_RELOAD[self.engine.api]:
            raise invalid("engine", f"api {self.engine.api} cannot reload weights from disk while it runs",
                          "give engine.launch so the trainer restarts the engine on each new checkpoint")
        awake = self.colocated is not None and self.colocated.awake_while_training
        if self.max_staleness and self.generator == "colocated" and not awake:
            raise invalid("max_staleness", "1 with generator: colocated: its engines sleep while their GPUs "
                                           "train, so nothing can play the next step's rollouts then "
                                           "(docs/colocated.md, Overlap)",
                          "set colocated.awake_while_training: true (the engines stay awake beside the trainer; "
                          "the memory plan counts both), or max_staleness: 0, or generator: engine or local")
        if self.max_staleness and not self.tis_cap > 0:
            raise invalid("max_staleness", f"{self.max_staleness} trains on rollouts sampled by older weights, which "
                                           "needs truncated importance weights (tis_cap is 0)",
                          "set tis_cap: 2.0 (or max_staleness: 0)")
        if self.aggregation == "seq-mean-token-sum-norm" and self.norm_length is None:
            raise invalid("aggregation", "seq-mean-token-sum-norm needs norm_length",
                          "set norm_length to the episode token budget (e.g. max_context_tokens)")
        if self.norm_length is not None and self.aggregation != "seq-mean-token-sum-norm":
            raise invalid("norm_length", f"given, but aggregation {self.aggregation} does not use it",
                          "remove norm_length, or set aggregation: seq-mean-token-sum-norm")
        if self.warmup_steps > self.max_steps:
            raise invalid("warmup_steps", f"{self.warmup_steps} warm-up steps in a run of max_steps {self.max_steps}: "
                                          f"the learning rate would never reach lr",
                          f"give warmup_steps at most {self.max_steps}")
        if self.max_new_tokens >= self.max_context_tokens:
            raise invalid("max_new_tokens", f"{self.max_new_tokens} is not below max_context_tokens "
                                            f"{self.max_context_tokens}: one turn could fill the whole episode",
                          "give max_new_tokens well below max_context_tokens (512 of 8192 by default)")
        if self.group_size * self.prompts_per_step > MAX_ROLLOUTS_PER_STEP:
            raise invalid("group_size", f"{self.group_size} rollouts x prompts_per_step {self.prompts_per_step} = "
                                        f"{self.group_size * self.prompts_per_step} episodes per step, more than "
                                        f"{MAX_ROLLOUTS_PER_STEP}", "the paper plays 8 x 4; give a few dozen per step")
        if self.validate_every and not self.validation_basins:
            raise invalid("validate_every", f"{self.validate_every}, but no validation_basins to validate on",
                          "list held-out basins in validation_basins, or set validate_every: 0")
        try:
            from_mapping(EnvConfig, self.env, base=preset(self.preset))
        except ConfigError as exc:
            raise invalid(("env", *exc.at), exc.problem or exc.message, exc.fix) from None

    def env_config(self) -> EnvConfig:
        """The environment of the rollouts: the preset with ``env`` on top."""
        return from_mapping(EnvConfig, self.env, base=preset(self.preset))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = dump(self)
        return out


def check_world_size(config: GRPOConfig, world_size: int, where: str = "<config>") -> None:
    """Refuse what does not work with ``world_size`` training processes (``where``: the file:line).

    With more than one process the policy's parameters are sharded (FSDP2) or replicated (DDP) and
    every forward pass of a sharded model is a collective of all ranks. Only rank 0 plays the
    rollouts, so in-process generation (``generator: local``) would need the other ranks to follow
    every one of rank 0's decoding steps; generation goes to an engine instead.
    """
    if world_size > 1 and config.generator == "local":
        raise ConfigError(f"{where}: generator: {config.generator} with {world_size} training processes: only "
                          f"rank 0 plays the rollouts, and in-process generation with a sharded policy would "
                          f"need every rank in every decoding step",
                          "set generator: colocated (an engine in every trainer process; docs/colocated.md) or "
                          "engine (an SGLang/vLLM server, or our engine_server; docs/grpo.md), or train with one "
                          "process")


def grpo_config_from_mapping(data: Any, *, at: KeyPath = (), where: Where | None = None,
                             base_dir: Path | None = None, source: str = "<config>",
                             world_size: int = 1) -> GRPOConfig:
    """A :class:`GRPOConfig` from a parsed mapping (preset defaults filled, paths resolved, and
    :func:`check_world_size` for ``world_size`` training processes)."""
    config = from_mapping(GRPOConfig, data, at=at, where=where, base_dir=base_dir, source=source)
    place = (where or (lambda path: source))((*at, "generator") if "generator" in data else at)
    check_world_size(config, world_size, place)
    return config


def load_grpo_config(path: str | Path, world_size: int = 1, overrides: dict[str, Any] | None = None) -> GRPOConfig:
    """Read a GRPO config file strictly (unknown keys, bad types and values name the file:line);
    ``world_size``: the number of training processes it will run with (:func:`check_world_size`);
    ``overrides``: command-line values by key (:func:`hydroagent_hpc.settings.load_file`)."""
    config = load_file(GRPOConfig, path, what="GRPO config", overrides=overrides)
    if world_size > 1 and config.generator == "local":
        doc = load_strict(path, what="GRPO config")
        check_world_size(config, world_size, doc.where(("generator",)))
    return config
