"""Does the recipe learn? ``python -m hydroagent_hpc.bench.learning --out DIR`` (``make train-bench``).

The whole recipe on CPU with the tiny offline Qwen3, repeated over model seeds x data seeds, and
every policy scored on the same held-out synthetic basins at the same budget (issue 30):

=================  ===========================================================================
row                what it is
=================  ===========================================================================
Base               the random tiny Qwen3 of each model seed, untrained (after ``--copy-steps`` steps
                   of copy pretraining when asked: train/copying.py)
SFT                Base after SFT on the teacher episodes of each data seed (the demo's recipe)
SFT+GRPO           SFT after ``--grpo-steps`` GRPO steps on the teaching basins (``paper`` preset,
                   K = ``--k``, per-episode credit), from the SFT checkpoint
heuristic          the teacher itself (agents/heuristic.py), seeds ``--ref-seeds``
DDS, random        the optimisers, same basins, same budget, seeds ``--ref-seeds``; once more
                   "(every simulation)": with tool calls enough for all the simulations of the
                   budget (three calls each), the row goal 2 compares at equal simulations
=================  ===========================================================================

Trained policies play greedily (one episode per held-out basin); each row gives the mean over its
seeds of: mean best NSE, the share of assistant messages that were valid tool calls, simulations
used, parse failures and total reward per episode, with the spread (sample standard deviation)
over seeds (an episode without a valid simulation scores -1). The ablation (``--ablation N``: the
first N cells) trains GRPO three times from the same SFT checkpoint with only the credit mode
changed: ``episode`` (the paper: one group-normalised return per episode), ``turn`` (per-turn
reward-to-go with the paper's shaping) and ``released`` (terminal reward only, what the authors'
code trained).

Curves: every ``validate_every`` steps GRPO plays the first ``--curve-basins`` held-out basins
greedily (stored as ``grpo-val`` episodes); the held-out reward and valid-call share against the
step, mean and spread over cells, are drawn in ``DIR/figures/curves.png``. The per-step learning
signal (zero-variance groups, advantage spread, KL, entropy, gradient norm, clip fraction, tokens
per advantage sign) is averaged over cells into ``DIR/tables/signal.csv`` for the diagnosis.

Every unit of work (a data set, an SFT run, a GRPO run, an evaluation) writes its result into its
own folder and a ``done.json`` last; a rerun with the same settings skips what is done, and the
trainers resume from their newest checkpoints; a changed recipe setting is refused, more seeds or
ablation cells extend a bench (:data:`EXTENDABLE`). ``--jobs`` units run at once, each on
``cores / jobs`` torch threads (the tiny model is too small to use two cores well in one
process). ``DIR/report.md`` holds the tables, the goals and the figures; ``DIR/result.json`` the
numbers. ``--quick`` is a smoke-sized run (minutes) for the tests.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import logging
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

from hydroagent_hpc.bench.blind import blind_ceiling, moves, nse_table, reading
from hydroagent_hpc.campaign import campaign_from_mapping, run_campaign
from hydroagent_hpc.train.grpo.config import grpo_config_from_mapping
from hydroagent_hpc.train.sft.config import config_from_mapping

__all__ = ["BenchPlan", "QUICK", "basin_gain", "basin_set", "per_basin", "units", "run", "summarise", "main"]

log = logging.getLogger(__name__)

CREDITS = ("episode", "turn", "released")
#: Plan fields a rerun may change: they add units (seeds, ablation cells) and leave the done ones valid.
EXTENDABLE = ("model_seeds", "data_seeds", "ablation")
REFERENCES = ("heuristic", "dds", "random")


@dataclass(frozen=True)
class BenchPlan:
    """Everything that decides a learning bench (written into ``DIR/plan.json``; a rerun must match)."""

    model_seeds: tuple[int, ...] = (0, 1, 2)
    data_seeds: tuple[int, ...] = (0, 1, 2)
    heldout: int = 96  # on 48 the blind move GRPO learns was worth +0.017, on 87 others +0.075 (docs/learning.md)
    teach: int = 48
    teacher_seeds: tuple[int, ...] = (0, 1)
    ref_seeds: tuple[int, ...] = (0, 1, 2)
    max_turns: int = 8
    max_simulations: int = 4
    sft_steps: int = 600
    sft_lr: float = 3e-3
    grpo_steps: int = 16
    k: int = 8
    prompts_per_step: int = 2
    grpo_lr: float = 2e-4
    baseline: str = "valid_only"  # the group mean over valid episodes (docs/learning.md)
    adv_clip: float = 3.0
    pg_tokens: str = "all"  # the tokens the policy gradient is taken on (all: the paper's; or arguments)
    temperature: float = 1.0
    entropy_coef: float = 0.0  # the paper's 0.01 only spread the sampled numbers here (docs/learning.md)
    max_new_tokens: int = 128
    validate_every: int = 4
    curve_basins: int = 12
    ablation: int = 0  # --ablation N adds the turn and released credits on N model seeds of data seed 0
    recovery: float = 0.1
    teacher_explore: float = 0.0  # the teacher's share of uniformly drawn moves (HeuristicHydrologist.explore)
    teacher_explore_start: float = 0.0  # the teacher's share of drawn first guesses (.explore_start)
    teacher_quote: bool = False  # the teacher quotes the observed values its moves act on (.quote)
    copy_steps: int = 0  # copy pretraining of each Base before SFT (train/copying.py), in batches of 16

    @property
    def env(self) -> dict[str, Any]:
        """The environment of every episode: teacher, GRPO, evaluation (the same budget for every row)."""
        return {"max_turns": self.max_turns, "max_simulations": self.max_simulations, "patience": None,
                "stop_at_target": False, "observation": "released"}

    def cells(self) -> list[tuple[int, int]]:
        return [(d, m) for d in self.data_seeds for m in self.model_seeds]

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(dataclasses.asdict(self)))


#: A run of minutes for the tests: the real code path at toy sizes (it does not learn).
QUICK = BenchPlan(model_seeds=(0,), data_seeds=(0,), heldout=2, teach=2, teacher_seeds=(0,), ref_seeds=(0,),
                  max_turns=4, max_simulations=2, sft_steps=4, grpo_steps=2, k=2, prompts_per_step=1,
                  max_new_tokens=48, validate_every=1, curve_basins=1, ablation=1)


# --------------------------------------------------------------------------- the units of work


@dataclass(frozen=True)
class Unit:
    """One piece of work: ``key`` names its folder (``DIR/<key>/``), ``needs`` the units it reads."""

    key: str
    kind: str
    args: tuple[Any, ...]
    needs: tuple[str, ...] = ()


def units(plan: BenchPlan) -> list[Unit]:
    """Every unit of the bench in an order that respects ``needs``."""
    # the scheduler starts ready units in this order: the long chains (data -> SFT -> GRPO) first
    out = [Unit("heldout", "heldout", ())]
    out += [Unit(f"data{d}", "data", (d,)) for d in plan.data_seeds]
    out += [Unit(f"base{m}", "base", (m,)) for m in plan.model_seeds]
    ablate = set(plan.cells()[:plan.ablation])
    for d, m in plan.cells():
        cell = f"d{d}m{m}"
        out.append(Unit(f"{cell}/sft", "sft", (d, m), (f"data{d}", f"base{m}")))
    for d, m in plan.cells():
        cell = f"d{d}m{m}"
        for credit in CREDITS if (d, m) in ablate else CREDITS[:1]:
            out.append(Unit(f"{cell}/grpo-{credit}", "grpo", (d, m, credit), (f"{cell}/sft", f"data{d}", "heldout")))
    for d, m in plan.cells():
        cell = f"d{d}m{m}"
        out.append(Unit(f"{cell}/eval-sft", "eval", (f"{cell}/sft",), (f"{cell}/sft", "heldout")))
        for credit in CREDITS if (d, m) in ablate else CREDITS[:1]:
            out.append(Unit(f"{cell}/eval-grpo-{credit}", "eval", (f"{cell}/grpo-{credit}",),
                            (f"{cell}/grpo-{credit}", "heldout")))
    out.append(Unit("references", "references", (), ("heldout",)))
    out.append(Unit("references-sims", "references", (True,), ("heldout",)))
    out.append(Unit("blind", "blind", (), ("heldout",)))
    out += [Unit(f"base{m}/eval", "eval", (f"base{m}",), (f"base{m}", "heldout")) for m in plan.model_seeds]
    return out


def _done(folder: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads((folder / "done.json").read_text()))
    except (OSError, ValueError):
        return None


def _finish(folder: Path, result: Mapping[str, Any]) -> dict[str, Any]:
    tmp = folder / ".done.json.tmp"
    tmp.write_text(json.dumps(dict(result), indent=2, default=str) + "\n")
    os.replace(tmp, folder / "done.json")  # last: a unit without it runs (and resumes) again
    return dict(result)


def basin_set(folder: Path, names: Sequence[tuple[str, int]]) -> list[str]:
    """The synthetic basins ``(name, seed)`` under ``folder`` (80 km², 10 + 3 days, as every bench basin),
    built where missing; their paths."""
    from hydroagent_hpc.sim.synth.basins import synthesize_basin

    paths = []
    for name, seed in names:
        path = folder / name
        if not (path / "manifest.json").exists():
            synthesize_basin(path, name=name, area_km2=80.0, window_days=10, warmup_days=3, seed=seed,
                             start="2021-07-01")
        paths.append(str(path.resolve()))
    return paths


def heldout_names(plan: BenchPlan) -> list[tuple[str, int]]:
    """The held-out basins: seeds 1001.. (never a teaching seed, see :func:`teach_names`)."""
    return [(f"syn_heldout{i + 1}", 1001 + i) for i in range(plan.heldout)]


def teach_names(plan: BenchPlan, data_seed: int) -> list[tuple[str, int]]:
    """The teaching basins of one data seed: seeds ``7 + 100 d ..`` (data seed 0 = the demo's 7..18)."""
    return [(f"syn_teach{i + 1}", 7 + 100 * data_seed + i) for i in range(plan.teach)]


def _campaign_env(plan: BenchPlan) -> dict[str, Any]:
    return {"preset": "paper", "protocol": "turns", **plan.env}


def _heldout(out: Path, plan: BenchPlan, folder: Path) -> dict[str, Any]:
    return {"basins": basin_set(folder / "basins", heldout_names(plan))}


def _references(out: Path, plan: BenchPlan, folder: Path, every_simulation: bool = False) -> dict[str, Any]:
    """The references under the policies' environment; ``every_simulation``: the optimisers (DDS,
    random) with tool calls enough for every simulation of the budget (an optimiser spends three
    calls per simulation: set, run, evaluate), the fair "at equal simulations" comparison."""

    env = _campaign_env(plan)
    refs: tuple[str, ...] = REFERENCES
    if every_simulation:
        env["max_turns"] = max(plan.max_turns, 3 * plan.max_simulations)
        refs = tuple(r for r in REFERENCES if r != "heuristic")
    spec = campaign_from_mapping({"name": "references", "basins": _read(out, "heldout")["basins"],
                                  "agents": [{"name": r, "kind": r} for r in refs],
                                  "seeds": list(plan.ref_seeds), "env": env})
    run_campaign(spec, folder / "eval.h5", progress=False)
    return {"store": str(folder / "eval.h5")}


def _blind(out: Path, plan: BenchPlan, folder: Path) -> dict[str, Any]:
    """What a policy that never reads its observations reaches on the held-out basins (bench/blind.py)."""
    table = nse_table(_read(out, "heldout")["basins"], "alpha0", observation=plan.env["observation"])
    return {**blind_ceiling(table), "param": "alpha0", "table": {str(k): v.tolist() for k, v in table.items()}}


def _base(out: Path, plan: BenchPlan, folder: Path, model_seed: int) -> dict[str, Any]:
    from hydroagent_hpc.train.tiny import build_tiny, save_tiny

    model = folder / "model"
    copied: dict[str, Any] = {}
    if not (model / "config.json").is_file():
        tmp = folder / ".model.tmp"
        if plan.copy_steps:
            from hydroagent_hpc.train.copying import pretrain_copy

            net, tokenizer = build_tiny(seed=model_seed)
            copied = pretrain_copy(net, tokenizer, plan.copy_steps, seed=model_seed).to_dict()
            save_tiny(tmp, net, tokenizer)
        else:
            save_tiny(tmp, seed=model_seed)
        os.replace(tmp, model)
    return {"model": str(model), **({"copy": copied} if copied else {})}


def _data(out: Path, plan: BenchPlan, folder: Path, data_seed: int) -> dict[str, Any]:
    from hydroagent_hpc.train.sft.data import build_sft_data

    basins = basin_set(folder / "basins", teach_names(plan, data_seed))
    teacher = campaign_from_mapping({
        "name": "teacher", "basins": basins, "seeds": list(plan.teacher_seeds), "env": _campaign_env(plan),
        "agents": [{"name": "heuristic", "kind": "heuristic", "partial": True, "digits": 3, "overshoot": 0.2,
                    **({"explore": plan.teacher_explore} if plan.teacher_explore else {}),
                    **({"explore_start": plan.teacher_explore_start} if plan.teacher_explore_start else {}),
                    **({"quote": True} if plan.teacher_quote else {})}]})
    run_campaign(teacher, folder / "teacher.h5", progress=False)
    report = build_sft_data([folder / "teacher.h5"], folder / "sft.h5", preset="released", tokenizer="tiny",
                            augment="none", max_tokens=32768, recovery=plan.recovery, recovery_seed=data_seed)
    return {"basins": basins, "sft_data": str(folder / "sft.h5"), "episodes": report.kept,
            "recovery_turns": report.recovery_turns}


def _sft(out: Path, plan: BenchPlan, folder: Path, data_seed: int, model_seed: int) -> dict[str, Any]:
    from hydroagent_hpc.train.sft.trainer import train_sft

    config = config_from_mapping({
        "data": _read(out, f"data{data_seed}")["sft_data"], "model": _read(out, f"base{model_seed}")["model"],
        "lr": plan.sft_lr, "weight_decay": 0.0, "warmup_steps": min(10, plan.sft_steps - 1),
        "max_steps": plan.sft_steps, "micro_batch_size": 1, "grad_accum": 1, "max_grad_norm": 1.0,
        "seed": model_seed, "dtype": "fp32", "fsdp": False, "save_every": 100, "log_every": 10,
        "bucket_by_length": True})
    summary = train_sft(config, folder / "run", resume=True)
    return {"model": str(folder / "run" / "final"), "wall_s": summary.get("wall_s"),
            "tokens_per_s": summary.get("tokens_per_s")}


def _grpo(out: Path, plan: BenchPlan, folder: Path, data_seed: int, model_seed: int, credit: str) -> dict[str, Any]:
    from hydroagent_hpc.train.grpo.trainer import train_grpo

    config = grpo_config_from_mapping({
        "preset": "paper", "model": _read(out, f"d{data_seed}m{model_seed}/sft")["model"],
        "basins": _read(out, f"data{data_seed}")["basins"],
        "validation_basins": _read(out, "heldout")["basins"][:plan.curve_basins],
        "validate_every": plan.validate_every, "group_size": plan.k, "prompts_per_step": plan.prompts_per_step,
        "max_steps": plan.grpo_steps, "lr": plan.grpo_lr, "advantage": credit, "temperature": plan.temperature,
        "baseline": plan.baseline, "adv_clip": plan.adv_clip, "pg_tokens": plan.pg_tokens,
        "entropy_coef": plan.entropy_coef,
        "max_new_tokens": plan.max_new_tokens, "seed": model_seed, "save_every": 2, "dtype": "fp32",
        "env": plan.env})
    summary = train_grpo(config, folder / "run", resume=True)
    if summary.get("stopped"):
        raise RuntimeError(f"{folder}: GRPO stopped ({summary['stopped']}); run the bench again to resume it")
    return {"model": str(folder / "run" / "final"), "wall_s": summary.get("wall_s"), "credit": credit}


#: Episodes decoded together in an evaluation. Small on a CPU: a batch decodes until its longest turn
#: ends and every row costs a step meanwhile, so big batches wait on their longest member. 96 greedy
#: episodes of one SFT policy on one thread (beside two bench units): 195 s at 12, 212 s at 16, 240 s
#: at 24, 345 s at 48, 409 s at 64 (the old default), 475 s at 96, with the same best NSE on every basin.
EVAL_BATCH = 12


def _evaluate(out: Path, plan: BenchPlan, folder: Path, name: str, model: Path | str) -> dict[str, Any]:
    """One greedy episode per held-out basin for the policy in ``model`` (agent ``name``), batched
    (:func:`hydroagent_hpc.train.evaluation.evaluate_policy`), under the references' environment."""
    from hydroagent_hpc.train.evaluation import evaluate_policy

    evaluate_policy(model, _read(out, "heldout")["basins"], folder / "eval.h5", agent=name, seeds=(0,),
                    preset="paper", env=_campaign_env(plan), max_new_tokens=plan.max_new_tokens,
                    generation_batch=EVAL_BATCH)
    return {"store": str(folder / "eval.h5")}


def _eval(out: Path, plan: BenchPlan, folder: Path, of: str) -> dict[str, Any]:
    name = "grpo" if "/grpo" in of else "sft" if "/sft" in of else "base"
    return _evaluate(out, plan, folder, name, _read(out, of)["model"])


_WORK: dict[str, Callable[..., dict[str, Any]]] = {"heldout": _heldout, "references": _references, "base": _base,
                                                   "data": _data, "sft": _sft, "grpo": _grpo, "eval": _eval,
                                                   "blind": _blind}


def _read(out: Path, key: str) -> dict[str, Any]:
    done = _done(out / key)
    if done is None:
        raise RuntimeError(f"{out / key}: not done yet (a unit read it before it finished)")
    return done


def _worker(threads: int) -> None:
    """A worker process's start, before anything imports torch: it reads its thread count once. On Linux
    the worker gets a SIGTERM when the bench process dies (``prctl(PR_SET_PDEATHSIG)``), so a bench
    killed mid-unit leaves no worker training on (and holding its run's store lock); the unit resumes
    from its checkpoint on the next run."""
    global _PARENT
    _PARENT = os.getppid()
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
        except OSError:
            log.debug("no prctl here: a killed bench's workers finish their unit")


#: The bench process that started this worker (set by :func:`_worker`).
_PARENT: int | None = None


def _orphan_exit(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a worker; if the bench died meanwhile, end the worker instead of returning.

    The trainers catch the SIGTERM that the bench's death sends (PR_SET_PDEATHSIG) to checkpoint
    and stop; the unit then ends normally or raises, and a pool worker would hand that to a parent
    that is gone and wait there for ever, asleep, holding its memory (seen: GRPO workers of a
    killed bench still there 50 minutes on). It ends without a word: its stderr is the dead bench's,
    which nobody may be reading, and a write there can block for ever."""
    try:
        return fn(*args)
    finally:
        if _bench_gone():
            os._exit(143)


def _bench_gone() -> bool:
    """Whether the bench that started this worker is gone or going: this worker has another parent, or
    (Linux) the bench's main thread is dead. The kernel sends the parent-death signal when the parent
    *thread* dies and first hands the worker to another thread of the same process, so a unit can stop
    and return while ``getppid()`` is still the bench's (seen in CI: a SIGKILLed bench, its threads
    dying one by one); the main thread's state (``/proc/PID/stat``: Z, X or no entry) says it then."""
    if _PARENT is None:
        return False
    if os.getppid() != _PARENT:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        with open(f"/proc/{_PARENT}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def _do(out: str, plan: dict[str, Any], unit: Unit) -> tuple[str, float]:
    """Run one unit in a worker process; returns its key and wall time."""
    return _orphan_exit(_unit, out, plan, unit)


def _unit(out: str, plan: dict[str, Any], unit: Unit) -> tuple[str, float]:
    t0 = time.perf_counter()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    root = Path(out)
    folder = root / unit.key
    folder.mkdir(parents=True, exist_ok=True)
    result = _WORK[unit.kind](root, BenchPlan(**_tuples(plan)), folder, *unit.args)
    _finish(folder, {**result, "unit_s": round(time.perf_counter() - t0, 1)})
    return unit.key, time.perf_counter() - t0


def _tuples(plan: dict[str, Any]) -> dict[str, Any]:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in plan.items()}


# --------------------------------------------------------------------------- the scheduler


def run(out: Path, plan: BenchPlan, jobs: int = 2, progress: bool = True,
        threads: int | None = None) -> dict[str, Any]:
    """Run every unit not done yet (``jobs`` at once, each on ``threads`` torch threads: by default the cores
    shared out), then :func:`summarise`; returns the summary."""
    out.mkdir(parents=True, exist_ok=True)
    stored = out / "plan.json"
    if stored.exists():
        old = json.loads(stored.read_text())
        # a key the stored plan lacks (added to the bench since) holds its default there
        known = {**BenchPlan().to_dict(), **old}
        changed = sorted(k for k in set(known) | set(plan.to_dict())
                         if k not in EXTENDABLE and known.get(k) != plan.to_dict().get(k))
        if changed:
            raise SystemExit(f"{stored}: this folder holds a bench with other settings ({', '.join(changed)}); "
                             "give another --out, or delete the folder to start again (more seeds or ablation "
                             "cells extend a bench: those may change)")
    stored.write_text(json.dumps(plan.to_dict(), indent=2) + "\n")
    todo = [u for u in units(plan) if _done(out / u.key) is None]
    threads = threads or max(1, (os.cpu_count() or 1) // max(1, jobs))
    log.info("learning bench in %s: %d units to run (%d done), %d at once on %d thread(s) each", out, len(todo),
             len(units(plan)) - len(todo), jobs, threads)
    bar = _progress(len(todo), progress)
    finished = {u.key for u in units(plan) if u not in todo}
    running: dict[Future[tuple[str, float]], Unit] = {}
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, jobs), mp_context=get_context("spawn"), initializer=_worker,
                             initargs=(threads,)) as pool:
        while todo or running:
            for u in [u for u in todo if set(u.needs) <= finished][:max(0, jobs - len(running))]:
                running[pool.submit(_do, str(out), plan.to_dict(), u)] = u
                todo.remove(u)
            if not running:
                raise RuntimeError(f"units wait on units that never finish: {[u.key for u in todo]}")
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in done:
                unit = running.pop(fut)
                key, wall = fut.result()  # a failed unit stops the bench; a rerun resumes it
                finished.add(key)
                log.info("%s done in %.0f s (%.0f s into the bench)", key, wall, time.perf_counter() - t0)
                bar(unit.key)
    return summarise(out, plan)


def _progress(total: int, show: bool) -> Callable[[str], None]:
    if not show or total == 0:
        return lambda key: None
    from tqdm import tqdm

    bar = tqdm(total=total, desc="learning bench", unit="unit")

    def tick(key: str) -> None:
        bar.set_postfix_str(key)
        bar.update(1)
        if bar.n >= total:
            bar.close()

    return tick


# --------------------------------------------------------------------------- scoring and the report


def score(store: Path | str, agent: str | None = None, seed: int | None = None) -> dict[str, float]:
    """One policy's numbers in one store (``agent``/``seed``: only those episodes): mean best NSE, an
    episode without a valid simulation scoring -1 (``unscored`` counts them), the share of assistant
    messages that were valid tool calls, simulations, parse failures and total reward per episode."""
    from hydroagent_hpc.store import read_episodes, read_turns

    eps = read_episodes(store)
    if agent is not None:
        eps = eps[eps.agent == agent]
    if seed is not None:
        eps = eps[eps.seed == seed]
    turns = read_turns(store)
    turns = turns[turns.episode_id.isin(set(eps.episode_id))]
    messages = int(turns.groupby("episode_id").message_index.nunique().sum())
    failed = int(turns[turns.kind == "parse_failure"].groupby("episode_id").message_index.nunique().sum())
    nse = eps.best_nse.astype(float).to_numpy()
    distinct = moves(store, episode_ids=list(eps.episode_id))["distinct_sequences"]
    reads = reading(store, episode_ids=list(eps.episode_id))["reads"]
    return {"best_nse": float(np.where(np.isfinite(nse), nse, UNSCORED).mean()) if nse.size else math.nan,
            "unscored": int((~np.isfinite(nse)).sum()),
            "valid_calls": 1.0 - failed / max(1, messages), "sims": float(eps.n_sims.mean()),
            "parse_failures": float(eps["counters.parse_failures"].mean()),
            "reward": float(eps.total_reward.mean()), "episodes": int(len(eps)),
            "distinct_moves": distinct / len(eps) if len(eps) else math.nan, "reads": reads}


#: The best NSE an episode without a valid simulation scores (the floor of the paper's clipped terminal term).
UNSCORED = -1.0
METRICS = ("best_nse", "valid_calls", "sims", "parse_failures", "reward", "distinct_moves", "reads")


def _row(name: str, samples: list[dict[str, float]], over: str) -> dict[str, Any]:
    row: dict[str, Any] = {"row": name, "n": len(samples), "over": over}
    for m in METRICS:
        vals = np.array([s[m] for s in samples], dtype=float)
        finite = vals[np.isfinite(vals)]
        row[m] = float(finite.mean()) if finite.size else math.nan
        row[f"{m}_sd"] = float(finite.std(ddof=1)) if finite.size > 1 else math.nan
    row["unscored"] = int(sum(s.get("unscored", 0) for s in samples))
    return row


def basin_gain(pairs: Sequence[tuple[Mapping[str, float], Mapping[str, float]]]) -> dict[str, float]:
    """The paired gain per held-out basin and how well the basin sample measures it.

    ``pairs``: per cell, the best NSE of each basin for SFT and for SFT+GRPO (an unscored episode as
    :data:`UNSCORED`). With :math:`g_b = \\frac1C\\sum_c (N^{GRPO}_{b,c} - N^{SFT}_{b,c})` over the
    :math:`C` cells, on the :math:`B` basins every cell played: ``mean`` :math:`= \\bar g` (the goal's
    paired gain) and ``se`` :math:`= s_g / \\sqrt B`, its standard error over basins (the sample
    standard deviation :math:`s_g` of the :math:`g_b`). The seed spread says how much the recipe
    varies with its seeds; ``se`` how much the gain would move on another draw of as many held-out
    basins from the same generator (docs/learning.md: the blind move GRPO learnt is worth +0.017 on one
    draw of 48 held-out basins, +0.075 on 87 others).
    """
    if not pairs:
        return {"mean": math.nan, "se": math.nan, "basins": 0}
    basins = sorted(set.intersection(*(set(a) & set(b) for a, b in pairs)))
    g = np.array([np.mean([b[k] - a[k] for a, b in pairs]) for k in basins], dtype=float)
    return {"mean": float(g.mean()) if g.size else math.nan,
            "se": float(g.std(ddof=1) / math.sqrt(g.size)) if g.size > 1 else math.nan, "basins": int(g.size)}


def per_basin(store: Path | str) -> dict[str, float]:
    """Best NSE of each basin's episode in an evaluation store (one episode per basin; unscored: -1)."""
    from hydroagent_hpc.store import read_episodes

    eps = read_episodes(store)
    nse = eps.best_nse.astype(float).to_numpy()
    return dict(zip(eps.basin_id.astype(str), np.where(np.isfinite(nse), nse, UNSCORED).tolist()))


def summarise(out: Path, plan: BenchPlan) -> dict[str, Any]:
    """Score every finished unit into ``DIR/result.json``, ``DIR/tables/*.csv`` and ``DIR/report.md``."""
    import pandas as pd

    from hydroagent_hpc.store import read_episodes

    rows: list[dict[str, Any]] = []
    cells = plan.cells()

    def have(key: str) -> bool:
        return _done(out / key) is not None

    base = [score(out / f"base{m}" / "eval" / "eval.h5") for m in plan.model_seeds if have(f"base{m}/eval")]
    sft = {c: score(out / f"d{c[0]}m{c[1]}" / "eval-sft" / "eval.h5") for c in cells
           if have(f"d{c[0]}m{c[1]}/eval-sft")}
    grpo = {credit: {c: score(out / f"d{c[0]}m{c[1]}" / f"eval-grpo-{credit}" / "eval.h5") for c in cells
                     if have(f"d{c[0]}m{c[1]}/eval-grpo-{credit}")} for credit in CREDITS}
    if base:
        rows.append(_row("Base", base, "model seeds"))
    if sft:
        rows.append(_row("SFT", list(sft.values()), "model x data seeds"))
    if grpo["episode"]:
        rows.append(_row("SFT+GRPO", list(grpo["episode"].values()), "model x data seeds"))
    if have("references"):
        store = out / "references" / "eval.h5"
        eps = read_episodes(store)
        for ref in REFERENCES:
            per_seed = [score(store, ref, seed) for seed in plan.ref_seeds
                        if ((eps.agent == ref) & (eps.seed == seed)).any()]
            if per_seed:
                rows.append(_row({"dds": "DDS"}.get(ref, ref), per_seed, "seeds"))
    if have("references-sims"):
        store = out / "references-sims" / "eval.h5"
        for ref in REFERENCES[1:]:
            rows.append(_row(f"{ {'dds': 'DDS'}.get(ref, ref)} (every simulation)",
                             [score(store, ref, seed) for seed in plan.ref_seeds], "seeds"))
    if have("blind"):
        b = _done(out / "blind") or {}
        grid = len(b.get("table") or {})
        for name, key in (("blind: best first guess", "best_single"), ("blind: best fixed pair", "best_pair")):
            value = b[key]
            shown = ", ".join(f"{v:g}" for v in value) if isinstance(value, list) else f"{value:g}"
            rows.append({"row": f"{name} (alpha0 {shown})", "n": grid, "over": "alpha0 values tried",
                         **dict.fromkeys(METRICS, math.nan), **{f"{m}_sd": math.nan for m in METRICS},
                         "best_nse": b[f"{key}_nse"], "unscored": 0})
    # the ablation: the same cells for every credit mode, beside their own SFT
    ablation = []
    common = [c for c in cells[:plan.ablation] if all(c in grpo[cr] for cr in CREDITS) and c in sft]
    if common:
        ablation.append(_row("SFT (the same cells)", [sft[c] for c in common], "cells"))
        for credit in CREDITS:
            ablation.append(_row(f"GRPO {credit}", [grpo[credit][c] for c in common], "cells"))
    paired = [(sft[c]["best_nse"], grpo["episode"][c]["best_nse"]) for c in cells if c in sft and c in grpo["episode"]]
    by_basin = basin_gain([(per_basin(out / f"d{d}m{m}" / "eval-sft" / "eval.h5"),
                            per_basin(out / f"d{d}m{m}" / "eval-grpo-episode" / "eval.h5"))
                           for d, m in cells if (d, m) in sft and (d, m) in grpo["episode"]])
    curves, signal = _curves(out, plan)
    goals = _goals(rows, paired, by_basin)
    tables = out / "tables"
    tables.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(tables / "rows.csv", index=False, lineterminator="\n")
    pd.DataFrame(ablation).to_csv(tables / "ablation.csv", index=False, lineterminator="\n")
    curves.to_csv(tables / "curves.csv", index=False, lineterminator="\n")
    signal.to_csv(tables / "signal.csv", index=False, lineterminator="\n")
    if not curves.empty:
        _curve_figure(curves, out / "figures" / "curves.png")
    walls = {u.key: (_done(out / u.key) or {}).get("unit_s") for u in units(plan)}
    result = {"plan": plan.to_dict(), "rows": rows, "ablation": ablation, "goals": goals,
              "paired_nse": paired, "basin_gain": by_basin, "unit_s": walls,
              "units_done": sum(1 for u in units(plan) if have(u.key)), "units": len(units(plan))}
    (out / "result.json").write_text(json.dumps(result, indent=2, default=_json_nan) + "\n")
    (out / "report.md").write_text(report_markdown(result, curves, signal))
    return result


def _json_nan(v: Any) -> Any:
    return None


def _curves(out: Path, plan: BenchPlan) -> tuple[Any, Any]:
    """Held-out (``grpo-val``) reward and valid-call share per validated step, and the per-step learning
    signal, per cell of the paper's credit mode; then mean and spread over cells per step."""
    import pandas as pd

    from hydroagent_hpc.report.training import read_metrics
    from hydroagent_hpc.store import read_episodes, read_turns

    val_rows, sig_rows = [], []
    for d, m in plan.cells():
        run = out / f"d{d}m{m}" / "grpo-episode" / "run"
        if not (run / "rollouts.h5").exists():
            continue
        eps = read_episodes(run / "rollouts.h5")
        eps = eps[eps.agent == "grpo-val"]
        turns = read_turns(run / "rollouts.h5")
        for step, group in eps.groupby(eps.episode_id.str.extract(r"grpo-val-s(\d+)-")[0].astype(int)):
            t = turns[turns.episode_id.isin(set(group.episode_id))]
            messages = t.groupby("episode_id").message_index.nunique().sum()
            failed = t[t.kind == "parse_failure"].groupby("episode_id").message_index.nunique().sum()
            nse = group.best_nse.astype(float).to_numpy()
            val_rows.append({"cell": f"d{d}m{m}", "step": int(step), "reward": float(group.total_reward.mean()),
                             "valid_calls": float(1 - failed / max(1, messages)),
                             "best_nse": float(np.mean(np.where(np.isfinite(nse), nse, UNSCORED)))})
        metrics = read_metrics(run / "metrics.csv")
        if metrics is not None:
            for r in metrics.to_dict("records"):
                sig_rows.append({"cell": f"d{d}m{m}", **r})
    curves = pd.DataFrame(val_rows)
    if not curves.empty:
        curves = (curves.groupby("step").agg(reward=("reward", "mean"), reward_sd=("reward", "std"),
                                             valid_calls=("valid_calls", "mean"),
                                             valid_calls_sd=("valid_calls", "std"),
                                             best_nse=("best_nse", "mean"), best_nse_sd=("best_nse", "std"),
                                             cells=("cell", "nunique")).reset_index())
    signal = pd.DataFrame(sig_rows)
    keep = [c for c in ("reward_mean", "best_nse_mean", "parse_failures_mean", "degenerate_share", "adv_p10",
                        "adv_p50", "adv_p90", "tokens_adv_pos", "tokens_adv_neg", "tokens_adv_zero", "kl", "entropy",
                        "grad_norm", "clip_fraction", "step_s") if c in signal.columns]
    if not signal.empty:
        signal = signal.groupby("step")[keep].mean().reset_index()
    return curves, signal


def _curve_figure(curves: Any, path: Path) -> None:
    from hydroagent_hpc.report.figures import new_figure, save_figure, style

    with style():
        fig = new_figure(10.0, 3.2)
        axes = fig.subplots(1, 3)
        for ax, col, title in zip(axes, ("reward", "valid_calls", "best_nse"),
                                  ("held-out reward per episode", "held-out valid-call share",
                                   "held-out best NSE")):
            mean, sd = curves[col].to_numpy(float), np.nan_to_num(curves[f"{col}_sd"].to_numpy(float))
            ax.plot(curves["step"], mean, marker="o", color="tab:blue")
            ax.fill_between(curves["step"], mean - sd, mean + sd, color="tab:blue", alpha=0.2, linewidth=0)
            ax.set(title=title, xlabel="GRPO step")
        save_figure(fig, path)


def _goals(rows: list[dict[str, Any]], paired: list[tuple[float, float]],
           by_basin: Mapping[str, float] | None = None) -> list[dict[str, Any]]:
    by = {r["row"]: r for r in rows}
    goals: list[dict[str, Any]] = []
    if "SFT" in by and "SFT+GRPO" in by:
        diffs = np.array([g - s for s, g in paired], dtype=float)
        spread = max(by["SFT"]["best_nse_sd"] if np.isfinite(by["SFT"]["best_nse_sd"]) else 0.0,
                     by["SFT+GRPO"]["best_nse_sd"] if np.isfinite(by["SFT+GRPO"]["best_nse_sd"]) else 0.0)
        gain = float(diffs.mean()) if diffs.size else math.nan
        goals.append({"goal": "SFT+GRPO above SFT on held-out best NSE by more than the seed spread",
                      "measured": f"paired gain {gain:+.3f} over {diffs.size} cells (wins {int((diffs > 0).sum())}, "
                                  f"losses {int((diffs < 0).sum())}); seed spread {spread:.3f}"
                                  + (f"; standard error over the {by_basin['basins']} held-out basins "
                                     f"{by_basin['se']:.3f}" if by_basin and np.isfinite(by_basin["se"]) else ""),
                      "met": bool(np.isfinite(gain) and gain > spread)})
    for ref, text in (("random (every simulation)" if "random (every simulation)" in by else "random",
                       "SFT+GRPO above random search at equal (or more) simulations"),
                      ("heuristic", "stretch: SFT+GRPO at or above its teacher")):
        if "SFT+GRPO" in by and ref in by:
            g, r = by["SFT+GRPO"], by[ref]
            goals.append({"goal": text, "measured": f"{g['best_nse']:.3f} vs {r['best_nse']:.3f} "
                                                    f"({g['sims']:.1f} vs {r['sims']:.1f} simulations)",
                          "met": bool(g["best_nse"] > r["best_nse"] if ref.startswith("random")
                                      else g["best_nse"] >= r["best_nse"])})
    return goals


def _fmt(v: Any, spec: str) -> str:
    return "n/a" if v is None or not np.isfinite(v) else format(v, spec)


def _table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| row | n | best NSE | valid calls | sims | parse failures | reward | distinct moves | reads |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = []
        for m, spec in (("best_nse", ".3f"), ("valid_calls", ".0%"), ("sims", ".1f"), ("parse_failures", ".2f"),
                        ("reward", ".2f"), ("distinct_moves", ".0%"), ("reads", ".2f")):
            cell = _fmt(r.get(m, math.nan), spec)
            if np.isfinite(r.get(f"{m}_sd", math.nan)):
                cell += f" ± {_fmt(r[f'{m}_sd'], spec)}"
            cells.append(cell)
        lines.append(f"| {r['row']} | {r['n']} {r['over']} | " + " | ".join(cells) + " |")
    return lines


def report_markdown(result: Mapping[str, Any], curves: Any, signal: Any) -> str:
    plan = result["plan"]
    lines = ["# Learning bench (issue 30)", "",
             f"{result['units_done']} of {result['units']} units done. Model seeds {plan['model_seeds']}, data seeds "
             f"{plan['data_seeds']}, {plan['heldout']} held-out basins, {plan['max_turns']} tool calls and "
             f"{plan['max_simulations']} simulations per episode for every row; SFT {plan['sft_steps']} steps; GRPO "
             f"{plan['grpo_steps']} steps, K={plan['k']}, {plan['prompts_per_step']} prompts per step, lr "
             f"{plan['grpo_lr']:g}, temperature {plan['temperature']:g}."
             + (" The teacher quotes the values it acts on (`--teacher-quote`)." if plan.get("teacher_quote") else "")
             + (f" Each Base was copy-pretrained for {plan['copy_steps']} steps (`--copy-steps`)."
                if plan.get("copy_steps") else "")
             + " Mean ± sample standard deviation over seeds "
             "(trained rows: over model x data seeds; Base: over model seeds; references: over their seeds). "
             "An episode without a valid simulation counts as best NSE -1. Distinct moves: the distinct sequences "
             "of evaluated parameter sets over the episodes (1 in 12 on 12 basins: the same moves everywhere, "
             "the policy did not read its observations); the blind rows: the best that a policy making the same "
             "moves on every basin reaches with one or two values of alpha0 (`python -m hydroagent_hpc.bench.blind`). "
             "Reads: whether the second move follows the first evaluation's peak ratio as the teacher's rule does "
             "(raise alpha0 when the peak is over 10 % too high, lower it when 10 % too low), as a balanced "
             "accuracy: 0.5 or less for a policy making the same move everywhere, 1 for one that follows the rule "
             "(`bench.blind.reading`).",
             "", "## Rows", ""]
    lines += _table(list(result["rows"]))
    lines += ["", "## Goals", "", "| goal | measured | met |", "|---|---|---|"]
    lines += [f"| {g['goal']} | {g['measured']} | {'yes' if g['met'] else 'no'} |" for g in result["goals"]]
    if result["ablation"]:
        lines += ["", "## Ablation: credit assignment (same cells, same SFT start, same budget)", ""]
        lines += _table(list(result["ablation"]))
    if not curves.empty:
        lines += ["", "## Held-out curves (the paper's credit mode)", "", "![curves](figures/curves.png)", "",
                  "| step | reward | valid calls | best NSE | cells |", "|---|---|---|---|---|"]
        for r in curves.to_dict("records"):
            lines.append(f"| {r['step']} | {_fmt(r['reward'], '.3f')} | {_fmt(r['valid_calls'], '.0%')} | "
                         f"{_fmt(r['best_nse'], '.3f')} | {r['cells']} |")
    if not signal.empty:
        cols = [c for c in signal.columns if c != "step"]
        lines += ["", "## Learning signal per step (mean over cells; `tables/signal.csv`)", "",
                  "| step | " + " | ".join(cols) + " |", "|" + "---|" * (len(cols) + 1)]
        for r in signal.to_dict("records"):
            lines.append(f"| {int(r['step'])} | " + " | ".join(_fmt(r[c], ".3g") for c in cols) + " |")
    total = sum(v for v in result["unit_s"].values() if v)
    lines += ["", f"Work: {total:.0f} s of unit time in all (`--jobs` units run at once, so the wall time is "
              "shorter); `unit_s` in result.json per unit.", ""]
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m hydroagent_hpc.bench.learning",
                                 description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("results/learning"))
    ap.add_argument("--jobs", type=int, default=2, help="units at once (default 2: one per core here)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads per unit (default: the cores / --jobs; 1 when two benches share the cores)")
    ap.add_argument("--quick", action="store_true", help="toy sizes: the real code path in minutes (tests)")
    ap.add_argument("--report-only", action="store_true", help="score what is done; run nothing")
    default = BenchPlan()
    for f in dataclasses.fields(BenchPlan):
        value = getattr(default, f.name)
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, tuple):
            ap.add_argument(flag, type=int, nargs="+", default=None, help=f"default {' '.join(map(str, value))}")
        elif isinstance(value, bool):
            ap.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=f"default {value}")
        else:
            ap.add_argument(flag, type=type(value), default=None, help=f"default {value}")
    return ap


def plan_from(args: argparse.Namespace) -> BenchPlan:
    """The plan the command line asks for: ``--quick`` or the defaults, with every given option over it."""
    overrides: dict[str, Any] = {f.name: tuple(v) if isinstance(v, list) else v for f in dataclasses.fields(BenchPlan)
                                 if (v := getattr(args, f.name)) is not None}
    return dataclasses.replace(QUICK if args.quick else BenchPlan(), **overrides)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    plan = plan_from(args)
    result = (summarise(args.out, plan) if args.report_only
              else run(args.out, plan, jobs=args.jobs, threads=args.threads))
    print((args.out / "report.md").read_text())
    del result
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
