"""A run folder that cannot be written is one clear error, never a half-written checkpoint (issue 32, item 4).

- ``--out`` under a regular file (what a read-only folder looks like to root, who may write anywhere):
  refused by ``hydroagent train sft|grpo`` before anything loads, nothing created.
- a folder without write permission (only when the tests do not run as root: root ignores it).
- a full disk, for real: the resumed SFT run is a subprocess whose file-size limit (``RLIMIT_FSIZE``,
  with ``SIGXFSZ`` ignored, so a write past it fails with ``EFBIG`` as one past a full disk fails with
  ``ENOSPC``) stops, by its size, the write of ``config.yaml``, of the checkpoint's ``model.pt`` or of
  its ``optim.pt``. The run must exit 1 with one line naming the folder and the cause, leave no
  temporary file or folder, leave ``latest``, the earlier checkpoint (and an unwritten ``config.yaml``)
  byte for byte as they were, and write no ``final/``; with room again it resumes and finishes.
- ``final/`` whose writer fails (an ``OSError(ENOSPC)`` raised by the writer after it wrote part of
  the folder): the temporary folder is removed and an earlier ``final/`` is left as it was.
"""

from __future__ import annotations

import errno
import hashlib
import os
import resource
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from helpers.sft import short_trajectories, write_sft_data  # noqa: E402
from hydroagent_hpc.cli import main  # noqa: E402
from hydroagent_hpc.train.checkpoint import FAULT_ENV  # noqa: E402
from hydroagent_hpc.train.tiny import build_tiny, build_tiny_tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    trajs = short_trajectories(build_tiny_tokenizer(), 4, seed=2)
    return write_sft_data(tmp_path_factory.mktemp("disk") / "data.h5", trajs, [1.0, 0.5, 0.8, 0.3])


def _sft_config(path: Path, data: Path) -> Path:
    path.write_text(f"data: {data}\nmodel: tiny\nlr: 1.0e-3\nmax_steps: 3\nmicro_batch_size: 1\nsave_every: 1\n"
                    f"keep_checkpoints: 5\nseed: 0\n")
    return path


def _errors(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("kind", ["sft", "grpo"])
def test_out_under_a_file_is_refused_before_anything_loads(kind, data, grpo_basins, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    cfg = tmp_path / "c.yaml"
    if kind == "sft":
        _sft_config(cfg, data)
    else:
        cfg.write_text(f"basins: [{grpo_basins / 'b1'}]\ngroup_size: 2\nprompts_per_step: 1\nmax_steps: 1\n")
    rc = main(["train", kind, str(cfg), "--out", str(blocker / "run")])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err, err
    assert len(_errors(err)) == 1 and str(blocker) in err and "is a file" in err, err
    assert "Loading weights" not in err  # refused before the model loads
    assert blocker.read_text() == "not a folder\n"
    # the trainers check it themselves too (the module entries Slurm jobs run do not go through the CLI)
    from hydroagent_hpc.errors import ConfigError

    if kind == "sft":
        from hydroagent_hpc.train.sft.trainer import load_sft_config, train_sft

        call = lambda: train_sft(load_sft_config(cfg), blocker / "run")  # noqa: E731
    else:
        from hydroagent_hpc.train.grpo.config import load_grpo_config
        from hydroagent_hpc.train.grpo.trainer import train_grpo

        call = lambda: train_grpo(load_grpo_config(cfg), blocker / "run")  # noqa: E731
    with pytest.raises(ConfigError, match=rf"{blocker} is a file, not a folder"):
        call()
    assert "Loading weights" not in capsys.readouterr().err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into any folder whatever its mode")
def test_a_folder_without_write_permission_is_refused(data, tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        rc = main(["train", "sft", str(_sft_config(tmp_path / "c.yaml", data)), "--out", str(locked / "run")])
    finally:
        locked.chmod(0o700)
    err = capsys.readouterr().err
    assert rc == 2 and str(locked) in err and len(_errors(err)) == 1, err
    assert not (locked / "run").exists()


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["HF_HUB_OFFLINE"] = "1"
    env["OMP_NUM_THREADS"] = "1"
    env.pop(FAULT_ENV, None)
    env.update(extra)
    return env


def _file_size_limit(limit: int) -> Callable[[], None]:
    """For the child: writes past ``limit`` bytes fail with EFBIG (SIGXFSZ ignored, as for a full disk)."""
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def _hydroagent(*args: str, env: dict[str, str], limit: int = 0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hydroagent_hpc.cli", *args], env=env, capture_output=True,
                          text=True, timeout=300, cwd=ROOT, preexec_fn=_file_size_limit(limit) if limit else None)


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


#: File-size limits of the resumed run and the first write each one stops: config.yaml (about 2 KB), the
#: checkpoint's model.pt (3.7 MB of fp32 weights) and its optim.pt (twice that).
LIMITS = {"config.yaml": 600, "model.pt": 256 << 10, "optim.pt": 5 << 20}


@pytest.fixture(scope="module")
def stopped(data, tmp_path_factory) -> tuple[Path, Path]:
    """The SFT config and a run that saved step 1 and stopped (SIGTERM through the trainer's handler): every
    case resumes a copy of it."""
    tmp = tmp_path_factory.mktemp("stopped")
    cfg = _sft_config(tmp / "sft.yaml", data)
    first = _hydroagent("train", "sft", str(cfg), "--out", str(tmp / "run"), env=_env(**{FAULT_ENV: "term:1"}))
    assert first.returncode == 143, first.stderr[-2000:]
    return cfg, tmp / "run"


@pytest.mark.slow  # one or two trainer processes per case: about 20 s each
@pytest.mark.parametrize("stops", sorted(LIMITS))
def test_a_full_disk_during_a_run_leaves_the_last_checkpoint_as_it_was(stops, stopped, tmp_path):
    cfg, run = stopped[0], tmp_path / "run"
    shutil.copytree(stopped[1], run)
    ckpts = run / "checkpoints"
    assert (ckpts / "latest").read_text().strip() == "step-1"
    before = _digests(ckpts / "step-1")
    config_before = (run / "config.yaml").read_bytes()
    # resumed with too little room: a write fails part-way
    second = _hydroagent("train", "sft", str(cfg), "--out", str(run), "--resume", env=_env(), limit=LIMITS[stops])
    err = second.stderr
    assert second.returncode == 1 and "Traceback" not in err, err[-3000:]
    lines = _errors(err)
    assert len(lines) == 1, err[-3000:]
    if stops == "config.yaml":
        assert f"--out {run}: the run stopped on an I/O error" in lines[0] and "File too large" in lines[0], lines[0]
    else:
        assert f"cannot write checkpoint step-2 into {ckpts}" in lines[0], lines[0]
    assert f"the last checkpoint, {ckpts / 'step-1'}, is intact" in lines[0] and "free space" in lines[0], lines[0]
    assert (ckpts / "latest").read_text().strip() == "step-1"
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step-1"], list(ckpts.iterdir())
    assert _digests(ckpts / "step-1") == before
    if stops == "config.yaml":  # else the resumed run rewrote it whole (resumed_from_step: 1)
        assert (run / "config.yaml").read_bytes() == config_before
    assert not [p.name for p in run.iterdir() if p.name.endswith(".tmp")]
    assert not (run / "final").exists()
    if stops != "model.pt":
        return
    # with room again, the run resumes from step 1 and finishes
    third = _hydroagent("train", "sft", str(cfg), "--out", str(run), "--resume", env=_env())
    assert third.returncode == 0, third.stderr[-2000:]
    assert (run / "final" / "model.safetensors").is_file()
    assert (ckpts / "latest").read_text().strip() == "step-3"


def test_a_failed_final_write_removes_its_temporary_folder_and_keeps_the_earlier_one(tmp_path):
    from hydroagent_hpc.train.writes import RunWriteError, write_folder

    model, tok = build_tiny(seed=0)
    final = tmp_path / "final"
    write_folder(final, lambda tmp: model.save_pretrained(tmp))
    earlier = _digests(final)

    def full_disk(tmp: Path) -> None:
        tok.save_pretrained(tmp)  # part of the folder is written, then the disk is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp / "model.safetensors"))

    with pytest.raises(RunWriteError, match=r"cannot write the final model into .*final \(\[Errno 28\] No space "
                                            r"left on device\); the earlier .*final is unchanged\n  fix: free space"):
        write_folder(final, full_disk)
    assert not (tmp_path / "final.tmp").exists()
    assert _digests(final) == earlier
