"""Text to tokens and back for one model: its chat template, in-context tokenization of answers,
and the end-of-answer marker every scored answer ends with."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import llama_cpp
from llama_cpp import _internals as internals

from llamadecide.engine.chat_template import BUILTIN_TEMPLATES, ChatTemplate, builtin_template_for
from llamadecide.errors import ModelLoadError

log = logging.getLogger(__name__)


class Tokenizer:
    def __init__(self, model: internals.LlamaModel, *, template_override: str | None, model_label: str) -> None:
        self._model = model
        self.metadata = model.metadata()
        self.bos_id = model.token_bos()
        self.eos_id = model.token_eos()
        self._add_bos = bool(model.add_bos_token()) and self.bos_id >= 0
        self.chat_template, self.chat_template_origin = self._load_template(template_override, model_label)
        self.end_of_answer = self._end_of_answer_tokens()

    def _token_text(self, token: int) -> str:
        return self._model.detokenize([token], special=True).decode("utf-8", errors="replace")

    def _load_template(self, override: str | None, model_label: str) -> tuple[ChatTemplate, str]:
        if override:
            source = BUILTIN_TEMPLATES.get(override, override)
            origin = f"builtin:{override}" if override in BUILTIN_TEMPLATES else "override"
        elif self.metadata.get("tokenizer.chat_template"):
            source = self.metadata["tokenizer.chat_template"]
            origin = "gguf"
        else:
            name = builtin_template_for(self.metadata.get("general.architecture", ""))
            source = BUILTIN_TEMPLATES[name]
            origin = f"builtin:{name}"
            log.warning("%s has no chat template (a base model?); using the built-in %r template", model_label, name)
        bos = self._token_text(self.bos_id) if self.bos_id >= 0 else ""
        eos = self._token_text(self.eos_id) if self.eos_id >= 0 else ""
        template = ChatTemplate(source=source, bos_token=bos, eos_token=eos)
        template.check_generation_prompt()
        return template, origin

    def _end_of_answer_tokens(self) -> list[int]:
        """Tokens the template puts after a reply, up to and including the first end-of-generation
        token: scoring them is what stops a prefix option beating a longer one."""
        suffix = self.tokenize(self.chat_template.answer_suffix())
        for i, token in enumerate(suffix):
            if self.is_end_of_generation(token):
                return suffix[: i + 1]
        if self.eos_id >= 0:
            return [self.eos_id]
        raise ModelLoadError("cannot find the end-of-answer token of this model's chat template")

    def tokenize(self, text: str, *, special: bool = True) -> list[int]:
        """Tokens of a piece of text inside a prompt (no BOS added)."""
        return self._model.tokenize(text.encode("utf-8"), add_bos=False, special=special)

    def tokenize_prompt(self, text: str) -> list[int]:
        """Tokens of a whole rendered prompt: BOS added when the model wants one and the
        template did not already write it."""
        tokens = self.tokenize(text)
        if self._add_bos and (not tokens or tokens[0] != self.bos_id):
            tokens.insert(0, self.bos_id)
        return tokens

    def tokenize_answers(self, prompt_text: str, answers: Sequence[str]) -> tuple[list[int], list[list[int]]]:
        """The prompt's tokens, and the tokens of `prompt_text + answer` for each answer, exactly as
        tokenize_prompt would give them, without tokenizing the whole prompt again per answer:
        llama.cpp cuts the text at special tokens before it tokenizes the pieces, so only the text
        after the prompt's last special token can change with the answer. (Tokenizing the whole
        prompt per answer made 255 long options cost seconds before any evaluation.)"""
        prompt = self.tokenize_prompt(prompt_text)
        last = max((i for i, t in enumerate(prompt) if self._is_special(t)), default=-1)
        start = prompt_text.rfind(self._token_text(prompt[last])) if last >= 0 else -1
        if start < 0 or self.tokenize(prompt_text[start:]) != prompt[last:]:
            return prompt, [self.tokenize_prompt(prompt_text + answer) for answer in answers]
        head, tail = prompt[:last], prompt_text[start:]
        return prompt, [head + self.tokenize(tail + answer) for answer in answers]

    def _is_special(self, token: int) -> bool:
        attr = llama_cpp.llama_vocab_get_attr(self._model.vocab, token)
        return bool(attr & (llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED))

    def detokenize(self, tokens: Sequence[int], *, special: bool = False) -> str:
        return self._model.detokenize(list(tokens), special=special).decode("utf-8", errors="replace")

    def is_end_of_generation(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._model.vocab, token))

    def render_chat(self, messages: Sequence[dict], *, add_generation_prompt: bool = True) -> str:
        return self.chat_template.render(messages, add_generation_prompt=add_generation_prompt)
