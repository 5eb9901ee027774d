"""Spoken answers on /v1/realtime (issue 51): output_modalities ["audio"] on a server with a voice (espeak-ng on
the speech-out worker), heard by a real WebSocket client on both listeners, in GA and beta names. Every event of
the GA session is checked against OpenAI's pinned schemas; the audio is decoded (PCM16 24 kHz, G.711 u-law and
a-law at 8 kHz) and measured; conversation.item.truncate and a barge-in are checked by the next answer's prompt
(its usage.input_tokens against the chat template over the conversation as cut) and by the item itself."""

from __future__ import annotations

import base64
import io
from contextlib import asynccontextmanager

import numpy as np
import pytest
import soundfile
import trio

from helpers_models import make_model_dir
from helpers_server import one_torch_thread, wait_for  # noqa: F401
from helpers_voice import needs_espeak, of_type, silence, speak, voice_client, voice_server
from helpers_voice_out import needs_voice
from rill.speech.async_speech import speech_model_available
from rill.transports.http import ServerConfig
from rill.transports.realtime.driver import RealtimeConfig
from test_realtime_spec_events import schemas, violations  # noqa: F401

pytestmark = [needs_voice, needs_espeak, pytest.mark.skipif(not speech_model_available("rill-tiny-speech"),
                                                            reason="rill-tiny-speech is not in this build")]

AUDIO = {"output_modalities": ["audio"]}


@pytest.fixture(scope="module")
def endless_dir(tmp_path_factory):
    """A random-weight model whose greedy answers never end: an answer that is still speaking when the user talks."""
    return make_model_dir(tmp_path_factory.mktemp("endless"), "mistral", endless=True)


@asynccontextmanager
async def spoken_server(llm="rill-tiny", config=None):
    """voice_server (rill-tiny-speech hears) with the default voice on the speech-out worker."""
    from rill.tts.espeak import EspeakBackend
    from rill.tts.worker import open_speech_out

    async with open_speech_out(EspeakBackend()) as out, voice_server(llm, "rill-tiny-speech", config) as server:
        server.app.extensions["rill"].speech_out = out
        yield server
        await wait_for(lambda: out.num_requests == 0)  # every answer's voice is done or stopped


def user_text(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


async def ask(client, question: str, **response) -> list[dict]:
    await client.send("conversation.item.create", item=user_text(question))
    await client.send("response.create", **({"response": response} if response else {}))
    return await client.until("response.done")


def audio_bytes(events: list[dict], prefix: str = "response.output_audio") -> bytes:
    return b"".join(base64.b64decode(e["delta"]) for e in of_type(events, f"{prefix}.delta"))


def transcript(events: list[dict], prefix: str = "response.output_audio_transcript") -> str:
    return "".join(e["delta"] for e in of_type(events, f"{prefix}.delta"))


def check_in_step(events: list[dict], audio: str, text: str) -> None:
    """Each clause's transcript delta comes right before its audio; no audio before the first transcript."""
    kinds = [e["type"] for e in events if e["type"] in (f"{audio}.delta", f"{text}.delta")]
    assert kinds and kinds[0] == f"{text}.delta" and kinds[-1] == f"{audio}.delta", kinds
    runs = "".join("t" if k == f"{text}.delta" else "a" for k in kinds)
    assert "tt" not in runs, runs  # every transcript piece has audio after it


def prompt_tokens(server, messages: list[dict]) -> int:
    tokenizer = server.app.extensions["rill"].serving.tokenizer
    return len(tokenizer.encode(tokenizer.apply_chat_template(messages), add_special_tokens=False))


async def test_a_spoken_answer_in_ga_events_pcm16_then_g711_conforms_to_openais_schemas(schemas):
    config = ServerConfig(realtime=RealtimeConfig(ws_port=0))  # OpenAI's 24 kHz input: the schemas allow no other
    async with spoken_server(config=config) as server, voice_client(server, "raw") as client:
        session = await client.update(**AUDIO, audio={"output": {"voice": "alloy", "speed": 1.0}})
        assert session["output_modalities"] == ["audio"]
        assert session["audio"]["output"] == {"format": {"type": "audio/pcm", "rate": 24_000}, "voice": "alloy",
                                              "speed": 1.0}
        pcm = await ask(client, "What is 17 + 25?")
        said = transcript(pcm)
        assert "42" in said, said
        check_in_step(pcm, "response.output_audio", "response.output_audio_transcript")
        assert not of_type(pcm, "response.output_text.delta")
        (done,) = of_type(pcm, "response.output_audio_transcript.done")
        assert done["transcript"] == said
        (part,) = of_type(pcm, "response.content_part.added")
        assert part["part"] == {"type": "audio", "transcript": ""}
        response = pcm[-1]["response"]
        assert response["status"] == "completed" and response["output_modalities"] == ["audio"]
        assert response["output"][0]["content"] == [{"type": "output_audio", "transcript": said}]
        samples = np.frombuffer(audio_bytes(pcm), dtype="<i2").astype(np.float32) / 32767
        seconds = len(samples) / 24_000
        assert 0.5 < seconds < 10 and np.sqrt(np.mean(samples ** 2)) > 0.01, seconds  # speech, not silence
        sizes = [len(base64.b64decode(e["delta"])) for e in of_type(pcm, "response.output_audio.delta")]
        assert max(sizes) <= 24_000 * 2 // 5  # 200 ms pieces

        for kind, subtype in (("audio/pcmu", "ULAW"), ("audio/pcma", "ALAW")):
            session = await client.update(audio={"output": {"format": {"type": kind}}})
            assert session["audio"]["output"]["format"] == {"type": kind}
            g711 = await ask(client, "What is 17 + 25?")
            assert transcript(g711) == said  # the same answer, the same voice: the same audio at 8 kHz
            data = audio_bytes(g711)
            assert abs(len(data) - len(samples) / 3) <= 3  # one byte a sample at 8 kHz
            decoded, rate = soundfile.read(io.BytesIO(data), format="RAW", subtype=subtype, samplerate=8_000,
                                           channels=1)
            assert rate == 8_000 and np.sqrt(np.mean(decoded ** 2)) > 0.01
    events = [event for _, event in client.log]
    found = [problem for event in events for problem in violations(schemas, event)]
    assert found == [], "\n".join(found)
    await wait_for(lambda: server.all_kv_free)


async def test_a_beta_client_gets_the_beta_names_and_a_per_response_choice_of_text():
    async with spoken_server() as server, \
            voice_client(server, "http", extra_headers=[(b"openai-beta", b"realtime=v1")]) as client:
        session = await client.update(modalities=["text", "audio"], voice="echo", output_audio_format="g711_alaw")
        assert session["modalities"] == ["text", "audio"] and session["output_modalities"] == ["audio"]
        assert session["voice"] == "echo" and session["output_audio_format"] == "g711_alaw"
        events = await ask(client, "What is 17 + 25?")
        said = transcript(events, "response.audio_transcript")
        assert "42" in said
        check_in_step(events, "response.audio", "response.audio_transcript")
        assert of_type(events, "response.audio.done") and of_type(events, "response.audio_transcript.done")
        assert len(audio_bytes(events, "response.audio")) > 8_000 * 0.5
        assert of_type(events, "conversation.item.created")
        assert events[-1]["response"]["output"][0]["content"] == [{"type": "audio", "transcript": said}]
        text = await ask(client, "What is 17 + 25?", modalities=["text"])  # this response only: text
        assert not of_type(text, "response.audio.delta") and "42" in text[-1]["response"]["output"][0]["content"][0][
            "text"]


async def test_truncate_cuts_the_spoken_item_and_the_next_prompt_to_the_audio_heard():
    async with spoken_server() as server, voice_client(server, "http") as client:
        await client.update(**AUDIO, audio={"input": {"turn_detection": None}})
        first = await ask(client, "What is 17 + 25?")
        said = transcript(first)
        item = first[-1]["response"]["output"][0]
        duration_ms = len(audio_bytes(first)) / 48
        # past the audio, no such part, a text item: errors, and nothing changes
        for content_index, end_ms in ((0, int(duration_ms) + 50), (1, 100), (0, -1)):
            await client.send("conversation.item.truncate", item_id=item["id"], content_index=content_index,
                              audio_end_ms=end_ms)
            error = (await client.until("error"))[-1]["error"]
            assert error["code"] == "invalid_value" and error["param"] in ("audio_end_ms", "content_index"), error
        await client.send("conversation.item.truncate", item_id=item["id"], content_index=0,
                          audio_end_ms=int(duration_ms * 0.4))
        truncated = (await client.until("conversation.item.truncated"))[-1]
        assert truncated["item_id"] == item["id"] and truncated["audio_end_ms"] == int(duration_ms * 0.4)
        await client.send("conversation.item.retrieve", item_id=item["id"])
        cut = (await client.until("conversation.item.retrieved"))[-1]["item"]["content"][0]["transcript"]
        assert cut and len(cut) < len(said) and said.startswith(cut), (cut, said)
        answer = await ask(client, "What is 2 + 3?", output_modalities=["text"])
        heard = [{"role": "user", "content": "What is 17 + 25?"}, {"role": "assistant", "content": cut},
                 {"role": "user", "content": "What is 2 + 3?"}]
        unheard = [heard[0], {"role": "assistant", "content": said}, heard[2]]
        used = answer[-1]["response"]["usage"]["input_tokens"]
        assert used == prompt_tokens(server, heard) < prompt_tokens(server, unheard)
    await wait_for(lambda: server.all_kv_free)


@pytest.mark.parametrize("session, param", [
    ({"audio": {"output": {"voice": "nobody"}}}, "session.audio.output.voice"),
    ({"audio": {"output": {"speed": 1.6}}}, "session.audio.output.speed"),
    ({"audio": {"output": {"speed": 0.2}}}, "session.audio.output.speed"),
    ({"audio": {"output": {"format": {"type": "audio/pcm", "rate": 16_000}}}}, "session.audio.output.format.rate"),
    ({"output_audio_format": "mp3"}, "session.output_audio_format"),
    ({"output_modalities": ["speech"]}, "session.output_modalities"),
])
async def test_voice_settings_past_their_limits_are_refused_whole(session, param):
    async with spoken_server() as server, voice_client(server, "raw") as client:
        at_limits = await client.update(**AUDIO, audio={"output": {"speed": 1.5, "voice": {"id": "cedar"}}})
        assert at_limits["audio"]["output"]["speed"] == 1.5  # cedar: OpenAI's name, in the voice's default if it lacks it
        assert at_limits["audio"]["output"]["voice"] == "cedar"
        await client.update(audio={"output": {"speed": 0.25}})
        await client.send("session.update", session={"instructions": "changed", **session})
        error = (await client.until("error"))[-1]["error"]
        assert error["param"] == param and error["code"] == "invalid_value", error
        await client.send("response.create", response={"output_modalities": ["speech"]})
        error = (await client.until("error"))[-1]["error"]
        assert error["param"] == "response.output_modalities"
        events = await ask(client, "What is 17 + 25?")
        assert "42" in transcript(events)  # the session as it was: cedar at 0.25, instructions unchanged


async def test_speech_over_a_spoken_answer_cancels_it_frees_its_request_and_keeps_what_was_heard(endless_dir):
    async with spoken_server(endless_dir) as server, voice_client(server, "http") as client:
        try:
            # temperature 0: the endless model never ends greedily; sampled, it may draw an end of turn (then the
            # answer to the question could end before the test cancels it: the flake this test once had)
            await client.update(**AUDIO, max_output_tokens=600, temperature=0,
                                audio={"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 300}}})
            await client.send("conversation.item.create", item=user_text("Tell me a long story."))
            await client.send("response.create")
            before = await client.until("response.output_audio.delta")
            first_id = before[-1]["response_id"]
            await client.stream(np.concatenate([speak("What is twelve plus thirty?", rate_wpm=140), silence(1.0)]))
            events = before + await client.until("input_audio_buffer.committed")
            started = of_type(events, "input_audio_buffer.speech_started")
            done = next(e for e in events if e["type"] == "response.done" and e["response"]["id"] == first_id)
            assert events.index(started[0]) < events.index(done)  # cancelled by the speech (not ended on its own)
            assert done["response"]["status"] == "cancelled"
            assert done["response"]["status_details"]["reason"] == "turn_detected"
            after = events[events.index(done):]
            assert not [e for e in after if e.get("response_id") == first_id and "delta" in e["type"]]
            sent = transcript([e for e in events if e.get("response_id") == first_id])
            item = done["response"]["output"][0]
            assert item["content"][0]["transcript"] == sent  # the item holds what was sent...
            (truncated,) = [e for e in events if e["type"] == "conversation.item.truncated"]
            assert truncated["item_id"] == item["id"]  # ...cut at once to what was played by the barge-in
            sent_ms = len(audio_bytes([e for e in events if e.get("response_id") == first_id])) / 48
            assert 0 < truncated["audio_end_ms"] < sent_ms
            await client.send("conversation.item.retrieve", item_id=item["id"])
            got = await client.until("conversation.item.retrieved")
            heard = got[-1]["item"]["content"][0]["transcript"]
            assert len(heard) < len(sent) and sent.startswith(heard)
            # the answer to the question asked over it (server VAD's create_response) reads the conversation as heard
            # its first audio may come before the retrieve's answer (a loaded machine): wait only if it has not
            if not [e for e in got if e["type"] == "response.output_audio.delta" and e["response_id"] != first_id]:
                got += await client.until("response.output_audio.delta")
            answer_id = next(e for e in reversed(got) if e["type"] == "response.output_audio.delta")["response_id"]
            ended = [e["response"] for e in got if e["type"] == "response.done" and e["response"]["id"] == answer_id]
            if ended:  # a fast engine wrote all 600 tokens before the retrieve came back (a 2-core Zen 5: 0.4 s)
                (answer,) = ended
                assert answer["status"] == "incomplete", answer["status_details"]
            else:
                await client.send("response.cancel", response_id=answer_id)
                answer = (await client.until("response.done"))[-1]["response"]
                assert answer["id"] == answer_id and answer["status"] == "cancelled"
            (question,) = of_type(events + got, "conversation.item.input_audio_transcription.completed")
            story = {"role": "user", "content": "Tell me a long story."}
            asked = {"role": "user", "content": question["transcript"]}
            as_heard = prompt_tokens(server, [story, {"role": "assistant", "content": heard}, asked])
            as_sent = prompt_tokens(server, [story, {"role": "assistant", "content": sent}, asked])
            assert abs(answer["usage"]["input_tokens"] - as_heard) <= 2 < as_sent - as_heard, (answer["usage"], as_heard)
        except BaseException:
            print("events received:\n" + client.timeline())  # shown with the failure: what came, in order
            raise
    await wait_for(lambda: server.all_kv_free)


async def test_truncating_the_answer_still_speaking_stops_it_there(endless_dir):
    async with spoken_server(endless_dir) as server, voice_client(server, "raw") as client:
        await client.update(**AUDIO, max_output_tokens=600, temperature=0, audio={"input": {"turn_detection": None}})
        await client.send("conversation.item.create", item=user_text("Tell me a long story."))
        await client.send("response.create")
        before = await client.until("response.output_audio.delta")
        item_id, heard_ms = before[-1]["item_id"], len(base64.b64decode(before[-1]["delta"])) // 48
        await client.send("conversation.item.truncate", item_id=item_id, content_index=0, audio_end_ms=heard_ms)
        events = await client.until("conversation.item.truncated")
        done = of_type(events, "response.done")[-1]["response"]
        assert done["status"] == "cancelled" and done["status_details"]["reason"] == "client_cancelled"
        assert events[-1]["audio_end_ms"] == heard_ms
        await client.send("conversation.item.retrieve", item_id=item_id)
        heard = (await client.until("conversation.item.retrieved"))[-1]["item"]["content"][0]["transcript"]
        said = transcript(before + events)
        assert heard and len(heard) < len(said) and said.startswith(heard)
    await wait_for(lambda: server.all_kv_free)


def sdk_spoken_exchange(url: str, question_pcm16_24k: bytes) -> list:
    """Blocking: the openai SDK's realtime client speaks a question (manual commit) and hears the answer."""
    import openai

    client = openai.OpenAI(api_key="none", base_url=url, max_retries=0)
    events = []
    with client.realtime.connect(model="gpt-realtime") as conn:
        conn.session.update(session={"type": "realtime", "output_modalities": ["audio"],
                                     "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24_000},
                                                         "turn_detection": None},
                                               "output": {"voice": "alloy"}}})
        step = 4_800  # 100 ms of PCM16 at 24 kHz
        for at in range(0, len(question_pcm16_24k), step):
            conn.input_audio_buffer.append(audio=base64.b64encode(question_pcm16_24k[at:at + step]).decode())
        conn.input_audio_buffer.commit()
        conn.response.create()
        for event in conn:
            events.append(event)
            if event.type in ("response.done", "error"):
                break
    return events


async def test_the_openai_sdk_speaks_a_question_and_hears_a_spoken_answer():
    import soxr

    pytest.importorskip("websockets")  # openai[realtime]
    question = np.concatenate([silence(0.3), speak("What is twelve plus thirty?", rate_wpm=140), silence(0.5)])
    pcm = (np.clip(soxr.resample(question, 16_000, 24_000), -1, 1) * 32767).astype("<i2").tobytes()
    config = ServerConfig(realtime=RealtimeConfig(ws_port=0))  # OpenAI's defaults: 24 kHz in
    async with spoken_server(config=config) as server:
        with trio.fail_after(120):
            events = await trio.to_thread.run_sync(sdk_spoken_exchange, server.url + "/v1", pcm,
                                                   abandon_on_cancel=True)
    types = [e.type for e in events]
    assert "error" not in types and types[-1] == "response.done", types
    heard = next(e for e in events if e.type == "conversation.item.input_audio_transcription.completed")
    assert "twelve" in heard.transcript.lower() or "12" in heard.transcript, heard.transcript
    said = "".join(e.delta for e in events if e.type == "response.output_audio_transcript.delta")
    audio = b"".join(base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta")
    assert "42" in said and len(audio) / 48_000 > 0.3, said  # PCM16 at 24 kHz: 48,000 bytes a second
    assert events[-1].response.output[0].content[0].type == "output_audio"
