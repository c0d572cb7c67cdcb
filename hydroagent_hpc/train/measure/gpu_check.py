"""The check to run first on a GPU: ``python -m hydroagent_hpc.bench.gpu_check --out VERDICT.json``.

``make gpu-check`` (or ``sbatch slurm/gpu-check.sbatch``) on one GPU, in under 8 minutes, answers
"will the paper recipe fit, train and learn here?" before an allocation is spent on it
(``../shared/docs/gpu-audit/README.md`` lists what would otherwise go wrong on first contact):

=================  =================================================================================
check              what it does, and what fails it
=================  =================================================================================
``environment``    torch / transformers / accelerate versions, the device, its memory, bf16 support
``memory_plan``    :mod:`hydroagent_hpc.train.memory_plan` for the paper's SFT config
                   (``data/train/sft-qwen3-4b.yaml``, 4 GPUs of this kind) and GRPO configs
                   (``grpo-qwen3-4b.yaml``: 3 trainers + 1 engine GPU; ``grpo-qwen3-4b-1gpu.yaml``:
                   one GPU) with the published Qwen3-4B shape; fails when one does not fit
``sft_step``       timed SFT steps of a Qwen3-4B-shaped model with random weights: fp32 master
                   weights, bf16 autocast, activation checkpointing, AdamW; tokens/s, MFU against
                   the device's dense BF16 peak (torchtitan reports 33-39 % for Llama-3.1-8B FSDP
                   on H100), peak memory against the plan's for the same shape and length
``grpo_step``      one GRPO optimizer step of the same model with a bf16 reference (KL 0.2,
                   entropy 0.01, chunked fp32 log-probs): seconds per trained token, peak memory
``tiny_grpo``      the trainer itself (:func:`~hydroagent_hpc.train.grpo.trainer.train_grpo`, the tiny
                   Qwen3, a synthetic basin, ``dtype: bf16``, lr 1e-6): more than 90 % of the
                   policy's entries move in one step (F1), and the update after real rollouts
                   recomputes every checkpointed layer (F2)
``engine``         where SGLang or vLLM is installed: the tiny model served by a launched engine,
                   one greedy turn compared with the trainer's own; skipped otherwise
=================  =================================================================================

Each check is ``passed``, ``failed`` (with the reason: an assertion, an out-of-memory, an error) or
``skipped`` (with the reason); the verdict is ``failed`` when any check failed. The JSON holds every
check's figures and seconds, the git commit and the library versions. Exit status 0 unless a check
failed (1); 2 when asked for a GPU run without CUDA.

``--cpu`` is the dry run of the same code on the CPU at small sizes (a reduced Qwen3 shape, 128-token
sequences, the plan against a nominal H100-80GB): it checks the check, in ``make test``; its figures
are not GPU figures.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import logging
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hydroagent_hpc.agents.llm.hf_local import HFLocalPolicy
from hydroagent_hpc.provenance import git_commit
from hydroagent_hpc.sim import open_simulator
from hydroagent_hpc.sim.basin import load_basin
from hydroagent_hpc.train.grpo.config import grpo_config_from_mapping, load_grpo_config
from hydroagent_hpc.train.memory_plan import QWEN3_4B_INSTRUCT_2507, gpu_named, plan_grpo, plan_sft
from hydroagent_hpc.train.sft.config import config_from_mapping, load_sft_config

__all__ = ["CheckResult", "run_checks", "main", "PAPER_CONFIGS"]

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[3]
#: The paper configs the plan is made for: (file, kind, training GPUs, the GPU the file names).
PAPER_CONFIGS = (("data/train/sft-qwen3-4b.yaml", "sft", 4, "H100-80GB"),
                 ("data/train/grpo-qwen3-4b.yaml", "grpo", 3, "H100-80GB"),
                 ("data/train/grpo-released.yaml", "grpo", 3, "H100-80GB"),
                 ("data/train/grpo-qwen3-4b-1gpu.yaml", "grpo", 1, "H200"))
#: The reduced Qwen3 shape of the ``--cpu`` dry run (the tiny model's width, a 4B model's proportions).
CPU_SHAPE = {"num_hidden_layers": 2, "hidden_size": 256, "intermediate_size": 768, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 4096}


class Skip(Exception):
    """A check that cannot run here (the reason is its message)."""


@dataclass
class CheckResult:
    name: str
    status: str  # passed | failed | skipped
    reason: str = ""
    seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)


def _run(name: str, fn: Callable[[], dict[str, Any]]) -> CheckResult:
    t0 = time.perf_counter()
    try:
        details = fn()
        status, reason = "passed", ""
    except Skip as exc:
        details, status, reason = {}, "skipped", str(exc)
    except AssertionError as exc:
        details, status, reason = {}, "failed", str(exc) or "assertion failed"
    except torch.cuda.OutOfMemoryError as exc:
        details, status, reason = {}, "failed", f"CUDA out of memory: {str(exc).splitlines()[0]}"
    except Exception as exc:  # every failure is a verdict; the traceback goes to the log
        log.debug("%s", traceback.format_exc())
        details, status, reason = {}, "failed", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    finally:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    result = CheckResult(name, status, reason, time.perf_counter() - t0, details)
    log.info("%-12s %-7s %5.1f s %s", name, status, result.seconds, reason)
    return result


# ---------------------------------------------------------------------------------------------
# The checks


def check_environment(device: torch.device) -> dict[str, Any]:
    import accelerate
    import transformers

    out: dict[str, Any] = {"torch": torch.__version__, "transformers": transformers.__version__,
                           "accelerate": accelerate.__version__, "device": str(device),
                           "cuda": torch.version.cuda, "cpu_threads": torch.get_num_threads()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        free, total = torch.cuda.mem_get_info(device)
        out.update(name=props.name, capability=f"{props.major}.{props.minor}", total_gib=total / 2**30,
                   free_gib=free / 2**30, devices=torch.cuda.device_count(), bf16=torch.cuda.is_bf16_supported())
        assert out["bf16"], f"{props.name} does not support bf16: the recipe computes in bf16"
    return out


def _gpu_for(device: torch.device, nominal: str) -> tuple[Any, int | None]:
    """The plan's GPU: the table's entry for this device's name, else its total memory; ``nominal``
    on the CPU."""

    if device.type != "cuda":
        return nominal, None
    name = torch.cuda.get_device_name(device)
    try:
        return gpu_named(name), None
    except Exception:  # a GPU not in the table: planned against its own memory
        return None, int(torch.cuda.mem_get_info(device)[1])


def check_memory_plan(device: torch.device, nominal: str) -> dict[str, Any]:
    """Each paper config planned on this GPU. It fails when a config does not fit here although this
    GPU has at least the memory of the one the config names (the plan or the config is wrong); a
    config for a larger GPU that does not fit here is reported, not failed."""

    gpu, free = _gpu_for(device, nominal)
    shape = QWEN3_4B_INSTRUCT_2507
    plans: dict[str, Any] = {}
    misfits = []
    for rel, kind, world, named in PAPER_CONFIGS:
        path = ROOT / rel
        if kind == "sft":
            plan = plan_sft(load_sft_config(path), world=world, gpu=gpu, free_bytes=free, shape=shape, suggest=False)
        else:
            plan = plan_grpo(load_grpo_config(path, world_size=world), world=world, gpu=gpu, free_bytes=free,
                             shape=shape, suggest=False)
        big_enough = plan.capacity >= gpu_named(named).usable
        plans[rel] = {"world": world, "names": named, "peak_gib": plan.peak / 2**30,
                      "capacity_gib": plan.capacity / 2**30, "fits_here": plan.fits, "largest": plan.largest.name}
        if not plan.fits and big_enough:
            misfits.append(f"{rel} on {world} x {plan.device}: peak {plan.peak / 2**30:.1f} GiB of "
                           f"{plan.capacity / 2**30:.1f} (largest: {plan.largest.name})")
    assert not misfits, "; ".join(misfits)
    return {"plans": plans}


def _qwen3(device: torch.device, cpu: bool, layers: int | None = None) -> Any:
    from hydroagent_hpc.train.measure.throughput import build_random_qwen3, qwen3_config

    overrides = dict(CPU_SHAPE) if cpu else {}
    if layers is not None:
        overrides["num_hidden_layers"] = layers
    return build_random_qwen3(qwen3_config(**overrides), str(device), torch.float32)


def _fitting_size(kind: str, device: torch.device, nominal: str, seq_len: int | None) -> tuple[int, int | None, float]:
    """``(tokens, layers, planned MiB)`` of the largest step of a Qwen3-4B shape that the memory plan fits
    on this GPU in one process: 4,096 tokens, else 2,048 or 1,024, else fewer layers (None: all 36).
    On the CPU: the dry run's size, planned for the nominal GPU."""
    import dataclasses


    gpu, free = _gpu_for(device, nominal)

    def planned(tokens: int, layers: int | None) -> tuple[bool, float]:
        shape = QWEN3_4B_INSTRUCT_2507 if layers is None else dataclasses.replace(QWEN3_4B_INSTRUCT_2507,
                                                                                   layers=layers)
        if kind == "sft":
            config: Any = config_from_mapping({"data": "-", "max_steps": 1, "max_seq_len": tokens, "dtype": "bf16",
                                               "activation_checkpointing": True, "fsdp": False})
            phase = plan_sft(config, world=1, gpu=gpu, free_bytes=free, shape=shape, suggest=False).training
        else:
            config = grpo_config_from_mapping({"basins": ["-"], "max_context_tokens": tokens, "dtype": "bf16",
                                               "activation_checkpointing": True, "prompts_per_step": 1,
                                               "group_size": 1})
            phase = plan_grpo(config, world=1, gpu=gpu, free_bytes=free, shape=shape, suggest=False).training
        return phase.fits, phase.peak / 2**20

    if device.type != "cuda":
        return seq_len or 128, None, float("nan")
    for tokens in ((seq_len,) if seq_len else (4096, 2048, 1024)):
        ok, mib = planned(tokens, None)
        if ok:
            return tokens, None, mib
    tokens = seq_len or 1024
    for layers in range(35, 0, -1):
        ok, mib = planned(tokens, layers)
        if ok:
            return tokens, layers, mib
    raise Skip(f"not even one Qwen3-4B layer fits this GPU's free memory for a {kind} step")


def check_sft_step(device: torch.device, cpu: bool, seconds: float, seq_len: int | None,
                   nominal: str) -> dict[str, Any]:
    from hydroagent_hpc.train.measure.throughput import measure_sft_steps

    tokens, layers, planned = _fitting_size("sft", device, nominal, seq_len)
    model = _qwen3(device, cpu, layers)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    r = measure_sft_steps(model, seq_len=tokens, batch=1, seconds=None if cpu else seconds,
                          steps=2 if cpu else None, warmup_steps=1, activation_checkpointing=True,
                          compute_dtype=torch.bfloat16)
    out = r.as_dict()
    out.update(layers=int(model.config.num_hidden_layers), planned_peak_mb=planned)
    if device.type == "cuda":
        out["peak_over_plan"] = out["peak_memory_mb"] / planned
    assert np.isfinite(out["final_loss"]), f"the loss is {out['final_loss']}"
    assert all(p.dtype == torch.float32 for p in model.parameters()), "the master weights are not fp32"
    return out


def check_grpo_step(device: torch.device, cpu: bool, seq_len: int | None, nominal: str) -> dict[str, Any]:
    import copy

    from hydroagent_hpc.train.measure.grpo_throughput import measure_decode, measure_train

    seq_len, layers, planned = _fitting_size("grpo", device, nominal, seq_len)
    model = _qwen3(device, cpu, layers)
    reference = copy.deepcopy(model).to(torch.bfloat16).eval()
    for p in reference.parameters():
        p.requires_grad_(False)
    from hydroagent_hpc.train.grpo.trainer import enable_checkpointing

    enable_checkpointing(model)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        s_per_token = measure_train(model, reference, seq_len=seq_len, repeats=1 if cpu else 2)
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    # rollout decode through the in-process sampler, under autocast as the trainer generates
    batch, ctx = (2, 64) if cpu else (8, 1500)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        decode_s = measure_decode(model, batch=batch, ctx=ctx, new_tokens=4 if cpu else 32, repeats=1)
    return {"seq_len": seq_len, "layers": int(model.config.num_hidden_layers), "train_s_per_token": s_per_token,
            "train_tokens_per_s": 1.0 / s_per_token, "peak_memory_mb": peak, "planned_peak_mb": planned,
            "decode_batch": batch, "decode_context": ctx, "decode_s_per_step": decode_s,
            "params": sum(p.numel() for p in model.parameters())}


def _basin(root: Path) -> str:
    from hydroagent_hpc.sim.synth.basins import synthesize_basin

    control = synthesize_basin(root / "syn_check", name="syn_check", area_km2=80.0, window_days=5, warmup_days=2,
                               seed=41, start="2021-07-01")
    return str(control.parent)


def check_tiny_grpo(device: torch.device, workdir: Path) -> dict[str, Any]:
    """F1 and F2 on this device with the trainer's own code (as ``tests/test_gpu_first_contact.py``)."""
    from safetensors.torch import load_file

    from hydroagent_hpc.train.generation.rollout import RolloutSpec
    from hydroagent_hpc.train.grpo.trainer import (
        Ranks,
        enable_checkpointing,
        optimise,
        play_episodes,
        train_grpo,
        training_batch,
    )
    from hydroagent_hpc.train.tiny import build_tiny

    d = _basin(workdir)
    common = {"basins": [d], "group_size": 2, "prompts_per_step": 1, "max_new_tokens": 8, "generation_batch": 2,
              "env": {"max_turns": 1}, "seed": 0}
    # F1: one step of the whole trainer at lr 1e-6 in bf16 moves nearly every weight
    config = grpo_config_from_mapping({**common, "max_steps": 1, "lr": 1e-6, "dtype": "bf16"})
    summary = train_grpo(config, workdir / "run", resume=False)
    after = load_file(str(workdir / "run" / "final" / "model.safetensors"))
    before = build_tiny(seed=0)[0].state_dict()
    moved = sum(int((after[k] != before[k].to(after[k].dtype)).sum()) for k in after)
    total = sum(t.numel() for t in after.values())
    assert moved / total > 0.9, f"F1: only {moved / total:.1%} of the policy's entries moved at lr 1e-6"
    # F2: the update after real rollouts recomputes every checkpointed layer
    config = grpo_config_from_mapping({**common, "kl_coef": 0.0, "activation_checkpointing": True})
    model, tok = build_tiny(seed=0)
    model = model.to(device)  # type: ignore[arg-type]
    enable_checkpointing(model)
    model.train()
    specs = [RolloutSpec(0, k, d, k, f"check{k}") for k in range(2)]
    rollouts, _ = play_episodes(config, model, tok, specs, {d: open_simulator(f"{d}/control.txt")}, {d: load_basin(d)})
    calls = [0]
    hooks = [layer.mlp.register_forward_pre_hook(lambda m, a: calls.__setitem__(0, calls[0] + 1))
             for layer in model.model.layers]
    batch = training_batch(rollouts, {i: np.array([1.0 if i == 0 else -1.0] * len(r.spans))
                                       for i, r in enumerate(rollouts)})
    optimise(config, model, torch.optim.AdamW(model.parameters(), lr=1e-6), batch, 0,
              Ranks.one_process(model, device=device))
    for h in hooks:
        h.remove()
    want = 2 * len(model.model.layers) * len(batch)
    assert calls[0] == want, f"F2: {calls[0]} layer passes in the update, {want} with every layer recomputed"
    return {"device": summary.get("device", str(device)), "entries_moved": moved / total,
            "layer_passes": calls[0], "layer_passes_expected": want}


def check_engine(device: torch.device, workdir: Path) -> dict[str, Any]:
    """The tiny model served by a launched SGLang or vLLM, one greedy turn against the trainer's own."""
    api = next((name for name, module in (("sglang", "sglang"), ("vllm", "vllm"))
                if importlib.util.find_spec(module) is not None), None)
    if api is None:
        raise Skip("neither sglang nor vllm is installed in this environment (pip install the pinned engine "
                   "to check the request round trip)")
    if device.type != "cuda":
        raise Skip(f"{api} needs a GPU")
    from hydroagent_hpc.train.generation.engine import EngineSampler, EngineSettings
    from hydroagent_hpc.train.generation.engine_process import EngineWeights
    from hydroagent_hpc.train.generation.sampler import BatchedSampler, Sampling
    from hydroagent_hpc.train.tiny import build_tiny

    port = 30000 + os.getpid() % 1000
    launch = ([sys.executable, "-m", "sglang.launch_server", "--model-path", "{model}", "--port", str(port),
               "--mem-fraction-static", "0.3"] if api == "sglang" else
              [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", "{model}", "--port", str(port),
               "--gpu-memory-utilization", "0.3", "--served-model-name", "policy"])
    settings = EngineSettings(api=api, url=f"http://127.0.0.1:{port}", launch=tuple(launch),
                              gpus=(str(torch.cuda.current_device()),), start_timeout_s=240.0,
                              model_name="policy" if api == "vllm" else None)
    model, tok = build_tiny(seed=0)
    probe = HFLocalPolicy(model, tok)
    sampling = Sampling(greedy=True, max_new_tokens=16)
    rendered: Any = tok.apply_chat_template([{"role": "user", "content": "Calibrate the basin."}], tokenize=True,
                                            add_generation_prompt=True)
    prompt = [int(i) for i in (rendered["input_ids"] if isinstance(rendered, dict) else rendered)]
    model = model.to(device)  # type: ignore[arg-type]
    local = BatchedSampler(model, probe.stop_ids, probe.pad_id, sampling).sample([prompt], [0])[0]
    with EngineWeights(settings, workdir, context_tokens=2048) as engine:
        t0 = time.perf_counter()
        engine.push(model, tok, 0)
        start_s = time.perf_counter() - t0
        remote = EngineSampler(engine.api, probe.stop_ids, sampling).sample([prompt], [0])[0]
    same = list(remote.ids) == list(local.ids)
    assert same, f"{api}: greedy ids {list(remote.ids)[:8]}... differ from the trainer's {list(local.ids)[:8]}..."
    return {"api": api, "start_s": start_s, "tokens": len(remote.ids),
            "logprob_max_diff": float(np.max(np.abs(np.subtract(remote.logprobs, local.logprobs))))
            if len(remote.logprobs) == len(local.logprobs) and len(local.logprobs) else None}


# ---------------------------------------------------------------------------------------------
# The run


def run_checks(*, cpu: bool, seconds: float = 45.0, seq_len: int | None = None,
               nominal_gpu: str = "H100-80GB", only: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Every check in order; the verdict (module doc)."""

    device = torch.device("cpu") if cpu else torch.device("cuda", torch.cuda.current_device())
    seq = seq_len or (128 if cpu else None)  # on a GPU: the largest the memory plan fits
    t0 = time.perf_counter()
    results: list[CheckResult] = []
    with tempfile.TemporaryDirectory(prefix="hydroagent-gpu-check-") as tmp:
        work = Path(tmp)
        plan: list[tuple[str, Callable[[], dict[str, Any]]]] = [
            ("environment", lambda: check_environment(device)),
            ("memory_plan", lambda: check_memory_plan(device, nominal_gpu)),
            ("sft_step", lambda: check_sft_step(device, cpu, seconds, seq, nominal_gpu)),
            ("grpo_step", lambda: check_grpo_step(device, cpu, seq, nominal_gpu)),
            ("tiny_grpo", lambda: check_tiny_grpo(device, work / "tiny")),
            ("engine", lambda: check_engine(device, work / "engine")),
        ]
        for name, fn in plan:
            if only and name not in only:
                continue
            results.append(_run(name, fn))
    failed = [r.name for r in results if r.status == "failed"]
    return {"verdict": "failed" if failed else "passed", "failed": failed, "mode": "cpu" if cpu else "gpu",
            "device": str(device), "git_commit": git_commit(), "wall_s": time.perf_counter() - t0,
            "checks": [asdict(r) for r in results]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hydroagent_hpc.bench.gpu_check", description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="write the JSON verdict here (and print it)")
    ap.add_argument("--cpu", action="store_true", help="the dry run on the CPU at small sizes (no GPU figures)")
    ap.add_argument("--seconds", type=float, default=45.0, help="seconds of timed SFT steps on the GPU (45)")
    ap.add_argument("--seq-len", type=int, default=None,
                    help="tokens per timed sequence (GPU: the largest of 4096, 2048, 1024 the plan fits; CPU 128)")
    ap.add_argument("--gpu", default="H100-80GB", help="the GPU the --cpu dry run plans for (H100-80GB)")
    ap.add_argument("--only", default="", help="comma list of checks to run (default: all)")
    ap.add_argument("--debug", action="store_true", help="tracebacks of failed checks in the log")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.cpu and not torch.cuda.is_available():
        sys.stderr.write(f"error: no CUDA device (torch {torch.__version__}); run this on a GPU node, "
                         f"or --cpu for the dry run\n")
        return 2
    only = tuple(s.strip() for s in args.only.split(",") if s.strip()) or None
    verdict = run_checks(cpu=args.cpu, seconds=args.seconds, seq_len=args.seq_len, nominal_gpu=args.gpu, only=only)
    text = json.dumps(verdict, indent=2, default=float)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_suffix(args.out.suffix + ".tmp")
        tmp.write_text(text + "\n")
        os.replace(tmp, args.out)
    sys.stdout.write(text + "\n")
    return 1 if verdict["verdict"] == "failed" else 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
