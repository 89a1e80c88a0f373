from __future__ import annotations

import os

# The suite runs on the small SmolLM2 wherever no model is named (in-process and in the servers it
# starts), whatever the installed default is.
os.environ["LLAMADECIDE_DEFAULT_MODEL"] = "smollm2-135m-instruct"

import sys  # noqa: E402
from pathlib import Path

import pytest  # noqa: E402

from llamadecide.engine import Engine, EngineConfig, bundled_model_path
from llamadecide.settings import Settings

sys.path.insert(0, str(Path(__file__).parent))


def engine_config(model_path: Path, **settings) -> EngineConfig:
    """The engine configuration the settings make for a model file (`Settings.engine_config`, the one
    place an EngineConfig is made), with these settings changed."""
    return Settings(model=str(model_path), **settings).engine_config()


@pytest.fixture(scope="session")
def engine() -> Engine:
    """The real engine on the bundled SmolLM2-135M-Instruct GGUF, shared by the session (on the GPU
    with LLAMADECIDE_N_GPU_LAYERS, as scripts/gpu-check.sh runs it)."""
    layers = int(os.environ.get("LLAMADECIDE_N_GPU_LAYERS", "0"))
    return Engine(engine_config(bundled_model_path(), n_ctx=4096, seed=0, n_gpu_layers=layers))


API_KEY = "test-key-0123456789"
DATA = Path(__file__).resolve().parents[1] / "data"  # the labelled data sets the repository holds (data/README.md)


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """A real server with the bundled model, an API key and a probability log."""
    from llamadecide.bench.server_process import ServerProcess

    log_dir = tmp_path_factory.mktemp("server")
    process = ServerProcess(
        "--api-key",
        API_KEY,
        "--probability-log",
        str(log_dir / "probabilities.jsonl"),
        env={"LLAMADECIDE_QUEUE_SIZE": "16", "LLAMADECIDE_MAX_BODY_BYTES": "262144"},
        log_dir=log_dir,
    )
    process.probability_log = log_dir / "probabilities.jsonl"
    with process:
        yield process
