"""Live metrics (train/live.py): TensorBoard event files and an offline W&B run written from the same rows
as metrics.csv, once per step across a resume; off unless asked; the progress display.

Real parts: real tiny SFT and GRPO runs (the tiny offline Qwen3, real data files, real basins), the real
``SummaryWriter`` read back with TensorBoard's own ``EventAccumulator``, and a real W&B run in offline mode
(``WANDB_MODE=offline``, no network) whose ``.wandb`` file is read back record by record.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import shutil
import struct
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tensorboard")

from helpers.sft import short_trajectories, write_sft_data  # noqa: E402
from helpers.threads import one_torch_thread  # noqa: E402, F401  (autouse fixture)
from hydroagent_hpc.errors import ConfigError  # noqa: E402
from hydroagent_hpc.train import live, tiny  # noqa: E402
from hydroagent_hpc.train.grpo.trainer import train_grpo  # noqa: E402
from hydroagent_hpc.train.sft.trainer import load_sft_config, train_sft  # noqa: E402

#: metrics.csv writes 8 significant digits, TensorBoard keeps float32.
REL = 2e-7




@pytest.fixture
def offline_wandb(monkeypatch, tmp_path):
    """W&B as a batch job without a network uses it: offline, quiet, no key."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


@pytest.fixture(scope="module")
def sft_data(tmp_path_factory) -> Path:
    tok = tiny.build_tiny_tokenizer()
    tmp = tmp_path_factory.mktemp("live-data")
    return write_sft_data(tmp / "data.h5", short_trajectories(tok, 4, seed=1), [1.0, 0.5, 0.8, 0.3])


def _sft_config(path: Path, data: Path, **kw: Any) -> Path:
    values = {"data": str(data), "model": "tiny", "lr": "3.0e-3", "max_steps": 4, "save_every": 2, **kw}
    path.write_text("".join(f"{k}: {v}\n" for k, v in values.items()))
    return path


def _csv_rows(run: Path) -> list[dict[str, str]]:
    with open(run / "metrics.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def _expected(kind: str, rows: list[dict[str, str]]) -> dict[str, dict[int, float]]:
    """metrics.csv as tag -> {step: value}, the numeric finite values only."""
    out: dict[str, dict[int, float]] = {}
    for r in rows:
        for column, text in r.items():
            if column == "step":
                continue
            try:
                value = float(text)
            except ValueError:
                continue
            if math.isfinite(value):
                out.setdefault(live.tag(kind, column), {})[int(r["step"])] = value
    return out


def _tensorboard(run: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def _wandb_records(path: Path) -> list[bytes]:
    """The records of a ``.wandb`` file: W&B's framing of LevelDB's log format (a 7-byte file header
    ``:W&B``, 0xBEE1, version; then 32 KiB blocks of records, each ``crc32 | length (2) | type (1)``,
    types 1 full, 2 first, 3 middle, 4 last of a record split across blocks)."""
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a W&B log"
    out, pos, part = [], 7, b""
    block = 32768
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # the rest of a block too short for a header is padding
            pos += left
            continue
        length, kind = struct.unpack("<HB", data[pos + 4:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        part += chunk
        if kind in (1, 4):
            out.append(part)
            part = b""
    return out


def _wandb_history(run_dir: Path) -> dict[str, dict[str, dict[int, float]]]:
    """Per offline run folder under ``RUN/wandb``: the logged history as tag -> {step: value}."""
    from wandb.proto import wandb_internal_pb2 as pb

    runs: dict[str, dict[str, dict[int, float]]] = {}
    for f in sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb")):
        history: dict[str, dict[int, float]] = {}
        for raw in _wandb_records(f):
            rec = pb.Record()
            rec.ParseFromString(raw)
            if rec.WhichOneof("record_type") != "history":
                continue
            items = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in rec.history.item}
            step = int(items.pop("_step", rec.history.step.num))
            for k, v in items.items():
                if not k.startswith("_"):
                    history.setdefault(k, {})[step] = v
        runs[f.parent.name] = history
    return runs


def _assert_matches(got: dict[str, dict[int, float]], expected: dict[str, dict[int, float]]) -> None:
    assert set(got) == set(expected), sorted(set(got) ^ set(expected))
    for name, by_step in expected.items():
        assert sorted(got[name]) == sorted(by_step), name
        for step, value in by_step.items():
            assert got[name][step] == pytest.approx(value, rel=REL, abs=1e-12), (name, step)


def test_sft_rows_reach_tensorboard_and_offline_wandb_and_a_resume_logs_each_step_once(
        sft_data, tmp_path, offline_wandb, caplog, monkeypatch):
    run = tmp_path / "run"
    cfg = _sft_config(tmp_path / "c.yaml", sft_data, report_to="[tensorboard, wandb]", run_name="first")
    monkeypatch.setattr(live, "LOG_EVERY_S", 0.0)  # a batch log (stderr is no terminal): a progress line per step
    with caplog.at_level(logging.INFO, logger="hydroagent_hpc.train.live"):
        train_sft(load_sft_config(cfg), run, resume=False)
    first = _csv_rows(run)
    assert [int(r["step"]) for r in first] == [1, 2, 3, 4]
    expected = _expected("sft", first)
    assert {"sft/loss", "sft/tokens_per_s", "sft/lr", "sft/grad_norm"} <= set(expected)

    board = _tensorboard(run)
    _assert_matches({t: dict(v) for t, v in board.items()}, expected)
    wandb_runs = _wandb_history(run)
    assert len(wandb_runs) == 1 and (run / "wandb" / "run-id").is_file()
    _assert_matches(next(iter(wandb_runs.values())), expected)
    progress = [r.getMessage() for r in caplog.records if r.name == "hydroagent_hpc.train.live"
                and "ETA" in r.getMessage()]
    assert len(progress) == 4 and progress[-1].startswith("sft: step 4/4 (100%)") and "tokens/s" in progress[-1]

    # the state a kill leaves after step 4's row and before its checkpoint: step 2 is the last checkpoint,
    # steps 3 and 4 were logged and run again; where the metrics go may change on resume (run_name)
    shutil.rmtree(run / "checkpoints" / "step-4")
    shutil.rmtree(run / "final")
    (run / "checkpoints" / "latest").write_text("step-2\n")
    cfg = _sft_config(tmp_path / "c.yaml", sft_data, report_to="[tensorboard, wandb]", run_name="resumed")
    summary = train_sft(load_sft_config(cfg), run, resume=True)
    assert summary["resumed_from_step"] == 2
    rows = _csv_rows(run)
    assert [int(r["step"]) for r in rows] == [1, 2, 3, 4]
    board = _tensorboard(run)
    assert all([s for s, _ in v] == [1, 2, 3, 4] for v in board.values()), board["sft/loss"]  # each step once
    _assert_matches({t: dict(v) for t, v in board.items()}, _expected("sft", rows))
    wandb_runs = _wandb_history(run)
    assert len(wandb_runs) == 2  # the same run id continued: the resumed part logs only steps 3 and 4
    assert len({name.rsplit("-", 1)[1] for name in wandb_runs}) == 1
    resumed = wandb_runs[max(wandb_runs)]
    _assert_matches(resumed, _expected("sft", [r for r in rows if int(r["step"]) > 2]))


def test_off_by_default_writes_no_live_metrics(sft_data, tmp_path, offline_wandb):
    run = tmp_path / "run"
    cfg = load_sft_config(_sft_config(tmp_path / "c.yaml", sft_data, max_steps=1))
    assert cfg.report_to == ()
    train_sft(cfg, run, resume=False)
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "config.yaml", "final", "metrics.csv"]


def test_a_missing_library_is_one_line_naming_the_extra_before_anything_is_written(sft_data, tmp_path,
                                                                                 monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # how Python marks a module that cannot be imported
    cfg = load_sft_config(_sft_config(tmp_path / "c.yaml", sft_data, report_to="[tensorboard, wandb]"))
    with pytest.raises(ConfigError) as err:
        train_sft(cfg, tmp_path / "run", resume=False)
    assert err.value.message == "report_to: wandb is asked for but the wandb package is not installed"
    assert err.value.fix.startswith("pip install 'hydroagent-hpc[wandb]'")
    assert not (tmp_path / "run" / "config.yaml").exists() and not (tmp_path / "run" / "tensorboard").exists()


def test_report_to_is_checked_like_every_key(sft_data, tmp_path):
    path = _sft_config(tmp_path / "c.yaml", sft_data, report_to="[tensorbord]")
    with pytest.raises(ConfigError, match=r"c\.yaml:6: report_to\[0\]: 'tensorbord' is not one of tensorboard, wandb"):
        load_sft_config(path)
    path = _sft_config(tmp_path / "c.yaml", sft_data, report_to="[wandb, wandb]")
    with pytest.raises(ConfigError, match=r"listed twice"):
        load_sft_config(path)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_a_bar_with_tokens_per_s_on_a_terminal_and_log_lines_otherwise(caplog):
    term = _Terminal()
    bar = live.Progress("sft", total=10, initial=2, stream=term)
    for step in (3, 4):
        bar.update({"step": step, "tokens": 1000, "loss": 2.5})
    shown = term.getvalue()
    bar.close()
    assert "4/10" in shown and "tok/s" in shown and "loss 2.5" in shown  # tqdm's own ETA is in the bar

    plain = io.StringIO()
    with caplog.at_level(logging.INFO, logger="hydroagent_hpc.train.live"):
        quiet = live.Progress("grpo", total=5, initial=0, stream=plain, every_s=3600.0)
        for step in range(1, 6):
            quiet.update({"step": step, "tokens": 10, "reward_mean": 0.25})
        quiet.close()
    lines = [r.getMessage() for r in caplog.records]
    assert plain.getvalue() == ""  # no bar drawn into a log file
    assert len(lines) == 1 and lines[0].startswith("grpo: step 5/5 (100%)") and "reward 0.25" in lines[0]


def test_grpo_rows_and_step_phases_reach_tensorboard(grpo_basins, tmp_path):
    """A one-step tiny GRPO run (real environment and simulator) with report_to: [tensorboard]."""
    values = {"basins": f"[{grpo_basins / 'b1'}]", "validation_basins": f"[{grpo_basins / 'v1'}]",
              "validate_every": 1, "group_size": 2, "prompts_per_step": 1, "max_steps": 1, "max_new_tokens": 8,
              "generation_batch": 2, "env": "{max_turns: 1}", "report_to": "[tensorboard]"}
    path = tmp_path / "grpo.yaml"
    path.write_text("".join(f"{k}: {v}\n" for k, v in values.items()))
    from hydroagent_hpc.train.grpo.config import load_grpo_config

    train_grpo(load_grpo_config(path), tmp_path / "run", resume=False)
    rows = _csv_rows(tmp_path / "run")
    board = {t: dict(v) for t, v in _tensorboard(tmp_path / "run").items()}
    phases = {t: v for t, v in board.items() if t.startswith("timeline/")}
    _assert_matches({t: v for t, v in board.items() if not t.startswith("timeline/")}, _expected("grpo", rows))
    for name in ("grpo/reward_mean", "grpo/adv_std", "grpo/kl", "grpo/entropy", "grpo/clip_fraction",
                 "grpo/degenerate_groups", "grpo/val_reward_mean", "grpo/simulation_s"):
        assert name in board, name
    assert {"timeline/rank0/generate_s", "timeline/rank0/train_s", "timeline/rank0/validate_s"} <= set(phases)
    assert 0 < phases["timeline/rank0/train_s"][1] <= float(rows[0]["step_s"])


def test_an_evaluation_summary_reaches_offline_wandb_at_the_runs_last_step(tmp_path, offline_wandb):
    """``train eval --report-to wandb`` on a run's ``final/``: one offline W&B run under
    ``RUN/eval-<store>/wandb`` holding the summary at the run's last step."""
    pytest.importorskip("wandb")
    from hydroagent_hpc.train.live import EvalLiveSettings, report_evaluation

    run = tmp_path / "run"
    (run / "final").mkdir(parents=True)
    (run / "metrics.csv").write_text("step,loss\n1,2.5\n2,2.0\n3,1.5\n")
    values = {"eval/best_nse_mean": 0.5, "eval/valid_calls": 0.75, "eval/best_nse/syn_small": 0.25}
    folder = report_evaluation(values, EvalLiveSettings(report_to=("wandb",)), str(run / "final"), tmp_path / "held.h5")
    assert folder == run / "eval-held"
    runs = _wandb_history(folder)
    assert len(runs) == 1
    _assert_matches(next(iter(runs.values())), {k: {3: v} for k, v in values.items()})
