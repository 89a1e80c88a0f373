"""The llama.cpp engine: load a GGUF, render its chat template, generate, score continuations."""

import os

# llama.cpp's CPU backend runs on OpenMP, whose default ACTIVE waiting spins idle threads: two
# processes sharing cores (a server beside a benchmark, tests beside a build) then slow each other
# down many times over. PASSIVE threads sleep instead; it must be set before libgomp loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from llamadecide.engine.generation import SamplingParams, json_grammar
from llamadecide.engine.llama_engine import Engine, EngineConfig, GenerationResult, TokenEvent
from llamadecide.engine.model_files import bundled_model_path, file_sha256, resolve_model_path

__all__ = [
    "Engine",
    "EngineConfig",
    "GenerationResult",
    "SamplingParams",
    "TokenEvent",
    "bundled_model_path",
    "file_sha256",
    "json_grammar",
    "resolve_model_path",
]
