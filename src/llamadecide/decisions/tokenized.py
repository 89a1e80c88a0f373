"""Questions as token sequences: prompt + answer + end-of-answer marker per option, tokenized in
context (the answer's tokens are the ones the model emits after the prompt), and the part of a
question's prompts that is the same for every state (its pinned prefix), tokenized once."""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from llamadecide.decisions.prompt import PROMPT_FORMAT_VERSION, build_messages
from llamadecide.decisions.questions import Question
from llamadecide.decisions.rotations import rotate, rotation_shifts, shown
from llamadecide.decisions.scoring import Scoring
from llamadecide.errors import InvalidRequestError


@dataclass(frozen=True)
class TokenizedQuestion:
    question: Question
    sequences: list[list[int]]  # prompt + answer + end marker, one per option
    boundaries: list[int]  # index where each answer's own tokens begin
    prompt_tokens: list[int]  # the prompt alone

    @property
    def answer_lengths(self) -> list[int]:
        """Tokens scored for each option: its own tokens and the end marker."""
        return [len(s) - b for s, b in zip(self.sequences, self.boundaries)]


def common_prefix(sequences: Sequence[Sequence[int]]) -> int:
    first = sequences[0]
    n = min(len(s) for s in sequences)
    for i in range(n):
        t = first[i]
        if any(s[i] != t for s in sequences):
            return i
    return n


def split_point(items: Sequence[TokenizedQuestion]) -> int:
    """Where the prompt the sequences share ends and their continuations begin: the longest common
    prefix, never inside an answer, leaving every continuation at least one token."""
    sequences = [s for item in items for s in item.sequences]
    return min(
        common_prefix(sequences), min(b for item in items for b in item.boundaries), min(len(s) for s in sequences) - 1
    )


def canonical_key(question: Question, rule: Scoring) -> str:
    """A question and its rule as text: the order questions are scored in, and the key of their
    pinned prefix (names and request order play no part)."""
    options = [[type(o.value).__name__, str(o.value), o.text, o.description or ""] for o in question.options]
    demonstrations = [[d.input, d.option] for d in rule.demonstrations]
    return json.dumps(
        [
            question.type,
            question.mode,
            question.instructions,
            options,
            rule.rotations,
            demonstrations,
            rule.prompt_format,
        ]
    )


def describe(question: Question) -> str:
    if question.name:
        return repr(question.name)
    text = question.instructions.strip()
    return repr(text if len(text) <= 60 else text[:57] + "...")


class QuestionTokenizer:
    """Tokenizes questions about a state for one engine (its chat template, tokenizer and end-of-answer
    marker), keeping the most recent questions' pinned prefixes."""

    def __init__(self, engine, *, cache_size: int = 256) -> None:
        self.engine = engine
        self._prefixes: OrderedDict[str, list[int]] = OrderedDict()
        self._cache_size = cache_size

    def tokenize(
        self,
        state_text: str,
        question: Question,
        demonstrations: Sequence[tuple[str, str]] = (),
        prompt_format: str = PROMPT_FORMAT_VERSION,
    ) -> TokenizedQuestion:
        prompt_text = self.engine.render_chat(build_messages(state_text, question, demonstrations, prompt_format))
        # In-context tokenization: prompt + answer tokenized together and split where they diverge
        # from the prompt alone, so the answer's tokens are the ones the model emits.
        prompt_tokens, with_answers = self.engine.tokenize_answers(prompt_text, question.answer_texts())
        sequences: list[list[int]] = []
        boundaries: list[int] = []
        for tokens in with_answers:
            full = tokens + list(self.engine.end_of_answer)
            sequences.append(full)
            boundaries.append(common_prefix([prompt_tokens, full]))
        seen: dict[tuple[int, ...], int] = {}
        for index, sequence in enumerate(sequences):
            key = tuple(sequence[boundaries[index] :])
            if key in seen:
                other = question.options[seen[key]].value
                raise InvalidRequestError(
                    f"options {other!r} and {question.options[index].value!r} are the same tokens to the model",
                    param="questions",
                )
            seen[key] = index
        return TokenizedQuestion(question, sequences, boundaries, prompt_tokens)

    def prompt_only(
        self,
        state_text: str,
        question: Question,
        demonstrations: Sequence[tuple[str, str]] = (),
        prompt_format: str = PROMPT_FORMAT_VERSION,
    ) -> TokenizedQuestion:
        """The prompt alone, for a head that reads its hidden state and no answer: rendering and
        tokenizing every option in context would cost more than the rest of such a request (77
        options: about 35 ms of CPU against a 29-row engine call)."""
        prompt_text = self.engine.render_chat(build_messages(state_text, question, demonstrations, prompt_format))
        prompt_tokens = self.engine.tokenize_prompt(prompt_text)
        return TokenizedQuestion(question, [prompt_tokens], [len(prompt_tokens)], prompt_tokens)

    def rotations(self, state_text: str, question: Question, rule: Scoring) -> list[tuple[int, TokenizedQuestion]]:
        """The question under every rotation its rule asks for, shift 0 first."""
        return [
            (
                shift,
                self.tokenize(
                    state_text, rotate(question, shift), shown(question, rule.demonstrations, shift), rule.prompt_format
                ),
            )
            for shift in rotation_shifts(question, rule.rotations)
        ]

    def pinned_prefix(self, question: Question, rule: Scoring, prompt_tokens: Sequence[int]) -> list[int]:
        """The leading tokens of this question's prompts that are the same for every state (empty for a
        state-first question without demonstrations): rendered and tokenized once per question and rule."""
        if not rule.pins_prefix:
            return []
        key = canonical_key(question, rule)
        prefix = self._prefixes.get(key)
        if prefix is None:
            exchanges = build_messages("-", question, shown(question, rule.demonstrations, 0), rule.prompt_format)[:-1]
            prefix = self.engine.tokenize_prompt(self.engine.render_chat(exchanges, add_generation_prompt=False))
            self._prefixes[key] = prefix
            while len(self._prefixes) > self._cache_size:
                self._prefixes.popitem(last=False)
        else:
            self._prefixes.move_to_end(key)
        return list(prompt_tokens[: common_prefix([prefix, prompt_tokens])])
