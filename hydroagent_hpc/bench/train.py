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

* ``--grpo`` (with or without ``--gpu``): the parts of a GRPO step measured with the trainer's own
  code (prefill, decode through the rollout sampler, one GRPO optimizer step with the reference
  model, activation checkpointing on unless ``--no-activation-checkpointing``;
  :mod:`hydroagent_hpc.train.measure.grpo_throughput`) and the step they add up to for the paper's
  setting (4 prompts x K=8 episodes of up to 50 turns), on 1 GPU and on 4, the assumptions printed
  with it. On the CPU it runs the tiny model with small sizes (seconds), which checks the code, not
  the GPU figure.

What is timed is the model math of one SFT step on one device, not the trainer's data pipeline,
checkpointing or FSDP communication (one device has none). Issue 14's goal: MFU >= 35 % for the 4B
shape on one H100/H200 (torchtitan publishes 33-39 % for Llama-3.1-8B on H100).

No GPU was available in the session that wrote this module: the ``--gpu`` path has not been run
yet; run it on a GPU node and record the numbers.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from hydroagent_hpc.errors import HydroAgentError, one_line
from hydroagent_hpc.train.memory_plan import MemoryPlanError, ModelShape, check_plan, free_device_memory, plan_sft
from hydroagent_hpc.train.sft.config import SFTConfig

__all__ = ["cpu_rows", "gpu_result", "markdown", "grpo_result", "grpo_markdown", "main", "build_parser",
           "bench_sft_config", "bench_shape", "bench_sft_plan"]

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
    return {"parts": parts.as_dict(), "shape": {**vars(shape), "tokens": shape.tokens}, "sim_s": sim_s,
            "sim_slots": sim_slots, "activation_checkpointing": activation_checkpointing, "estimates": rows}


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
    if args.gpu and cuda_device_count() == 0:
        print("error: --gpu --grpo needs a CUDA device and a CUDA build of torch; this machine has none "
              "(run it on a GPU node, e.g. `srun --gpus=1 python -m hydroagent_hpc.bench.train --gpu --grpo`, or "
              "drop --gpu to check the code on the CPU with the tiny model)", file=sys.stderr)
        return 2
    r = grpo_result(args.gpu, shape, sim_s=args.sim_s, sim_slots=args.sim_slots, layers=args.layers,
                    activation_checkpointing=args.activation_checkpointing, decode_ctx=args.decode_ctx)
    sys.stdout.write(json.dumps(r) + "\n" if args.json else grpo_markdown(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
