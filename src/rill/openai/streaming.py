"""Streaming input on the engine: one StreamRun per session, shared by Mode A (NDJSON lines of
one request) and Mode B (REST session calls); rill.transports.streaming_input is the wire.

A run opens an engine session with the prompt's prefix, turns each chunk, in sequence order,
into token ids (rill.tokenizer.IncrementalEncoder keeps them equal to the whole prompt's),
appends them as they come, and at end of input appends the prompt's suffix and asks for the
answer. A pump task in the session manager's nursery renders the answer with the endpoint's own
SSE writer (stream_chat / stream_completion) into the session's output log, which readers follow.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing

import trio

from rill.openai import sse
from rill.openai.errors import ApiError, bad_request
from rill.openai.serving import Serving, api_error
from rill.openai.streaming_prompt import PromptParts
from rill.outputs import RequestDelta
from rill.sessions.chunks import InputChunk, Modality, check_chunk
from rill.sessions.config import OutputMode, SessionOptions, StartPolicy
from rill.sessions.errors import SessionError, UnsupportedModality
from rill.openai.streaming_audio import RunAudio, decode_audio_chunk
from rill.openai.streaming_speech import RunSpeech, speech_settings
from rill.openai.streaming_video import FRAME_MODALITIES, RunVideo, prepare_frame
from rill.sessions.manager import SessionManager
from rill.sessions.session import StreamingSession
from rill.sessions.state import CloseReason, SessionState
from rill.tokenizer import IncrementalEncoder

# How a session closed by rill (not by finishing) reads in its output stream.
_CLOSED_ERRORS = {
    CloseReason.EXPIRED: (410, "session_expired", "the session was idle past its timeout and is closed"),
    CloseReason.DELETED: (410, "session_deleted", "the session was deleted"),
    CloseReason.PAYLOAD_TOO_LARGE: (413, "session_payload_too_large", "the session's input exceeded its limit"),
    CloseReason.CLIENT_GONE: (499, "client_gone", "the client left mid-upload"),
    CloseReason.SHUTDOWN: (503, "server_shutdown", "the server is shutting down"),
}


def as_api_error(exc: BaseException) -> ApiError:
    """Session rule errors keep their status (404, 409, 410, 413, 429); the rest map as elsewhere."""
    if isinstance(exc, SessionError):
        return ApiError(exc.status, exc.message, param=exc.param, code=exc.code)
    return api_error(exc)


def open_run(serving: Serving, manager: SessionManager, api, req, owner: str | None, *, addressable: bool,
             endpoint: str, speech=None, voice_out=None) -> StreamRun:
    """Validate a streaming request, open its session (429 past the limits) and its engine session;
    take its first chunk if it brings one. `speech` (an AsyncSpeechEngine) hears audio chunks;
    `voice_out` (the speech-out worker) speaks the answer when the request asks for audio."""
    trace = serving.new_trace(endpoint, api.trace_prefix)
    try:
        job, parts = api.prepare(serving, trace, req)
        policy, mode = (req.streaming_input or SessionOptions()).resolve(manager.config)
        if mode is OutputMode.RESPOND_PER_CHUNK:
            parts.turn_text = api.turn_text(serving, job)
        _check_prompt_fits(serving, api, job, parts)
        spoken = speech_settings(req, voice_out, streams=addressable or bool(req.stream))
        serving.check_ready()
        session = manager.open(owner, addressable=addressable)
    except Exception as exc:
        serving.finish(trace, as_api_error(exc).status)
        raise
    run = session.run = StreamRun(serving, manager, session, api, job, parts, policy, mode, speech)
    try:
        if spoken is not None:
            run.voice = RunSpeech(run, voice_out, *spoken)
        run.open()
        if req.chunk is not None:
            run.push(req.chunk)
    except Exception as exc:
        run.error = run.error or as_api_error(exc)
        manager.close(session, CloseReason.DELETED)  # its id was never given out
        serving.finish(trace, run.error.status)
        raise
    return run


def _check_prompt_fits(serving: Serving, api, job, parts: PromptParts) -> None:
    """The prompt without any streamed text must leave room for the answer."""
    encode = serving.tokenizer.encode
    num_tokens = len(parts.prefix_ids) + len(encode(parts.prefix_text + parts.suffix_text,
                                                    add_special_tokens=parts.add_special_tokens))
    serving.check_fits(max(num_tokens, 1), job.params.max_tokens, api.prompt_param)


def attach(manager: SessionManager) -> None:
    """Closing a session (any reason) frees its engine side at once."""
    manager.on_close = lambda session: session.run and session.run.on_session_closed()


class StreamRun:
    """One streaming-input request on the engine: its prompt as it grows, its answer as frames."""

    def __init__(self, serving: Serving, manager: SessionManager, session: StreamingSession, api, job,
                 parts: PromptParts, policy: StartPolicy, mode: OutputMode, speech=None):
        self.serving, self.manager, self.session = serving, manager, session
        self.speech = speech  # the speech engine for audio chunks (None: they are refused)
        self.audio: RunAudio | None = None  # started by the first audio chunk
        self.video: RunVideo | None = None  # started by the first image or video chunk
        self.voice: RunSpeech | None = None  # the answer read aloud, when the request asked for audio
        self._prepared: dict[int, tuple[bytes, object]] = {}  # frame chunks decoded: id -> (digest, frame)
        self.api, self.job, self.mode = api, job, mode
        self.request_id = job.trace.request_id
        self.suffix_text, self.turn_text = parts.suffix_text, parts.turn_text
        self.encoder = IncrementalEncoder(serving.tokenizer, add_special_tokens=parts.add_special_tokens)
        self.ids = parts.prefix_ids + self.encoder.feed(parts.prefix_text)  # sent to the engine so far
        self.text = parts.prefix_text  # the prompt text so far, for echo
        num_prefix_tokens = len(parts.prefix_ids) + len(serving.tokenizer.encode(
            parts.prefix_text, add_special_tokens=parts.add_special_tokens))
        self.start_after_tokens = policy.start_after_tokens(num_prefix_tokens)
        self.num_turns = 0
        self.deltas: list[RequestDelta] = []  # every delta, for the JSON result
        self.error: ApiError | None = None  # why the run failed, when rill ended it
        self.input_scope: trio.CancelScope | None = None  # Mode A: the body reader, cancelled on close
        self._first_token_timed = False
        self._result = None

    # -- opening and input --------------------------------------------------------------------------

    def open(self) -> None:
        """Open the engine session with the prompt's prefix and start the output pump."""
        recv = self.serving.engine.open_session(
            self.request_id, self.job.params, start_after_tokens=self.start_after_tokens,
            respond_per_chunk=self.mode is OutputMode.RESPOND_PER_CHUNK, prompt_token_ids=self.ids,
        )
        self.manager.start_soon(self.pump, recv)

    async def prepare(self, chunk: InputChunk) -> None:
        """Before push: decode a frame chunk off the trio thread (a bad frame is refused alone)."""
        sid = chunk.sequence_id
        if chunk.modality not in FRAME_MODALITIES or sid < self.session.next_sequence_id:
            return  # not a frame, or a repeat of one applied
        digest = chunk.digest
        if self._prepared.get(sid, (None,))[0] == digest:
            return  # a repeat of one waiting
        self.session.check_input_open()
        check_chunk(chunk, self.session.max_chunk_bytes)
        if len(self._prepared) > self.manager.config.max_pending_chunks:
            raise UnsupportedModality("too many frame chunks wait for the chunks before them", param="sequence_id",
                                      code="too_far_ahead")
        self._prepared[sid] = (digest, await prepare_frame(self, chunk))

    def push(self, chunk: InputChunk) -> None:
        """Take one chunk: apply it and any it unblocked; finish at end of input."""
        if chunk.modality is Modality.AUDIO:
            self._check_audio(chunk)
        for ready in self.manager.accept(self.session, chunk):
            self._guard(lambda ready=ready: self._take(ready))
            if ready.end_of_input:
                self.finish()

    def _check_audio(self, chunk: InputChunk) -> None:
        """Before the chunk touches the session: a bad or unwelcome audio chunk is refused alone."""
        if self.speech is None:
            raise UnsupportedModality("modality 'audio' needs a speech model and this server serves none (rill "
                                      "serve --speech-model); send text or tokens", param="modality")
        if self.video is not None:
            raise UnsupportedModality("a session takes audio or frames, not both", param="modality")
        decode_audio_chunk(chunk)
        if self.audio is not None:
            self.audio.check_room()

    def _take(self, chunk: InputChunk) -> None:
        if chunk.modality in FRAME_MODALITIES and self.video is None:
            self.video = RunVideo(self, self.serving.options.live_video)
        if self.video is not None:  # from the first frame on, every chunk keeps its place among the frames
            digest, prepared = self._prepared.pop(chunk.sequence_id, (None, None))
            if chunk.modality in FRAME_MODALITIES and digest != chunk.digest:
                raise UnsupportedModality("a frame chunk was not decoded before it was applied", param="payload")
            self.video.take(chunk, prepared)
            return
        if chunk.modality is Modality.AUDIO and self.audio is None:
            self.audio = RunAudio(self, self.speech, self.mode is OutputMode.RESPOND_PER_CHUNK)
        if self.audio is not None:
            self.audio.take(chunk)
        else:
            self._apply(chunk)

    async def wait_for_audio_room(self) -> None:
        """Mode A reads its body no faster than its audio is recognised."""
        if self.audio is not None:
            await self.audio.live.wait_for_room()

    def finish(self, last_sequence_id: int | None = None) -> None:
        """End of input (idempotent): the prompt's suffix goes in and the answer starts."""
        session = self.session
        if session.state is SessionState.FINISHED or session.close_reason is CloseReason.COMPLETED:
            return
        session.check_input_open()
        session.check_can_finish(last_sequence_id)
        if self.audio is not None and self.audio.finish():
            return  # the audio's last words first: RunAudio finishes the input then
        if self.video is not None:
            self.video.finish()  # after the frames before it: RunVideo finishes the input then
            return
        self._guard(self._finish_input)

    def _apply(self, chunk: InputChunk) -> None:
        if chunk.modality is Modality.TOKENS:
            self._check_vocab(chunk.payload)
            self._append(self.encoder.flush() + chunk.payload, self.serving.tokenizer.decode(chunk.payload))
        elif self.mode is OutputMode.RESPOND_PER_CHUNK and chunk.payload:
            opener = self.turn_text if self.num_turns else ""
            self.num_turns += 1
            text = opener + chunk.payload + self.suffix_text
            self._append(self.encoder.flush(text), text)
        else:
            self._append(self.encoder.feed(chunk.payload), chunk.payload)

    def _finish_input(self) -> None:
        suffix = "" if self.mode is OutputMode.RESPOND_PER_CHUNK else self.suffix_text
        self._append(self.encoder.flush(suffix), suffix, check=False)
        self.serving.check_fits(len(self.ids), self.job.params.max_tokens, self.api.prompt_param)
        self.api.set_prompt(self.job, self.ids, self.text)
        self.manager.finish(self.session)
        self.serving.engine.finish(self.request_id)

    def _append(self, ids: list[int], text: str, check: bool = True, mm_items=(), media: bool = False) -> None:
        if check and len(self.ids) + len(ids) >= self.serving.max_model_len:
            raise bad_request(f"the streamed input reaches {len(self.ids) + len(ids)} tokens; this model's "
                              f"maximum context length is {self.serving.max_model_len}", "payload",
                              "context_length_exceeded")
        self.text += text
        if ids:
            self.ids += ids
            self.serving.engine.append(self.request_id, ids, mm_items)
            if self.video is not None:
                self.video.on_sent(ids, media)  # its context mirrors the engine session's
        threshold = self.start_after_tokens
        if threshold is not None and len(self.ids) >= threshold:
            self.manager.start(self.session)

    def _check_vocab(self, ids: list[int]) -> None:
        bad = [t for t in ids if not 0 <= t < self.serving.vocab_size]
        if bad:
            raise bad_request(f"token ids {bad[:8]} are outside the vocabulary of {self.serving.vocab_size}",
                              "payload")

    def _guard(self, step) -> None:
        """Run an input step; an error it raises fails the session (input cannot be taken back)."""
        try:
            step()
        except Exception as exc:
            self.error = as_api_error(exc)
            self.manager.close(self.session, CloseReason.FAILED)
            raise

    # -- closing ------------------------------------------------------------------------------------

    def on_session_closed(self) -> None:
        """The manager closed the session: free the engine side now, stop reading Mode A's body."""
        self.serving.engine.abort(self.request_id)
        if self.voice is not None:
            self.voice.close()
        if self.audio is not None:
            self.audio.close()
        if self.video is not None:
            self.video.close()
        if self.input_scope is not None:
            self.input_scope.cancel()

    def closed_error(self) -> ApiError:
        if self.error is not None:
            return self.error
        status, code, message = _CLOSED_ERRORS.get(self.session.close_reason, (500, "internal_error", "closed"))
        return ApiError(status, f"session {self.session.session_id}: {message}", code=code)

    # -- output ------------------------------------------------------------------------------------

    async def pump(self, recv) -> None:
        """The endpoint's SSE frames into the session's log; then the session closes."""
        log = self.session.output
        try:
            async with aclosing(self.api.stream(self.serving, self.job, self._deltas(recv))) as frames:
                async for frame in frames:
                    if frame == sse.DONE and self.voice is not None:
                        await self.voice.wait()  # the last clause's audio comes before the end
                    log.append(frame)
        finally:
            if self.voice is not None:
                self.voice.close()
            log.close()
            self.serving.engine.abort(self.request_id)
        ok = self.job.trace.status == 200
        self.manager.close(self.session, CloseReason.COMPLETED if ok else CloseReason.FAILED)

    async def _deltas(self, recv) -> AsyncIterator[tuple[int, RequestDelta]]:
        finished = False
        with recv:
            async for delta in recv:
                self._on_delta(delta)
                finished = delta.finished or delta.error is not None
                yield 0, delta
                # The writer turns a delta into all its frames before it asks for the next one,
                # so a frame logged here lands right after the frames of the turn's last delta.
                if delta.turn_finish_reason is not None:
                    self.session.output.append(self.api.turn_frame(self.job, delta))
        if not finished:
            raise self.closed_error()

    def _on_delta(self, delta: RequestDelta) -> None:
        self.deltas.append(delta)
        self.job.trace.on_delta(delta)
        if self.voice is not None:
            self._speak(delta)
        if delta.token_ids and self.session.finished_at_s is not None and not self._first_token_timed:
            self._first_token_timed = True
            self.manager.record_first_token(self.session)

    def _speak(self, delta: RequestDelta) -> None:
        self.voice.feed(delta.text)
        if delta.finished or delta.error is not None:
            self.voice.finish()
        elif delta.turn_finish_reason is not None:
            self.voice.end_turn()  # the turn's last clause is spoken now, not with the next turn's first

    async def result(self):
        """The answer as one JSON body, once the output is complete; raises the run's error."""
        await self.session.output.wait_closed()
        if self._result is None:
            self._result = await self.api.complete(self.serving, self.job, self._replay())
        return self._result

    async def _replay(self) -> AsyncIterator[tuple[int, RequestDelta]]:
        for delta in self.deltas:
            yield 0, delta
        if not (self.deltas and (self.deltas[-1].finished or self.deltas[-1].error)):
            raise self.closed_error()
