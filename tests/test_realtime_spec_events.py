"""Every server event of a scripted realtime session, checked against the realtime event schemas of OpenAI's
published OpenAPI spec (the pinned, trimmed copy in tests/data; RealtimeServerEvent's union, event type ->
schema). The session speaks GA as OpenAI's SDKs do, in OpenAI's defaults (PCM16 at 24 kHz), and covers text,
tools, cancel, truncation settings, item retrieve and delete, errors, audio with server VAD and with semantic
VAD, and a committed silence, on rill-tiny and rill-tiny-speech.

Where OpenAI's own schemas and OpenAI's own behaviour disagree, the event is excused here, and only there:
SPEC_QUIRKS names each place. Nothing else is excused: an event rill sends that the union has no schema for
fails the test too.
"""

from __future__ import annotations

import base64

import jsonschema
import numpy as np
import pytest
import soxr
import yaml
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from helpers_server import one_torch_thread  # noqa: F401
from helpers_voice import needs_espeak, silence, speak, voice_client, voice_server
from rill.speech.async_speech import speech_model_available
from rill.transports.http import ServerConfig
from rill.transports.realtime.driver import RealtimeConfig
from test_openai_spec import SPEC_PATH, openapi_to_json_schema

pytestmark = [needs_espeak, pytest.mark.skipif(not speech_model_available("rill-tiny-speech"),
                                               reason="rill-tiny-speech is not in this build")]

WEATHER = {"type": "function", "name": "get_weather", "description": "Get the current weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}

# (event type, JSON path) -> why OpenAI's schema is wrong there. Each is what OpenAI's own published example of
# the event sends (openapi.yaml's x-oaiMeta examples), against the schema beside it.
SPEC_QUIRKS = {
    # response.created's example: "status_details": null and "usage": null; the schema types both as objects.
    ("response.created", "response.status_details"): "null while the response runs",
    ("response.created", "response.usage"): "null until the response is done",
    # response.done's example: "status_details": null for a completed response.
    ("response.done", "response.status_details"): "null for a completed response",
}


@pytest.fixture(scope="module")
def schemas():
    """event type -> a validator of RealtimeServerEvent's member for it."""
    with open(SPEC_PATH) as f:
        spec = yaml.safe_load(f)
    registry = Registry().with_resource("urn:openai", Resource(openapi_to_json_schema(spec), DRAFT202012))
    out = {}
    for ref in spec["components"]["schemas"]["RealtimeServerEvent"]["anyOf"]:
        name = ref["$ref"].rsplit("/", 1)[1]
        (event_type,) = spec["components"]["schemas"][name]["properties"]["type"]["enum"]
        out[event_type] = jsonschema.Draft202012Validator({"$ref": f"urn:openai#/components/schemas/{name}"},
                                                          registry=registry)
    return out


def violations(schemas: dict, event: dict) -> list[str]:
    validator = schemas.get(event["type"])
    if validator is None:
        return [f"{event['type']}: no such event in OpenAI's spec"]
    found = []
    for error in validator.iter_errors(event):
        path = ".".join(str(p) for p in error.absolute_path)
        if (event["type"], path) not in SPEC_QUIRKS:
            found.append(f"{event['type']} at {path or '/'}: {error.message}")
    return found


def pcm16_24k_b64(samples_16k: np.ndarray) -> list[str]:
    samples = soxr.resample(samples_16k, 16_000, 24_000)
    pcm = (np.clip(samples, -1, 1) * 32767).astype("<i2")
    step = 2_400  # 100 ms at 24 kHz
    return [base64.b64encode(pcm[i:i + step].tobytes()).decode() for i in range(0, len(pcm), step)]


async def speak_24k(client, samples_16k: np.ndarray) -> None:
    for piece in pcm16_24k_b64(samples_16k):
        await client.send("input_audio_buffer.append", audio=piece)


def user_text(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


async def scripted_session(client) -> list[dict]:
    """Drive one connection through the script; every server event it got."""
    await client.update(type="realtime", instructions="You are a helpful assistant.", tools=[WEATHER],
                        max_output_tokens=40, truncation={"type": "retention_ratio", "retention_ratio": 0.8},
                        audio={"input": {"turn_detection": None}})
    # tools: the call, its output, the answer
    await client.send("conversation.item.create", item=user_text("What's the weather in Paris?"))
    await client.send("response.create")
    done = (await client.until("response.done"))[-1]
    call = next(item for item in done["response"]["output"] if item["type"] == "function_call")
    await client.send("conversation.item.create", item={"type": "function_call_output", "call_id": call["call_id"],
                                                        "output": '{"temperature_c": 21, "condition": "sunny"}'})
    await client.send("response.create")
    answer = (await client.until("response.done"))[-1]
    assistant = next(item for item in answer["response"]["output"] if item["type"] == "message")
    # retrieve, truncate (an error: no audio was spoken), delete
    await client.send("conversation.item.retrieve", item_id=assistant["id"])
    await client.until("conversation.item.retrieved")
    await client.send("conversation.item.truncate", item_id=assistant["id"], content_index=0, audio_end_ms=100)
    await client.until("error")
    await client.send("conversation.item.delete", item_id=call["id"])
    await client.until("conversation.item.deleted")
    # cancel
    await client.send("conversation.item.create", item=user_text("Uppercase: a long list of words"))
    await client.send("response.create")
    await client.until("response.created")
    await client.send("response.cancel")
    await client.until("response.done")
    # errors: an unknown event, an unknown item, an empty commit
    for event in (("conversation.item.retrieve", {"item_id": "item_nope"}), ("input_audio_buffer.commit", {}),
                  ("response.nope", {})):
        await client.send(event[0], **event[1])
        await client.until("error")
    # a committed silence: an item with an empty transcript
    await speak_24k(client, silence(0.25))
    await client.send("input_audio_buffer.commit")
    await client.until("conversation.item.input_audio_transcription.completed")
    # speech with server VAD, then with semantic VAD: transcribed, committed, answered
    question = np.concatenate([silence(0.3), speak("What is twelve plus thirty?", rate_wpm=140), silence(2.5)])
    for turn in ({"type": "server_vad"}, {"type": "semantic_vad", "eagerness": "high"}):
        await client.update(audio={"input": {"turn_detection": turn}})
        await speak_24k(client, question)
        await client.until("response.done")
    return [event for _, event in client.log]  # session.created (voice_client read it) included


async def test_every_server_event_of_a_scripted_session_conforms_to_openais_schemas(schemas):
    config = ServerConfig(realtime=RealtimeConfig(ws_port=0))  # OpenAI's defaults: 24 kHz
    async with voice_server("rill-tiny", "rill-tiny-speech", config) as server, voice_client(server) as client:
        events = await scripted_session(client)
    types = {event["type"] for event in events}
    assert {"session.created", "session.updated", "conversation.item.added", "conversation.item.done",
            "response.function_call_arguments.done", "response.output_text.delta", "response.content_part.done",
            "conversation.item.retrieved", "conversation.item.deleted", "error", "input_audio_buffer.speech_started",
            "input_audio_buffer.committed", "conversation.item.input_audio_transcription.completed"} <= types, types
    found = [problem for event in events for problem in violations(schemas, event)]
    assert found == [], "\n".join(found)


def test_the_check_refuses_what_rill_sent_before_ga(schemas):
    """rill's pre-GA shapes, which the Agents SDK refused: an output_text content part, a 16 kHz session."""
    part = {"type": "response.content_part.added", "event_id": "e", "response_id": "r", "item_id": "i",
            "output_index": 0, "content_index": 0, "part": {"type": "output_text", "text": ""}}
    assert violations(schemas, part)
    assert not violations(schemas, {**part, "part": {"type": "text", "text": ""}})
    session = {"type": "session.created", "event_id": "e", "session": {
        "type": "realtime", "id": "s", "object": "realtime.session",
        "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16_000}}}}}
    assert violations(schemas, session)
    assert violations(schemas, {"type": "transcription.delta", "event_id": "e", "delta": "hi"})  # vLLM's, not GA's
