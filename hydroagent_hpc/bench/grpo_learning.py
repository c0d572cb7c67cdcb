"""Learning with GRPO on CPU: ``python -m hydroagent_hpc.bench.grpo_learning --from SFT_DIR --out DIR``.

Continues :mod:`hydroagent_hpc.bench.sft_learning` (run it first; ``SFT_DIR`` is its ``--out``):
the SFT'd tiny Qwen3 (``SFT_DIR/run/final``) is the initial policy of a GRPO run on the teaching
basins (``paper`` preset: per-turn payments + terminal score, episode advantages, KL 0.2 to the
initial policy), validated greedily on the held-out basin before the first step and after the last.
Repeated for ``--seeds`` seeds; prints the mean reward of the training rollouts at the first and
the last step, and the held-out reward and best NSE before and after, per seed and their mean.
Not part of ``make bench`` (minutes per seed).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from hydroagent_hpc.train.grpo.config import grpo_config_from_mapping

__all__ = ["run", "main"]


def run(sft_dir: Path, out: Path, steps: int = 4, seeds: int = 2, k: int = 4, turns: int = 12,
        lr: float = 1e-5) -> dict[str, Any]:
    from hydroagent_hpc.train.grpo.trainer import train_grpo

    basins = sorted(str(p) for p in (sft_dir / "basins").iterdir() if p.name.startswith("syn_teach"))
    heldout = sorted(str(p) for p in (sft_dir / "basins").iterdir() if p.name.startswith("syn_heldout"))
    model = sft_dir / "run" / "final"
    if not (model / "config.json").is_file() or not basins:
        raise SystemExit(f"{sft_dir}: no SFT run here "
                         f"(run python -m hydroagent_hpc.bench.sft_learning --out {sft_dir})")
    env = {"max_turns": turns, "max_simulations": 4, "patience": None, "stop_at_target": False}
    per_seed = []
    for seed in range(seeds):
        config = grpo_config_from_mapping({
            "basins": basins, "validation_basins": heldout, "model": str(model), "group_size": k,
            "prompts_per_step": min(2, len(basins)), "max_steps": steps, "lr": lr, "max_new_tokens": 256,
            "validate_every": steps, "seed": seed, "env": env})
        run_dir = out / f"seed{seed}"
        summary = train_grpo(config, run_dir, resume=True)
        with open(run_dir / "metrics.csv", newline="") as fh:
            rows = list(csv.DictReader(fh))
        from hydroagent_hpc.store import read_episodes

        eps = read_episodes(run_dir / "rollouts.h5")
        val = eps[eps.agent == "grpo-val"]
        before = val[val.episode_id.str.startswith("grpo-val-s00000-")]
        after = val[val.episode_id.str.startswith(f"grpo-val-s{steps:05d}-")]
        per_seed.append({"seed": seed, "reward_first_step": float(rows[0]["reward_mean"]),
                         "reward_last_step": float(rows[-1]["reward_mean"]),
                         "valid_share_first": 1 - float(rows[0]["parse_failures_mean"]) / float(rows[0]["turns_mean"]),
                         "valid_share_last": 1 - float(rows[-1]["parse_failures_mean"]) / float(rows[-1]["turns_mean"]),
                         "heldout_reward_before": float(before.total_reward.mean()),
                         "heldout_reward_after": float(after.total_reward.mean()),
                         "heldout_best_nse_before": _nse(before.best_nse.mean()),
                         "heldout_best_nse_after": _nse(after.best_nse.mean()),
                         "wall_s": summary["wall_s"]})
    keys = [k for k in per_seed[0] if k not in ("seed",)]
    mean = {key: float(np.mean([r[key] for r in per_seed if r[key] is not None]))
            if any(r[key] is not None for r in per_seed) else None for key in keys}
    result = {"steps": steps, "k": k, "seeds": per_seed, "mean": mean}
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def _nse(value: Any) -> float | None:
    return None if value is None or value != value else float(value)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hydroagent_hpc.bench.grpo_learning",
                                 description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--from", dest="sft_dir", required=True, type=Path, help="the --out of bench.sft_learning")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--turns", type=int, default=12)
    ap.add_argument("--lr", type=float, default=1e-5)
    args = ap.parse_args(argv)
    import logging

    logging.basicConfig(level=logging.WARNING)
    r = run(args.sft_dir, args.out, args.steps, args.seeds, args.k, args.turns, args.lr)
    sys.stdout.write(json.dumps(r, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
