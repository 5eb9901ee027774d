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

- manual commit to final transcript: from `input_audio_buffer.commit` (sent as the last sound ends) to the
  turn's `...input_audio_transcription.completed`, against transcribing the whole recording
  (/v1/audio/transcriptions on the same clip, timed from the same moment).

`--speech-model` takes a comma list (issue 56: a causal model against the Whisper path): each model is
served by a `rill serve` of its own, one after another, on the same clips and word times; the result has
one block per model (`models`), the first model's figures also at the top level as before. The stream
counts are swept in order and the sweep stops at the first count that falls behind.

Targets (DESIGN.md, the Whisper path): lag p50 < 500 ms; first token <= 1/5 of the baseline (manual
commit) and < silence + 150 ms (server VAD); 8 concurrent streams keep up. Causal models (issue 56): lag
p50 <= 300 ms and p95 <= 600 ms, a manual commit's final transcript at most 1/5 of the whole-recording
transcription, 24 streams on 2 cores. Reported here, never asserted.
"""

from __future__ import annotations

import json
import subprocess
import time
from contextlib import asynccontextmanager
from pathlib import Path

import numpy as np

from rill.bench import voice_report, voice_spoken
from rill.bench.voice_client import (  # noqa: F401 (turn_detection and voice_spoken import the client from here)
    CHUNK_S, EVENT_TIMEOUT_S, RATE, Turn, b64, bounded_read, realtime_session, session, speak, vad)
from rill.bench.common import add_common_args, default_cache_dir, percentile, progress
from rill.bench.speech_set import Clip, load_audio_set

NAME = "voice"
LEAD_S = 0.3  # silence before each question
LOUD = 1e-3  # |amplitude| above this is sound (rill.tiny_speech.synth's silence floor)
# A causal model has no window (it hears an endless stream): its clips are bounded as Whisper's 30 s window
# bounds them, so that both kinds of model hear the same set.
CAUSAL_CLIP_S = 30.0


def add_arguments(p) -> None:
    add_common_args(p, NAME)
    p.add_argument("--llm", default="rill-tiny", help="the LLM: rill-tiny or a directory (default %(default)s)")
    p.add_argument("--speech-model", default="rill-tiny-speech", help="rill-tiny-speech, a Whisper directory or a "
                   "causal one (Voxtral Realtime, Kyutai STT); a comma list measures each on a server of its own, on "
                   "the same clips (default %(default)s)")
    p.add_argument("--speech-delay-ms", type=float, default=None, metavar="MS", help="`rill serve --speech-delay-ms`: "
                   "a Voxtral Realtime model's transcription delay (default: the model's)")
    p.add_argument("--no-speech-early-stop", dest="speech_early_stop", action="store_false",
                   help="`rill serve --no-speech-early-stop`: a commit runs the whole right padding")
    p.add_argument("--n", type=int, default=16, help="questions (default %(default)s)")
    p.add_argument("--streams", default="1,2,4,8", help="concurrent stream counts, swept in order; the sweep stops "
                   "at the first count that falls behind (default %(default)s)")
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


# -- the measurements ----------------------------------------------------------------------------------


async def one_turn(url: str, clip: Clip, args, manual: bool) -> tuple[Turn, float, float]:
    """One question in a realtime session: what came back, when speech ended and when the audio began
    (the trio clock)."""
    import trio

    settings = {"temperature": 0, "max_output_tokens": args.max_tokens,
                "turn_detection": None if manual else vad(args.silence_ms)}
    turn, times = Turn(), {}

    async def talk() -> None:
        said = clip.audio[:int(round(sound_end_s(clip.audio) * RATE))] if manual else clip.audio
        audio = np.concatenate([np.zeros(int(LEAD_S * RATE), np.float32), said])
        # set before speaking: the reader may end the turn (and cancel this) before the clip's trailing silence is sent
        times["start"] = trio.current_time()
        times["end"] = times["start"] + LEAD_S + sound_end_s(clip.audio)
        await speak(ws, audio)
        if manual:  # push-to-talk: the button is let go as the last sound ends, and the client commits
            turn.commit_s = trio.current_time()
            await ws.send_message(json.dumps({"type": "input_audio_buffer.commit"}))
            await ws.send_message(json.dumps({"type": "response.create"}))
        else:
            await speak(ws, np.zeros(int((args.silence_ms / 1000 + 0.7) * RATE), np.float32))

    async with realtime_session(url, settings) as ws:
        await bounded_read(ws, [turn], "response.done", talk)
    return turn, times["end"], times["start"]


async def baseline_turn(base: str, speech_model: str, llm: str, clip: Clip, args) -> tuple[float, float, str]:
    """The whole recording transcribed, then asked: seconds from the end of speech to the whole transcript,
    and to the first token; the transcript."""
    import httpx

    async with httpx.AsyncClient(base_url=base, timeout=EVENT_TIMEOUT_S) as client:
        t0 = time.perf_counter()
        files = {"file": ("q.wav", clip.path.read_bytes(), "audio/wav")}
        text = (await client.post("/v1/audio/transcriptions", files=files, data={"model": speech_model})).json()["text"]
        transcribed = time.perf_counter() - t0
        body = {"model": llm, "messages": [{"role": "user", "content": text}], "max_tokens": args.max_tokens,
                "temperature": 0, "stream": True}
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: {") and json.loads(line[6:])["choices"] and \
                        json.loads(line[6:])["choices"][0]["delta"].get("content"):
                    return transcribed, time.perf_counter() - t0, text
    return transcribed, float("nan"), text


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

    lags, finals, unfinished, empty = [], [], 0, 0

    async def stream(i: int) -> None:
        nonlocal unfinished, empty
        picks = [(i * 3 + j) % len(clips) for j in range(3)]
        gap = np.zeros(int((args.silence_ms / 1000 + 0.5) * RATE), np.float32)
        offset, pieces, marks = 0.0, [], []
        for j in picks:
            pieces += [np.zeros(int(LEAD_S * RATE), np.float32), clips[j].audio, gap]
            marks.append(offset)
            offset += LEAD_S + clips[j].seconds + len(gap) / RATE
        turns, times = [Turn() for _ in picks], {}

        async def talk() -> None:
            times["start"] = trio.current_time()  # before speaking: the reader may cancel this once all came
            await speak(ws, np.concatenate(pieces))

        async with realtime_session(url, {"type": "transcription", "turn_detection": vad(args.silence_ms)}) as ws:
            await bounded_read(ws, turns, "conversation.item.input_audio_transcription.completed", talk)
        for turn, j, mark in zip(turns, picks, marks):
            lags.extend(word_lags(turn, times["start"] + mark, ends[j]))
            speech_end = times["start"] + mark + LEAD_S + sound_end_s(clips[j].audio)
            if turn.completed_s is None or not turn.transcript.strip():  # a turn with no words is unfinished, as
                unfinished += 1  # when the server sent nothing for it (before every turn got a transcript)
                empty += turn.completed_s is not None
            else:
                finals.append(turn.completed_s - speech_end - args.silence_ms / 1000)

    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(stream, i)
    return {"streams": n, "lag_ms": voice_report.ms(lags), "final_after_vad_end_ms": voice_report.ms(finals), "unfinished": unfinished,
            "empty": empty,
            "keeps_up": keeps_up(lags, finals, unfinished, args.keep_up_ms / 1000)}


def keeps_up(lags: list[float], finals: list[float], unfinished: int, bound_s: float) -> bool:
    """Every turn's final transcript came, p95 within the bound of the VAD's end, and half the words within it
    of being said. A model that wrote no words is judged on its finals alone: a causal decoder steps every
    frame whether or not it writes, so its finals still show a stream falling behind."""
    if unfinished or not finals or percentile(finals, 95) >= bound_s:
        return False
    return bool(not lags or percentile(lags, 50) < bound_s)  # a plain bool: numpy's is no JSON


async def sweep_streams(url: str, clips: list[Clip], ends: list[list[float]], args) -> list[dict]:
    """The stream counts in order, stopping after the first that falls behind (more would only fall further)."""
    out = []
    for n in progress([int(s) for s in args.streams.split(",")], desc="voice: concurrent", disable=args.no_progress):
        out.append(await concurrent_streams(url, clips, ends, n, args))
        if not out[-1]["keeps_up"]:
            break
    return out


# -- the run --------------------------------------------------------------------------------------------


def speech_models(args) -> list[str]:
    return [m.strip() for m in str(args.speech_model).split(",") if m.strip()]


def is_causal(model: str) -> bool:
    """A streaming (causal) recogniser: Voxtral Realtime or Kyutai STT, read from config.json as serving does."""
    from rill.speech.async_speech import resolve_speech_model
    from rill.speech.kyutai.loader import is_kyutai_dir
    from rill.speech.voxtral_realtime.loader import is_voxtral_realtime_dir

    directory = resolve_speech_model(model)
    return is_kyutai_dir(directory) or is_voxtral_realtime_dir(directory)


def clip_bound_s(model: str) -> float:
    """The longest clip the model hears whole: Whisper's window (preprocessor_config's n_samples), or
    CAUSAL_CLIP_S for a causal model, which has none."""
    from rill.speech.async_speech import resolve_speech_model

    if is_causal(model):
        return CAUSAL_CLIP_S
    return json.loads((resolve_speech_model(model) / "preprocessor_config.json").read_text())["n_samples"] / RATE


@asynccontextmanager
async def _server(args, tts_model: str | None = "espeak", speech_model: str | None = None):
    """`rill serve` of the bench's models in this process (the first speech model unless one is named):
    yields its base URL."""
    import trio

    from rill.config import EngineConfig
    from rill.server import serve
    from rill.transports.http import ServerConfig

    config = EngineConfig(model=args.llm, dtype="float32", seed=args.seed)
    speech_model = speech_model or speech_models(args)[0]
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(lambda task_status: serve(
            config, ServerConfig(), "127.0.0.1", 0, 1.0, speech_model=speech_model, tts_model=tts_model,
            speech_delay_ms=args.speech_delay_ms if is_causal(speech_model) else None,
            speech_early_stop=args.speech_early_stop, shutdown_trigger=stop.wait, task_status=task_status))
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
    """The spoken half once per voice, each on a server of its own (the voice is a server setting), hearing
    with the first speech model."""
    import argparse

    first = argparse.Namespace(**{**vars(args), "speech_model": speech_models(args)[0]})
    out = {}
    for voice in [v for v in args.voices.split(",") if v]:
        async with _server(args, _voice_model(voice, args)) as base:
            out[voice] = await voice_spoken.measure(base, base.replace("http://", "ws://") + "/v1/realtime", clips,
                                                    first)
    return out


async def _listen(model: str, clips: list[Clip], ends: list[list[float]], args) -> dict:
    """The listening half with one speech model on a server of its own: per question a server VAD turn, a
    push-to-talk turn and the whole recording transcribed then asked; then the stream sweep."""
    from rill.tiny_speech.evaluate import normalize

    async with _server(args, speech_model=model) as base:
        url = base.replace("http://", "ws://") + "/v1/realtime"
        out = {"speech_model": model, "vad": [], "manual": [], "baseline": []}
        for clip, clip_ends in zip(progress(clips, desc=f"voice: {Path(model).name}", disable=args.no_progress),
                                   ends):
            turn, speech_end, start = await one_turn(url, clip, args, manual=False)
            out["vad"].append({"text": clip.text, "transcript": turn.transcript, "answer": turn.answer,
                               "exact": normalize(turn.transcript) == normalize(clip.text),
                               "lags_s": word_lags(turn, start, clip_ends),
                               "first_token_s": (turn.first_token_s or float("nan")) - speech_end,
                               "errors": turn.errors})
            turn, speech_end, _ = await one_turn(url, clip, args, manual=True)
            out["manual"].append({"first_token_s": (turn.first_token_s or float("nan")) - speech_end,
                                  "commit_to_final_s": (turn.completed_s or float("nan")) - turn.commit_s,
                                  "transcript": turn.transcript, "errors": turn.errors})
            transcribed, first, text = await baseline_turn(base, model, args.llm, clip, args)
            out["baseline"].append({"first_token_s": first, "transcribe_s": transcribed, "transcript": text})
        out["streams"] = await sweep_streams(url, clips, ends, args)
    return out


async def _serve_and_measure(clips: list[Clip], ends: list[list[float]], args) -> dict:
    if args.spoken_only:
        return {"spoken": await _spoken(clips, args)}
    out = {"models": [await _listen(model, clips, ends, args) for model in speech_models(args)]}
    if args.spoken_sessions:
        out["spoken"] = await _spoken(clips, args)
    return out


def run(args) -> dict:
    import trio

    bound_s = min(clip_bound_s(model) for model in speech_models(args))  # every model hears the same clips
    root = args.cache_dir if args.cache_dir is not None else default_cache_dir()
    clips = load_audio_set(root, args.seed, args.n, bound_s, disable_progress=args.no_progress)
    ends = []
    if not args.spoken_only:  # the word times only the transcript lag needs
        voices = manifest_voices(clips)
        ends = [word_ends_s(c, v) for c, v in zip(progress(clips, desc="word times", disable=args.no_progress),
                                                  voices)]
    measured = trio.run(_serve_and_measure, clips, ends, args)
    if args.spoken_only:
        return voice_report.spoken_result(measured, _config(clips, bound_s, args))
    return voice_report.result(measured, _config(clips, bound_s, args), args.silence_ms / 1000)


def _config(clips: list[Clip], bound_s: float, args) -> dict:
    return {"llm": args.llm, "speech_model": str(args.speech_model), "n": len(clips), "silence_ms": args.silence_ms,
            "chunk_ms": CHUNK_S * 1000, "streams": args.streams, "keep_up_ms": args.keep_up_ms,
            "voices": args.voices, "kokoro_shape": args.kokoro_shape, "spoken_sessions": args.spoken_sessions,
            "max_tokens": args.max_tokens, "clip_bound_s": bound_s, "speech_delay_ms": args.speech_delay_ms,
            "speech_early_stop": args.speech_early_stop,
            "causal": [is_causal(model) for model in speech_models(args)]}


summary = voice_report.summary
plot = voice_report.plot
