"""OpenAI's model names in a realtime session, served by the models this server has.

OpenAI's clients name OpenAI's models by default: the Agents SDK's session.update says
`gpt-realtime-2.1` and transcribes with `gpt-4o-mini-transcribe`, the openai SDK's
`realtime.connect(model=...)` puts the name on the URL. A drop-in server must not refuse a session
over such a name, so these names are aliases: a realtime model name is served by the connection's
chat model, a transcription model name by the server's speech model, and the session reports the
model actually used (`session.model`, `audio.input.transcription.model`). Any other name that no
served model has stays an error (`model_not_found`): a typo is not an alias. To answer to other
names too, serve the model under them (`--served-model-name`).
"""

from __future__ import annotations

# Prefixes of OpenAI's realtime (speech-to-speech) model names, dated versions included:
# gpt-realtime, gpt-realtime-mini, gpt-realtime-2.1, gpt-4o-realtime-preview-2025-06-03, ...
REALTIME_PREFIXES = ("gpt-realtime", "gpt-4o-realtime", "gpt-4o-mini-realtime", "gpt-audio")
# OpenAI's transcription models, as `audio.input.transcription.model` takes them.
TRANSCRIPTION_NAMES = frozenset({"whisper-1", "gpt-4o-transcribe", "gpt-4o-mini-transcribe",
                                 "gpt-4o-transcribe-diarize", "gpt-transcribe", "gpt-live-transcribe",
                                 "gpt-realtime-whisper"})


def is_openai_realtime_model(name: str | None) -> bool:
    return name is not None and name.startswith(REALTIME_PREFIXES)


def is_openai_transcription_model(name: str | None) -> bool:
    return name is not None and (name in TRANSCRIPTION_NAMES or name.startswith(("gpt-4o-mini-transcribe-",
                                                                                  "gpt-4o-transcribe-")))
