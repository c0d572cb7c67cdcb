"""Keep an external inference engine serving the trainer's weights: the launcher and the weight push.

:class:`EngineProcess` (optional; used when ``engine.launch`` is given) starts the server as a
subprocess from an argument list (never a shell string; ``{model}`` becomes the weights folder and
``{api_key}`` the key from ``engine.api_key_env``), waits until its health endpoint answers 200,
and stops it (SIGTERM to its process group, SIGKILL after 30 s) at the end. Its output goes to
``RUN/engine.log`` with the API key replaced by ``***``; the logged command line is redacted too.

:class:`EngineWeights` pushes the policy after every optimizer step (and once before the first
rollout, so a resumed run's engine serves the resumed weights): ``save_pretrained`` into
``weights_dir/step-NNNNNN.tmp``, renamed to ``step-NNNNNN`` when complete (a reader never sees a
half-written folder), then either the engine's live reload (SGLang's
``/update_weights_from_disk``) or, for an API without one (vLLM), a restart of the launched
process on the new folder. Older folders are removed once the engine serves the new one. The
seconds this takes are the step's ``weight_sync_s``.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import IO, Any

from hydroagent_hpc.train.engine import EngineAPI, EngineError, EngineSettings, make_api

log = logging.getLogger(__name__)

__all__ = ["EngineProcess", "EngineWeights", "save_weights"]


class EngineProcess:
    """An engine server this run started (see the module doc)."""

    def __init__(self, settings: EngineSettings, api: EngineAPI, log_path: Path) -> None:
        if not settings.launch:
            raise ValueError("EngineProcess needs engine.launch")
        self.settings, self.api, self.log_path = settings, api, log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self._pump: threading.Thread | None = None
        self.starts = 0

    def _argv(self, model_dir: str) -> tuple[list[str], list[str]]:
        """The argument list, and the same with the key redacted (for the log)."""
        key = self.settings.api_key()
        argv, shown = [], []
        for arg in self.settings.launch or ():
            if key and key in arg:
                raise EngineError("engine.launch holds the API key itself",
                                  "write {api_key} where the key goes; it is read from engine.api_key_env")
            argv.append(arg.replace("{model}", model_dir).replace("{api_key}", key or ""))
            shown.append(arg.replace("{model}", model_dir).replace("{api_key}", "***"))
        return argv, shown

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, model_dir: str) -> None:
        """Start the server on ``model_dir`` and wait for its health endpoint."""
        if self.running:
            raise EngineError("the engine is already running", "stop it first")
        argv, shown = self._argv(model_dir)
        if self.api.health(timeout=2.0):
            raise EngineError(f"engine.url {self.settings.base}: a server already answers there",
                              "stop it, or drop engine.launch to use it as it is")
        log.info("engine: starting %s", " ".join(shown))
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        assert self.proc.stdout is not None
        self._pump = threading.Thread(target=_pump, args=(self.proc.stdout, self.log_path, self.settings.api_key()),
                                      name="engine-log", daemon=True)
        self._pump.start()
        self.starts += 1
        deadline = time.monotonic() + self.settings.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                self.proc = None
                raise EngineError(f"engine exited with status {code} while starting ({_tail(self.log_path)})",
                                  f"see {self.log_path} and check engine.launch")
            if self.api.health(timeout=2.0):
                self.api.reset()
                log.info("engine: %s answers at %s (pid %d)", self.api.name, self.settings.base, self.proc.pid)
                return
            time.sleep(0.2)
        self.stop()
        raise EngineError(f"engine at {self.settings.base}: no health answer within "
                          f"{self.settings.start_timeout_s:g} s",
                          f"see {self.log_path}; raise engine.start_timeout_s for a large model")

    def stop(self) -> None:
        """Stop the server this run started (its process group), if it runs."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if self._pump is not None:
            self._pump.join(timeout=5)
        log.info("engine: stopped (pid %d)", proc.pid)

    def restart(self, model_dir: str) -> None:
        self.stop()
        self.start(model_dir)


def _pump(stream: IO[bytes], path: Path, secret: str | None) -> None:
    """Copy the engine's output to ``path`` line by line, with the key replaced."""
    with open(path, "ab") as out:
        for line in iter(stream.readline, b""):
            if secret:
                line = line.replace(secret.encode(), b"***")
            out.write(line)
            out.flush()
    stream.close()


def _tail(path: Path, n: int = 400) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "no log"
    return " ".join(text[-n:].split()) or "no output"


def save_weights(model: Any, tokenizer: Any, folder: Path) -> Path:
    """``save_pretrained`` of the model (and tokenizer) into ``folder``, atomically (temp + rename)."""
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    return folder


class EngineWeights:
    """Makes the engine serve the trainer's current weights (see the module doc); a context manager
    that stops a launched engine on exit."""

    def __init__(self, settings: EngineSettings, run_dir: Path) -> None:
        self.settings = settings
        self.api = make_api(settings)
        self.root = Path(settings.weights_dir) if settings.weights_dir else run_dir / "engine-weights"
        self.process = EngineProcess(settings, self.api, run_dir / "engine.log") if settings.launch else None
        if self.process is None and not self.api.live_reload:
            raise EngineError(f"engine.api {self.api.name}: the server cannot load new weights while it runs",
                              "give engine.launch (with {model}) so the trainer restarts it on each checkpoint")
        self.current: Path | None = None
        self.pushes = 0

    def __enter__(self) -> EngineWeights:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def push(self, model: Any, tokenizer: Any, step: int) -> float:
        """Serve ``model``'s weights as those of ``step``; returns the seconds it took."""
        t0 = time.perf_counter()
        self.root.mkdir(parents=True, exist_ok=True)
        folder = save_weights(model, tokenizer, self.root / f"step-{step:06d}")
        if self.process is not None and (not self.api.live_reload or not self.process.running):
            if self.process.running:
                self.process.restart(str(folder.resolve()))
            else:
                self.process.start(str(folder.resolve()))
        else:
            self.api.load_weights(str(folder.resolve()))
        for old in self.root.glob("step-*"):
            if old.is_dir() and old != folder:
                shutil.rmtree(old, ignore_errors=True)
        self.current = folder
        self.pushes += 1
        seconds = time.perf_counter() - t0
        log.info("engine: serving the weights of step %d (%.2f s)", step, seconds)
        return seconds

    def close(self) -> None:
        if self.process is not None:
            self.process.stop()
