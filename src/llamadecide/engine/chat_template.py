"""Rendering prompts with the model's own chat template (GGUF `tokenizer.chat_template`)."""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from llamadecide.errors import ModelLoadError, UnsupportedError

_SENTINEL = "\u2063LLAMADECIDE_ANSWER\u2063"

# Templates for GGUFs that carry none (base models). Chosen by architecture, or by name.
BUILTIN_TEMPLATES: dict[str, str] = {
    "chatml": (
        "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    ),
    "gemma": (
        "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set prefix = messages[0]['content'] + '\n\n' %}"
        "{% set turns = messages[1:] %}{% else %}{% set prefix = '' %}{% set turns = messages %}{% endif %}"
        "{% for message in turns %}<start_of_turn>{{ 'model' if message['role'] == 'assistant' else message['role'] "
        "}}\n"
        "{{ prefix if loop.first else '' }}{{ message['content'] | trim }}<end_of_turn>\n{% endfor %}"
        "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
    ),
}


def builtin_template_for(architecture: str) -> str:
    return "gemma" if architecture.startswith("gemma") else "chatml"


def _raise_exception(message: str) -> None:
    raise UnsupportedError(f"chat template refused the conversation: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


@dataclass(frozen=True)
class ChatTemplate:
    """A compiled Jinja chat template plus the special-token strings it refers to."""

    source: str
    bos_token: str
    eos_token: str

    def __post_init__(self) -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            compiled = env.from_string(self.source)
        except jinja2.TemplateError as exc:
            raise ModelLoadError(f"the model's chat template does not compile: {exc}") from exc
        object.__setattr__(self, "_compiled", compiled)

    def render(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True) -> str:
        try:
            return self._compiled.render(  # type: ignore[attr-defined]
                messages=list(messages),
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                tools=None,
            )
        except jinja2.UndefinedError:
            # Some templates read optional variables (Qwen2.5's does, at every render); retry with a
            # lenient environment, compiled once (compiling took 15 ms, a tenth of a head request).
            return self._lenient().render(
                messages=list(messages),
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )

    def _lenient(self) -> jinja2.Template:
        compiled = getattr(self, "_lenient_compiled", None)
        if compiled is None:
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise_exception
            env.globals["strftime_now"] = _strftime_now
            compiled = env.from_string(self.source)
            object.__setattr__(self, "_lenient_compiled", compiled)
        return compiled

    def answer_suffix(self) -> str:
        """The text the template puts right after an assistant reply (e.g. `<|im_end|>\\n`)."""
        messages = [
            {"role": "user", "content": "Question?"},
            {"role": "assistant", "content": _SENTINEL},
        ]
        text = self.render(messages, add_generation_prompt=False)
        at = text.rfind(_SENTINEL)
        if at < 0:
            raise ModelLoadError("the chat template drops assistant replies; cannot score answers")
        return text[at + len(_SENTINEL) :]

    def check_generation_prompt(self) -> None:
        """Refuse templates that render a conversation differently once a reply is appended,
        since scoring relies on prompt + answer being what the model would see."""
        user = [{"role": "user", "content": "Question?"}]
        opened = self.render(user, add_generation_prompt=True)
        full = self.render(user + [{"role": "assistant", "content": _SENTINEL}], add_generation_prompt=False)
        if not full.startswith(opened):
            raise ModelLoadError(
                "the chat template's generation prompt is not a prefix of a rendered reply; "
                "answers cannot be scored in context with this template"
            )
