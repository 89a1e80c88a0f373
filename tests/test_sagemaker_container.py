"""The container's entrypoint run locally as SageMaker runs it: model under a model directory,
SM_LLAMA_CPP_* settings, `serve` argument, /ping and /invocations as SageMaker calls them."""

from __future__ import annotations

import json
import os
import shutil
import sys

import httpx

from llamadecide.bench.server_process import ServerProcess
from llamadecide.engine import bundled_model_path


def test_defaults_are_sagemakers(monkeypatch, tmp_path):
    from llamadecide.sagemaker.serve import sagemaker_settings

    for key in ("LLAMADECIDE_HOST", "LLAMADECIDE_PORT", "SM_LLAMA_CPP_PORT", "SM_LLAMA_CPP_HOST"):
        monkeypatch.delenv(key, raising=False)
    (tmp_path / "profiles").mkdir()
    monkeypatch.setenv("LLAMADECIDE_MODEL_DIR", str(tmp_path))
    settings = sagemaker_settings()
    assert (settings.host, settings.port, settings.profiles_dir) == ("0.0.0.0", 8080, tmp_path / "profiles")
    assert settings.open_invocations


def test_the_containers_defaults_give_way_to_every_other_source(monkeypatch, tmp_path):
    from llamadecide.sagemaker.serve import sagemaker_settings

    for key in ("LLAMADECIDE_HOST", "LLAMADECIDE_PORT", "SM_LLAMA_CPP_PORT", "SM_LLAMA_CPP_HOST"):
        monkeypatch.delenv(key, raising=False)
    config = tmp_path / "settings.json"
    config.write_text(json.dumps({"port": 9100}))
    monkeypatch.setenv("LLAMADECIDE_CONFIG", str(config))
    monkeypatch.setenv("SM_LLAMA_CPP_HOST", "127.0.0.2")
    monkeypatch.setenv("LLAMADECIDE_OPEN_INVOCATIONS", "false")
    settings = sagemaker_settings()
    assert (settings.host, settings.port, settings.open_invocations) == ("127.0.0.2", 9100, False)


def test_entrypoint_with_a_sagemaker_environment(tmp_path):
    model_dir = tmp_path / "opt-ml-model"
    model_dir.mkdir()
    gguf = bundled_model_path()
    os.symlink(gguf, model_dir / gguf.name)  # as model.tar.gz unpacks: the GGUF at the root
    server = ServerProcess(log_dir=tmp_path, command=[sys.executable, "-m", "llamadecide.sagemaker.serve", "serve"])
    server.env.update(
        {
            "LLAMADECIDE_MODEL_DIR": str(model_dir),
            "LLAMADECIDE_HOST": "127.0.0.1",
            "LLAMADECIDE_PORT": str(server.port),  # the container's default is 0.0.0.0:8080
            "SM_LLAMA_CPP_CTX_SIZE": "2048",
            "SM_LLAMA_CPP_THREADS": "2",
            "SM_LLAMA_CPP_N_GPU_LAYERS": "0",
            "LLAMA_API_KEY": "only-for-v1-routes",
        }
    )
    with server:
        assert httpx.get(f"{server.url}/ping", timeout=120).status_code == 200
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json",
            "X-Amzn-SageMaker-Custom-Attributes": "route=/v1/decisions",
        }  # no Authorization: SageMaker never sends one
        body = {
            "model": "m",
            "input": "The parcel arrived broken.",
            "questions": [{"type": "predicate", "instructions": "The customer reports damage."}],
        }
        response = httpx.post(f"{server.url}/invocations", content=json.dumps(body), headers=headers, timeout=60)
        assert response.status_code == 200, response.text
        assert 0 < response.json()["answers"][0]["probability"] < 1
        models = httpx.get(
            f"{server.url}/v1/models", headers={"Authorization": "Bearer only-for-v1-routes"}, timeout=120
        ).json()
        assert models["data"][0]["meta"]["n_ctx"] == 2048  # SM_LLAMA_CPP_CTX_SIZE reached the engine
        assert models["data"][0]["id"] == gguf.stem
        assert httpx.get(f"{server.url}/v1/models", timeout=120).status_code == 401
    shutil.rmtree(model_dir)
