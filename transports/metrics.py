"""GET /metrics: the engine's state and the server's latencies in the Prometheus text format.

Gauges and counters are read from the engine's per-step stats snapshot at scrape time; the
latency histograms are fed from the engine's recent-latency queues, drained at each scrape and
when a request ends (the engine appends in its thread; deque appends and pops are atomic).

One model: the series carry no model label (as they always have). Several models (rill serve
--model A --model B): each engine's series carry `model_name`, its first served name, as vLLM's do;
the server's own series (HTTP requests, sessions, realtime, responses) stay unlabelled."""

from __future__ import annotations

from collections import deque

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0,
                      20.0, 40.0, 80.0)
_ENCODER_TOKEN_BUCKETS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
_RTF_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0, 10.0)

_GAUGES = (
    ("rill_num_requests_running", "Sequences in the running batch.", "num_running"),
    ("rill_num_requests_waiting", "Sequences waiting to be scheduled.", "num_waiting"),
    ("rill_num_sessions_parked", "Streaming-input sessions waiting for input.", "num_parked"),
    ("rill_kv_cache_usage_ratio", "Fraction of KV blocks in use (0-1).", "kv_usage"),
    ("rill_kv_cache_free_blocks", "KV blocks free.", "num_free_kv_blocks"),
    ("rill_kv_cache_blocks", "KV blocks in all.", "num_kv_blocks"),
    ("rill_prefix_cache_hit_rate", "Prompt tokens found in the prefix cache / tokens looked up.",
     "prefix_cache_hit_rate"),
    ("rill_encoder_cache_entries", "Images and video frames whose encoder output is kept.", "encoder_cache_entries"),
    ("rill_encoder_cache_tokens", "Encoder output embeddings kept in the encoder cache.", "encoder_cache_tokens"),
)
_COUNTERS = (
    ("rill_prompt_tokens", "Prompt tokens received.", "num_prompt_tokens"),
    ("rill_generation_tokens", "Tokens generated.", "num_generation_tokens"),
    ("rill_prefix_cache_queries_tokens", "Prompt tokens looked up in the prefix cache.", "prefix_cache_queried_tokens"),
    ("rill_prefix_cache_hits_tokens", "Prompt tokens found in the prefix cache.", "prefix_cache_hit_tokens"),
    ("rill_num_preemptions", "Sequences preempted for KV space.", "num_preemptions"),
    ("rill_requests_finished", "Engine requests that finished.", "num_finished"),
    ("rill_requests_aborted", "Engine requests aborted.", "num_aborted"),
    ("rill_engine_steps", "Engine steps run.", "num_steps"),
    ("rill_encoder_cache_hits", "Images (and video items) a sequence needed that the encoder cache had, or that "
     "another sequence encoded in the same step.", "encoder_cache_hits"),
    ("rill_encoder_cache_misses", "Images (and video items) a sequence needed that the vision encoder ran for.",
     "encoder_cache_misses"),
    ("rill_encoder_tokens", "Embeddings the vision encoder computed.", "num_encoder_tokens"),
)


class _PerModel:
    """Families with one sample per engine: unlabelled for one model, `model_name` for several."""

    def __init__(self, labelled: bool):
        self.labelled = labelled
        self.engines: list[tuple[object, str]] = []  # (engine, model_name)

    def family(self, kind, name: str, text: str, value_of):
        if not self.labelled:
            return kind(name, text, value=value_of(self.engines[0][0]))
        family = kind(name, text, labels=["model_name"])
        for engine, model in self.engines:
            family.add_metric([model], value_of(engine))
        return family


class _EngineCollector(_PerModel):
    def collect(self):
        for name, text, attr in _GAUGES:
            yield self.family(GaugeMetricFamily, name, text, lambda e, a=attr: float(getattr(e.stats, a)))
        for name, text, attr in _COUNTERS:
            yield self.family(CounterMetricFamily, name, text, lambda e, a=attr: getattr(e.stats, a))
        yield self.family(GaugeMetricFamily, "rill_engine_alive", "1 while the engine's worker runs.",
                          lambda e: 1.0 if e.is_alive else 0.0)


class _SessionCollector:
    """Streaming-input sessions (rill.sessions.SessionManager), read at scrape time."""

    def __init__(self, manager):
        self.manager = manager

    def collect(self):
        m = self.manager
        yield GaugeMetricFamily("rill_streaming_sessions_open", "Streaming-input sessions open.", value=m.num_open)
        for name, text, value in (
            ("rill_streaming_sessions_opened", "Streaming-input sessions opened.", m.num_opened),
            ("rill_streaming_sessions_started", "Sessions whose prefill started.", m.num_started),
            ("rill_streaming_sessions_expired", "Sessions closed idle past their timeout.", m.num_expired),
            ("rill_streaming_input_chunks", "Input chunks received (repeats excluded).", m.num_chunks_received),
            ("rill_streaming_input_bytes", "Input payload bytes received.", m.num_bytes_received),
        ):
            yield CounterMetricFamily(name, text, value=value)


class _RealtimeCollector:
    """Realtime connections open on both listeners (the hub's one count), read at scrape time."""

    def __init__(self, hub):
        self.hub = hub

    def collect(self):
        yield GaugeMetricFamily("rill_realtime_connections_open", "Realtime WebSocket connections open (both listeners).",
                                value=self.hub.num_connections)


class _ResponsesCollector:
    """Stored responses and background runs (rill.openai.responses_api.background.Responses)."""

    def __init__(self, responses):
        self.responses = responses

    def collect(self):
        store, runs = self.responses.store, self.responses.runs
        yield GaugeMetricFamily("rill_responses_stored", "Responses kept for GET and previous_response_id.",
                                value=len(store))
        yield GaugeMetricFamily("rill_responses_background_running", "Background responses running.",
                                value=runs.num_running)
        for name, text, value in (
            ("rill_responses_background_started", "Background responses started.", runs.num_started),
            ("rill_responses_background_cancelled", "Background responses cancelled or deleted while running.",
             runs.num_cancelled),
            ("rill_responses_evicted", "Stored responses evicted by --responses-max-stored or -max-age-s.",
             store.num_evicted),
        ):
            yield CounterMetricFamily(name, text, value=value)


class _LiveVideoCollector(_PerModel):
    """Frame streams (rill.live_video): each Serving's LiveVideoStats and its engine's rebases, at scrape time."""

    def __init__(self, labelled: bool):
        super().__init__(labelled)
        self.stats: dict[int, object] = {}  # id(engine) -> its Serving's LiveVideoStats

    def collect(self):
        from rill.live_video.stats import METRICS

        for name, text, attr in METRICS:
            yield self.family(CounterMetricFamily, name, text, lambda e, a=attr: getattr(self.stats[id(e)], a))
        yield self.family(GaugeMetricFamily, "rill_live_video_open_feeds", "Live video feeds open.",
                          lambda e: float(self.stats[id(e)].num_open_feeds))
        yield self.family(CounterMetricFamily, "rill_live_video_rebases_applied",
                          "Rebases that took effect in the engine.", lambda e: e.stats.num_rebased)


class Metrics:
    def __init__(self, label_models: bool = False):
        self.registry = CollectorRegistry()
        self._labels = ["model_name"] if label_models else []  # on the engines' latency histograms
        self.ttft = self._histogram("rill_time_to_first_token_seconds", "Time to first token.")
        self.itl = self._histogram("rill_inter_token_latency_seconds", "Time between output tokens.")
        self.e2e = self._histogram("rill_e2e_request_latency_seconds", "Request time in the engine, end to end.")
        self.encoder_tokens = Histogram("rill_encoder_tokens_per_step", "Embeddings the vision encoder computed in "
                                        "a step that ran it (bounded by --max-num-encoder-tokens, but for an item "
                                        "larger than that, which runs alone).", self._labels,
                                        buckets=_ENCODER_TOKEN_BUCKETS, registry=self.registry)
        self.requests = Counter("rill_http_requests", "HTTP requests answered.", ["endpoint", "status"],
                                registry=self.registry)
        self.ttft_after_input = self._histogram("rill_streaming_input_ttft_after_end_seconds",
                                                "Time from a session's end of input to its first token.",
                                                per_model=False)  # the sessions' manager serves every model
        # POST /v1/audio/transcriptions (transports/audio_http.py)
        self.transcriptions = Counter("rill_transcription_requests", "Transcription requests answered.", ["status"],
                                      registry=self.registry)
        self.audio_seconds = Counter("rill_transcription_audio_seconds", "Seconds of audio transcribed.",
                                     registry=self.registry)
        self.real_time_factor = Histogram("rill_transcription_real_time_factor",
                                          "Time to transcribe a recording, once uploaded and decoded, / its length "
                                          "(below 1: faster than real time).",
                                          buckets=_RTF_BUCKETS, registry=self.registry)
        # POST /v1/audio/speech (transports/speech_http.py)
        self.speech_requests = Counter("rill_speech_requests", "Speech (text-to-speech) requests answered.",
                                       ["status"], registry=self.registry)
        self.speech_characters = Counter("rill_speech_input_characters", "Characters of text spoken.",
                                         registry=self.registry)
        self.speech_audio_seconds = Counter("rill_speech_audio_seconds", "Seconds of audio spoken.",
                                            registry=self.registry)
        self.speech_real_time_factor = Histogram("rill_speech_real_time_factor",
                                                 "Time to speak a text / its audio's length (below 1: faster than "
                                                 "real time).", buckets=_RTF_BUCKETS, registry=self.registry)
        self.speech_first_audio = Histogram("rill_speech_time_to_first_audio_seconds",
                                            "Time from a speech request to its first audio bytes.",
                                            buckets=_LATENCY_BUCKETS_S, registry=self.registry)
        self._engines = _EngineCollector(bool(self._labels))
        self._live_video = _LiveVideoCollector(bool(self._labels))
        self._sessions = None

    def _histogram(self, name: str, text: str, per_model: bool = True) -> Histogram:
        labels = self._labels if per_model else []
        return Histogram(name, text, labels, buckets=_LATENCY_BUCKETS_S, registry=self.registry)

    def attach(self, engine, model_name: str = "") -> None:
        """An engine's series (model_name labels them when there are several)."""
        if not self._engines.engines:
            self.registry.register(self._engines)
        self._engines.engines.append((engine, model_name))

    def attach_live_video(self, stats, engine=None, model_name: str = "") -> None:
        """A Serving's frame-stream counters, beside its engine's (the engine attached last by default)."""
        engine = engine if engine is not None else self._engines.engines[-1][0]
        if not self._live_video.engines:
            self.registry.register(self._live_video)
        self._live_video.engines.append((engine, model_name))
        self._live_video.stats[id(engine)] = stats

    def attach_realtime(self, hub) -> None:
        self.registry.register(_RealtimeCollector(hub))

    def attach_responses(self, responses) -> None:
        self.registry.register(_ResponsesCollector(responses))

    def attach_sessions(self, manager) -> None:
        self._sessions = manager
        self.registry.register(_SessionCollector(manager))

    def on_transcription(self, status: int, audio_s: float, elapsed_s: float) -> None:
        self.transcriptions.labels(str(status)).inc()
        if status == 200 and audio_s > 0:
            self.audio_seconds.inc(audio_s)
            self.real_time_factor.observe(elapsed_s / audio_s)

    def on_request_done(self, trace) -> None:
        self.requests.labels(trace.endpoint, str(trace.status)).inc()
        self.drain()

    def drain(self) -> None:
        for engine, model_name in self._engines.engines:
            stats = engine.core.stats
            for queue, histogram in ((stats.ttft_s, self.ttft), (stats.itl_s, self.itl), (stats.e2e_s, self.e2e),
                                     (stats.encoder_tokens, self.encoder_tokens)):
                _drain(queue, histogram.labels(model_name) if self._labels else histogram)
        if self._sessions is not None:
            _drain(self._sessions.ttft_after_input_s, self.ttft_after_input)

    def render(self) -> bytes:
        self.drain()
        return generate_latest(self.registry)


def _drain(queue: deque, histogram: Histogram) -> None:
    while queue:
        histogram.observe(queue.popleft())
