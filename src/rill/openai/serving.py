"""What the chat and completion handlers share: the engine, the served model names, admission,
the per-request trace (one log line each), and running a request's prompts on the engine."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field

import msgspec
import trio

from rill.errors import ValidationError
from rill.live_video.config import LiveVideoConfig
from rill.live_video.stats import LiveVideoStats
from rill.media import MediaPolicy
from rill.openai.chat_media import DEFAULT_LIMITS as DEFAULT_MM_LIMITS
from rill.openai.errors import ApiError, bad_request, from_decode_error, from_exception
from rill.openai.chat_bodies import ModelCard
from rill.outputs import RequestDelta
from rill.sampling_params import SamplingParams
from rill.structured import Grammar, GrammarCompiler, GrammarSpec

log = logging.getLogger("rill.server")

TOOL_CALL_PARSERS = ("hermes",)
# Bodies past INLINE_BODY_BYTES are rendered and tokenized in a worker thread, at most
# PREPARE_THREADS at once per model: a 4 MB prompt took 7 s on the trio thread, and /health,
# every stream and realtime session waited. Smaller ones stay inline (no thread hop), so
# they never queue behind a large one.
INLINE_BODY_BYTES = 16 << 10
PREPARE_THREADS = 2
# Sequences one request may create (prompts x n). vLLM caps it too (VLLM_MAX_N_SEQUENCES, after
# CVE-2026-34756): without a cap a 1 KB completions call of 100 prompts x n=256 queued 25,339 sequences.
MAX_SEQUENCES_PER_REQUEST = 1024


@dataclass
class ServingOptions:
    served_model_names: list[str] = field(default_factory=list)  # empty: the engine's model argument
    tool_call_parser: str | None = "hermes"  # None: tool calls stay in the content
    reasoning_parser: str | None = None  # see reasoning_parser.REASONING_PARSERS
    max_waiting: int | None = None  # requests waiting for their first token; past it, 429
    media: MediaPolicy = field(default_factory=MediaPolicy)  # image and video sources and limits (rill.media)
    limit_mm_per_prompt: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_MM_LIMITS))
    live_video: LiveVideoConfig = field(default_factory=LiveVideoConfig)  # frame streams (rill.live_video)
    max_sequences_per_request: int = MAX_SEQUENCES_PER_REQUEST  # prompts x n; past it, 400


@dataclass
class RequestTrace:
    """One request's figures, logged once when it ends."""

    request_id: str
    endpoint: str
    start_s: float = field(default_factory=time.monotonic)
    num_prompt_tokens: int = 0
    num_generated_tokens: int = 0
    first_token_s: float | None = None
    status: int | None = None

    @property
    def ttft_ms(self) -> float | None:
        return None if self.first_token_s is None else (self.first_token_s - self.start_s) * 1e3

    def on_delta(self, delta: RequestDelta) -> None:
        if self.first_token_s is None and delta.token_ids:
            self.first_token_s = time.monotonic()
        self.num_generated_tokens += len(delta.token_ids)


# The trace of the request the current task serves, so that the transport's catch-all log line
# (for routes that make none) is not written a second time for one that does.
current_trace: ContextVar[RequestTrace | None] = ContextVar("rill_current_trace", default=None)


class Serving:
    """The engine, as the OpenAI handlers see it."""

    def __init__(self, engine, options: ServingOptions | None = None,
                 on_done: Callable[[RequestTrace], None] | None = None):
        self.engine = engine
        self.options = options or ServingOptions()
        self.tokenizer = engine.tokenizer
        self.model_names = self.options.served_model_names or [engine.core.config.model]
        self.max_model_len = engine.core.max_model_len
        self.vocab_size = engine.core.model_config.vocab_size
        self.generation_config = dict(engine.core.generation_config or {})
        self.num_awaiting_first_token = 0
        self._on_done = on_done
        self.created = int(time.time())
        self._grammars: GrammarCompiler | None = None
        self.mm_inputs = getattr(engine.core, "mm_inputs", None)  # a vision model's processor, else None
        self.live_video = LiveVideoStats()  # frame streams' counters, for /metrics
        self.prepare_limiter = trio.CapacityLimiter(PREPARE_THREADS)

    async def prepare(self, prepare: Callable, trace: RequestTrace, body: bytes):
        """prepare(self, trace, body): validate, render and tokenize; a large body in a worker thread."""
        if len(body) <= INLINE_BODY_BYTES:
            return prepare(self, trace, body)
        return await trio.to_thread.run_sync(prepare, self, trace, body, limiter=self.prepare_limiter)

    def media_parts(self):
        """A collector for one chat's images and videos (rill.openai.chat_media)."""
        from rill.openai.chat_media import MediaParts

        return MediaParts(self.mm_inputs is not None, dict(self.options.limit_mm_per_prompt))

    # -- checks before a request runs ------------------------------------------------------------------

    def check_model(self, name: str | None) -> str:
        if name is None:
            return self.model_names[0]
        if name not in self.model_names:
            raise ApiError(404, f"the model {name!r} does not exist; this server serves {self.model_names}",
                           param="model", code="model_not_found")
        return name

    def model_cards(self) -> list[ModelCard]:
        """GET /v1/models: one card per served name, each rooted at the model the engine loaded."""
        root = self.engine.core.config.model
        return [ModelCard(name, self.created, self.max_model_len, root=root,
                          input_modalities=self.input_modalities()) for name in self.model_names]

    def input_modalities(self) -> list[str]:
        """What the model reads: text; images with a processor (mm_inputs); video when that processor
        has a video config, the test rill.live_video.framing makes before it takes frames."""
        if self.mm_inputs is None:
            return ["text"]
        return ["text", "image", "video"] if hasattr(self.mm_inputs, "video_cfg") else ["text", "image"]

    def model_card(self, name: str) -> ModelCard:
        """GET /v1/models/{model}: the card as the list shows it; 404 model_not_found otherwise."""
        return self.model_cards()[self.model_names.index(self.check_model(name))]

    def check_ready(self) -> None:
        """503 when the engine is dead, 429 when too many requests wait for their first token."""
        if not self.engine.is_alive:
            raise ApiError(503, f"the engine is not running: {self.engine.dead!r}", code="engine_dead")
        limit = self.options.max_waiting
        if limit is not None and self.num_awaiting_first_token >= limit:
            raise ApiError(429, f"{self.num_awaiting_first_token} requests are already waiting (limit {limit}); "
                           "retry shortly", code="too_many_waiting_requests", headers={"Retry-After": "1"})

    def check_params(self, params: SamplingParams) -> None:
        params.check_vocab(self.vocab_size)
        max_n = self.engine.core.config.max_num_seqs  # one request's choices run as one batch at most
        if params.n > max_n:
            raise ValidationError(f"n is {params.n}; this server runs at most {max_n} sequences at once "
                                  "(--max-num-seqs)", "n", "invalid_value")

    def check_fan_out(self, num_prompts: int, n: int) -> None:
        """400 when one request asks for more sequences than --max-sequences-per-request."""
        limit = self.options.max_sequences_per_request
        if num_prompts * n > limit:
            raise bad_request(f"this request asks for {num_prompts} prompt(s) x n={n} = {num_prompts * n} sequences; "
                              f"this server runs at most {limit} for one request (--max-sequences-per-request)",
                              "n" if num_prompts == 1 else "prompt", "too_many_sequences")

    def compile_grammar(self, constraint: tuple[GrammarSpec, str] | None) -> Grammar | None:
        """The compiled grammar of a (spec, request field) pair, from the cache when it was seen before;
        a 400 naming the field when it cannot be enforced."""
        return None if constraint is None else self.grammars.compile(*constraint)

    @property
    def grammars(self) -> GrammarCompiler:
        """Made on first use: its vocabulary table costs about a second for a 150k vocabulary."""
        if self._grammars is None:
            self._grammars = GrammarCompiler(self.tokenizer, self.vocab_size, self.engine.core.eos_token_ids)
        return self._grammars

    def check_prompt_text(self, text: str, param: str) -> None:
        """400 at once, before tokenizing, for a prompt text sure to be longer than the context
        (rill.tokenizer.length_bound): tokenizing a 4 MB prompt costs seconds of CPU."""
        bound = getattr(self.tokenizer, "token_count_bound", None)
        num_tokens = 0 if bound is None else bound.at_least(text)
        if num_tokens >= self.max_model_len:
            raise bad_request(f"this model's maximum context length is {self.max_model_len} tokens; the prompt has "
                              f"{len(text)} characters, so at least {num_tokens} tokens", param,
                              "context_length_exceeded")

    def check_fits(self, num_prompt_tokens: int, max_tokens: int | None, prompt_param: str) -> None:
        try:
            self.engine.check_fits(num_prompt_tokens, max_tokens)
        except ValidationError as exc:
            param = prompt_param if exc.param in ("messages", "prompt") else exc.param
            raise bad_request(exc.message, param, exc.code) from exc

    # -- running ---------------------------------------------------------------------------------------

    def new_trace(self, endpoint: str, prefix: str) -> RequestTrace:
        trace = RequestTrace(f"{prefix}-{self.engine.new_request_id()}", endpoint)
        current_trace.set(trace)
        return trace

    async def run(self, trace: RequestTrace, prompts: list[list[int]], params: SamplingParams, mm_items=(),
                  ) -> AsyncIterator[tuple[int, RequestDelta]]:
        """Submit every prompt at once; yield (prompt index, delta), one prompt's stream after the
        other (the engine runs them together; later ones buffer). Leaving early aborts them all."""
        ids = [f"{trace.request_id}-{i}" for i in range(len(prompts))]
        waiting = set()
        try:
            recvs = []
            for request_id, prompt in zip(ids, prompts):
                recvs.append(self.engine.submit(request_id, prompt, params, mm_items))
                waiting.add(request_id)
                self.num_awaiting_first_token += 1
            for i, recv in enumerate(recvs):
                with recv:  # closed without a checkpoint, so no delivery lands on a closed channel
                    async for delta in recv:
                        if delta.request_id in waiting:
                            waiting.discard(delta.request_id)
                            self.num_awaiting_first_token -= 1
                        trace.on_delta(delta)
                        yield i, delta
        finally:
            self.num_awaiting_first_token -= len(waiting)
            for request_id in ids:
                self.engine.abort(request_id)

    def finish(self, trace: RequestTrace, status: int) -> None:
        """Log the request's one line (once) and report it to the metrics."""
        if trace.status is not None:
            return
        trace.status = status
        total_ms = (time.monotonic() - trace.start_s) * 1e3
        ttft = "-" if trace.ttft_ms is None else f"{trace.ttft_ms:.1f}"
        log.info("%s %s status=%d prompt_tokens=%d generated_tokens=%d ttft_ms=%s total_ms=%.1f model=%s",
                 trace.request_id, trace.endpoint, status, trace.num_prompt_tokens, trace.num_generated_tokens,
                 ttft, total_ms, self.model_names[0])
        if self._on_done is not None:
            self._on_done(trace)


def api_error(exc: BaseException) -> ApiError:
    """The client's view of a failure; failures rill did not expect are logged with their traceback."""
    error = from_exception(exc)
    if error.status >= 500 and not isinstance(exc, ApiError):
        log.error("request failed", exc_info=exc)
    return error


def decode_body(body: bytes, kind: type):
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.MsgspecError as exc:
        raise from_decode_error(exc) from exc
    except RecursionError as exc:  # msgspec's depth guard
        raise bad_request("the request body is nested too deeply to decode", code="invalid_json") from exc


def sampling_error(exc: ValidationError, renames: dict[str, str]) -> ApiError:
    """A SamplingParams error, its param renamed to the request field the client set."""
    return bad_request(exc.message, renames.get(exc.param, exc.param), exc.code)


def finish_reason(delta: RequestDelta) -> str | None:
    return delta.finish_reason if delta.finish_reason in ("stop", "length") else None
