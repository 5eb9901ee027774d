"""The messages of WS /v1/audio/speech/stream (vLLM-Omni's streaming-text speech protocol), sans IO.

Client -> server (JSON text frames):
    {"type": "session.config", "model", "voice", "response_format", "speed", "split_granularity", ...}
    {"type": "input.text", "text": "..."}      text as it arrives, in any pieces
    {"type": "input.done"}                      end of an utterance: flush; the connection stays open
    {"type": "session.close"}                   end of the connection
Server -> client:
    {"type": "audio.start", "utterance_index", "sentence_index", "sentence_text", "format", "sample_rate",
     "channels"}, then binary frames of audio as it is made, then
    {"type": "audio.done", "utterance_index", "sentence_index", "total_bytes", "error"}
    {"type": "session.done", "utterance_index", "total_sentences"}     after input.done's last sentence
    {"type": "error", "message", "code", "param"}                       vLLM-Omni's, plus OpenAI's code and param

`split_granularity` is vLLM-Omni's field: "clause" (rill's default: the voice starts at the first clause
boundary), "sentence" (only at sentence ends), or "none" (nothing until input.done; then the whole text,
split as /v1/audio/speech splits an input, since no voice takes an unbounded text in one pass).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from rill.tts.clauses import ClauseSplitter, split_text

MAX_MESSAGE_BYTES = 16 * 1024  # one client message; a text delta is far smaller
MAX_UTTERANCE_CHARS = 32 * 1024  # text between two input.done (OpenAI's /v1/audio/speech takes 4,096 a request)
CONFIG_TIMEOUT_S = 10.0  # the first message must come by then (vLLM-Omni's figure)
IDLE_TIMEOUT_S = 30.0  # no message for this long closes an idle connection (vLLM-Omni's figure)
STREAM_FORMATS = ("pcm", "wav")  # pcm: raw 16-bit little-endian mono at sample_rate; wav: one file a sentence

Granularity = Literal["clause", "sentence", "none"]


class SessionConfig(msgspec.Struct, kw_only=True):
    """session.config; fields rill does not use (vLLM-Omni's task_type, ref_audio, ...) are ignored."""

    model: str | None = None
    voice: str | None = None
    response_format: str = "pcm"
    speed: float = 1.0
    split_granularity: Granularity = "clause"
    stream_audio: bool = True  # accepted; audio always streams as it is made
    instructions: str | None = None  # accepted, unused (as on /v1/audio/speech with these voices)
    language: str | None = None  # accepted; the voice names its language


class InputText(msgspec.Struct):
    text: str


class StreamError(Exception):
    """A message refused: sent as an error event; `fatal` ones close the connection after."""

    def __init__(self, message: str, code: str, param: str | None = None, fatal: bool = False):
        super().__init__(message)
        self.message, self.code, self.param, self.fatal = message, code, param, fatal

    def event(self) -> dict:
        return {"type": "error", "message": self.message, "code": self.code, "param": self.param}


def parse_message(raw: str | bytes) -> tuple[str, dict]:
    """(type, message) of one client frame, or StreamError."""
    size = len(raw.encode() if isinstance(raw, str) else raw)
    if size > MAX_MESSAGE_BYTES:
        raise StreamError(f"a message of {size} bytes is over the limit of {MAX_MESSAGE_BYTES}",
                          "message_too_large")
    try:
        message = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise StreamError(f"a message must be a JSON object: {exc}", "invalid_json") from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise StreamError("a message must be a JSON object with a string 'type'", "invalid_event", "type")
    return message["type"], message


def decode_config(message: dict) -> SessionConfig:
    body = {k: v for k, v in message.items() if k != "type"}
    try:
        config = msgspec.convert(body, SessionConfig)
    except msgspec.ValidationError as exc:
        raise StreamError(f"invalid session.config: {exc}", "invalid_value") from None
    if config.response_format not in STREAM_FORMATS:
        raise StreamError(f"response_format must be one of {list(STREAM_FORMATS)} on this stream, got "
                          f"{config.response_format!r}", "invalid_value", "response_format")
    if not 0.25 <= config.speed <= 4.0:
        raise StreamError(f"speed must be between 0.25 and 4.0, got {config.speed}", "invalid_value", "speed")
    return config


def decode_text(message: dict) -> str:
    try:
        return msgspec.convert({"text": message.get("text")}, InputText).text
    except msgspec.ValidationError:
        raise StreamError("input.text needs a string 'text'", "invalid_value", "text") from None


def make_splitter(granularity: Granularity) -> ClauseSplitter:
    """rill's clause splitter for each of vLLM-Omni's granularities ("none": the cap alone cuts)."""
    if granularity == "clause":
        return ClauseSplitter()
    if granularity == "sentence":
        return ClauseSplitter(min_words=1 << 30)  # clause marks never reach it; sentence ends always cut
    return _WholeText()


class _WholeText:
    """split_granularity "none": nothing until input.done, then the whole utterance's clauses."""

    def __init__(self):
        self._parts: list[str] = []

    def feed(self, piece: str) -> list[str]:
        self._parts.append(piece)
        return []

    def finish(self) -> list[str]:
        text, self._parts = "".join(self._parts), []
        return split_text(text)


def audio_start(utterance: int, sentence: int, text: str, fmt: str, sample_rate: int) -> dict:
    return {"type": "audio.start", "utterance_index": utterance, "sentence_index": sentence, "sentence_text": text,
            "format": fmt, "sample_rate": sample_rate, "channels": 1}


def audio_done(utterance: int, sentence: int, total_bytes: int, error: bool = False) -> dict:
    return {"type": "audio.done", "utterance_index": utterance, "sentence_index": sentence,
            "total_bytes": total_bytes, "error": error}


def session_done(utterance: int, total_sentences: int) -> dict:
    return {"type": "session.done", "utterance_index": utterance, "total_sentences": total_sentences}

