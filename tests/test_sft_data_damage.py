"""Damaged SFT data is refused whole, with the file and the row, before anything trains (issue 32, item 4).

A real data file is built once: a heuristic campaign on a small synthetic basin, then
:func:`~hydroagent_hpc.train.sft.data.build_sft_data` (what ``hydroagent train sft-data`` runs) with
the tiny tokenizer. The cases are generated from that file: every dataset deleted, one entry short,
one entry long, of the wrong type and of the wrong shape; values damaged at a chosen example (a NaN,
infinite or negative weight, offsets that do not increase, start elsewhere or end outside the data,
spans outside their sequence, token ids below 0 or beyond the vocabulary, mask values other than 0
and 1); every weight 0, no assistant token, weights whose sum overflows; the schema and its version
missing or unknown; no example at all; the file cut short. Which datasets the trainer needs and
what each damage must do is written here, not read from the code.

Each damaged file runs ``hydroagent train sft CONFIG --out RUN`` in this process: it must end in
exit status 2 and one line that names the file, the dataset (or attribute) and, for damage at one
example, that example, with no run folder created (nothing was trained). Damage to what the trainer
does not read (``best_nse``, ``source``, ``basin_id``, ``agent``), a zero weight beside positive ones,
whole-number weights and a version 1 file must still open, as the trainer opens them (training a
good file is tests/test_sft.py's).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
h5py = pytest.importorskip("h5py")
np = pytest.importorskip("numpy")

from hydroagent_hpc.cli import main  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
#: What the trainer reads of every example (the other datasets are provenance).
REQUIRED = ("input_ids", "assistant_mask", "offsets", "spans", "span_offsets", "weight", "episode_id")
#: Read when present: one entry per example.
PER_EXAMPLE_OPTIONAL = ("variant", "n_variants")
#: Never read by the trainer.
UNREAD = ("best_nse", "source", "basin_id", "agent")
TOKEN_LEVEL = ("input_ids", "assistant_mask")
INDEXES = ("offsets", "span_offsets")
VOCAB = 1024  # the tiny tokenizer's
CASE_TIMEOUT_S = 240
ROW = 1  # the example the row damage is put in


@pytest.fixture(scope="module")
def data_file(tmp_path_factory) -> Path:
    """A real SFT data file: two heuristic episodes on a small basin, tokenised with the tiny tokenizer."""
    from hydroagent_hpc.campaign import load_campaign, run_campaign
    from hydroagent_hpc.sim.synth.basins import synthesize_basin
    from hydroagent_hpc.train.sft.data import build_sft_data

    tmp = tmp_path_factory.mktemp("sft-damage")
    control = synthesize_basin(tmp / "syn", name="syn_small", area_km2=80.0, window_days=10, warmup_days=3, seed=7,
                               start="2021-07-01")
    spec = tmp / "teach.yaml"
    spec.write_text(f"name: teach\nbasins: [{control.parent}]\nagents:\n  - {{name: heuristic, kind: heuristic}}\n"
                    "seeds: [0, 1, 2]\nenv: {preset: paper, max_simulations: 2, max_turns: null, patience: null, "
                    "target_nse: 0.99}\n")
    run_campaign(load_campaign(spec), tmp / "teach.h5", workers=1, progress=False)
    build_sft_data([tmp / "teach.h5"], tmp / "data.h5", preset="released", tokenizer="tiny", max_tokens=32768)
    with h5py.File(tmp / "data.h5", "r") as f:
        assert len(f["weight"]) == 3 and set(REQUIRED + PER_EXAMPLE_OPTIONAL + UNREAD) == set(f)
    return tmp / "data.h5"


@pytest.fixture(autouse=True)
def _deadline():
    def expired(signum, frame):
        raise TimeoutError(f"the case ran for more than {CASE_TIMEOUT_S} s")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(CASE_TIMEOUT_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


# --------------------------------------------------------------------------------------------- damage
Damage = Callable[[Any], None]  # applied to the open h5py.File


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    damage: Damage
    refused: bool
    names: tuple[str, ...] = ()  # what the error must name (dataset or attribute)
    row: int | None = None  # the example it must name
    whole_file: Callable[[Path], None] | None = None  # damage to the bytes instead


def _replace(f: Any, name: str, data: Any) -> None:
    attrs = dict(f[name].attrs) if name in f else {}
    del f[name]
    if np.asarray(data).dtype.kind in "OSU":
        f.create_dataset(name, data=[x.decode() if isinstance(x, bytes) else x for x in data],
                         dtype=h5py.string_dtype("utf-8"))
    else:
        f.create_dataset(name, data=data)
    f[name].attrs.update(attrs)


def _edit(name: str, fn: Callable[[np.ndarray, Any], np.ndarray]) -> Damage:
    def damage(f: Any) -> None:
        _replace(f, name, fn(f[name][()].copy(), f))
    return damage


def _set(name: str, index: Any, value: Any) -> Damage:
    def fn(a: np.ndarray, f: Any) -> np.ndarray:
        a[index(f) if callable(index) else index] = value
        return a
    return _edit(name, fn)


def _in_row(offset: int = 5) -> Callable[[Any], int]:
    """A token position inside example ROW."""
    return lambda f: int(f["offsets"][ROW]) + offset


def _span_in_row(f: Any) -> int:
    return int(f["span_offsets"][ROW])


def _dataset_cases() -> list[Case]:
    out = []
    for name in REQUIRED + PER_EXAMPLE_OPTIONAL + UNREAD:
        needed = name in REQUIRED
        sized = name in REQUIRED + PER_EXAMPLE_OPTIONAL
        names = (name,) if sized else ()

        def delete(f: Any, name: str = name) -> None:
            del f[name]

        out.append(Case(f"{name}:missing", delete, needed, names))
        out.append(Case(f"{name}:one-short", _edit(name, lambda a, f: a[:-1]), sized, names))
        out.append(Case(f"{name}:one-long", _edit(name, lambda a, f: np.concatenate([a, a[-1:]])), sized, names))
        if name not in ("episode_id", "basin_id", "agent"):
            out.append(Case(f"{name}:text", _edit(name, lambda a, f: np.array(["x"] * len(a), dtype=object)),
                            sized, names))
            out.append(Case(f"{name}:2-D", _edit(name, lambda a, f: a.reshape(len(a), -1)[:, :1][:, :, None]
                                                 if a.ndim == 2 else a.reshape(-1, 1)), sized, names))
    return out


def _value_cases() -> list[Case]:
    last = -1
    return [
        *[Case(f"weight[{ROW}]={v!r}", _set("weight", ROW, v), True, ("weight",), ROW)
          for v in (float("nan"), float("inf"), -float("inf"), -1.0, -1e-12)],
        Case("weight:all-zero", _edit("weight", lambda a, f: np.zeros_like(a)), True, ("weight",)),
        Case("weight:sum-overflows", _edit("weight", lambda a, f: np.full_like(a, 1e308)), True, ("weight",)),
        Case(f"weight[{ROW}]=0", _set("weight", ROW, 0.0), False),
        Case("weight:as-int", _edit("weight", lambda a, f: np.ones(len(a), dtype=np.int64)), False),
        Case(f"offsets[{ROW + 1}]=offsets[{ROW}]", _edit("offsets", lambda a, f: _at(a, ROW + 1, a[ROW])), True,
             ("offsets",), ROW),
        Case(f"offsets[{ROW}]>offsets[{ROW + 1}]", _edit("offsets", lambda a, f: _at(a, ROW, a[ROW + 1] + 1)), True,
             ("offsets",), ROW),
        Case("offsets[0]=1", _set("offsets", 0, 1), True, ("offsets",), 0),
        Case(f"offsets[{ROW}]=-3", _set("offsets", ROW, -3), True, ("offsets",), ROW - 1),
        Case("offsets[-1]:past-the-data", _edit("offsets", lambda a, f: _at(a, last, a[last] + 5)), True,
             ("offsets",)),
        Case("offsets[-1]:short-of-the-data", _edit("offsets", lambda a, f: _at(a, last, a[last] - 5)), True,
             ("offsets",)),
        Case("span_offsets:decrease", _edit("span_offsets", lambda a, f: _at(a, ROW, a[ROW + 1] + 1)), True,
             ("span_offsets",), ROW),
        Case("span_offsets[0]=1", _set("span_offsets", 0, 1), True, ("span_offsets",), 0),
        Case("span_offsets[-1]:past-the-spans", _edit("span_offsets", lambda a, f: _at(a, last, a[last] + 1)), True,
             ("span_offsets",)),
        Case(f"spans:end-past-row-{ROW}", _edit("spans", lambda a, f: _at2(a, _span_in_row(f), 1,
                                                                            _length(f, ROW) + 1)),
             True, ("spans",), ROW),
        Case(f"spans:empty-turn-row-{ROW}", _edit("spans", lambda a, f: _at2(a, _span_in_row(f), 0,
                                                                              a[_span_in_row(f), 1])),
             True, ("spans",), ROW),
        Case(f"spans:negative-row-{ROW}", _edit("spans", lambda a, f: _at2(a, _span_in_row(f), 0, -1)), True,
             ("spans",), ROW),
        *[Case(f"input_ids:row-{ROW}={v}", _set("input_ids", _in_row(), v), True, ("input_ids",) if v < 0 else (),
               ROW) for v in (-1, VOCAB, 2**31 - 1)],
        Case("input_ids:as-float", _edit("input_ids", lambda a, f: a.astype(np.float32)), True, ("input_ids",)),
        Case(f"assistant_mask:row-{ROW}=2", _set("assistant_mask", _in_row(), 2), True, ("assistant_mask",), ROW),
        Case("assistant_mask:all-zero", _edit("assistant_mask", lambda a, f: np.zeros_like(a)), True,
             ("assistant_mask",)),
        Case("assistant_mask:as-float", _edit("assistant_mask", lambda a, f: a.astype(np.float64)), True,
             ("assistant_mask",)),
    ]


def _at(a: np.ndarray, i: int, v: Any) -> np.ndarray:
    a[i] = v
    return a


def _at2(a: np.ndarray, i: int, j: int, v: Any) -> np.ndarray:
    a[i, j] = v
    return a


def _length(f: Any, row: int) -> int:
    return int(f["offsets"][row + 1] - f["offsets"][row])


def _attr_cases() -> list[Case]:
    def attr(name: str, value: Any) -> Damage:
        def damage(f: Any) -> None:
            if value is None:
                del f.attrs[name]
            else:
                f.attrs[name] = value
        return damage

    return [Case("schema:missing", attr("schema", None), True, ("schema",)),
            Case("schema:other", attr("schema", "hydroagent_hpc.episodes"), True, ("schema",)),
            Case("schema_version:missing", attr("schema_version", None), True, ("schema_version",)),
            *[Case(f"schema_version={v!r}", attr("schema_version", v), True, ("schema_version",))
              for v in (0, 3, 99, "2", 2.5)],
            Case("schema_version=1", attr("schema_version", 1), False)]


def _empty(f: Any) -> None:
    for name in REQUIRED + PER_EXAMPLE_OPTIONAL + UNREAD:
        shape = (0, 2) if name == "spans" else (1,) if name in INDEXES else (0,)
        dtype = h5py.string_dtype("utf-8") if name in ("episode_id", "basin_id", "agent") else f[name].dtype
        del f[name]
        f.create_dataset(name, shape=shape, dtype=dtype)


def _cut(share: float) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        data = path.read_bytes()
        path.write_bytes(data[:int(len(data) * share)])
    return damage


def _no_op(f: Any) -> None:
    return None


CASES: list[Case] = [
    *_dataset_cases(), *_value_cases(), *_attr_cases(),
    Case("no-example", _empty, True),
    *[Case(f"file-cut-at-{int(s * 100)}%", _no_op, True, whole_file=_cut(s)) for s in (0.1, 0.5, 0.9, 0.99)],
    Case("file-empty", _no_op, True, whole_file=_cut(0.0)),
]


def test_the_cases_cover_every_dataset_of_a_real_file(data_file):
    with h5py.File(data_file, "r") as f:
        names = set(f)
    damaged = {c.id.split(":")[0].split("[")[0] for c in CASES}
    assert names <= damaged, names - damaged
    assert len(CASES) > 80


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_damaged_sft_data_is_refused_with_file_and_row_before_training(case, data_file, tmp_path, capsys):
    data = tmp_path / "damaged.h5"
    shutil.copy(data_file, data)
    with h5py.File(data, "a") as f:
        case.damage(f)
    if case.whole_file is not None:
        case.whole_file(data)
    if not case.refused:  # what the trainer opens and checks (training itself: tests/test_sft.py)
        from hydroagent_hpc.train.sft.data import SFTDataset

        ds = SFTDataset(data)
        assert len(ds) == 3 and all(int(ds[i]["input_ids"].numel()) > 0 for i in range(len(ds)))
        return
    cfg = tmp_path / "sft.yaml"
    cfg.write_text(f"data: {data}\nmodel: tiny\nmax_steps: 1\nlr: 1.0e-3\nmicro_batch_size: 1\nseed: 0\n")
    run = tmp_path / "run"
    rc = main(["train", "sft", str(cfg), "--out", str(run)])
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    assert rc == 2, f"exit {rc} (trained on damaged data?): {err[-1500:]}"
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"not one line: {err[-2000:]}"
    assert str(data) in err, f"the file is not named: {err}"
    for name in case.names:
        assert name in err, f"{name!r} not named: {err}"
    if case.row is not None:
        assert f"example {case.row}" in err, f"example {case.row} not named: {err}"
    assert not run.exists(), "a run folder was created for damaged data"
