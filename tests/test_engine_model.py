"""The engine with the real bundled model: template, tokens, generation, errors."""

import numpy as np
import pytest

from conftest import bundled_model_path, engine_config
from llamadecide.engine import Engine, GenerationResult, SamplingParams, TokenEvent
from llamadecide.errors import ContextOverflowError, InvalidRequestError, ModelLoadError


def chat(engine, text):
    return engine.tokenize_prompt(engine.render_chat([{"role": "user", "content": text}]))


def generate(engine, prompt, **params):
    items = list(engine.generate(prompt, SamplingParams(**params)))
    text = "".join(i.text for i in items if isinstance(i, TokenEvent))
    result = items[-1]
    assert isinstance(result, GenerationResult)
    return text, result, [i for i in items if isinstance(i, TokenEvent)]


def test_end_of_answer_marker_comes_from_the_template(engine):
    assert engine.detokenize(engine.end_of_answer, special=True) == "<|im_end|>"
    assert engine.is_end_of_generation(engine.end_of_answer[-1])


def test_prompt_uses_the_models_chat_template(engine):
    text = engine.render_chat([{"role": "user", "content": "hi"}])
    assert text.endswith("<|im_start|>assistant\n")


def test_greedy_generation_is_deterministic_and_bounded(engine):
    prompt = chat(engine, "Name three colours.")
    first, result, tokens = generate(engine, prompt, max_tokens=12, temperature=0.0)
    second, _, _ = generate(engine, prompt, max_tokens=12, temperature=0.0)
    assert first == second and first.strip()
    assert result.completion_tokens <= 12 and result.prompt_tokens == len(prompt)
    assert result.finish_reason in ("stop", "length")


def test_seeded_sampling_repeats(engine):
    prompt = chat(engine, "Write a word.")
    a, _, _ = generate(engine, prompt, max_tokens=8, temperature=1.0, seed=123)
    b, _, _ = generate(engine, prompt, max_tokens=8, temperature=1.0, seed=123)
    assert a == b


def test_stop_string_ends_generation_without_emitting_it(engine):
    prompt = chat(engine, "Count from 1 to 10 separated by commas.")
    full, _, _ = generate(engine, prompt, max_tokens=40, temperature=0.0)
    assert "4" in full
    cut, result, _ = generate(engine, prompt, max_tokens=40, temperature=0.0, stop=("4",))
    assert "4" not in cut and full.startswith(cut) and result.finish_reason == "stop"


def test_logprobs_are_reported(engine):
    _, _, tokens = generate(
        engine, chat(engine, "Say yes."), max_tokens=3, temperature=0.0, top_logprobs=3, logprobs=True
    )
    first = tokens[0]
    assert first.logprob is not None and first.logprob <= 0
    assert len(first.top_logprobs) == 3 and first.top_logprobs[0][0] == first.token  # greedy picks the top


def test_prompt_cache_is_reused_between_calls(engine):
    prompt = chat(engine, "Tell me about the sea.")
    generate(engine, prompt, max_tokens=2, temperature=0.0)
    _, result, _ = generate(engine, prompt, max_tokens=2, temperature=0.0)
    assert result.cached_tokens == len(prompt) - 1


def test_context_overflow_is_refused(engine):
    with pytest.raises(ContextOverflowError):
        engine.generate([1] * (engine.n_ctx + 5), SamplingParams())
    with pytest.raises(ContextOverflowError):
        engine.score_continuations([1] * engine.n_ctx, [[2, 3]])


def test_empty_inputs_are_refused(engine):
    with pytest.raises(InvalidRequestError):
        engine.score_continuations([], [[1]])
    with pytest.raises(InvalidRequestError):
        engine.score_continuations([1, 2], [[]])


def test_options_beyond_the_sequence_limit_are_grouped(engine):
    """Four KV sequences leave one for options (prompt, a pin, scratch): ten options are ten groups,
    each its own call, where an engine with sequences to spare takes them in one; every score is
    the from-scratch one."""
    small = Engine(engine_config(engine.model_path, n_ctx=1024, n_seq_max=4))
    prefix = chat(small, "Pick a number.")
    continuations = [small.tokenize(str(i)) + small.end_of_answer for i in range(10)]
    small.score_continuations(prefix[:-1], [prefix[-1:]])  # the prompt in the cache: only the options are counted
    before = small.counters["decode_calls"]
    grouped = small.score_continuations(prefix, continuations)
    assert small.counters["decode_calls"] - before == len(continuations)
    engine.clear_cache()
    engine.score_continuations(prefix[:-1], [prefix[-1:]])
    before = engine.counters["decode_calls"]
    together = engine.score_continuations(prefix, continuations)
    assert engine.counters["decode_calls"] - before == 1
    assert all(np.array_equal(a, b) for a, b in zip(together, grouped))
    for continuation, scores in zip(continuations, grouped):
        assert scores[0] == small.score_naive(prefix + continuation, len(prefix))[0]


def test_a_file_that_is_not_gguf_is_a_typed_error(tmp_path):
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a model")
    with pytest.raises(ModelLoadError):
        Engine(engine_config(bogus))


def _scores(engine, prompt, answers):
    return [list(v) for v in engine.score_continuations(prompt, answers)]


def test_a_pinned_prefix_survives_other_prompts_and_changes_no_number(engine):
    shared = chat(engine, "Here are some examples. " * 20)[:-4]
    first = shared + chat(engine, "Is the sky blue?")[1:]
    second = shared + chat(engine, "Is grass red?")[1:]
    answers = [engine.tokenize(" yes", special=False), engine.tokenize(" no", special=False)]
    engine.clear_cache()
    assert engine.pin_prefix(shared)
    expected = _scores(engine, second, answers)
    engine.clear_cache()
    assert engine.pin_prefix(shared) and engine.pin_prefix(shared)  # pinning again is free
    _scores(engine, first, answers)
    _scores(engine, chat(engine, "Something else entirely."), answers)  # sequence 0 moves away
    assert _scores(engine, second, answers) == expected  # bit-identical: same KV, taken from the pin
    assert engine.last_reused_tokens == len(shared)
    engine.clear_cache()


def test_pins_are_bounded_and_give_way_to_a_prompt_that_needs_the_room():
    small = Engine(engine_config(bundled_model_path(), n_ctx=512, pinned_prefixes=2))
    try:
        prefixes = [chat(small, f"Example {i}. " * 10) for i in range(3)]
        for prefix in prefixes:
            assert small.pin_prefix(prefix)
        assert [list(p) for p in small.pinned] == prefixes[1:]  # the least recently used gave way
        assert not small.pin_prefix(chat(small, "long " * 600))  # cannot fit the context: not pinned
        long_prompt = chat(small, "word " * 380)
        assert len(long_prompt) + sum(len(p) for p in prefixes[1:]) > small.n_ctx
        small.score_continuations(long_prompt, [small.tokenize(" yes", special=False)])
        assert len(small.pinned) < 2  # as many as needed gave way, least recently used first, and the call succeeded
    finally:
        small.close()


def test_a_near_limit_prefix_is_pinned_beside_a_long_cached_prompt():
    """Sequence 0 holds a long prompt; a prefix of most of the context is pinned next to it: the
    prompt's cells give way first, and nothing fails for lack of room."""
    small = Engine(engine_config(bundled_model_path(), n_ctx=1024))
    try:
        cached = chat(small, "cached " * 500)
        answers = [small.tokenize(" yes", special=False), small.tokenize(" no", special=False)]
        small.score_continuations(cached, answers)
        pinned = chat(small, "pinned " * 470)[:-4]
        assert len(cached) + len(pinned) > small.n_ctx
        assert small.pin_prefix(pinned)
        prompt = pinned + chat(small, "Is it?")[1:]
        scores = small.score_continuations(prompt, answers)
        assert small.last_reused_tokens == len(pinned)
        small.clear_cache()
        assert [list(v) for v in small.score_continuations(prompt, answers)] == [list(v) for v in scores]
    finally:
        small.close()
