"""GRPO with the simulator as the verifier: ``hydroagent train grpo CONFIG --out RUN``.

The command line (and the MPI rank split) is :mod:`hydroagent_hpc.train.grpo.launch`.

One step, top to bottom (:func:`train_grpo`; a step is :func:`_one_step`):

1. **Prompts.** ``prompts_per_step`` training basins, taken in a per-epoch shuffle of
   ``basins`` (seeded); held-out ``validation_basins`` are never trained on.
2. **Rollouts.** ``group_size`` (K) episodes per prompt, all at once through
   :func:`~hydroagent_hpc.train.generation.rollout.run_rollouts` (one thread per episode, batched model turns,
   at most ``max_simulations_in_flight`` simulations, identical parameter sets on a basin simulated
   once, runs of one basin that wait for a slot gathered into batches of up to ``sim_batch``).
   Member ``k`` of group ``g`` at step ``s`` samples with the seed derived from
   ``(seed, s, g, k)``, so a resumed step replays the same episodes. Every rollout is stored as an
   episode in ``RUN/rollouts.h5`` (the campaign store format: ``hydroagent report`` reads it).
3. **Rewards and advantages** from the environment's ledger only: per assistant message the
   payments of the calls it made, and the terminal payment
   (:func:`~hydroagent_hpc.train.grpo.advantages.group_advantages`, mode ``advantage``). A group whose
   returns are all equal gives no gradient and is counted (``degenerate_groups``).
4. **Loss.** Each trainable sequence is scored by the policy in chunks
   (:func:`~hydroagent_hpc.train.grpo.loss.token_logprobs`) and by the frozen reference (the
   initial policy) when ``kl_coef > 0``; the clipped-ratio loss with k3 KL and the entropy bonus
   (:func:`~hydroagent_hpc.train.grpo.loss.grpo_loss`) is aggregated with the step's **global**
   token and sequence counts, so splitting the step into one sequence per backward pass changes
   nothing. One optimizer step per rollout batch (one PPO epoch, mini-batch = batch, as the paper):
   ``old_logp`` is the policy's own detached log-prob, so the ratio is 1 and the clip is inert
   until an engine other than the trainer samples. Then gradient clipping and AdamW.
5. **Record.** One row per step in ``RUN/metrics.csv`` (reward parts, best NSE, simulations,
   turns, parse failures, stop reasons, entropy, KL, clip fraction, advantage statistics, time
   split into generation / simulation / training), one console line, and the step's timeline: when
   each process generated, waited, trained and synced, and when each rollout waited for a GPU batch
   or a simulation slot, one line of ``RUN/timeline.jsonl`` (:mod:`hydroagent_hpc.train.grpo.timeline`,
   drawn by ``hydroagent train timeline RUN``).
6. **Checkpoints** every ``save_every`` steps, on SIGUSR1 (and SIGTERM, which then stops), and at
   the end, atomically (:mod:`hydroagent_hpc.train.checkpoint`); a resumed run replays nothing
   twice: a step is either complete in the checkpoint or redone from its start. ``RUN/final`` is a
   ``save_pretrained`` folder the ``hf_local`` agent loads.

With ``generator: engine`` the rollouts (and validation) are sampled by an SGLang or vLLM server
(:mod:`hydroagent_hpc.train.generation.engine`); the trainer pushes its weights to it before the first rollout
and after every optimizer step (:mod:`hydroagent_hpc.train.generation.engine_process`), timed as
``weight_sync_s``.

Several processes (``torchrun``/``accelerate launch``, ``WORLD_SIZE`` > 1; docs/grpo.md "Several
GPUs"): rank 0 alone plays the rollouts through the engine, writes the run folder and broadcasts the
trainable sequences with their advantages; rank ``r`` of ``W`` trains on sequences ``r, r + W, ...``
(:func:`rank_passes`) with the step's token and sequence counts all-reduced first, so the gradient is
the one-process gradient whatever ``W``; the policy and the reference are FSDP2-sharded (``fsdp``)
or DDP replicas, and the weights are gathered onto rank 0 for the engine push and ``final/``.

Validation (``validate_every`` > 0): one greedy episode per validation basin before the first
step and every ``validate_every`` steps, stored in the same file (agent ``grpo-val``).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import os
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from hydroagent_hpc.agents.llm.hf_local import HFLocalPolicy
from hydroagent_hpc.config import preset
from hydroagent_hpc.errors import ConfigError, one_line
from hydroagent_hpc.sim import open_simulator
from hydroagent_hpc.sim.basin import load_basin
from hydroagent_hpc.train.checkpoint import (
    TrainerState,
    fault,
    load_checkpoint,
)
from hydroagent_hpc.train.distributed import (
    Signals,
    agree,
    all_reduce_max,
    all_reduce_sum,
    grad_sync,
    make_accelerator,
    pretrained_copy,
    process_group_timeout,
    shard,
)
from hydroagent_hpc.train.finite import (
    NonFiniteError,
    check_step,
    check_weights,
    save_final,
    stopped_at,
)
from hydroagent_hpc.train.generation.colocated import ColocatedGenerator
from hydroagent_hpc.train.generation.colocated import for_run as colocated_for_run
from hydroagent_hpc.train.generation.engine import EngineSampler, serve_rollouts
from hydroagent_hpc.train.generation.engine_process import EngineWeights
from hydroagent_hpc.train.generation.rollout import (
    RemoteRunner,
    Rollout,
    RolloutPolicy,
    RolloutSpec,
    SharedRuns,
    run_rollouts,
)
from hydroagent_hpc.train.generation.sampler import BatchedSampler, RolloutSampler, Sampling
from hydroagent_hpc.train.grpo import timeline
from hydroagent_hpc.train.grpo.advantages import group_advantages, token_advantages
from hydroagent_hpc.train.grpo.config import GRPOConfig, check_world_size
from hydroagent_hpc.train.grpo.decisions import PieceTable, argument_mask
from hydroagent_hpc.train.grpo.loss import LogprobModel, grpo_loss, truncated_importance_weights
from hydroagent_hpc.train.grpo.overlap import RolloutsAhead, behaviour_model
from hydroagent_hpc.train.live import Live, open_live
from hydroagent_hpc.train.memory_plan import colocated_memory_fraction, require_fits
from hydroagent_hpc.train.rundir import MetricsCSV, field_defaults, prepare_run_dir, write_run_config
from hydroagent_hpc.train.writes import check_run_dir, save_checkpoint_or_stop

log = logging.getLogger(__name__)

__all__ = ["train_grpo", "rollout_seed", "plan_prompts", "rank_passes", "learning_signal", "METRICS_COLUMNS",
           "load_policy", "play_episodes", "training_batch", "optimise", "Ranks", "EpisodeStore"]

METRICS_COLUMNS = ("step", "reward_mean", "reward_std", "turn_reward_mean", "terminal_mean", "best_nse_mean",
                   "simulations_mean", "turns_mean", "parse_failures_mean", "rollouts", "trainable",
                   "degenerate_groups", "adv_mean", "adv_std", "adv_abs_max", "loss", "pg", "kl", "entropy",
                   "clip_fraction", "grad_norm", "lr", "tokens", "logprob_mismatch_mean", "logprob_mismatch_max",
                   "tis_weight_mean", "staleness", "tis_ratio_mean", "tis_ratio_max", "tis_truncated_share",
                   "generation_s", "simulation_s", "training_s",
                   "step_s", "sim_peak_in_flight", "shared_run_hits", "stop_reasons", "val_reward_mean",
                   "val_best_nse_mean", "weight_sync_s", "sim_batches", "sim_batched_runs",
                   "degenerate_share", "adv_p10", "adv_p50", "adv_p90", "tokens_adv_pos", "tokens_adv_neg",
                   "tokens_adv_zero")


def rollout_seed(seed: int, step: int, group: int, member: int) -> int:
    """The sampling seed of member ``member`` of group ``group`` at step ``step`` (63-bit)."""
    s = np.random.SeedSequence([int(seed) & ((1 << 63) - 1), 1, int(step), int(group), int(member)])
    a, b = (int(x) for x in s.generate_state(2, dtype=np.uint32))
    return ((a << 32) | b) & ((1 << 63) - 1)


def plan_prompts(n_basins: int, per_step: int, seed: int, epoch: int, index: int) -> tuple[list[int], int, int]:
    """The basin indices of the next step and the new ``(epoch, index)`` position.

    Each epoch is a permutation of the basins seeded by ``(seed, epoch)``; a step takes the next
    ``per_step`` of it and continues into the next epoch's permutation when it runs out.
    """
    out: list[int] = []
    while len(out) < per_step:
        order = np.random.default_rng([int(seed), int(epoch)]).permutation(n_basins)
        take = min(per_step - len(out), n_basins - index)
        out += [int(i) for i in order[index:index + take]]
        index += take
        if index >= n_basins:
            epoch, index = epoch + 1, 0
    return out, epoch, index


# ---------------------------------------------------------------------------------------------
# Setup


def load_policy(config: GRPOConfig, device: torch.device) -> tuple[Any, Any]:
    """The policy in fp32 on ``device`` and its tokenizer.

    The policy always holds fp32 (master) weights, whatever the compute dtype: an AdamW step at the
    paper's lr 1e-6 is below bf16's spacing for almost every weight (|w| ~ 0.02 has a bf16 spacing
    of 1.2e-4), so bf16 weights would hardly move (gpu-audit F1). bf16 compute comes from FSDP2's
    ``param_dtype`` or from ``torch.autocast`` (:func:`_autocast`).
    """
    model: Any
    tokenizer: Any
    if config.model == "tiny":
        from hydroagent_hpc.train.tiny import build_tiny

        model, tokenizer = build_tiny(seed=config.seed)
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = Path(config.model)
        if not (path / "config.json").is_file():
            raise ConfigError(f"model: {path} is not a save_pretrained folder (no config.json)",
                                  "point model at an SFT run's final/ folder, or use model: tiny")
        try:
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"model: {path}: cannot load ({one_line(exc)})",
                                  "point model at a complete save_pretrained folder") from None
    check_weights(model, f"model: {config.model}", error=ConfigError,
                  fix="start from a model whose weights are finite (an SFT run's final/ or the base model)")
    return model.to(device=device, dtype=torch.float32), tokenizer


class _Metrics(MetricsCSV):
    """``metrics.csv`` and ``metrics.h5``: one row per step; on resume the rows after the checkpoint
    are dropped from both.

    ``metrics.h5`` holds one dataset per column under ``/metrics`` (float64; ``stop_reasons`` as
    text), each row written and flushed before the step's checkpoint, so a reader sees whole rows.
    """

    def __init__(self, path: Path, resumed_step: int | None, live: Live | None = None) -> None:
        super().__init__(path, METRICS_COLUMNS, resumed_step, live)
        self.h5 = path.with_suffix(".h5")
        self._init_h5(resumed_step)

    def _init_h5(self, resumed_step: int | None) -> None:
        import h5py

        if resumed_step is not None and self.h5.is_file():
            problem = self._h5_problem(resumed_step)
            if problem is None:
                with h5py.File(self.h5, "a") as f:
                    keep = int(np.sum(f["metrics/step"][:] <= resumed_step))
                    for name in METRICS_COLUMNS:
                        if name not in f["metrics"]:  # a column added since the run started: NaN so far
                            f["metrics"].create_dataset(name, data=np.full(keep, np.nan), maxshape=(None,),
                                                        chunks=(256,))
                        f[f"metrics/{name}"].resize((keep,))
                    f.attrs["columns"] = list(METRICS_COLUMNS)
                return
            log.warning("%s: %s; rebuilt from %s (values at its 8 significant digits)", self.h5, problem, self.path)
        tmp = self.h5.with_suffix(".h5.tmp")
        with h5py.File(tmp, "w") as f:
            f.attrs["columns"] = list(METRICS_COLUMNS)
            g = f.create_group("metrics")
            for name in METRICS_COLUMNS:
                dtype = h5py.string_dtype("utf-8") if name == "stop_reasons" else np.float64
                g.create_dataset(name, shape=(0,), maxshape=(None,), dtype=dtype, chunks=(256,))
        os.replace(tmp, self.h5)
        for row in self.rows:  # the rows metrics.csv keeps (none on a fresh start)
            self._append_h5(dict(zip(self.columns, row)))

    def _h5_problem(self, resumed_step: int) -> str | None:
        """Why ``metrics.h5`` cannot be trimmed to the checkpoint's rows (a write cut off by a kill, a
        damaged file), or None: it must open, hold the step column, and hold the same steps 1 .. the
        checkpoint's step as ``metrics.csv``'s kept rows, every column as long as the step column."""
        import h5py

        try:
            with h5py.File(self.h5, "r") as f:
                g = f["metrics"]
                steps = np.asarray(g["step"][:], dtype=np.float64)
                lengths = {name: g[name].shape[0] for name in g}
        except (OSError, KeyError, ValueError, TypeError) as exc:
            return f"cannot be read ({type(exc).__name__})"
        kept = steps[steps <= resumed_step]
        if [int(s) for s in kept] != [int(r[0]) for r in self.rows]:
            return f"its steps up to {resumed_step} differ from {self.path.name}'s"
        short = sorted(name for name, n in lengths.items() if n < len(kept))
        if short:
            return f"column(s) {', '.join(short[:3])} shorter than the step column"
        return None

    def _append_h5(self, row: Mapping[str, Any]) -> None:
        import h5py

        with h5py.File(self.h5, "a") as f:
            for name in METRICS_COLUMNS:
                ds = f[f"metrics/{name}"]
                n = ds.shape[0]
                ds.resize((n + 1,))
                value = row.get(name)
                if name == "stop_reasons":
                    ds[n] = str(value or "")
                else:
                    ds[n] = _as_float(value)
            f.flush()

    def write(self, row: Mapping[str, Any]) -> None:
        super().write(row)
        self._append_h5(row)


def _as_float(value: Any) -> float:
    """A metric value as a float: None and '' (a missing value, as metrics.csv writes it) are NaN."""
    if value is None or value == "":
        return float("nan")
    return float(value)


# ---------------------------------------------------------------------------------------------
# Rollouts


class EpisodeStore:
    """The run's episode store; a replayed step's episodes that are already stored are not written again."""

    def __init__(self, path: Path) -> None:
        from hydroagent_hpc.store import EpisodeWriter

        self.writer = EpisodeWriter(path)
        self.basins: dict[str, Any] = {}

    def write(self, rollouts: Sequence[Rollout]) -> None:
        for r in rollouts:
            ep = r.episode
            if ep is None or self.writer.has(ep.episode_id):
                continue
            self.writer.write(ep, self.basins.get(r.spec.basin_dir))

    def close(self) -> None:
        self.writer.close()


def play_episodes(config: GRPOConfig, model: Any, tokenizer: Any, specs: list[RolloutSpec], sims: dict[str, Any],
                  basins: dict[str, Any], *, greedy: bool = False, agent: str = "grpo",
                  runner: Any = None, engine: EngineWeights | None = None,
                  generator: ColocatedGenerator | None = None) -> tuple[list[Rollout], dict[str, Any]]:
    """Play ``specs`` with ``model`` (all episodes' model turns batched; the simulations on ``runner``,
    a pool, or in threads): the rollouts and the step's sampling figures. ``greedy`` for evaluation.
    ``generator``: the colocated engines (each group's turns on its engine), instead of ``engine`` or
    the in-process sampler."""
    from hydroagent_hpc.env.environment import CalibrationEnv

    env_config = preset(config.preset, **config.env)
    sampling = Sampling(temperature=config.temperature, top_p=config.top_p, top_k=config.top_k,
                        max_new_tokens=config.max_new_tokens, greedy=greedy)
    was_training = model.training  # before the probe: building it puts the model in eval mode
    probe = HFLocalPolicy(model, tokenizer)  # stop and pad ids as evaluation uses them
    sampler: RolloutSampler | None = None  # None: the colocated engines sample (synced after each step)
    if engine is not None:  # an external engine serving the current weights (engine.push after each step)
        sampler = EngineSampler(engine.api, probe.stop_ids, sampling, max_batch=config.generation_batch)
    elif generator is None:
        compute = _compute_dtype(config, model.device)  # the trainer's compute dtype over its fp32 weights
        sampler = BatchedSampler(model, probe.stop_ids, probe.pad_id, sampling, max_batch=config.generation_batch,
                                 prefix_cache=config.prefix_cache,
                                 autocast_dtype=None if compute == torch.float32 else compute)
    if sampler is not None:
        sampler = timeline.timed_sampler(sampler)  # its batches on the step timeline (when a run records one)
    slots = timeline.timed_slots(config.max_simulations_in_flight)
    shared = SharedRuns() if config.share_runs else None
    model.eval()
    t0 = time.perf_counter()
    if sampler is not None:
        serving = serve_rollouts(sampler)
    else:  # each group's turns on its colocated engine
        assert generator is not None
        serving = generator.routes(sampling, probe.stop_ids, [s.group for s in specs])
    with serving as server:  # an engine: one request per turn, continuously batched there
        route = server.for_group if generator is not None else (lambda group: server)  # type: ignore[attr-defined]
        rollouts = run_rollouts(
            specs,
            env_factory=lambda spec, sim: CalibrationEnv(basins[spec.basin_dir],
                                                         timeline.rollout_simulator(spec, sim, agent), env_config,
                                                         agent=agent, seed=spec.seed, episode_id=spec.episode_id),
            simulators=sims,
            policy_factory=lambda spec: RolloutPolicy(model, tokenizer,
                                                      timeline.rollout_server(spec, route(spec.group), agent),
                                                      sampling, seed=spec.seed,
                                                      max_context_tokens=config.max_context_tokens, name=agent),
            slots=slots, shared=shared, runner=runner, sim_batch=config.sim_batch)
        stats = dict(server.stats)
    model.train(was_training)
    sim = slots.stats()
    stats.update(wall_s=time.perf_counter() - t0, sim_busy_s=sim["busy_s"], sim_peak=sim["peak"], sim_runs=sim["runs"],
                 sim_batches=sim["batches"], sim_batched_runs=sim["batched_runs"],
                 shared_hits=shared.hits if shared else 0)
    log.debug("%s: %d simulations in %d slot holds (%d of them in batches of 2+), peak %d in flight, %.1f s busy",
              agent, sim["runs"], sim["batches"], sim["batched_runs"], sim["peak"], sim["busy_s"])
    return rollouts, stats


def _episode_summary(rollouts: Sequence[Rollout]) -> dict[str, Any]:
    eps = [r.episode for r in rollouts if r.episode is not None]
    if not eps:
        return {"reward_mean": float("nan"), "best_nse_mean": float("nan")}
    rewards = [sum(r.turn_rewards) + r.terminal for r in rollouts if r.episode is not None]
    best = [e.best_nse for e in eps if e.best_nse is not None and math.isfinite(e.best_nse)]
    stops = collections.Counter(str(e.stop_reason).split(":")[0] for e in eps)
    return {"reward_mean": float(np.mean(rewards)), "reward_std": float(np.std(rewards)),
            "turn_reward_mean": float(np.mean([sum(r.turn_rewards) for r in rollouts if r.episode is not None])),
            "terminal_mean": float(np.mean([r.terminal for r in rollouts if r.episode is not None])),
            "best_nse_mean": float(np.mean(best)) if best else float("nan"),
            "simulations_mean": float(np.mean([e.counters.get("simulations", 0) for e in eps])),
            "turns_mean": float(np.mean([len(e.turns) for e in eps])),
            "parse_failures_mean": float(np.mean([sum(t.kind == "parse_failure" for t in e.turns) for e in eps])),
            "stop_reasons": ";".join(f"{k}={v}" for k, v in sorted(stops.items()))}


# ---------------------------------------------------------------------------------------------
# The run


def _compute_dtype(config: GRPOConfig, device: torch.device) -> torch.dtype:
    if config.dtype == "fp32" or (config.dtype == "auto" and device.type != "cuda"):
        return torch.float32
    return torch.bfloat16


@dataclass
class Ranks:
    """The training processes: ``world`` ranks, this one ``rank``; ``scorer`` and ``reference`` compute
    the policy's and the frozen reference's token log-probs (:class:`LogprobModel`, sharded with FSDP2,
    wrapped in DDP, or plain)."""

    world: int
    rank: int
    device: torch.device
    dtype: torch.dtype
    fsdp: bool
    scorer: torch.nn.Module
    reference: torch.nn.Module | None

    @classmethod
    def one_process(cls, model: torch.nn.Module, reference: torch.nn.Module | None = None,
                    device: torch.device | None = None, dtype: torch.dtype = torch.float32) -> Ranks:
        """A single process training ``model`` (and scoring ``reference``) unwrapped."""
        return cls(1, 0, device or torch.device("cpu"), dtype, False, LogprobModel(model),
                   LogprobModel(reference).eval() if reference is not None else None)

    @property
    def lead(self) -> bool:
        return self.rank == 0

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """The dtype the scorers compute in under ``torch.autocast``: None where they need none (fp32
        compute, or FSDP2, whose mixed-precision policy all-gathers the fp32 shards in ``dtype``)."""
        return None if self.fsdp or self.dtype == torch.float32 else self.dtype

    @property
    def distributed(self) -> bool:
        return self.world > 1


def enable_checkpointing(model: Any) -> None:
    """Activation checkpointing of every decoder layer, non-reentrant (the form that composes with
    FSDP2 and DDP). It recomputes only while the model is in training mode (transformers checks
    ``self.training`` in the layer), which :func:`optimise` ensures."""
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x names it so
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def _decoder_layers(model: Any) -> list[torch.nn.Module]:
    return list(getattr(getattr(model, "model", None), "layers", None) or [])


@dataclass
class _Run:
    """What the step loop of :func:`train_grpo` works with, set up by :func:`_setup` (the engines by
    :func:`_start_generators`; rank 0 alone holds the metrics, the episode store, the simulators, the basins
    and the engine; the others hold None or empty ones)."""

    config: GRPOConfig
    run_dir: Path
    model: Any
    tokenizer: Any
    optimizer: torch.optim.Optimizer
    scheduler: Any
    state: TrainerState
    resume_from: Path | None
    metrics: _Metrics | None
    store: EpisodeStore | None
    sims: dict[str, Any]
    basins: dict[str, Any]
    runner: Any
    pad_id: int
    ranks: Ranks
    engine: EngineWeights | None
    started: float
    generator: ColocatedGenerator | None = None  # generator: colocated, on every rank


def train_grpo(config: GRPOConfig, run_dir: str | os.PathLike[str], resume: bool = True,
               pool: Any = None) -> dict[str, Any]:
    """Run GRPO as configured into ``run_dir``; returns a summary (see the module docstring).

    ``pool``: run the simulations on this pool's workers (the root rank's
    :class:`~hydroagent_hpc.hpc.mpi.MPIPool`); None runs them in the rollout threads.

    Under ``torchrun``/``accelerate launch`` (``WORLD_SIZE`` > 1) every process calls this; rank 0
    alone plays the rollouts (through the engine), stores them and writes the run folder, and every
    rank trains on its share of each step (:func:`optimise`). See docs/grpo.md, "Several GPUs".
    With several processes only rank 0 may get a ``pool`` (the MPI layout of
    ``python -m hydroagent_hpc.train.grpo --pool mpi --trainers T``: the simulation ranks serve rank 0's rollouts).

    In order: :func:`_setup` (every check before anything is written, then the run folder's files),
    the generators (:func:`_start_generators`), the step loop (:func:`_run`); whatever happens the metrics,
    the episode store and the engines are closed (:func:`_close`), the metrics' sinks marked failed on an error.
    """
    started = time.perf_counter()
    run = _setup(config, Path(run_dir), resume, pool, started)
    try:
        _start_generators(run)
        return _run(run)
    except BaseException:
        if run.metrics is not None:  # TensorBoard, W&B and the progress display
            run.metrics.close(failed=True)
        raise
    finally:
        _close(run)


def _setup(config: GRPOConfig, run_dir: Path, resume: bool, pool: Any, started: float) -> _Run:
    """Everything before the first step, checks first: nothing is written before the run folder, the processes,
    the basins and simulators (rank 0 only: it alone plays rollouts), the memory plan (on a GPU, before any
    weight loads) and the model are checked and the run folder agrees with the config
    (:func:`~hydroagent_hpc.train.rundir.prepare_run_dir`). Then the scorers (:func:`_training_ranks`), the
    optimizer and the (resumed) state, and rank 0's files (:func:`_open_files`)."""
    check_run_dir(run_dir)
    accelerator, world, rank, device = _processes(config, pool)
    lead = rank == 0
    runner = RemoteRunner(pool, config.simulator) if pool is not None else None
    all_dirs = list(config.basins) + list(config.validation_basins)
    basins = {d: load_basin(d) for d in all_dirs} if lead else {}
    sims = {d: open_simulator(Path(d) / "control.txt", config.simulator) for d in all_dirs} if lead else {}
    dtype = _compute_dtype(config, device)
    require_fits(config, "grpo", world, device)  # on a GPU: the memory plan, before any weight is loaded
    torch.manual_seed(config.seed)
    model, tokenizer = load_policy(config, device)
    resume_from = prepare_run_dir(run_dir, config.to_dict(), resume, ConfigError, field_defaults(GRPOConfig),
                                  model=model)
    if world > 1:
        dist.barrier()  # every rank has read the run folder before rank 0 writes to it
    ranks = _training_ranks(config, model, accelerator, world, rank, device, dtype)
    optimizer, scheduler, state = _optimizer_and_state(config, model, resume_from, ranks)
    metrics, store = _open_files(config, run_dir, ranks, state, resume_from, basins) if lead else (None, None)
    pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
    log.info("GRPO: %d training basins x K=%d, %d prompts/step, %d steps, %s advantages, kl %.3g, entropy %.3g, "
             "%s on %s, %d process(es)%s", len(config.basins), config.group_size, config.prompts_per_step,
             config.max_steps, config.advantage, config.kl_coef, config.entropy_coef, dtype, device, world,
             " FSDP2" if ranks.fsdp else (" DDP" if world > 1 else ""))
    return _Run(config, run_dir, model, tokenizer, optimizer, scheduler, state, resume_from, metrics, store, sims,
                basins, runner, pad_id, ranks, None, started)


def _processes(config: GRPOConfig, pool: Any) -> tuple[Any, int, int, torch.device]:
    """(the accelerator or None, the number of processes, this one's rank, its device). With ``WORLD_SIZE`` > 1
    the process group (gloo or NCCL) through accelerate, and a ``pool`` given to any rank but 0 refused."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        check_world_size(config, world)
        accelerator: Any = make_accelerator(config.collective_timeout_s)  # the process group: gloo or NCCL
        world, rank, device = accelerator.num_processes, accelerator.process_index, accelerator.device
        log.info("rank %d of %d: collectives time out after %.0f s", rank, world, process_group_timeout() or 0.0)
        if pool is not None and rank != 0:
            raise ConfigError(f"a simulation pool given to training rank {rank} of {world}",
                              "give the pool to rank 0 only: it alone plays the rollouts (as "
                              "python -m hydroagent_hpc.train.grpo --pool mpi --trainers does)")
        return accelerator, world, rank, device
    return None, world, 0, torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _training_ranks(config: GRPOConfig, model: Any, accelerator: Any, world: int, rank: int, device: torch.device,
                    dtype: torch.dtype) -> Ranks:
    """The training processes around ``model``: the frozen reference (``kl_coef`` > 0), activation checkpointing,
    and the policy's and reference's scorers, sharded with FSDP2 (several processes, ``fsdp`` not off), the
    policy's wrapped in DDP (several processes otherwise; the reference a full replica on every rank) or plain."""
    reference = None
    if config.kl_coef > 0:
        import copy

        # frozen: its weights never change, so it may hold the compute dtype (bf16 on a GPU: half the memory)
        reference = copy.deepcopy(model).to(dtype).eval()
        for p in reference.parameters():
            p.requires_grad_(False)
    if config.activation_checkpointing:
        enable_checkpointing(model)
    model.config.use_cache = True
    model.train()  # optimise sets it again before every update: a rollout phase may leave it in eval mode
    use_fsdp = world > 1 and config.fsdp is not False
    scorer: torch.nn.Module = LogprobModel(model)
    ref_scorer = LogprobModel(reference).eval() if reference is not None else None
    if use_fsdp:
        shard(scorer, dtype, layers=_decoder_layers(model))
        if ref_scorer is not None:
            shard(ref_scorer, dtype, layers=_decoder_layers(reference))
    elif world > 1:
        scorer = accelerator.prepare(scorer)  # DDP; the reference is a full replica on every rank
    return Ranks(world, rank, device, dtype, use_fsdp, scorer, ref_scorer)


def _optimizer_and_state(config: GRPOConfig, model: Any, resume_from: Path | None,
                         ranks: Ranks) -> tuple[torch.optim.Optimizer, Any, TrainerState]:
    """AdamW (created after sharding: it holds, and the checkpoints name, the parameters of the model itself;
    fused on a GPU: no full-size temporary at the step, the memory plan counts none), the warm-up schedule, and
    the trainer state: fresh, or loaded from ``resume_from`` (its weights must be finite). The reference was
    copied before: it stays the initial policy, not the resumed one."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.lr,
                                  betas=(0.9, 0.999), eps=1e-8, weight_decay=config.weight_decay,
                                  fused=ranks.device.type == "cuda")
    warm = config.warmup_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0)
    state = TrainerState()
    if resume_from is not None:
        state = load_checkpoint(resume_from, model, optimizer, scheduler)
        check_weights(model, f"--resume from {resume_from}: the checkpoint's model", distributed=ranks.distributed,
                      device=ranks.device, fix="resume from an earlier checkpoint (write its step-N name into "
                                               "checkpoints/latest) or start a new --out folder")
    return optimizer, scheduler, state


def _open_files(config: GRPOConfig, run_dir: Path, ranks: Ranks, state: TrainerState, resume_from: Path | None,
                basins: dict[str, Any]) -> tuple[_Metrics, EpisodeStore]:
    """Rank 0: ``config.yaml``, the metrics (cut back to the checkpoint's step on a resume; with their
    TensorBoard / W&B sinks) and the episode store."""
    write_run_config(run_dir, config.to_dict(), {"device": str(ranks.device), "compute_dtype": str(ranks.dtype),
                                                 "world_size": ranks.world, "fsdp": ranks.fsdp,
                                                 "resumed_from_step": state.step or None})
    resumed = state.step if resume_from is not None else None
    metrics = _Metrics(run_dir / "metrics.csv", resumed,
                       open_live("grpo", config, run_dir, resumed, config.max_steps))  # TensorBoard, W&B
    store = EpisodeStore(run_dir / "rollouts.h5")
    store.basins = basins
    return metrics, store


def _start_generators(run: _Run) -> None:
    """The generators besides the trainer's own sampler: rank 0's external engine (``generator: engine``), or
    an engine in every process (``generator: colocated``, its memory share beside the trainer's state)."""
    config, ranks = run.config, run.ranks
    if ranks.lead and config.generator == "engine":
        assert config.engine is not None  # checked with the config
        run.engine = EngineWeights(config.engine, run.run_dir,
                                   context_tokens=config.max_context_tokens + config.max_new_tokens)
    if config.generator == "colocated":  # every rank: an engine in this process
        share = colocated_memory_fraction(config, world=ranks.world, device=ranks.device)  # beside the trainer's state
        run.generator = colocated_for_run(config, run.model, run.tokenizer, ranks.device, ranks.dtype,
                                          world=ranks.world, rank=ranks.rank, planned_fraction=share)


def _close(run: _Run) -> None:
    """The metrics (their live sinks and progress display), the episode store and the engines, those opened."""
    if run.metrics is not None:
        run.metrics.close()
    if run.store is not None:
        run.store.close()
    if run.engine is not None:
        run.engine.close()
    if run.generator is not None:
        run.generator.close()


@dataclass
class _Rollouts:
    """Rank 0's rollouts of a step and what was derived from them; ``version``: the optimizer steps of the
    weights that sampled them (the step's own minus one on-policy, minus two with ``max_staleness`` 1)."""

    rollouts: list[Any]
    stats: dict[str, Any]
    per_turn: dict[Any, np.ndarray]
    degenerate: int
    seconds: float
    version: int = 0


@dataclass
class _Progress:
    """The step loop's record so far: the last validation's summary, the step last checkpointed (-1: none), the
    rows of ``metrics.csv`` written by this process (rank 0), and what stopped the loop early (``"SIGTERM"``)."""

    last_val: dict[str, Any]
    saved_at: int
    rows: list[dict[str, Any]] = field(default_factory=list)
    stopped: str | None = None


def _run(run: _Run) -> dict[str, Any]:
    """The step loop of :func:`train_grpo` (its setup done; the caller closes the store and the engine).

    On rank 0 only: rollouts, advantages, episodes, metrics, validation, the engine. On every rank:
    the weight gather for the engine push, the training step, checkpoints and the final model.
    """
    config, state, ranks = run.config, run.state, run.ranks
    # the engine serves the current (initial or resumed) weights before any rollout
    _sync_weights(run, state.step)
    last_val: dict[str, Any] = {}
    if ranks.lead and config.validation_basins and config.validate_every and run.resume_from is None:
        last_val = _validate_now(run, state.step)
    progress = _Progress(last_val, saved_at=state.step if run.resume_from is not None else -1)
    with Signals() as signals, timeline.recording(run.run_dir, rank=ranks.rank, world=ranks.world, device=ranks.device,
                                                  resumed_step=state.step if run.resume_from is not None else 0), \
            _rollouts_ahead(run) as ahead:  # max_staleness 1 (rank 0): the next step's rollouts during training
        while state.step < config.max_steps:
            if _one_step(run, progress, signals, ahead):
                break
    return _finish(run, progress, ahead)


def _one_step(run: _Run, progress: _Progress, signals: Signals, ahead: RolloutsAhead[_Rollouts] | None) -> bool:
    """One step: the prompts and (rank 0) their rollouts, the training batch on every rank
    (:func:`_shared_batch`), the next step's rollouts started (``max_staleness`` 1), the loss and one
    optimizer step, the new weights served, the step recorded (:func:`_record_step`, its timeline line) and
    checkpointed when due (:func:`_checkpoint_if_due`). True when a SIGTERM stops the run."""
    config, state, ranks = run.config, run.state, run.ranks
    step = state.step + 1
    t_step = time.perf_counter()
    timeline.begin_step(step)
    idx, epoch, index = plan_prompts(len(config.basins), config.prompts_per_step, config.seed,
                                     state.epoch, state.index)
    played = _this_steps_rollouts(run, ahead, step, idx, t_step) if ranks.lead else None
    batch = _shared_batch(run, played)
    if ahead is not None and step < config.max_steps:
        _play_ahead(run, ahead, step + 1, epoch, index)
    t_train = time.perf_counter()
    with timeline.span("train"):
        parts, lr = _optimizer_step(run, batch)
    training_s = time.perf_counter() - t_train
    if ahead is not None:  # every rollout of the next step is sampled before the weights change
        ahead.wait()
    if config.max_staleness and run.generator is not None and ranks.distributed:
        dist.barrier()  # colocated: no rank's engine takes new weights while rank 0's thread may still use it
    state.step, state.epoch, state.index = step, epoch, index
    state.tokens += int(parts["tokens"])
    # the engine serves the new weights before anything samples again (validation included)
    weight_sync_s = float("nan")
    if run.engine is not None or ranks.distributed or run.generator is not None:
        with timeline.span("sync"):
            weight_sync_s = _sync_weights(run, step)
    if played is not None:
        if config.validation_basins and config.validate_every and step % config.validate_every == 0:
            with timeline.span("validate"):
                progress.last_val = _validate_now(run, step)
        progress.rows.append(_record_step(run, step, played, batch, parts, lr, len(idx), training_s,
                                          time.perf_counter() - t_step, weight_sync_s, progress.last_val))
    record = timeline.end_step()  # the step's line of RUN/timeline.jsonl, before its checkpoint
    if run.metrics is not None and record is not None:
        run.metrics.log(step, _phase_seconds(record))  # to TensorBoard / W&B (no column of metrics.csv)
    return _checkpoint_if_due(run, progress, signals, ahead, step)


def _shared_batch(run: _Run, played: _Rollouts | None) -> list[_Sequence]:
    """Rank 0's training batch (the trainable rollouts with their advantages per group, from the ledger) on
    every rank; then the colocated engines release their memory (the rollouts are over on every one), unless
    they stay awake beside the trainer (``colocated.awake_while_training``)."""
    with timeline.span("wait"):  # the other ranks wait here for rank 0's rollouts
        pieces = PieceTable(run.tokenizer) if run.config.pg_tokens == "arguments" else None
        batch = _share(training_batch(played.rollouts, played.per_turn, pieces) if played is not None else None,
                       run.ranks)
    if run.generator is not None and not run.generator.awake_while_training:  # release the engines' memory
        with timeline.span("sleep"):
            run.generator.sleep()
    return batch


def _finish(run: _Run, progress: _Progress, ahead: RolloutsAhead[_Rollouts] | None) -> dict[str, Any]:
    """After the loop: unless a SIGTERM stopped it, the last checkpoint and ``final/`` (:func:`_save_last`);
    the summary."""
    state, rows = run.state, progress.rows
    final = run.run_dir / "final"
    if progress.stopped is None:
        _save_last(run, progress.saved_at, final)
        if ahead is not None:  # the last checkpoint holds the last step: no file is read again
            ahead.prune(state.step)
    return {"run_dir": str(run.run_dir), "steps": state.step, "stopped": progress.stopped,
            "final": str(final) if progress.stopped is None else None,
            "first_reward": rows[0]["reward_mean"] if rows else None,
            "last_reward": rows[-1]["reward_mean"] if rows else None,
            "world_size": run.ranks.world, "fsdp": run.ranks.fsdp, "wall_s": time.perf_counter() - run.started}


def _push(engine: EngineWeights | None, model: Any, tokenizer: Any, step: int, ranks: Ranks) -> float:
    """Make the engine serve ``model``'s weights; the seconds it took (NaN without an engine).

    With several processes the whole model is first gathered onto rank 0 (a collective: every rank
    calls this), which then pushes that copy; the gather counts in the seconds.
    """
    if not ranks.distributed:
        return engine.push(model, tokenizer, step) if engine is not None else float("nan")
    t0 = time.perf_counter()
    full = pretrained_copy(model, ranks.dtype)
    if engine is None or full is None:
        return float("nan")
    engine.push(full, tokenizer, step)
    return time.perf_counter() - t0


def _sync_weights(run: _Run, step: int) -> float:
    """Make the generator serve the current weights: the colocated engines (every rank syncs its own,
    in memory), or the external engine (gathered onto rank 0 and pushed); the seconds (NaN without one)."""
    if run.generator is not None:
        return run.generator.sync(run.model, step)
    if run.engine is not None or run.ranks.distributed:
        return _push(run.engine, run.model, run.tokenizer, step, run.ranks)
    return float("nan")


def _share(batch: list[_Sequence] | None, ranks: Ranks) -> list[_Sequence]:
    """Rank 0's training batch on every rank (``broadcast_object_list``: pickled, sent from rank 0)."""
    if not ranks.distributed:
        assert batch is not None
        return batch
    box: list[Any] = [batch]
    dist.broadcast_object_list(box, src=0)
    return list(box[0])


def _phase_seconds(record: Mapping[str, Any]) -> dict[str, float]:
    """The seconds of each phase of each training process in a step's timeline record, for the live metrics:
    ``timeline/rank0/train_s``, ``timeline/rank0/forward_s`` (inside train), ``timeline/rank0/idle_s``."""
    return {f"timeline/{lane.replace(' ', '')}/{phase}_s": float(seconds)
            for lane, entry in timeline.utilisation([record])["lanes"].items() if entry["kind"] == "rank"
            for phase, seconds in entry["seconds"].items()}


def _validate_now(run: _Run, step: int) -> dict[str, Any]:
    """Rank 0: the greedy validation episodes at ``step``."""
    assert run.store is not None
    return _validate(run.config, run.model, run.tokenizer, run.sims, run.basins, run.store, step, run.runner,
                     run.engine, run.generator)


def _play_step(run: _Run, step: int, idx: Sequence[int], t_step: float, model: Any = None,
               version: int | None = None) -> _Rollouts:
    """Rank 0: K rollouts of each prompt basin of the step, written to the episode store, and their
    per-turn advantages (group-relative, from the ledger). ``model``: what the rollout policies are built
    on (the trainer's model; another while it trains, :func:`_play_ahead`); ``version``: the optimizer steps
    of the weights that sample (the trainer's by default), stored with each episode (``provenance``)."""
    config = run.config
    assert run.store is not None
    version = run.state.step if version is None else version
    specs = [RolloutSpec(g, k, config.basins[b], rollout_seed(config.seed, step, g, k), f"grpo-s{step:05d}-g{g}-k{k}")
             for g, b in enumerate(idx) for k in range(config.group_size)]
    with timeline.span("generate"):
        rollouts, stats = play_episodes(config, run.model if model is None else model, run.tokenizer, specs, run.sims,
                                        run.basins, runner=run.runner, engine=run.engine, generator=run.generator)
    for r in rollouts:
        if r.episode is not None:
            r.episode.provenance = {**r.episode.provenance, "policy_version": version}
    run.store.write(rollouts)
    fault("kill_after_rollouts", step)
    seconds = time.perf_counter() - t_step
    per_turn, degenerate = _advantages(config, rollouts, len(idx))
    return _Rollouts(rollouts, stats, per_turn, degenerate, seconds, version)


def _rollouts_ahead(run: _Run) -> contextlib.AbstractContextManager[RolloutsAhead[_Rollouts] | None]:
    """With ``max_staleness`` 1, rank 0's :class:`~hydroagent_hpc.train.grpo.overlap.RolloutsAhead` (on a
    resume holding the next step's rollouts if they were played before the kill); else a block giving None."""
    if not (run.config.max_staleness and run.ranks.lead):
        return contextlib.nullcontext()
    ahead: RolloutsAhead[_Rollouts] = RolloutsAhead(run.run_dir, behaviour_model(run.config.generator, run.model))
    if run.resume_from is not None:
        ahead.resume(run.state.step + 1)
    return ahead


def _this_steps_rollouts(run: _Run, ahead: RolloutsAhead[_Rollouts] | None, step: int, idx: Sequence[int],
                         t_step: float) -> _Rollouts:
    """Rank 0: the step's rollouts, played during the previous step (``max_staleness`` 1) or now."""
    played = ahead.take(step) if ahead is not None else None
    return played if played is not None else _play_step(run, step, idx, t_step)


def _play_ahead(run: _Run, ahead: RolloutsAhead[_Rollouts], step: int, epoch: int, index: int) -> None:
    """Rank 0: start playing ``step``'s rollouts (its prompts from the sampler position ``epoch, index``)
    with the current weights, in a thread, while the trainer trains the step before it."""
    config = run.config
    idx, _, _ = plan_prompts(len(config.basins), config.prompts_per_step, config.seed, epoch, index)
    version = run.state.step
    model = ahead.behaviour.refresh(run.model, version)  # local: a copy of these weights; engine: a shell
    t0 = time.perf_counter()
    ahead.start(step, lambda: _play_step(run, step, idx, t0, model=model, version=version))


def _optimizer_step(run: _Run, batch: list[_Sequence]) -> tuple[dict[str, float], float]:
    """The loss over ``batch`` and one optimizer step on every rank, then one scheduler step; (the loss's
    parts, the learning rate the step used)."""
    step = run.state.step + 1
    if run.generator is not None:  # never train while an engine of this process holds its memory
        run.generator.check_released()
    try:
        parts = optimise(run.config, run.model, run.optimizer, batch, run.pad_id, run.ranks, step)
        check_weights(run.model, f"step {step}: after the optimizer step the policy", distributed=run.ranks.distributed,
                      device=run.ranks.device)
    except NonFiniteError as exc:  # nothing is saved after a non-finite step: the last checkpoint stays
        raise stopped_at(exc, run.run_dir) from None
    lr = float(run.scheduler.get_last_lr()[0])
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)`")
        run.scheduler.step()
    return parts, lr


def _record_step(run: _Run, step: int, played: _Rollouts, batch: list[_Sequence], parts: dict[str, float], lr: float,
                 groups: int, training_s: float, step_s: float, weight_sync_s: float,
                 last_val: dict[str, Any]) -> dict[str, Any]:
    """Rank 0: the step's row of ``metrics.csv`` and its console line; the row."""
    assert run.metrics is not None
    rollouts, stats, degenerate = played.rollouts, played.stats, played.degenerate
    advs = np.concatenate(list(played.per_turn.values())) if played.per_turn else np.zeros(1)
    row = {"step": step, **_episode_summary(rollouts), "rollouts": len(rollouts),
           **learning_signal(batch, advs, degenerate, groups),
           "trainable": sum(r.trainable for r in rollouts), "degenerate_groups": degenerate,
           "adv_mean": float(advs.mean()), "adv_std": float(advs.std()),
           "adv_abs_max": float(np.abs(advs).max()), **parts, "lr": lr, "staleness": step - 1 - played.version,
           "generation_s": float(stats["busy_s"]),
           "simulation_s": float(stats["sim_busy_s"]), "training_s": training_s,
           "step_s": step_s, "sim_peak_in_flight": int(stats["sim_peak"]),
           "shared_run_hits": int(stats.get("shared_hits", 0)),
           "sim_batches": int(stats["sim_batches"]),
           "sim_batched_runs": int(stats["sim_batched_runs"]),
           "val_reward_mean": last_val.get("reward_mean", float("nan")),
           "val_best_nse_mean": last_val.get("best_nse_mean", float("nan")),
           "weight_sync_s": weight_sync_s}
    run.metrics.write(row)
    log.info("step %d/%d reward %.3f (turn %.3f, terminal %.3f) best NSE %.3f | loss %.4f kl %.4f "
             "entropy %.3f | %d/%d trainable, %d degenerate groups | rollouts %.1f s train %.1f s | "
             "%d simulations in %d slot holds, %d of them batched",
             step, run.config.max_steps, row["reward_mean"], row.get("turn_reward_mean", float("nan")),
             row.get("terminal_mean", float("nan")), row["best_nse_mean"], row["loss"], row["kl"],
             row["entropy"], row["trainable"], len(rollouts), degenerate, played.seconds, training_s,
             int(stats["sim_runs"]), row["sim_batches"], row["sim_batched_runs"])
    return row


def _checkpoint_if_due(run: _Run, progress: _Progress, signals: Signals, ahead: RolloutsAhead[_Rollouts] | None,
                       step: int) -> bool:
    """A checkpoint every ``save_every`` steps, on SIGUSR1 and on SIGTERM (every rank agrees on a signal
    that reached any of them), recorded in ``progress.saved_at``; the rollouts played ahead before it are
    dropped. True on a SIGTERM: the run stops (``progress.stopped``) after this step's checkpoint."""
    ranks = run.ranks
    fault("usr1", step)
    fault("term", step)
    signalled_here = signals.save
    want_save, want_stop = agree(signals, ranks.distributed, ranks.device)
    if want_save and ranks.distributed:  # which ranks the signal reached (all of them save)
        log.info("rank %d of %d: checkpoint on a signal at step %d (the signal reached this rank: %s)",
                 ranks.rank, ranks.world, step, "yes" if signalled_here else "no")
    # a stop always saves this step: a SIGTERM that arrived during the last save had its save flag
    # cleared with that save's
    if (want_save or (want_stop and progress.saved_at != step)
            or (run.config.save_every and step % run.config.save_every == 0)):
        save_checkpoint_or_stop(run.run_dir, run.model, run.optimizer, run.scheduler, run.state,
                                keep=run.config.keep_checkpoints)
        progress.saved_at = step
        signals.save = False
    fault("kill", step)
    if ahead is not None:
        ahead.prune(progress.saved_at)
    if want_stop:
        progress.stopped = "SIGTERM"
        log.warning("SIGTERM: saved checkpoint step-%d and stopping", step)
    return want_stop


def _save_last(run: _Run, saved_at: int, final: Path) -> None:
    """After the last step: its checkpoint (unless saved already) and the final model (gathered from
    the shards when several ranks train)."""
    if saved_at != run.state.step:
        save_checkpoint_or_stop(run.run_dir, run.model, run.optimizer, run.scheduler, run.state,
                        keep=run.config.keep_checkpoints)
    if run.ranks.distributed:
        full = pretrained_copy(run.model, run.ranks.dtype)  # collective
        if full is not None:
            _save_final(final, full, run.tokenizer)
        dist.barrier()
    else:
        _save_final(final, run.model, run.tokenizer)


def learning_signal(batch: Sequence[_Sequence], turn_advantages: np.ndarray, degenerate: int,
                    groups: int) -> dict[str, float]:
    """Why a step does or does not move the policy: the share of groups whose returns were all equal
    (no gradient from them), the 10/50/90 % quantiles of the per-turn advantages, and the shares of
    trained (mask-1) tokens whose advantage is positive, negative or zero (a step whose tokens all
    carry 0 trains on the KL and entropy terms alone)."""
    counts = np.zeros(3)
    for seq in batch:
        adv = seq.token_advantages()[np.asarray(seq.mask, dtype=bool)]
        counts += ((adv > 0).sum(), (adv < 0).sum(), (adv == 0).sum())
    shares = counts / counts.sum() if counts.sum() else np.full(3, np.nan)
    q = np.quantile(turn_advantages, [0.1, 0.5, 0.9]) if turn_advantages.size else np.full(3, np.nan)
    return {"degenerate_share": degenerate / groups if groups else float("nan"),
            "adv_p10": float(q[0]), "adv_p50": float(q[1]), "adv_p90": float(q[2]),
            "tokens_adv_pos": float(shares[0]), "tokens_adv_neg": float(shares[1]), "tokens_adv_zero": float(shares[2])}


def _parse_failures(rollout: Rollout) -> int:
    """The parse failures of a played rollout (a rollout without an episode counts as one)."""
    if rollout.episode is None:
        return 1
    return sum(t.kind == "parse_failure" for t in rollout.episode.turns)


def _advantages(config: GRPOConfig, rollouts: Sequence[Rollout], groups: int) -> tuple[dict[int, np.ndarray], int]:
    """Per-turn advantages of the trainable rollouts (by index) and the number of degenerate groups."""
    per_turn: dict[int, np.ndarray] = {}
    degenerate = 0
    for g in range(groups):
        members = [i for i, r in enumerate(rollouts) if r.spec.group == g and r.trainable]
        if not members:
            degenerate += 1
            continue
        valid = ([_parse_failures(rollouts[i]) == 0 for i in members] if config.baseline != "group" else None)
        ga = group_advantages([rollouts[i].turn_rewards for i in members],
                              [rollouts[i].terminal for i in members], mode=config.advantage,
                              gamma=config.gamma, std=config.std_normalise, baseline_members=valid,
                              clip=config.adv_clip)
        degenerate += bool(ga.degenerate)
        for k, (i, adv) in enumerate(zip(members, ga.per_turn)):
            # valid_only: a member with a parse failure carries no advantage (only the KL and entropy terms)
            drop = config.baseline == "valid_only" and valid is not None and not valid[k]
            per_turn[i] = np.zeros_like(adv, dtype=np.float64) if drop else np.asarray(adv, dtype=np.float64)
    return per_turn, degenerate


@dataclass
class _Sequence:
    """What the loss needs of one trainable rollout (and what rank 0 sends the other ranks): the ids,
    the 0/1 mask of sampled ids, the assistant spans, the generator's log-probs of the mask-1 ids, the
    advantage of each assistant turn and, with ``pg_tokens: arguments``, the 0/1 mask of the tokens that
    carry it (None: every token of a turn does)."""

    ids: list[int]
    mask: list[int]
    spans: list[tuple[int, int]]
    sample_logprobs: list[float]
    advantages: np.ndarray
    pg_mask: np.ndarray | None = None

    def token_advantages(self) -> np.ndarray:
        """Each token's advantage: its turn's (:func:`token_advantages`), times :attr:`pg_mask` if any."""
        adv = token_advantages(self.advantages, self.spans, len(self.ids))
        return adv if self.pg_mask is None else adv * self.pg_mask


def training_batch(rollouts: Sequence[Rollout], per_turn: dict[int, np.ndarray],
                   pieces: PieceTable | None = None) -> list[_Sequence]:
    """The trainable rollouts among ``rollouts`` as sequences, each with its per-turn advantages ``per_turn[i]``;
    with ``pieces`` (``pg_tokens: arguments``) each also with the mask of its tool calls' argument tokens
    (:func:`~hydroagent_hpc.train.grpo.decisions.argument_mask`)."""
    return [_Sequence(list(r.ids), list(r.mask), list(r.spans), list(r.sample_logprobs), per_turn[i],
                      None if pieces is None else argument_mask(pieces(r.ids), r.spans))
            for i in per_turn if (r := rollouts[i]).trainable]


def rank_passes(n: int, world: int, rank: int) -> list[int | None]:
    """The sequences (indices into a batch of ``n``) that ``rank`` of ``world`` trains on, in order.

    Rank ``r`` takes ``r, r + W, r + 2W, ...``: the ranks' shares are disjoint and together the
    whole batch. Each list is padded with None to ``ceil(n / W)`` entries, so every rank runs the same
    number of forward and backward passes (under FSDP each pass is a collective of all ranks); a
    None pass back-propagates zero times a real sequence's loss.
    """
    mine: list[int | None] = list(range(rank, n, world))
    return mine + [None] * (-(-n // world) - len(mine))


def _local_counts(batch: Sequence[_Sequence], passes: Sequence[int | None]) -> tuple[float, float]:
    """Mask-1 tokens and sequences of this rank's share (summed over the ranks: the step's totals)."""
    mine = [batch[k] for k in passes if k is not None]
    return float(sum(sum(s.mask) for s in mine)), float(len(mine))


def _autocast(device: torch.device, dtype: torch.dtype | None) -> Any:
    """``torch.autocast`` to ``dtype`` on ``device``'s type, or a no-op when ``dtype`` is None."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def _accumulate(config: GRPOConfig, scorer: torch.nn.Module, reference: torch.nn.Module | None,
                batch: Sequence[_Sequence], passes: Sequence[int | None], total_tokens: float, n_seq: float,
                world: int, device: torch.device, *, autocast_dtype: torch.dtype | None = None) -> dict[str, float]:
    """Forward and backward passes over this rank's share of ``batch``; the gradients stay in ``.grad``.

    The scorer must be in training mode (activation checkpointing runs only then: a policy left in
    eval mode by a rollout phase would keep every layer's activations, gpu-audit F2); a scorer in
    eval mode is refused. ``autocast_dtype``: compute the forward passes under ``torch.autocast`` to
    it (bf16 over fp32 master weights, one process or DDP; :attr:`Ranks.autocast_dtype`). The loss
    itself is float32 (log-probs, advantages, masks).

    Every pass's loss is aggregated with the step's global ``total_tokens`` and ``n_seq``
    (:func:`~hydroagent_hpc.train.grpo.loss.aggregate`), so summing the passes of all ranks gives the
    loss of the whole batch whatever the split; each backward is of ``W * weight * loss``
    (``weight`` 0 on a padding pass) because DDP/FSDP average the ranks' gradients
    (:mod:`hydroagent_hpc.train.distributed`). Gradients are reduced across ranks in the last pass
    only. Returns this rank's sums of the diagnostics (loss, parts, mismatch, TIS weights).
    """
    if not scorer.training:
        raise RuntimeError("the policy is in eval mode inside an optimisation step: activation checkpointing "
                           "would not run (call scorer.train() first)")
    sums: dict[str, float] = collections.defaultdict(float)
    for j, k in enumerate(passes):
        seq, weight = (batch[k], 1.0) if k is not None else (batch[0], 0.0)
        ids = torch.tensor([seq.ids], dtype=torch.long, device=device)
        attn = torch.ones_like(ids)
        mask = torch.tensor([seq.mask], dtype=torch.float32, device=device)
        adv = torch.from_numpy(seq.token_advantages())[None].to(
            device=device, dtype=torch.float32)
        with grad_sync(scorer, j == len(passes) - 1):
            with _autocast(device, autocast_dtype), timeline.span("forward"):
                logp, entropy = scorer(ids, attn, chunk_size=config.logprob_chunk, with_entropy=True)
            ref_logp = None
            if reference is not None:
                with torch.no_grad(), _autocast(device, autocast_dtype), timeline.span("forward"):
                    ref_logp, _ = reference(ids, attn, chunk_size=config.logprob_chunk, with_entropy=False)
            is_weights = _off_policy_weights(config, seq, logp, mask, weight, sums, device)
            parts = grpo_loss(logp, logp.detach(), ref_logp, entropy, adv, mask, clip_low=config.clip_low,
                              clip_high=config.clip_high, kl_coef=config.kl_coef, entropy_coef=config.entropy_coef,
                              aggregation=config.aggregation, norm_length=config.norm_length,
                              total_tokens=total_tokens, num_sequences=n_seq, is_weights=is_weights)
            with timeline.span("backward"):
                (parts.loss * (world * weight)).backward()
        reshard = getattr(reference, "reshard", None)  # FSDP2 keeps a root's parameters gathered after forward
        if reshard is not None:
            reshard()
        if not weight:
            continue
        sums["loss"] += float(parts.loss.detach())
        share = float(mask.sum()) / max(total_tokens, 1.0)  # token-weighted means of the diagnostics
        for key in ("pg", "kl", "entropy", "clip_fraction"):
            value = getattr(parts, key)
            sums[key] += float(value) * (share if key == "clip_fraction" else 1.0)
    return sums


def _off_policy_weights(config: GRPOConfig, seq: _Sequence, logp: torch.Tensor, mask: torch.Tensor, weight: float,
                        sums: dict[str, float], device: torch.device) -> torch.Tensor | None:
    """The generator's log-probs of the sampled ids against the trainer's ``logp``: the engine mismatch (and,
    with ``max_staleness`` 1, the step of policy change between sampling and training), added to ``sums`` (a
    ``defaultdict(float)``) on a real pass (``weight`` not 0); with ``tis_cap`` > 0 the truncated importance weights
    ``min(p_trainer / p_generator, cap)``. None without weights (``tis_cap`` 0, or no generator log-probs)."""
    if len(seq.sample_logprobs) != int(mask.sum()):
        return None
    gen = torch.zeros_like(mask)
    gen[mask.bool()] = torch.tensor(seq.sample_logprobs, dtype=gen.dtype, device=device)
    delta = (logp.detach().float() - gen)[mask.bool()]
    if weight:
        sums["mismatch_abs_sum"] += float(delta.abs().sum())
        sums["mismatch_max"] = max(sums["mismatch_max"], float(delta.abs().max()) if delta.numel() else 0.0)
    if not config.tis_cap > 0:
        return None
    tis = truncated_importance_weights(logp, gen, mask, config.tis_cap)
    if weight:
        sums["tis_weight_sum"] += float(tis.weights[mask.bool()].sum())
        sums["tis_ratio_sum"] += tis.ratio_sum
        sums["tis_truncated"] += tis.truncated
        sums["tis_ratio_max"] = max(sums["tis_ratio_max"], tis.ratio_max)
    return tis.weights


_SUMMED = ("loss", "pg", "kl", "entropy", "clip_fraction", "mismatch_abs_sum", "tis_weight_sum", "tis_ratio_sum",
           "tis_truncated")


def optimise(config: GRPOConfig, model: Any, optimizer: torch.optim.Optimizer, batch: Sequence[_Sequence],
             pad_id: int, ranks: Ranks, step: int | None = None) -> dict[str, float]:
    """One optimizer step over the trainable rollouts (one sequence per backward pass), this rank's
    share (:func:`rank_passes`) of them; the step's token and sequence counts are summed over the
    ranks before any backward pass, so the gradient is the single-process one (:func:`_accumulate`).
    A loss or gradient norm that is not finite raises :class:`~hydroagent_hpc.train.finite.NonFiniteError`
    before the optimizer steps (``step`` names it)."""
    passes = rank_passes(len(batch), ranks.world, ranks.rank)
    counts = torch.tensor(_local_counts(batch, passes), dtype=torch.float64, device=ranks.device)
    total_tokens, n_seq = (float(v) for v in all_reduce_sum(counts, ranks.distributed))
    if n_seq == 0:  # the same on every rank: the batch is rank 0's
        log.warning("no trainable rollout in this batch: the optimizer does not step")
        return {"loss": 0.0, "pg": 0.0, "kl": 0.0, "entropy": float("nan"), "clip_fraction": 0.0,
                "grad_norm": 0.0, "tokens": 0.0, "logprob_mismatch_mean": float("nan"),
                "logprob_mismatch_max": float("nan"), "tis_weight_mean": float("nan"),
                "tis_ratio_mean": float("nan"), "tis_ratio_max": float("nan"), "tis_truncated_share": float("nan")}
    optimizer.zero_grad(set_to_none=True)
    ranks.scorer.train()  # whatever the rollout phase left: checkpointing recomputes only in training mode
    local = _accumulate(config, ranks.scorer, ranks.reference, batch, passes, total_tokens, n_seq, ranks.world,
                        ranks.device, autocast_dtype=ranks.autocast_dtype)
    summed = all_reduce_sum(torch.tensor([local[k] for k in _SUMMED], dtype=torch.float64, device=ranks.device),
                            ranks.distributed)
    sums = dict(zip(_SUMMED, (float(v) for v in summed)))
    sums["mismatch_max"], sums["tis_ratio_max"] = (float(v) for v in all_reduce_max(
        torch.tensor([local["mismatch_max"], local["tis_ratio_max"]], dtype=torch.float64, device=ranks.device),
        ranks.distributed))
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
    grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    check_step(sums["loss"], grad_norm, step)  # before the weights move: a NaN never reaches them
    with timeline.span("optimizer"):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    tokens = max(total_tokens, 1.0)
    return {"loss": sums["loss"], "pg": sums["pg"], "kl": sums["kl"], "entropy": sums["entropy"],
            "clip_fraction": sums["clip_fraction"], "grad_norm": grad_norm, "tokens": total_tokens,
            "logprob_mismatch_mean": sums["mismatch_abs_sum"] / tokens, "logprob_mismatch_max": sums["mismatch_max"],
            **_tis_means(config, sums, tokens)}


def _tis_means(config: GRPOConfig, sums: Mapping[str, float], tokens: float) -> dict[str, float]:
    """The truncated importance weights' mean, and the untruncated ratios' mean, maximum and share above
    ``tis_cap``, over the step's mask-1 tokens (NaN with ``tis_cap`` 0: no weights are computed)."""
    if not config.tis_cap > 0:
        return dict.fromkeys(("tis_weight_mean", "tis_ratio_mean", "tis_ratio_max", "tis_truncated_share"),
                             float("nan"))
    return {"tis_weight_mean": sums["tis_weight_sum"] / tokens, "tis_ratio_mean": sums["tis_ratio_sum"] / tokens,
            "tis_ratio_max": sums["tis_ratio_max"], "tis_truncated_share": sums["tis_truncated"] / tokens}


def _validate(config: GRPOConfig, model: Any, tokenizer: Any, sims: dict[str, Any], basins: dict[str, Any],
              store: EpisodeStore, step: int, runner: Any = None,
              engine: EngineWeights | None = None, generator: ColocatedGenerator | None = None) -> dict[str, Any]:
    specs = [RolloutSpec(g, 0, d, config.seed, f"grpo-val-s{step:05d}-g{g}")
             for g, d in enumerate(config.validation_basins)]
    rollouts, _ = play_episodes(config, model, tokenizer, specs, sims, basins, greedy=True, agent="grpo-val",
                                runner=runner, engine=engine, generator=generator)
    store.write(rollouts)
    summary = _episode_summary(rollouts)
    log.info("validation at step %d: reward %.3f, best NSE %.3f on %d held-out basins", step,
             summary["reward_mean"], summary["best_nse_mean"], len(specs))
    return summary


def _save_final(final: Path, model: Any, tokenizer: Any) -> None:
    """``final/`` through a temporary folder (never with non-finite weights; a failed write leaves none)."""
    save_final(final, model, tokenizer, "the final policy")

