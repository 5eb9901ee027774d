"""A camera left on: frames at 2 fps with their timestamps, sent as fast as the server takes them (a
simulated stream sped up), over /v1/realtime into a random-weight Qwen2-VL. The context keeps its window
(max_frames 16, rebased 8 at a time), so the KV blocks in use stay flat however long the stream runs;
a question at the end is answered over the window only; closing the connection frees everything.
Five simulated minutes run by default; the full hour (7,200 frames) is marked slow."""

from __future__ import annotations

import pytest
import trio

from helpers_live_video import FLASHES_QUESTION, light_clip, png_b64
from helpers_server import one_torch_thread, running_server, wait_for  # noqa: F401
from helpers_vision import make_vl_model_dir
from rill.live_video.config import LiveVideoConfig
from rill.transports.http import ServerConfig
from rill.transports.realtime.driver import RealtimeConfig
from test_realtime_server import connect, hub

FPS = 2
MAX_FRAMES, REBASE_FRAMES = 16, 8
AHEAD = 6  # frames the client may send past those in the prompt (the server's inbox holds them all)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_vl_model_dir(tmp_path_factory.mktemp("qwen2_vl"), "qwen2_vl")


async def run_stream(model_dir, minutes: float) -> None:
    num_frames = int(minutes * 60 * FPS)
    payloads = [png_b64(f) for f in light_clip([i % 3 == 0 for i in range(12)])]  # a camera repeats itself
    live = LiveVideoConfig(max_frames=MAX_FRAMES, rebase_frames=REBASE_FRAMES, max_waiting_frames=AHEAD + 2)
    config = ServerConfig(realtime=RealtimeConfig(ws_port=0, ping_interval_s=None), live_video=live)
    async with running_server(model_dir, config) as server:
        stats, bm = server.serving.live_video, server.engine.core.block_manager
        used, tokens = [], []  # after each frame: KV blocks in use, the live session's tokens
        async with connect(server, "raw") as client:
            await client.update(temperature=0, max_response_output_tokens=4)
            with trio.fail_after(60 + minutes * 60):
                for i in range(num_frames):
                    await client.send("input_video_frame.append", image=payloads[i % len(payloads)],
                                      timestamp_ms=1000 * i // FPS)
                    await wait_for(lambda: stats.num_frames_appended >= i + 1 - AHEAD, seconds=30, poll_s=0.002)
                    used.append(bm.num_used_blocks)
                    tokens.append(max((s.num_tokens for seqs in server.engine.core.requests.values() for s in seqs),
                                      default=0))
            await client.send("conversation.item.create", item={"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": FLASHES_QUESTION}]})
            events = await client.respond()
            assert events[-1]["type"] == "response.done" and not [e for e in events if e["type"] == "error"]
            window_tokens = events[-1]["response"]["usage"]["input_tokens"]
        assert stats.num_frames_appended == num_frames and stats.num_frames_dropped == 0
        assert stats.num_rebases >= (num_frames - MAX_FRAMES) // REBASE_FRAMES - 2
        assert server.engine.stats.num_rebased >= stats.num_rebases - 1
        # Flat: no more KV in use late in the stream than within its first minute, and the last prompt
        # holds a window of frames, not the stream (a frame of 84x56 is 3 tokens here: 2 frames a piece of 6).
        # Flat: per simulated minute, the peak of KV blocks in use (a rebase's shadow prefill beside the live
        # session included) and of the session's tokens is no higher than in the first minute, one block
        # of slack for where block boundaries fall; the whole stream unwindowed would need ~8x the blocks.
        per_minute = 60 * FPS
        block_peaks = [max(used[i:i + per_minute]) for i in range(0, num_frames, per_minute)]
        token_peaks = [max(tokens[i:i + per_minute]) for i in range(0, num_frames, per_minute)]
        print(f"{num_frames} frames, {stats.num_rebases} rebases, last prompt {window_tokens} tokens; per minute: "
              f"peak KV blocks {block_peaks}, peak session tokens {token_peaks}")
        assert max(block_peaks) <= block_peaks[0] + 1, block_peaks
        assert max(token_peaks) <= token_peaks[0] + 3 * AHEAD, token_peaks
        assert max(used) * bm.block_size * 8 < 3 * num_frames
        assert window_tokens < 3 * (MAX_FRAMES + REBASE_FRAMES + AHEAD) + 200 < 3 * num_frames
        await wait_for(lambda: server.all_kv_free and not server.engine.core.requests, seconds=10)
        await wait_for(lambda: hub(server).num_connections == 0 and stats.num_open_feeds == 0)


async def test_five_simulated_minutes_hold_flat_kv(model_dir):
    await run_stream(model_dir, 5)


@pytest.mark.slow
async def test_a_simulated_hour_at_two_fps_holds_flat_kv(model_dir):
    await run_stream(model_dir, 60)
