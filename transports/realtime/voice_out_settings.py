"""The speaking half of session.update: output modalities, voice, speed and output audio format, in
the GA form (`output_modalities`, `audio.output.{format, voice, speed}`) and the beta's (`modalities`,
`voice`, `speed`, `output_audio_format`), GA winning where both are given.

`["audio"]` is honoured when the server has a voice (`rill serve --tts-model`, default espeak-ng):
answers are spoken, with their transcript. Without one it is accepted, as before, and the session
reports the `["text"]` it gets. A session that names no modality answers in text (OpenAI's GA default
is audio; a text client of an existing rill deployment must not start receiving audio it never asked
for). Speed is OpenAI's realtime range, 0.25-1.5.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from rill.transports.realtime.audio_output import OutputFormat, beta_format, ga_format
from rill.transports.realtime.events import AudioOutput, RealtimeError

DEFAULT_VOICE = "alloy"  # OpenAI's default
# OpenAI's voice names (realtime's VoiceIdsShared and /v1/audio/speech's): one the server's voice lacks is
# taken and spoken in its default voice, as SDKs send their own default (the Agents SDK's is "ash")
OPENAI_VOICES = frozenset({"alloy", "ash", "ballad", "coral", "echo", "sage", "shimmer", "verse", "marin", "cedar",
                           "fable", "nova", "onyx"})
MIN_SPEED, MAX_SPEED = 0.25, 1.5
MODALITIES = ("text", "audio")


@dataclass(frozen=True)
class VoiceOut:
    audio: bool = False  # output_modalities ["audio"] asked for
    voice: str = DEFAULT_VOICE
    speed: float = 1.0
    format: OutputFormat = OutputFormat()


def voice_out(config, current: VoiceOut, resolve_voice: Callable[[str], str] | None) -> VoiceOut:
    """`config`: a SessionConfig. `resolve_voice`: the server's voice's check (UnknownVoice), None when
    it has none (then voice names are taken unchecked, as OpenAI's names were before rill spoke)."""
    new = current
    modalities = config.output_modalities if config.output_modalities is not None else config.modalities
    if modalities is not None:
        new = replace(new, audio=wants_audio(modalities, "session.output_modalities"))
    output = config.audio.output if config.audio is not None and config.audio.output is not None else AudioOutput()
    voice = output.voice if output.voice is not None else config.voice
    if voice is not None:
        new = replace(new, voice=_voice(voice, resolve_voice, "session.audio.output.voice"))
    speed = output.speed if output.speed is not None else config.speed
    if speed is not None:
        new = replace(new, speed=check_speed(speed, "session.audio.output.speed"))
    if output.format is not None:
        new = replace(new, format=ga_format(output.format, "session.audio.output.format"))
    elif config.output_audio_format is not None:
        new = replace(new, format=beta_format(config.output_audio_format, "session.output_audio_format"))
    return new


def wants_audio(modalities: list[str], param: str) -> bool:
    unknown = [m for m in modalities if m not in MODALITIES]
    if unknown:
        raise RealtimeError("invalid_value", f"output_modalities may hold \"text\" and \"audio\"; got {unknown}", param)
    return "audio" in modalities


def check_speed(speed: float, param: str) -> float:
    if not MIN_SPEED <= speed <= MAX_SPEED:
        raise RealtimeError("invalid_value", f"speed must be between {MIN_SPEED} and {MAX_SPEED}; got {speed}", param)
    return float(speed)


def _voice(voice: str | dict, resolve_voice, param: str) -> str:
    name = voice.get("id") if isinstance(voice, dict) else voice
    if not isinstance(name, str) or not name:
        raise RealtimeError("invalid_value", "voice is a voice name or {\"id\": name}", param)
    if resolve_voice is not None:
        from rill.tts.backend import UnknownVoice

        try:
            resolve_voice(name)
        except UnknownVoice as exc:
            if name not in OPENAI_VOICES:
                raise RealtimeError("invalid_value", f"unknown voice {name!r}: {exc}", param) from None
    return name


def modalities_wire(voice: VoiceOut, speaks: bool) -> list[str]:
    """What a response is given: ["audio"] only when asked and the server has a voice."""
    return ["audio"] if voice.audio and speaks else ["text"]


def output_wire(voice: VoiceOut) -> AudioOutput:
    return AudioOutput(format=voice.format.ga_wire(), voice=voice.voice, speed=voice.speed)
