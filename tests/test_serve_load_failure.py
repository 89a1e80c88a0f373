"""A model that cannot load stops `serve` at once with exit status 1 and a one-line reason, so a
container or a supervisor sees it; the GGUF header check names a truncated file as truncated."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest

from llamadecide.engine import bundled_model_path
from llamadecide.engine.gguf_file import gguf_problem


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def header_only_gguf(path: Path) -> Path:
    """A consistent GGUF header (no tensors) that llama.cpp still cannot load as a model."""
    path.write_bytes(
        b"GGUF"
        + struct.pack("<IQQ", 3, 0, 1)
        + _string("general.architecture")
        + struct.pack("<I", 8)
        + _string("llama")
    )
    return path


def truncated_copy(path: Path, keep: int) -> Path:
    with open(bundled_model_path(), "rb") as source:
        path.write_bytes(source.read(keep))
    return path


def test_the_header_tells_a_truncated_file(tmp_path):
    whole = bundled_model_path()
    assert gguf_problem(whole) is None
    size = whole.stat().st_size
    for keep in (10, 4096, size // 2, size - 1):
        assert "is truncated" in gguf_problem(truncated_copy(tmp_path / f"cut-{keep}.gguf", keep))
    (tmp_path / "noise.gguf").write_bytes(b"\x13\x37" * 5000)
    assert "not a GGUF file" in gguf_problem(tmp_path / "noise.gguf")
    assert gguf_problem(header_only_gguf(tmp_path / "empty.gguf")) is None


def serve(model: str, port: int = 18731) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "llamadecide.cli.main", "serve", "--model", model, "--port", str(port)],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "case, expected",
    [
        ("missing", "model file not found"),
        ("truncated", "is truncated"),
        ("noise", "not a GGUF file"),
        ("empty directory", "no *.gguf file"),
        ("unknown name", "nor a bundled model name"),
        ("unloadable", "cannot load"),  # found only when llama.cpp tries: the running server stops
    ],
)
def test_serve_exits_with_the_reason(tmp_path, case, expected):
    models = {
        "missing": str(tmp_path / "nowhere.gguf"),
        "truncated": str(truncated_copy(tmp_path / "cut.gguf", 1_000_000)),
        "noise": str(tmp_path / "noise.gguf"),
        "empty directory": str(tmp_path / "empty"),
        "unknown name": "no-such-model",
        "unloadable": str(header_only_gguf(tmp_path / "header.gguf")),
    }
    (tmp_path / "noise.gguf").write_bytes(b"random bytes " * 100)
    (tmp_path / "empty").mkdir()
    result = serve(models[case])
    assert result.returncode == 1, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the model cannot load:") and expected in last, last
