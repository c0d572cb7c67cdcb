"""The model card (``README.md``) of a run's ``final/`` folder, for SFT and GRPO alike.

:func:`~hydroagent_hpc.train.finite.save_final` writes it into the temporary folder with the weights
and the tokenizer, so ``final/`` appears with its card or not at all. Everything comes from the run
folder (``final/``'s parent) as the trainer left it before the final save:

- ``config.yaml`` (:func:`~hydroagent_hpc.train.rundir.write_run_config`): the recipe (``sft`` when the
  config names ``data``, ``grpo`` when it names ``basins``), the base model, the whole config;
- the data: SFT's data file with its SHA-256 and preset (the file's ``preset`` attribute); GRPO's
  training and held-out basins and its environment preset;
- held-out results: the rows of ``metrics.csv`` with a finite ``val_reward_mean`` or
  ``val_best_nse_mean`` (GRPO validation, greedy, on ``validation_basins``);
- provenance: the git commit, the hydroagent-hpc version and the time of this writing, and the
  provenance the run recorded when it started.

A missing or unreadable input is written as such into the card; it never stops the final save.
"""

from __future__ import annotations

import csv
import logging
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from hydroagent_hpc import __version__
from hydroagent_hpc.provenance import git_commit
from hydroagent_hpc.sim.manifest import file_sha256

log = logging.getLogger(__name__)

__all__ = ["CARD_NAME", "VALIDATION_COLUMNS", "model_card", "write_model_card"]

CARD_NAME = "README.md"
#: The ``metrics.csv`` columns of a GRPO validation row.
VALIDATION_COLUMNS = ("val_reward_mean", "val_best_nse_mean")


def _run_config(run_dir: Path) -> tuple[dict[str, Any], str, str]:
    """(the record of ``config.yaml``, its text, a problem or "")."""
    path = run_dir / "config.yaml"
    try:
        text = path.read_text(encoding="utf-8")
        record = yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        return {}, "", f"{path} could not be read ({type(exc).__name__})"
    if not isinstance(record, dict) or not isinstance(record.get("config"), dict):
        return {}, text, f"{path} holds no run config"
    return record, text, ""


def _data_file(path: str) -> dict[str, Any]:
    """The SFT data file's SHA-256 and build attributes (or the problem reading it)."""
    import h5py

    info: dict[str, Any] = {"path": path}
    try:
        info["sha256"] = file_sha256(path)
        with h5py.File(path, "r") as f:
            for key in ("preset", "augment", "tokenizer", "git_commit", "created_utc"):
                value = f.attrs.get(key)
                if value is not None:
                    info[key] = value.decode() if isinstance(value, bytes) else str(value)
    except OSError as exc:
        info["problem"] = f"could not be read ({exc.strerror or type(exc).__name__})"
    return info


def _validation_rows(run_dir: Path) -> list[dict[str, str]]:
    """The ``metrics.csv`` rows that hold a validation result (GRPO), in step order."""
    try:
        with open(run_dir / "metrics.csv", newline="", encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh))
    except (OSError, UnicodeDecodeError, csv.Error):
        return []

    def finite(v: str | None) -> bool:
        try:
            return v is not None and math.isfinite(float(v))
        except ValueError:
            return False

    return [r for r in rows if any(finite(r.get(c)) for c in VALIDATION_COLUMNS)]


def _is_hub_id(model: str) -> bool:
    """A Hugging Face hub id (``org/name``), not a local folder or the built-in ``tiny``."""
    return model.count("/") == 1 and not model.startswith((".", "/", "~")) and not Path(model).exists()


def model_card(run_dir: str | Path) -> str:
    """The card of ``run_dir``'s final model (see the module doc)."""
    run_dir = Path(run_dir)
    record, config_text, problem = _run_config(run_dir)
    config: dict[str, Any] = record.get("config") or {}
    recipe = "sft" if "data" in config else "grpo" if "basins" in config else "unknown"
    model = str(config.get("model", "unknown"))
    base = ("the built-in tiny Qwen3 (hydroagent_hpc.train.tiny, random initialisation)" if model == "tiny"
            else f"`{model}`")
    front = ["---", "library_name: transformers", "pipeline_tag: text-generation"]
    if _is_hub_id(model):
        front.append(f"base_model: {model}")
    front += ["tags:", "- hydroagent-hpc", f"- {recipe}", "- tool-calling", "- hydrology", "---", ""]
    lines = [f"# hydroagent-hpc {recipe.upper()} policy: a CREST/EF5 calibration agent", "",
             f"Trained by `hydroagent train {recipe}` (run folder `{run_dir.resolve()}`) from {base}. "
             "A causal language model that calibrates the CREST/EF5 hydrologic model through tool calls "
             "(set_parameters, run_simulation, evaluate) in Qwen3's Hermes `<tool_call>` format.", ""]
    lines += ["## Data and recipe", ""]
    if recipe == "sft":
        data = _data_file(str(config.get("data")))
        lines += [f"- recipe: sft (assistant-only, per-example-weighted SFT), data preset "
                  f"`{data.get('preset', 'unknown')}`" + (f", augment `{data['augment']}`" if "augment" in data
                                                          else ""),
                  f"- data file: `{data['path']}`",
                  f"- data SHA-256: `{data.get('sha256', 'unknown')}`" + (f" ({data['problem']})"
                                                                         if "problem" in data else "")]
        if "tokenizer" in data:
            lines.append(f"- data tokenizer: `{data['tokenizer']}`")
    elif recipe == "grpo":
        lines += [f"- recipe: grpo (the simulator as the verifier), environment preset "
                  f"`{config.get('preset', 'unknown')}`",
                  f"- training basins: {', '.join(f'`{b}`' for b in config.get('basins') or []) or 'none'}",
                  "- held-out basins: " + (", ".join(f"`{b}`" for b in config.get("validation_basins") or [])
                                           or "none")]
    else:
        lines.append(f"- recipe unknown: {problem or 'the config names neither data (sft) nor basins (grpo)'}")
    lines += ["", "## Held-out results", ""]
    rows = _validation_rows(run_dir)
    if rows:
        lines += ["Greedy validation episodes on the held-out basins (metrics.csv):", "",
                  "| step | " + " | ".join(VALIDATION_COLUMNS) + " |", "|---|" + "---|" * len(VALIDATION_COLUMNS)]
        lines += [f"| {r.get('step', '')} | " + " | ".join(r.get(c) or "" for c in VALIDATION_COLUMNS) + " |"
                  for r in rows]
    else:
        lines.append("None recorded by this run (SFT runs and GRPO runs without validation_basins and "
                     "validate_every hold none); evaluate with `hydroagent train eval FOLDER --basins ...`.")
    found = record.get("provenance")
    run_prov: dict[str, Any] = found if isinstance(found, dict) else {}
    lines += ["", "## Provenance", "",
              f"- written {datetime.now(timezone.utc).isoformat(timespec='seconds')} by hydroagent-hpc "
              f"{__version__}, git commit `{git_commit()}`",
              f"- the run started with git commit `{run_prov.get('git_commit', 'unknown')}` at "
              f"{run_prov.get('created_utc', 'unknown')}"]
    versions = record.get("versions")
    if isinstance(versions, dict) and versions:
        lines.append("- packages: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    lines += ["", "## Use", "", "```python",
              "from transformers import AutoModelForCausalLM, AutoTokenizer",
              'model = AutoModelForCausalLM.from_pretrained("FOLDER")',
              'tokenizer = AutoTokenizer.from_pretrained("FOLDER")',
              "text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, "
              "tokenize=False)",
              "```", "", "Evaluate on basins: `hydroagent train eval FOLDER --basins BASIN_DIR ... --budget N`.", "",
              "## Config", ""]
    if config_text:
        lines += ["The run's `config.yaml`:", "", "```yaml", config_text.rstrip("\n"), "```"]
    else:
        lines.append(problem or "no config.yaml")
    return "\n".join(front + lines) + "\n"


def write_model_card(folder: str | Path, run_dir: str | Path) -> Path:
    """Write :func:`model_card` of ``run_dir`` as ``folder/README.md`` (``folder``: the temporary final
    folder, renamed into place with the weights by the caller)."""
    path = Path(folder) / CARD_NAME
    path.write_text(model_card(run_dir), encoding="utf-8")
    return path
