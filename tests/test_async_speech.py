"""The speech worker's trio bridge (rill.speech.async_speech) with no socket: concurrent requests
equal the core's own results, leaving an iteration aborts in the core, a refused request raises
its own error and the worker goes on, and a dead worker fails every request."""

from __future__ import annotations

import pytest
import trio

from helpers_server import one_torch_thread, wait_for  # noqa: F401
from helpers_whisper import make_whisper_dir, synthetic_audio
from rill.errors import EngineDeadError, ValidationError
from rill.speech.async_speech import open_speech_engine
from rill.speech.core import SpeechCore
from rill.speech.decoding import TranscribeParams


@pytest.fixture(scope="module")
def speech_dir(tmp_path_factory):
    return make_whisper_dir(tmp_path_factory.mktemp("whisper"), multilingual=True, max_source_positions=100,
                            max_target_positions=48)


def core_alone(speech_dir, audio, params=TranscribeParams()):
    core = SpeechCore(str(speech_dir))
    core.add_request("alone", audio, params)
    for _ in range(10_000):
        for delta in core.step():
            if delta.finished is not None:
                return delta.finished
    raise AssertionError("the core never finished")


async def collect(engine, audio, params=TranscribeParams()):
    deltas = [delta async for delta in engine.transcribe(audio, params)]
    assert deltas[-1].finished is not None and all(d.finished is None for d in deltas[:-1])
    assert "".join(d.text for d in deltas) == deltas[-1].finished.text
    return deltas[-1].finished


async def test_concurrent_transcriptions_each_equal_the_core_alone(speech_dir):
    audios = [synthetic_audio(seconds, seed) for seed, seconds in enumerate((1.0, 3.5, 2.2))]
    expected = [core_alone(speech_dir, audio) for audio in audios]
    results = [None] * len(audios)
    async with open_speech_engine(speech_dir) as engine:
        async def one(i):
            results[i] = await collect(engine, audios[i])

        async with trio.open_nursery() as nursery:
            for i in range(len(audios)):
                nursery.start_soon(one, i)
        assert engine.num_requests == 0 and not engine.core.has_work()
    assert results == expected


async def test_leaving_the_iteration_early_aborts_the_request_in_the_core(speech_dir):
    async with open_speech_engine(speech_dir) as engine:
        async for delta in engine.transcribe(synthetic_audio(6.0), TranscribeParams()):
            assert delta.finished is None
            break  # the generator is closed here: its finally aborts
        await wait_for(lambda: not engine.core.has_work() and not engine.core.requests, seconds=10)
        assert engine.num_requests == 0


async def test_a_cancelled_reader_aborts_the_request_in_the_core(speech_dir):
    async with open_speech_engine(speech_dir) as engine:
        with trio.move_on_after(0.2):
            await collect(engine, synthetic_audio(20.0))  # ten windows: far longer than 0.2 s
        await wait_for(lambda: not engine.core.has_work() and not engine.core.requests, seconds=10)


async def test_a_refused_request_raises_its_error_and_the_worker_goes_on(speech_dir):
    audio = synthetic_audio(1.0)
    async with open_speech_engine(speech_dir) as engine:
        with pytest.raises(ValidationError) as refused:
            await collect(engine, audio, TranscribeParams(language="xx"))
        assert refused.value.param == "language"
        assert await collect(engine, audio) == core_alone(speech_dir, audio)


async def test_worker_death_fails_live_and_new_requests_fault_injected(speech_dir, monkeypatch):
    """Fault injection: the core's step raises; the request in flight and every later one get
    EngineDeadError, and `died` is set (rill serve stops on it)."""
    def broken_step(self):
        raise RuntimeError("injected fault")

    monkeypatch.setattr(SpeechCore, "step", broken_step)
    async with open_speech_engine(speech_dir) as engine:
        with pytest.raises(EngineDeadError, match="injected fault"):
            await collect(engine, synthetic_audio(1.0))
        with trio.fail_after(5):
            await engine.died.wait()
        assert not engine.is_alive
        with pytest.raises(EngineDeadError):
            await collect(engine, synthetic_audio(1.0))
