"""A damaged checkpoint is named and never trained on: the run resumes from the newest intact one.

The damage is generated: each file of the newest checkpoint (weights, optimizer state, trainer
state, manifest) truncated (to nothing, to half, by one byte), zeroed over a span, byte-flipped,
extended, overwritten with noise or deleted; a valid archive holding other contents (zeroed
optimizer moments, another model's weights); a garbage, dangling or missing ``latest`` pointer; a
checkpoint of another model size and one of a run with another config put in its place; and the
same damage to every checkpoint. Each case resumes a real SFT run (the tiny offline Qwen3, real
HDF5 data, in this process on one thread) that a SIGTERM stopped after step 2 of 3, with
checkpoints at steps 1 and 2. It passes when

- the newest checkpoint is damaged and an older one intact: a warning names the damaged folder and
  what is wrong, and the run trains on from the intact one to weights equal, bit for bit, to those
  of the uninterrupted run, with metric rows 1, 2, 3 (no step repeated or skipped);
- only the pointer is damaged: the same, from the newest intact checkpoint;
- none is intact: a one-line :class:`~hydroagent_hpc.errors.HydroAgentError` names the damaged
  checkpoints and says how to go on, and nothing more is trained or written.

``tests/test_train_kill.py`` kills the trainers at every write; this file damages what they wrote.
"""

from __future__ import annotations

import csv
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from safetensors.torch import load_file  # noqa: E402

from helpers.cases import sampled  # noqa: E402
from helpers.sft import short_trajectories, write_sft_data  # noqa: E402
from helpers.threads import one_torch_thread  # noqa: E402, F401  (autouse fixture)
from hydroagent_hpc.errors import HydroAgentError, one_line  # noqa: E402
from hydroagent_hpc.train import tiny  # noqa: E402
from hydroagent_hpc.train.checkpoint import FAULT_ENV, TrainerState, save_checkpoint  # noqa: E402
from hydroagent_hpc.train.sft.trainer import load_sft_config, sft_optimizer, train_sft  # noqa: E402

STEPS = 3
FILES = ("model.pt", "optim.pt", "trainer.pt", "manifest.json")


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> dict[str, Any]:
    """A run stopped by SIGTERM after step 2 (checkpoints step-1 and step-2), and the uninterrupted run."""
    tmp = tmp_path_factory.mktemp("ckpt-damage")
    data = write_sft_data(tmp / "data.h5", short_trajectories(tiny.build_tiny_tokenizer(), 4, seed=1),
                          [1.0, 0.5, 0.8, 0.3])
    cfg = tmp / "sft.yaml"
    cfg.write_text(f"data: {data}\nmodel: tiny\nlr: 3.0e-3\nwarmup_steps: 1\nseed: 0\nmax_steps: {STEPS}\n"
                   "micro_batch_size: 1\ngrad_accum: 2\nsave_every: 1\n")
    config = load_sft_config(cfg)
    whole = train_sft(config, tmp / "whole", resume=False)
    assert whole["steps"] == STEPS
    os.environ[FAULT_ENV] = "term:2"
    try:
        cut = train_sft(config, tmp / "cut", resume=False)
    finally:
        del os.environ[FAULT_ENV]
    assert cut["stopped"] == "SIGTERM" and cut["steps"] == 2
    ckpts = tmp / "cut" / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir() if p.is_dir()) == ["step-1", "step-2"]
    return {"tmp": tmp, "config": config, "cut": tmp / "cut",
            "weights": load_file(str(tmp / "whole" / "final" / "model.safetensors"))}


def _steps(run: Path) -> list[int]:
    with open(run / "metrics.csv", newline="") as fh:
        return [int(r["step"]) for r in csv.DictReader(fh)]


# ---------------------------------------------------------------------------------------------
# Damage


def _bytes(path: Path) -> bytearray:
    return bytearray(path.read_bytes())


def _file_damage(kind: str, seed: int = 0) -> Callable[[Path], None]:
    def apply(path: Path) -> None:
        data = _bytes(path)
        n = len(data)
        rng = np.random.default_rng(seed)
        if kind == "empty":
            path.write_bytes(b"")
        elif kind == "half":
            path.write_bytes(bytes(data[: n // 2]))
        elif kind == "last-byte":  # the last byte that is not white space (a manifest's closing brace)
            path.write_bytes(bytes(data.rstrip()[:-1]))
        elif kind == "zero-span":
            lo = n // 3
            data[lo:lo + min(4096, n // 3)] = bytes(min(4096, n // 3))
            path.write_bytes(bytes(data))
        elif kind == "flip":
            at = int(rng.integers(0, n))
            data[at] ^= 0x5A
            path.write_bytes(bytes(data))
        elif kind == "append":
            path.write_bytes(bytes(data) + b"\0garbage\n")
        elif kind == "noise":
            path.write_bytes(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
        elif kind == "delete":
            path.unlink()
        else:
            raise ValueError(kind)
    return apply


FILE_DAMAGE = [("empty", 0), ("half", 0), ("last-byte", 0), ("zero-span", 0), ("flip", 1), ("flip", 2), ("flip", 3),
               ("append", 0), ("noise", 0), ("delete", 0)]


def _zeroed_optimizer(path: Path) -> None:
    """optim.pt rewritten as a valid archive whose Adam moments and step counts are all zero."""
    state = torch.load(path, map_location="cpu", weights_only=False)
    for entry in state["state"].values():
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                entry[key] = torch.zeros_like(value)
    torch.save(state, path)


def _other_weights(path: Path) -> None:
    """model.pt rewritten as a valid archive of the same shapes with other values (another seed's model)."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    gen = torch.Generator().manual_seed(11)
    torch.save({k: torch.randn(v.shape, generator=gen, dtype=v.dtype) for k, v in state.items()}, path)


def _foreign(base: dict[str, Any], run: Path, *, layers: int | None = None, lr: float | None = None) -> None:
    """Put a checkpoint of another model size (``layers``) or of a run with another config (``lr``) at step-2."""
    import yaml

    scratch = run.parent / f"foreign-{run.name}"
    scratch.mkdir()
    record = yaml.safe_load((run / "config.yaml").read_text())
    if lr is not None:
        record["config"]["lr"] = lr
    (scratch / "config.yaml").write_text(yaml.safe_dump(record))
    tok = tiny.build_tiny_tokenizer()
    model = tiny.build_tiny_qwen3(tok, seed=3, **({"num_hidden_layers": layers} if layers else {}))
    model.train()
    optimizer = sft_optimizer(model, base["config"])
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    for _ in range(2):
        ids = torch.randint(0, 1000, (1, 12), generator=torch.Generator().manual_seed(4))
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
    save_checkpoint(scratch, model, optimizer, scheduler, TrainerState(step=2, epoch=1, index=0, tokens=500,
                                                                       micro_per_step=2))
    shutil.rmtree(run / "checkpoints" / "step-2")
    shutil.move(str(scratch / "checkpoints" / "step-2"), run / "checkpoints" / "step-2")


def _pointer(text: bytes | None) -> Callable[[Path], None]:
    def apply(run: Path) -> None:
        pointer = run / "checkpoints" / "latest"
        if text is None:
            pointer.unlink()
        else:
            pointer.write_bytes(text)
    return apply


class Case:
    """One damage: ``apply(run)``; ``resumes_from`` the step the run must go back to (None: none is intact)."""

    def __init__(self, name: str, apply: Callable[[Path], None], resumes_from: int | None, names: str) -> None:
        self.name, self.apply, self.resumes_from, self.names = name, apply, resumes_from, names

    def __repr__(self) -> str:
        return self.name


def _on(files: tuple[str, ...], steps: tuple[int, ...], damage: Callable[[Path], None]) -> Callable[[Path], None]:
    def apply(run: Path) -> None:
        for step in steps:
            for f in files:
                damage(run / "checkpoints" / f"step-{step}" / f)
    return apply


def generated_cases() -> list[Case]:
    cases: list[Case] = []
    for f in FILES:
        for kind, seed in FILE_DAMAGE:
            cases.append(Case(f"step-2/{f}:{kind}{seed or ''}", _on((f,), (2,), _file_damage(kind, seed)), 1,
                              "step-2"))
    cases.append(Case("step-2/optim.pt:zeroed-state", _on(("optim.pt",), (2,), _zeroed_optimizer), 1, "step-2"))
    cases.append(Case("step-2/model.pt:other-weights", _on(("model.pt",), (2,), _other_weights), 1, "step-2"))
    for label, text in [("empty", b""), ("blank", b"\n"), ("missing-step", b"step-99\n"), ("not-a-step", b"step-two"),
                        ("escape", b"../../step-2"), ("tmp", b"step-2.tmp"), ("binary", b"\xff\xfe\x00\x01"),
                        ("two-names", b"step-2 step-1"), ("deleted", None)]:
        cases.append(Case(f"latest:{label}", _pointer(text), 2, "latest"))
    cases.append(Case("latest:names-an-empty-newer-folder", _newer_empty_folder, 2, "step-7"))
    cases.append(Case("step-2:another-model-size", lambda run: None, 1, "step-2"))  # applied in _apply
    cases.append(Case("step-2:another-config", lambda run: None, 1, "step-2"))
    for f, kind in [("model.pt", "half"), ("optim.pt", "flip"), ("trainer.pt", "empty"), ("manifest.json", "noise")]:
        cases.append(Case(f"every-checkpoint/{f}:{kind}", _on((f,), (1, 2), _file_damage(kind, 1)), None, "step-1"))
    return cases


def _newer_empty_folder(run: Path) -> None:
    (run / "checkpoints" / "step-7").mkdir()
    (run / "checkpoints" / "latest").write_text("step-7\n")


CASES = generated_cases()
#: One of each kind for `make test`; the rest are slow.
FAST = {"step-2/model.pt:half", "step-2/optim.pt:zeroed-state", "latest:binary", "step-2:another-model-size",
        "every-checkpoint/optim.pt:flip"}


def _apply(case: Case, base: dict[str, Any], run: Path) -> None:
    shutil.copytree(base["cut"], run)
    if case.name == "step-2:another-model-size":
        _foreign(base, run, layers=2)
    elif case.name == "step-2:another-config":
        _foreign(base, run, lr=1.0e-3)
    else:
        case.apply(run)


def check(case: Case, base: dict[str, Any], run: Path, caplog: pytest.LogCaptureFixture) -> str | None:
    """What the resumed run did wrong with ``case`` (None: nothing)."""
    _apply(case, base, run)
    rows_before = _steps(run)
    caplog.clear()
    try:
        with caplog.at_level(logging.WARNING):
            summary = train_sft(base["config"], run, resume=True)
    except HydroAgentError as exc:
        text = one_line(exc)
        if case.resumes_from is not None:
            return f"stopped although step-{case.resumes_from} is intact: {text}"
        if case.names not in text or "fix:" not in text or "\n" in str(exc).split("\n  fix:")[0]:
            return f"the error does not name {case.names} on one line with a fix: {text}"
        if _steps(run) != rows_before or (run / "final").exists():
            return "trained or wrote on although no checkpoint is intact"
        return None
    except Exception as exc:  # the finding: an error that is not the toolkit's one-line error
        return f"raised {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    if case.resumes_from is None:
        return f"trained on although every checkpoint is damaged (steps {summary['steps']})"
    warned = " ".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
    if case.names not in warned:
        return f"no warning names {case.names} (warnings: {warned[:300]!r})"
    if f"step-{case.resumes_from}" not in warned and case.resumes_from != 2:
        return f"no warning says the run resumes from step-{case.resumes_from}"
    if _steps(run) != list(range(1, STEPS + 1)):
        return f"metric rows {_steps(run)}"
    weights = load_file(str(run / "final" / "model.safetensors"))
    if weights.keys() != base["weights"].keys() or any(not torch.equal(weights[k], base["weights"][k])
                                                       for k in weights):
        return "the final weights differ from the uninterrupted run's (trained on damaged state)"
    return None


@pytest.mark.parametrize("case", sampled("checkpoint-damage", [pytest.param(c, id=c.name) for c in CASES], fast=FAST,
                                          sample=10))
def test_a_damaged_checkpoint_is_named_and_never_trained_on(case, base, tmp_path, caplog):
    problem = check(case, base, tmp_path / "run", caplog)
    assert problem is None, problem
