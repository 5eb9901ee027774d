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
        tokens = []  # after each frame: the live session's tokens
        block_peaks = []  # per simulated minute: the high-water mark of KV blocks in use, every step counted
        per_minute = 60 * FPS
        async with connect(server, "raw") as client:
            await client.update(temperature=0, max_response_output_tokens=4)
            with trio.fail_after(60 + minutes * 60):
                bm.reset_peak()
                for i in range(num_frames):
                    if i and i % per_minute == 0:
                        block_peaks.append(bm.reset_peak())
                    await client.send("input_video_frame.append", image=payloads[i % len(payloads)],
                                      timestamp_ms=1000 * i // FPS)
                    await wait_for(lambda: stats.num_frames_appended >= i + 1 - AHEAD, seconds=30, poll_s=0.002)
                    tokens.append(max((s.num_tokens for seqs in server.engine.core.requests.values() for s in seqs),
                                      default=0))
                block_peaks.append(bm.reset_peak())
            await client.send("conversation.item.create", item={"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": FLASHES_QUESTION}]})
            events = await client.respond()
            assert events[-1]["type"] == "response.done" and not [e for e in events if e["type"] == "error"]
            window_tokens = events[-1]["response"]["usage"]["input_tokens"]
        assert stats.num_frames_appended == num_frames and stats.num_frames_dropped == 0
        assert stats.num_rebases >= (num_frames - MAX_FRAMES) // REBASE_FRAMES - 2
        assert server.engine.stats.num_rebased >= stats.num_rebases - 1
        # Flat: per simulated minute, the high-water mark of KV blocks in use (a rebase's shadow prefill
        # beside the live session included: every minute holds several rebases, so every minute's mark
        # counts one) and the peak of the session's tokens are no higher than in the first minute, with
        # slack for where block boundaries and the frames ahead fall; the last prompt holds a window of
        # frames, not the stream (a frame of 84x56 is 3 tokens here: 2 frames a piece of 6); the whole
        # stream unwindowed would need ~8x the blocks. Sampling blocks in use after each frame instead
        # missed the shadow in some minutes and not in others (CI: [7, 11, 7, 11, 7]).
        token_peaks = [max(tokens[i:i + per_minute]) for i in range(0, num_frames, per_minute)]
        print(f"{num_frames} frames, {stats.num_rebases} rebases, last prompt {window_tokens} tokens; per minute: "
              f"peak KV blocks {block_peaks}, peak session tokens {token_peaks}")
        assert len(block_peaks) == -(-num_frames // per_minute)
        assert max(block_peaks) <= block_peaks[0] + 2, block_peaks
        live_blocks = -(-max(tokens) // bm.block_size)
        assert max(block_peaks) <= 2 * live_blocks + 2, (block_peaks, live_blocks)  # live session + shadow
        assert max(token_peaks) <= token_peaks[0] + 3 * AHEAD, token_peaks
        assert max(block_peaks) * bm.block_size * 8 < 3 * num_frames
        assert window_tokens < 3 * (MAX_FRAMES + REBASE_FRAMES + AHEAD) + 200 < 3 * num_frames
        await wait_for(lambda: server.all_kv_free and not server.engine.core.requests, seconds=10)
        await wait_for(lambda: hub(server).num_connections == 0 and stats.num_open_feeds == 0)


async def test_five_simulated_minutes_hold_flat_kv(model_dir):
    await run_stream(model_dir, 5)


@pytest.mark.slow
async def test_a_simulated_hour_at_two_fps_holds_flat_kv(model_dir):
    await run_stream(model_dir, 60)
