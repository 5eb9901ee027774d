"""`rill bench live-video`: a clip streamed at 2 frames a second over /v1/realtime, a question at its end,
against the same clip and question sent as one request; and the frame rate the server sustains.

`rill serve` runs in this process on 127.0.0.1 with a vision model: --model, a local Qwen2-VL /
Qwen2.5-VL directory, or rill-tiny-vision (the default; in a build without it, a random-weight stand-in of
its shape, said in the output: answers are noise, speed is what counts). The clip is drawn here: a red light
that flashes and a digit, --seconds long at --fps, new noise each round so no cache serves a frame twice.

    live        frames sent as `input_video_frame.append` at the clip's pace (--speed > 1 sends faster),
                then the question (conversation.item.create + response.create): time from the question's
                last byte to the first answer token. Frames are encoded and prefilled as they arrive.
    whole       the clip as an MP4 (`video_url`, sampled at 2 fps by the server, as transformers does)
                plus the question in one streamed /v1/chat/completions request: time to the first token.
    sustained   --burst-frames frames sent back to back, then a question: frames / (first answer token -
                first frame sent), a lower bound on what decode + vision encoder + prefill take per second.

Reported: p50 and each round of both first-token times, their ratio (target, issue 31: live <= 1/10 of
whole), frames dropped by the server's pacer (from /metrics), and the sustained frames/s.
"""

from __future__ import annotations

import base64
import io
import json
import re
import time
from pathlib import Path

import numpy as np

from rill.bench.common import add_common_args, default_cache_dir, percentile, progress, save_plot

NAME = "live-video"
TARGET_RATIO = 0.1
QUESTION = "How many times did the red light flash?"
EVENT_TIMEOUT_S = 300


def add_arguments(p) -> None:
    add_common_args(p, NAME)
    p.add_argument("--model", default="rill-tiny-vision", help="rill-tiny-vision | a Qwen2-VL directory "
                   "(default: %(default)s; a random-weight stand-in of its shape where the build lacks it)")
    p.add_argument("--seconds", type=float, default=16.0, help="clip length (default %(default)s: 32 frames at 2 "
                   "fps, what the whole request's sampler keeps)")
    p.add_argument("--fps", type=float, default=2.0, help="frames a second in the clip (default %(default)s)")
    p.add_argument("--size", default="224x168", help="frame WIDTHxHEIGHT (default %(default)s)")
    p.add_argument("--rounds", type=int, default=3, help="live and whole rounds (default %(default)s)")
    p.add_argument("--speed", type=float, default=1.0, help="send frames this many times faster than real time")
    p.add_argument("--burst-frames", type=int, default=32, help="frames of the sustained-rate run (default %(default)s)")
    p.add_argument("--max-tokens", type=int, default=8, help="answer tokens (default %(default)s)")


# -- the clip ---------------------------------------------------------------------------------------------


def draw_clip(num_frames: int, size: tuple[int, int], seed: int) -> list[np.ndarray]:
    """A red light that flashes (every third frame or so) and a digit that changes, on noise: RGB [H, W, 3]."""
    from PIL import Image, ImageDraw

    w, h = size
    rng = np.random.default_rng(seed)
    frames = []
    for i in range(num_frames):
        image = Image.fromarray(rng.integers(0, 60, (h, w, 3), dtype=np.uint8))
        draw = ImageDraw.Draw(image)
        r = min(w, h) // 5
        on = rng.random() < 0.35
        draw.ellipse((w // 3 - r, h // 2 - r, w // 3 + r, h // 2 + r), fill=(230, 20, 20) if on else (70, 70, 70))
        draw.text((2 * w // 3, h // 2 - 6), str(int(rng.integers(0, 10))), fill=(255, 255, 255))
        frames.append(np.asarray(image))
    return frames


def png_b64(frame: np.ndarray) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(frame).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def mp4_data_url(frames: list[np.ndarray], fps: float) -> str:
    import av

    buf = io.BytesIO()
    h, w = frames[0].shape[:2]
    with av.open(buf, "w", format="mp4") as container:
        stream = container.add_stream("mpeg4", rate=round(fps))
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())
    return "data:video/mp4;base64," + base64.b64encode(buf.getvalue()).decode()


# -- the two sides ------------------------------------------------------------------------------------------


async def _send(ws, type_: str, **fields) -> None:
    await ws.send_message(json.dumps({"type": type_, **fields}))


async def _answer(ws, asked: list[float]) -> tuple[float, str]:
    """(seconds from the question to the first answer token, the answer) once response.done comes."""
    import trio

    first, text = None, ""
    with trio.fail_after(EVENT_TIMEOUT_S):
        while True:
            event = json.loads(await ws.get_message())
            if event["type"] == "response.output_text.delta":
                first = first or time.perf_counter()
                text += event["delta"]
            elif event["type"] == "error":
                raise RuntimeError(f"the server said: {event['error']}")
            elif event["type"] == "response.done":
                return (first or time.perf_counter()) - asked[0], text


async def live_round(url: str, frames: list[np.ndarray], args, pace_s: float) -> dict:
    """Frames at pace_s apart (0: back to back), then the question; times measured at the client."""
    import trio
    from trio_websocket import open_websocket_url

    payloads = [png_b64(f) for f in frames]  # encoded before the clock starts, as a camera's encoder would
    async with open_websocket_url(url, message_queue_size=256) as ws:
        assert json.loads(await ws.get_message())["type"] == "session.created"
        await _send(ws, "session.update", session={"temperature": 0, "max_response_output_tokens": args.max_tokens})
        start = time.perf_counter()
        for i, payload in enumerate(payloads):
            await trio.sleep_until(trio.current_time() + max(0.0, start + i * pace_s - time.perf_counter()))
            await _send(ws, "input_video_frame.append", image=payload, timestamp_ms=round(1000 * i / args.fps))
        await trio.sleep_until(trio.current_time() + max(0.0, start + len(payloads) * pace_s - time.perf_counter()))
        await _send(ws, "conversation.item.create", item={"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": QUESTION}]})
        await _send(ws, "response.create")
        asked = [time.perf_counter()]
        first_token_s, text = await _answer(ws, asked)
        return {"first_token_s": first_token_s, "text": text, "since_first_frame_s": asked[0] + first_token_s - start}


async def whole_round(base: str, model: str, frames: list[np.ndarray], args) -> dict:
    import httpx

    body = {"model": model, "stream": True, "temperature": 0, "max_tokens": args.max_tokens, "messages": [
        {"role": "user", "content": [{"type": "video_url", "video_url": {"url": mp4_data_url(frames, args.fps)}},
                                     {"type": "text", "text": QUESTION}]}]}
    async with httpx.AsyncClient(base_url=base, timeout=EVENT_TIMEOUT_S) as client:
        start, first, text = time.perf_counter(), None, ""
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                raise RuntimeError(f"the whole request failed: {response.status_code} {await response.aread()}")
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                delta = json.loads(line[6:])["choices"][0]["delta"].get("content")
                if delta:
                    first = first or time.perf_counter()
                    text += delta
    return {"first_token_s": (first or time.perf_counter()) - start, "text": text}


async def frames_dropped(base: str) -> int:
    import httpx

    async with httpx.AsyncClient(base_url=base) as client:
        text = (await client.get("/metrics")).text
    match = re.search(r"^rill_live_video_frames_dropped(?:_total)? (\S+)$", text, re.M)
    return int(float(match.group(1))) if match else 0


async def _serve_and_measure(model_dir: Path, args) -> dict:
    import trio

    from rill.config import EngineConfig
    from rill.live_video.config import LiveVideoConfig
    from rill.server import serve
    from rill.transports.http import ServerConfig

    size = tuple(int(v) for v in args.size.lower().split("x"))
    num_frames = max(2, round(args.seconds * args.fps))
    live = LiveVideoConfig(max_frames=max(32, num_frames, args.burst_frames),
                           max_waiting_frames=max(2, args.burst_frames))  # the burst waits whole, nothing dropped
    config = EngineConfig(model=str(model_dir), dtype="float32", seed=args.seed)
    stop = trio.Event()
    out: dict = {"live": [], "whole": [], "num_frames": num_frames}
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(lambda task_status: serve(
            config, ServerConfig(live_video=live), "127.0.0.1", 0, 1.0, shutdown_trigger=stop.wait,
            task_status=task_status))
        base = binds[0]
        url = base.replace("http://", "ws://") + "/v1/realtime"
        try:
            warm = draw_clip(2, size, args.seed + 10_000)
            await live_round(url, warm, args, 0.0)  # warm-up, not timed
            await whole_round(base, str(model_dir), warm, args)
            for r in progress(range(args.rounds), desc="live-video: live and whole rounds", disable=args.no_progress):
                clip = draw_clip(num_frames, size, args.seed + 2 * r + 1)
                out["live"].append(await live_round(url, clip, args, 1 / (args.fps * args.speed)))
                out["whole"].append(await whole_round(base, str(model_dir), draw_clip(num_frames, size,
                                                                                      args.seed + 2 * r + 2), args))
            out["dropped_in_live_rounds"] = await frames_dropped(base)
            burst = draw_clip(args.burst_frames, size, args.seed + 20_000)
            with progress(total=1, desc="live-video: sustained rate", disable=args.no_progress) as bar:
                out["burst"] = await live_round(url, burst, args, 0.0)
                bar.update()
            return out
        finally:
            stop.set()


# -- the run -------------------------------------------------------------------------------------------------


def run(args) -> dict:
    import trio

    from rill.bench.vision_set import resolve_model

    if min(args.rounds, args.burst_frames, args.max_tokens) < 1 or args.fps <= 0 or args.speed <= 0:
        raise SystemExit("--rounds, --burst-frames and --max-tokens must be at least 1; --fps and --speed > 0")
    cache = args.cache_dir if args.cache_dir is not None else default_cache_dir()
    model_dir, note = resolve_model(args.model, cache, args.seed)
    if note:
        print(f"note: {note}", flush=True)
    m = trio.run(_serve_and_measure, model_dir, args)
    live_ms = [1000 * r["first_token_s"] for r in m["live"]]
    whole_ms = [1000 * r["first_token_s"] for r in m["whole"]]
    ratio = percentile(live_ms, 50) / percentile(whole_ms, 50)
    burst = m["burst"]
    return {
        "config": {"model": args.model, "model_dir": str(model_dir), "random_weights": note is not None, "note": note,
                   "seconds": args.seconds, "fps": args.fps, "frames": m["num_frames"], "size": args.size,
                   "rounds": args.rounds, "speed": args.speed, "burst_frames": args.burst_frames,
                   "max_tokens": args.max_tokens, "question": QUESTION},
        "first_token_ms": {"live_p50": percentile(live_ms, 50), "whole_p50": percentile(whole_ms, 50),
                           "live": live_ms, "whole": whole_ms},
        "ratio_live_over_whole": ratio,
        "target_ratio": TARGET_RATIO,
        "target_met": ratio <= TARGET_RATIO,
        "frames_dropped_in_live_rounds": m["dropped_in_live_rounds"],
        "sustained_frames_per_s": args.burst_frames / burst["since_first_frame_s"],
        "answers": {"live": [r["text"] for r in m["live"]], "whole": [r["text"] for r in m["whole"]]},
    }


def summary(result: dict) -> str:
    c, first = result["config"], result["first_token_ms"]
    return "\n".join([
        f"live-video: {c['frames']} frames ({c['seconds']:g} s at {c['fps']:g} fps, {c['size']}) streamed "
        f"{c['speed']:g}x real time, model {c['model']} ({c['model_dir']}), {c['rounds']} rounds, torch threads "
        f"{result.get('torch_threads', '?')}",
        f"  question -> first token (p50): live {first['live_p50']:.0f} ms, whole clip + question "
        f"{first['whole_p50']:.0f} ms: ratio {result['ratio_live_over_whole']:.3f} (target <= {TARGET_RATIO})",
        f"  frames dropped while streaming: {result['frames_dropped_in_live_rounds']}; sustained "
        f"{result['sustained_frames_per_s']:.1f} frames/s ({c['burst_frames']} frames back to back, decode + "
        "encoder + prefill)",
    ])


def plot(result: dict, path) -> None:
    def draw(axes):
        first = result["first_token_ms"]
        bars = axes[0].bar(["live (streamed)", "whole clip"], [first["live_p50"], first["whole_p50"]],
                           color=["tab:green", "tab:grey"])
        axes[0].bar_label(bars, labels=[f"{v:.0f}" for v in (first["live_p50"], first["whole_p50"])], fontsize=8)
        axes[0].set_ylabel("question -> first answer token, ms (p50)")
        rounds = range(1, len(first["live"]) + 1)
        axes[1].plot(rounds, first["live"], marker="o", label="live")
        axes[1].plot(rounds, first["whole"], marker="o", label="whole clip")
        axes[1].set_xticks(list(rounds))
        axes[1].set_xlabel("round")
        axes[1].set_ylabel("first token, ms")
        axes[1].set_yscale("log")
        axes[1].legend(fontsize=8)

    c = result["config"]
    save_plot(Path(path), draw, ncols=2, title=f"rill bench live-video: {c['frames']} frames at {c['fps']:g} fps, "
              f"{result['sustained_frames_per_s']:.1f} frames/s sustained")
