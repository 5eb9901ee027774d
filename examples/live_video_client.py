"""Stream a video file (or a camera) into rill's realtime WebSocket API at its real frame rate, and ask
questions about it typed on stdin. Each frame goes as an `input_video_frame.append` event (a JPEG or PNG,
base64, with its timestamp_ms); rill encodes and prefills frames as they arrive, so an answer starts about
one engine step after the question, whatever the camera has shown so far. Frames older than the server's
window (--live-video-max-frames) leave the context, so the stream may run for hours.

    rill serve --model ./qwen2-vl-2b                      # /v1/realtime on port 8000; a Qwen2-VL model
    python examples/live_video_client.py clip.mp4 --fps 2 # then type: How many times did the light flash?
    python examples/live_video_client.py --camera /dev/video0 --fps 2        # Linux (v4l2)
    python examples/live_video_client.py --camera 0 --camera-format avfoundation   # macOS
    python examples/live_video_client.py --camera testsrc=rate=30 --camera-format lavfi   # FFmpeg's test source
    echo "What digit was shown last?" | python examples/live_video_client.py clip.mp4 --ask-at-end

Needs PyAV (`pip install av`) and trio-websocket. Frames are sent at the clip's own pace: `--fps` takes
every n-th frame so that at most that many go per second (the server samples nothing itself).
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import sys
import time

import av
import trio
from PIL import Image
from trio_websocket import open_websocket_url


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("video", nargs="?", help="a video file PyAV can open (MP4, WebM, MKV, ...)")
    p.add_argument("--camera", help="a camera device PyAV can open instead of a file (/dev/video0, 0, video=Name)")
    p.add_argument("--camera-format", default="v4l2", help="PyAV input format of --camera: v4l2, avfoundation, dshow")
    p.add_argument("--url", default="ws://127.0.0.1:8000/v1/realtime")
    p.add_argument("--api-key", default=os.environ.get("RILL_API_KEY"))
    p.add_argument("--fps", type=float, default=2.0, help="frames sent per second at most (every n-th frame)")
    p.add_argument("--max-side", type=int, default=0, help="scale frames down to this longest side (0: as they are)")
    p.add_argument("--image-format", choices=("jpeg", "png"), default="jpeg")
    p.add_argument("--loop", action="store_true", help="start the file again at its end (a camera that stays on)")
    p.add_argument("--ask-at-end", action="store_true", help="read questions only once the file has been sent "
                   "(for piped stdin); the client exits after the last answer")
    p.add_argument("--instructions", default="")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--max-tokens", type=int, default=64)
    args = p.parse_args(argv)
    if (args.video is None) == (args.camera is None):
        p.error("give a video file or --camera")
    return args


# -- frames ---------------------------------------------------------------------------------------------------------


def open_source(args: argparse.Namespace):
    if args.camera is not None:
        return av.open(args.camera, format=args.camera_format)
    return av.open(args.video)


def frames(args: argparse.Namespace):
    """(time_s, RGB PIL image) of the frames to send, at most args.fps a second, in the source's time."""
    offset_s, next_s = 0.0, 0.0
    while True:
        with open_source(args) as container:
            stream = container.streams.video[0]
            first_s = last_s = None  # a camera's clock starts anywhere: times count from its first frame
            for frame in container.decode(stream):
                pts_s = float(frame.time) if frame.time is not None else last_s or 0.0
                first_s = pts_s if first_s is None else first_s
                last_s = pts_s
                time_s = offset_s + pts_s - first_s
                if time_s + 1e-6 < next_s:
                    continue
                next_s = time_s + 1 / args.fps
                yield time_s, frame.to_image()
        if not args.loop or args.camera is not None:
            return
        offset_s = next_s


def encode(image: Image.Image, args: argparse.Namespace) -> str:
    if args.max_side and max(image.size) > args.max_side:
        image.thumbnail((args.max_side, args.max_side))
    buf = io.BytesIO()
    image.save(buf, format=args.image_format.upper(), **({"quality": 85} if args.image_format == "jpeg" else {}))
    return base64.b64encode(buf.getvalue()).decode()


async def stream_frames(ws, args: argparse.Namespace, done: trio.Event) -> None:
    """Send each frame when its time comes (the source's clock against ours), decoding off the trio thread."""
    source = frames(args)
    start = time.perf_counter()
    num_sent = 0
    while True:
        item = await trio.to_thread.run_sync(next, source, None)
        if item is None:
            break
        time_s, image = item
        payload = await trio.to_thread.run_sync(encode, image, args)
        await trio.sleep_until(trio.current_time() + max(0.0, start + time_s - time.perf_counter()))
        await send(ws, "input_video_frame.append", image=payload, timestamp_ms=round(1000 * time_s))
        num_sent += 1
    print(f"[{num_sent} frames sent]", file=sys.stderr)
    done.set()


# -- questions and answers ----------------------------------------------------------------------------------------


async def send(ws, type_: str, **fields) -> None:
    await ws.send_message(json.dumps({"type": type_, **fields}))


async def ask_questions(ws, args: argparse.Namespace, video_done: trio.Event, answered, asked: list) -> None:
    if args.ask_at_end:
        await video_done.wait()
    while True:
        line = await trio.to_thread.run_sync(sys.stdin.readline)
        if not line:
            return
        question = line.strip()
        if not question:
            continue
        await send(ws, "conversation.item.create", item={
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": question}]})
        await send(ws, "response.create")
        asked.append(time.perf_counter())
        await answered.receive()  # one question at a time


async def print_events(ws, answered, asked: list) -> None:
    first = None
    while True:
        event = json.loads(await ws.get_message())
        kind = event["type"]
        if kind in ("response.output_text.delta", "response.text.delta"):
            first = first or time.perf_counter()
            print(event["delta"], end="", flush=True)
        elif kind == "input_video_frame.dropped":
            print(f"[{event['num_frames_dropped']} frames dropped so far: the encoder is behind]", file=sys.stderr)
        elif kind == "error":
            print(f"[error {event['error']['code']}] {event['error']['message']}", file=sys.stderr)
        elif kind == "response.done":
            usage = event["response"]["usage"]
            ttft = f"{1000 * (first - asked[-1]):.0f} ms" if first and asked else "-"
            print(flush=True)
            print(f"[{usage['input_tokens']} tokens in, {usage['output_tokens']} out; first token {ttft} after "
                  "the question]", file=sys.stderr)
            first = None
            await answered.send(None)


async def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    headers = [(b"authorization", f"Bearer {args.api_key}".encode())] if args.api_key else []
    async with open_websocket_url(args.url, extra_headers=headers, message_queue_size=64) as ws:
        created = json.loads(await ws.get_message())
        assert created["type"] == "session.created", created
        await send(ws, "session.update", session={"instructions": args.instructions, "temperature": args.temperature,
                                                  "max_response_output_tokens": args.max_tokens})
        answered_send, answered = trio.open_memory_channel(1)
        video_done, asked = trio.Event(), []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(print_events, ws, answered_send, asked)
            nursery.start_soon(stream_frames, ws, args, video_done)
            await ask_questions(ws, args, video_done, answered, asked)
            nursery.cancel_scope.cancel()  # stdin ended: the last answer is in


if __name__ == "__main__":
    trio.run(main)
