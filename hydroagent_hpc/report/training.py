"""Training curves from the trainers' ``metrics.csv`` files (one row per optimizer step).

:func:`read_metrics` reads one file into a DataFrame (numbers as floats, missing values NaN);
:func:`training_figure` draws the SFT loss per step and the GRPO reward per step with its parts
(the per-turn part and the terminal part), the best NSE and the parse failures of the rollouts.
Either run may be absent (``None``): its panels say so instead of drawing.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from hydroagent_hpc.report.figures import new_figure, save_figure, style

__all__ = ["read_metrics", "training_figure", "GRPO_PARTS"]

#: GRPO columns drawn as the reward and its parts: (column, label).
GRPO_PARTS = (("reward_mean", "reward (mean)"), ("turn_reward_mean", "per-turn part"),
              ("terminal_mean", "terminal part"))


def read_metrics(path: str | Path) -> pd.DataFrame | None:
    """The rows of a ``metrics.csv`` (numeric columns as floats), or None when the file is absent or empty."""
    p = Path(path)
    if not p.is_file():
        return None
    df = pd.read_csv(p)
    if df.empty or "step" not in df.columns:
        return None
    for col in df.columns:
        if col != "stop_reasons":
            df[col] = pd.to_numeric(df[col], errors="coerce")
    return df.sort_values("step", kind="stable").reset_index(drop=True)


def training_figure(sft: pd.DataFrame | None, grpo: pd.DataFrame | None, path: Path) -> None:
    """Three panels: SFT loss; GRPO reward and its parts; GRPO best NSE and parse failures per episode."""
    with style():
        fig = new_figure(11.0, 3.2)
        ax_sft, ax_rew, ax_nse = fig.subplots(1, 3)
        if sft is not None and "loss" in sft.columns:
            ax_sft.plot(sft["step"], sft["loss"], marker=".", color="tab:blue")
        else:
            ax_sft.text(0.5, 0.5, "no SFT metrics", ha="center", va="center", transform=ax_sft.transAxes)
        ax_sft.set(title="SFT: weighted loss per step", xlabel="optimizer step", ylabel="loss")
        if grpo is not None:
            for (col, label), color in zip(GRPO_PARTS, ("black", "tab:orange", "tab:green")):
                if col in grpo.columns:
                    ax_rew.plot(grpo["step"], grpo[col], marker="o", color=color, label=label)
            ax_rew.legend(loc="best")
            if "best_nse_mean" in grpo.columns:
                ax_nse.plot(grpo["step"], grpo["best_nse_mean"], marker="o", color="tab:purple",
                            label="best NSE (mean over rollouts)")
            if "parse_failures_mean" in grpo.columns:
                twin = ax_nse.twinx()
                twin.plot(grpo["step"], grpo["parse_failures_mean"], marker="s", color="tab:red", linestyle="--",
                          label="parse failures per episode")
                twin.set_ylabel("parse failures per episode", color="tab:red")
                twin.grid(False)
            ax_nse.legend(loc="upper left")
        else:
            for ax in (ax_rew, ax_nse):
                ax.text(0.5, 0.5, "no GRPO metrics", ha="center", va="center", transform=ax.transAxes)
        ax_rew.set(title="GRPO: reward per step and its parts", xlabel="step", ylabel="reward per episode")
        ax_nse.set(title="GRPO rollouts: best NSE, parse failures", xlabel="step", ylabel="best NSE")
        save_figure(fig, path)
