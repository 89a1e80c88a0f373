"""The llama.cpp engine: load a GGUF, render its chat template, generate, score continuations.

The public names load llama.cpp on first use, so the engine's pure modules (`config`, `trie`) can
be imported without it."""

import os
from importlib import import_module

# llama.cpp's CPU backend runs on OpenMP, whose default ACTIVE waiting spins idle threads: two
# processes sharing cores (a server beside a benchmark, tests beside a build) then slow each other
# down many times over. PASSIVE threads sleep instead; it must be set before libgomp loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

_EXPORTS = {
    "Engine": "llamadecide.engine.llama_engine",
    "EngineConfig": "llamadecide.engine.config",
    "GenerationResult": "llamadecide.engine.values",
    "ScoringInput": "llamadecide.engine.values",
    "TokenEvent": "llamadecide.engine.values",
    "TrieScores": "llamadecide.engine.values",
    "SamplingParams": "llamadecide.engine.generation",
    "json_grammar": "llamadecide.engine.generation",
    "bundled_model_path": "llamadecide.engine.model_files",
    "file_sha256": "llamadecide.engine.gguf_file",
    "gpu_offload_supported": "llamadecide.engine.llama_engine",
    "resolve_model_path": "llamadecide.engine.model_files",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
