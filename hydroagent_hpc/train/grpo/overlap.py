"""One step of overlap (``max_staleness: 1``): step n+1's rollouts are played while step n trains.

Off by default (``max_staleness: 0``, on-policy: the paper's and released's loop, every step's rollouts
sampled by the weights that then train on them). With ``max_staleness: 1`` rank 0 starts the next
step's rollouts in a thread of its own (:class:`RolloutsAhead`) right after this step's training batch
is shared, and the trainer trains meanwhile; the thread is joined before the new weights reach the
generator, so every rollout of a step is sampled by one set of weights, one optimizer step older than
the weights that train on it. The loss corrects for that with truncated importance weights against
the sampler's own log-probs (``tis_cap``; :func:`~hydroagent_hpc.train.grpo.loss.truncated_importance_weights`).

What samples while the trainer updates, per generator:

* ``engine``: the engine process keeps serving the weights pushed after the previous step; the
  rollout threads only send it requests. The model object the rollout policies are built on is a
  shell on the ``meta`` device (:func:`behaviour_model`): the engine generates, so only its config is read,
  and the trainer's model is never switched to eval mode under the optimizer.
* ``local``: a copy of the policy (one more set of weights in memory), refreshed from the trainer's
  weights before each start (:meth:`BehaviourModel.refresh`): the in-process sampler decodes with it
  while the trainer's model trains.
* ``colocated`` with ``colocated.awake_while_training`` (refused without it: the engines would sleep
  while their GPUs train): the engines, awake beside the trainers, keep the weights of the last sync;
  the rollout policies are built on a shell, as for ``engine``. The weight sync after the step waits for
  the thread (and, with several ranks, every rank for rank 0: a barrier), so no engine takes new weights
  while a turn is in flight on it (docs/colocated.md, Overlap).

**Resume.** When the thread is joined, the step's rollouts are also written to
``RUN/overlap/step-NNNNNN.pkl`` (a pickle of the trainer's own record, written to a temporary file,
fsynced and renamed; read back by an unpickler that builds only this package's dataclasses, numpy
arrays and plain values, so a file planted in a run folder cannot run code), before that step's
predecessor is checkpointed. A run resumed from checkpoint n
reads ``step-(n+1)`` back instead of playing it again with the weights of step n (it was sampled by
those of step n-1, which the checkpoint does not hold), so the resumed run trains on what the
uninterrupted run trained on; without the file (a run that was on-policy) it plays the step
on-policy. After each step only the files a resume can read are kept (that of the step after the
last checkpoint and the newest), and none once the run has ended.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import logging
import os
import pickle
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

import torch

log = logging.getLogger(__name__)

__all__ = ["RolloutsAhead", "BehaviourModel", "behaviour_model", "PENDING_DIR"]

T = TypeVar("T")

#: The folder of the run that holds the next step's rollouts (one file per step).
PENDING_DIR = "overlap"
_FORMAT = 1
#: What a pending-rollouts file may build besides this package's own classes: plain containers and
#: values, numpy arrays and scalars. Anything else (``os.system``, ``builtins.eval``, ...) is refused.
_SAFE_BUILTINS = frozenset({"list", "dict", "tuple", "set", "frozenset", "int", "float", "complex", "str", "bytes",
                            "bytearray", "bool", "NoneType", "slice", "range", "object"})
_SAFE_GLOBALS = frozenset({("collections", "OrderedDict"), ("collections", "defaultdict"),
                           ("copyreg", "_reconstructor"),
                           ("datetime", "datetime"), ("datetime", "date"), ("datetime", "timedelta"),
                           ("datetime", "timezone"), ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"),
                           ("pathlib", "Path"), ("numpy", "dtype"), ("numpy", "ndarray")})
_NUMPY_RECONSTRUCT = ("numpy.core.multiarray", "numpy._core.multiarray")
_NUMPY_NUMERIC = ("numpy.core.numeric", "numpy._core.numeric")  # arrays in pickle protocol 5


def _record_type(obj: Any) -> bool:
    """A dataclass or an enum of this package: building one assigns fields, it runs nothing else."""
    return isinstance(obj, type) and (dataclasses.is_dataclass(obj) or issubclass(obj, enum.Enum))


class _OwnRecordUnpickler(pickle.Unpickler):
    """Builds only :data:`_SAFE_GLOBALS`, safe builtins, numpy's array/scalar constructors and the
    dataclasses and enums of ``hydroagent_hpc``; any other global in the stream raises
    :class:`pickle.UnpicklingError`."""

    def find_class(self, module: str, name: str) -> Any:
        allowed = ((module == "builtins" and name in _SAFE_BUILTINS) or (module, name) in _SAFE_GLOBALS
                   or (module in _NUMPY_RECONSTRUCT and name in ("_reconstruct", "scalar"))
                   or (module in _NUMPY_NUMERIC and name == "_frombuffer")
                   or (module.split(".")[0] == "hydroagent_hpc" and _record_type(super().find_class(module, name))))
        if not allowed:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a pending-rollouts file")
        return super().find_class(module, name)


class BehaviourModel:
    """The model the next step's rollout policies are built on while the trainer's model trains.

    ``model``: a copy of the policy that the in-process sampler decodes with (``copy=True``), or a
    shell without weights on the ``meta`` device when an engine generates. ``version``: the optimizer
    steps of the weights it samples with (set by :meth:`refresh`).
    """

    def __init__(self, model: Any, *, copy_weights: bool) -> None:
        self.copy_weights = copy_weights
        if copy_weights:
            self.model = copy.deepcopy(model).eval()
            self.model.requires_grad_(False)
        else:
            with torch.device("meta"):
                self.model = type(model)(model.config).eval()
        self.version = -1

    def refresh(self, trainer_model: Any, version: int) -> Any:
        """Take the trainer's current weights (a copy: they are those of ``version`` optimizer steps);
        returns the model to sample with."""
        if self.copy_weights:
            with torch.no_grad():
                for mine, theirs in zip(self.model.parameters(), trainer_model.parameters(), strict=True):
                    mine.copy_(theirs)
                for mine, theirs in zip(self.model.buffers(), trainer_model.buffers(), strict=True):
                    mine.copy_(theirs)
        self.version = int(version)
        return self.model


def behaviour_model(generator: str, model: Any) -> BehaviourModel:
    """The :class:`BehaviourModel` of ``generator`` (``local``: a copy; ``engine`` and ``colocated``, whose
    engines sample: a shell)."""
    return BehaviourModel(model, copy_weights=generator == "local")


class RolloutsAhead(Generic[T]):
    """Rank 0's rollouts of the next step, played in a thread while this step trains (module doc).

    ``run_dir``: the run folder (the files of ``RUN/overlap``); ``behaviour``: what the rollout policies
    sample with meanwhile. :meth:`start` the next step's play, :meth:`wait` for it (before the
    generator's weights change), :meth:`take` it at that step's start. As a context manager, leaving
    the block (an error in the trainer's thread) joins a thread still playing, so nothing it writes
    outlives the run.
    """

    def __init__(self, run_dir: Path, behaviour: BehaviourModel) -> None:
        self.folder = Path(run_dir) / PENDING_DIR
        self.behaviour = behaviour
        self._thread: threading.Thread | None = None
        self._step: int | None = None
        self._result: T | None = None
        self._error: BaseException | None = None

    def __enter__(self) -> RolloutsAhead[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            log.info("waiting for the rollouts of step %s, played ahead, to end", self._step)
            self._thread.join()
            self._thread = None

    def _path(self, step: int) -> Path:
        return self.folder / f"step-{step:06d}.pkl"

    def start(self, step: int, play: Callable[[], T]) -> None:
        """Play step ``step``'s rollouts (``play()``) in a thread of its own."""
        if self._thread is not None:
            raise RuntimeError(f"the rollouts of step {self._step} are still being played")
        self._step, self._result, self._error = step, None, None

        def body() -> None:
            try:
                self._result = play()
            except BaseException as exc:  # re-raised in the trainer's thread by wait()
                self._error = exc

        self._thread = threading.Thread(target=body, name=f"rollouts-step-{step}", daemon=True)
        self._thread.start()

    def wait(self) -> None:
        """Join the thread (nothing when none runs); re-raise what it raised; write the step's file."""
        if self._thread is None:
            return
        self._thread.join()
        self._thread = None
        if self._error is not None:
            error, self._error, self._step = self._error, None, None
            raise error
        assert self._step is not None
        self._write(self._step, self._result)

    def _write(self, step: int, result: Any) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self._path(step)
        tmp = path.with_suffix(".pkl.tmp")
        with open(tmp, "wb") as fh:
            pickle.dump({"format": _FORMAT, "step": step, "rollouts": result}, fh, protocol=pickle.HIGHEST_PROTOCOL)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)

    def take(self, step: int) -> T | None:
        """The rollouts of ``step`` if they were played ahead (or read back by :meth:`resume`), else None."""
        if self._thread is not None:
            raise RuntimeError(f"take({step}) while the rollouts of step {self._step} are still being played")
        if self._step != step:
            return None
        result, self._step, self._result = self._result, None, None
        return result

    def resume(self, step: int) -> None:
        """A resumed run: read back the rollouts of ``step`` (the one after the checkpoint) if they were
        played ahead; a file that is missing, cut or of another step is ignored (the step plays anew)."""
        path = self._path(step)
        if not path.is_file():
            return
        try:
            with open(path, "rb") as fh:
                record = _OwnRecordUnpickler(fh).load()  # written by _write; only our classes are built
        except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ValueError) as exc:
            log.warning("%s: cannot be read (%s: %s); step %d's rollouts are played again", path,
                        type(exc).__name__, exc, step)
            return
        if not isinstance(record, dict) or record.get("format") != _FORMAT or record.get("step") != step:
            log.warning("%s: not the rollouts of step %d; they are played again", path, step)
            return
        log.info("resume: step %d's rollouts, played ahead before the kill, read back from %s", step, path)
        self._step, self._result = step, record["rollouts"]

    def prune(self, saved_step: int) -> None:
        """Remove the files no resume can read: a resume from the checkpoint of ``saved_step`` reads
        ``saved_step + 1``, one from the next checkpoint the newest file (written before that checkpoint)."""
        if not self.folder.is_dir():
            return
        files: dict[int, list[Path]] = {}
        for path in self.folder.glob("step-*.pkl*"):
            digits = path.name[len("step-"):].split(".")[0]
            if digits.isdigit():
                files.setdefault(int(digits), []).append(path)
        newest = max((step for step, paths in files.items() if any(p.suffix == ".pkl" for p in paths)), default=None)
        for step, paths in files.items():
            if step <= saved_step or (step != saved_step + 1 and step != newest):
                for path in paths:
                    path.unlink(missing_ok=True)
