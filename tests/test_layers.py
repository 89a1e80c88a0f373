"""Imports go downward: no module imports one of a higher layer, lazily inside a function or not
(a loop through a lazy import is still a loop)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "src" / "llamadecide"

# Packages from the bottom up; a package may import its own layer and those below.
PACKAGES = {
    "errors": 0,
    "aws": 1,
    "prices": 1,
    "engine": 1,
    "decisions": 2,
    "settings": 3,
    "calibration": 3,
    "bulk": 4,
    "labels": 4,
    "server": 4,
    "sagemaker": 5,
    "bench": 5,
    "planning": 6,
    "cli": 7,
}
# Inside the engine, module by module.
ENGINE = {
    "config": 0,
    "values": 0,
    "trie": 0,
    "model_files": 0,
    "gguf_file": 0,
    "chat_template": 0,
    "hidden_tap": 0,
    "decoder": 1,
    "tokenizer": 1,
    "kv_cache": 2,
    "scoring": 3,
    "generation": 3,
    "batch_scorer": 4,
    "llama_engine": 5,
    "__init__": 6,
}


def _imports(path: Path) -> list[list[str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("llamadecide."):
            found.append(node.module.split(".")[1:])
        elif isinstance(node, ast.Import):
            found.extend(a.name.split(".")[1:] for a in node.names if a.name.startswith("llamadecide."))
    return found


def test_packages_import_downward():
    upward = []
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        own = parts[0]
        if own == "__init__":
            continue
        for target in _imports(path):
            if target[0] != own and PACKAGES[target[0]] > PACKAGES[own]:
                upward.append(f"{'/'.join(parts)} imports llamadecide.{'.'.join(target)}")
    assert not upward, upward


def test_engine_modules_import_downward():
    upward = []
    for path in (ROOT / "engine").glob("*.py"):
        for target in _imports(path):
            if (
                target[0] == "engine"
                and len(target) > 1
                and ENGINE[target[1]] >= ENGINE[path.stem]
                and target[1] != path.stem
            ):
                if not (path.stem == "__init__"):
                    upward.append(f"engine/{path.name} imports engine.{target[1]}")
    assert not upward, upward


def test_only_the_engine_imports_llama_cpp():
    """ARCHITECTURE.md's rule: engine/ is the only code that imports llama_cpp, lazily or not."""
    found = []
    for path in ROOT.rglob("*.py"):
        if path.relative_to(ROOT).parts[0] == "engine":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if any(name == "llama_cpp" or name.startswith("llama_cpp.") for name in names):
                found.append(str(path.relative_to(ROOT)))
    assert found == []


def test_no_function_is_over_a_hundred_lines():
    """Functions of one step each: a function past 100 lines is doing several (flags included)."""
    long = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in sorted(ROOT.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 100
    ]
    assert not long, long
