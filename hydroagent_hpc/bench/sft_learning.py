"""Learning on CPU: ``python -m hydroagent_hpc.bench.sft_learning --out DIR [--steps N]``.

The whole first training stage, small enough for a laptop, measured the way issue 14 asks:

1. three small synthetic basins (80 km2, 10 days): two for teaching, one held out;
2. a teacher campaign: the heuristic hydrologist on the two teaching basins, ``--seeds`` seeds,
   ``--sims`` simulations each (its episodes carry the diagnosis + tool-call text an LLM writes);
   (``--overshoot P``: with probability P a move asks past its bound, so the teacher set holds
   ``clipped`` replies and how to go on; agents/heuristic.py explains why; ``--digits N``: values
   to N significant digits; ``--partial``: set_parameters sends only the values that change);
3. ``train.sft.data.build_sft_data`` (``released`` weights, no augmentation: every episode kept;
   ``--recovery P``: masked error-recovery turns, see train/sft/data.py);
4. ``train.sft.train_sft`` of the tiny offline Qwen3 for ``--steps`` steps (fp32, CPU);
5. the base (untrained) and the SFT'd model as ``hf_local`` agents on the held-out basin (greedy,
   at most ``--turns`` tool calls): the share of assistant messages that were valid tool calls,
   how many parse-failure replies were followed by a valid call (recoveries: the message right
   after one that drew a parse failure holds a call and no parse failure), the best NSE, and why
   each episode stopped.

Prints one table and writes ``DIR/result.json``. Not part of ``make bench`` (a few minutes).
``--evaluate-only --heldout N``: no training; step 5 again for the models already in ``DIR`` on
N held-out basins (the run's own first), ``DIR/eval-heldoutN.h5`` and ``DIR/result-heldoutN.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from hydroagent_hpc.campaign import campaign_from_mapping, run_campaign
from hydroagent_hpc.train.sft.config import load_sft_config

__all__ = ["run", "main"]


def run(out: Path, steps: int = 120, seeds: int = 6, sims: int = 4, turns: int = 12, teach: int = 2,
        lr: float = 3e-3, width: int | None = None, layers: int | None = None, heldout: int = 1,
        overshoot: float = 0.0, digits: int | None = None, recovery: float = 0.0,
        partial: bool = False) -> dict[str, Any]:
    from hydroagent_hpc.train.sft.data import build_sft_data
    from hydroagent_hpc.train.sft.trainer import train_sft
    from hydroagent_hpc.train.tiny import save_tiny

    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    held = _heldout_names(heldout)
    names = [(f"syn_teach{i + 1}", 7 + i) for i in range(teach)] + held
    basins = _basins(out, names)
    env = _env(sims)
    teacher = campaign_from_mapping({"name": "teacher", "basins": [basins[n] for n, _ in names[:teach]],
                                     "agents": [{"name": "heuristic", "kind": "heuristic",
                                                 **({"overshoot": overshoot} if overshoot else {}),
                                                 **({"digits": digits} if digits else {}),
                                                 **({"partial": True} if partial else {})}],
                                     "seeds": list(range(seeds)), "env": env})
    run_campaign(teacher, out / "teacher.h5", progress=False)
    report = build_sft_data([out / "teacher.h5"], out / "sft.h5", preset="released", tokenizer="tiny",
                            augment="none", max_tokens=32768, recovery=recovery)
    model_line = "model: tiny"
    if width or layers:  # a wider/deeper random model than train/tiny.py's default sizes
        from hydroagent_hpc.train.tiny import TINY_QWEN3_SIZES, build_tiny_qwen3, build_tiny_tokenizer

        w = width or int(TINY_QWEN3_SIZES["hidden_size"])
        tokenizer = build_tiny_tokenizer()
        model = build_tiny_qwen3(tokenizer, seed=0, hidden_size=w, intermediate_size=3 * w,
                                 num_hidden_layers=layers or int(TINY_QWEN3_SIZES["num_hidden_layers"]),
                                 num_attention_heads=w // 32, num_key_value_heads=max(1, w // 64), head_dim=32)
        save_tiny(out / "base", model=model, tokenizer=tokenizer)
        model_line = f"model: {(out / 'base').resolve()}"
    else:
        save_tiny(out / "base", seed=0)
    config = out / "sft.yaml"
    config.write_text(f"data: sft.h5\n{model_line}\nlr: {lr}\nweight_decay: 0.0\nwarmup_steps: 10\n"
                      f"max_steps: {steps}\nmicro_batch_size: 1\ngrad_accum: 1\nmax_grad_norm: 1.0\nseed: 0\n"
                      f"dtype: fp32\nfsdp: false\nactivation_checkpointing: false\nsave_every: 100000\n"
                      f"log_every: 10\nbucket_by_length: true\n")
    t_sft = time.perf_counter()
    summary = train_sft(load_sft_config(config), out / "run", resume=True)
    sft_s = time.perf_counter() - t_sft
    losses = [float(line.split(",")[1]) for line in (out / "run" / "metrics.csv").read_text().splitlines()[1:]]
    policies = _evaluate(out, [basins[n] for n, _ in held], env, turns, out / "eval.h5")
    result = {"teacher_episodes": report.kept, "sft_steps": steps, "model": model_line.split(": ", 1)[1],
              "width": width, "layers": layers, "overshoot": overshoot, "digits": digits, "partial": partial,
              "recovery": recovery, "recovery_turns": report.recovery_turns,
              "teach_basins": teach, "seeds": seeds, "heldout_basins": heldout,
              "loss_first": losses[0], "loss_last": losses[-1], "sft_s": round(sft_s, 1),
              "tokens_per_s": summary.get("tokens_per_s"), "policies": policies,
              "total_s": round(time.perf_counter() - t0, 1)}
    (out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def _heldout_names(heldout: int) -> list[tuple[str, int]]:
    return [("syn_heldout", 6)] + [(f"syn_heldout{i + 1}", 1000 + i) for i in range(1, heldout)]


def _basins(out: Path, names: list[tuple[str, int]]) -> dict[str, str]:
    from hydroagent_hpc.sim.synth.basins import synthesize_basin

    basins = {}
    for name, seed in names:
        folder = out / "basins" / name
        if not (folder / "control.txt").exists():
            synthesize_basin(folder, name=name, area_km2=80.0, window_days=10, warmup_days=3, seed=seed,
                             start="2021-07-01")
        basins[name] = str(folder)
    return basins


def _env(sims: int) -> dict[str, Any]:
    return {"preset": "paper", "protocol": "turns", "max_simulations": sims, "patience": None, "stop_at_target": False}


def _evaluate(out: Path, basins: list[str], env: dict[str, Any], turns: int, store: Path) -> dict[str, dict[str, Any]]:
    """The base (``out/base``) and the SFT'd model (``out/run/final``) as greedy ``hf_local`` agents."""

    agent = {"kind": "hf_local", "greedy": True, "max_new_tokens": 256}
    evaluation = campaign_from_mapping({
        "name": "eval", "basins": basins, "seeds": [0], "env": {**env, "max_turns": turns},
        "agents": [{"name": "base", "path": str(out / "base"), **agent},
                   {"name": "sft", "path": str(out / "run" / "final"), **agent}]})
    run_campaign(evaluation, store, progress=False)
    return score_policies(store)


def evaluate_again(out: Path, heldout: int, sims: int = 4, turns: int = 12) -> dict[str, Any]:
    """The models of a finished run in ``out`` on ``heldout`` held-out basins (the run's own ones first,
    then more; the same evaluation and scores as :func:`run`): ``out/eval-heldoutN.h5`` and
    ``out/result-heldoutN.json``."""
    if not (out / "run" / "final").is_dir():
        raise SystemExit(f"{out}: no finished run (run/final/ is missing)")
    t0 = time.perf_counter()
    basins = _basins(out, _heldout_names(heldout))
    policies = _evaluate(out, list(basins.values()), _env(sims), turns, out / f"eval-heldout{heldout}.h5")
    result = {"heldout_basins": heldout, "policies": policies, "total_s": round(time.perf_counter() - t0, 1)}
    (out / f"result-heldout{heldout}.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def score_policies(store: Path) -> dict[str, dict[str, Any]]:
    """Per agent of an evaluation store: messages, the valid-call share, parse-failure messages and
    recoveries (the next message holds a call and no parse failure), mean best NSE, stop reasons."""
    from hydroagent_hpc.store import read_episodes, read_turns

    episodes, turn_rows = read_episodes(store), read_turns(store)
    policies: dict[str, dict[str, Any]] = {}
    for agent_name, eps in episodes.groupby("agent"):
        n_messages = n_failed = n_recovered = 0
        for _, ep in eps.iterrows():
            rows = turn_rows[turn_rows.episode_id == ep.episode_id]
            failed = {int(m) for m in rows[rows.kind == "parse_failure"].message_index}
            called = {int(m) for m in rows[rows.kind == "tool"].message_index}
            n_messages += int(rows.message_index.nunique())
            n_failed += len(failed)
            n_recovered += sum(1 for m in failed if m + 1 in called and m + 1 not in failed)
        nses = [float(v) for v in eps.best_nse if v == v]
        policies[str(agent_name)] = {"episodes": int(len(eps)), "messages": n_messages,
                                     "valid_call_share": float(1 - n_failed / max(1, n_messages)),
                                     "parse_failure_messages": n_failed, "recoveries": n_recovered,
                                     "best_nse": float(sum(nses) / len(nses)) if nses else None,
                                     "scored_episodes": len(nses),
                                     "stop_reason": ";".join(sorted(str(r) for r in eps.stop_reason))}
    return policies


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hydroagent_hpc.bench.sft_learning",
                                 description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--sims", type=int, default=4)
    ap.add_argument("--turns", type=int, default=12)
    ap.add_argument("--teach", type=int, default=2, help="number of teaching basins")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--heldout", type=int, default=1, help="number of held-out evaluation basins")
    ap.add_argument("--width", type=int, help="hidden size of a larger random model (default: train/tiny.py's 128)")
    ap.add_argument("--layers", type=int, help="layers of a larger random model (default: train/tiny.py's 4)")
    ap.add_argument("--overshoot", type=float, default=0.0,
                    help="teacher noise: probability that a heuristic move asks past its bound (agents/heuristic.py)")
    ap.add_argument("--digits", type=int, help="teacher: significant digits of its values (default 6 decimals)")
    ap.add_argument("--partial", action="store_true",
                    help="teacher: set_parameters sends only the values that change (agents/heuristic.py)")
    ap.add_argument("--recovery", type=float, default=0.0,
                    help="SFT data: probability of a masked error-recovery turn before each teacher call "
                         "(train/sft/data.py)")
    ap.add_argument("--evaluate-only", action="store_true",
                    help="no training: evaluate the base and final models already in --out on --heldout basins "
                         "(--sims, --turns as the run's); writes eval-heldoutN.h5 and result-heldoutN.json")
    args = ap.parse_args(argv)
    if args.evaluate_only:
        r = evaluate_again(args.out, args.heldout, args.sims, args.turns)
        print(f"evaluation of {args.out} on {args.heldout} held-out basins in {r['total_s']} s")
        _print_policies(r["policies"])
        return 0
    r = run(args.out, args.steps, args.seeds, args.sims, args.turns, args.teach, args.lr, args.width, args.layers,
            args.heldout, args.overshoot, args.digits, args.recovery, args.partial)
    print(f"SFT {r['sft_steps']} steps in {r['sft_s']} s: loss {r['loss_first']:.3f} -> {r['loss_last']:.3f}")
    _print_policies(r["policies"])
    return 0


def _print_policies(policies: dict[str, dict[str, Any]]) -> None:
    print(f"{'policy':<8} {'messages':>8} {'valid calls':>11} {'recovered':>9} {'mean best NSE':>13}  stop")
    for name, p in policies.items():
        nse = "n/a" if p["best_nse"] is None else f"{p['best_nse']:.3f}"
        rec = f"{p['recoveries']}/{p['parse_failure_messages']}"
        print(f"{name:<8} {p['messages']:>8} {p['valid_call_share']:>11.0%} {rec:>9} {nse:>13}  {p['stop_reason']}")


if __name__ == "__main__":
    raise SystemExit(main())
