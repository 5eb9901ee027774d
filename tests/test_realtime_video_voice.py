"""A question about the camera asked by voice: frames over /v1/realtime, then the question spoken
(espeak-ng) into input_audio_buffer with a manual commit, on a random-weight Qwen2-VL and a random-weight
Whisper. The recognised words join the message after its frames, the item holds both (input_video, then
input_audio with its transcript), and the answer is the engine's to the clip and the transcript sent
whole; a later turn renders that message again, video and transcript."""

from __future__ import annotations

import json

import pytest

from helpers_live_video import light_clip, png_b64, whole_answer
from helpers_server import one_torch_thread, wait_for  # noqa: F401
from helpers_vision import make_vl_model_dir
from helpers_voice import needs_espeak, of_type, speak, voice_client, voice_server
from helpers_whisper import make_whisper_dir
from rill.live_video.config import LiveVideoConfig
from rill.transports.http import ServerConfig
from rill.transports.realtime.driver import RealtimeConfig

pytestmark = needs_espeak
ANSWER = {"temperature": 0, "max_tokens": 4}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_vl_model_dir(tmp_path_factory.mktemp("qwen2_vl"), "qwen2_vl")


@pytest.fixture(scope="module")
def speech_dir(tmp_path_factory):
    return make_whisper_dir(tmp_path_factory.mktemp("whisper"), multilingual=False, max_source_positions=250,
                            max_target_positions=64)


class Served:
    """whole_answer's view of a voice server."""

    def __init__(self, server):
        self.engine, self.serving = server.engine, server.app.extensions["rill"].serving


@pytest.mark.parametrize("listener", ["http", "raw"])
async def test_frames_then_a_spoken_question_answer_as_the_clip_and_transcript(model_dir, speech_dir, listener):
    frames = light_clip([False, True, True, False, True, False])
    config = ServerConfig(realtime=RealtimeConfig(ws_port=0, audio_rate_hz=16_000), live_video=LiveVideoConfig(max_waiting_frames=64))
    async with voice_server(model_dir, speech_dir, config) as server, voice_client(server, listener) as client:
        await client.update(turn_detection=None, temperature=0, max_output_tokens=4)
        for i, frame in enumerate(frames):
            await client.send("input_video_frame.append", image=png_b64(frame), timestamp_ms=500 * i)
        await client.stream(speak("How many times did the light flash?"), pace=float("inf"))
        await client.send("input_audio_buffer.commit")
        events = await client.until("conversation.item.input_audio_transcription.completed")
        transcript = events[-1]["transcript"]
        assert events[-1]["content_index"] == 1  # the audio part follows the video part
        deltas = of_type(events, "conversation.item.input_audio_transcription.delta")
        assert deltas and {d["content_index"] for d in deltas} == {1}  # the deltas say so too
        (created,) = [e for e in of_type(events, "conversation.item.added") if e["item"]["role"] == "user"]
        assert [p["type"] for p in created["item"]["content"]] == ["input_video", "input_audio"]
        assert of_type(events, "input_audio_buffer.committed")
        await client.send("response.create")
        answer = await client.until("response.done")
        text = "".join(d["delta"] for d in of_type(answer, "response.output_text.delta"))
        assert text == await whole_answer(Served(server), frames, transcript.strip(), ANSWER), json.dumps(transcript)
        # The next turn renders the spoken message again, with its video: it answers without an error.
        await client.send("conversation.item.create", item={"type": "message", "role": "user",
                                                            "content": [{"type": "input_text", "text": "And now?"}]})
        await client.send("response.create")
        later = await client.until("response.done")
        assert not of_type(later, "error") and later[-1]["response"]["usage"]["input_tokens"] > \
            answer[-1]["response"]["usage"]["input_tokens"]
    await wait_for(lambda: server.all_kv_free and server.num_connections == 0)
