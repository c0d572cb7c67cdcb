"""SFT and GRPO step throughput: ``python -m hydroagent_hpc.bench.train [--gpu] [--grpo]``.

* CPU (the default; a section of ``make bench``): tokens/s and peak memory of full-parameter SFT
  steps (forward, weighted assistant-only loss, backward, clip, AdamW) of the tiny offline Qwen3
  (:mod:`hydroagent_hpc.train.tiny`, fp32) at a few sequence lengths.
* ``--gpu``: a Qwen3-4B-shaped model (:data:`hydroagent_hpc.train.measure.throughput.QWEN3_4B_SHAPE`) with
  random weights on one CUDA device, held as the SFT trainer holds it in one process (fp32 master
  weights, bf16 autocast compute, the trainer's own AdamW), 8,192-token sequences with activation
  checkpointing (``--no-activation-checkpointing`` turns it off; the result records which ran),
  timed for ``--seconds`` (default 180): tokens/s per GPU, achieved TFLOP/s and MFU against the
  device's dense BF16 peak (989 TFLOP/s for H100/H200; ``--peak-tflops`` for others), and peak
  memory beside the memory plan's (:mod:`hydroagent_hpc.train.memory_plan`). The plan is checked
  against the device's free memory before the model is built: a size that does not fit is refused
  with the number of layers that would (``--layers``). The FLOP count and its formula are in
  :mod:`hydroagent_hpc.train.measure.throughput`. Without CUDA it refuses with exit status 2.

* ``--grpo --layouts`` (CPU, no model, instant): the paper-sized step per layout (engine on its own GPU,
  as the audit found it and with its fixes; colocated; colocated with one-step overlap) from the
  layout model (:func:`hydroagent_hpc.train.measure.grpo_throughput.estimate_layout`) and its documented
  default parts (:func:`~hydroagent_hpc.train.measure.grpo_throughput.paper_costs`: roofline decode and
  prefill on H100, training at 35 % MFU, sync, sleep/wake, 1 s simulations on 32 slots). ``--gpus``,
  ``--turn-cv`` (spread of the turn lengths: convoying) and the shape flags apply.
* ``--grpo`` (with or without ``--gpu``): the parts of a GRPO step measured with the trainer's own
  code (prefill, decode through the rollout sampler, one GRPO optimizer step with the reference
  model, activation checkpointing on unless ``--no-activation-checkpointing``;
  :mod:`hydroagent_hpc.train.measure.grpo_throughput`) and the step they add up to for the paper's
  setting (4 prompts x K=8 episodes of up to 50 turns), on 1 GPU and on 4, the assumptions printed
  with it. On the CPU it runs the tiny model with small sizes (seconds), which checks the code, not
  the GPU figure. With ``--gpu`` it also measures what one GPU can of the layouts (an engine's sleep and
  wake as torch does them, the in-device part of a weight sync of the 4B model in 1 GiB buckets, decode
  at batch 8 and 32) and prints the layout table from those parts beside the documented one. Without a
  CUDA device ``--gpu --grpo`` says why it skips the measurement and prints the documented table (exit 0).

What is timed is the model math of one SFT step on one device, not the trainer's data pipeline,
checkpointing or FSDP communication (one device has none). Issue 14's goal: MFU >= 35 % for the 4B
shape on one H100/H200 (torchtitan publishes 33-39 % for Llama-3.1-8B on H100).

No GPU was available in the session that wrote this module: the ``--gpu`` path has not been run
yet; run it on a GPU node and record the numbers.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from typing import Any

from hydroagent_hpc.errors import HydroAgentError, one_line
from hydroagent_hpc.train.memory_plan import MemoryPlanError, ModelShape, check_plan, free_device_memory, plan_sft
from hydroagent_hpc.train.sft.config import SFTConfig

__all__ = ["cpu_rows", "gpu_result", "markdown", "grpo_result", "grpo_markdown", "main", "build_parser",
           "bench_sft_config", "bench_shape", "bench_sft_plan", "layouts_result", "layouts_markdown", "measured_costs"]

log = logging.getLogger(__name__)

CPU_SEQ_LENS = (256, 1024)


def cpu_rows(seq_lens: tuple[int, ...] = CPU_SEQ_LENS, steps: int = 5, batch: int = 4) -> list[dict[str, Any]]:
    """Timed SFT steps of the tiny Qwen3 on the CPU, one row per sequence length."""
    from hydroagent_hpc.train.measure.throughput import measure_sft_steps
    from hydroagent_hpc.train.tiny import build_tiny

    rows = []
    for seq_len in seq_lens:
        model, _ = build_tiny(seed=0)
        model.float()  # the tiny model is float32 already; CPU SFT trains in float32
        r = measure_sft_steps(model, seq_len=seq_len, batch=batch, steps=steps, warmup_steps=1)
        rows.append(r.as_dict())
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| model | device | dtype | params | batch x seq | steps | s | tokens/s | GFLOP/s (model) | "
             "peak memory MB |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| tiny Qwen3 | {r['device']} | {r['dtype']} | {r['params'] / 1e6:.2f} M | "
                     f"{r['batch']} x {r['seq_len']} | {r['steps']} | {r['seconds']:.2f} | {r['tokens_per_s']:,.0f} | "
                     f"{r['achieved_tflops'] * 1e3:.1f} | {r['peak_memory_mb']:.0f} |")
    return "\n".join(lines) + ("\n\nTimed: forward, weighted assistant-only loss, backward, clip, AdamW "
                               "(`python -m hydroagent_hpc.bench.train`); peak memory is the process's "
                               "peak resident set.\n")


def bench_sft_config(seq_len: int, batch: int, activation_checkpointing: bool) -> Any:
    """The ``--gpu`` SFT benchmark as an SFT config (for its memory plan): one process, bf16 compute
    over fp32 weights, one micro-batch of ``batch x seq_len`` tokens per optimizer step."""

    return SFTConfig(data="-", max_steps=1, max_seq_len=seq_len, micro_batch_size=batch, grad_accum=1,
                     dtype="bf16", fsdp=False, activation_checkpointing=activation_checkpointing)


def bench_shape(layers: int | None = None) -> Any:
    """The benchmark's model shape (Qwen3-4B, or fewer layers)."""
    from hydroagent_hpc.train.measure.throughput import qwen3_config

    return ModelShape.from_config(qwen3_config(**({"num_hidden_layers": layers} if layers else {})),
                                  name="Qwen3-4B shape" + (f", {layers} layers" if layers else ""))


def bench_sft_plan(seq_len: int, batch: int, activation_checkpointing: bool, layers: int | None = None, *,
                   gpu: str | None = None, free_bytes: int | None = None) -> Any:
    """The memory plan of the ``--gpu`` SFT benchmark (:func:`hydroagent_hpc.train.memory_plan.plan_sft`)."""

    return plan_sft(bench_sft_config(seq_len, batch, activation_checkpointing), world=1, gpu=gpu,
                    free_bytes=free_bytes, shape=bench_shape(layers), suggest=False)


def _layers_that_fit(seq_len: int, batch: int, activation_checkpointing: bool, free_bytes: int) -> int | None:
    top = int(bench_shape().layers)
    for layers in range(top - 1, 0, -1):
        if bench_sft_plan(seq_len, batch, activation_checkpointing, layers, free_bytes=free_bytes).fits:
            return layers
    return None


def gpu_result(seconds: float, seq_len: int, batch: int, activation_checkpointing: bool,
               peak_tflops: float | None, layers: int | None = None) -> dict[str, Any]:
    """The ``--gpu`` benchmark on CUDA device 0 (the caller checked that there is one): the model as the SFT
    trainer holds it in one process (fp32 master weights, bf16 autocast, the trainer's AdamW). The memory
    plan is checked against the device's free memory first (a :class:`MemoryPlanError` names the
    ``--layers`` that would fit)."""
    from hydroagent_hpc.train.measure.throughput import build_random_qwen3, measure_sft_steps, qwen3_config
    from hydroagent_hpc.train.sft.trainer import sft_optimizer

    free = free_device_memory("cuda:0")
    assert free is not None
    plan = bench_sft_plan(seq_len, batch, activation_checkpointing, layers, free_bytes=free)
    try:
        check_plan(plan)
    except MemoryPlanError as exc:
        fit = _layers_that_fit(seq_len, batch, activation_checkpointing, free)
        raise MemoryPlanError(f"--gpu benchmark: {exc.message}",
                              (f"--layers {fit} fits ({plan.device}); " if fit else "") +
                              "or a shorter --seq-len; the SFT trainer itself needs FSDP2 over more GPUs here "
                              "(hydroagent train plan)") from None
    overrides = {"num_hidden_layers": layers} if layers else {}
    model = build_random_qwen3(qwen3_config(**overrides), "cuda", "float32")
    trainer = SFTConfig(data="-", max_steps=1)
    r = measure_sft_steps(model, seq_len=seq_len, batch=batch, seconds=seconds, warmup_steps=2,
                          activation_checkpointing=activation_checkpointing, peak_tflops=peak_tflops,
                          compute_dtype="bfloat16", optimizer=lambda m: sft_optimizer(m, trainer))
    return {**r.as_dict(), "plan_peak_mb": plan.peak / 2**20, "plan_capacity_mb": plan.capacity / 2**20}


#: The layouts the GRPO estimate is printed for: (training GPUs, generating GPUs).
GRPO_LAYOUTS = ((1, 1), (4, 1), (4, 4))


def grpo_result(gpu: bool, shape: Any, *, sim_s: float, sim_slots: int, layers: int | None = None,
                activation_checkpointing: bool = False, decode_ctx: int | None = None) -> dict[str, Any]:
    """Measure a GRPO step's parts (4B shape in BF16 on CUDA device 0 with ``gpu``, else the tiny model on
    the CPU at small sizes) and estimate ``shape``'s step for each of :data:`GRPO_LAYOUTS`."""
    from hydroagent_hpc.train.measure.grpo_throughput import estimate_step, measure_parts

    if gpu:
        from hydroagent_hpc.train.measure.throughput import build_random_qwen3, qwen3_config

        cfg = qwen3_config(**({"num_hidden_layers": layers} if layers else {}))
        model = build_random_qwen3(cfg, "cuda", "bfloat16", seed=0)
        reference = build_random_qwen3(cfg, "cuda", "bfloat16", seed=1).requires_grad_(False)
        if activation_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        long_ctx = decode_ctx or min(shape.tokens, 8192)
        sizes = dict(prefill_batch=8, prefill_len=2048, decode_batch=shape.episodes,
                     decode_ctx=(shape.prompt, long_ctx), decode_tokens=32, train_seq_len=8192)
    else:
        from hydroagent_hpc.train.tiny import build_tiny

        model, _ = build_tiny(seed=0)
        reference, _ = build_tiny(seed=1)
        model.float()
        reference.float().requires_grad_(False)
        sizes = dict(prefill_batch=4, prefill_len=256, decode_batch=4, decode_ctx=(64, decode_ctx or 256),
                     decode_tokens=8, train_seq_len=256)
    if activation_checkpointing and not gpu:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    parts = measure_parts(model, reference, **sizes)
    rows = [{"gpus": g, "engines": e, **estimate_step(parts, shape, gpus=g, engines=e, sim_s_per_run=sim_s,
                                                      sim_slots=sim_slots)}
            for g, e in GRPO_LAYOUTS]
    out = {"parts": parts.as_dict(), "shape": {**vars(shape), "tokens": shape.tokens}, "sim_s": sim_s,
           "sim_slots": sim_slots, "activation_checkpointing": activation_checkpointing, "estimates": rows}
    if gpu:  # what one GPU measures of the layouts, and the layout table from it
        import dataclasses

        del reference
        costs, raw = measured_costs(model, parts, shape, decode_ctx=sizes["decode_ctx"])
        costs = dataclasses.replace(costs, sim_s=sim_s, sim_slots=sim_slots)
        out["layout_parts"] = raw
        out["layouts_measured"] = layouts_result(shape, costs)
    return out


def grpo_markdown(r: dict[str, Any]) -> str:
    p, sh = r["parts"], r["shape"]
    (c0, c1), (d0, d1) = p["decode_ctx"], p["decode_s"]
    cpu_note = (["The tiny model on the CPU: this checks the benchmark's code; the step estimate below is not a "
                 "GPU figure (run `--gpu --grpo` on a GPU node for that).", ""] if p["device"] == "cpu" else [])
    ac = "on" if r.get("activation_checkpointing") else "off"
    lines = [f"## GRPO step parts, {p['device']}, {p['dtype']}, {p['params'] / 1e6:,.1f} M parameters "
             f"(random weights), activation checkpointing {ac}", "", *cpu_note, "| part | measured |", "|---|---|",
             f"| prefill (no gradient) | {p['prefill_tps']:,.0f} tokens/s |",
             f"| decode, batch {p['decode_batch']} | {d0 * 1e3:.2f} ms/step at {c0:,} tokens of context, "
             f"{d1 * 1e3:.2f} ms at {c1:,} |",
             f"| GRPO optimizer step (policy with gradient, reference, loss, AdamW) | "
             f"{p['train_s_per_token'] * 1e6:.2f} us/token at {p['train_seq_len']:,} tokens |",
             f"| peak memory | {p['peak_memory_mb'] / 1024:.1f} GB |", "",
             f"## Estimated step: {sh['episodes']} episodes x {sh['turns']} turns ({sh['prompt']:,}-token prompt, "
             f"{sh['turn']} tokens per turn, {sh['tool']} per tool reply: {sh['tokens']:,} tokens per episode), "
             f"{sh['sims_per_episode']} simulations per episode at {r['sim_s']:g} s on {r['sim_slots']} slots",
             "", "| training GPUs | generating GPUs | prefill s | decode s | train s | simulation s (overlapped) | "
             "step s | step min |", "|---|---|---|---|---|---|---|---|"]
    for e in r["estimates"]:
        lines.append(f"| {e['gpus']} | {e['engines']} | {e['prefill_s']:.1f} | {e['decode_s']:.1f} | "
                     f"{e['train_s']:.1f} | {e['simulate_s']:.1f} | {e['step_s']:.1f} | {e['step_s'] / 60:.2f} |")
    lines += ["", "Formula and assumptions: hydroagent_hpc/train/measure/grpo_throughput.py "
              "(a lower bound: FSDP's gathers "
              "and the weight sync to an engine are not counted; the decode time of several generating GPUs is the "
              "one measured at this batch). Issue 15's goal: a paper-sized step in <= 3 minutes on 4 H100s.", ""]
    return "\n".join(lines)


def layouts_result(shape: Any, costs: Any = None, *, gpus: int = 4, group_size: int = 8,
                   turn_cv: float = 0.0) -> dict[str, Any]:
    """The step of ``shape`` per layout on ``gpus`` GPUs
    (:func:`~hydroagent_hpc.train.measure.grpo_throughput.paper_layouts`) from ``costs`` (default: the
    documented parts, :func:`~hydroagent_hpc.train.measure.grpo_throughput.paper_costs`)."""
    from hydroagent_hpc.train.measure.grpo_throughput import layout_table, paper_costs, paper_layouts

    costs = costs if costs is not None else paper_costs(shape)
    rows = layout_table(shape, costs, paper_layouts(gpus), group_size=group_size, turn_cv=turn_cv)
    mean_ctx = shape.prompt + (shape.turns - 1) / 2 * (shape.turn + shape.tool)
    return {"shape": {**vars(shape), "tokens": shape.tokens}, "gpus": gpus, "group_size": group_size,
            "turn_cv": turn_cv, "costs": costs.as_dict(),
            "decode_ms": {str(b): costs.decode.step(b, b * mean_ctx) * 1e3 for b in (shape.episodes // gpus,
                                                                                    shape.episodes)},
            "mean_ctx": mean_ctx, "layouts": rows}


def layouts_markdown(r: dict[str, Any]) -> str:
    sh, c = r["shape"], r["costs"]
    d = r["decode_ms"]
    lines = [f"## GRPO step per layout on {r['gpus']} GPUs ({c['source']})", "",
             f"{sh['episodes']} episodes (groups of {r['group_size']}, a group on one engine) x {sh['turns']} turns: "
             f"{sh['prompt']:,}-token prompt, {sh['turn']} tokens per turn (spread: cv {r['turn_cv']:g}), "
             f"{sh['tool']} per tool reply ({sh['tokens']:,} per episode); {sh['sims_per_episode']} simulations "
             f"per episode at {c['sim_s']:g} s on {c['sim_slots']} slots, on each episode's own path. Decode "
             + ", ".join(f"{ms:.1f} ms/step at batch {b}" for b, ms in d.items())
             + f" (mean context {r['mean_ctx']:,.0f}); training {c['train_s_per_token'] * 1e6:.2f} us/token on one "
             f"GPU; sleep {c['sleep_s']:.2f} s, wake {c['wake_s']:.2f} s; a sync through the disk "
             f"{c['disk_sync_s']:g} s.", "",
             "| layout | GPUs generating / training | rollouts s (busiest engine) | waits per episode s "
             "(GPU / slot) | train s | weight sync s | sleep + wake s | step s | step min |",
             "|---|---|---|---|---|---|---|---|---|"]
    for e in r["layouts"]:
        shared = " (the same)" if e["engines"] == e["trainers"] and e["gpus"] == e["trainers"] else ""
        lines.append(f"| {e['layout']} | {e['engines']} / {e['trainers']}{shared} | {e['rollouts_s']:.1f} "
                     f"({e['engine_busy_s']:.1f}) | {e['gpu_wait_s']:.1f} / {e['sim_wait_s']:.1f} | "
                     f"{e['train_s']:.1f} | "
                     f"{e['sync_s']:.1f} | {e['sleep_wake_s']:.1f} | {e['step_s']:.1f} | {e['step_s'] / 60:.2f} |")
    lines += ["", "The model: hydroagent_hpc/train/measure/grpo_throughput.py (the rollouts played decode step by "
              "decode step; FSDP's gathers during training not counted). Goal (issue 33): <= 2 min on 4 H100s; "
              "the audit: ~23 min as coded with SGLang, ~5 with every first-contact fix.", ""]
    return "\n".join(lines)


def measured_costs(model: Any, parts: Any, shape: Any, *, decode_ctx: tuple[int, int], decode_tokens: int = 16,
                   bucket_bytes: int = 2**30) -> tuple[Any, dict[str, Any]]:
    """The layout model's parts from this device (``model``: the BF16 policy of :func:`grpo_result`; ``parts``
    its :class:`~hydroagent_hpc.train.measure.grpo_throughput.GRPOStepParts`): decode through the in-process
    sampler at batch ``episodes / 4`` and ``episodes`` (fitted, :class:`DecodeCost`), an engine's sleep and
    wake as torch does them, the in-device part of a weight sync; the training and prefill of ``parts``; the
    link bandwidth and the rest from the documented defaults. Returns the costs and the raw measurements."""
    import dataclasses

    from hydroagent_hpc.train.measure.grpo_throughput import (
        DecodeCost,
        PrefillCost,
        measure_decode,
        measure_sleep_wake,
        measure_weight_sync,
        paper_costs,
    )

    small = max(1, shape.episodes // 4)
    points = [(parts.decode_batch, float(c), s) for c, s in zip(parts.decode_ctx, parts.decode_s)]
    points += [(small, float(c), measure_decode(model, batch=small, ctx=c, new_tokens=decode_tokens))
               for c in decode_ctx]
    sleep_s, wake_s = measure_sleep_wake(model)
    sync = measure_weight_sync(model, bucket_bytes=bucket_bytes)
    costs = dataclasses.replace(
        paper_costs(shape), decode=DecodeCost.fit(points), prefill=PrefillCost(1.0 / parts.prefill_tps),
        train_s_per_token=parts.train_at(shape.tokens), weight_bytes=float(sync["bytes"]),
        copy_bytes_per_s=sync["bytes"] / sync["seconds"], sync_per_bucket_s=0.0, sleep_s=sleep_s, wake_s=wake_s,
        source=f"measured on one {parts.device}: decode through the in-process sampler (not an engine), the "
               f"training step, prefill, sleep/wake as torch offload, the in-device sync; link bandwidth and "
               f"disk sync documented defaults")
    raw = {"decode_points": points, "sleep_s": sleep_s, "wake_s": wake_s, "weight_sync": sync}
    return costs, raw


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's command line (its defaults are the ``--gpu`` runs' settings)."""
    ap = argparse.ArgumentParser(prog="python -m hydroagent_hpc.bench.train", description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", action="store_true", help="the Qwen3-4B-shaped BF16 benchmark on CUDA device 0")
    ap.add_argument("--seconds", type=float, default=180.0, help="--gpu: seconds of timed steps (default 180)")
    ap.add_argument("--seq-len", type=int, default=8192, help="--gpu: tokens per sequence (default 8192)")
    ap.add_argument("--batch", type=int, default=1, help="--gpu: sequences per step (default 1)")
    ap.add_argument("--activation-checkpointing", action=argparse.BooleanOptionalAction, default=True,
                    help="--gpu, --grpo: recompute each decoder layer's activations in the backward pass (default "
                         "on, as the paper configs train; --no-activation-checkpointing measures without; "
                         "the result records which ran)")
    ap.add_argument("--peak-tflops", type=float, help="--gpu: the device's dense BF16 peak (default: by name)")
    ap.add_argument("--layers", type=int, help="--gpu: fewer layers for a quick check (MFU then differs)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of Markdown")
    g = ap.add_argument_group("--grpo: the GRPO step's parts and the estimated paper-sized step")
    g.add_argument("--grpo", action="store_true", help="measure a GRPO step's parts (see the module doc)")
    g.add_argument("--episodes", type=int, default=32, help="rollouts per step (default 32: 4 prompts x K=8)")
    g.add_argument("--turns", type=int, default=50, help="assistant turns per episode (default 50, the cap)")
    g.add_argument("--prompt-tokens", type=int, default=1500, help="system and task prompt (default 1500)")
    g.add_argument("--turn-tokens", type=int, default=150, help="assistant tokens per turn (default 150)")
    g.add_argument("--tool-tokens", type=int, default=250, help="tokens per tool reply (default 250)")
    g.add_argument("--sims-per-episode", type=int, default=25, help="simulator runs per episode (default 25)")
    g.add_argument("--sim-s", type=float, default=1.0,
                   help="seconds per simulator run (default 1.0: a 10,000-cell basin, 90 days hourly, one core)")
    g.add_argument("--sim-slots", type=int, default=32, help="simulations in flight (default 32, the paper's)")
    g.add_argument("--decode-ctx", type=int, help="the longer decode context (default: the episode, at most 8192)")
    g.add_argument("--layouts", action="store_true",
                   help="no measurement: the step per layout from the layout model's documented default parts")
    g.add_argument("--gpus", type=int, default=4, help="--layouts: GPUs of the node (default 4)")
    g.add_argument("--group-size", type=int, default=8, help="--layouts: rollouts per group, one engine each "
                                                             "(default 8)")
    g.add_argument("--turn-cv", type=float, default=0.0,
                   help="--layouts: spread of the turn lengths (coefficient of variation; default 0: every turn "
                        "the same; >0 shows convoying)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.grpo:
        return _grpo_main(args)
    if not args.gpu:
        rows = cpu_rows()
        sys.stdout.write(json.dumps(rows) + "\n" if args.json else markdown(rows))
        return 0
    from hydroagent_hpc.train.measure.throughput import cuda_device_count

    if cuda_device_count() == 0:
        print("error: --gpu needs a CUDA device and a CUDA build of torch; this machine has none "
              "(run it on a GPU node, e.g. `srun --gpus=1 python -m hydroagent_hpc.bench.train --gpu`, or "
              "drop --gpu for the CPU benchmark)", file=sys.stderr)
        return 2

    try:
        r = gpu_result(args.seconds, args.seq_len, args.batch, args.activation_checkpointing, args.peak_tflops,
                       args.layers)
    except HydroAgentError as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 2
    if args.json:
        sys.stdout.write(json.dumps(r) + "\n")
        return 0
    mfu = f"{r['mfu'] * 100:.1f} %" if r["mfu"] is not None else "n/a (unknown peak: give --peak-tflops)"
    sys.stdout.write(
        f"## SFT throughput, Qwen3-4B shape, random weights, {r['dtype']} master weights, {r['compute_dtype']} "
        f"compute, {r['optimizer']}\n\n"
        f"| device | params | matmul params | batch x seq | act. ckpt | steps | s | tokens/s per GPU | "
        f"TFLOP/s | peak TFLOP/s | MFU | peak memory GB |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n"
        f"| {r['device']} | {r['params'] / 1e9:.3f} B | {r['matmul_params'] / 1e9:.3f} B | {r['batch']} x "
        f"{r['seq_len']} | {r['activation_checkpointing']} | {r['steps']} | {r['seconds']:.1f} | "
        f"{r['tokens_per_s']:,.0f} | {r['achieved_tflops']:.1f} | {r['peak_tflops'] or 'n/a'} | {mfu} | "
        f"{r['peak_memory_mb'] / 1024:.1f} (plan {r['plan_peak_mb'] / 1024:.1f}) |\n\n"
        f"Model FLOPs per token = 6 x matmul params + 12 x layers x "
        f"(heads x head_dim) x seq_len = {r['flops_per_token'] / 1e9:.2f} GFLOP "
        "(hydroagent_hpc/train/measure/throughput.py).\n")
    return 0


def _grpo_main(args: argparse.Namespace) -> int:
    from hydroagent_hpc.train.measure.grpo_throughput import EpisodeShape
    from hydroagent_hpc.train.measure.throughput import cuda_device_count

    try:
        shape = EpisodeShape(episodes=args.episodes, prompt=args.prompt_tokens, turn=args.turn_tokens,
                             tool=args.tool_tokens, turns=args.turns, sims_per_episode=args.sims_per_episode)
    except ValueError as exc:
        print(f"error: {exc} (the --episodes/--turns/--*-tokens/--sims-per-episode flags)", file=sys.stderr)
        return 2
    if args.gpus < 2 or args.group_size < 1 or args.turn_cv < 0:
        print(f"error: --gpus {args.gpus} / --group-size {args.group_size} / --turn-cv {args.turn_cv}: the layouts "
              "need 2 or more GPUs, a group of 1 or more, a spread of 0 or more", file=sys.stderr)
        return 2
    skipped = args.gpu and cuda_device_count() == 0
    if skipped:
        print("skipped: --gpu --grpo measures on a CUDA device and this machine has none (or torch has no CUDA "
              "build); the layout table below is the model's, from its documented default parts, not a "
              "measurement (run it on a GPU node, e.g. `srun --gpus=1 python -m hydroagent_hpc.bench.train --gpu "
              "--grpo`)", file=sys.stderr)
    if args.layouts or skipped:
        from hydroagent_hpc.train.measure.grpo_throughput import paper_costs

        costs = dataclasses.replace(paper_costs(shape), sim_s=args.sim_s, sim_slots=args.sim_slots)
        table = layouts_result(shape, costs, gpus=args.gpus, group_size=args.group_size, turn_cv=args.turn_cv)
        sys.stdout.write(json.dumps(table) + "\n" if args.json else layouts_markdown(table))
        return 0
    r = grpo_result(args.gpu, shape, sim_s=args.sim_s, sim_slots=args.sim_slots, layers=args.layers,
                    activation_checkpointing=args.activation_checkpointing, decode_ctx=args.decode_ctx)
    if args.json:
        sys.stdout.write(json.dumps(r) + "\n")
        return 0
    sys.stdout.write(grpo_markdown(r))
    if "layouts_measured" in r:
        from hydroagent_hpc.train.measure.grpo_throughput import paper_costs

        sys.stdout.write("\n" + layouts_markdown(r["layouts_measured"]) + "\n"
                         + layouts_markdown(layouts_result(shape, dataclasses.replace(
                             paper_costs(shape), sim_s=args.sim_s, sim_slots=args.sim_slots))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
