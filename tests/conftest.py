from __future__ import annotations

import pytest

from llamadecide.engine import Engine, EngineConfig, bundled_model_path


@pytest.fixture(scope="session")
def engine() -> Engine:
    """The real engine on the bundled SmolLM2-135M-Instruct GGUF, shared by the session."""
    return Engine(EngineConfig(model_path=bundled_model_path(), n_ctx=4096, seed=0))
