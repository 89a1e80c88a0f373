from llamadecide.engine.generation import TextAssembler


def test_stop_string_split_across_tokens_is_never_emitted():
    a = TextAssembler(["</end>"])
    out = a.feed(b"hello </") + a.feed(b"en") + a.feed(b"d> more")
    assert out == "hello "
    assert a.stopped and a.flush() == ""


def test_partial_stop_prefix_is_released_when_it_does_not_match():
    a = TextAssembler(["STOP"])
    assert a.feed(b"ST") == ""
    assert a.feed(b"AY") == "STAY"


def test_multibyte_character_split_over_tokens():
    snowman = "☃".encode()
    a = TextAssembler([])
    assert a.feed(snowman[:1]) == ""
    assert a.feed(snowman[1:]) == "☃"
    assert a.flush() == ""
