"""Live metrics: each trainer's metric rows also to TensorBoard and Weights & Biases, and a progress display.

Both trainers write one row per optimizer step into ``RUN/metrics.csv``
(:class:`~hydroagent_hpc.train.rundir.MetricsCSV`). When the config asks for it (``report_to``), the
same row goes to each :class:`MetricSink` as it is written; nothing else in the trainers knows about
them. The choice is made once, by :func:`open_live` on rank 0 (the only process that writes rows):

- ``tensorboard``: :class:`TensorBoardSink`, event files under ``RUN/tensorboard`` (the standard
  ``SummaryWriter``); every row is flushed as it is written.
- ``wandb``: :class:`WandbSink`, one W&B run whose files are under ``RUN/wandb``; ``WANDB_MODE=offline``
  writes it without a network (``wandb sync RUN/wandb/offline-run-*`` uploads it later). The API key
  is W&B's own business (``WANDB_API_KEY`` or ``wandb login``): nothing here reads or writes one.

Each numeric, finite value of a row is logged under ``<trainer>/<column>`` (``sft/loss``,
``grpo/reward_mean``, ``grpo/val_best_nse_mean``) at the row's step; text columns and missing values
(NaN, empty) are left out. Extra values that are in no row (GRPO's step-timeline phase seconds,
``timeline/rank0/train_s``) go to the sinks only (:meth:`Live.log`).

**Resume.** The rows a checkpoint holds were logged by the run that wrote them; a resumed run logs
only the steps after its checkpoint. TensorBoard: the writer starts with ``purge_step`` = the
checkpoint's step + 1, so a reader drops what the interrupted run logged after the checkpoint (the
steps that run again) and every step is shown once. W&B: the run's id is kept in
``RUN/wandb/run-id`` and the resumed run continues it (``resume="allow"``); W&B itself ignores a step
lower than one it already holds, so a step replayed after the checkpoint keeps the value the
interrupted run logged there (metrics.csv and TensorBoard hold the new one).

**Evaluations.** ``hydroagent train eval ... --report-to tensorboard`` (:class:`EvalLiveSettings`) sends
the evaluation's summary through the same sinks (:func:`report_evaluation`), each value under
``eval/<name>`` (``eval/best_nse_mean``, ``eval/best_nse/<basin>``), into ``L/tensorboard`` and
``L/wandb``: for a run's ``final/`` (a folder whose parent holds ``metrics.csv``) ``L`` is
``RUN/eval-<store name>`` and the step is the run's last one, so ``tensorboard --logdir RUN`` shows the
evaluation beside the training curves; for any other checkpoint or a URL, ``L`` is ``STORE.live`` next
to the store, at step 0. The summary covers the whole store, so a rerun replaces the event file it
wrote before (and starts a new W&B run).

**Progress.** :class:`Progress` shows the steps going by: a tqdm bar with tokens/s and the time left
when stderr is a terminal, otherwise (a batch job's log) a plain log line at most every
:data:`LOG_EVERY_S` seconds and at the last step, with the same figures.
"""

from __future__ import annotations

import csv
import importlib.util
import logging
import math
import os
import secrets
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any, Protocol

from hydroagent_hpc.errors import ConfigError, one_line
from hydroagent_hpc.settings import Settings, setting

log = logging.getLogger(__name__)

__all__ = ["REPORT_TO", "LIVE_KEYS", "LOG_EVERY_S", "MetricSink", "TensorBoardSink", "WandbSink", "Live", "Progress",
           "open_live", "require_installed", "metric_values", "tag", "is_terminal", "report_to_setting",
           "wandb_project_setting", "run_name_setting", "EvalLiveSettings", "evaluation_live_dir",
           "report_evaluation"]

#: Where metric rows may also go (``report_to``).
REPORT_TO = ("tensorboard", "wandb")
#: The config keys that only choose where metrics are shown: a resumed run may change them.
LIVE_KEYS = ("report_to", "wandb_project", "run_name")
#: Seconds between two progress lines when stderr is not a terminal.
LOG_EVERY_S = 60.0
_EXTRA = {"tensorboard": ("tensorboard", "torch.utils.tensorboard"), "wandb": ("wandb", "wandb")}


def report_to_setting(help: str = "where the metric rows also go while the run trains: tensorboard "
                                   "(RUN/tensorboard), wandb (RUN/wandb; WANDB_MODE=offline needs no network; "
                                   "the authors used W&B)") -> Any:
    """The ``report_to`` field of a trainer config (``tuple[str, ...]``)."""
    return setting((), choices=REPORT_TO, unique=True, source="ours", help=help,
                   fix="list any of tensorboard, wandb (e.g. report_to: [tensorboard]), or [] for none")


def wandb_project_setting() -> Any:
    """The ``wandb_project`` field of a trainer config (``str``)."""
    return setting("hydroagent", nonempty=True, help="the W&B project of the run (report_to: wandb)")


def run_name_setting() -> Any:
    """The ``run_name`` field of a trainer config (``str | None``)."""
    return setting(None, help="the run's name in W&B (null: the run folder's name)")


class MetricSink(Protocol):
    """Somewhere a trainer's metric values go as they are made."""

    def log(self, step: int, values: Mapping[str, float]) -> None:
        """``values`` (tag -> number) at optimizer step ``step``."""

    def close(self, failed: bool = False) -> None:
        """Flush and release; ``failed``: the run stopped on an error."""


def require_installed(report_to: Sequence[str]) -> None:
    """Refuse, in one line naming the extra to install, a ``report_to`` whose library is missing."""
    for name in report_to:
        package, module = _EXTRA[name]
        try:
            found = importlib.util.find_spec(package) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise ConfigError(f"report_to: {name} is asked for but the {package} package is not installed"
                              + (f" (needed by {module})" if module != package else ""),
                              f"pip install 'hydroagent-hpc[{name}]', or drop {name} from report_to")


def tag(kind: str, column: str) -> str:
    """The name a metric column is logged under: ``sft/loss``, ``grpo/kl``."""
    return f"{kind}/{column}"


def metric_values(kind: str, row: Mapping[str, Any], step_column: str = "step") -> dict[str, float]:
    """The numeric, finite values of ``row`` by :func:`tag` (text, None, '' and NaN left out)."""
    out: dict[str, float] = {}
    for column, value in row.items():
        if column == step_column or isinstance(value, (bool, str)) or value is None:
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(number):
            out[tag(kind, column)] = number
    return out


class TensorBoardSink:
    """Event files under ``folder``; the step is the global step, and a resumed run purges what was
    logged after its checkpoint (``purge_step``)."""

    def __init__(self, folder: Path, resumed_step: int | None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        folder.mkdir(parents=True, exist_ok=True)
        # a fresh start purges every step an earlier attempt in this folder logged (as metrics.csv starts over)
        self.writer = SummaryWriter(log_dir=str(folder), purge_step=(resumed_step or 0) + 1)
        self.folder = folder

    def log(self, step: int, values: Mapping[str, float]) -> None:
        for name, value in values.items():
            self.writer.add_scalar(name, value, global_step=step)
        self.writer.flush()  # a killed run leaves every logged row on disk

    def close(self, failed: bool = False) -> None:
        self.writer.close()


class WandbSink:
    """One W&B run, its files under ``run_dir/wandb``; a resumed run continues the same run id."""

    def __init__(self, run_dir: Path, project: str, name: str | None, config: Mapping[str, Any],
                 resumed_step: int | None) -> None:
        import wandb

        folder = run_dir / "wandb"
        folder.mkdir(parents=True, exist_ok=True)
        id_file = folder / "run-id"
        run_id = id_file.read_text().strip() if resumed_step is not None and id_file.is_file() else ""
        if not run_id:
            run_id = secrets.token_hex(4)
            id_file.write_text(run_id + "\n")
        try:
            self.run = wandb.init(project=project, name=name or run_dir.name, id=run_id, resume="allow",
                                  dir=str(run_dir), config=dict(config), reinit="create_new")
        except Exception as exc:  # wandb raises its own errors (no network, no login, a bad project)
            raise ConfigError(f"report_to: wandb: cannot start the W&B run ({one_line(exc)})",
                              "set WANDB_MODE=offline to write it under RUN/wandb without a network and "
                              "`wandb sync` it later, log in (WANDB_API_KEY or `wandb login`), or drop wandb "
                              "from report_to") from None
        self.folder = folder

    def log(self, step: int, values: Mapping[str, float]) -> None:
        self.run.log(dict(values), step=step)

    def close(self, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else 0)


def is_terminal(stream: IO[str] | None = None) -> bool:
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


class Progress:
    """Rank 0's progress: a tqdm bar (tokens/s, the loss or reward, the time left) when ``stream`` is a
    terminal, otherwise a log line at most every :data:`LOG_EVERY_S` seconds and at the last step."""

    def __init__(self, kind: str, total: int, initial: int, stream: IO[str] | None = None,
                 every_s: float | None = None) -> None:
        self.kind, self.total, self.initial = kind, int(total), int(initial)
        self.every_s = LOG_EVERY_S if every_s is None else every_s
        self.started = self.last_line = time.monotonic()
        self.tokens = 0.0
        self.bar: Any = None
        self._redirect: Any = None
        stream = sys.stderr if stream is None else stream
        if is_terminal(stream):
            from tqdm.auto import tqdm
            from tqdm.contrib.logging import logging_redirect_tqdm

            self.bar = tqdm(total=self.total, initial=self.initial, desc=kind, unit="step", leave=False, file=stream,
                            dynamic_ncols=True, mininterval=0)  # a step takes seconds: draw each one
            self._redirect = logging_redirect_tqdm()  # log lines print above the bar, not through it
            self._redirect.__enter__()

    def update(self, row: Mapping[str, Any]) -> None:
        step = int(row["step"])
        tokens = _number(row.get("tokens"))
        self.tokens += tokens if math.isfinite(tokens) else 0.0
        elapsed = max(time.monotonic() - self.started, 1e-9)
        rate = self.tokens / elapsed
        figure = ("loss", _number(row.get("loss"))) if "reward_mean" not in row else (
            "reward", _number(row.get("reward_mean")))
        if self.bar is not None:
            self.bar.set_postfix_str(f"{rate:,.0f} tok/s, {figure[0]} {figure[1]:.4g}", refresh=False)
            self.bar.update(step - self.bar.n)
            return
        now = time.monotonic()
        if now - self.last_line < self.every_s and step < self.total:
            return
        self.last_line = now
        done = step - self.initial
        left = (self.total - step) * elapsed / done if done > 0 else float("nan")
        log.info("%s: step %d/%d (%.0f%%), %.0f tokens/s, %s %.4g, elapsed %s, ETA %s", self.kind, step, self.total,
                 100.0 * step / max(self.total, 1), rate, figure[0], figure[1], _clock(elapsed), _clock(left))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self._redirect is not None:
            self._redirect.__exit__(None, None, None)
            self._redirect = None


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def _clock(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class Live:
    """What a metric-row writer feeds besides its file: the sinks asked for and the progress display."""

    def __init__(self, kind: str, sinks: Sequence[MetricSink] = (), progress: Progress | None = None) -> None:
        self.kind, self.sinks, self.progress = kind, list(sinks), progress

    def row(self, row: Mapping[str, Any]) -> None:
        """A metric row, as it goes into metrics.csv."""
        self.log(int(row["step"]), metric_values(self.kind, row))
        if self.progress is not None:
            self.progress.update(row)

    def log(self, step: int, values: Mapping[str, float]) -> None:
        """Values in no row (already tagged) at ``step``, to the sinks only."""
        if not values:
            return
        for sink in self.sinks:
            sink.log(step, values)

    def close(self, failed: bool = False) -> None:
        if self.progress is not None:
            self.progress.close()
            self.progress = None
        sinks, self.sinks = self.sinks, []
        for sink in sinks:
            sink.close(failed)


def open_live(kind: str, config: Any, run_dir: str | os.PathLike[str], resumed_step: int | None,
              total: int, progress: bool = True) -> Live:
    """Rank 0's :class:`Live` for a run of trainer ``kind`` ("sft", "grpo") resumed at ``resumed_step`` (None:
    a fresh start): the sinks ``config.report_to`` names (with ``wandb_project``, ``run_name``) and the
    progress display up to step ``total`` (``progress``: False for none)."""
    run_dir = Path(run_dir)
    report_to = tuple(getattr(config, "report_to", ()))
    require_installed(report_to)
    sinks: list[MetricSink] = []
    try:
        if "tensorboard" in report_to:
            sinks.append(TensorBoardSink(run_dir / "tensorboard", resumed_step))
        if "wandb" in report_to:
            record = config.to_dict() if hasattr(config, "to_dict") else {}
            sinks.append(WandbSink(run_dir, str(getattr(config, "wandb_project", "") or "hydroagent"),
                                   getattr(config, "run_name", None), {"trainer": kind, **record}, resumed_step))
    except BaseException:
        for sink in sinks:
            sink.close(failed=True)
        raise
    if sinks:
        log.info("live metrics: %s", ", ".join(f"{n} ({run_dir / n})" for n in report_to))
    return Live(kind, sinks, Progress(kind, total, resumed_step or 0) if progress else None)


@dataclass(frozen=True)
class EvalLiveSettings(Settings):
    """Where ``hydroagent train eval`` also sends its summary (its ``--report-to``, ``--wandb-project`` and
    ``--run-name`` options are made from these fields)."""

    report_to: tuple[str, ...] = report_to_setting(
        "where the evaluation's summary also goes: tensorboard, wandb (RUN/eval-<store name>/ when evaluating "
        "a run's final/, at the run's last step; otherwise STORE.live/ next to the store, at step 0)")
    wandb_project: str = wandb_project_setting()
    run_name: str | None = setting(None, help="the evaluation's name in W&B (null: <run folder>/eval-<store name> "
                                              "or the store's name)")


def _last_step(metrics: Path) -> int:
    """The step of the last row of a run's ``metrics.csv`` (0 when it holds none)."""
    last = 0
    with open(metrics, newline="") as fh:
        reader = csv.DictReader(fh)
        if reader.fieldnames is None or "step" not in reader.fieldnames:
            raise ConfigError(f"{metrics}:1: no step column: not a run's metrics.csv",
                              "evaluate a run's final/ whose metrics.csv the trainer wrote, or a copy of the "
                              "checkpoint outside the run folder")
        for line, row in enumerate(reader, start=2):
            try:
                last = int(row["step"])
            except (TypeError, ValueError):
                raise ConfigError(f"{metrics}:{line}: step {row['step']!r} is not a whole number",
                                  "repair or remove the broken row (the trainer writes whole steps)") from None
    return last


def evaluation_live_dir(target: str, out: str | os.PathLike[str]) -> tuple[Path, int]:
    """Where an evaluation of ``target`` into store ``out`` logs its summary, and at which step: a run's
    ``final/`` (its parent holds ``metrics.csv``): ``RUN/eval-<store name>`` at the run's last step;
    anything else: ``STORE.live`` next to the store, at step 0."""
    out = Path(out)
    folder = Path(target).expanduser()
    if not target.startswith(("http://", "https://")) and folder.name == "final" and \
            (folder.parent / "metrics.csv").is_file():
        run = folder.resolve().parent
        return run / f"eval-{out.stem}", _last_step(run / "metrics.csv")
    return out.with_name(out.stem + ".live"), 0


def report_evaluation(values: Mapping[str, float], settings: EvalLiveSettings, target: str,
                      out: str | os.PathLike[str]) -> Path | None:
    """An evaluation's summary ``values`` (named as :func:`tag` names them, ``eval/...``) to the sinks
    ``settings.report_to`` names, in :func:`evaluation_live_dir`; the folder, or None when none was asked."""
    if not settings.report_to:
        return None
    require_installed(settings.report_to)
    folder, step = evaluation_live_dir(target, out)
    board = folder / "tensorboard"
    if "tensorboard" in settings.report_to and board.is_dir():
        for old in board.glob("events.out.tfevents.*"):  # the summary of the whole store replaces the last one
            old.unlink()
    name = settings.run_name or (f"{folder.parent.name}/{folder.name}" if folder.name.startswith("eval-")
                                 else folder.name)
    live = open_live("eval", replace(settings, run_name=name), folder, None, 0, progress=False)
    try:
        live.log(step, values)
    except BaseException:
        live.close(failed=True)
        raise
    live.close()
    log.info("evaluation summary: %d values at step %d to %s", len(values), step, folder)
    return folder
