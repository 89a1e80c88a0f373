"""Flags derived from the fields they set, as llama-cpp-python derives its server's flags from its
settings (`add_args_from_model`): each flag's type, default and help come from a `Settings` field
(its description) or a `RunConfig` field (its `option` help), so a default is declared once.

`@settings_flags(*names)` gives a command one flag per named setting and calls it with
`settings=Settings(...)` built from the flags given (the environment, SM_LLAMA_CPP_* variables and
the config file fill the rest). `@config_flags(RunConfig, *names)` gives it one flag per named field,
with the field's default, and calls it with `run=` the dict of their values."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from llamadecide.engine.config import EngineConfig
from llamadecide.engine.model_files import ModelLocations
from llamadecide.settings import ENGINE_DERIVED, Settings

# The settings a verb that loads a model takes: the engine's, where its model comes from, its template.
ENGINE_SETTINGS = (
    "model",
    *(f.name for f in dataclasses.fields(EngineConfig) if f.name not in ENGINE_DERIVED),
    "chat_template_file",
    "chat_template",
)
SERVER_SETTINGS = tuple(name for name in Settings.model_fields if name not in ENGINE_SETTINGS)
# Verbs that only score sample nothing: the sampling seed is not theirs (their --seed splits data).
SCORING_SETTINGS = tuple(name for name in ENGINE_SETTINGS if name != "seed")

# Where a flag is not the field's name (kept as users have typed them: llama.cpp's short forms).
FLAG_NAMES: dict[str, tuple[str, ...]] = {
    "model": ("--model", "-m"),
    "n_threads": ("--threads", "-t", "--n-threads"),
    "n_gpu_layers": ("--n-gpu-layers", "-ngl"),
    "port": ("--port", "-p"),
    "no_mmap": ("--no-mmap/--mmap",),
}


@dataclass(frozen=True)
class Flag:
    name: str  # the field it sets, and the command's parameter
    type: Any
    default: Any
    help: str
    decls: tuple[str, ...]
    panel: str | None = None
    bounds: dict[str, float] = dataclasses.field(default_factory=dict)

    def parameter(self) -> inspect.Parameter:
        option = typer.Option(*self.decls, help=self.help, rich_help_panel=self.panel, **self.bounds)
        return inspect.Parameter(
            self.name, inspect.Parameter.KEYWORD_ONLY, default=self.default, annotation=Annotated[self.type, option]
        )


def _plain(annotation: Any) -> Any:
    """The type a flag parses: X for Optional[X], list[X] for tuple[X, ...]."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType) and len(args) == 1:
        return _plain(args[0])
    if origin is tuple:
        return list[args[0]]
    return annotation


def _decls(name: str, kind: Any, given: tuple[str, ...] = ()) -> tuple[str, ...]:
    if given:
        return given
    if name in FLAG_NAMES:
        return FLAG_NAMES[name]
    flag = "--" + name.replace("_", "-")
    return (f"{flag}/--no-{flag[2:]}",) if kind is bool else (flag,)


def setting_flag(name: str) -> Flag:
    """The flag of a setting: unset (None) unless given, so the other sources apply; its help names the
    setting's default and variable, its help panel whether it is the engine's."""
    field = Settings.model_fields[name]
    kind = _plain(field.annotation)
    default = "" if field.default is None else f"default {field.default}; "
    if name == "model":  # the default model is itself a setting (of where models are looked up)
        default = f"now {ModelLocations().default_model}; "
    bounds = {}
    for rule in field.metadata:
        for attr, key in (("ge", "min"), ("le", "max")):
            if getattr(rule, attr, None) is not None:
                bounds[key] = getattr(rule, attr)
    return Flag(
        name,
        Optional[kind],
        None,
        f"{field.description} ({default}LLAMADECIDE_{name.upper()})",
        _decls(name, kind),
        "Engine settings" if name in ENGINE_SETTINGS else "Server settings",
        bounds,
    )


def config_flag(cls: type, name: str, panel: str | None = None) -> Flag:
    """The flag of a dataclass field declared with `calibration.config.option`, defaulting to the field's."""
    field = {f.name: f for f in dataclasses.fields(cls)}[name]
    annotation = typing.get_type_hints(cls)[name]
    kind = _plain(annotation)
    default = list(field.default) if isinstance(field.default, tuple) else field.default
    optional = type(None) in typing.get_args(annotation)
    return Flag(
        name,
        Optional[kind] if optional else kind,
        default,
        field.metadata["help"],
        _decls(name, kind, field.metadata.get("flags", ())),
        panel,
        dict(field.metadata.get("bounds", {})),
    )


def _derive(command: Callable, into: str, flags: list[Flag], build: Callable[[dict[str, Any]], Any]) -> Callable:
    """`command` with `into` replaced by the flags, called with `into=build(their values)`."""
    signature = inspect.signature(command, eval_str=True)
    kept = [p for p in signature.parameters.values() if p.name != into]

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        values = {flag.name: kwargs.pop(flag.name) for flag in flags if flag.name in kwargs}
        return command(*args, **{into: build(values)}, **kwargs)

    parameters = [*kept, *(flag.parameter() for flag in flags)]
    wrapper.__signature__ = signature.replace(parameters=parameters)
    # Typer reads this signature and these (evaluated) annotations, not the command's own.
    wrapper.__annotations__ = {p.name: p.annotation for p in parameters}
    del wrapper.__wrapped__
    return wrapper


def settings_flags(*names: str) -> Callable[[Callable], Callable]:
    def decorate(command: Callable) -> Callable:
        return _derive(command, "settings", [setting_flag(n) for n in names], settings_from_flags)

    return decorate


def config_flags(cls: type, *names: str, panel: str | None = None, into: str = "run") -> Callable[[Callable], Callable]:
    def decorate(command: Callable) -> Callable:
        flags = [config_flag(cls, n, panel) for n in names]
        return _derive(command, into, flags, lambda values: {k: _as_field(v) for k, v in values.items()})

    return decorate


def _as_field(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def settings_from_flags(values: dict[str, Any]) -> Settings:
    """Settings from the environment with the flags the user passed on top; a value a setting refuses
    is the user's error, said with the flag's name."""
    from pydantic import ValidationError

    from llamadecide.cli.common import fail

    given = {k: (str(v) if isinstance(v, Path) and k == "model" else v) for k, v in values.items() if v is not None}
    try:
        return Settings(**given)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = str(first["loc"][0]) if first.get("loc") else "settings"
        flag = _decls(where, None)[0] if where in Settings.model_fields else where
        raise fail(f"{flag}: {first['msg']}") from None


def given_settings(settings: Settings, names: tuple[str, ...]) -> set[str]:
    """Of these settings, those set by a flag, a variable or the config file (not left at their default)."""
    return {name for name in names if name in settings.model_fields_set}
