"""Bad training configuration values are refused before anything loads (issue 32, item 4).

Every case is generated from the configuration classes themselves: each field of
:class:`~hydroagent_hpc.train.sft.config.SFTConfig`, :class:`~hydroagent_hpc.train.grpo.config.GRPOConfig`,
its ``engine`` section (:class:`~hydroagent_hpc.train.generation.engine_config.EngineSettings`), the
pipeline's ``sft:`` and ``grpo:`` sections and the pipeline site file
(:class:`~hydroagent_hpc.pipeline.submit.Site`) is replaced in turn by NaN, infinities, -1, 0, a huge
value, text and a true/false (a number for true/false fields, an unknown word for choices), every
mapping gets an unknown key, and a list of pairs of values that are valid alone but not together
(warm-up longer than the run, ``max_new_tokens`` not below the context, a norm length without the
aggregation that uses it, ...) is added.

Which values a field must refuse is written here, field by field (:data:`SFT_DOMAIN`,
:data:`GRPO_DOMAIN`, ...), independently of the limits the code declares; a test fails when a
numeric field has no entry, so a field added later must be classified. A value the oracle accepts
must load (and keep its value); a value it refuses must make the loader raise, and then the real
command (``hydroagent train sft|grpo CONFIG --out RUN``, ``hydroagent pipeline run``, ``hydroagent
pipeline submit --site``), run in this process, must exit 2 with one line, no traceback, naming the
key and FILE:LINE of the offending key, before the run folder exists (so before a model, a
tokenizer or any data was read: the trainers read those only after the config).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
import types
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml

from hydroagent_hpc.cli import main

ROOT = Path(__file__).resolve().parents[1]
NAN, INF = float("nan"), float("inf")
HUGE_FLOAT, HUGE_INT = 1e308, 2**62

# --------------------------------------------------------------------------------------------- the oracle
# field -> (kind, lowest, lowest allowed?, highest, highest allowed?, null allowed?). Written from what
# each value means, not copied from the code's limits.


def num(kind: str, lo: float | None = None, lo_in: bool = True, hi: float | None = None, hi_in: bool = True,
        null: bool = False) -> tuple[str, float | None, bool, float | None, bool, bool]:
    return kind, lo, lo_in, hi, hi_in, null


TIMEOUT = num("float", 0, False, 1e7)  # a longer timeout overflows timedelta and socket timeouts
SFT_DOMAIN = {
    "lr": num("float", 0, False, 1),  # AdamW moves each weight by ~lr per step
    "min_lr_ratio": num("float", 0, True, 1),
    "weight_decay": num("float", 0, True, 1),
    "warmup_steps": num("int", 0),
    "max_steps": num("int", 1, null=True),
    "epochs": num("int", 1, null=True),
    "micro_batch_size": num("int", 1),
    "grad_accum": num("int", 1, True, 4096),  # a step of 2**62 micro-batches never ends
    "max_grad_norm": num("float", 0, False),
    "seed": num("int", 0),
    "save_every": num("int", 0),
    "keep_checkpoints": num("int", 0),
    "log_every": num("int", 1),
    "max_seq_len": num("int", 1, null=True),
    "collective_timeout_s": TIMEOUT,
}
GRPO_DOMAIN = {
    "group_size": num("int", 1),
    "prompts_per_step": num("int", 1),
    "max_steps": num("int", 1),
    "gamma": num("float", 0, True, 1),
    "lr": num("float", 0, False, 1),
    "warmup_steps": num("int", 0),
    "weight_decay": num("float", 0, True, 1),
    "max_grad_norm": num("float", 0, False),
    "clip_low": num("float", 0, True, 1, False),
    "clip_high": num("float", 0),
    "tis_cap": num("float", 0),
    "adv_clip": num("float", 0),
    "max_staleness": num("int", 0, True, 1),
    "kl_coef": num("float", 0),
    "entropy_coef": num("float", 0),
    "norm_length": num("int", 1, null=True),
    "temperature": num("float", 0, False),
    "top_p": num("float", 0, False, 1),
    "top_k": num("int", 0),
    "max_new_tokens": num("int", 1),
    "max_context_tokens": num("int", 2),
    "max_simulations_in_flight": num("int", 1),
    "sim_batch": num("int", 1),
    "generation_batch": num("int", 1),
    "logprob_chunk": num("int", 1),
    "seed": num("int", 0),
    "save_every": num("int", 0),
    "keep_checkpoints": num("int", 0),
    "validate_every": num("int", 0),
    "collective_timeout_s": TIMEOUT,
}
ENGINE_DOMAIN = {"timeout_s": TIMEOUT, "start_timeout_s": TIMEOUT}
SITE_DOMAIN = {
    "cpus_per_task": num("int", 1),
    "mem_gb": num("float", 0, False, 1e5, null=True),  # 100 TB: more than any node
    "array_parallelism": num("int", 1),
    "gpus": num("int", 0, True, 1),
    "grpo_sim_ranks": num("int", 0),
    "train_cpus_per_task": num("int", 1, null=True),
}


def sft_rules(c: dict[str, Any]) -> bool:
    """SFT values valid alone but not together: exactly one of max_steps and epochs; no warm-up longer
    than the run."""
    if (c.get("max_steps") is None) == (c.get("epochs") is None):
        return False
    return c.get("max_steps") is None or c.get("warmup_steps", 0) <= c["max_steps"]


def grpo_rules(c: dict[str, Any]) -> bool:
    """GRPO values valid alone but not together."""
    if c.get("warmup_steps", 0) > c.get("max_steps", 10):
        return False  # the learning rate would never reach lr
    if c.get("max_new_tokens", 512) >= c.get("max_context_tokens", 8192):
        return False  # one turn could fill the whole episode
    if c.get("group_size", 8) * c.get("prompts_per_step", 4) > 65536:
        return False  # more episodes in one step than memory holds
    sum_norm = c.get("aggregation") == "seq-mean-token-sum-norm"
    if sum_norm != (c.get("norm_length") is not None):
        return False  # the norm length and the aggregation that uses it come together
    if c.get("validate_every", 0) and not c.get("validation_basins"):
        return False  # validation with nothing to validate on
    if (c.get("generator") == "engine") != (c.get("engine") is not None):
        return False
    engine = c.get("engine") or {}
    if engine and engine.get("api") == "vllm" and not engine.get("launch"):
        return False  # vLLM cannot reload weights: the trainer must be able to restart it
    return not set(c.get("basins", ())) & set(c.get("validation_basins", ()))


def accepts(domain: tuple, value: Any) -> bool:
    kind, lo, lo_in, hi, hi_in, null = domain
    if value is None:
        return null
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if kind == "int" and not isinstance(value, int):
        return False
    if not math.isfinite(value):
        return False
    if lo is not None and not (value >= lo if lo_in else value > lo):
        return False
    return hi is None or (value <= hi if hi_in else value < hi)


def numeric_mutations(kind: str) -> list[Any]:
    huge = HUGE_INT if kind == "int" else HUGE_FLOAT
    values: list[Any] = [NAN, INF, -INF, -1, 0, huge, "x", True]
    if kind == "int":
        values.append(1.5)
    return values


# --------------------------------------------------------------------------------------------- valid files
SFT_BASE: dict[str, Any] = {
    "data": "data.h5", "model": "tiny", "lr": 1.0e-4, "min_lr_ratio": 0.1, "weight_decay": 0.0, "warmup_steps": 2,
    "max_steps": 10, "micro_batch_size": 1, "grad_accum": 2, "max_grad_norm": 1.0, "seed": 0, "dtype": "auto",
    "fsdp": "auto", "activation_checkpointing": False, "save_every": 5, "keep_checkpoints": 2, "log_every": 1,
    "bucket_by_length": True, "max_seq_len": 4096, "collective_timeout_s": 3600.0}
GRPO_BASE: dict[str, Any] = {
    "basins": ["b1", "b2"], "validation_basins": ["v1"], "preset": "paper", "model": "tiny", "group_size": 4,
    "prompts_per_step": 2, "max_steps": 10, "advantage": "episode", "gamma": 1.0, "std_normalise": True,
    "lr": 1.0e-6, "warmup_steps": 2, "weight_decay": 0.0, "max_grad_norm": 1.0, "clip_low": 0.2, "clip_high": 0.2,
    "tis_cap": 0.0, "kl_coef": 0.1, "entropy_coef": 0.01, "aggregation": "token-mean", "temperature": 1.0,
    "top_p": 0.95, "top_k": 0, "max_new_tokens": 256, "max_context_tokens": 4096, "max_simulations_in_flight": 8,
    "sim_batch": 4, "share_runs": True, "generation_batch": 16, "prefix_cache": True, "logprob_chunk": 512, "seed": 0,
    "dtype": "auto", "save_every": 5, "keep_checkpoints": 2, "validate_every": 5, "simulator": "embedded",
    "generator": "local", "fsdp": "auto", "activation_checkpointing": False, "collective_timeout_s": 3600.0,
    "env": {"max_turns": 6}}
ENGINE_BASE: dict[str, Any] = {"api": "sglang", "url": "http://127.0.0.1:30000", "timeout_s": 600.0,
                               "start_timeout_s": 900.0}
SITE_BASE: dict[str, Any] = {"partition": "cpu", "gpu_partition": "gpu", "cpus_per_task": 2, "mem_gb": 16.0,
                             "array_parallelism": 8, "gpus": 1, "grpo_sim_ranks": 0, "train_cpus_per_task": 4,
                             "time_min": {"default": 30}}
BOOLS = {"activation_checkpointing", "bucket_by_length", "std_normalise", "share_runs", "prefix_cache"}
CHOICES = {"dtype": "fp16", "fsdp": "maybe", "preset": "bogus", "advantage": "bogus", "aggregation": "bogus",
           "generator": "bogus", "api": "bogus"}


def _numeric_fields(cls: type) -> list[str]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        args = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)
        if any(a in (int, float) for a in args) and bool not in args:
            out.append(f.name)
    return out


def _classes() -> dict[str, type]:
    from hydroagent_hpc.pipeline.submit import Site
    from hydroagent_hpc.train.generation.engine_config import EngineSettings
    from hydroagent_hpc.train.grpo.config import GRPOConfig
    from hydroagent_hpc.train.sft.config import SFTConfig

    return {"sft": SFTConfig, "grpo": GRPOConfig, "engine": EngineSettings, "site": Site}


DOMAINS = {"sft": SFT_DOMAIN, "grpo": GRPO_DOMAIN, "engine": ENGINE_DOMAIN, "site": SITE_DOMAIN}


@pytest.mark.parametrize("name", sorted(DOMAINS))
def test_every_numeric_field_has_a_domain_here(name):
    """A numeric field added later must be classified in this file before its mutations run."""
    missing = set(_numeric_fields(_classes()[name])) - set(DOMAINS[name]) - {"time_min"}
    assert not missing, f"{name}: numeric fields without a domain in {Path(__file__).name}: {sorted(missing)}"


# --------------------------------------------------------------------------------------------- the cases
@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    kind: str  # sft | grpo | site | pipeline
    changes: tuple[tuple[tuple[Any, ...], Any], ...]  # (key path, value): what the error must name
    refused: bool
    setup: tuple[tuple[tuple[Any, ...], Any], ...] = ()  # applied first (an engine section to mutate)

    @property
    def keys(self) -> list[str]:
        return [str(p[-1]) for p, _ in self.changes]


def _apply(doc: dict[str, Any], changes: tuple[tuple[tuple[Any, ...], Any], ...]) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    for path, value in changes:
        cur = doc
        for p in path[:-1]:
            cur = cur.setdefault(p, {})
        cur[path[-1]] = value
    return doc


def _plain_ok(doc: dict[str, Any], kind: str) -> bool:
    """The oracle: every known numeric field in its domain and the cross-field rules hold."""
    if kind == "sft":
        return all(accepts(SFT_DOMAIN[k], v) for k, v in doc.items() if k in SFT_DOMAIN) and sft_rules(doc)
    if kind == "grpo":
        engine = doc.get("engine") or {}
        return (all(accepts(GRPO_DOMAIN[k], v) for k, v in doc.items() if k in GRPO_DOMAIN)
                and all(accepts(ENGINE_DOMAIN[k], v) for k, v in engine.items() if k in ENGINE_DOMAIN)
                and grpo_rules(doc))
    return all(accepts(SITE_DOMAIN[k], v) for k, v in doc.items() if k in SITE_DOMAIN)


def _field_cases(kind: str, base: dict[str, Any], domain: dict[str, tuple], prefix: tuple[Any, ...] = (),
                 check: str | None = None) -> list[Case]:
    out = []
    check = check or kind
    for name, dom in domain.items():
        for i, value in enumerate(numeric_mutations(dom[0])):
            changes = (((*prefix, name), value),)
            doc = _apply(base, changes)
            ok = _plain_ok(doc, check)
            out.append(Case(f"{kind}:{'.'.join(map(str, (*prefix, name)))}={value!r}#{i}", kind, changes, not ok))
    for name in sorted(BOOLS):
        if name in base or (prefix and name in _get(base, prefix)):
            for i, value in enumerate(["maybe", 1, 0.5]):
                out.append(Case(f"{kind}:{name}={value!r}#{i}", kind, (((*prefix, name), value),), True))
    for name, bad in CHOICES.items():
        if name in _get(base, prefix):
            out.append(Case(f"{kind}:{name}={bad!r}", kind, (((*prefix, name), bad),), True))
    out.append(Case(f"{kind}:{'.'.join(map(str, prefix)) or 'top'}.unknown-key", kind,
                    (((*prefix, "learning_rate"), 0.1),), True))
    return out


def _get(doc: dict[str, Any], path: tuple[Any, ...]) -> dict[str, Any]:
    for p in path:
        doc = doc[p]
    return doc


#: Pairs (or triples) of values valid alone but not together, and the kind they belong to.
CROSS: list[tuple[str, dict[str, Any]]] = [
    ("sft", {"warmup_steps": 11}),  # base max_steps 10
    ("sft", {"max_steps": 1, "warmup_steps": 2}),
    ("sft", {"epochs": 1}),  # max_steps is given too
    ("sft", {"max_steps": None}),  # neither
    ("grpo", {"warmup_steps": 11}),
    ("grpo", {"max_steps": 1}),  # base warm-up 2
    ("grpo", {"max_new_tokens": 4096}),  # base context 4096
    ("grpo", {"max_context_tokens": 256}),  # base max_new_tokens 256
    ("grpo", {"max_new_tokens": 8192, "max_context_tokens": 4096}),
    ("grpo", {"group_size": 1024, "prompts_per_step": 128}),
    ("grpo", {"aggregation": "seq-mean-token-sum-norm"}),  # without norm_length
    ("grpo", {"norm_length": 4096}),  # with token-mean
    ("grpo", {"validation_basins": []}),  # validate_every 5
    ("grpo", {"validation_basins": ["b1"]}),  # also a training basin
    ("grpo", {"generator": "engine"}),  # without an engine section
    ("grpo", {"engine": dict(ENGINE_BASE)}),  # with generator local
    ("grpo", {"generator": "engine", "engine": {**ENGINE_BASE, "api": "vllm"}}),  # vLLM without launch
    ("grpo", {"env": {"max_turns": NAN}}),
    ("grpo", {"env": {"max_turns": -1}}),
    ("grpo", {"env": {"bogus": 1}}),
]


def _cross_cases() -> list[Case]:
    out = []
    for i, (kind, values) in enumerate(CROSS):
        changes = tuple(((k,), v) for k, v in values.items())
        doc = _apply(SFT_BASE if kind == "sft" else GRPO_BASE, changes)
        refused = not _plain_ok(doc, kind) or "env" in values  # the env cases are all bad values
        assert refused, f"cross case {values} is valid by the oracle: it tests nothing"
        out.append(Case(f"{kind}:cross:{'+'.join(values)}#{i}", kind, changes, refused))
    return out


def _engine_cases() -> list[Case]:
    base = {**GRPO_BASE, "generator": "engine", "engine": dict(ENGINE_BASE)}
    out = []
    for c in _field_cases("grpo", base, ENGINE_DOMAIN, prefix=("engine",)):
        doc = _apply(base, c.changes)
        out.append(dataclasses.replace(c, id="engine-" + c.id, refused=c.refused or not _plain_ok(doc, "grpo")))
    for i, (key, value) in enumerate([("url", "ftp://x"), ("url", ""), ("api_key_env", "1 BAD"), ("gpus", "x"),
                                      ("launch", []), ("launch", ["python", "serve.py"]), ("timeout_s", "600s")]):
        out.append(Case(f"engine-grpo:engine.{key}={value!r}#{i}", "grpo", ((("engine", key), value),), True))
    return [dataclasses.replace(c, setup=((("generator",), "engine"), (("engine",), dict(ENGINE_BASE)))) for c in out]


def _pipeline_cases() -> list[Case]:
    """The pipeline's sft: and grpo: sections get the numeric mutations of their configs (NaN, -1, 0, huge,
    text) and the cross-field pairs; they are checked by the same settings when the file is read."""
    demo = yaml.safe_load((ROOT / "data" / "pipelines" / "demo.yaml").read_text())
    out = []
    for section, domain, check in (("sft", SFT_DOMAIN, "sft"), ("grpo", GRPO_DOMAIN, "grpo")):
        for name, dom in domain.items():
            for i, value in enumerate([NAN, -1, HUGE_INT if dom[0] == "int" else HUGE_FLOAT]):
                merged = {**demo[section], name: value}
                merged.pop("init", None)
                if check == "grpo":  # the pipeline fills basins, validation basins and the model
                    merged = {"basins": ["t"], **({"validation_basins": ["h"]} if merged.get("validate_every")
                                                  and isinstance(merged["validate_every"], int) else {}), **merged}
                ok = _plain_ok({**({"data": "d"} if check == "sft" else {}), **merged}, check)
                out.append(Case(f"pipeline:{section}.{name}={value!r}#{i}", "pipeline",
                                (((section, name), value),), not ok))
    for i, (kind, values) in enumerate(CROSS):
        if "env" in values or "validation_basins" in values or "engine" in values or "generator" in values:
            continue
        section = kind
        merged = {**demo[section], **values}
        merged.pop("init", None)
        if kind == "sft":
            refused = not _plain_ok({"data": "d", **merged}, "sft")
        else:
            refused = not _plain_ok({"basins": ["t"], **merged}, "grpo")
        if refused:
            out.append(Case(f"pipeline:cross:{section}.{'+'.join(values)}#{i}", "pipeline",
                            tuple(((section, k), v) for k, v in values.items()), True))
    return out


def _site_cases() -> list[Case]:
    return _field_cases("site", SITE_BASE, SITE_DOMAIN) + [
        Case("site:time_min=nan", "site", ((("time_min",), NAN),), True),
        Case("site:time_min.grpo=-1", "site", ((("time_min", "grpo"), -1),), True),
        Case("site:time_min.bogus=5", "site", ((("time_min", "bogus"), 5),), True)]


CASES: list[Case] = (_field_cases("sft", SFT_BASE, SFT_DOMAIN) + _field_cases("grpo", GRPO_BASE, GRPO_DOMAIN)
                     + _cross_cases() + _engine_cases() + _site_cases() + _pipeline_cases())


def test_the_generated_cases_are_many_and_mostly_refusals():
    refused = sum(c.refused for c in CASES)
    assert len(CASES) > 500 and refused > 0.7 * len(CASES), (len(CASES), refused)


# --------------------------------------------------------------------------------------------- running them
def dump(doc: Any) -> str:
    return yaml.safe_dump(doc, default_flow_style=False, sort_keys=False, width=10_000)


def key_lines(text: str, path: tuple[Any, ...]) -> set[int]:
    """1-based lines from the key at ``path`` (or the nearest mapping above it that exists) to its value's end."""
    node = yaml.compose(text)
    lines = {1}
    for part in path:
        if not isinstance(node, yaml.MappingNode):
            break
        found = {k.value: (k, v) for k, v in node.value}.get(part)
        if found is None:
            break
        k, node = found
        end = node.end_mark.line + (1 if node.end_mark.column > 0 else 0)
        lines = set(range(k.start_mark.line + 1, max(k.start_mark.line + 1, end) + 1))
    return lines


#: The keys of the cross-field rules: a conflict may be reported at any of them.
RULE_KEYS = ("max_steps", "epochs", "warmup_steps", "max_new_tokens", "max_context_tokens", "group_size",
             "prompts_per_step", "aggregation", "norm_length", "validate_every", "validation_basins", "basins",
             "generator", "engine")


def _alone_ok(case: Case, key: Any, value: Any) -> bool:
    """Whether ``value`` is valid for ``key`` by itself (so the case is refused for a conflict)."""
    domain = {"sft": SFT_DOMAIN, "grpo": {**GRPO_DOMAIN, **ENGINE_DOMAIN}, "site": SITE_DOMAIN}.get(case.kind)
    if domain is None:
        domain = {**SFT_DOMAIN, **GRPO_DOMAIN}
    return key not in domain or accepts(domain[key], value)


def _write(case: Case, tmp: Path) -> tuple[Path, str]:
    changes = (*case.setup, *case.changes)
    if case.kind == "sft":
        doc, name = _apply(SFT_BASE, changes), "sft.yaml"
    elif case.kind == "grpo":
        doc, name = _apply(GRPO_BASE, changes), "grpo.yaml"
    elif case.kind == "site":
        doc, name = _apply(SITE_BASE, changes), "site.yaml"
    else:
        doc, name = _apply(yaml.safe_load((ROOT / "data" / "pipelines" / "demo.yaml").read_text()), changes), \
            "pipeline.yaml"
    text = dump(doc)
    path = tmp / name
    path.write_text(text)
    return path, text


def _load(case: Case, path: Path) -> Any:
    if case.kind == "sft":
        from hydroagent_hpc.train.sft.config import load_sft_config

        return load_sft_config(path)
    if case.kind == "grpo":
        from hydroagent_hpc.train.grpo.config import load_grpo_config

        return load_grpo_config(path)
    if case.kind == "site":
        from hydroagent_hpc.pipeline.submit import load_site

        return load_site(path)
    from hydroagent_hpc.pipeline.spec import load_pipeline

    return load_pipeline(path)


def _argv(case: Case, path: Path, run: Path) -> list[str]:
    if case.kind in ("sft", "grpo"):
        return ["train", case.kind, str(path), "--out", str(run)]
    if case.kind == "site":
        return ["pipeline", "submit", str(ROOT / "data" / "pipelines" / "demo.yaml"), "--run-dir", str(run),
                "--site", str(path)]
    return ["pipeline", "run", str(path), "--run-dir", str(run)]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_bad_value_is_refused_naming_key_and_line_before_anything_loads(case, tmp_path, capsys):
    path, text = _write(case, tmp_path)
    if not case.refused:
        loaded = _load(case, path)  # a valid value loads as given
        if case.kind in ("sft", "grpo") and len(case.changes) == 1 and len(case.changes[0][0]) == 1:
            (key,), value = case.changes[0]
            assert getattr(loaded, key) == value
        return
    from hydroagent_hpc.errors import HydroAgentError

    try:
        _load(case, path)
    except HydroAgentError:
        pass
    else:  # the command would go on and train (or submit) with it
        pytest.fail(f"accepted: {case.id}")
    run = tmp_path / "run"
    try:
        rc = main(_argv(case, path, run))
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    assert rc == 2, f"exit {rc}: {err[-1500:]}"
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"not one line: {err[-1500:]}"
    assert any(k in err for k in case.keys + ["learning_rate"]), f"no key of {case.keys} named: {err}"
    named = {int(n) for n in re.findall(rf"{re.escape(path.name)}:(\d+)", err)}
    expected: set[int] = set()
    for p, _ in case.changes:
        expected |= key_lines(text, p)
        if len(p) <= 2 and _alone_ok(case, p[-1], _) and p[-1] in RULE_KEYS:  # a conflict: either key's line
            expected |= {n for k in RULE_KEYS for n in key_lines(text, (*p[:-1], k)) if n > 1}
    assert named & expected, f"{path.name}: lines {sorted(named)} named, expected one of {sorted(expected)}: {err}"
    assert not run.exists(), "the run folder was created although the config was refused"
