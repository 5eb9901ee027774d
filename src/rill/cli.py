"""The `rill` command: serve, chat, generate, transcribe, bench, train-tiny, eval-tiny."""

from __future__ import annotations

import argparse
import json
import os
import sys


def _env(name: str, default=None, kind=str):
    value = os.environ.get(f"RILL_{name}")
    return default if value is None else kind(value)


def add_engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dtype", default=_env("DTYPE"), choices=["auto", "float32", "bfloat16", "float16"],
                   help="auto (default): the checkpoint's own; on the CPU float16 runs as float32 (logged)")
    p.add_argument("--device", default=_env("DEVICE", "cpu"))
    p.add_argument("--max-model-len", type=int, default=_env("MAX_MODEL_LEN", None, int))
    p.add_argument("--num-kv-blocks", type=int, default=_env("NUM_KV_BLOCKS", None, int), help="KV budget in blocks")
    p.add_argument("--kv-cache-gb", type=float, default=_env("KV_CACHE_GB", None, float),
                   help="KV budget in GiB (default: 2, or an eighth of the machine's memory if less)")
    p.add_argument("--block-size", type=int, default=_env("BLOCK_SIZE", 16, int))
    p.add_argument("--max-num-seqs", type=int, default=_env("MAX_NUM_SEQS", 256, int), help="max running requests")
    p.add_argument("--max-num-batched-tokens", type=int, default=_env("MAX_NUM_BATCHED_TOKENS", 2048, int))
    p.add_argument("--no-prefix-caching", action="store_true", default=bool(_env("NO_PREFIX_CACHING", "")))
    p.add_argument("--chat-template", default=_env("CHAT_TEMPLATE"), help="file with a Jinja chat template")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=_env("TENSOR_PARALLEL_SIZE", 1, int),
                   help="split the model over this many processes (one GPU each on CUDA; gloo on CPU)")
    p.add_argument("--stream-interval", type=int, default=_env("STREAM_INTERVAL", 1, int),
                   help="send a stream's tokens in groups of this many (one by one until the first text; "
                        "the end at once; default 1)")
    p.add_argument("--max-steps-ahead", type=int, default=_env("MAX_STEPS_AHEAD", None, int),
                   help="engine steps whose output may wait for the server's event loop before the engine "
                        "waits for it (0: never; default 4 on the CPU, 0 on CUDA)")
    p.add_argument("--cuda-graphs", action="store_true", default=bool(_env("CUDA_GRAPHS", "")),
                   help="replay decode steps from CUDA graphs captured at start (--device cuda)")
    p.add_argument("--max-num-encoder-tokens", type=int, default=_env("MAX_NUM_ENCODER_TOKENS", None, int),
                   help="vision models: image embeddings the encoder may make per step (default: max-num-batched-tokens)")


def engine_config(args):
    template = None
    if args.chat_template:
        with open(args.chat_template) as f:
            template = f.read()
    try:
        return _engine_config(args, template)
    except ValueError as exc:  # an option out of range: one line, as argparse reports its own errors
        from rill.errors import RillError

        raise RillError(str(exc)) from None


def _engine_config(args, template):
    from rill.config import MAX_STREAM_BUFFER_BYTES, EngineConfig

    return EngineConfig(
        model=args.model, dtype=args.dtype, device=args.device, block_size=args.block_size,
        num_kv_blocks=args.num_kv_blocks,
        kv_cache_bytes=None if args.kv_cache_gb is None else int(args.kv_cache_gb * (1 << 30)),
        max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        enable_prefix_caching=not args.no_prefix_caching, chat_template=template,
        tensor_parallel_size=args.tensor_parallel_size,
        max_num_encoder_tokens=getattr(args, "max_num_encoder_tokens", None),
        cuda_graphs=getattr(args, "cuda_graphs", False),
        stream_interval=getattr(args, "stream_interval", 1),
        max_steps_ahead=getattr(args, "max_steps_ahead", None),
        max_stream_buffer_bytes=getattr(args, "max_stream_buffer_bytes", MAX_STREAM_BUFFER_BYTES) or None,
    )


def _cmd_generate(args) -> int:
    from rill.offline import LLM
    from rill.sampling_params import SamplingParams

    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed)
    with LLM(**vars(engine_config(args))) as llm:
        if args.command == "chat":
            outs = llm.chat([[{"role": "user", "content": p}] for p in args.prompts], params)
        else:
            outs = llm.generate(args.prompts, params)
    for out in outs:
        if args.json:
            print(json.dumps({"prompt": out.prompt, "text": out.outputs[0].text,
                              "finish_reason": out.outputs[0].finish_reason}))
        else:
            print(out.outputs[0].text)
    return 0


def _cmd_serve(args) -> int:
    import logging

    from rill.live_video import config as live_video_config
    from rill.media import policy as media_policy
    from rill.model_set import model_specs, served_models
    from rill.openai.chat_media import parse_limits
    from rill.openai.responses_api import config as responses_config
    from rill.server import run
    from rill.sessions import config as streaming_input_config
    from rill.transports.http import ServerConfig, send_timeout_option
    from rill.transports.cross_site import hosts_for_bind
    from rill.transports.realtime.driver import realtime_config

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server = ServerConfig(
        api_key=args.api_key or None, max_waiting=args.max_waiting, max_body_bytes=args.max_body_bytes,
        max_body_bytes_in_flight=args.max_body_bytes_in_flight,
        max_sequences_per_request=args.max_sequences_per_request,
        served_model_names=args.served_model_name or [],
        web_ui=not args.no_web_ui,
        tool_call_parser=None if args.tool_call_parser == "none" else args.tool_call_parser,
        reasoning_parser=None if args.reasoning_parser == "none" else args.reasoning_parser,
        streaming_input=streaming_input_config.from_args(args), replica_id=args.replica_id,
        realtime=realtime_config(args),
        keep_alive_timeout_s=args.keep_alive_timeout_s, body_timeout_s=args.body_timeout_s,
        max_header_bytes=args.max_header_bytes, read_timeout_s=args.read_timeout_s, backlog=args.backlog,
        send_timeout_s=send_timeout_option(args.send_timeout_s),
        max_audio_bytes=args.max_audio_bytes, responses=responses_config.from_args(args),
        media=media_policy.from_args(args),
        limit_mm_per_prompt=parse_limits(args.limit_mm_per_prompt),
        live_video=live_video_config.from_args(args),
        allowed_hosts=hosts_for_bind(args.host, args.allowed_hosts or ()),
        allowed_origins=tuple(args.allowed_origins or ()),
    )
    speech_options = speech_serve_options(args)
    models = served_models(engine_config(args), model_specs(args.model, args.models, os.environ.get("RILL_MODEL")),
                           args.served_model_name)
    if len(models) > 1:
        return run(models, server, args.host, args.port, args.shutdown_grace_s, args.speech_model, args.tts_model,
                   **speech_options)
    server.served_model_names = models[0].names
    return run(models[0].config, server, args.host, args.port, args.shutdown_grace_s, args.speech_model,
               args.tts_model, **speech_options)


def speech_serve_options(args) -> dict:
    """serve()'s speech model settings; a delay the speech model cannot take fails here, before any model
    loads (RillError: one line)."""
    from rill.speech.async_speech import check_speech_delay

    check_speech_delay(args.speech_model, args.speech_delay_ms)
    return {"speech_delay_ms": args.speech_delay_ms, "speech_early_stop": args.speech_early_stop}


def add_serve_args(p: argparse.ArgumentParser) -> None:
    from rill.live_video.config import add_arguments as add_live_video_args
    from rill.media.policy import add_arguments as add_media_args
    from rill.openai.responses_api.config import add_arguments as add_responses_args
    from rill.sessions.config import add_arguments as add_streaming_input_args
    from rill.transports.realtime.driver import add_realtime_args

    add_streaming_input_args(p)
    add_realtime_args(p)
    add_responses_args(p)
    add_media_args(p)
    add_live_video_args(p)
    p.add_argument("--limit-mm-per-prompt", default=_env("LIMIT_MM_PER_PROMPT", ""),
                   help="images and videos one prompt may carry, e.g. image=4,video=1 (default image=8,video=1)")
    p.add_argument("model", nargs="?", default=None,
                   help="rill-tiny or a local Hugging Face model directory (default: RILL_MODEL, else every model "
                        "the package ships: rill-tiny, and rill-tiny-vision when this build has it)")
    p.add_argument("--model", dest="models", action="append", metavar="[NAME=]MODEL",
                   help="serve this model too (repeatable; the first model is the default for requests that name "
                        "none); NAME=MODEL serves it as NAME, else it is named MODEL as given")
    p.add_argument("--host", default=_env("HOST", "127.0.0.1"))
    p.add_argument("--port", type=int, default=_env("PORT", 8000, int), help="0: any free port")
    p.add_argument("--api-key", default=_env("API_KEY"), help="require 'Authorization: Bearer KEY' on /v1/*")
    p.add_argument("--allowed-hosts", nargs="+", default=_env("ALLOWED_HOSTS", None, lambda v: v.split(",")),
                   metavar="NAME", help="without --api-key: names the Host header may carry besides IP literals, "
                   "localhost and --host (DNS rebinding; *: any; checked by default only on a loopback bind or a "
                   "bind to a name) [RILL_ALLOWED_HOSTS, comma-separated]")
    p.add_argument("--allowed-origins", nargs="+", default=_env("ALLOWED_ORIGINS", None, lambda v: v.split(",")),
                   metavar="ORIGIN", help="web origins (https://app.example) that may call the server, with CORS; "
                   "without --api-key other origins get 403 (default: none but the server's own page; *: any) "
                   "[RILL_ALLOWED_ORIGINS, comma-separated]")
    p.add_argument("--no-web-ui", action="store_true", default=bool(_env("NO_WEB_UI", "")),
                   help="do not serve the web page at / (404 there) [RILL_NO_WEB_UI]")
    p.add_argument("--max-waiting", type=int, default=_env("MAX_WAITING", None, int),
                   help="requests waiting for their first token before new ones get 429")
    p.add_argument("--max-body-bytes", type=int, default=_env("MAX_BODY_BYTES", 16 << 20, int))
    p.add_argument("--max-body-bytes-in-flight", type=int, default=_env("MAX_BODY_BYTES_IN_FLIGHT", 512 << 20, int),
                   help="request bodies being read at once, all connections together; a body past it gets 503 "
                        "unread (default 512 MiB)")
    p.add_argument("--max-sequences-per-request", type=int, default=_env("MAX_SEQUENCES_PER_REQUEST", 1024, int),
                   help="sequences one request may create, prompts x n; past it, 400 (default 1024)")
    p.add_argument("--speech-model", default=_env("SPEECH_MODEL", "rill-tiny-speech"),
                   help="rill-tiny-speech (default; skipped with a log line when not in this build), a local "
                        "Whisper directory, or none: the model of /v1/audio/transcriptions")
    p.add_argument("--speech-delay-ms", type=float, default=_env("SPEECH_DELAY_MS", None, float), metavar="MS",
                   help="a Voxtral Realtime speech model's transcription delay: a positive multiple of its 80 ms "
                        "frame (default: tekken.json's transcription_delay_ms; refused for other models, whose "
                        "delay is fixed by their weights) [RILL_SPEECH_DELAY_MS]")
    p.add_argument("--no-speech-early-stop", dest="speech_early_stop", action="store_false",
                   default=not _env("NO_SPEECH_EARLY_STOP", ""),
                   help="a Voxtral Realtime stream's end (a commit, an upload's end) runs all of mistral-common's "
                        "right padding instead of stopping at the first pad past its audio plus the delay "
                        "[RILL_NO_SPEECH_EARLY_STOP]")
    p.add_argument("--tts-model", default=_env("TTS_MODEL", "espeak"),
                   help="the voice of /v1/audio/speech and spoken answers: espeak (default: espeak-ng's synthesizer, "
                        "no download), a local Kokoro directory (config.json, .pth or safetensors, voices/), or none")
    p.add_argument("--max-audio-bytes", type=int, default=_env("MAX_AUDIO_BYTES", 25 * 1000 * 1000, int),
                   help="largest file /v1/audio/transcriptions accepts (413 past it; default 25 MB as OpenAI's)")
    p.add_argument("--keep-alive-timeout-s", type=float, default=_env("KEEP_ALIVE_TIMEOUT_S", 20.0, float),
                   help="close a connection idle this long, or whose request headers take longer (default 20: "
                        "above client pools' idle expiry; behind a proxy, above the proxy's)")
    p.add_argument("--backlog", type=int, default=_env("BACKLOG", 2048, int),
                   help="connections waiting to be accepted (default 2048; the kernel caps it at net.core.somaxconn)")
    p.add_argument("--body-timeout-s", type=float, default=_env("BODY_TIMEOUT_S", 60.0, float),
                   help="a JSON body must arrive within this (408)")
    p.add_argument("--max-header-bytes", type=int, default=_env("MAX_HEADER_BYTES", 16 << 10, int),
                   help="request line and headers past this are a 431")
    p.add_argument("--read-timeout-s", type=float, default=_env("READ_TIMEOUT_S", None, float),
                   help="close a connection that sends nothing this long (off: SSE readers send nothing)")
    p.add_argument("--send-timeout-s", type=float, default=_env("SEND_TIMEOUT_S", 30.0, float),
                   help="close a connection (HTTP, /v1/realtime, the raw --ws-port listener) when a write to it "
                        "waits this long for the client to read; its request is aborted (0: no limit; default 30)")
    p.add_argument("--max-stream-buffer-bytes", type=int, default=_env("MAX_STREAM_BUFFER_BYTES", 4 << 20, int),
                   help="output one request may hold for a client that does not read it (about its memory); past "
                        "it the request is aborted, its KV freed, and the stream ends with an error (0: no limit; "
                        "default 4 MiB)")
    p.add_argument("--served-model-name", nargs="+", default=_env("SERVED_MODEL_NAME", None, lambda v: v.split(",")),
                   help="names clients use for the model (default: the MODEL argument); with several, the first")
    p.add_argument("--tool-call-parser", default=_env("TOOL_CALL_PARSER", "hermes"), choices=["hermes", "none"])
    p.add_argument("--reasoning-parser", default=_env("REASONING_PARSER", "none"),
                   choices=["none", "qwen3", "deepseek_r1"])
    p.add_argument("--shutdown-grace-s", type=float, default=_env("SHUTDOWN_GRACE_S", 10.0, float),
                   help="on SIGINT/SIGTERM, seconds streams in flight get to finish")
    p.add_argument("--replica-id", default=_env("REPLICA_ID"), type=_replica_name, metavar="NAME",
                   help="behind a load balancer: ids of this replica's sessions and stored responses start "
                        "with NAME. (see rill nginx-config)")
    p.add_argument("--log-level", default=_env("LOG_LEVEL", "info"),
                   choices=["debug", "info", "warning", "error"])
    add_engine_args(p)


def _replica_name(text: str) -> str:
    from rill.scaling.replica import check_name

    try:
        return check_name(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _cmd_transcribe(args) -> int:
    from rill.openai.transcriptions import render
    from rill.speech.transcriber import Transcriber

    transcriber = Transcriber(args.model, device=args.device)
    try:
        results = transcriber.transcribe_all(args.files, language=args.language, prompt=args.prompt,
                                             temperature=args.temperature)
    except OSError as exc:  # a FILE that cannot be read
        print(f"rill: error: {exc}", file=sys.stderr)
        return 2
    for path, result in zip(args.files, results):
        if len(args.files) > 1 and args.response_format in ("text", "srt", "vtt"):
            print(f"==> {path} <==")
        body, _ = render(result, args.response_format, args.temperature)
        sys.stdout.write(body.decode() + ("" if body.endswith(b"\n") else "\n"))
    return 0


def add_transcribe_args(p: argparse.ArgumentParser) -> None:
    from rill.openai.transcriptions import RESPONSE_FORMATS

    p.add_argument("files", nargs="+", metavar="FILE", help="recordings: WAV, FLAC, OGG (MP3 where libsndfile has it)")
    p.add_argument("--model", default=_env("SPEECH_MODEL", "rill-tiny-speech"),
                   help="rill-tiny-speech (default) or a local Whisper directory")
    p.add_argument("--language", default=None, help="ISO code such as en (default: detected, or en)")
    p.add_argument("--prompt", default=None, help="text the recording continues (Whisper's previous-text prompt)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--response-format", default="text", choices=RESPONSE_FORMATS,
                   help="text (default), json and verbose_json (one object a line), srt, vtt")
    p.add_argument("--device", default=_env("DEVICE", "cpu"))


def _cmd_speak(args) -> int:
    from pathlib import Path

    from rill.tts.audio_out import FORMATS, encode
    from rill.tts.backend import UnknownVoice
    from rill.tts.synthesizer import Synthesizer

    text = sys.stdin.read() if args.text == "-" else args.text
    fmt = args.format or (Path(args.output).suffix.lstrip(".").lower() if args.output else "wav")
    fmt = {"ogg": "opus", "raw": "pcm"}.get(fmt, fmt)
    if fmt not in FORMATS:
        print(f"rill: error: cannot tell the format of {args.output!r}: give --format ({', '.join(FORMATS)})",
              file=sys.stderr)
        return 2
    try:
        voice = Synthesizer(args.model, voice=args.voice, speed=args.speed)
    except (UnknownVoice, ValueError) as exc:
        print(f"rill: error: {exc}", file=sys.stderr)
        return 2
    data = encode(voice.speak(text), fmt, voice.sample_rate)
    if args.output in (None, "-"):
        sys.stdout.buffer.write(data)
    else:
        Path(args.output).write_bytes(data)
    return 0


def add_speak_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("text", help="what to say (- reads standard input)")
    p.add_argument("-o", "--output", default=None, help="the file to write (default: standard output); its suffix "
                   "gives the format unless --format does")
    p.add_argument("--model", default=_env("TTS_MODEL", "espeak"), help="espeak (default) or a local Kokoro directory")
    p.add_argument("--voice", default=None, help="alloy, ash, ... (GET /v1/audio/voices lists them; default alloy)")
    p.add_argument("--speed", type=float, default=1.0, help="0.25-4.0 (default 1.0)")
    p.add_argument("--format", default=None, help="wav (default), pcm, flac, mp3, opus, aac")


def _forward(module: str):
    def run(args) -> int:
        import importlib

        return importlib.import_module(module).main(args.rest) or 0

    return run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rill", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve", help="the OpenAI-compatible HTTP server")
    add_serve_args(p)
    p.set_defaults(func=_cmd_serve)
    for name in ("chat", "generate"):
        p = sub.add_parser(name, help=f"offline {name}: print the answer to each prompt")
        p.add_argument("prompts", nargs="+")
        p.add_argument("--model", default=_env("MODEL", "rill-tiny"))
        p.add_argument("--temperature", type=float, default=0.0)
        p.add_argument("--max-tokens", type=int, default=128)
        p.add_argument("--seed", type=int, default=None)
        p.add_argument("--json", action="store_true", help="one JSON object per line")
        add_engine_args(p)
        p.set_defaults(func=_cmd_generate)
    p = sub.add_parser("transcribe", help="offline speech to text: print each recording's transcript")
    add_transcribe_args(p)
    p.set_defaults(func=_cmd_transcribe)
    p = sub.add_parser("speak", help="offline text to speech: write the text spoken to a file")
    add_speak_args(p)
    p.set_defaults(func=_cmd_speak)
    for name, module, text in (
        ("train-tiny", "rill.tiny.train", "train rill-tiny from scratch (see its --help)"),
        ("eval-tiny", "rill.tiny.evaluate", "held-out accuracy of rill-tiny per task family"),
        ("bench", "rill.bench", "benchmarks: throughput, streaming-input, scheduler, serve, soak (see --help)"),
        ("nginx-config", "rill.scaling.nginx", "print an nginx configuration for replicas behind one address"),
    ):
        p = sub.add_parser(name, help=text, add_help=False)
        p.add_argument("rest", nargs=argparse.REMAINDER)
        p.set_defaults(func=_forward(module))
    return parser


FORWARDED = {"train-tiny": "rill.tiny.train", "eval-tiny": "rill.tiny.evaluate",
             "train-tiny-speech": "rill.tiny_speech.train", "eval-tiny-speech": "rill.tiny_speech.evaluate", "bench": "rill.bench",
             "train-tiny-vision": "rill.tiny_vision.train", "eval-tiny-vision": "rill.tiny_vision.evaluate",
             "train-tiny-causal": "rill.tiny_causal.train", "eval-tiny-causal": "rill.tiny_causal.evaluate",
             "nginx-config": "rill.scaling.nginx"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # torch's CPU allocator backs allocations of 2 MB and more with transparent huge pages when this
    # is 1 (the kernel's THP mode "madvise" otherwise leaves them on 4 KB pages): the weights and
    # activations a CPU step streams through then cost fewer TLB misses, 1.1x on decode and prefill
    # steps of random-qwen2-100m (BENCHMARKS.md). THP_MEM_ALLOC_ENABLE=0 in the environment keeps 4 KB.
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    # rill's C kernels run on their own thread pool (kernels/cpu_pool.h), whose workers spin briefly between
    # calls; torch's OpenMP workers, left to their default, spin after every parallel torch op on the same
    # cores, and the two pools then take turns at a core each wants: 8 sequences of random-qwen2-100m in
    # bfloat16 on 2 cores ran 19.9 s against 13.2-13.9 s with OMP_WAIT_POLICY=PASSIVE (torch's workers
    # sleep at once; a parallel torch op wakes them). libgomp reads it when torch loads, hence here.
    if argv and argv[0] in ("serve", "bench"):
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if argv and argv[0] in FORWARDED:  # their own parsers handle every option, --help included
        import importlib

        return importlib.import_module(FORWARDED[argv[0]]).main(argv[1:]) or 0
    args = build_parser().parse_args(argv)
    from rill.errors import RillError

    try:
        return args.func(args)
    except RillError as exc:
        print(f"rill: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
