"""The SFT trainer (train/sft/trainer.py): weighted loss, accumulation, ranks, exact resume, errors.

Real parts throughout: the tiny offline Qwen3, real HDF5 data files (short conversations tokenised
by the real trajectory builder, and one teacher set from a real heuristic campaign), real
subprocesses killed with real signals (SIGKILL, SIGUSR1, SIGTERM through the trainer's handlers,
triggered at a chosen step by its fault-injection variable), and a real 2-process torchrun on gloo.
"""

from __future__ import annotations

import contextlib
import csv
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from safetensors.torch import load_file  # noqa: E402

from helpers.paths import pythonpath  # noqa: E402
from helpers.sft import short_trajectories, write_sft_data  # noqa: E402
from hydroagent_hpc.errors import ConfigError  # noqa: E402
from hydroagent_hpc.train import tiny  # noqa: E402
from hydroagent_hpc.train.checkpoint import FAULT_ENV  # noqa: E402
from hydroagent_hpc.train.sft.data import SFTDataset  # noqa: E402
from hydroagent_hpc.train.sft.trainer import (  # noqa: E402
    METRICS_COLUMNS,
    collate,
    load_sft_config,
    loss_denominator,
    lr_factor,
    plan_epoch,
    targets_only_head,
    train_sft,
    weighted_token_loss,
)

ROOT = Path(__file__).resolve().parents[1]
BASE = {"model": "tiny", "lr": 3.0e-3, "warmup_steps": 1, "max_grad_norm": 1.0, "seed": 0}
#: Runs whose batches differ in shape (padding, batch size) agree in loss and gradient norm to float
#: rounding (compared at rel 1e-5), but AdamW divides each gradient element by its own RMS, so an element
#: whose gradient is ~1e-9 (rounding noise) still moves by a fraction of lr: parameters are compared at
#: lr / 6, well below the ~lr moves of every element that a wrongly weighted example would cause.
SHAPE_ATOL = 5e-4


def _cfg(path: Path, data: Path, **kw: object) -> Path:
    values = {"data": str(data), **BASE, **kw}
    lines = []
    for k, v in values.items():
        lines.append(f"{k}: {str(v).lower() if isinstance(v, bool) else v}")
    path.write_text("\n".join(lines) + "\n")
    return path


def _params(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "final" / "model.safetensors")


def _metrics(run: Path) -> list[dict[str, float]]:
    with open(run / "metrics.csv", newline="") as fh:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(fh)]


def _assert_same_params(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = 1e-6) -> None:
    assert a.keys() == b.keys() and a
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst <= atol, f"parameters differ by up to {worst:.3g}"


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = pythonpath()
    env["HF_HUB_OFFLINE"] = "1"
    env["OMP_NUM_THREADS"] = "1"  # as this process (_one_thread): a run split across both computes alike
    env.pop(FAULT_ENV, None)
    env.update(extra)
    return env


def _run_module(cfg: Path, out: Path, *args: str, faults: str = "",
                timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hydroagent_hpc.train.sft", str(cfg), "--out", str(out), *args],
                          env=_env(**({FAULT_ENV: faults} if faults else {})), capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """One torch thread here and in the trainer subprocesses: the exact-resume tests compare a run
    split between a subprocess and this process with one run in this process, bit for bit, and the
    rounding of a matrix product depends on the thread count (and on an earlier test module having
    changed it and set it back: tests/test_hf_local.py does)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def tok():
    return tiny.build_tiny_tokenizer()


@pytest.fixture(scope="module")
def trajs(tok):
    return short_trajectories(tok, 8, seed=1)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, trajs):
    """An uninterrupted run: 4 examples, micro-batch 1 x accumulation 2 -> 2 steps per epoch, 6 steps."""
    tmp = tmp_path_factory.mktemp("ref")
    data = write_sft_data(tmp / "data.h5", trajs[:4], [1.0, 0.5, 0.8, 0.3])
    cfg = _cfg(tmp / "ref.yaml", data, max_steps=6, micro_batch_size=1, grad_accum=2, save_every=2)
    summary = train_sft(load_sft_config(cfg), tmp / "run", resume=False)
    assert summary["steps"] == 6 and summary["epoch"] == 3 and summary["stopped"] is None
    return {"tmp": tmp, "data": data, "cfg": cfg, "run": tmp / "run", "params": _params(tmp / "run"),
            "metrics": _metrics(tmp / "run")}


# ---------------------------------------------------------------------------------------------
# Plan, schedule and the loss


def test_epoch_plan_uses_every_example_once_and_buckets_by_length():
    rng = np.random.default_rng(3)
    lengths = [int(v) for v in rng.integers(10, 500, size=203)]
    plans = [plan_epoch(lengths, 3, seed=5, epoch=e, bucket_by_length=True) for e in (0, 1)]
    for plan in plans:
        assert sorted(i for mb in plan for i in mb) == list(range(203)) and all(1 <= len(mb) <= 3 for mb in plan)
    assert plans[0] != plans[1] and plan_epoch(lengths, 3, 5, 0, True) == plans[0]  # seeded per epoch
    spread = np.mean([max(lengths[i] for i in mb) - min(lengths[i] for i in mb) for mb in plans[0]])
    unsorted = plan_epoch(lengths, 3, seed=5, epoch=0, bucket_by_length=False)
    assert spread < 0.3 * np.mean([max(lengths[i] for i in mb) - min(lengths[i] for i in mb) for mb in unsorted])


def test_lr_schedule_warms_up_linearly_then_follows_a_cosine():
    f = [lr_factor(s, warmup_steps=4, max_steps=14, min_lr_ratio=0.1) for s in range(15)]
    assert f[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert f[4] == 1.0 and f[9] == pytest.approx(0.1 + 0.9 * 0.5) and f[14] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(f[4:], f[5:]))



def test_loss_is_the_weighted_mean_of_assistant_token_ce_and_rows_do_not_leak(tok, trajs):
    model = tiny.build_tiny_qwen3(tok, seed=0)
    items = [{"input_ids": torch.tensor(t.input_ids), "assistant_mask": torch.tensor(t.assistant_mask),
              "weight": torch.tensor(w)} for t, w in zip(trajs[:3], (1.0, 0.25, 2.0))]
    batch = collate(items, tok.pad_token_id)
    assert batch["input_ids"].shape[1] == max(len(t) for t in trajs[:3])
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        got = float(weighted_token_loss(logits, batch) / loss_denominator(batch))
        num = den = 0.0
        for row, it in enumerate(items):
            ids, mask, w = it["input_ids"], it["assistant_mask"], float(it["weight"])
            alone = model(input_ids=ids[None]).logits[0]  # the row by itself: padding leaks nothing
            assert torch.allclose(alone, logits[row, :len(ids)], atol=1e-5)
            logp = torch.log_softmax(alone.double(), -1)
            for t in range(1, len(ids)):
                if mask[t]:
                    num += w * -float(logp[t - 1, ids[t]])
                    den += w
    assert got == pytest.approx(num / den, rel=1e-5)


def test_the_head_on_the_assistant_targets_only_gives_the_full_logits_loss_and_gradient(tok, trajs):
    """The trainer's forward (targets_only_head): logits [targets, V], the same loss and gradient as the
    full [B, T, V] logits, and the head is whole again afterwards."""
    items = [{"input_ids": torch.tensor(t.input_ids), "assistant_mask": torch.tensor(t.assistant_mask),
              "weight": torch.tensor(w)} for t, w in zip(trajs[:3], (1.0, 0.25, 2.0))]
    batch = collate(items, tok.pad_token_id)
    targets = int((batch["loss_mask"][:, 1:] > 0).sum())
    results = []
    for only in (False, True):
        model = tiny.build_tiny_qwen3(tok, seed=0)
        with targets_only_head(model, batch) if only else contextlib.nullcontext():
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        assert logits.shape == ((targets, len(tok)) if only else (*batch["input_ids"].shape, len(tok)))
        loss = weighted_token_loss(logits, batch) / loss_denominator(batch)
        loss.backward()
        results.append((float(loss), {n: p.grad for n, p in model.named_parameters()}))
        after = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        assert after.shape == (*batch["input_ids"].shape, len(tok))  # the hook is gone
    (full_loss, full_grad), (loss, grad) = results
    assert 0 < targets < int(batch["attention_mask"].sum())  # prompts and padding are not projected
    assert loss == pytest.approx(full_loss, rel=1e-6)
    for name, g in full_grad.items():
        assert torch.allclose(grad[name], g, rtol=1e-5, atol=1e-7), name


def test_a_zero_weight_example_changes_nothing(tmp_path, trajs, tok):
    a, b = trajs[0], trajs[5]
    with_zero = _cfg(tmp_path / "z.yaml", write_sft_data(tmp_path / "z.h5", [a, b], [1.0, 0.0]), max_steps=2,
                     micro_batch_size=2, weight_decay=0.1)
    alone = _cfg(tmp_path / "a.yaml", write_sft_data(tmp_path / "a.h5", [a], [1.0]), max_steps=2,
                 micro_batch_size=2, weight_decay=0.1)
    train_sft(load_sft_config(with_zero), tmp_path / "z")
    train_sft(load_sft_config(alone), tmp_path / "a")
    _assert_same_params(_params(tmp_path / "z"), _params(tmp_path / "a"), atol=SHAPE_ATOL)
    assert [r["loss"] for r in _metrics(tmp_path / "z")] == pytest.approx([r["loss"] for r in _metrics(tmp_path / "a")],
                                                                          rel=1e-5)
    # only zero weights: nothing would be learned, so the data is refused before anything trains
    only = _cfg(tmp_path / "o.yaml", write_sft_data(tmp_path / "o.h5", [b], [0.0]), epochs=1)
    with pytest.raises(ConfigError, match=r"o\.h5: the weights sum to 0\.0: nothing would be learned"):
        train_sft(load_sft_config(only), tmp_path / "o")
    assert not (tmp_path / "o").exists()


def test_doubling_every_weight_changes_nothing(tmp_path, trajs):
    """Also: a save_pretrained folder as ``model`` (the tiny model saved) trains like ``tiny`` itself."""
    w = [1.0, 0.5, 0.8, 0.3, 0.9, 0.1, 0.6, 0.7]
    folder = tiny.save_tiny(tmp_path / "tiny-model", seed=0)
    runs = {}
    for name, scale, model in (("x1", 1.0, "tiny"), ("x2", 2.0, str(folder))):
        data = write_sft_data(tmp_path / f"{name}.h5", trajs, [scale * v for v in w])
        cfg = _cfg(tmp_path / f"{name}.yaml", data, max_steps=2, micro_batch_size=2, grad_accum=2, model=model)
        train_sft(load_sft_config(cfg), tmp_path / name)
        runs[name] = _metrics(tmp_path / name)
    _assert_same_params(_params(tmp_path / "x1"), _params(tmp_path / "x2"), atol=1e-6)
    for col in ("loss", "grad_norm"):  # an unnormalised loss would double both
        assert [r[col] for r in runs["x1"]] == pytest.approx([r[col] for r in runs["x2"]], rel=1e-5)


def test_accumulating_four_micro_batches_equals_one_big_batch(tmp_path, trajs):
    data = write_sft_data(tmp_path / "d.h5", trajs, [1.0, 0.5, 0.8, 0.3, 0.9, 0.1, 0.6, 0.7])
    for name, mbs, accum in (("big", 4, 1), ("accum", 1, 4)):
        cfg = _cfg(tmp_path / f"{name}.yaml", data, max_steps=2, micro_batch_size=mbs, grad_accum=accum,
                   bucket_by_length=False)
        train_sft(load_sft_config(cfg), tmp_path / name)
    big, acc = _metrics(tmp_path / "big"), _metrics(tmp_path / "accum")
    assert [r["tokens"] for r in big] == [r["tokens"] for r in acc]
    for col in ("loss", "grad_norm"):
        assert [r[col] for r in big] == pytest.approx([r[col] for r in acc], rel=1e-5)
    _assert_same_params(_params(tmp_path / "big"), _params(tmp_path / "accum"), atol=SHAPE_ATOL)


@pytest.mark.slow
@pytest.mark.parametrize("fsdp", [True, False], ids=["fsdp2", "ddp"])
def test_two_processes_on_gloo_follow_the_one_process_curve(reference, tmp_path, fsdp):
    """torchrun, 2 processes x accumulation 1 (FSDP2 fully_shard with activation checkpointing, or DDP)
    == 1 process x accumulation 2; with report_to: [tensorboard], only rank 0 writes the event file."""
    pytest.importorskip("tensorboard")
    cfg = _cfg(tmp_path / "two.yaml", reference["data"], max_steps=6, micro_batch_size=1, grad_accum=1,
               save_every=2, fsdp=fsdp, activation_checkpointing=fsdp, collective_timeout_s=4321,
               report_to="[tensorboard]")
    out = tmp_path / "two"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "-m", "hydroagent_hpc.train.sft", str(cfg), "--out", str(out)],
                          env=_env(OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert '"world_size": 2' in proc.stderr and f'"fsdp": {str(fsdp).lower()}' in proc.stderr
    assert proc.stderr.count("collectives time out after 4321 s") == 2, proc.stderr[-3000:]  # gpu-audit F4
    extra = torch.load(out / "checkpoints" / "step-6" / "trainer.pt", weights_only=False)
    assert len(extra["rng_ranks"]) == 2  # each rank's own RNG states (gpu-audit F12)
    two, one = _metrics(out), reference["metrics"]
    assert [r["step"] for r in two] == [r["step"] for r in one] == [1, 2, 3, 4, 5, 6]
    assert [r["tokens"] for r in two] == [r["tokens"] for r in one]
    assert [r["loss"] for r in two] == pytest.approx([r["loss"] for r in one], rel=1e-4)
    _assert_same_params(_params(out), reference["params"], atol=SHAPE_ATOL)
    _assert_one_event_writer(out, two)


def _assert_one_event_writer(run: Path, rows: list[dict[str, float]]) -> None:
    """RUN/tensorboard holds one event file (rank 0's writer), each metrics.csv row in it once."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = sorted(p.name for p in (run / "tensorboard").iterdir())
    assert len(files) == 1 and files[0].startswith("events.out.tfevents."), files
    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    steps = [int(r["step"]) for r in rows]
    for column in ("loss", "tokens", "lr", "grad_norm"):
        logged = acc.Scalars(f"sft/{column}")
        assert [e.step for e in logged] == steps, (column, [e.step for e in logged])  # no step twice
        assert [e.value for e in logged] == pytest.approx([r[column] for r in rows], rel=2e-7), column


# ---------------------------------------------------------------------------------------------
# Exact resume


def _assert_continues(reference: dict, run: Path) -> None:
    _assert_same_params(_params(run), reference["params"], atol=1e-6)
    got, want = _metrics(run), reference["metrics"]
    assert [r["step"] for r in got] == [1, 2, 3, 4, 5, 6]
    assert [r["loss"] for r in got] == pytest.approx([r["loss"] for r in want], rel=1e-6)


@pytest.mark.slow
def test_resume_after_sigkill_during_a_save_at_an_epoch_boundary(reference, tmp_path):
    run = tmp_path / "run"
    proc = _run_module(reference["cfg"], run, faults="kill_in_save:4")
    assert proc.returncode == -9, proc.stderr[-2000:]
    ckpts = run / "checkpoints"
    # killed while writing step 4: latest still names step 2 (the end of epoch 1), which is complete
    assert (ckpts / "latest").read_text().strip() == "step-2" and (ckpts / "step-4.tmp").is_dir()
    assert not (run / "final").exists()
    summary = train_sft(load_sft_config(reference["cfg"]), run, resume=True)
    assert summary["resumed_from_step"] == 2 and summary["steps"] == 6  # epoch boundary: 4 more steps, not 0
    assert not (ckpts / "step-4.tmp").exists()
    _assert_continues(reference, run)


@pytest.mark.slow
def test_resume_after_sigusr1_checkpoint_and_sigkill(reference, tmp_path):
    cfg = _cfg(tmp_path / "usr1.yaml", reference["data"], max_steps=6, micro_batch_size=1, grad_accum=2, save_every=0)
    run = tmp_path / "run"
    proc = _run_module(cfg, run, faults="usr1:3,kill:4")
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-3"  # only SIGUSR1 saved
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest", "step-3"]
    assert len(_metrics(run)) == 4  # step 4 ran after the SIGUSR1 save; resuming drops its row
    train_sft(load_sft_config(cfg), run, resume=True)
    _assert_continues(reference, run)


def test_a_sigterm_during_a_save_still_leaves_the_last_step_saved(reference, tmp_path, monkeypatch):
    """SIGUSR1 at step 3, then SIGTERM while step 3's checkpoint is being written (the batch script's requeue can
    come that early): the save clears the save flag, so the stop at step 4 must save by itself, or the run would
    stop with step 4 trained and logged but not saved (and a resume would log step 4 twice)."""
    cfg = _cfg(tmp_path / "race.yaml", reference["data"], max_steps=6, micro_batch_size=1, grad_accum=2, save_every=0)
    run = tmp_path / "run"
    monkeypatch.setenv(FAULT_ENV, "usr1:3,term_in_save:3")
    summary = train_sft(load_sft_config(cfg), run)
    assert summary["stopped"] == "SIGTERM" and summary["steps"] == 4
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-4"
    assert [r["step"] for r in _metrics(run)] == [1, 2, 3, 4]
    monkeypatch.delenv(FAULT_ENV)
    train_sft(load_sft_config(cfg), run, resume=True)
    _assert_continues(reference, run)


def test_sigterm_saves_and_exits_143_then_the_cli_resumes(reference, tmp_path, monkeypatch, capsys):
    from hydroagent_hpc.cli import main as cli

    cfg = _cfg(tmp_path / "term.yaml", reference["data"], max_steps=6, micro_batch_size=1, grad_accum=2, save_every=0)
    run = tmp_path / "run"
    monkeypatch.setenv(FAULT_ENV, "term:1")
    assert cli(["train", "sft", str(cfg), "--out", str(run)]) == 143
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-1" and not (run / "final").exists()
    monkeypatch.delenv(FAULT_ENV)
    capsys.readouterr()
    assert cli(["train", "sft", str(cfg), "--out", str(run)]) == 2  # not without --resume
    assert "--resume" in capsys.readouterr().err
    other = _cfg(tmp_path / "other.yaml", reference["data"], max_steps=6, micro_batch_size=1, grad_accum=2,
                 save_every=0, lr=1.0e-3)
    assert cli(["train", "sft", str(other), "--out", str(run), "--resume"]) == 2  # not with another config
    assert "started with another config (differs in lr)" in capsys.readouterr().err
    assert cli(["train", "sft", str(cfg), "--out", str(run), "--resume"]) == 0
    assert '"steps": 6' in capsys.readouterr().out  # the command's result line
    _assert_continues(reference, run)
    # the final folder loads as a model with its tokenizer and chat template
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(run / "final", local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(run / "final", local_files_only=True)
    assert tokenizer.chat_template and model.config.use_cache
    from hydroagent_hpc.agents.llm.hf_local import HFLocalPolicy

    policy = HFLocalPolicy(str(run / "final"), greedy=True, max_new_tokens=4, device="cpu")
    reply = policy.act([{"role": "system", "content": "You calibrate."}, {"role": "user", "content": "Go."}])
    assert isinstance(reply, str)
    import yaml

    record = yaml.safe_load((run / "config.yaml").read_text())
    assert record["config"]["data"] == str(reference["data"]) and record["provenance"]["git_commit"]
    assert record["versions"]["torch"] == torch.__version__.split("+")[0] or record["versions"]["torch"]


def test_config_keys_given_as_options_replace_the_files_and_are_recorded(reference, tmp_path, capsys):
    from hydroagent_hpc.cli import main as cli

    cfg = _cfg(tmp_path / "o.yaml", reference["data"], max_steps=6, micro_batch_size=1, grad_accum=2, save_every=0)
    run = tmp_path / "run"
    assert cli(["train", "sft", str(cfg), "--out", str(run), "--max-steps", "2", "--lr", "2e-3",
                "--no-bucket-by-length"]) == 0
    import yaml

    record = yaml.safe_load((run / "config.yaml").read_text())["config"]
    assert (record["max_steps"], record["lr"], record["bucket_by_length"]) == (2, 2e-3, False)
    assert len(_metrics(run)) == 2
    capsys.readouterr()
    assert cli(["train", "sft", str(cfg), "--out", str(run), "--resume"]) == 2  # without the options: another config
    assert "differs in" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # the field's own limit, before anything loads
        cli(["train", "sft", str(cfg), "--out", str(tmp_path / "r0"), "--lr", "0"])
    assert "--lr" in capsys.readouterr().err and not (tmp_path / "r0").exists()
    assert cli(["train", "sft", str(cfg), "--out", str(tmp_path / "r1"), "--epochs", "1"]) == 2  # with max_steps
    assert "exactly one of max_steps and epochs" in capsys.readouterr().err and not (tmp_path / "r1").exists()


# ---------------------------------------------------------------------------------------------
# Learning on the heuristic's teacher set


@pytest.mark.slow
def test_loss_falls_on_a_small_teacher_set(tmp_path, small_basin_dir):
    from hydroagent_hpc.campaign import load_campaign, run_campaign
    from hydroagent_hpc.train.sft.data import build_sft_data

    spec = tmp_path / "teach.yaml"
    spec.write_text(f"name: teach\nbasins: [{small_basin_dir}]\nagents:\n  - {{name: heuristic, kind: heuristic}}\n"
                    "seeds: [0, 1]\nenv: {preset: paper, max_simulations: 2, max_turns: null, patience: null, "
                    "target_nse: 0.99}\n")
    run_campaign(load_campaign(spec), tmp_path / "teach.h5", workers=1, progress=False)
    build_sft_data([tmp_path / "teach.h5"], tmp_path / "teach-sft.h5", preset="released", tokenizer="tiny",
                   max_tokens=32768)
    assert len(SFTDataset(tmp_path / "teach-sft.h5")) == 2
    cfg = _cfg(tmp_path / "sft.yaml", tmp_path / "teach-sft.h5", max_steps=4, micro_batch_size=1, lr=5.0e-3)
    summary = train_sft(load_sft_config(cfg), tmp_path / "run")
    rows = _metrics(tmp_path / "run")
    assert list(rows[0]) == list(METRICS_COLUMNS) and len(rows) == 4
    assert rows[-1]["loss"] < 0.8 * rows[0]["loss"], [r["loss"] for r in rows]
    assert all(r["tokens_per_s"] > 0 and r["peak_mem_mb"] > 0 and np.isfinite(r["grad_norm"]) for r in rows)
    assert summary["final_loss"] == pytest.approx(rows[-1]["loss"], rel=1e-6)


# ---------------------------------------------------------------------------------------------
# One clear error each, nothing written


def test_bad_config_names_file_and_line(tmp_path, reference):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(f"data: {reference['data']}\nmodel: tiny\nlr: fast\nmax_steps: 2\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml:3: lr: expected a number"):
        load_sft_config(cfg)
    cfg.write_text(f"data: {reference['data']}\nmax_steps: 2\nlearning_rate: 0.1\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml:3: learning_rate: unknown key"):
        load_sft_config(cfg)
    cfg.write_text(f"data: {reference['data']}\nmax_steps: 2\nepochs: 1\n")
    with pytest.raises(ConfigError, match="exactly one of max_steps and epochs"):
        load_sft_config(cfg)
    cfg.write_text(f"data: {reference['data']}\nmax_steps: 2\nmax_steps: 3\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml:3: max_steps: duplicate key"):
        load_sft_config(cfg)


def test_missing_data_and_overlong_sequences_are_refused_before_writing(tmp_path, reference, capsys):
    from hydroagent_hpc.cli import main as cli

    missing = _cfg(tmp_path / "missing.yaml", tmp_path / "nope.h5", max_steps=2)
    assert cli(["train", "sft", str(missing), "--out", str(tmp_path / "r1")]) == 2
    err = capsys.readouterr().err
    assert "nope.h5: no such SFT data file" in err and "sft-data" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r1").exists()

    lengths = np.diff(SFTDataset(reference["data"]).offsets)
    short = _cfg(tmp_path / "short.yaml", reference["data"], max_steps=2, max_seq_len=int(lengths.min()))
    with pytest.raises(ConfigError, match=r"sequences are longer than max_seq_len .*episode_id-\d+ \(\d+ tokens\)"):
        train_sft(load_sft_config(short), tmp_path / "r2")
    assert not (tmp_path / "r2").exists()
