"""The trio bridge for speech: one worker thread owns SpeechCore and steps it while it has work; trio
tasks talk to it through a thread-safe inbox and get each step's deltas back in one cross-thread call.

    async with open_speech_engine("rill-tiny-speech") as speech:
        async for delta in speech.transcribe(audio, TranscribeParams(language="en")):
            ...  # delta.text as it is decoded; delta.finished (a Transcription) last

The same shape as the LLM engine's bridge (rill.engine.async_engine), smaller: a speech request has
no session, no samples and no streamed input, and its deltas are bounded by the decoder's length
limit, so each request's channel is unbounded and the worker never waits on a reader. A separate
worker rather than the LLM engine's scheduler: the two models share nothing (no KV layout, no
tokenizer), and a long LLM prefill must not hold up a decoder step of a live transcription.
"""

from __future__ import annotations

import itertools
import logging
import math
import queue
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import msgspec
import numpy as np
import trio

from rill.engine.outbox import Outbox
from rill.errors import EngineDeadError, ModelLoadError, RillError, ValidationError
from rill.speech.audio import SAMPLE_RATE
from rill.speech.causal import EndLive, FeedLive, OpenLive
from rill.speech.core import SpeechCore
from rill.speech.decoding import SpeechDelta, TranscribeParams
from rill.speech.whisper import RILL_TINY_SPEECH, speech_model_path

log = logging.getLogger("rill.speech")



def resolve_speech_model(name: str | Path) -> Path:
    """"rill-tiny-speech" -> the directory shipped in the package; anything else is a local directory."""
    return speech_model_path(name)


def speech_model_available(name: str | Path) -> bool:
    return (resolve_speech_model(name) / "config.json").is_file()


# Messages into the worker: small frozen structs (STYLE.md principle 6).
class AddSpeech(msgspec.Struct, frozen=True):
    request_id: str
    audio: np.ndarray  # mono float32 at sample_rate
    params: TranscribeParams
    sample_rate: int = SAMPLE_RATE


class AbortSpeech(msgspec.Struct, frozen=True):
    request_id: str


class Shutdown(msgspec.Struct, frozen=True):
    pass


class RequestRejected(msgspec.Struct, frozen=True):
    """Worker -> trio: the core refused a request (a ValidationError, say); the trio side re-raises it."""

    request_id: str
    error: BaseException


class AsyncSpeechEngine:
    """Trio-side handle of the speech worker. `transcribe` is the whole API; aborts are idempotent."""

    def __init__(self, core: SpeechCore, trio_token: trio.lowlevel.TrioToken, model_name: str | None = None):
        self.core = core
        self.model_name = model_name or core.model_name
        self._token = trio_token
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, trio.MemorySendChannel] = {}
        self._ids = itertools.count()
        self.dead: BaseException | None = None
        self.died = trio.Event()  # set with `dead`: rill serve stops on it as on the LLM engine's
        # Worker -> trio, as in the LLM bridge: deltas pile up in the outbox and one trio callback at
        # a time drains them, so a fast worker never floods trio's callback queue.
        self._outbox = Outbox(trio_token, self._drain)  # batches of SpeechDelta | RequestRejected
        self.num_steps = 0  # worker steps run (an int written by the worker alone)

    # -- trio side ---------------------------------------------------------------------------------

    @property
    def is_alive(self) -> bool:
        return self.dead is None

    @property
    def num_requests(self) -> int:
        """Requests the trio side is waiting on."""
        return len(self._streams)

    @property
    def input_rate(self) -> int:
        """The rate the core hears whole recordings at (Kyutai STT: 24 kHz; Whisper, Voxtral: 16 kHz): an
        upload decoded straight to it reaches the model without a second resample."""
        return self.core.input_rate

    def new_request_id(self) -> str:
        return f"speech-{next(self._ids)}"

    def _send(self, msg) -> None:
        self._inbox.put(msg)
        self._wake.set()

    async def transcribe(self, audio: np.ndarray, params: TranscribeParams | None = None,
                         request_id: str | None = None, sample_rate: int = SAMPLE_RATE) -> AsyncIterator[SpeechDelta]:
        """Deltas as the core decodes them; the last one carries `finished`. Leaving early, or being
        cancelled (the client closed the connection), aborts the request in the core. `audio` is mono
        float32 at `sample_rate`: 16 kHz, or the core's own `input_rate`.

        Raises the core's own RillError when it refuses the request (a ValidationError is a 400 at the
        HTTP edge), EngineDeadError when the worker is dead or dies meanwhile, and RillError with the
        core's message when a delta reports an error."""
        if sample_rate not in (SAMPLE_RATE, self.input_rate):
            raise ValueError(f"{self.model_name} takes audio at {SAMPLE_RATE} or {self.input_rate} Hz, "
                             f"not {sample_rate}")
        request_id = request_id or self.new_request_id()
        recv = self._open_stream(request_id)
        self._send(AddSpeech(request_id, audio, params or TranscribeParams(), sample_rate))
        try:
            with recv:  # closed before the abort, with no checkpoint between
                async for delta in recv:
                    if isinstance(delta, RequestRejected):
                        raise delta.error
                    if delta.error is not None:
                        raise (EngineDeadError if self.dead is not None else RillError)(delta.error)
                    yield delta
        finally:
            self.abort(request_id)

    def open_live(self, input_rate: int = 16_000, request_id: str | None = None):
        """A live stream of a causal model (rill.speech.causal): feed it audio as it comes, read its deltas.
        Close it (or leave its `with` block) to free it in the worker."""
        from rill.speech.live_handle import LiveHandle

        request_id = request_id or self.new_request_id()
        recv = self._open_stream(request_id)
        self._send(OpenLive(request_id, input_rate))
        return LiveHandle(self, request_id, recv)

    def _open_stream(self, request_id: str) -> trio.MemoryReceiveChannel:
        if self.dead is not None:
            raise EngineDeadError(f"the speech engine is dead: {self.dead!r}")
        if request_id in self._streams:
            raise RillError(f"request id {request_id!r} is already live")
        send, recv = trio.open_memory_channel(math.inf)  # bounded by the decoder's length limit
        self._streams[request_id] = send
        return recv

    def abort(self, request_id: str) -> None:
        """Idempotent: the core drops the request at the worker's next look at its inbox."""
        send = self._streams.pop(request_id, None)
        if send is None:
            return  # finished (the core freed it) or aborted already
        send.close()
        self._send(AbortSpeech(request_id))

    def _post(self, items: list) -> None:
        """Worker thread: deltas (or a refusal) for the trio thread."""
        self._outbox.post(items)

    def _drain(self, batches: list[list]) -> None:
        # Trio thread: everything posted since the last drain, in order.
        for batch in batches:
            for item in batch:
                self._deliver(item)

    def _deliver(self, item: SpeechDelta | RequestRejected) -> None:
        send = self._streams.get(item.request_id)
        if send is None:
            return  # aborted on this side already
        try:
            send.send_nowait(item)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.abort(item.request_id)  # the reader left without aborting
            return
        if isinstance(item, RequestRejected) or item.error is not None or item.finished is not None:
            del self._streams[item.request_id]  # the core holds nothing more for it
            send.close()

    def _fail_all(self, error: BaseException) -> None:
        self.dead = error
        self.died.set()
        for request_id, send in list(self._streams.items()):
            with send:
                try:
                    send.send_nowait(SpeechDelta(request_id, error=f"speech engine failed: {error!r}"))
                except trio.BrokenResourceError:
                    pass  # nobody is reading
        self._streams.clear()

    # -- worker thread -----------------------------------------------------------------------------

    def run_worker(self) -> None:
        try:
            while self._apply_inbox():
                if self.core.has_work():
                    deltas = self.core.step()
                    self.num_steps += 1
                    if deltas:
                        self._post(deltas)
                else:
                    self._wake.wait()
                    self._wake.clear()
        except BaseException as exc:  # the engine must never leave a caller hanging
            log.exception("speech worker died")
            self._token.run_sync_soon(self._fail_all, exc)

    def _apply_inbox(self) -> bool:
        """Apply every message waiting; False at Shutdown."""
        while True:
            try:
                msg = self._inbox.get_nowait()
            except queue.Empty:
                return True
            if isinstance(msg, Shutdown):
                return False
            self._apply(msg)

    def _apply(self, msg: AddSpeech | AbortSpeech | OpenLive | FeedLive | EndLive) -> None:
        if isinstance(msg, (OpenLive, FeedLive, EndLive)):
            self._apply_live(msg)
            return
        if isinstance(msg, AbortSpeech):
            self.core.abort(msg.request_id)
            return
        try:
            self.core.add_request(msg.request_id, msg.audio, msg.params, msg.sample_rate)
        except RillError as exc:  # a bad request fails alone (the core kept nothing of it); the engine goes on
            self._post([RequestRejected(msg.request_id, exc)])

    def _apply_live(self, msg: OpenLive | FeedLive | EndLive) -> None:
        live = getattr(self.core, "live", None)
        try:
            if live is None:
                raise ValidationError(f"{self.model_name} is not a streaming (causal) speech model", param="model")
            if isinstance(msg, OpenLive):
                live.open(msg.request_id, msg.input_rate)
            elif isinstance(msg, FeedLive):
                live.feed(msg.request_id, msg.pcm)
            else:
                live.end(msg.request_id)
        except RillError as exc:  # the stream fails alone; the engine goes on
            self._post([RequestRejected(msg.request_id, exc)])

    def shutdown(self) -> None:
        self._send(Shutdown())


def speech_core(directory: Path, **core_kwargs):
    """The core for the directory's kind, read from config.json's model_type: Kyutai STT streams
    (rill.speech.kyutai), Voxtral Realtime streams (rill.speech.voxtral_realtime), anything else is a
    Whisper directory. All offer SpeechCore's interface. `delay_ms` and `early_stop` are Voxtral's: a
    delay asked of another kind is refused (Kyutai's and Whisper's are fixed by their weights)."""
    from rill.speech.kyutai.loader import is_kyutai_dir
    from rill.speech.voxtral_realtime.loader import is_voxtral_realtime_dir

    if is_voxtral_realtime_dir(directory):
        from rill.speech.voxtral_realtime.core import VoxtralCore

        try:
            return VoxtralCore(str(directory), **core_kwargs)
        except ValueError as exc:  # a delay that is not a multiple of the model's frame
            raise ModelLoadError(f"{directory.name}: {exc}") from None
    core_kwargs.pop("early_stop", None)
    if core_kwargs.pop("delay_ms", None) is not None:
        raise _fixed_delay(directory)
    if is_kyutai_dir(directory):
        from rill.speech.kyutai.core import KyutaiCore

        return KyutaiCore(str(directory), **core_kwargs)
    return SpeechCore(str(directory), **core_kwargs)


def check_speech_delay(name: str | Path | None, delay_ms: float | None) -> None:
    """`rill serve --speech-delay-ms`, checked before any model loads: only a Voxtral Realtime model takes
    a delay, and only a positive multiple of its frame. Raises ModelLoadError."""
    from rill.speech.voxtral_realtime.config import AudioSpec, read_json
    from rill.speech.voxtral_realtime.loader import is_voxtral_realtime_dir

    if delay_ms is None or name is None or name == "none":
        return
    directory = resolve_speech_model(name)
    if not is_voxtral_realtime_dir(directory):
        raise _fixed_delay(directory)
    audio = read_json(directory / "tekken.json").get("audio") or {}
    try:
        AudioSpec.from_dir(directory, audio).num_delay_tokens(delay_ms)
    except (KeyError, ValueError) as exc:
        raise ModelLoadError(f"{directory.name}: --speech-delay-ms: {exc}") from None


def _fixed_delay(directory: Path) -> ModelLoadError:
    return ModelLoadError(f"{directory.name}: --speech-delay-ms sets the transcription delay of a Voxtral Realtime "
                          f"model; this model's delay is fixed by its weights (Whisper, Kyutai STT)")


@asynccontextmanager
async def open_speech_engine(path: str | Path = RILL_TINY_SPEECH, *, model_name: str | None = None,
                             **core_kwargs) -> AsyncIterator[AsyncSpeechEngine]:
    """Load the model (in a thread), run the speech worker thread for the block's duration.

    `path` is "rill-tiny-speech" or a local Whisper, Kyutai STT or Voxtral Realtime directory; `model_name` is the
    name clients use
    (default: `path` as given)."""
    directory = resolve_speech_model(path)
    if not directory.is_dir():
        raise ModelLoadError(f"no speech model at {directory}")
    core = await trio.to_thread.run_sync(lambda: speech_core(directory, **core_kwargs))
    engine = AsyncSpeechEngine(core, trio.lowlevel.current_trio_token(), model_name or str(path))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            lambda: trio.to_thread.run_sync(engine.run_worker, limiter=trio.CapacityLimiter(1))
        )
        try:
            yield engine
        finally:
            engine.shutdown()


@asynccontextmanager
async def open_serving_speech(name: str | None, **core_kwargs) -> AsyncIterator[AsyncSpeechEngine | None]:
    """`rill serve --speech-model`: None or "none" serves no speech model. The shipped rill-tiny-speech
    may be absent from a build (it is trained by its own recipe): then rill serves without speech and
    says so in one log line, rather than failing to start. Any other missing directory is an error."""
    if name is None or name == "none":
        yield None
        return
    if name == RILL_TINY_SPEECH and not speech_model_available(name):
        log.warning("%s is not in this build (%s): serving without speech; /v1/audio/transcriptions answers "
                    "404 model_not_found", name, resolve_speech_model(name))
        yield None
        return
    async with open_speech_engine(name, **core_kwargs) as engine:
        log.info("transcribing with %s", name)
        yield engine
