"""Incremental detokenization: UTF-8 hold-back and stop strings split across tokens."""

from llmserve.service.engine.executor.textstream import TextStream


def test_incomplete_utf8_is_held_back() -> None:
    stream = TextStream()
    euro = "€".encode()  # three bytes
    assert stream.push(euro[:1]) == ("", None)
    assert stream.push(euro[1:2]) == ("", None)
    assert stream.push(euro[2:] + b"!") == ("€!", None)


def test_stop_string_split_across_tokens_is_never_emitted() -> None:
    stream = TextStream(("STOP",))
    emitted = []
    for piece in (b"hello S", b"T", b"O", b"P and more"):
        text, stop = stream.push(piece)
        emitted.append(text)
        if stop:
            break
    assert stop == "STOP"
    assert "".join(emitted) == "hello "


def test_partial_match_released_when_it_diverges() -> None:
    stream = TextStream(("STOP",))
    assert stream.push(b"a ST") == ("a ", None)
    assert stream.push(b"ORM") == ("STORM", None)
    assert stream.flush() == ""


def test_earliest_of_several_stops_wins() -> None:
    stream = TextStream(("world", "lo w"))
    assert stream.push(b"hello world") == ("hel", "lo w")


def test_flush_releases_held_text() -> None:
    stream = TextStream(("xyz",))
    assert stream.push(b"abc x") == ("abc ", None)
    assert stream.flush() == "x"
