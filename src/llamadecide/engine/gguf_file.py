"""A GGUF file's fingerprint (the SHA-256 profiles are bound to) and a check of its header before
llama.cpp reads it (a truncated or foreign file is named as such, not a crash)."""

from __future__ import annotations

import hashlib
import os
import struct
from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=16)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    """SHA-256 of a file, computed once per (path, size, mtime)."""
    stat = path.stat()
    return _sha256(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


_GGUF_SCALARS = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # value type -> bytes
_GGUF_STRING, _GGUF_ARRAY = 8, 9
# ggml tensor type -> (elements per block, bytes per block), for the common types; a tensor of another
# type is taken to end where it starts (the check stays a lower bound).
_GGML_BLOCKS = {
    0: (1, 4),
    1: (1, 2),
    2: (32, 18),
    3: (32, 20),
    6: (32, 22),
    7: (32, 24),
    8: (32, 34),
    9: (32, 36),
    10: (256, 84),
    11: (256, 110),
    12: (256, 144),
    13: (256, 176),
    14: (256, 210),
    15: (256, 292),
    30: (1, 2),
}


def gguf_problem(path: Path) -> str | None:
    """Why a file cannot be a whole GGUF model, read from its header alone: not GGUF at all, or
    truncated (the file ends inside its metadata, or before the tensor data its header places).
    None when the header is consistent with the file's size (the file may still be damaged)."""

    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as handle:
        if handle.read(4) != b"GGUF":
            return f"{path} is not a GGUF file (it does not start with the GGUF magic)"

        def read(n: int) -> bytes:
            data = handle.read(n)
            if len(data) != n:
                raise EOFError
            return data

        def u32() -> int:
            return struct.unpack("<I", read(4))[0]

        def u64() -> int:
            return struct.unpack("<Q", read(8))[0]

        def skip_value(kind: int) -> None:
            if kind == _GGUF_STRING:
                handle.seek(u64(), os.SEEK_CUR)
            elif kind == _GGUF_ARRAY:
                inner, count = u32(), u64()
                if inner in _GGUF_SCALARS:
                    handle.seek(_GGUF_SCALARS[inner] * count, os.SEEK_CUR)
                else:
                    for _ in range(count):
                        skip_value(inner)
            elif kind in _GGUF_SCALARS:
                handle.seek(_GGUF_SCALARS[kind], os.SEEK_CUR)
            else:
                raise ValueError(f"unknown GGUF value type {kind}")
            if handle.tell() > size:
                raise EOFError

        try:
            version, tensors, keys = u32(), u64(), u64()
            if version < 2 or tensors > 1 << 24 or keys > 1 << 24:
                return f"{path} has an unreadable GGUF header (version {version}, {tensors} tensors, {keys} keys)"
            alignment = 32
            for _ in range(keys):
                name = read(u64()).decode("utf-8", errors="replace")
                kind = u32()
                if name == "general.alignment" and kind == 4:
                    alignment = u32()
                else:
                    skip_value(kind)
            data_end = 0
            for _ in range(tensors):
                handle.seek(u64(), os.SEEK_CUR)  # name
                elements = 1
                for _ in range(u32()):
                    elements *= u64()
                per_block, block_bytes = _GGML_BLOCKS.get(u32(), (elements or 1, 0))
                data_end = max(data_end, u64() + -(-elements // per_block) * block_bytes)
        except EOFError:
            return f"{path} is truncated: the file ends inside its GGUF header ({size} bytes)"
        except ValueError as exc:
            return f"{path} has an unreadable GGUF header: {exc}"
        data_start = -(-handle.tell() // alignment) * alignment
        if tensors and data_start + data_end > size:
            return (
                f"{path} is truncated: its header places tensor data up to byte {data_start + data_end}, "
                f"the file has {size} bytes"
            )
    return None
