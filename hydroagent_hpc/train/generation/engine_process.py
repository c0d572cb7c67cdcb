"""Keep an external inference engine serving the trainer's weights: the launcher and the weight push.

:class:`EngineProcess` (optional; used when ``engine.launch`` is given) starts the server as a
subprocess from an argument list (never a shell string; ``{model}`` becomes the weights folder,
``{api_key}`` the key from ``engine.api_key_env`` and ``{python}`` the trainer's own interpreter),
waits until its health endpoint answers 200, and stops it at the end. Its output goes to
``RUN/engine.log`` with the API key replaced by ``***``; the logged command line is redacted too.

What the launched server gets (:meth:`EngineProcess.launch_env`, :meth:`EngineProcess.argv`):

- its own GPUs: ``CUDA_VISIBLE_DEVICES`` set to ``engine.gpus`` when given, else to the visible
  devices (``CUDA_VISIBLE_DEVICES`` of the trainer, else the ``torch.cuda.device_count()`` or
  ``nvidia-smi -L`` devices) after the first ``T``, ``T`` being the trainer processes on this node
  (``LOCAL_WORLD_SIZE``, else ``WORLD_SIZE``, else 1; the trainers take devices ``0..T-1``, as
  accelerate binds rank ``r`` to device ``r % count``). A node with CUDA devices and none left for
  the engine is refused before anything starts, with the counts; a node without CUDA devices
  leaves the variable as it is (the CPU stand-in engine runs there);
- the trainer's environment without the torch launcher's rendezvous variables (``RANK``,
  ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, ``TORCHELASTIC_*``, ...), which the engine's own
  ``torch.distributed`` would otherwise read, plus the API's :attr:`EngineAPI.launch_env` (SGLang:
  ``SGLANG_RETURN_ORIGINAL_LOGPROB=1``, so its log-probs are the model's own at any temperature);
- the run's context length (``max_context_tokens + max_new_tokens``) as ``--context-length``
  (SGLang) or ``--max-model-len`` (vLLM), appended unless ``engine.launch`` already sets it
  (without it both engines size their KV cache for the model's full 262,144 tokens).

Stopping (:meth:`EngineProcess.stop`): SIGTERM to the server's process group, then a wait until no
process of that group is alive (the API server exits first; vLLM's engine-core and SGLang's
scheduler processes, which hold the GPU memory, can outlive it for seconds), SIGKILL to the group
after ``stop_timeout_s``. Before a restart, where ``nvidia-smi`` exists, also a wait (up to
``memory_timeout_s``) until no process of the old server holds GPU memory and the engine GPUs'
used memory is back to what it was before the first start (plus :data:`GPU_SLACK_MIB`): both
engines refuse to start when the free memory is short of their share. A wait that runs out is an
error naming the processes or the devices.

:class:`EngineWeights` pushes the policy after every optimizer step (and once before the first
rollout, so a resumed run's engine serves the resumed weights): ``save_pretrained`` into
``weights_dir/step-NNNNNN.tmp``, renamed to ``step-NNNNNN`` when complete (a reader never sees a
half-written folder), then either the engine's live reload (SGLang's
``/update_weights_from_disk``) or, for an API without one (vLLM), a restart of the launched
process. A launched server is always started on ``weights_dir/current``, a link swapped atomically
to the newest folder: the served path is the same at every step, so vLLM's compile cache (keyed by
a hash of its model config, the model path string included) is hit on every restart after the
first (:mod:`hydroagent_hpc.train.generation.engine` names the vLLM source read). Older
folders are removed once the engine serves the new one. The seconds this takes are the step's
``weight_sync_s``.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from hydroagent_hpc.train.generation.engine import EngineAPI, EngineError, EngineSettings, api_key, make_api

log = logging.getLogger(__name__)

__all__ = ["EngineProcess", "EngineWeights", "save_weights", "visible_devices", "trainer_processes",
           "engine_devices", "group_members", "wait_group_gone", "GpuState", "gpu_state", "point_link", "GPU_SLACK_MIB"]

#: Used GPU memory (MiB) above the pre-start level that still counts as released (a CUDA context).
GPU_SLACK_MIB = 1024.0

#: The torch launcher's variables (torchrun, accelerate, our MPI split) kept from a launched engine.
_LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                  "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "LOCAL_ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_LAUNCHER_PREFIXES = ("TORCHELASTIC_", "TORCH_ELASTIC_")


# -- which GPUs the engine gets --------------------------------------------------------------------
def _torch_device_count() -> int:
    try:
        import torch

        return int(torch.cuda.device_count())
    except Exception:  # a broken driver must not stop a CPU run
        return 0


def _nvidia_smi(*args: str) -> str | None:
    """``nvidia-smi ARGS``'s output, or None where it is missing or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        done = subprocess.run([exe, *args], capture_output=True, text=True, timeout=15, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def visible_devices(environ: Mapping[str, str] | None = None) -> list[str]:
    """The CUDA devices this process may use, as ``CUDA_VISIBLE_DEVICES`` entries.

    ``CUDA_VISIBLE_DEVICES`` when set (its entries up to the first negative one, as CUDA reads it;
    an empty value: none); else ``"0" .. "n-1"`` for the ``n`` devices ``torch.cuda.device_count()``
    counts, or the ``GPU`` lines of ``nvidia-smi -L`` where torch counts none.
    """
    env = os.environ if environ is None else environ
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is not None:
        out = []
        for entry in (e.strip() for e in raw.split(",")):
            if not entry or entry.startswith("-"):
                break
            out.append(entry)
        return out
    n = _torch_device_count()
    if n == 0:
        listing = _nvidia_smi("-L")
        n = sum(1 for line in (listing or "").splitlines() if line.startswith("GPU "))
    return [str(i) for i in range(n)]


def trainer_processes(environ: Mapping[str, str] | None = None) -> int:
    """``T``, the trainer processes on this node: ``LOCAL_WORLD_SIZE``, else ``WORLD_SIZE``, else 1."""
    env = os.environ if environ is None else environ
    for name in ("LOCAL_WORLD_SIZE", "WORLD_SIZE"):
        raw = env.get(name)
        if raw is None or not raw.strip():
            continue
        try:
            value = int(raw)
        except ValueError:
            value = 0
        if value < 1:
            raise EngineError(f"{name}={raw!r} in the environment is not a number of processes",
                              "fix the launcher's environment (torchrun / accelerate launch set it)")
        return value
    return 1


def engine_devices(gpus: Sequence[str] | None, trainers: int, visible: Sequence[str]) -> list[str] | None:
    """The ``CUDA_VISIBLE_DEVICES`` entries of a launched engine (module doc).

    ``gpus`` (``engine.gpus``) when given; else ``visible[trainers:]``, the visible devices no
    trainer uses. None when no CUDA device is visible at all (nothing to choose: the variable is left
    as inherited). Raises :class:`EngineError` when devices exist and none is left for the engine.
    """
    if gpus:
        shared = [g for g in gpus if g in visible[:trainers]]
        if shared:
            log.warning("engine.gpus %s includes GPU(s) %s that trainer processes use (the first %d of %s): the "
                        "engine and the trainers share their memory", ",".join(gpus), ",".join(shared), trainers,
                        ",".join(visible))
        return list(gpus)
    if not visible:
        return None
    left = list(visible[trainers:])
    if not left:
        raise EngineError(f"engine.launch: {len(visible)} visible GPU(s) ({','.join(visible)}) and {trainers} "
                          f"trainer process(es) on this node leave no GPU for the engine (the trainers use devices "
                          f"0..{trainers - 1})",
                          f"run {len(visible) - 1 if len(visible) > 1 else 'fewer'} trainer(s) (T = GPUs - 1), give "
                          f"the job one more GPU, or name the engine's GPUs in engine.gpus")
    return left


# -- process groups --------------------------------------------------------------------------------
def group_members(pgid: int) -> list[int]:
    """The live processes of process group ``pgid`` (zombies, which hold no memory, not counted).

    Read from ``/proc/PID/stat`` (state and process group fields); where there is no ``/proc``,
    ``[pgid]`` while ``killpg(pgid, 0)`` finds the group.
    """
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [pgid]
    out = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) ": state ppid pgrp ...
        if len(fields) >= 3 and fields[2] == str(pgid) and fields[0] not in ("Z", "X", "x"):
            out.append(int(entry.name))
    return sorted(out)


def wait_group_gone(pgid: int, timeout_s: float, poll_s: float = 0.05) -> list[int]:
    """Wait until process group ``pgid`` has no live process; the ones still alive at the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = group_members(pgid)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(poll_s)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# -- GPU memory ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GpuState:
    """What ``nvidia-smi`` reports: used MiB per device (keyed by index and by UUID) and the pids
    of the processes that hold GPU memory."""

    used_mib: dict[str, float]
    holders: frozenset[int]


def gpu_state() -> GpuState | None:
    """The GPUs' used memory and memory-holding pids from ``nvidia-smi`` (None where it is missing).

    Devices are keyed by UUID always, and by ``nvidia-smi``'s index only where that index is also
    CUDA's (every GPU of one model, whose CUDA order is the PCI order nvidia-smi uses, or
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``): a wrong index would watch a trainer's GPU.
    """
    gpus = _nvidia_smi("--query-gpu=index,uuid,name,memory.used", "--format=csv,noheader,nounits")
    if gpus is None:
        return None
    rows = []
    for line in gpus.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 4:
            continue
        try:
            rows.append((parts[0], parts[1], parts[2], float(parts[3])))
        except ValueError:
            continue
    same_order = len({name for _, _, name, _ in rows}) <= 1 or os.environ.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID"
    used: dict[str, float] = {}
    for index, uuid, _, mib in rows:
        used[uuid] = mib
        if same_order:
            used[index] = mib
    apps = _nvidia_smi("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits") or ""
    holders = set()
    for line in apps.splitlines():
        head = line.split(",")[0].strip()
        if head.isdigit():
            holders.add(int(head))
    return GpuState(used, frozenset(holders))


# -- the launched server ---------------------------------------------------------------------------
def engine_cpus(env: Mapping[str, str] | None = None) -> set[int]:
    """The CPUs ``HYDROAGENT_ENGINE_CPUS`` sets aside for a launched engine (``slurm/ranks.sh`` sets it on
    rank 0 of a GPU job: a comma list of CPU ids and ``a-b`` ranges); empty when unset.

    Raises:
        EngineError: a value that is not such a list.
    """
    raw = (os.environ if env is None else env).get("HYDROAGENT_ENGINE_CPUS", "").strip()
    out: set[int] = set()
    for item in filter(None, (p.strip() for p in raw.split(","))):
        lo, sep, hi = item.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise EngineError(f"HYDROAGENT_ENGINE_CPUS={raw!r} is not a list of CPU ids",
                              "e.g. 8,9,10,11 or 8-11 (slurm/ranks.sh sets it), or unset it")
        out.update(range(int(lo), int(hi if sep else lo) + 1))
    return out


class EngineProcess:
    """An engine server this run started (see the module doc).

    ``context_tokens``: the context length a launched server is given (None: the engine's default).
    ``trainer_gpus``: ``T``, the trainer processes on this node (None: from the environment,
    :func:`trainer_processes`).
    """

    def __init__(self, settings: EngineSettings, api: EngineAPI, log_path: Path, *,
                 context_tokens: int | None = None, trainer_gpus: int | None = None,
                 stop_timeout_s: float = 30.0, memory_timeout_s: float = 180.0) -> None:
        if not settings.launch:
            raise ValueError("EngineProcess needs engine.launch")
        if context_tokens is not None and context_tokens < 1:
            raise ValueError(f"context_tokens={context_tokens!r}: must be a positive number of tokens")
        self.settings, self.api, self.log_path = settings, api, log_path
        self.context_tokens = context_tokens
        self.trainers = trainer_processes() if trainer_gpus is None else int(trainer_gpus)
        self.stop_timeout_s, self.memory_timeout_s = float(stop_timeout_s), float(memory_timeout_s)
        #: The engine's CUDA_VISIBLE_DEVICES entries (None: no CUDA device here, the variable inherited).
        self.devices = engine_devices(settings.gpus, self.trainers, visible_devices())
        self.proc: subprocess.Popen[bytes] | None = None
        self._pump: threading.Thread | None = None
        self._baseline: dict[str, float] | None = None
        self.starts = 0

    def launch_env(self) -> dict[str, str]:
        """The environment the server is started with (module doc)."""
        env = {k: v for k, v in os.environ.items()
               if k not in _LAUNCHER_VARS and not k.startswith(_LAUNCHER_PREFIXES)}
        if self.devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.devices)
        cpus = engine_cpus()
        if cpus:  # threads sized to the engine's own CPUs, not the trainer rank's OMP_NUM_THREADS
            env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(len(cpus))
        env.update(self.api.launch_env)
        return env

    def argv(self, model_dir: str) -> tuple[list[str], list[str]]:
        """The argument list, and the same with the key redacted (for the log)."""
        key = api_key(self.settings)
        argv, shown = [], []
        for arg in self.settings.launch or ():
            if key and key in arg:
                raise EngineError("engine.launch holds the API key itself",
                                  "write {api_key} where the key goes; it is read from engine.api_key_env")
            arg = arg.replace("{python}", sys.executable)  # the trainer's own interpreter (its venv)
            argv.append(arg.replace("{model}", model_dir).replace("{api_key}", key or ""))
            shown.append(arg.replace("{model}", model_dir).replace("{api_key}", "***"))
        flag = self.api.context_flag
        if self.context_tokens and flag and not _has_option(argv, flag):
            extra = [flag, str(int(self.context_tokens))]
            argv += extra
            shown += extra
        return argv, shown

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, model_dir: str) -> None:
        """Start the server on ``model_dir`` and wait for its health endpoint."""
        if self.running:
            raise EngineError("the engine is already running", "stop it first")
        argv, shown = self.argv(model_dir)
        if self.api.health(timeout=2.0):
            raise EngineError(f"engine.url {self.settings.base}: a server already answers there",
                              "stop it, or drop engine.launch to use it as it is")
        env = self.launch_env()
        if self._baseline is None:
            state = gpu_state()
            self._baseline = dict(state.used_mib) if state is not None else {}
        log.info("engine: starting %s (CUDA_VISIBLE_DEVICES=%s%s)", " ".join(shown),
                 env.get("CUDA_VISIBLE_DEVICES", "<inherited: unset>"),
                 "".join(f", {k}={v}" for k, v in self.api.launch_env.items()))
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True)
        cpus = engine_cpus()
        if cpus:  # the CPUs the job script set aside for the engine (slurm/ranks.sh), not the trainer's
            try:
                os.sched_setaffinity(self.proc.pid, cpus)
                log.info("engine: pinned to CPUs %s (HYDROAGENT_ENGINE_CPUS)", ",".join(map(str, sorted(cpus))))
            except OSError as exc:
                log.warning("engine: could not pin to HYDROAGENT_ENGINE_CPUS=%s (%s); it shares the trainer's CPUs",
                            os.environ.get("HYDROAGENT_ENGINE_CPUS"), exc)
        assert self.proc.stdout is not None
        self._pump = threading.Thread(target=_pump, args=(self.proc.stdout, self.log_path, api_key(self.settings)),
                                      name="engine-log", daemon=True)
        self._pump.start()
        self.starts += 1
        deadline = time.monotonic() + self.settings.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                self.stop(wait_gpu=False)
                raise EngineError(f"engine exited with status {code} while starting ({_tail(self.log_path)})",
                                  f"see {self.log_path} and check engine.launch")
            if self.api.health(timeout=2.0):
                self.api.reset()
                if self.api.launch_env:
                    self.api.unscaled_logprobs = True
                log.info("engine: %s answers at %s (pid %d)", self.api.name, self.settings.base, self.proc.pid)
                return
            time.sleep(0.2)
        self.stop(wait_gpu=False)
        raise EngineError(f"engine at {self.settings.base}: no health answer within "
                          f"{self.settings.start_timeout_s:g} s",
                          f"see {self.log_path}; raise engine.start_timeout_s for a large model")

    def stop(self, wait_gpu: bool = True) -> None:
        """Stop the server this run started: its whole process group (module doc); with ``wait_gpu``
        also wait until its GPU memory is released."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        pgid = proc.pid  # start_new_session: the server leads its own process group
        members = set(group_members(pgid)) | {proc.pid}
        _signal_group(pgid, signal.SIGTERM)
        try:
            proc.wait(timeout=self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            _signal_group(pgid, signal.SIGKILL)
            proc.wait()
        left = wait_group_gone(pgid, self.stop_timeout_s)
        if left:
            log.warning("engine: processes %s of the server's group %d outlived SIGTERM by %g s; sending SIGKILL",
                        left, pgid, self.stop_timeout_s)
            _signal_group(pgid, signal.SIGKILL)
            left = wait_group_gone(pgid, 10.0)
        if self._pump is not None:
            self._pump.join(timeout=5)
        if left:
            raise EngineError(f"engine: processes {left} of the stopped server's process group {pgid} are still "
                              f"alive after SIGKILL",
                              f"they hold the engine's GPUs: kill them (kill -9 {' '.join(map(str, left))}) and "
                              f"see {self.log_path}")
        log.info("engine: stopped (pid %d, process group gone)", proc.pid)
        if wait_gpu:
            self._wait_gpu_released(members)

    def _wait_gpu_released(self, members: set[int]) -> None:
        """Wait until no process of the old server holds GPU memory and the engine's devices are back
        to their pre-start use (``nvidia-smi``; nothing to wait for where it is missing)."""
        deadline = time.monotonic() + self.memory_timeout_s
        while True:
            state = gpu_state()
            if state is None:
                return
            held = sorted(members & state.holders)
            over = {d: state.used_mib[d] for d in self.devices or ()
                    if d in state.used_mib and d in (self._baseline or {})
                    and state.used_mib[d] > (self._baseline or {})[d] + GPU_SLACK_MIB}
            if not held and not over:
                return
            if time.monotonic() >= deadline:
                parts = ([f"processes {held} of the old server still hold GPU memory"] if held else []) + \
                        [f"GPU {d} uses {mib:.0f} MiB (before the first start: {(self._baseline or {})[d]:.0f} MiB)"
                         for d, mib in over.items()]
                raise EngineError(f"engine: the stopped server's GPU memory is not released after "
                                  f"{self.memory_timeout_s:g} s: {'; '.join(parts)}",
                                  "check nvidia-smi on the node and end what holds the engine's GPUs; the engine "
                                  "cannot start on a GPU without its free memory")
            time.sleep(0.5)

    def restart(self, model_dir: str) -> None:
        """Stop the server, wait until its processes and GPU memory are gone, and start it again."""
        self.stop()
        self.start(model_dir)


def _has_option(argv: Sequence[str], flag: str) -> bool:
    """True when ``argv`` sets ``flag`` (``--a-b`` or ``--a_b``, alone or as ``--a-b=V``, also inside
    one argument of a shell wrapper)."""
    names = {flag, "--" + flag[2:].replace("-", "_")}
    words = [w for arg in argv for w in arg.split()]
    return any(w in names or w.split("=", 1)[0] in names for w in words)


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


def point_link(link: Path, folder: Path) -> Path:
    """Make ``link`` a symbolic link to ``folder`` (a sibling), replaced atomically; returns ``link``."""
    tmp = link.with_name(f".{link.name}.{os.getpid()}.tmp")
    try:
        tmp.unlink()
    except FileNotFoundError:
        pass
    os.symlink(folder.name, tmp, target_is_directory=True)
    os.replace(tmp, link)
    return link


class EngineWeights:
    """Makes the engine serve the trainer's current weights (see the module doc); a context manager
    that stops a launched engine on exit.

    ``context_tokens`` and ``trainer_gpus`` go to :class:`EngineProcess` (a launched engine only).
    """

    def __init__(self, settings: EngineSettings, run_dir: Path, *, context_tokens: int | None = None,
                 trainer_gpus: int | None = None) -> None:
        self.settings = settings
        self.api = make_api(settings)
        self.root = Path(settings.weights_dir) if settings.weights_dir else run_dir / "engine-weights"
        self.process = EngineProcess(settings, self.api, run_dir / "engine.log", context_tokens=context_tokens,
                                     trainer_gpus=trainer_gpus) if settings.launch else None
        if self.process is None and not self.api.live_reload:
            raise EngineError(f"engine.api {self.api.name}: the server cannot load new weights while it runs",
                              "give engine.launch (with {model}) so the trainer restarts it on each checkpoint")
        self.current: Path | None = None
        self.pushes = 0

    def __enter__(self) -> EngineWeights:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def served_path(self) -> Path:
        """The folder path a launched server is started on: the same at every step (module doc)."""
        return self.root.resolve() / "current"

    def push(self, model: Any, tokenizer: Any, step: int) -> float:
        """Serve ``model``'s weights as those of ``step``; returns the seconds it took."""
        t0 = time.perf_counter()
        self.root.mkdir(parents=True, exist_ok=True)
        folder = save_weights(model, tokenizer, self.root / f"step-{step:06d}")
        if self.process is not None:
            served = str(point_link(self.served_path, folder))
            if not self.process.running:
                self.process.start(served)
            elif self.api.live_reload:
                self.api.load_weights(str(folder.resolve()))
            else:
                self.process.restart(served)
        else:
            self.api.load_weights(str(folder.resolve()))
        for old in self.root.glob("step-*"):
            if old.is_dir() and not old.is_symlink() and old != folder:
                shutil.rmtree(old, ignore_errors=True)
        self.current = folder
        self.pushes += 1
        seconds = time.perf_counter() - t0
        log.info("engine: serving the weights of step %d (%.2f s)", step, seconds)
        return seconds

    def close(self) -> None:
        if self.process is not None:
            try:
                self.process.stop(wait_gpu=False)
            except EngineError as exc:  # the run is over; say so, do not hide the run's own outcome
                log.error("engine: %s", exc)
