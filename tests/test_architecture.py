"""The direction of imports in docs/architecture.md, kept true by a test.

`types`, `params`, `metrics` import nothing of ours; `sim/` imports only those (and itself);
only `cli` and `bench` may sit on top of everything.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "hydroagent_hpc"

ALLOWED = {
    "errors": set(),
    "registry": {"errors"},  # the one Registry type; each extension point keeps its own table
    "types": set(),
    "params": set(),
    "metrics": {"metrics", "errors"},
    "sim": {"types", "params", "metrics", "sim", "errors", "registry"},
    "toolcalls": {"types", "params", "errors"},
    "prompts": {"types", "params", "toolcalls", "errors"},
    "rewards": {"config", "errors"},
    "config": {"errors", "registry", "yamlio"},
    "yamlio": {"errors"},
    "store": {"types", "params", "store", "errors"},
    "hpc": {"hpc", "errors", "registry"},  # generic: takes callables, never imports the domain
    "report": {"types", "params", "metrics", "sim", "store", "report", "errors"},
    "datasets": {"types", "params", "metrics", "sim", "datasets", "errors"},
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hydroagent_hpc"):
            parts = node.module.split(".")
            if len(parts) > 1:
                found.add(parts[1])
            else:
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("hydroagent_hpc."):
                    found.add(alias.name.split(".")[1])
    return found


def test_import_directions():
    bad = []
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG)
        layer = rel.parts[0].removesuffix(".py")
        if layer not in ALLOWED:
            continue
        extra = _imports(path) - ALLOWED[layer] - {"__init__"}
        if extra:
            bad.append(f"{rel} imports {sorted(extra)}")
    assert not bad, "\n".join(bad)


def test_no_utils_module_and_no_print_in_library():
    assert not list(PKG.rglob("utils.py"))
    offenders = []
    for path in PKG.rglob("*.py"):
        if path.name in ("__main__.py", "demo.py") or "bench" in path.parts or "cli" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                offenders.append(f"{path.relative_to(PKG)}:{node.lineno}")
    assert not offenders, f"library code logs instead of printing: {offenders}"
