"""`rill bench voice`: spoken questions streamed at real-time pace over /v1/realtime into `rill serve`
(rill-tiny-speech + rill-tiny by default), in this process on 127.0.0.1.

Measured, over the held-out espeak-ng questions of `rill bench transcribe` (rill.bench.speech_set):
- transcript lag: for each committed word, its arrival less the moment its audio had been sent. A
  word's end in the clip comes from espeak-ng itself: the clip's words are said again one prefix at a
  time with the same voice, and the end of the prefix's last sound is the word's end. Audio goes up
  as a microphone sends it: the 100 ms that ends at time t is sent at t. Words are matched by their
  order, so the figure is only meaningful where the transcript is right (`exact` says how often).
- end of speech to the first answer token: with server VAD (default silence 500 ms: the figure
  includes it, and is also given less it), with a manual commit right after the last audio, and the
  baseline: the whole recording to /v1/audio/transcriptions, then its text to
  /v1/chat/completions (stream), timed from the same moment.
- concurrent streams: N clients at once, each speaking its questions back to back in a
  transcription session; N streams keep up when their turns' transcripts are complete within
  `--keep-up-ms` of the VAD's end of turn (p95) and half their words within `--keep-up-ms` of being
  said (lag p50): a recogniser that falls behind real time lets both grow without bound. (Not the
  lag's p95: the commit policy alone holds a few words longer, a number until three passes agree,
  so it passes 1 s with a single stream.)

Targets (DESIGN.md): lag p50 < 500 ms; first token <= 1/5 of the baseline (manual commit) and
< silence + 150 ms (server VAD); 8 concurrent streams keep up. Reported here, never asserted.
"""

from __future__ import annotations

import base64
import json
import statistics
import subprocess
import time
from contextlib import asynccontextmanager
from pathlib import Path

import numpy as np

from rill.bench import voice_spoken
from rill.bench.common import add_common_args, default_cache_dir, percentile, progress, save_plot
from rill.bench.speech_set import Clip, load_audio_set

NAME = "voice"
CHUNK_S = 0.1
LEAD_S = 0.3  # silence before each question
RATE = 16_000
LOUD = 1e-3  # |amplitude| above this is sound (rill.tiny_speech.synth's silence floor)
EVENT_TIMEOUT_S = 120


def add_arguments(p) -> None:
    add_common_args(p, NAME)
    p.add_argument("--llm", default="rill-tiny", help="the LLM: rill-tiny or a directory (default %(default)s)")
    p.add_argument("--speech-model", default="rill-tiny-speech", help="rill-tiny-speech or a Whisper directory")
    p.add_argument("--n", type=int, default=16, help="questions (default %(default)s)")
    p.add_argument("--streams", default="1,2,4,8", help="concurrent stream counts (default %(default)s)")
    p.add_argument("--silence-ms", type=int, default=500, help="server VAD's silence_duration_ms")
    p.add_argument("--keep-up-ms", type=float, default=1000.0, help="lag bound of a stream that keeps up")
    p.add_argument("--max-tokens", type=int, default=24, help="answer length")
    p.add_argument("--spoken-sessions", default="1,8", help="concurrent sessions whose answers are spoken, timed to "
                   "the first audio byte against transcribe-chat-speak (rill.bench.voice_spoken; '' skips it)")
    p.add_argument("--voices", default="espeak,kokoro", help="the voices of the spoken half, each on a server of its "
                   "own: espeak (the default voice), kokoro (a random-weight Kokoro of --kokoro-shape, made once in "
                   "the cache) or a Kokoro directory (default %(default)s)")
    p.add_argument("--kokoro-shape", default="kokoro-82m", help="the random Kokoro's shape (default %(default)s)")
    p.add_argument("--spoken-only", action="store_true", help="measure only the spoken half (skip transcript lag, "
                   "first token and concurrent streams)")


# -- word times -----------------------------------------------------------------------------------------


def sound_end_s(audio: np.ndarray) -> float:
    loud = np.flatnonzero(np.abs(audio) > LOUD)
    return (loud[-1] + 1) / RATE if len(loud) else 0.0


def word_ends_s(clip: Clip, voice_args: list[str]) -> list[float]:
    """The end of each spoken word in the clip, in seconds (espeak-ng says each prefix again)."""
    from rill.speech.audio import load_audio

    words = clip_words(clip)
    ends = []
    for k in range(1, len(words) + 1):
        wav = subprocess.run(["espeak-ng", *voice_args, "--stdout", " ".join(words[:k])], capture_output=True,
                             check=True, timeout=20).stdout
        ends.append(sound_end_s(load_audio(wav)))
    ends[-1] = sound_end_s(clip.audio)
    return ends


def clip_words(clip: Clip) -> list[str]:
    return clip.text.split()


def manifest_voices(clips: list[Clip]) -> list[list[str]]:
    manifest = json.loads((clips[0].path.parent / "manifest.json").read_text(encoding="utf-8"))
    return [entry["voice"] for entry in manifest[:len(clips)]]


# -- a realtime client ----------------------------------------------------------------------------------


def b64(samples: np.ndarray) -> str:
    return base64.b64encode((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()).decode()


class Turn:
    """What one spoken question got, with arrival times (trio clock, seconds)."""

    def __init__(self):
        self.deltas: list[tuple[float, str]] = []
        self.completed_s: float | None = None
        self.transcript = ""
        self.first_token_s: float | None = None
        self.done_s: float | None = None
        self.answer = ""


async def speak(ws, audio: np.ndarray) -> float:
    """Send `audio` as a microphone would (each 100 ms when it has been spoken); the start time."""
    import trio

    start = trio.current_time()
    step = int(CHUNK_S * RATE)
    for at in range(0, len(audio), step):
        await trio.sleep_until(start + min(at + step, len(audio)) / RATE)  # a piece goes once it has been said
        await ws.send_message(json.dumps({"type": "input_audio_buffer.append", "audio": b64(audio[at:at + step])}))
    return start


async def read_turns(ws, turns: list[Turn], until: str) -> None:
    """Events into `turns` (one per completed transcript) until `until` has come len(turns) times."""
    import trio

    index, count = 0, 0
    with trio.fail_after(EVENT_TIMEOUT_S):
        while count < len(turns):
            event = json.loads(await ws.get_message())
            now, kind = trio.current_time(), event["type"]
            turn = turns[min(index, len(turns) - 1)]
            if kind == "conversation.item.input_audio_transcription.delta":
                turn.deltas.append((now, event["delta"]))
            elif kind == "conversation.item.input_audio_transcription.completed":
                turn.completed_s, turn.transcript = now, event["transcript"]
                index += 1
            elif kind == "response.output_text.delta":
                turns[index - 1].first_token_s = turns[index - 1].first_token_s or now
                turns[index - 1].answer += event["delta"]
            elif kind == "response.done":
                turns[index - 1].done_s = now
            elif kind == "error":
                raise RuntimeError(f"error event: {event['error']}")
            if kind == until:
                count += 1


async def session(url: str, settings: dict):
    """realtime_session entered by hand, for callers that close it themselves: (its context, the socket)."""
    ws_cm = realtime_session(url, settings)
    return ws_cm, await ws_cm.__aenter__()


@asynccontextmanager
async def realtime_session(url: str, settings: dict):
    """A /v1/realtime session with `settings` applied; the socket closes (and its answer with it) when the block
    ends, however it ends."""
    from trio_websocket import open_websocket_url

    settings = {"input_audio_format": {"type": "audio/pcm", "rate": 16_000}, **settings}  # the speech sent is 16 kHz
    async with open_websocket_url(url) as ws:
        assert json.loads(await ws.get_message())["type"] == "session.created"
        await ws.send_message(json.dumps({"type": "session.update", "session": settings}))
        assert json.loads(await ws.get_message())["type"] == "session.updated"
        yield ws


def vad(silence_ms: int) -> dict:
    return {"type": "server_vad", "silence_duration_ms": silence_ms}


# -- the measurements ----------------------------------------------------------------------------------


async def one_turn(url: str, clip: Clip, args, manual: bool) -> tuple[Turn, float, float]:
    """One question in a realtime session: what came back, when speech ended and when the audio began
    (the trio clock)."""
    import trio

    settings = {"temperature": 0, "max_output_tokens": args.max_tokens,
                "turn_detection": None if manual else vad(args.silence_ms)}
    ws_cm, ws = await session(url, settings)
    turn = Turn()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_turns, ws, [turn], "response.done")
            said = clip.audio[:int(round(sound_end_s(clip.audio) * RATE))] if manual else clip.audio
            audio = np.concatenate([np.zeros(int(LEAD_S * RATE), np.float32), said])
            start = await speak(ws, audio)
            speech_end = start + LEAD_S + sound_end_s(clip.audio)
            if manual:  # push-to-talk: the button is let go as the last sound ends, and the client commits
                await ws.send_message(json.dumps({"type": "input_audio_buffer.commit"}))
                await ws.send_message(json.dumps({"type": "response.create"}))
            else:
                await speak(ws, np.zeros(int((args.silence_ms / 1000 + 0.7) * RATE), np.float32))
    finally:
        await ws_cm.__aexit__(None, None, None)
    return turn, speech_end, start


async def baseline_turn(base: str, speech_model: str, llm: str, clip: Clip, args) -> tuple[float, str]:
    """The whole recording transcribed, then asked: seconds from the end of speech to the first token."""
    import httpx

    async with httpx.AsyncClient(base_url=base, timeout=EVENT_TIMEOUT_S) as client:
        t0 = time.perf_counter()
        files = {"file": ("q.wav", clip.path.read_bytes(), "audio/wav")}
        text = (await client.post("/v1/audio/transcriptions", files=files, data={"model": speech_model})).json()["text"]
        body = {"model": llm, "messages": [{"role": "user", "content": text}], "max_tokens": args.max_tokens,
                "temperature": 0, "stream": True}
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: {") and json.loads(line[6:])["choices"] and \
                        json.loads(line[6:])["choices"][0]["delta"].get("content"):
                    return time.perf_counter() - t0, text
    return float("nan"), text


def word_lags(turn: Turn, start: float, ends: list[float]) -> list[float]:
    """Arrival less sending time for each committed word, matched to the spoken words by order."""
    lags, k = [], 0
    for arrived, text in turn.deltas:
        for _ in text.split():
            if k < len(ends):
                lags.append(arrived - (start + LEAD_S + ends[k]))
            k += 1
    return lags


async def concurrent_streams(url: str, clips: list[Clip], ends: list[list[float]], n: int, args) -> dict:
    """n transcription sessions at once, each speaking 3 questions back to back."""
    import trio

    lags, finals = [], []

    async def stream(i: int) -> None:
        picks = [(i * 3 + j) % len(clips) for j in range(3)]
        ws_cm, ws = await session(url, {"type": "transcription", "turn_detection": vad(args.silence_ms)})
        turns = [Turn() for _ in picks]
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_turns, ws, turns, "conversation.item.input_audio_transcription.completed")
                gap = np.zeros(int((args.silence_ms / 1000 + 0.5) * RATE), np.float32)
                offset, pieces, marks = 0.0, [], []
                for j in picks:
                    pieces += [np.zeros(int(LEAD_S * RATE), np.float32), clips[j].audio, gap]
                    marks.append(offset)
                    offset += LEAD_S + clips[j].seconds + len(gap) / RATE
                start = await speak(ws, np.concatenate(pieces))
        finally:
            await ws_cm.__aexit__(None, None, None)
        for turn, j, mark in zip(turns, picks, marks):
            lags.extend(word_lags(turn, start + mark, ends[j]))
            speech_end = start + mark + LEAD_S + sound_end_s(clips[j].audio)
            if turn.completed_s is not None:
                finals.append(turn.completed_s - speech_end - args.silence_ms / 1000)

    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(stream, i)
    keep_up_s = args.keep_up_ms / 1000
    out = {"streams": n, "lag_ms": _ms(lags), "final_after_vad_end_ms": _ms(finals)}
    out["keeps_up"] = bool(lags and finals and percentile(lags, 50) < keep_up_s and percentile(finals, 95) < keep_up_s)
    return out


def _ms(seconds: list[float]) -> dict:
    if not seconds:
        return {"n": 0}
    ms = [1000 * s for s in seconds]
    return {"n": len(ms), "p50": percentile(ms, 50), "p95": percentile(ms, 95), "mean": statistics.fmean(ms)}


# -- the run --------------------------------------------------------------------------------------------


@asynccontextmanager
async def _server(args, tts_model: str | None = "espeak"):
    """`rill serve` of the bench's models in this process: yields its base URL."""
    import trio

    from rill.config import EngineConfig
    from rill.server import serve
    from rill.transports.http import ServerConfig

    config = EngineConfig(model=args.llm, dtype="float32", seed=args.seed)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(lambda task_status: serve(
            config, ServerConfig(), "127.0.0.1", 0, 1.0, speech_model=args.speech_model, tts_model=tts_model,
            shutdown_trigger=stop.wait, task_status=task_status))
        try:
            yield binds[0]
        finally:
            stop.set()


def _voice_model(voice: str, args) -> str:
    """--voices' entry as `serve`'s tts_model: espeak, the random Kokoro's directory, or a directory."""
    if voice != "kokoro":
        return voice
    from rill.bench.speak import _kokoro_dir

    return str(_kokoro_dir(args))


async def _spoken(clips: list[Clip], args) -> dict:
    """The spoken half once per voice, each on a server of its own (the voice is a server setting)."""
    out = {}
    for voice in [v for v in args.voices.split(",") if v]:
        async with _server(args, _voice_model(voice, args)) as base:
            out[voice] = await voice_spoken.measure(base, base.replace("http://", "ws://") + "/v1/realtime", clips,
                                                    args)
    return out


async def _serve_and_measure(clips: list[Clip], ends: list[list[float]], args) -> dict:
    from rill.tiny_speech.evaluate import normalize

    if args.spoken_only:
        return {"spoken": await _spoken(clips, args)}

    async with _server(args) as base:
        url = base.replace("http://", "ws://") + "/v1/realtime"
        out = {"vad": [], "manual": [], "baseline": []}
        for clip, clip_ends in zip(progress(clips, desc="voice: one stream", disable=args.no_progress), ends):
            turn, speech_end, start = await one_turn(url, clip, args, manual=False)
            out["vad"].append({"text": clip.text, "transcript": turn.transcript, "answer": turn.answer,
                               "exact": normalize(turn.transcript) == normalize(clip.text),
                               "lags_s": word_lags(turn, start, clip_ends),
                               "first_token_s": (turn.first_token_s or float("nan")) - speech_end})
            turn, speech_end, _ = await one_turn(url, clip, args, manual=True)
            out["manual"].append({"first_token_s": (turn.first_token_s or float("nan")) - speech_end})
            seconds, text = await baseline_turn(base, args.speech_model, args.llm, clip, args)
            out["baseline"].append({"first_token_s": seconds, "transcript": text})
        out["streams"] = []
        for n in progress([int(s) for s in args.streams.split(",")], desc="voice: concurrent",
                          disable=args.no_progress):
            out["streams"].append(await concurrent_streams(url, clips, ends, n, args))
    if args.spoken_sessions:
        out["spoken"] = await _spoken(clips, args)
    return out


def run(args) -> dict:
    import trio

    from rill.speech.async_speech import resolve_speech_model

    model_dir = resolve_speech_model(args.speech_model)
    window_s = json.loads((model_dir / "preprocessor_config.json").read_text())["n_samples"] / RATE
    root = args.cache_dir if args.cache_dir is not None else default_cache_dir()
    clips = load_audio_set(root, args.seed, args.n, window_s, disable_progress=args.no_progress)
    ends = []
    if not args.spoken_only:  # the word times only the transcript lag needs
        voices = manifest_voices(clips)
        ends = [word_ends_s(c, v) for c, v in zip(progress(clips, desc="word times", disable=args.no_progress),
                                                  voices)]
    measured = trio.run(_serve_and_measure, clips, ends, args)
    return _spoken_result(measured, clips, args) if args.spoken_only else _result(measured, clips, args)


def _config(clips: list[Clip], args) -> dict:
    return {"llm": args.llm, "speech_model": str(args.speech_model), "n": len(clips), "silence_ms": args.silence_ms,
            "chunk_ms": CHUNK_S * 1000, "streams": args.streams, "keep_up_ms": args.keep_up_ms,
            "voices": args.voices, "kokoro_shape": args.kokoro_shape, "spoken_sessions": args.spoken_sessions,
            "max_tokens": args.max_tokens}


def _spoken_result(m: dict, clips: list[Clip], args) -> dict:
    return {"config": _config(clips, args), "spoken_answer": m["spoken"],
            "targets": {"spoken_p50_ms": 300, "spoken_vs_cascade": 0.2, "sessions": 8}}


def _result(m: dict, clips: list[Clip], args) -> dict:
    lags = [lag for turn in m["vad"] for lag in turn["lags_s"]]
    vad_first = [t["first_token_s"] for t in m["vad"]]
    manual_first = [t["first_token_s"] for t in m["manual"]]
    base_first = [t["first_token_s"] for t in m["baseline"]]
    silence_s = args.silence_ms / 1000
    p50 = lambda xs: percentile([x for x in xs if x == x], 50) * 1000 if any(x == x for x in xs) else None  # noqa: E731
    return {
        "config": _config(clips, args),
        "exact_transcripts": sum(t["exact"] for t in m["vad"]) / len(m["vad"]),
        "transcript_lag_ms": _ms(lags),
        "first_token_ms": {"server_vad": p50(vad_first), "server_vad_less_silence": (p50(vad_first) or 0) - 1000 * silence_s,
                           "manual_commit": p50(manual_first), "baseline_transcribe_then_chat": p50(base_first)},
        "concurrency": m["streams"],
        "spoken_answer": m.get("spoken"),
        "turns": m["vad"],
        "targets": {"lag_p50_ms": 500, "manual_vs_baseline": 0.2, "vad_over_silence_ms": 150, "streams": 8},
    }


def summary(result: dict) -> str:
    if "first_token_ms" not in result:  # --spoken-only
        c = result["config"]
        lines = [f"voice (spoken half): {c['n']} questions, {c['speech_model']} + {c['llm']}, server VAD silence "
                 f"{c['silence_ms']} ms, torch threads {result.get('torch_threads', '?')}"]
        for voice, spoken in result["spoken_answer"].items():
            lines += voice_spoken.summary_lines(spoken, voice)
        return "\n".join(lines)
    c, lag, first = result["config"], result["transcript_lag_ms"], result["first_token_ms"]
    fmt = lambda v: "n/a" if v is None else f"{v:.0f} ms"  # noqa: E731
    lines = [f"voice: {c['n']} questions, {c['speech_model']} + {c['llm']}, server VAD silence {c['silence_ms']} ms, "
             f"torch threads {result.get('torch_threads', '?')}; exact transcripts {result['exact_transcripts']:.0%}",
             f"  transcript lag: p50 {fmt(lag.get('p50'))}, p95 {fmt(lag.get('p95'))} over {lag['n']} words "
             f"(target p50 < 500 ms)",
             f"  end of speech -> first answer token (p50): server VAD {fmt(first['server_vad'])} "
             f"({fmt(first['server_vad_less_silence'])} past the silence; target < 150 ms), manual commit "
             f"{fmt(first['manual_commit'])}, transcribe-then-chat {fmt(first['baseline_transcribe_then_chat'])}"]
    if first["manual_commit"] and first["baseline_transcribe_then_chat"]:
        lines.append(f"  manual commit / baseline: {first['manual_commit'] / first['baseline_transcribe_then_chat']:.2f}"
                     " (target <= 0.2)")
    for s in result["concurrency"]:
        lines.append(f"  {s['streams']} streams: lag p50 {fmt(s['lag_ms'].get('p50'))} p95 {fmt(s['lag_ms'].get('p95'))}, "
                     f"final transcript after the VAD's end p95 {fmt(s['final_after_vad_end_ms'].get('p95'))}: "
                     f"{'keeps up' if s['keeps_up'] else 'falls behind'}")
    for voice, spoken in (result.get("spoken_answer") or {}).items():
        lines += voice_spoken.summary_lines(spoken, voice)
    return "\n".join(lines)


def plot(result: dict, path) -> None:
    spoken = result.get("spoken_answer") or {}
    if "first_token_ms" not in result:  # --spoken-only
        save_plot(Path(path), lambda axes: _plot_spoken(axes[0], spoken), ncols=1,
                  title=f"rill bench voice: spoken answers ({result['config']['llm']})")
        return

    def draw(axes):
        first = result["first_token_ms"]
        names = ["server VAD", "manual commit", "transcribe+chat"]
        values = [first["server_vad"] or 0, first["manual_commit"] or 0, first["baseline_transcribe_then_chat"] or 0]
        bars = axes[0].bar(names, values)
        axes[0].bar_label(bars, labels=[f"{v:.0f}" for v in values], fontsize=8)
        axes[0].axhline(result["config"]["silence_ms"], color="grey", linestyle=":", label="VAD silence")
        axes[0].set_ylabel("end of speech -> first token, ms (p50)")
        axes[0].legend(fontsize=8)
        streams = [s["streams"] for s in result["concurrency"]]
        for key, label in (("p50", "lag p50"), ("p95", "lag p95")):
            axes[1].plot(streams, [s["lag_ms"].get(key) or 0 for s in result["concurrency"]], marker="o", label=label)
        axes[1].axhline(500, color="grey", linestyle=":", label="500 ms")
        axes[1].set_xlabel("concurrent real-time streams")
        axes[1].set_ylabel("transcript lag, ms")
        axes[1].legend(fontsize=8)
        if spoken:
            _plot_spoken(axes[2], spoken)

    save_plot(Path(path), draw, ncols=3 if spoken else 2, title=f"rill bench voice: {Path(result['config']['speech_model']).name} + "
              f"{result['config']['llm']}")


def _plot_spoken(ax, spoken: dict) -> None:
    """End of speech to the first spoken byte (p50) per voice: push-to-talk, server VAD sessions, the cascade."""
    voices = list(spoken)
    rows = [("push-to-talk", lambda s: s["manual_commit"].get("p50"))]
    rows += [(f"VAD x{n['sessions']}", lambda s, k=k: s["sessions"][k].get("p50"))
             for k, n in enumerate(spoken[voices[0]]["sessions"])]
    rows.append(("cascade", lambda s: s["cascade"].get("p50")))
    width = 0.8 / len(rows)
    for k, (label, get) in enumerate(rows):
        values = [get(spoken[v]) or 0 for v in voices]
        bars = ax.bar([i + k * width for i in range(len(voices))], values, width, label=label)
        ax.bar_label(bars, labels=[f"{v:.0f}" for v in values], fontsize=7)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(voices))], voices)
    ax.axhline(300, color="grey", linestyle=":", label="300 ms")
    shown = [v for label, get in rows for v in (get(spoken[name]) for name in voices) if v]
    if shown and max(shown) > 20 * min(shown):  # a neural voice on CPU beside espeak-ng: seconds beside ms
        ax.set_yscale("log")
    ax.set_ylabel("end of speech -> first spoken byte, ms (p50)")
    ax.legend(fontsize=7)
