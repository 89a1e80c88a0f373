"""The llama.cpp engine: load a GGUF, render its chat template, generate, score continuations."""

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
