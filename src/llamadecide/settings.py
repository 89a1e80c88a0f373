"""Settings, defined once. They feed environment variables (LLAMADECIDE_*), the AWS llama.cpp
container's SM_LLAMA_CPP_* variables, a JSON/YAML config file and CLI flags alike.

Precedence, highest first: explicit values (CLI flags), LLAMADECIDE_* variables,
SM_LLAMA_CPP_* / LLAMA_API_KEY variables, the config file, defaults.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from llamadecide.engine.config import EngineConfig
from llamadecide.engine.model_files import ModelLocations, resolve_model_path

log = logging.getLogger(__name__)

SM_PREFIX = "SM_LLAMA_CPP_"

# llama-server flag (long or short form, as SM_LLAMA_CPP_FOO_BAR becomes --foo-bar) -> setting.
SM_FLAG_TO_SETTING: dict[str, str] = {
    "model": "model",
    "m": "model",
    "ctx-size": "n_ctx",
    "c": "n_ctx",
    "n-gpu-layers": "n_gpu_layers",
    "gpu-layers": "n_gpu_layers",
    "ngl": "n_gpu_layers",
    "threads": "n_threads",
    "t": "n_threads",
    "threads-batch": "n_threads_batch",
    "tb": "n_threads_batch",
    "batch-size": "n_batch",
    "b": "n_batch",
    "ubatch-size": "n_ubatch",
    "ub": "n_ubatch",
    "parallel": "n_seq_max",
    "np": "n_seq_max",
    "seed": "seed",
    "s": "seed",
    "host": "host",
    "port": "port",
    "api-key": "api_key",
    "flash-attn": "flash_attn",
    "fa": "flash_attn",
    "chat-template-file": "chat_template_file",
    "chat-template": "chat_template",
    "alias": "model_alias",
    "no-mmap": "no_mmap",
    "repack": "repack",
}


def sm_llama_cpp_flags(environ: Mapping[str, str]) -> dict[str, str | bool]:
    """The AWS container's rule: SM_LLAMA_CPP_FOO_BAR=value is the flag --foo-bar value;
    `true` makes a bare flag and `false` drops it."""
    flags: dict[str, str | bool] = {}
    for key, value in environ.items():
        if not key.startswith(SM_PREFIX) or key == SM_PREFIX:
            continue
        flag = key[len(SM_PREFIX) :].lower().replace("_", "-")
        lowered = value.strip().lower()
        if lowered == "false":
            continue
        flags[flag] = True if lowered == "true" else value
    return flags


class _SageMakerSource(PydanticBaseSettingsSource):
    """SM_LLAMA_CPP_* and LLAMA_API_KEY, mapped onto our settings."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:  # pragma: no cover
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        unknown: list[str] = []
        for flag, value in sm_llama_cpp_flags(os.environ).items():
            name = SM_FLAG_TO_SETTING.get(flag)
            if name is None:
                unknown.append(flag)
            else:
                values[name] = value
        if unknown:
            log.warning("ignoring SM_LLAMA_CPP_* flags llamadecide does not use: %s", ", ".join(sorted(unknown)))
        if "LLAMA_API_KEY" in os.environ and "api_key" not in values:
            values["api_key"] = os.environ["LLAMA_API_KEY"]
        return values


class _ConfigFileSource(PydanticBaseSettingsSource):
    """A JSON or YAML file named by LLAMADECIDE_CONFIG."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:  # pragma: no cover
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        path = os.environ.get("LLAMADECIDE_CONFIG")
        if not path:
            return {}
        text = Path(path).read_text(encoding="utf-8")
        if path.endswith((".yaml", ".yml")):
            import yaml

            data = yaml.safe_load(text) or {}
        else:
            data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"{path} must hold a mapping of settings")
        return data


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LLAMADECIDE_", extra="forbid", populate_by_name=True)

    # engine
    model: str | None = Field(
        None,
        description="GGUF file, directory or bundled model name (default: /opt/ml/model's GGUF, else the default "
        "bundled model, LLAMADECIDE_DEFAULT_MODEL; see `llamadecide models`)",
    )
    model_alias: str | None = Field(
        None, description="Model name reported to clients (default: the GGUF's general.name)"
    )
    n_ctx: int = Field(
        8192,
        ge=0,
        description="Context size in tokens (0: the model's training context); prompt, option list and answer "
        "trie must fit",
    )
    n_batch: int = Field(512, ge=1, description="Logical batch size for prompt evaluation")
    n_ubatch: int = Field(512, ge=1, description="Physical batch size")
    n_threads: int | None = Field(None, ge=1, description="CPU threads for generation (default: all cores)")
    n_threads_batch: int | None = Field(None, ge=1, description="CPU threads for batch evaluation (default: n_threads)")
    n_gpu_layers: int = Field(0, ge=-1, description="Layers offloaded to the GPU: 0 CPU only, -1 all")
    n_seq_max: int = Field(0, ge=0, description="KV sequences (options scored at once); 0: llama.cpp's maximum")
    pinned_prefixes: int = Field(
        8,
        ge=0,
        description="Question prefixes (question-first prompt format, demonstrations) kept evaluated across "
        "requests; each is one KV sequence fewer for options",
    )
    pinned_cells: int = Field(
        0,
        ge=0,
        description="Most KV cells the pinned prefixes hold together (0: no cap; pins give way, least recently used "
        "first, to requests that need the room)",
    )
    call_cost_rows: int = Field(
        64,
        ge=1,
        description="What one llama_decode call costs in batch rows (the weights are streamed once a call); answer "
        "tries with at least this many nodes may be expanded best-first under max_probability_bound",
    )
    max_probability_bound: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="Bound on the probability error of an uncalibrated answer with many options, expanded best-first "
        "(reported per answer as probability_bound); 0: always exact",
    )
    seed: int = Field(0, description="Sampling seed")
    flash_attn: bool = Field(True, description="Use flash attention (off: answers depend on where their KV cells lie)")
    deterministic: bool = Field(
        True,
        description="Score in llama.cpp call shapes whose numbers depend neither on batch-mates nor on server history "
        "(off: calls up to n_batch rows, faster on long prompts with a stock llama.cpp, answers move by its "
        "kernel noise)",
    )
    no_mmap: bool = Field(False, description="Read the model into memory instead of mapping it")
    repack: bool = Field(
        False, description="Use llama.cpp's repacked CPU weight layouts (batch-size-dependent numerics)"
    )
    chat_template_file: Path | None = Field(None, description="Jinja chat template overriding the GGUF's")
    chat_template: str | None = Field(None, description="Built-in template (chatml, gemma) overriding the GGUF's")
    hidden_tap: bool = Field(
        True,
        description="Read hidden states inside the call (a call that reads no logits stops at the deepest state it "
        "reads); off: llama.cpp's embeddings mode",
    )
    verbose: bool = Field(False, description="Print llama.cpp's own logs")

    # server
    host: str = Field("127.0.0.1", description="Address to listen on")
    port: int = Field(8000, ge=1, le=65535, description="Port to listen on")
    api_key: str | None = Field(
        None, description="Require Authorization: Bearer <key> on /v1 routes, /invocations and /metrics"
    )
    open_invocations: bool = Field(
        False,
        description="/invocations needs no key even with api_key set (the SageMaker entrypoint's default: SageMaker "
        "authenticates callers at its edge)",
    )
    max_body_bytes: int = Field(6_291_456, ge=1024, description="Largest request body accepted (SageMaker's limit)")
    max_questions: int = Field(400, ge=1, description="Most questions in one decision request")
    max_options: int = Field(255, ge=2, description="Most options in one question")
    max_rotations: int = Field(8, ge=1, le=255, description="Most option-order rotations one request may ask for")
    max_request_rows: int = Field(
        16384,
        ge=1,
        description="Most tokens one decision request may have evaluated (prompts and answer tries over its questions "
        "and rotations), counted before any evaluation",
    )
    request_timeout: float = Field(
        120.0,
        ge=0,
        description="Seconds one request may hold the engine (0: no limit); then it gets 504 and the engine moves on",
    )
    max_tokens: int = Field(2048, ge=1, description="Most tokens one completion may generate")
    decision_batch: int = Field(
        16,
        ge=1,
        description="Most waiting decision requests evaluated together in shared engine calls, each answer what it is "
        "alone (1: one at a time)",
    )
    queue_size: int = Field(64, ge=1, description="Requests that may wait for the engine before 503")
    drain_timeout: float = Field(
        20.0,
        ge=0,
        description="Seconds a stopping server (SIGTERM) lets in-flight and queued requests finish; then waiting ones "
        "get 503, generations stop, and it exits (SageMaker kills 30 s after its stop signal)",
    )
    probability_log: Path | None = Field(None, description="Append one JSON line per answer to this file")
    profiles_dir: Path | None = Field(None, description="Directory of calibration profiles (JSON)")
    profiles_poll: float = Field(
        5.0,
        ge=0,
        description="Seconds between looks at profiles_dir for new or changed profiles, taken in without a restart "
        "(one version per name: the highest); 0: only at start-up",
    )
    label_store: str | None = Field(
        None,
        description="Where served decisions' review items and people's labels are kept: a SQLite file, or "
        "s3://bucket/prefix that every instance behind one endpoint shares (none: no review queue, no labels)",
    )
    audit_rate: float = Field(
        0.02,
        ge=0.0,
        le=1.0,
        description="Share of automatic decisions drawn at random into the review queue beside every escalation, "
        "their chance recorded: what audits production precision and certifies refits",
    )
    review_retention_days: float = Field(
        30.0,
        ge=0,
        description="Days the input text of a decision in the review queue is kept (0: no limit); after that its "
        "label stays but no longer trains. Automatic decisions not audited keep only the input's hash",
    )
    a2i_flow_definition: str | None = Field(
        None,
        description="ARN of an Amazon Augmented AI flow definition: each decision entering the review queue also "
        "starts a human loop there (`llamadecide labels import` reads the loops' output from S3)",
    )
    swagger_ui: bool = Field(
        False,
        description="Serve the Swagger UI page at /docs (it loads its scripts from a CDN); /openapi.json is always "
        "served",
    )
    systemone_extensions: bool = Field(
        True, description="Add llamadecide's x_-prefixed fields (x_label_mass...) to System One answers"
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (
            init_settings,
            env_settings,
            _SageMakerSource(settings_cls),
            _ConfigFileSource(settings_cls),
        )

    @classmethod
    def for_container(cls, **flags: Any) -> Settings:
        """The settings of the SageMaker container: every source as usual, then, below them all but the
        defaults, the hosting contract's own (0.0.0.0:8080, invocations open since SageMaker
        authenticates at its edge and forwards no key, profiles from /opt/ml/model/profiles when the
        archive has them). The one place the container's precedence is written."""
        return _ContainerSettings(**flags)

    def model_path(self) -> Path:
        return resolve_model_path(self.model)

    def engine_config(self) -> EngineConfig:
        """The engine's configuration: every field the setting of its name (the one place one is made)."""
        template = (
            self.chat_template_file.read_text(encoding="utf-8") if self.chat_template_file else self.chat_template
        )
        own = {f.name: getattr(self, f.name) for f in fields(EngineConfig) if f.name not in ENGINE_DERIVED}
        return EngineConfig(model_path=self.model_path(), chat_template=template, **own)


ENGINE_DERIVED = ("model_path", "chat_template")  # EngineConfig fields computed from settings, not copied


SAGEMAKER_PORT = 8080


class _ContainerDefaultsSource(PydanticBaseSettingsSource):
    """What SageMaker's hosting contract sets where nothing else did."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:  # pragma: no cover
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        values: dict[str, Any] = {"host": "0.0.0.0", "port": SAGEMAKER_PORT, "open_invocations": True}
        profiles = ModelLocations().model_dir / "profiles"
        if profiles.is_dir():
            values["profiles_dir"] = profiles
        return values


class _ContainerSettings(Settings):
    @classmethod
    def settings_customise_sources(cls, settings_cls, *sources, **named) -> tuple[PydanticBaseSettingsSource, ...]:
        return (
            *super().settings_customise_sources(settings_cls, *sources, **named),
            _ContainerDefaultsSource(settings_cls),
        )


def settings_table() -> str:
    """Every setting as a Markdown table (docs/settings.md holds it; a test keeps the two equal)."""
    flags: dict[str, list[str]] = {}
    for flag, name in SM_FLAG_TO_SETTING.items():
        flags.setdefault(name, []).append(flag.upper().replace("-", "_"))
    lines = ["| setting | default | `SM_LLAMA_CPP_` | meaning |", "| --- | --- | --- | --- |"]
    for name, field in Settings.model_fields.items():
        default = "none" if field.default is None else json.dumps(field.default)
        sm = ", ".join(f"`{flag}`" for flag in flags.get(name, []))
        lines.append(f"| `{name}` | {default} | {sm} | {field.description} |")
    for name, field in ModelLocations.model_fields.items():  # read where models are looked up (engine)
        default = f"`{field.default}`" if name != "model_cache" else "`~/.cache/llamadecide/models`"
        lines.append(f"| `{name}` | {default} |  | {field.description}; environment only |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(settings_table(), end="")
