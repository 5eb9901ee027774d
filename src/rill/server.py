"""`rill serve`: one trio root nursery running the engine and hypercorn (trio worker).

SIGINT or SIGTERM stops accepting connections; streams in flight get `grace_s` seconds to
finish; those still running a moment before its end get an SSE error event (transports/draining.py),
no write to a client outlives it (transports/send_guard.py), then the engine shuts down and the
process exits 0. When the engine's worker dies,
every request in flight gets an error and rill stops the same way, then exits 1, so that a
supervisor (systemd's Restart=on-failure, a Kubernetes pod) starts it again, as vLLM does.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial

import hypercorn
import trio
from hypercorn.trio import serve as hypercorn_serve

from rill.config import EngineConfig
from rill.engine.async_engine import AsyncEngine, open_engine
from rill.gc_heap import freeze_startup_heap, thaw_heap
from rill.model_set import ServedModel
from rill.transports import send_guard
from rill.transports.draining import cut_time_s
from rill.transports.http import ServerConfig, create_app
from rill.transports.realtime.quart_route import realtime_hub
from rill.transports.realtime.ws_listener import serve_ws

log = logging.getLogger("rill.server")


def hypercorn_config(host: str, port: int, grace_s: float, server: ServerConfig | None = None) -> hypercorn.Config:
    server = server or ServerConfig()
    config = hypercorn.Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.graceful_timeout = grace_s
    config.keep_alive_timeout = server.keep_alive_timeout_s  # also bounds the wait for a request's headers
    config.read_timeout = server.read_timeout_s
    config.h11_max_incomplete_size = server.max_header_bytes
    config.backlog = server.backlog
    config.websocket_ping_interval = server.realtime.ping_interval_s  # /v1/realtime keepalive
    config.accesslog = None  # rill logs one line per request itself
    config.errorlog = logging.getLogger("hypercorn.error")  # through the app's logging setup, once
    send_guard.install()
    setattr(config, send_guard.ATTRIBUTE, send_guard.SendGuard(server.send_timeout_s))
    return config


async def wait_for_stop_signal() -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            log.info("got %s: no new connections; letting streams in flight finish", signal.Signals(signum).name)
            return


async def serve(engine_config: EngineConfig | list[ServedModel], server_config: ServerConfig,
                host: str = "127.0.0.1", port: int = 8000, grace_s: float = 10.0, *, speech_model: str | None = None,
                tts_model: str | None = "espeak", speech_delay_ms: float | None = None, speech_early_stop: bool = True,
                shutdown_trigger=wait_for_stop_signal, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve until `shutdown_trigger` returns (by default: SIGINT or SIGTERM) or an engine dies.
    `engine_config`: one model, or several (rill.model_set), each on its own engine in this nursery.
    `speech_model` ("rill-tiny-speech", a directory, or None) runs the speech worker beside the LLM's;
    `tts_model` ("espeak", a Kokoro directory, or None/"none") the speech-out worker (the voice).
    `speech_delay_ms` (None: the model's) and `speech_early_stop` set a Voxtral Realtime speech model's
    transcription delay and whether its streams end at the first pad past the audio (VoxtralStream).
    task_status gets the bound URLs once the server listens. Returns the exit status: 1 when
    an engine died, else 0."""
    from rill.speech.async_speech import open_serving_speech  # torch and the Whisper runtime: only when serving
    from rill.tts.serving import open_serving_voice

    models = engine_config if isinstance(engine_config, list) else None
    configs = [engine_config] if models is None else [model.config for model in models]
    async with (open_engines(configs) as llms,
                open_serving_speech(speech_model, device=configs[0].device, delay_ms=speech_delay_ms,
                                    early_stop=speech_early_stop) as speech,
                open_serving_voice(tts_model) as voice,
                trio.open_nursery() as nursery):
        if models is None:
            app = create_app(engine=llms[0], server=server_config, speech=speech, speech_out=voice)
        else:
            app = create_app(server=server_config, speech=speech, speech_out=voice,
                             models=[(model.names, llm) for model, llm in zip(models, llms)])
        config = hypercorn_config(host, port, grace_s, server_config)
        realtime, stopping = server_config.realtime, trio.Event()
        engines = llms if speech is None else [*llms, speech]
        trigger = partial(_stop_then_set, shutdown_trigger, stopping, engines, partial(_bound_grace, app, config))
        binds = await nursery.start(partial(hypercorn_serve, app, config, shutdown_trigger=trigger))
        if realtime.ws_port is not None:  # the raw realtime listener stops when hypercorn starts to
            ws_url = await nursery.start(partial(serve_ws, realtime_hub(app), host, realtime.ws_port, stop=stopping))
            binds = [*binds, ws_url]
        freeze_startup_heap()  # models loaded, sockets bound: the rest of the heap is what requests make
        log.info("serving %s at %s", ", ".join(c.model for c in configs), ", ".join(binds))
        task_status.started(binds)
    thaw_heap()
    if (dead := _first_death(engines)) is not None:
        log.error("stopped: the engine died (%r); exiting 1 so that a supervisor restarts rill", dead)
        return 1
    log.info("stopped")
    return 0


@asynccontextmanager
async def open_engines(configs: list[EngineConfig]) -> AsyncIterator[list[AsyncEngine]]:
    """One engine per config, opened in order (each its own worker thread and KV cache); closed in reverse."""
    async with AsyncExitStack() as stack:
        yield [await stack.enter_async_context(open_engine(config)) for config in configs]


def _first_death(engines) -> BaseException | None:
    return next((e.dead for e in engines if e.dead is not None), None)


def _bound_grace(app, config: hypercorn.Config) -> None:
    """Shutdown starts now: streams still running just before the grace ends get an error event, and
    no write to a client (a full socket) outlives the grace, so the process exits within it."""
    deadline = trio.current_time() + config.graceful_timeout
    app.extensions["rill"].draining.end_at(deadline - cut_time_s(config.graceful_timeout))
    getattr(config, send_guard.ATTRIBUTE).stop_at(deadline)


async def _stop_then_set(shutdown_trigger, stopping: trio.Event, engines, on_stop=lambda: None) -> None:
    """Return when the shutdown trigger does or an engine (an LLM's, the speech one) dies, whichever first."""
    async with trio.open_nursery() as nursery:

        async def first(wait) -> None:
            await wait()
            nursery.cancel_scope.cancel()

        nursery.start_soon(first, shutdown_trigger)
        for engine in engines:
            nursery.start_soon(first, engine.died.wait)
    if _first_death(engines) is not None:
        log.error("the engine died: no new connections; requests in flight got an error")
    on_stop()
    stopping.set()


def run(engine_config: EngineConfig | list[ServedModel], server_config: ServerConfig, host: str, port: int,
        grace_s: float, speech_model: str | None = None, tts_model: str | None = "espeak", **speech_options) -> int:
    """`speech_options`: serve()'s speech_delay_ms and speech_early_stop."""
    return trio.run(partial(serve, engine_config, server_config, host, port, grace_s, speech_model=speech_model,
                            tts_model=tts_model, **speech_options))
