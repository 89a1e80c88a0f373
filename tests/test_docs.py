"""The docs against the repository: every file ARCHITECTURE.md names exists, the README names no
path outside the repository, and its sample output's command is where the docs check
(scripts/check_readme.py, run on an install with the default model) finds it."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "llamadecide"


def _found(name: str) -> bool:
    places = [ROOT, PACKAGE, ROOT / "tests", *(p for p in PACKAGE.iterdir() if p.is_dir())]
    return any((place / name).exists() for place in places)


def test_every_file_architecture_md_names_exists():
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`([\w./-]+\.(?:py|md|json|sh|cpp|html|yaml))`", text))
    named |= {f"benchmarks/{m}.py" for m in re.findall(r"`benchmarks\.(\w+)`", text)}
    assert len(named) > 20
    assert sorted(name for name in named if not _found(name)) == []


def test_the_docs_name_no_path_outside_the_repository():
    for path in (ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").glob("*.md"))):
        assert "../shared" not in path.read_text(encoding="utf-8"), path.name


def test_the_readme_sample_output_follows_its_command():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from check_readme import command_and_output
    finally:
        sys.path.pop(0)
    command, shown, _ = command_and_output((ROOT / "README.md").read_text(encoding="utf-8"))
    assert command[:2] == [".venv/bin/llamadecide", "decide"] and "-q" in command
    options = [command[i + 1] for i, part in enumerate(command) if part == "-o"]
    assert all(option in shown for option in options)
