"""SFT throughput: ``python -m hydroagent_hpc.bench.train [--gpu]``.

* CPU (the default; a section of ``make bench``): tokens/s and peak memory of full-parameter SFT
  steps (forward, weighted assistant-only loss, backward, clip, AdamW) of the tiny offline Qwen3
  (:mod:`hydroagent_hpc.train.tiny`, fp32) at a few sequence lengths.
* ``--gpu``: a Qwen3-4B-shaped model (:data:`hydroagent_hpc.train.throughput.QWEN3_4B_SHAPE`) with
  random weights in BF16 on one CUDA device, 8,192-token sequences, timed for ``--seconds``
  (default 180): tokens/s per GPU, achieved TFLOP/s and MFU against the device's dense BF16 peak
  (989 TFLOP/s for H100/H200; ``--peak-tflops`` for others). The FLOP count and its formula are in
  :mod:`hydroagent_hpc.train.throughput`. Without CUDA it refuses with exit status 2.

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

__all__ = ["cpu_rows", "gpu_result", "markdown", "main"]

log = logging.getLogger(__name__)

CPU_SEQ_LENS = (256, 1024)


def cpu_rows(seq_lens: tuple[int, ...] = CPU_SEQ_LENS, steps: int = 5, batch: int = 4) -> list[dict[str, Any]]:
    """Timed SFT steps of the tiny Qwen3 on the CPU, one row per sequence length."""
    from hydroagent_hpc.train.throughput import measure_sft_steps
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


def gpu_result(seconds: float, seq_len: int, batch: int, activation_checkpointing: bool,
               peak_tflops: float | None, layers: int | None = None) -> dict[str, Any]:
    """The ``--gpu`` benchmark on CUDA device 0 (the caller checked that there is one)."""
    from hydroagent_hpc.train.throughput import build_random_qwen3, measure_sft_steps, qwen3_config

    overrides = {"num_hidden_layers": layers} if layers else {}
    model = build_random_qwen3(qwen3_config(**overrides), "cuda", "bfloat16")
    r = measure_sft_steps(model, seq_len=seq_len, batch=batch, seconds=seconds, warmup_steps=2,
                          activation_checkpointing=activation_checkpointing, peak_tflops=peak_tflops)
    return r.as_dict()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hydroagent_hpc.bench.train", description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", action="store_true", help="the Qwen3-4B-shaped BF16 benchmark on CUDA device 0")
    ap.add_argument("--seconds", type=float, default=180.0, help="--gpu: seconds of timed steps (default 180)")
    ap.add_argument("--seq-len", type=int, default=8192, help="--gpu: tokens per sequence (default 8192)")
    ap.add_argument("--batch", type=int, default=1, help="--gpu: sequences per step (default 1)")
    ap.add_argument("--activation-checkpointing", action="store_true", help="--gpu: recompute activations")
    ap.add_argument("--peak-tflops", type=float, help="--gpu: the device's dense BF16 peak (default: by name)")
    ap.add_argument("--layers", type=int, help="--gpu: fewer layers for a quick check (MFU then differs)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of Markdown")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if not args.gpu:
        rows = cpu_rows()
        sys.stdout.write(json.dumps(rows) + "\n" if args.json else markdown(rows))
        return 0
    from hydroagent_hpc.train.throughput import cuda_device_count

    if cuda_device_count() == 0:
        print("error: --gpu needs a CUDA device and a CUDA build of torch; this machine has none "
              "(run it on a GPU node, e.g. `srun --gpus=1 python -m hydroagent_hpc.bench.train --gpu`, or "
              "drop --gpu for the CPU benchmark)", file=sys.stderr)
        return 2
    r = gpu_result(args.seconds, args.seq_len, args.batch, args.activation_checkpointing, args.peak_tflops,
                   args.layers)
    if args.json:
        sys.stdout.write(json.dumps(r) + "\n")
        return 0
    mfu = f"{r['mfu'] * 100:.1f} %" if r["mfu"] is not None else "n/a (unknown peak: give --peak-tflops)"
    sys.stdout.write(
        f"## SFT throughput, Qwen3-4B shape, random weights, {r['dtype']}\n\n"
        f"| device | params | matmul params | batch x seq | act. ckpt | steps | s | tokens/s per GPU | "
        f"TFLOP/s | peak TFLOP/s | MFU | peak memory GB |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n"
        f"| {r['device']} | {r['params'] / 1e9:.3f} B | {r['matmul_params'] / 1e9:.3f} B | {r['batch']} x "
        f"{r['seq_len']} | {r['activation_checkpointing']} | {r['steps']} | {r['seconds']:.1f} | "
        f"{r['tokens_per_s']:,.0f} | {r['achieved_tflops']:.1f} | {r['peak_tflops'] or 'n/a'} | {mfu} | "
        f"{r['peak_memory_mb'] / 1024:.1f} |\n\nModel FLOPs per token = 6 x matmul params + 12 x layers x "
        f"(heads x head_dim) x seq_len = {r['flops_per_token'] / 1e9:.2f} GFLOP "
        "(hydroagent_hpc/train/throughput.py).\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
