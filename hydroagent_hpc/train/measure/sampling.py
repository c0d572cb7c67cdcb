"""``python -m hydroagent_hpc.bench.sampler``: one decode step's sampling, before and after audit F13.

Baseline, measured in the same run: the sampler's step before F13 was fixed (top-p by sorting the whole
vocabulary; then, per row, ``torch.multinomial(...).item()`` and ``float(model_logp[row, token])``: two
host reads per row). Now: :func:`hydroagent_hpc.train.generation.sampler.draw_tokens` (top-p from ``torch.topk``
candidates, every row drawn on the device by inverse CDF) and one transfer of all tokens and log-probs.
The logits are random with a scale that gives nuclei of a few to some hundred ids at top-p 0.95, as an
instruct model's are. Prints a Markdown table; the speed is a ratio against the baseline.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch

from hydroagent_hpc.train.generation.sampler import (
    TOP_P_CANDIDATES,
    Sampling,
    draw_tokens,
    draw_tokens_sorted,
    sampling_probs,
)


def step_full_sort(logits: torch.Tensor, s: Sampling, gens: list[torch.Generator]) -> tuple[list[int], list[float]]:
    """The step before F13: full-vocabulary sort for top-p, then 2 host reads per row."""
    model_logp = torch.log_softmax(logits, dim=-1)
    probs = sampling_probs(logits, s)
    sorted_p, order = torch.sort(probs, dim=-1, descending=True)
    before = torch.cumsum(sorted_p, dim=-1) - sorted_p
    keep = torch.zeros_like(before < s.top_p).scatter(-1, order, before < s.top_p)
    probs = torch.where(keep, probs, torch.zeros_like(probs))
    probs = probs / probs.sum(dim=-1, keepdim=True)
    toks = [int(torch.multinomial(probs[r], 1, generator=gens[r]).item()) for r in range(logits.shape[0])]
    return toks, [float(model_logp[r, t]) for r, t in enumerate(toks)]


def step_candidates(logits: torch.Tensor, s: Sampling, u: torch.Tensor, width: int = TOP_P_CANDIDATES
                    ) -> tuple[list[int], list[float]]:
    """The step now: top-p from candidates, all rows on the device, one transfer (a second for wide rows)."""
    model_logp = torch.log_softmax(logits, dim=-1)
    probs = sampling_probs(logits, s)
    tok, covered = draw_tokens(probs, u, s.top_p, width)
    lp = model_logp.gather(-1, tok[:, None])[:, 0]
    host = torch.stack([tok.double(), lp.double(), covered.double()]).tolist()
    wide = [r for r, c in enumerate(host[2]) if not c]
    if wide:
        rows = torch.tensor(wide, device=logits.device)
        new = draw_tokens_sorted(probs[rows], u[rows], s.top_p)
        tok = tok.index_copy(0, rows, new)
        lp = model_logp.gather(-1, tok[:, None])[:, 0]
        host = torch.stack([tok.double(), lp.double()]).tolist()
    return [int(t) for t in host[0]], host[1]


def _time(fn: Callable[[], object], repeats: int, sync: Callable[[], None]) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hydroagent_hpc.bench.sampler", description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=32, help="rows sampled per step (the generation batch)")
    ap.add_argument("--vocab", type=int, default=151936, help="vocabulary size (Qwen3's)")
    ap.add_argument("--scale", type=float, default=6.0, help="logit scale (larger: smaller nuclei)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    g = torch.Generator(device=device).manual_seed(0)
    logits = torch.randn(args.rows, args.vocab, generator=g, device=device) * args.scale
    s = Sampling(temperature=1.0, top_p=0.95)
    gens = [torch.Generator(device=device).manual_seed(r) for r in range(args.rows)]
    u = torch.rand(args.rows, generator=g, dtype=torch.float64, device=device)
    with torch.inference_mode():
        old = _time(lambda: step_full_sort(logits, s, gens), args.repeats, sync)
        new = _time(lambda: step_candidates(logits, s, u), args.repeats, sync)
    out = sys.stdout.write
    out(f"\n### One sampling step: {args.rows} rows x {args.vocab} ids on {device} (top-p 0.95)\n\n")
    out("| step | host reads per step | median ms | speed-up |\n|---|---:|---:|---:|\n")
    out(f"| full sort + per-row multinomial (before F13) | {2 * args.rows} | {old * 1e3:.2f} | 1.00 |\n")
    out(f"| top-{TOP_P_CANDIDATES} candidates, one transfer | 1 | {new * 1e3:.2f} | {old / new:.2f} |\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
