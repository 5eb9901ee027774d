"""The realtime protocol's events of a spoken answer (server -> client), as msgspec structs.

GA names (`response.output_audio.*`, `response.output_audio_transcript.*`) and the beta's
(`response.audio.*`, `response.audio_transcript.*`), which carry the same fields; and
`conversation.item.truncated`, the answer to `conversation.item.truncate` (and to the server's own
estimate of what was heard at a barge-in). `spoken` sends these.
"""

from __future__ import annotations

from rill.transports.realtime.events import ServerEvent


class OutputAudioDelta(ServerEvent, tag="response.output_audio.delta"):
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    delta: str  # base64 audio in the session's output format


class OutputAudioDone(ServerEvent, tag="response.output_audio.done"):
    response_id: str
    item_id: str
    output_index: int
    content_index: int


class OutputTranscriptDelta(ServerEvent, tag="response.output_audio_transcript.delta"):
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    delta: str


class OutputTranscriptDone(ServerEvent, tag="response.output_audio_transcript.done"):
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    transcript: str


class BetaAudioDelta(OutputAudioDelta, tag="response.audio.delta"):
    pass


class BetaAudioDone(OutputAudioDone, tag="response.audio.done"):
    pass


class BetaTranscriptDelta(OutputTranscriptDelta, tag="response.audio_transcript.delta"):
    pass


class BetaTranscriptDone(OutputTranscriptDone, tag="response.audio_transcript.done"):
    pass


class ConversationItemTruncated(ServerEvent, tag="conversation.item.truncated"):
    item_id: str
    content_index: int
    audio_end_ms: int


GA_AUDIO_EVENTS = (OutputAudioDelta, OutputAudioDone, OutputTranscriptDelta, OutputTranscriptDone)
BETA_AUDIO_EVENTS = (BetaAudioDelta, BetaAudioDone, BetaTranscriptDelta, BetaTranscriptDone)
