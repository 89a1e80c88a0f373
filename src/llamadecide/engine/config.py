"""The engine's settings (no llama.cpp here)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class EngineConfig:
    model_path: Path
    n_ctx: int = 4096
    n_batch: int = 512
    n_ubatch: int = 512
    n_threads: int | None = None
    n_threads_batch: int | None = None
    n_gpu_layers: int = 0  # 0: CPU only; -1: every layer on the GPU
    n_seq_max: int = 0  # 0: as many KV sequences as llama.cpp allows
    # KV sequences kept aside to hold pinned prompt prefixes (a question-first prompt format's question
    # block, k-shot demonstrations) across calls that evaluate other prompts in between; each one
    # fewer option scored in a single group.
    pinned_prefixes: int = 8
    # Most KV cells the pinned prefixes may hold together (0: whatever the requests leave free).
    pinned_cells: int = 0
    # The cost model for skipping work: one llama_decode call costs about as much as this many batch
    # rows (the bundled models on CPU: the weights are streamed once per call). A bound on the answers
    # (`score_trie(epsilon=...)`) expands tries of at least this many nodes best-first, over several calls.
    call_cost_rows: int = 64
    seed: int = 0
    flash_attn: bool = True
    # Scoring evaluates in call shapes whose numbers do not depend on what else is in the call or
    # in the KV cache (`decoder.call_sizes`), so an answer is the same on a fresh engine and after
    # any other traffic. Off: calls as large as n_batch (faster for long prompts, history-dependent).
    deterministic: bool = True
    use_mmap: bool = True
    # llama.cpp's repacked weight layouts (CPU_REPACK, e.g. for Q4_K) switch between GEMM and GEMV
    # kernels by batch size, so a token's numbers would depend on what else is in its batch. Off by
    # default: no measurable prompt speed-up on the bundled models, and scores stay batch-independent.
    repack: bool = False
    # Read hidden states inside the call (`hidden_tap`: no vocabulary projection for calls that read
    # no logits); off, or for a model whose graph names no `result_norm`: llama.cpp's embeddings mode.
    hidden_tap: bool = True
    chat_template: str | None = None  # Jinja source, or a built-in name (chatml, gemma), overriding the GGUF's
    verbose: bool = False
