"""``python -m hydroagent_hpc.bench`` (``make bench``): simulator, metrics, report, HPC, queued runs, SFT, GRPO.

Prints Markdown tables; every speed is a ratio against a baseline measured in the same run.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from hydroagent_hpc.bench import grpo as gbench
from hydroagent_hpc.bench import hpc as hbench
from hydroagent_hpc.bench import queued_runs, scaling
from hydroagent_hpc.bench import train as tbench
from hydroagent_hpc.bench.fidelity import fidelity_rows
from hydroagent_hpc.bench.simulator import PUBLISHED_EF5_S, bench_case, peak_rss_mb

ROOT = Path(__file__).resolve().parents[2]


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hydroagent_hpc.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--basins", default=str(ROOT / "results" / "demo" / "basins"),
                    help="where the demo basins are (built if missing)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--skip-demo", action="store_true", help="only the reference case")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    out = sys.stdout.write

    cases: list[tuple[str, Path]] = []
    ref = ROOT / "tests" / "data" / "ef5-reference" / "dendritic" / "control_a.txt"  # the golden EF5 cases
    if ref.exists():
        cases.append(("ref dendritic/control_a", ref))
    if not args.skip_demo:
        from hydroagent_hpc.sim.synth.basins import build_demo_basins

        for control in build_demo_basins(args.basins):
            cases.append((f"demo {control.parent.name}", control))

    if ref.exists():

        out("## Fidelity against EF5 1.2.3 (unrounded ours vs EF5's printed 2-decimal values)\n\n")
        out("| case | gauge | rows | max dQ m3/s | at Q | max dSM % | max dFast | max dSlow |\n"
            "|---|---|---|---|---|---|---|---|\n")
        for r in fidelity_rows(ref.parent.parent):
            out(f"| {r['case']} | {r['gauge']} | {r['rows']} | {r['max_dQ']:.4f} | {r['at_Q']:.2f} | "
                f"{r['max_dSM']:.4f} | {r['max_dFast']:.5f} | {r['max_dSlow']:.5f} |\n")
        out("\n")

    if os.environ.get("HYDROAGENT_EF5"):
        from hydroagent_hpc.bench import differential

        out("## Differential sweep against the real EF5 (`python -m hydroagent_hpc.bench.differential`, "
            "seeds 1000-1099)\n\n")
        out(differential.summary(differential.sweep(range(1000, 1100))) + "\n\n")
        sys.stdout.flush()

    out("## Simulator (embedded engine; EF5 with OMP_NUM_THREADS=1)\n\n")
    out("| case | cells | steps | kernel | load cold s | load warm s | run s | run numba s | Mcell-steps/s | batch8 s "
        "| batch8/run | process s | EF5 process s | EF5 process / run | process / EF5 process | forcing MB |\n")
    out("|---" * 16 + "|\n")
    for label, control in cases:
        t = bench_case(control, label, args.repeats)
        ef5_ratio = t.ef5_process_s / t.run_s if t.ef5_process_s else None
        proc_ratio = t.process_s / t.ef5_process_s if t.ef5_process_s else None
        out(f"| {label} | {t.cells} | {t.steps} | {t.kernel} | {t.load_cold_s:.3f} | {t.load_warm_s:.3f} | "
            f"{t.run_s:.4f} | {_fmt(t.run_numba_s, '.4f')} | {t.cell_steps_per_s / 1e6:.1f} | {t.batch8_s:.4f} | "
            f"{t.batch_ratio:.2f} | {t.process_s:.3f} | {_fmt(t.ef5_process_s)} | {_fmt(ef5_ratio, '.1f')} | "
            f"{_fmt(proc_ratio, '.2f')} | {t.forcing_mb:.1f} |\n")
        sys.stdout.flush()
    if not args.skip_demo:

        out("\n")
        sys.stdout.flush()
        scaling.main(["--out", str(ROOT / "results" / "bench-scaling")])
    if not os.environ.get("HYDROAGENT_EF5"):
        out("\nEF5 columns: no binary configured (set HYDROAGENT_EF5 to measure EF5 in the same run). "
            "Published EF5 1.2.3 wall time for dendritic/control_a (whole process, ef5-reference README): "
            f"{PUBLISHED_EF5_S['dendritic/control_a.txt']} s -- published, not measured here.\n")
    out(f"\nPeak resident memory of this benchmark process: {peak_rss_mb():.0f} MB\n")

    try:
        from hydroagent_hpc.bench import metrics as mbench
    except ImportError:
        return 0
    out("\n## Metrics\n\n| benchmark | baseline | s per call | ratio vs baseline |\n|---|---|---|---|\n")
    for row in mbench.run():
        out(f"| {row['name']} | {row['baseline']} | {row['seconds_per_call']:.6f} | {row['ratio_vs_baseline']:.1f} |\n")

    from hydroagent_hpc.bench import report as rbench

    out("\n## Report (a campaign of 1,000 episodes: `hydroagent report`)\n\n")
    out(rbench.markdown(rbench.run()))


    hpc_control = next((str(c) for _, c in cases if c.parent.name == "syn_01403060"), None)
    out("\n## HPC pools and Slurm (`python -m hydroagent_hpc.bench.hpc`)\n\n")
    out(hbench.markdown(hpc_control or hbench.default_control()))

    out("\n## Rollout-style queued runs: a basin's waiting runs in one batch (`python -m "
        "hydroagent_hpc.bench.queued_runs`)\n\n")
    queued = next((c for _, c in cases if c.parent.name == "syn_02338660"), None)
    if queued is not None:

        out(queued_runs.markdown(queued_runs.measure(queued)))
    else:
        out("(skipped with --skip-demo: it runs the smallest demo basin)\n")
    sys.stdout.flush()


    out("\n## SFT steps on the CPU, tiny Qwen3 (`python -m hydroagent_hpc.bench.train`; `--gpu` for the 4B shape)\n\n")
    out(tbench.markdown(tbench.cpu_rows()))
    from hydroagent_hpc.train.measure.grpo_throughput import EpisodeShape

    out("\n## A GRPO step's parts on the CPU, tiny Qwen3 (`python -m hydroagent_hpc.bench.train --grpo`; "
        "`--gpu --grpo` for the 4B shape and the paper-sized step)\n\n")
    out(tbench.grpo_markdown(tbench.grpo_result(False, EpisodeShape(), sim_s=1.0, sim_slots=32)))


    out("\n## GRPO on the CPU, tiny Qwen3 (`python -m hydroagent_hpc.bench.grpo --quick`; without `--quick`: "
        "K=8, 12 calls)\n\n")
    import tempfile

    demo_dirs = [c.parent for _, c in cases if c.parent.name.startswith("syn_")]
    if demo_dirs:
        schedule = gbench.schedule_comparison(demo_dirs, k=4, turns=6)
        with tempfile.TemporaryDirectory(prefix="hydroagent-bench-grpo-") as tmp:
            out(gbench.markdown(schedule, gbench.step_breakdown(Path(tmp), steps=1)))
    else:
        out("(skipped with --skip-demo: the schedule comparison plays the demo basins)\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
