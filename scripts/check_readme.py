"""The README's sample output, produced by its command: runs the `llamadecide decide` command of the
README's first code block on this checkout's install and compares what it prints with the block
after it (the model name and timing at the end of the last line vary by machine and are not
compared). `--write` puts the command's output into the README instead.

    .venv/bin/python scripts/check_readme.py [--write]

Needs the default model (`bash scripts/install.sh models`); exits 1 when the README is stale."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
VARYING = re.compile(r"  \S+  \d+ ms$")  # the model's name and the seconds a decision took


def command_and_output(text: str) -> tuple[list[str], str, str]:
    """The decide command of the first bash block, and the plain block after it (as written)."""
    blocks = re.findall(r"```(\w*)\n(.*?)```", text, flags=re.S)
    bash = next(body for kind, body in blocks if kind == "bash")
    line = next(line for line in bash.splitlines() if "llamadecide decide" in line)
    command = shlex.split(line.split("&&", 1)[1])
    shown = next(body for kind, body in blocks if kind == "" and "┏" in body)
    return command, shown, bash


def comparable(output: str) -> str:
    return "\n".join(VARYING.sub("", line.rstrip()) for line in output.strip().splitlines())


def main(argv: list[str]) -> int:
    text = README.read_text(encoding="utf-8")
    command, shown, _ = command_and_output(text)
    command[0] = str(README.parent / command[0])
    printed = subprocess.run(command, capture_output=True, text=True, check=True, cwd=README.parent).stdout
    if "--write" in argv:
        kept = "\n".join(VARYING.sub("", line.rstrip()) for line in printed.strip().splitlines())
        README.write_text(text.replace(shown, kept + "\n"), encoding="utf-8")
        print("README.md: sample output written")
        return 0
    if comparable(printed) != comparable(shown):
        print("README.md's sample output is not what its command prints now:\n" + printed, file=sys.stderr)
        return 1
    print("README.md's sample output is what its command prints")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
