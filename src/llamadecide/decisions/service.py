"""Deciding: every option of every question scored exactly, in one batched engine call."""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from llamadecide.decisions import maths
from llamadecide.decisions.lexical import LexicalModel
from llamadecide.decisions.prompt import PROMPT_FORMAT_VERSION, QUESTION_FIRST_FORMATS, build_messages, check_layout, render_state
from llamadecide.decisions.questions import OptionValue, Question
from llamadecide.errors import ContextOverflowError, InvalidRequestError, RequestTimeoutError


class ScoringEngine(Protocol):
    """The small part of the engine that deciding needs."""

    end_of_answer: list[int]
    n_ctx: int

    def render_chat(self, messages: Sequence[dict], *, add_generation_prompt: bool = True) -> str: ...
    def tokenize_prompt(self, text: str) -> list[int]: ...
    def tokenize_answers(self, prompt_text: str, answers: Sequence[str]) -> tuple[list[int], list[list[int]]]: ...
    def score_trie(self, prefix: Sequence[int], continuations: Sequence[Sequence[int]], *, hidden: bool = False,
                   epsilon: float = 0.0) -> Any: ...
    def score_naive(self, tokens: Sequence[int], start: int) -> np.ndarray: ...
    def hidden_state(self, prompt: Sequence[int]) -> np.ndarray: ...


@dataclass(frozen=True)
class Head:
    """A fitted multinomial logistic head over `maths.head_features` (standardisation folded in),
    optionally fused with a lexical expert on the input text: softmax(a log p_head + b log p_lexical),
    `mix` = (a, b)."""

    weights: np.ndarray = field(compare=False)  # K x (K + hidden size), or K x hidden size (`hidden-1`)
    intercept: np.ndarray = field(compare=False)  # K
    lexical: LexicalModel | None = field(default=None, compare=False)
    mix: tuple[float, float] = (1.0, 0.0)
    features: str = maths.LOGLIK_HIDDEN

    @property
    def reads_logprobs(self) -> bool:
        """False for a head on the hidden state alone: its questions' answers are never scored."""
        return self.features != maths.HIDDEN_ONLY

    def probabilities(self, logprobs: Sequence[float] | None, hidden: np.ndarray, text: str | None = None) -> np.ndarray:
        features = maths.head_features(None if logprobs is None else np.asarray(logprobs), hidden, self.features)
        if features.shape[-1] != self.weights.shape[1]:
            raise InvalidRequestError(
                f"the calibration head reads {self.weights.shape[1]} features, this model gives {features.shape[-1]}; "
                "it was fitted for another model", param="calibration")
        P = maths.head_probabilities(features, self.weights, self.intercept)
        if self.lexical is None:
            return P
        if text is None:
            raise ValueError("a head with a lexical expert needs the input text")
        return self.lexical.fuse(P[None, :], [text], self.mix)[0]


@dataclass(frozen=True)
class Demonstration:
    """A labelled example shown to the model before the question (k-shot): an input and the index
    of its option in the question's own option order."""

    input: str
    option: int


@dataclass(frozen=True)
class Scoring:
    """How a question is scored and its log-likelihoods become probabilities. Calibration fits
    these per task.

    rotations > 1 asks the question that many times with the option list cyclically rotated
    (evenly spaced shifts), every rotation sharing the state's evaluated prefix in the same batch,
    and averages each option's log-likelihood over them: position bias cancels out.
    prior_correction divides out the model's answer distribution on content-free inputs; `prior`
    fixes that distribution (a calibration profile stores the one it was fitted with, so serving
    does not recompute it: the recomputed value moves by llama.cpp's KV-layout noise, which on a
    balanced two-option question can flip answers near the boundary).
    A head replaces the softmax by a fitted classifier over the log-likelihoods and hidden state.
    demonstrations are answered examples put before the question (see `prompt.build_messages`).
    layout is the prompt format the question is asked in (`prompt.PROMPT_FORMATS`): it belongs to
    the question (its profile), never to one request, so an answer does not depend on what else
    was asked."""

    temperature: float = 1.0
    length_normalize: bool = False
    bias: tuple[float, ...] | None = None
    prior_correction: bool = False
    prior: tuple[float, ...] | None = None  # the content-free log prior to subtract (else computed)
    rotations: int = 1
    head: Head | None = None
    demonstrations: tuple[Demonstration, ...] = ()
    layout: str = PROMPT_FORMAT_VERSION


@dataclass(frozen=True)
class OptionScore:
    value: OptionValue
    answer_text: str
    # log p(answer tokens + end-of-answer marker | prompt); None when the question's head reads the
    # hidden state alone (the answers are not scored). Under a bound (Answer.bound > 0) an option the
    # evaluation left unexpanded gets its share of the probability its unexpanded prefix leaves.
    logprob: float | None
    n_tokens: int
    probability: float


@dataclass(frozen=True)
class Answer:
    question: Question
    options: tuple[OptionScore, ...]
    label_mass: float | None
    confidence: float
    scoring: Scoring
    prompt_format: str = PROMPT_FORMAT_VERSION
    # 0: every probability exact. Otherwise the answers were expanded best-first (`Decider.epsilon`)
    # and every probability is within this of the exact one.
    bound: float = 0.0

    @property
    def probabilities(self) -> list[float]:
        return [o.probability for o in self.options]

    @property
    def top(self) -> OptionScore:
        return max(self.options, key=lambda o: o.probability)

    @property
    def choice(self) -> OptionValue:
        return self.top.value

    @property
    def probability(self) -> float:
        """For predicates: the probability that the statement is true."""
        return next(o.probability for o in self.options if o.value is True)

    @property
    def score(self) -> float:
        """For scores: the expected level index."""
        return maths.expected_score(self.probabilities)


@dataclass(frozen=True)
class Decision:
    answers: list[Answer]
    prompt_tokens: int  # distinct tokens evaluated for this decision: shared prefix + trie
    shared_prefix_tokens: int
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _Scored:
    question: Question
    sequences: list[list[int]]  # prompt + answer + end marker, one per option
    boundaries: list[int]  # index where each answer's own tokens begin
    prompt_tokens: list[int]  # the prompt alone

    @property
    def answer_lengths(self) -> list[int]:
        """Tokens scored for each option: its own tokens and the end marker."""
        return [len(s) - b for s, b in zip(self.sequences, self.boundaries)]


def _common_prefix(sequences: Sequence[Sequence[int]]) -> int:
    first = sequences[0]
    n = min(len(s) for s in sequences)
    for i in range(n):
        t = first[i]
        if any(s[i] != t for s in sequences):
            return i
    return n


class Decider:
    def __init__(self, engine: ScoringEngine, *, prior_cache_size: int = 512, epsilon: float = 0.0) -> None:
        """epsilon > 0 lets `decide` expand a plain softmax question's answers best-first when they
        are many (the engine's `call_cost_rows`): every probability is then within `epsilon` of the
        exact one, and the answer says by how much (`Answer.bound`). 0: always exact."""
        if epsilon < 0 or epsilon >= 1:
            raise ValueError("epsilon must be in [0, 1)")
        self.engine = engine
        self.epsilon = epsilon
        self._priors: OrderedDict[tuple, np.ndarray] = OrderedDict()
        self._prior_cache_size = prior_cache_size

    def _tokenize(self, state_text: str, question: Question, demonstrations: Sequence[tuple[str, str]] = (),
                  layout: str = PROMPT_FORMAT_VERSION) -> _Scored:
        prompt_text = self.engine.render_chat(build_messages(state_text, question, demonstrations, layout))
        # In-context tokenization: prompt + answer tokenized together and split where they diverge
        # from the prompt alone, so the answer's tokens are the ones the model emits.
        prompt_tokens, with_answers = self.engine.tokenize_answers(prompt_text, question.answer_texts())
        sequences: list[list[int]] = []
        boundaries: list[int] = []
        for tokens in with_answers:
            full = tokens + list(self.engine.end_of_answer)
            sequences.append(full)
            boundaries.append(_common_prefix([prompt_tokens, full]))
        seen: dict[tuple[int, ...], int] = {}
        for index, sequence in enumerate(sequences):
            key = tuple(sequence[boundaries[index]:])
            if key in seen:
                other = question.options[seen[key]].value
                raise InvalidRequestError(
                    f"options {other!r} and {question.options[index].value!r} are the same tokens to the model",
                    param="questions",
                )
            seen[key] = index
        return _Scored(question, sequences, boundaries, prompt_tokens)

    def _score(self, state_text: str, questions: Sequence[Question], rules: Sequence[Scoring], *,
               limits: "Limits | None" = None, epsilon: float = 0.0, hidden: bool = False) -> tuple[list[_Combined], int, int]:
        """Per question, every option of every rotation in one batched evaluation, and each option's
        log-likelihood averaged over its rotations, in the question's own option order; with the
        hidden state at the answer position from the same evaluation when a head needs it (or
        `hidden`). A question whose head reads the hidden state alone has only its prompt
        evaluated. Plain softmax questions may be bounded by `epsilon` (`Answer.bound`)."""
        for rule in rules:
            if check_layout(rule.layout) in QUESTION_FIRST_FORMATS and rule.rotations > 1:
                raise InvalidRequestError(f"rotations need the state-first prompt format {PROMPT_FORMAT_VERSION!r}: "
                                          f"in {rule.layout!r} each rotation would be a question prefix of its own",
                                          param="rotations")
        per_question: list[list[tuple[int, _Scored]]] = [
            [(shift, self._tokenize(state_text, rotate(question, shift), _shown(question, rule.demonstrations, shift),
                                    rule.layout))
             for shift in rotation_shifts(question, rule.rotations)]
            for question, rule in zip(questions, rules)]
        for question, variants in zip(questions, per_question):  # what cannot fit is refused before any work
            needed = max(len(s) for _, item in variants for s in item.sequences)
            if needed > self.engine.n_ctx:
                raise ContextOverflowError(f"question {_describe(question)}: the prompt with its longest answer needs "
                                           f"{needed} tokens but the context holds {self.engine.n_ctx} (shorten the "
                                           "input or the options, or raise n_ctx)", param="questions")
        scored_answers = [rule.head is None or rule.head.reads_logprobs for rule in rules]
        if limits is not None:
            limits.check_work(per_question, scored_answers)
        combined: list[_Combined] = []
        # One engine call per question. The state is still evaluated once: each call keeps the
        # cached prefix it shares with the previous one. Scoring each question in a layout of its
        # own makes its answer exactly the same whether it is asked alone or beside other questions.
        for question, rule, variants, answers_scored in zip(questions, rules, per_question, scored_answers):
            if limits is not None:
                limits.check_time()
            self._pin_question_prefix(state_text, question, rule, variants[0][1].prompt_tokens)
            prompt = next(item.prompt_tokens for shift, item in variants if shift == 0)
            if not answers_scored:
                lengths = variants[0][1].answer_lengths
                combined.append(_Combined(None, lengths, prompt, self.engine.hidden_state(prompt)))
                continue
            group = [s for _, item in variants for s in item.sequences]
            local = _split_point([item for _, item in variants])
            bounded = epsilon if epsilon > 0 and _plain(rule) else 0.0
            trie = self.engine.score_trie(group[0][:local], [s[local:] for s in group],
                                          hidden=hidden or rule.head is not None, epsilon=bounded)
            k = len(question.options)
            if trie.lazy:
                totals, bound = _bounded_totals([s[local:] for s in group], trie.rows,
                                                [b - local for b in variants[0][1].boundaries])
                combined.append(_Combined(totals, variants[0][1].answer_lengths, prompt, trie.hidden, bound))
                continue
            rows = iter(trie.rows)
            sums, lengths = np.zeros(k), np.zeros(k)
            for shift, item in variants:
                for position, (boundary, length) in enumerate(zip(item.boundaries, item.answer_lengths)):
                    original = (position + shift) % k
                    sums[original] += float(next(rows)[boundary - local:].sum())
                    lengths[original] += length
            n = len(variants)
            combined.append(_Combined(list(sums / n), [int(round(x / n)) for x in lengths], prompt, trie.hidden))
        # Reported: the distinct tokens all questions needed, the state counted once.
        all_sequences = [s for variants, answers_scored in zip(per_question, scored_answers) for _, item in variants
                         for s in (item.sequences if answers_scored else [item.prompt_tokens])]
        shared = min(_split_point([item for variants in per_question for _, item in variants]), _common_prefix(all_sequences))
        return combined, shared + _distinct_prefixes([s[shared:] for s in all_sequences]), shared

    def _pin_question_prefix(self, state_text: str, question: Question, rule: Scoring, prompt_tokens: list[int]) -> None:
        """Ask the engine to keep the part of the prompt that is the same for every state evaluated
        (the question block in a question-first layout, demonstrations), so requests asking this
        question share it even when other prompts run in between. A state-first question without
        demonstrations has no such part."""
        pin = getattr(self.engine, "pin_prefix", None)
        if pin is None or not (rule.demonstrations or rule.layout in QUESTION_FIRST_FORMATS):
            return
        exchanges = build_messages(state_text, question, _shown(question, rule.demonstrations, 0), rule.layout)[:-1]
        text = self.engine.render_chat(exchanges, add_generation_prompt=False)
        pin(prompt_tokens[:_common_prefix([self.engine.tokenize_prompt(text), prompt_tokens])])

    def decide(
        self,
        state: Any,
        questions: Sequence[Question],
        *,
        scoring: Sequence[Scoring | None] | Scoring | None = None,
        limits: "Limits | None" = None,
    ) -> Decision:
        """Answer every question about one state. The state's tokens are evaluated once for all
        questions; all options of all questions (and rotations) are scored in one batched trie
        evaluation. `limits` bounds the work (checked after tokenizing, before any evaluation) and
        the time (checked before each question's evaluation)."""
        if not questions:
            raise InvalidRequestError("at least one question is required", param="questions")
        began = time.perf_counter()
        state_text = render_state(state)
        rules = _per_question_scoring(scoring, len(questions))
        # Questions go into the batch in an order fixed by their content, not by the request, so
        # reordering (or renaming) the questions of a request changes no answer, not even by
        # llama.cpp's batch-layout noise.
        order = sorted(range(len(questions)), key=lambda i: _canonical_key(questions[i], rules[i]))
        scored, distinct, shared = self._score(state_text, [questions[i] for i in order], [rules[i] for i in order],
                                               limits=limits, epsilon=self.epsilon)
        combined: list[_Combined] = [scored[0]] * len(questions)
        for position, i in enumerate(order):
            combined[i] = scored[position]
        cached = int(getattr(self.engine, "last_reused_tokens", 0))
        answers: list[Answer] = []
        for question, rule, item in zip(questions, rules, combined):
            prior = self.prior(question, rule) if rule.prior_correction else None
            answers.append(_answer(question, item.logprobs, item.lengths, rule, prior=prior, hidden=item.hidden,
                                   state_text=state_text, bound=item.bound))
        return Decision(answers, distinct, shared, time.perf_counter() - began, {"cached_tokens": cached})

    def scores(self, state: Any, question: Question, *, rotations: int = 1, hidden: bool = False,
               demonstrations: Sequence[Demonstration] = (), layout: str = PROMPT_FORMAT_VERSION,
               ) -> tuple[list[float], list[int], np.ndarray | None]:
        """Raw material for calibration: the option log-likelihoods (averaged over rotations),
        token counts, and optionally the hidden state at the answer position."""
        rule = Scoring(rotations=rotations, demonstrations=tuple(demonstrations), layout=layout)
        combined, _, _ = self._score(render_state(state), [question], [rule], hidden=hidden)
        item = combined[0]
        assert item.logprobs is not None
        return item.logprobs, item.lengths, item.hidden

    def hidden(self, state: Any, question: Question, *, demonstrations: Sequence[Demonstration] = (),
               layout: str = PROMPT_FORMAT_VERSION) -> np.ndarray:
        """What a head on the hidden state alone reads: the hidden state at the answer position,
        with only the prompt evaluated (the question prefix pinned as a decision pins it)."""
        rule = Scoring(demonstrations=tuple(demonstrations), layout=check_layout(layout))
        state_text = render_state(state)
        item = self._tokenize(state_text, question, _shown(question, rule.demonstrations, 0), rule.layout)
        self._pin_question_prefix(state_text, question, rule, item.prompt_tokens)
        return self.engine.hidden_state(item.prompt_tokens)

    def content_free_scores(self, question: Question, *, rotations: int = 1, demonstrations: Sequence[Demonstration] = (),
                            layout: str = PROMPT_FORMAT_VERSION) -> tuple[np.ndarray, np.ndarray]:
        """Option log-likelihoods (rows: `maths.CONTENT_FREE_INPUTS`) and token counts for inputs
        that carry no content (after the same demonstrations, if any). Evaluated from an empty KV
        cache: what the cache held before would move them by llama.cpp's layout noise (about 0.03
        nats on the default model), and the prior must be the same in calibration, on every server
        and in every run."""
        rule = Scoring(rotations=rotations, demonstrations=tuple(demonstrations), layout=layout)
        clear = getattr(self.engine, "clear_cache", None)
        if clear is not None:
            clear()
        rows, lengths = [], []
        for text in maths.CONTENT_FREE_INPUTS:
            combined, _, _ = self._score(text, [question], [rule])
            rows.append(combined[0].logprobs)
            lengths.append(combined[0].lengths)
        return np.asarray(rows), np.asarray(lengths, dtype=np.float64)

    def prior(self, question: Question, rule: Scoring) -> np.ndarray:
        """The question's content-free log prior over its options: the rule's fixed one (a profile's),
        else computed (cached per question, options, mode, rotations, demonstrations and
        normalisation)."""
        if rule.prior is not None:
            return np.asarray(rule.prior)
        key = (question.type, question.instructions, question.options, question.mode, rule.rotations,
               rule.demonstrations, rule.length_normalize, rule.layout)
        cached = self._priors.get(key)
        if cached is not None:
            self._priors.move_to_end(key)
            return cached
        rows, lengths = self.content_free_scores(question, rotations=rule.rotations, demonstrations=rule.demonstrations,
                                                 layout=rule.layout)
        prior = maths.content_free_prior(rows, lengths if rule.length_normalize else None)
        self._priors[key] = prior
        while len(self._priors) > self._prior_cache_size:
            self._priors.popitem(last=False)
        return prior

    def decide_naive(self, state: Any, question: Question, *, scoring: Scoring | None = None) -> Answer:
        """Reference path: one full evaluation from scratch per option. Slow; for checks and the
        benchmark baseline."""
        rule = scoring or Scoring()
        item = self._tokenize(render_state(state), question, _shown(question, rule.demonstrations, 0), rule.layout)
        totals = [float(self.engine.score_naive(s, b).sum()) for s, b in zip(item.sequences, item.boundaries)]
        return _answer(question, totals, item.answer_lengths, rule)


def _canonical_key(question: Question, rule: Scoring) -> str:
    options = [[type(o.value).__name__, str(o.value), o.text, o.description or ""] for o in question.options]
    shown = [[d.input, d.option] for d in rule.demonstrations]
    return json.dumps([question.type, question.mode, question.instructions, options, rule.rotations, shown, rule.layout])


def _describe(question: Question) -> str:
    if question.name:
        return repr(question.name)
    text = question.instructions.strip()
    return repr(text if len(text) <= 60 else text[:57] + "...")


def _shown(question: Question, demonstrations: Sequence[Demonstration], shift: int) -> list[tuple[str, str]]:
    """The demonstrations as (input, answer text) for the question rotated by `shift`: an option's
    answer text in labels mode is its position's label, so it moves with the rotation."""
    k = len(question.options)
    answers = rotate(question, shift).answer_texts()
    shown = []
    for demonstration in demonstrations:
        if not 0 <= demonstration.option < k:
            raise InvalidRequestError(f"a demonstration answers option {demonstration.option}; the question has {k} options",
                                      param="demonstrations")
        if not demonstration.input.strip():
            raise InvalidRequestError("a demonstration's input is empty", param="demonstrations")
        shown.append((demonstration.input, answers[(demonstration.option - shift) % k]))
    return shown


def rotation_shifts(question: Question, rotations: int) -> list[int]:
    """Evenly spaced cyclic shifts of the option list, 0 first."""
    k = len(question.options)
    if rotations < 1:
        raise InvalidRequestError("rotations must be at least 1", param="rotations")
    if rotations == 1:
        return [0]
    if question.type == "score":
        raise InvalidRequestError("a score's levels are ordered; rotating them would change their meaning",
                                  param="rotations")
    if rotations > k:
        raise InvalidRequestError(f"at most {k} rotations for {k} options, got {rotations}", param="rotations")
    return sorted({(r * k) // rotations for r in range(rotations)})


def rotate(question: Question, shift: int) -> Question:
    if shift == 0:
        return question
    return replace(question, options=question.options[shift:] + question.options[:shift])


@dataclass
class Limits:
    """What one decision may cost: `max_rows` evaluated tokens (prompt tokens the previous question
    did not leave in the cache, plus answer-trie nodes, over every question and rotation), refused
    before any evaluation; and `stop`, asked before each question's evaluation, which ends the
    decision with RequestTimeoutError once it says so (the engine then moves on)."""

    max_rows: int | None = None
    stop: Callable[[], bool] | None = None

    def check_work(self, per_question: Sequence[Sequence[tuple[int, "_Scored"]]], scored_answers: Sequence[bool]) -> None:
        if self.max_rows is None:
            return
        rows, previous = 0, []
        for variants, answers_scored in zip(per_question, scored_answers):
            if not answers_scored:
                prompt = variants[0][1].prompt_tokens
                rows += len(prompt) - _common_prefix([previous, prompt])
                previous = prompt
                continue
            group = [s for _, item in variants for s in item.sequences]
            local = _split_point([item for _, item in variants])
            rows += local - _common_prefix([previous, group[0][:local]]) + _distinct_prefixes([s[local:] for s in group])
            previous = group[0][:local]
        if rows > self.max_rows:
            raise InvalidRequestError(
                f"this request needs about {rows} evaluated tokens (prompts and answer tries over its questions and "
                f"rotations); the limit is {self.max_rows} (max_request_rows): split it or shorten it", param="questions")

    def check_time(self) -> None:
        if self.stop is not None and self.stop():
            raise RequestTimeoutError("the decision ran past its time limit (request_timeout)")


@dataclass(frozen=True)
class _Combined:
    logprobs: list[float] | None  # None: the answers were not scored (a head on the hidden state alone)
    lengths: list[int]
    prompt_tokens: list[int]
    hidden: np.ndarray | None = None
    bound: float = 0.0


def _plain(rule: Scoring) -> bool:
    """A rule whose probabilities are the softmax of the raw log-likelihoods: the only kind a bound
    on the unexpanded answers' total probability carries over to (a head reads every option's exact
    log-likelihood; a prior, bias, temperature or length normalisation reweights them one by one)."""
    return (rule.head is None and not rule.prior_correction and rule.bias is None and rule.temperature == 1.0
            and not rule.length_normalize and rule.rotations == 1)


def _bounded_totals(continuations: Sequence[Sequence[int]], rows: Sequence[np.ndarray],
                    starts: Sequence[int]) -> tuple[list[float], float]:
    """Option log-likelihoods from a best-first evaluation, and the bound on the probabilities
    they give. A complete option has its exact log-likelihood. The options under one unexpanded
    node share what its prefix leaves, split evenly: together at most that probability, F in all;
    M the complete options' total. Softmax over these is then within F / M of the exact
    probabilities, every one: the exact normaliser lies in [M, M + F]."""
    totals: list[float] = [0.0] * len(rows)
    open_groups: dict[tuple[int, ...], list[int]] = {}
    complete_mass = 0.0
    for index, (tokens, row, start) in enumerate(zip(continuations, rows, starts)):
        known = ~np.isnan(row)
        totals[index] = float(row[start:][known[start:]].sum())
        if known.all():
            complete_mass += float(np.exp(totals[index]))
        else:
            open_groups.setdefault(tuple(tokens[: int(np.argmin(known))]), []).append(index)
    frontier_mass = 0.0
    for members in open_groups.values():
        for index in members:
            totals[index] -= float(np.log(len(members)))
        frontier_mass += float(np.exp(totals[members[0]])) * len(members)
    bound = frontier_mass / complete_mass if complete_mass > 0 else 1.0
    return totals, min(bound, 1.0)


def _split_point(items: Sequence[_Scored]) -> int:
    """Where the prompt the sequences share ends and their continuations begin: the longest common
    prefix, never inside an answer, leaving every continuation at least one token."""
    sequences = [s for item in items for s in item.sequences]
    return min(_common_prefix(sequences), min(b for item in items for b in item.boundaries),
               min(len(s) for s in sequences) - 1)


def _distinct_prefixes(sequences: Sequence[Sequence[int]]) -> int:
    """Number of distinct non-empty prefixes: the tokens a trie evaluation really computes."""
    root: dict = {}
    count = 0
    for sequence in sequences:
        level = root
        for token in sequence:
            if token not in level:
                level[token] = {}
                count += 1
            level = level[token]
    return count


def _per_question_scoring(scoring: Sequence[Scoring | None] | Scoring | None, count: int) -> list[Scoring]:
    if scoring is None or isinstance(scoring, Scoring):
        return [scoring or Scoring()] * count
    if len(scoring) != count:
        raise ValueError("one scoring rule per question is required")
    return [s or Scoring() for s in scoring]


def _answer(question: Question, totals: list[float] | None, lengths: list[int], rule: Scoring, *,
            prior: np.ndarray | None = None, hidden: np.ndarray | None = None, state_text: str | None = None,
            bound: float = 0.0) -> Answer:
    if rule.bias is not None and totals is not None and len(rule.bias) != len(totals):
        raise InvalidRequestError("the calibration bias does not match the number of options", param="calibration")
    if rule.head is not None:
        if hidden is None:
            raise ValueError("a head needs the hidden state")
        if rule.head.intercept.shape[0] != len(question.options):
            raise InvalidRequestError("the calibration head does not match the number of options", param="calibration")
        probabilities = rule.head.probabilities(totals, hidden, state_text)
    else:
        assert totals is not None
        probabilities = maths.normalise(
            totals,
            temperature=rule.temperature,
            lengths=lengths if rule.length_normalize else None,
            bias=rule.bias,
            prior=prior,
        )
    logprobs = totals if totals is not None else [None] * len(question.options)
    options = tuple(
        OptionScore(o.value, text, lp, n, float(p))
        for o, text, lp, n, p in zip(question.options, question.answer_texts(), logprobs, lengths, probabilities)
    )
    mass = maths.label_mass(totals) if totals is not None else None
    return Answer(question, options, mass, maths.confidence(probabilities), rule, rule.layout, bound)
