"""The state of the house, read from the source: what issue 31 measures before and after.

``python -m hydroagent_hpc.bench.house`` prints (``--json`` for a machine):

- lines in the modules that define and check configuration (:data:`CONFIG_MODULES`), the classes
  derived from ``ConfigError`` (one error class per config is what issue 31 removes) and the
  functions that turn a mapping into a config (``*_from_mapping``, ``load_*config*``, ``load_site``,
  ``load_campaign``, ``load_pipeline``, ``load_models``);
- ``train/``: modules and lines;
- import circles: strongly connected groups of our modules when imports inside functions count too
  (a circle that only a function-level import keeps from failing at import time is a hidden door);
- function-level imports of our own modules, and of the heavy optional libraries deferred on purpose;
- private names imported across modules (``from a.b import _x`` outside ``a.b``);
- the longest functions.

Nothing here imports the package's modules: the source is read with :mod:`ast`.
"""

from __future__ import annotations

import argparse
import ast
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

PKG = Path(__file__).resolve().parents[1]
ROOT = PKG.parent

#: Modules that define a configuration and its checks (paths relative to the package); missing ones are skipped.
CONFIG_MODULES = ("config.py", "settings.py", "yamlio.py", "train/config.py", "train/grpo_config.py",
                  "train/sft/config.py", "train/grpo/config.py", "train/generation/engine_config.py",
                  "pipeline/submit.py", "pipeline/spec.py", "campaign/spec.py", "agents/llm/models_file.py",
                  "hpc/slurm.py", "hpc/site.py")
LOADER_SUFFIXES = ("_from_mapping",)
LOADER_NAMES = ("load_config", "load_sft_config", "load_grpo_config", "load_site", "load_campaign", "load_pipeline",
                "load_models", "load_models_file", "load_settings")
DEFERRED_OK = ("torch", "transformers", "tokenizers", "accelerate", "safetensors", "mpi4py", "matplotlib", "numba",
               "submitit", "openai", "h5py", "scipy", "trl", "wandb", "tensorboard", "datasets")


def _modname(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(node: ast.ImportFrom, here: str, is_pkg: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = here.split(".") if is_pkg else here.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _in_function(tree: ast.AST) -> set[int]:
    """ids of import nodes that sit inside a function body."""
    inside: set[int] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for n in ast.walk(fn):
                if isinstance(n, (ast.Import, ast.ImportFrom)):
                    inside.add(id(n))
    return inside


def _type_checking(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test):
            for m in ast.walk(n):
                if isinstance(m, (ast.Import, ast.ImportFrom)):
                    skip.add(id(m))
    return skip


def measure() -> dict[str, Any]:
    files = sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts)
    modules = {_modname(p): p for p in files}
    graph: dict[str, set[str]] = defaultdict(set)
    fn_own = fn_heavy = fn_other = 0
    private: list[str] = []
    functions: list[tuple[int, str]] = []
    config_errors: list[str] = []
    loaders: list[str] = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        inside, skip = _in_function(tree), _type_checking(tree)
        is_pkg = path.name == "__init__.py"
        for n in ast.walk(tree):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.append((n.end_lineno - n.lineno + 1, f"{name}.{n.name}"))  # type: ignore[operator]
                if n.name.endswith(LOADER_SUFFIXES) or n.name in LOADER_NAMES:
                    loaders.append(f"{name}.{n.name}")
            if isinstance(n, ast.ClassDef) and any("ConfigError" in ast.unparse(b) for b in n.bases):
                config_errors.append(f"{name}.{n.name}")
            if not isinstance(n, (ast.Import, ast.ImportFrom)) or id(n) in skip:
                continue
            targets: list[str] = []
            if isinstance(n, ast.Import):
                targets = [a.name for a in n.names]
            else:
                mod = _resolve(n, name, is_pkg)
                targets = [mod]
                if mod.startswith("hydroagent_hpc") and mod != name:
                    private += [f"{name} <- {mod}.{a.name}" for a in n.names
                                if a.name.startswith("_") and not a.name.startswith("__")]
                    targets += [f"{mod}.{a.name}" for a in n.names if f"{mod}.{a.name}" in modules]
            own = [t for t in targets if t.startswith("hydroagent_hpc")]
            if id(n) in inside:
                if own:
                    fn_own += 1
                elif any(t.split(".")[0] in DEFERRED_OK for t in targets):
                    fn_heavy += 1
                else:
                    fn_other += 1
            for t in own:
                while t and t not in modules:
                    t = t.rpartition(".")[0]
                if t and t != name:
                    graph[name].add(t)
    circles = import_circles(graph)
    config_lines = {m: len((PKG / m).read_text().splitlines()) for m in CONFIG_MODULES if (PKG / m).is_file()}
    train = [p for p in files if p.relative_to(PKG).parts[0] == "train"]
    functions.sort(reverse=True)
    return {
        "config_modules": config_lines, "config_lines": sum(config_lines.values()),
        "config_error_classes": sorted(config_errors), "config_loaders": sorted(loaders),
        "train_modules": len(train), "train_lines": sum(len(p.read_text().splitlines()) for p in train),
        "import_circles": circles,
        "function_level_imports": {"own": fn_own, "deferred_heavy": fn_heavy, "other": fn_other},
        "private_cross_imports": sorted(private),
        "longest_functions": [f"{n} lines: {f}" for n, f in functions[:8]],
    }


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module in ``graph`` (module -> the modules it imports):
    Tarjan's algorithm, iterative; each group sorted. ``tests/test_architecture.py`` uses it too."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hydroagent_hpc.bench.house", description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print JSON")
    args = ap.parse_args(argv)
    m = measure()
    if args.json:
        print(json.dumps(m, indent=1))
        return 0
    print(f"configuration: {m['config_lines']} lines in {len(m['config_modules'])} modules; "
          f"{len(m['config_error_classes'])} ConfigError subclasses; {len(m['config_loaders'])} loaders")
    print(f"  error classes: {', '.join(m['config_error_classes']) or 'none'}")
    print(f"  loaders: {', '.join(m['config_loaders'])}")
    print(f"train/: {m['train_modules']} modules, {m['train_lines']} lines")
    print(f"import circles: {len(m['import_circles'])}")
    for c in m["import_circles"]:
        print(f"  {' <-> '.join(c)}")
    f = m["function_level_imports"]
    print(f"function-level imports: {f['own']} of our modules, {f['deferred_heavy']} deferred heavy libraries, "
          f"{f['other']} other")
    print(f"private names imported across modules: {len(m['private_cross_imports'])}")
    for p in m["private_cross_imports"]:
        print(f"  {p}")
    print("longest functions:")
    for line in m["longest_functions"]:
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
