"""Live video over the realtime API on both listeners (/v1/realtime on the HTTP port and the raw
trio-websocket one), against a real server on a random-weight Qwen2-VL and a real trio-websocket client:
`input_video_frame.append` frames (PNG drawn here) and a question created after them answer as the
clip and question sent whole; `input_image` parts of conversation.item.create answer as the engine does
with the picture; a bad frame or picture gets an error event and the connection goes on; a text-only
model refuses both clearly; frames faster than the encoder are dropped (input_video_frame.dropped); a
dropped connection frees its KV, its feed and its tasks."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image

from helpers_live_video import FLASHES_QUESTION, LAST_DIGIT_QUESTION, light_clip, png_b64, whole_answer
from helpers_models import make_model_dir
from helpers_server import one_torch_thread, running_server, wait_for  # noqa: F401
from helpers_vision import make_vl_model_dir
from rill.live_video.config import LiveVideoConfig
from rill.media import load_image
from rill.multimodal.inputs import IMAGE
from rill.multimodal.qwen2_vl_inputs import VideoClip
from rill.sampling_params import SamplingParams
from rill.transports.http import ServerConfig
from rill.transports.realtime.driver import RealtimeConfig
from test_realtime_server import connect, hub, text_of

STATES = [False, True, True, False, True, False, False, True]
ANSWER = {"temperature": 0, "max_tokens": 6}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_vl_model_dir(tmp_path_factory.mktemp("qwen2_vl"), "qwen2_vl")


@pytest.fixture(params=["http", "raw"])
def listener(request) -> str:
    return request.param


def serve(model_dir, **live):
    config = ServerConfig(realtime=RealtimeConfig(ws_port=0), live_video=LiveVideoConfig(**live))
    return running_server(model_dir, config)


async def greedy(client) -> None:
    await client.update(temperature=0, max_response_output_tokens=6)


async def stream(client, frames, start_ms: int = 0) -> list[str]:
    return [await client.send("input_video_frame.append", image=png_b64(f), timestamp_ms=start_ms + 500 * i)
            for i, f in enumerate(frames)]


async def put_question(client, question: str) -> None:
    """A user text message, not waited for: with frames streaming into the open message it joins it."""
    await client.send("conversation.item.create", item={"type": "message", "role": "user",
                                                        "content": [{"type": "input_text", "text": question}]})


async def ask(client, question: str) -> list[dict]:
    await put_question(client, question)
    return await client.respond()


async def start_answer(client, frames, max_output_tokens: int) -> list[dict]:
    """Greedy; the frames, then the flashes question, and an answer started: its events up to its first delta."""
    await greedy(client)
    await stream(client, frames)
    await put_question(client, FLASHES_QUESTION)
    await client.send("response.create", response={"max_output_tokens": max_output_tokens})
    return await client.until("response.output_text.delta")


def data_url(pixels: np.ndarray) -> str:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


async def image_answer(server, url: str, question: str) -> str:
    """What the engine answers to one user message [picture, question], greedily."""
    serving = server.serving
    content = [{"type": "image"}, {"type": "text", "text": question}]
    ids = serving.tokenizer.encode(serving.tokenizer.apply_chat_template([{"role": "user", "content": content}]),
                                   add_special_tokens=False)
    item = serving.mm_inputs.item(IMAGE, load_image(url, serving.options.media, param="image_url"))
    ids, items = serving.mm_inputs.expand(ids, [item])
    text = ""
    async for delta in server.engine.generate(ids, SamplingParams(**ANSWER), mm_items=items):
        text += delta.text
    return text


async def chat_answer(server, history: list) -> str:
    """What the engine answers to a chat of user turns (clips, question) and assistant answers, greedily."""
    serving, messages, items = server.serving, [], []
    for turn in history:
        if isinstance(turn, str):
            messages.append({"role": "assistant", "content": turn})
            continue
        clips, question = turn
        messages.append({"role": "user", "content": [{"type": "video"}] * len(clips) + [{"type": "text",
                                                                                         "text": question}]})
        items += [serving.mm_inputs.item("video", VideoClip(np.stack(c), 2.0)) for c in clips]
    text = serving.tokenizer.apply_chat_template(messages)
    ids, items = serving.mm_inputs.expand(serving.tokenizer.encode(text, add_special_tokens=False), items)
    out = ""
    async for delta in server.engine.generate(ids, SamplingParams(**ANSWER), mm_items=items):
        out += delta.text
    return out


async def kv_and_feeds_free(server) -> None:
    await wait_for(lambda: server.all_kv_free and not server.engine.core.requests, seconds=10)
    await wait_for(lambda: hub(server).num_connections == 0 and server.serving.live_video.num_open_feeds == 0)


# -- frames and a question ---------------------------------------------------------------------------------------


async def test_streamed_frames_and_a_question_answer_as_the_whole_clip(model_dir, listener):
    frames = light_clip(STATES)
    async with serve(model_dir, max_waiting_frames=64) as server, connect(server, listener) as client:
        await greedy(client)
        await stream(client, frames)
        events = await ask(client, FLASHES_QUESTION)
        created = next(e for e in events if e["type"] == "conversation.item.added")
        assert [p["type"] for p in created["item"]["content"]] == ["input_video", "input_text"]
        assert created["item"]["content"][0]["num_frames"] == len(frames)
        assert text_of(events) == await whole_answer(server, frames, FLASHES_QUESTION, ANSWER)
        assert not [e for e in events if e["type"] == "error"]
        stats = server.serving.live_video
        assert stats.num_frames_appended == len(frames) and stats.num_frames_dropped == 0


async def test_the_question_streamed_as_text_answers_the_same(model_dir, listener):
    frames = light_clip(STATES[:6])
    async with serve(model_dir, max_waiting_frames=64) as server, connect(server, listener) as client:
        await greedy(client)
        await stream(client, frames)
        await client.send("input_text_buffer.append", delta=LAST_DIGIT_QUESTION)
        events = await client.respond()
        assert text_of(events) == await whole_answer(server, frames, LAST_DIGIT_QUESTION, ANSWER)


async def test_frames_after_an_answer_open_the_next_turn(model_dir, listener):
    first, second = light_clip(STATES[:4]), light_clip(STATES[4:])
    async with serve(model_dir, max_waiting_frames=64) as server, connect(server, listener) as client:
        await greedy(client)
        await stream(client, first)
        answer = text_of(await ask(client, FLASHES_QUESTION))
        await stream(client, second, start_ms=2000)
        events = await ask(client, LAST_DIGIT_QUESTION)
        assert server.serving.live_video.num_frames_appended == len(first) + len(second)
        # The second turn's prompt: the first turn's video and question, the answer, the new video and question.
        history = [([first], FLASHES_QUESTION), answer, ([second], LAST_DIGIT_QUESTION)]
        assert text_of(events) == await chat_answer(server, history)


# -- pictures ------------------------------------------------------------------------------------------------------


async def test_input_image_item_answers_as_the_engine_with_the_picture(model_dir, listener):
    url = data_url(light_clip([True])[0])
    async with serve(model_dir) as server, connect(server, listener) as client:
        await greedy(client)
        await client.send("conversation.item.create", item={
            "type": "message", "role": "user",
            "content": [{"type": "input_image", "image_url": url}, {"type": "input_text", "text": "What is red?"}]})
        created = (await client.until("conversation.item.added"))[-1]
        assert [p["type"] for p in created["item"]["content"]] == ["input_image", "input_text"]
        assert "image_url" not in created["item"]["content"][0]  # processed, not echoed back
        events = await client.respond()
        assert text_of(events) == await image_answer(server, url, "What is red?")


# -- errors ---------------------------------------------------------------------------------------------------------


async def test_bad_frames_and_pictures_get_error_events_and_the_stream_goes_on(model_dir, listener):
    frames = light_clip(STATES[:4])
    not_an_image = base64.b64encode(b"certainly not a PNG").decode()
    async with serve(model_dir, max_waiting_frames=64) as server, connect(server, listener) as client:
        await greedy(client)
        await stream(client, frames[:2])
        bad = [await client.send("input_video_frame.append", image="%%% not base64"),
               await client.send("input_video_frame.append", image=not_an_image),
               await client.send("input_video_frame.append", image=png_b64(frames[0]), timestamp_ms=10)]
        errors = [await client.error() for _ in bad]
        assert sorted(e["event_id"] for e in errors) == sorted(bad)
        assert {e["code"] for e in errors} <= {"invalid_image", "invalid_timestamp"}
        assert any(e["code"] == "invalid_timestamp" for e in errors)
        await stream(client, frames[2:], start_ms=1000)
        await client.send("conversation.item.create", item={
            "type": "message", "role": "user",
            "content": [{"type": "input_image", "image_url": "data:image/png;base64," + not_an_image}]})
        assert (await client.error())["code"] == "invalid_image"
        events = await ask(client, FLASHES_QUESTION)
        assert text_of(events) == await whole_answer(server, frames, FLASHES_QUESTION, ANSWER)
        assert server.serving.live_video.num_bad_frames >= 3


async def test_a_text_only_model_refuses_frames_and_pictures_clearly(tmp_path, listener):
    text_dir = make_model_dir(tmp_path / "mistral", "mistral")
    async with serve(text_dir) as server, connect(server, listener) as client:
        await client.send("input_video_frame.append", image=png_b64(light_clip([True])[0]))
        error = await client.error()
        assert error["code"] == "unsupported_modality" and "video" in error["message"]
        await client.send("conversation.item.create", item={
            "type": "message", "role": "user", "content": [{"type": "input_image", "image_url": data_url(
                light_clip([True])[0])}]})
        error = await client.error()
        assert error["code"] == "unsupported_modality" and error["param"] == "item.content[0].type"
        await client.say("text works")
        assert (await client.respond(max_output_tokens=1))[-1]["type"] == "response.done"


# -- pacing and cleanup ---------------------------------------------------------------------------------------------


async def test_frames_faster_than_the_encoder_are_dropped_and_told(model_dir, listener):
    frames = light_clip([i % 2 == 0 for i in range(24)])
    async with serve(model_dir, max_waiting_frames=1, max_frames_in_flight=2) as server, \
            connect(server, listener) as client:
        await greedy(client)
        await stream(client, frames)
        events = await ask(client, FLASHES_QUESTION)
        dropped = [e for e in events if e["type"] == "input_video_frame.dropped"]
        assert dropped and dropped[-1]["num_frames_dropped"] == max(e["num_frames_dropped"] for e in dropped)
        stats = server.serving.live_video
        assert stats.num_frames_dropped > 0
        assert stats.num_frames_appended + stats.num_frames_dropped == len(frames)
        assert events[-1]["type"] == "response.done" and not [e for e in events if e["type"] == "error"]


async def test_a_dropped_connection_frees_kv_feed_and_tasks(model_dir, listener):
    frames = light_clip([i % 3 == 0 for i in range(12)])
    async with serve(model_dir, max_waiting_frames=64) as server:
        async with connect(server, listener) as client:
            await greedy(client)
            await stream(client, frames)
            await wait_for(lambda: server.serving.live_video.num_frames_appended >= 4, seconds=30)
            assert not server.all_kv_free and server.serving.live_video.num_open_feeds == 1
        await kv_and_feeds_free(server)
        async with connect(server, listener) as client:  # the server goes on
            await greedy(client)
            await stream(client, frames[:2])
            assert text_of(await ask(client, FLASHES_QUESTION))
        await kv_and_feeds_free(server)


# -- more of the protocol: vLLM's commit, frames during an answer, limits at and past them -------------------------


async def test_vllm_commit_with_a_query_answers_as_the_whole_clip(model_dir, listener):
    frames = light_clip(STATES[:6])
    async with serve(model_dir, max_waiting_frames=64) as server, connect(server, listener) as client:
        await greedy(client)
        await stream(client, frames)
        await client.send("input_video_frame.commit", query=FLASHES_QUESTION)
        events = await client.until("response.done")
        assert text_of(events) == await whole_answer(server, frames, FLASHES_QUESTION, ANSWER)
        await client.send("input_video_frame.commit")  # nothing new to commit
        assert (await client.error())["code"] == "input_video_frame_commit_empty"


async def test_frames_sent_during_an_answer_wait_and_form_the_next_message(model_dir, listener):
    first, second = light_clip(STATES[:4]), light_clip(STATES[4:])
    async with serve(model_dir, max_waiting_frames=64) as server, connect(server, listener) as client:
        started = await start_answer(client, first, 48)
        await stream(client, second, start_ms=2000)  # while the first answer is on its way
        done = started + await client.until("response.done")
        assert done[-1]["response"]["usage"]["output_tokens"] > 2 * len(second)
        answer = text_of(done)
        events = await ask(client, LAST_DIGIT_QUESTION)
        history = [([first], FLASHES_QUESTION), answer, ([second], LAST_DIGIT_QUESTION)]
        assert text_of(events) == await chat_answer(server, history)


async def test_frames_need_a_session_that_answers_when_asked(model_dir, listener):
    async with serve(model_dir) as server, connect(server, listener) as client:
        await client.update(output_mode="respond_per_chunk")
        await client.send("input_video_frame.append", image=png_b64(light_clip([True])[0]))
        error = await client.error()
        assert error["code"] == "unsupported_modality" and error["param"] == "session.output_mode"
        await client.send("input_video_frame.append", image="", timestamp_ms=0)
        assert (await client.error())["code"] in ("unsupported_modality", "invalid_image")
        assert server.serving.live_video.num_feeds == 0


async def test_frame_fields_are_checked(model_dir, listener):
    async with serve(model_dir) as server, connect(server, listener) as client:
        for fields, code in (({"image": ""}, "invalid_image"), ({"image": "aGk=", "timestamp_ms": -1}, "invalid_value"),
                             ({"image": 7}, "invalid_type"), ({}, "missing_required_parameter")):
            await client.send("input_video_frame.append", **fields)
            assert (await client.error())["code"] == code, fields
        assert server.serving.live_video.num_frames_received == 0


async def test_a_frame_at_the_byte_limit_is_taken_and_one_past_it_refused(model_dir, listener):
    from rill.media.policy import MediaPolicy

    frame = light_clip([True])[0]
    size = len(base64.b64decode(png_b64(frame)))
    config = ServerConfig(realtime=RealtimeConfig(ws_port=0), media=MediaPolicy(max_media_bytes=size),
                          live_video=LiveVideoConfig(max_waiting_frames=64))
    async with running_server(model_dir, config) as server, connect(server, listener) as client:
        await greedy(client)
        bigger = light_clip([True, False], size=(90, 60))[1]
        assert len(base64.b64decode(png_b64(bigger))) > size
        await client.send("input_video_frame.append", image=png_b64(frame), timestamp_ms=0)
        await client.send("input_video_frame.append", image=png_b64(frame), timestamp_ms=500)
        refused = await client.send("input_video_frame.append", image=png_b64(bigger), timestamp_ms=1000)
        error = await client.error()
        assert (error["code"], error["event_id"]) == ("invalid_image", refused) and str(size) in error["message"]
        events = await ask(client, FLASHES_QUESTION)
        assert text_of(events) == await whole_answer(server, [frame, frame], FLASHES_QUESTION, ANSWER)


async def test_pictures_per_conversation_at_the_limit_and_past_it(model_dir, listener):
    urls = [data_url(f) for f in light_clip([True, False, True])]
    config = ServerConfig(realtime=RealtimeConfig(ws_port=0), limit_mm_per_prompt={"image": 2, "video": 1})
    async with running_server(model_dir, config) as server, connect(server, listener) as client:
        await greedy(client)
        for url in urls[:2]:
            await client.send("conversation.item.create", item={"type": "message", "role": "user",
                                                                "content": [{"type": "input_image", "image_url": url}]})
            assert (await client.until("conversation.item.done"))[-1]["item"]["content"][0]["type"] == "input_image"
        await client.send("conversation.item.create", item={"type": "message", "role": "user",
                                                            "content": [{"type": "input_image", "image_url": urls[2]}]})
        error = await client.error()
        assert error["code"] == "too_many_media" and "2" in error["message"]
        events = await client.respond()
        assert events[-1]["type"] == "response.done" and not [e for e in events if e["type"] == "error"]


async def test_an_item_inserted_before_the_streaming_message_reopens_it_with_its_frames(model_dir, listener):
    frames = light_clip(STATES[:6])
    async with serve(model_dir, max_waiting_frames=64) as server, connect(server, listener) as client:
        await greedy(client)
        await client.say("Hello")
        await stream(client, frames)
        await client.send("conversation.item.create", item={"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Watch this."}]}, previous_item_id="root")
        inserted = (await client.until("conversation.item.added"))[-1]
        assert inserted["previous_item_id"] is None  # first in the conversation, before the frames' message
        events = await ask(client, FLASHES_QUESTION)
        messages = [{"role": "user", "content": "Watch this."}, {"role": "user", "content": "Hello"},
                    {"role": "user", "content": [{"type": "video"}, {"type": "text", "text": FLASHES_QUESTION}]}]
        assert text_of(events) == await messages_answer(server, messages, [frames])


async def messages_answer(server, messages: list[dict], clips: list) -> str:
    serving = server.serving
    items = [serving.mm_inputs.item("video", VideoClip(np.stack(c), 2.0)) for c in clips]
    text = serving.tokenizer.apply_chat_template(messages)
    ids, items = serving.mm_inputs.expand(serving.tokenizer.encode(text, add_special_tokens=False), items)
    out = ""
    async for delta in server.engine.generate(ids, SamplingParams(**ANSWER), mm_items=items):
        out += delta.text
    return out


async def test_a_camera_across_many_turns_keeps_only_the_window_of_frames(model_dir, listener):
    """Frames, a question, an answer, again and again: older turns' videos leave the context through the
    window too (max_frames 4), so the engine session never holds more than the window's frames."""
    async with serve(model_dir, max_frames=4, rebase_frames=2, max_waiting_frames=64) as server, \
            connect(server, listener) as client:
        await greedy(client)
        stats, pad = server.serving.live_video, server.serving.mm_inputs.placeholder("video")
        in_context = []  # video placeholders in the engine's live session before each question
        for turn in range(4):
            await stream(client, light_clip(STATES[:6]), start_ms=10_000 * turn)
            await wait_for(lambda: stats.num_frames_appended == 6 * (turn + 1))
            in_context.append(max(seq.token_ids.count(pad) for seqs in server.engine.core.requests.values()
                                  for seq in seqs))
            events = await ask(client, FLASHES_QUESTION)
            assert events[-1]["type"] == "response.done" and not [e for e in events if e["type"] == "error"]
        # 3 placeholders a frame here (6 a piece of two): at most the window, a rebase's stride and the
        # frames in flight (a rebase waits for the last to take effect): 10 frames, of the 24 streamed.
        assert max(in_context) <= 3 * (4 + 2 + 4) < 3 * 24, in_context
        assert stats.num_frames_trimmed >= 24 - 10


async def test_text_typed_between_frames_during_an_answer_keeps_its_place_in_the_next_message(model_dir, listener):
    first, before, after = light_clip(STATES[:4]), light_clip(STATES[4:6]), light_clip(STATES[6:8])
    async with serve(model_dir, max_waiting_frames=64) as server, connect(server, listener) as client:
        started = await start_answer(client, first, 200)
        await stream(client, before, start_ms=2000)  # all while the answer is on its way
        await client.send("input_text_buffer.append", delta="And then:")
        await stream(client, after, start_ms=3000)
        done = started + await client.until("response.done")
        assert done[-1]["response"]["usage"]["output_tokens"] > 20  # long enough for the frames and text to come
        events = await ask(client, LAST_DIGIT_QUESTION)
        created = next(e for e in events if e["type"] == "conversation.item.added")
        assert [(p["type"], p.get("text")) for p in created["item"]["content"]] == [
            ("input_video", None), ("input_text", "And then:"), ("input_video", None),
            ("input_text", LAST_DIGIT_QUESTION)]
        messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": FLASHES_QUESTION}]},
                    {"role": "assistant", "content": text_of(done)},
                    {"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "And then:"},
                                                 {"type": "video"}, {"type": "text", "text": LAST_DIGIT_QUESTION}]}]
        assert text_of(events) == await messages_answer(server, messages, [first, before, after])


async def test_frames_then_a_commit_during_an_answer_form_the_next_message(model_dir, listener):
    first, during = light_clip(STATES[:4]), light_clip(STATES[4:8])
    async with serve(model_dir, max_waiting_frames=64) as server, connect(server, listener) as client:
        started = await start_answer(client, first, 200)
        await stream(client, during, start_ms=2000)
        await client.send("input_text_buffer.append", delta=LAST_DIGIT_QUESTION)
        await client.send("input_text_buffer.commit")
        done = started + await client.until("response.done")
        committed = await client.until("conversation.item.added")  # once the answer is over
        assert [p["type"] for p in committed[-1]["item"]["content"]] == ["input_video", "input_text"]
        events = await client.respond()
        history = [([first], FLASHES_QUESTION), text_of(done), ([during], LAST_DIGIT_QUESTION)]
        assert text_of(events) == await chat_answer(server, history)


async def test_truncation_keeps_the_pictures_of_the_turns_left_in_context(model_dir, listener):
    """A long conversation with a picture in its middle: the streamed message that needs room leaves out the
    oldest (text) turn, and the picture's turn, still in the context, is placed again with its picture."""
    url = data_url(light_clip([True])[0])

    def long_text(k: int) -> str:  # about 2,250 tokens; the test model's context is 4,096
        return " ".join(f"w{k}x{i}" for i in range(400))

    async with serve(model_dir) as server, connect(server, listener) as client:
        await greedy(client)
        await put_question(client, long_text(0))
        await client.until("conversation.item.added")
        await client.respond()
        await client.send("conversation.item.create", item={
            "type": "message", "role": "user",
            "content": [{"type": "input_image", "image_url": url}, {"type": "input_text", "text": "What is red?"}]})
        await client.until("conversation.item.added")
        seen = text_of(await client.respond())
        for piece in (long_text(1)[:900], long_text(1)[900:]):
            await client.send("input_text_buffer.append", delta=piece)
        events = await client.respond()
        serving = server.serving
        kept = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is red?"}]},
                {"role": "assistant", "content": seen}, {"role": "user", "content": long_text(1)}]
        ids = serving.tokenizer.encode(serving.tokenizer.apply_chat_template(kept), add_special_tokens=False)
        item = serving.mm_inputs.item(IMAGE, load_image(url, serving.options.media, param="image_url"))
        ids, items = serving.mm_inputs.expand(ids, [item])
        expected = ""
        async for delta in server.engine.generate(ids, SamplingParams(**ANSWER), mm_items=items):
            expected += delta.text
        assert events[-1]["response"]["usage"]["input_tokens"] == len(ids)
        assert text_of(events) == expected
    await kv_and_feeds_free(server)
