"""Live streams of Kyutai STT on the speech worker (rill.speech.causal): every stream's steps batched in
one forward per worker step, token for token what each stream gives alone; bounded state for a long
stream; a closed or aborted stream frees everything. Random-weight models (tests/helpers_kyutai.py)."""

from __future__ import annotations

import numpy as np
import pytest
import trio

from helpers_kyutai import make_kyutai_dir, synthetic_audio
from helpers_server import one_torch_thread, wait_for  # noqa: F401
from rill.errors import RillError
from rill.speech.async_speech import open_speech_engine
from rill.speech.causal import LiveStreams
from rill.speech.kyutai import KyutaiStream, load_kyutai
from rill.speech.kyutai.batch import KyutaiCausal

RATE = 16_000


@pytest.fixture(scope="module")
def wide_dir(tmp_path_factory):
    """Replicate padding, a silence prefix and a delay: the shape with the most to get wrong."""
    return make_kyutai_dir(tmp_path_factory.mktemp("kyutai") / "wide", "wide", seed=4)


@pytest.fixture(scope="module")
def runtime(wide_dir):
    return load_kyutai(wide_dir)


def alone(runtime, audio: np.ndarray) -> list[int]:
    stream = KyutaiStream(runtime, RATE)
    return stream.feed(audio).token_ids + stream.finish().token_ids


def test_three_streams_batched_equal_each_alone(runtime):
    audios = {f"s{i}": synthetic_audio(s, seed=10 + i, rate=RATE) for i, s in enumerate((4.0, 3.1, 5.3))}
    live = LiveStreams(KyutaiCausal(runtime))
    rng = np.random.default_rng(0)
    fed = dict.fromkeys(audios, 0)
    got = {name: [] for name in audios}
    live.open("s0", RATE)
    live.open("s1", RATE)
    for step in range(10_000):
        if step == 3:
            live.open("s2", RATE)  # joins a batch already under way
        for name, audio in audios.items():
            if name in live.streams and fed[name] < len(audio) and rng.random() < 0.8:
                size = int(rng.integers(1, 9_000))  # irregular pieces, 1 sample to 0.56 s
                live.feed(name, audio[fed[name]:fed[name] + size])
                fed[name] += size
                if fed[name] >= len(audio):
                    live.end(name)
        for delta in live.step():
            got[delta.request_id] += delta.token_ids
        if not live.num_live:
            break
    assert live.max_batch == 3
    for name, audio in audios.items():
        assert got[name] == alone(runtime, audio), name


@pytest.mark.parametrize("minutes", [1.5, pytest.param(20, marks=pytest.mark.slow)])
def test_a_long_stream_holds_flat_state(runtime, minutes):
    """Minutes of audio at full speed: caches, queues and the detokenizer's window stay the same size."""
    live = LiveStreams(KyutaiCausal(runtime))
    live.open("long", RATE)
    stream = live.streams["long"]
    piece = synthetic_audio(15.0, seed=5, rate=RATE)
    sizes = []
    for _ in range(int(minutes * 4)):  # 15 s at a time, 480 ms a step
        for i in range(0, len(piece), 7_680):
            live.feed("long", piece[i:i + 7_680])
            live.step()
        sizes.append((stream.num_state_bytes, len(stream._recent_ids), stream._num_detok_ids))
    assert stream.audio_s > minutes * 60 - 1
    cache_bytes = [s[0] for s in sizes]
    assert max(cache_bytes[1:]) - min(cache_bytes[1:]) < 2 * runtime.frame_size * 4  # a part frame of audio
    assert max(cache_bytes) < 200_000
    assert all(n <= 1024 for _, _, n in sizes)


async def test_closing_or_aborting_live_streams_frees_the_worker(wide_dir, runtime):
    audio = synthetic_audio(3.0, seed=2, rate=RATE)
    async with open_speech_engine(str(wide_dir)) as speech:
        live_streams = speech.core.live
        # One stream read to its end through the worker equals the stream alone.
        with speech.open_live(RATE) as handle:
            for i in range(0, len(audio), 4_000):
                handle.feed(audio[i:i + 4_000])
            handle.end()
            tokens = [t async for delta in handle for t in delta.token_ids]
        assert tokens == alone(runtime, audio)
        # Closed mid-stream, or left by a cancelled reader: the worker forgets both.
        first, second = speech.open_live(RATE), speech.open_live(RATE)
        first.feed(audio)
        second.feed(audio)
        await wait_for(lambda: live_streams.num_live == 2)
        first.close()
        with trio.move_on_after(0.2):
            with second:
                async for _ in second:
                    pass
        await wait_for(lambda: live_streams.num_live == 0 and not speech.num_requests)
        first.feed(audio)  # after close: ignored, nothing reopens
        await trio.sleep(0.05)
        assert live_streams.num_live == 0


async def test_a_whisper_worker_refuses_a_live_stream(tmp_path):
    from helpers_whisper import make_whisper_dir

    whisper = make_whisper_dir(tmp_path / "whisper", multilingual=False, max_source_positions=250,
                               max_target_positions=64)
    async with open_speech_engine(str(whisper)) as speech:
        with speech.open_live(RATE) as handle:
            with pytest.raises(RillError, match="not a streaming"):
                async for _ in handle:
                    pass
        assert not speech.num_requests


async def test_the_recogniser_holds_its_source_at_the_backlog_limit(wide_dir, runtime):
    """CausalLiveTranscriber's wait_for_room: audio up to max_backlog_s passes at once; past it the source
    waits until the worker has heard enough, and the turn's transcript is the whole recording's."""
    from rill.speech.causal_live import CausalLiveTranscriber
    from rill.speech.live import LiveConfig, TranscriptDone

    audio = synthetic_audio(6.0, seed=3, rate=RATE)
    events = []
    async with open_speech_engine(str(wide_dir)) as speech:
        live = CausalLiveTranscriber(speech, LiveConfig(turn_detection=None, max_backlog_s=1.0), events.append)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(live.run)
            live.feed(audio[:RATE])  # at the limit: room at once
            assert live.backlog_s == 1.0
            with trio.fail_after(0.01):
                await live.wait_for_room()
            live.feed(audio[RATE:])  # past it: held until the worker catches up
            assert live.backlog_s > 1.0
            with trio.fail_after(60):
                await live.wait_for_room()
            assert live.backlog_s <= 1.0
            live.commit(final=True)
            await wait_for(lambda: any(isinstance(e, TranscriptDone) for e in events), seconds=60)
            nursery.cancel_scope.cancel()
        await wait_for(lambda: speech.core.live.num_live == 0 and not speech.num_requests)
    (done,) = [e for e in events if isinstance(e, TranscriptDone)]
    stream = KyutaiStream(runtime, RATE)
    assert done.final and done.by_commit and done.text == (stream.feed(audio).text + stream.finish().text).strip()
