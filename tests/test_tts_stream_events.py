"""WS /v1/audio/speech/stream's messages, sans IO: sizes at and past the limit, configs, granularities."""

import msgspec
import pytest

from rill.tts.stream_events import (MAX_MESSAGE_BYTES, StreamError, decode_config, decode_text, make_splitter,
                                    parse_message)


def _text_message(num_bytes: int) -> str:
    head = '{"type":"input.text","text":"Hi.'
    return head + " " * (num_bytes - len(head) - 2) + '"}'


def test_message_at_the_size_limit_is_taken():
    raw = _text_message(MAX_MESSAGE_BYTES)
    assert len(raw.encode()) == MAX_MESSAGE_BYTES
    kind, message = parse_message(raw)
    assert kind == "input.text" and message["text"].startswith("Hi.")


def test_message_past_the_size_limit_is_refused():
    with pytest.raises(StreamError) as caught:
        parse_message(_text_message(MAX_MESSAGE_BYTES + 1))
    assert caught.value.code == "message_too_large"
    assert caught.value.event()["type"] == "error"


@pytest.mark.parametrize("raw", ["not json", "[1, 2]", '{"text": "no type"}', '{"type": 5}', b"\xff\xfe"])
def test_bad_messages_are_refused(raw):
    with pytest.raises(StreamError):
        parse_message(raw)


def test_config_defaults_and_ignored_fields():
    config = decode_config({"type": "session.config", "voice": "alloy", "task_type": "CustomVoice"})
    assert (config.voice, config.response_format, config.speed, config.split_granularity) == (
        "alloy", "pcm", 1.0, "clause")


@pytest.mark.parametrize(("field", "value"), [("response_format", "mp3"), ("speed", 0.2), ("speed", 4.01),
                                              ("split_granularity", "word"), ("speed", "fast")])
def test_bad_config_is_refused(field, value):
    with pytest.raises(StreamError) as caught:
        decode_config({field: value})
    assert caught.value.code == "invalid_value"


@pytest.mark.parametrize("speed", [0.25, 4.0])
def test_speed_at_its_limits_is_taken(speed):
    assert decode_config({"speed": speed}).speed == speed


def test_input_text_needs_a_string():
    assert decode_text({"text": "hello"}) == "hello"
    with pytest.raises(StreamError):
        decode_text({"text": 5})
    with pytest.raises(StreamError):
        decode_text({})


def test_granularities():
    text = "This is the first part, and this the second. Then a third one."
    def run(granularity):
        splitter = make_splitter(granularity)
        fed = [c for ch in text for c in splitter.feed(ch)]
        return fed, splitter.finish()
    assert run("clause") == (["This is the first part,", "and this the second."], ["Then a third one."])
    assert run("sentence") == (["This is the first part, and this the second."], ["Then a third one."])
    assert run("none") == ([], ["This is the first part,", "and this the second.", "Then a third one."])
    assert msgspec.json.decode(msgspec.json.encode(StreamError("x", "y").event())) == {
        "type": "error", "message": "x", "code": "y", "param": None}
