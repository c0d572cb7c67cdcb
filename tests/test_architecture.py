"""The direction of imports in docs/architecture.md, kept true by a test.

Every package and top-level module of ``hydroagent_hpc`` is a row of :data:`LAYERS`, with the rows
it may import (its own row always). A new package or module that is not in the table fails
:func:`test_every_package_and_module_is_in_the_table`: add a row here and say in the commit why it
sits where it does. Imports are read from the source (``ast``), at module level AND inside
functions, so a lazy import is held to the same direction.

The layers, bottom to top:

- **core** (:data:`CORE_ORDER`): errors, types, params, registry, yamlio, settings, config, provenance. Each
  imports only the core modules before it in that order (and the package's ``__version__``).
- **metrics/**: pure functions on series; core only.
- **sim/** (engine, control files, grids, EF5 backend): core and metrics. **sim/synth/** (synthetic
  basins) sits on the engine: sim, never the other way round.
- **store/** (HDF5): core only. **hpc/** (pools, Slurm): generic, nothing of ours but core
  errors and registry: it takes callables and never imports the domain.
- **datasets/**: core, metrics, sim. **env/** (and env/toolcalls when it is a package): core,
  metrics, sim.
- **agents/** (and agents/optimizers, agents/llm): env, metrics, core.
- **train/**: agents, env, sim, store, metrics, hpc (submitting training jobs), core.
- **campaign/**: agents, env, store, hpc, sim, core. **report/**: store, metrics, sim, core.
- **pipeline/**: the whole recipe; everything but cli and bench.
- **cli/** and **bench/**: everything.

torch and the Hugging Face libraries (:data:`HEAVY`) are imported only in ``train/`` and
``agents/llm/hf_local.py`` (:data:`HEAVY_ALLOWED`), lazily there in the agent, so that importing any
other module never loads them (checked in a fresh interpreter).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "hydroagent_hpc"
TESTS = ROOT / "tests"

#: The core modules in the order they may import each other: each only the ones before it.
CORE_ORDER = ("errors", "types", "params", "registry", "yamlio", "settings", "config", "provenance")
CORE = frozenset(CORE_ORDER)
SIM = frozenset({"sim", "sim.synth"})
ENV = frozenset({"env", "env.toolcalls"})
AGENTS = frozenset({"agents", "agents.optimizers", "agents.llm"})

#: Row -> the rows it may import besides itself. A row is a package (``sim``), a subpackage
#: (``sim.synth``) or a top-level module (``config``); a module belongs to the longest row that
#: contains it. The package root (``hydroagent_hpc/__init__.py``: the version) is open to all.
LAYERS: dict[str, frozenset[str]] = {
    **{name: frozenset(CORE_ORDER[:i]) for i, name in enumerate(CORE_ORDER)},
    "metrics": CORE,
    "sim": CORE | {"metrics"},
    "sim.synth": CORE | {"metrics", "sim"},
    "store": CORE,
    "hpc": frozenset({"errors", "registry"}),
    "datasets": CORE | {"metrics"} | SIM,
    "env": CORE | {"metrics"} | SIM | ENV,
    "env.toolcalls": CORE | {"metrics"} | SIM | ENV,
    "agents": CORE | {"metrics"} | ENV | AGENTS,
    "agents.optimizers": CORE | {"metrics"} | ENV | AGENTS,
    "agents.llm": CORE | {"metrics"} | ENV | AGENTS,
    "train": CORE | {"metrics", "store", "hpc"} | SIM | ENV | AGENTS,  # reads and writes stores; GRPO runs simulators;
    # submit.py hands training jobs to hpc/ (Slurm, submitit)
    "campaign": CORE | {"store", "hpc"} | ENV | AGENTS | SIM,
    "report": CORE | {"store", "metrics"} | SIM,
    # the whole recipe: chains campaigns, trainers and the report (everything but cli/ and bench/)
    "pipeline": CORE | {"metrics", "store", "hpc", "datasets", "campaign", "train", "report"} | SIM | ENV | AGENTS,
}
EVERYTHING = frozenset(LAYERS) | {"cli", "bench"}
LAYERS["cli"] = EVERYTHING
LAYERS["bench"] = EVERYTHING

#: Imports against the table that are known, explained, and waiting for a fix elsewhere. Each
#: entry must still occur (the test fails when it is gone, so the entry gets deleted).
KNOWN_EXCEPTIONS: dict[tuple[str, str], str] = {
    ("campaign/submit.py", "report"): "the Slurm merge job writes RUN/report after merging (lazy, optional "
                                      "import); to be passed in by the CLI as a callable",
}

#: Libraries that pull in torch or the Hugging Face stack (hundreds of MB, seconds to import).
HEAVY = frozenset({"torch", "transformers", "tokenizers", "accelerate", "safetensors", "trl", "peft"})
#: Where they may be imported: module names, each with everything under it.
HEAVY_ALLOWED = ("train", "agents.llm.hf_local")


def _module_name(path: Path) -> str:
    """``sim/synth/terrain.py`` -> ``sim.synth.terrain``; a package's ``__init__.py`` -> the package."""
    parts = list(path.relative_to(PKG).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_package(name: str) -> bool:
    return (PKG.joinpath(*name.split(".")) / "__init__.py").is_file()


def _exists(name: str) -> bool:
    return _is_package(name) or PKG.joinpath(*name.split(".")).with_suffix(".py").is_file()


def _row(name: str) -> str | None:
    """The longest row of :data:`LAYERS` that ``name`` is or lies under; "" for the package root."""
    if name == "":
        return ""
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        if ".".join(parts[:k]) in LAYERS:
            return ".".join(parts[:k])
    return None


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module name inside hydroagent_hpc) for every import of ours, wherever it is written."""
    here = _module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name.removeprefix("hydroagent_hpc").lstrip(".")) for a in node.names
                      if a.name == "hydroagent_hpc" or a.name.startswith("hydroagent_hpc.")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = package.split(".") if package else []
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                module = ".".join([*base, *([node.module] if node.module else [])])
            elif node.module == "hydroagent_hpc" or (node.module or "").startswith("hydroagent_hpc."):
                module = node.module.removeprefix("hydroagent_hpc").lstrip(".")
            else:
                continue
            for alias in node.names:  # `from hydroagent_hpc.sim import synth` imports sim.synth
                sub = f"{module}.{alias.name}" if module else alias.name
                found.append((node.lineno, sub if _exists(sub) else module))
    return found


def _heavy_imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] in HEAVY]
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] in HEAVY:
            found.append((node.lineno, node.module))
    return found


def _sources() -> list[Path]:
    return sorted(PKG.rglob("*.py"))


def test_every_package_and_module_is_in_the_table():
    unknown = set()
    for path in _sources():
        name = _module_name(path)
        if name == "":
            continue
        top = name.split(".")[0]
        if top not in LAYERS:
            unknown.add(top)
        # every package, subpackages included, is a row of its own
        parts = name.split(".")
        for k in range(1, len(parts) + 1):
            pkg = ".".join(parts[:k])
            if _is_package(pkg) and pkg not in LAYERS:
                unknown.add(pkg)
    assert not unknown, (f"{sorted(unknown)} not in the layer table: add a row to LAYERS in {Path(__file__).name} "
                         "(which layers it may import) and to docs/architecture.md")


def test_core_order_is_a_total_order_of_the_core():
    assert len(set(CORE_ORDER)) == len(CORE_ORDER)
    for i, name in enumerate(CORE_ORDER):
        assert LAYERS[name] == frozenset(CORE_ORDER[:i])


def test_import_directions():
    bad, used = [], set()
    for path in _sources():
        rel = path.relative_to(PKG).as_posix()
        row = _row(_module_name(path))
        if row is None:
            continue  # reported by test_every_package_and_module_is_in_the_table
        for line, target in sorted(set(_imports(path))):
            target_row = _row(target)
            if target_row in ("", row) or (target_row is not None and target_row in LAYERS[row]):
                continue
            if (rel, target_row) in KNOWN_EXCEPTIONS:
                used.add((rel, target_row))
                continue
            allowed = ", ".join(sorted(LAYERS[row])) or "nothing of ours"
            bad.append(f"{rel}:{line} imports hydroagent_hpc.{target} ({target_row or 'unknown'}); "
                       f"{row} may import {allowed}")
    assert not bad, "imports against the layer table (docs/architecture.md):\n" + "\n".join(bad)
    stale = set(KNOWN_EXCEPTIONS) - used
    assert not stale, f"fixed, delete from KNOWN_EXCEPTIONS: {sorted(stale)}"


def test_torch_and_transformers_only_in_train_and_the_local_model_agent():
    bad = []
    for path in _sources():
        name = _module_name(path)
        if any(name == ok or name.startswith(ok + ".") for ok in HEAVY_ALLOWED):
            continue
        bad += [f"{path.relative_to(PKG)}:{line} imports {mod}" for line, mod in _heavy_imports(path)]
    assert not bad, (f"{sorted(HEAVY)} may be imported only in {HEAVY_ALLOWED} (lazily in the agent):\n"
                     + "\n".join(bad))


def test_importing_any_other_module_does_not_load_torch():
    """Every module but train/ and hf_local imports in a fresh interpreter without loading torch & co."""
    names = [f"hydroagent_hpc.{n}" if n else "hydroagent_hpc" for n in map(_module_name, _sources())
             if not any(n == ok or n.startswith(ok + ".") for ok in HEAVY_ALLOWED) and not n.endswith("__main__")]
    code = ("import importlib, sys\n"
            f"for name in {names!r}:\n"
            "    importlib.import_module(name)\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {sorted(HEAVY)!r}))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", f"importing {len(names)} modules loaded {proc.stdout.strip()}"


def test_no_utils_module_and_no_print_in_library():
    assert not list(PKG.rglob("utils.py"))
    offenders = []
    for path in _sources():
        if path.name in ("__main__.py", "demo.py") or "bench" in path.parts or "cli" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                offenders.append(f"{path.relative_to(PKG)}:{node.lineno}")
    assert not offenders, f"library code logs instead of printing: {offenders}"


def _test_modules() -> set[str]:
    """Importable names of the modules under tests/ that hold tests or fixtures (not helpers/)."""
    return {p.stem for p in TESTS.glob("*.py")}


def test_test_modules_do_not_import_each_other():
    """Shared test code lives in tests/helpers/ (or is a fixture in conftest.py), never in a test module."""
    siblings = _test_modules() - {"conftest"}
    bad = []
    for path in sorted([*TESTS.glob("*.py"), *TESTS.glob("helpers/*.py"), *TESTS.glob("scripts/*.py")]):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            bad += [f"{path.relative_to(TESTS)}:{node.lineno} imports {n}" for n in names
                    if n.split(".")[0] in siblings or n.split(".")[0] == "tests"]
    assert not bad, "test modules import each other; move what they share to tests/helpers/:\n" + "\n".join(bad)


def test_the_checks_see_what_they_claim():
    """The import reader resolves lazy, relative and `from package import module` imports."""
    tree = {path.relative_to(PKG).as_posix(): dict(_imports(path)) for path in _sources()}
    assert "report" in tree["campaign/submit.py"].values()  # a function-level import
    assert any(v.startswith("sim.synth") for v in tree["datasets/camels_basin.py"].values())
    assert _row("sim.synth.terrain") == "sim.synth" and _row("sim.grids") == "sim" and _row("") == ""
    assert _heavy_imports(PKG / "agents" / "llm" / "hf_local.py")  # lazy imports inside functions count
