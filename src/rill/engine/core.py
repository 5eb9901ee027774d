"""EngineCore: the synchronous, I/O-free heart of rill. One `step()` schedules, runs the
model once, samples, detokenizes and returns what changed. The worker thread drives it;
tests and the offline LLM can drive it directly."""

from __future__ import annotations

import logging
import time

import msgspec
import torch

from rill.config import EngineConfig, default_kv_cache_bytes
from rill.engine.block_manager import BlockManager
from rill.engine.cuda_graphs import MAX_GRAPH_BATCH
from rill.engine.kv_layout import KVLayout
from rill.engine.live_sessions import LiveSessions
from rill.engine.model_runner import ModelRunner
from rill.engine.pooling import Pooler, pool_spans
from rill.engine.prompt_logprobs import prompt_spans
from rill.engine.sampler import SampledToken, Sampler, make_generator
from rill.engine.scheduler import ScheduledBatch, Scheduler
from rill.engine.sequence import FinishReason, Sequence
from rill.engine.stats import EngineStats
from rill.engine.vision_step import start_vision
from rill.errors import ValidationError
from rill.models.loader import load
from rill.multimodal.mrope import MRopeLayout
from rill.outputs import RequestDelta, TokenLogprob
from rill.sampling_params import SamplingParams
from rill.tokenizer import Detokenizer, Tokenizer
from rill.tokenizer.piece_index import piece_index

log = logging.getLogger("rill.engine")


class EngineCore:
    def __init__(self, config: EngineConfig):
        self.config = config
        torch.manual_seed(config.seed)
        self.model_dir, self.model_config, self.generation_config, model = _load(config)
        try:
            self._start(config, model)
        except BaseException:
            _close(model)  # a tensor-parallel model's other ranks
            raise

    def _start(self, config: EngineConfig, model) -> None:
        self.kv_heads_per_rank = model.config.num_kv_heads  # all of them, unless tensor parallel
        self.tokenizer = Tokenizer.from_dir(self.model_dir, chat_template=config.chat_template)
        cfg = self.model_config
        self.max_model_len = min(config.max_model_len or cfg.max_position_embeddings, cfg.max_position_embeddings)
        self.window = cfg.sliding_window  # the one window when every layer slides with it
        self.kv_layout = KVLayout.for_windows(cfg.layer_windows)
        num_blocks = config.num_kv_blocks or self._blocks_for_budget(config.kv_cache_bytes or default_kv_cache_bytes())
        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching,
                                          self.kv_layout.group_windows)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, config.max_num_batched_tokens)
        eos = set(cfg.eos_token_ids) | ({self.tokenizer.eos_token_id} - {None})
        self.eos_token_ids = frozenset(eos)
        sampler = Sampler(self.eos_token_ids, cfg.vocab_size, piece_index(self.tokenizer))
        self.runner = ModelRunner(model, num_blocks, config.block_size, sampler, self.kv_layout)
        self.mm_inputs = None  # the image and video processor of a model with a vision tower (rill.multimodal)
        if cfg.vision is not None:
            self.mm_inputs, self.scheduler.vision = start_vision(self.model_dir, cfg, model, config)
        if config.tensor_parallel_size > 1:
            model.allocate_kv(num_blocks, config.block_size)  # the other ranks' shares: same block ids
        if self.runner.device.type == "cuda" and config.tensor_parallel_size == 1 and cfg.vision is None:
            log.info("compiled the attention kernels in %.1f s (a warm-up pass)", self.runner.warm_up())
        if config.cuda_graphs:
            max_batch = min(config.max_num_seqs, MAX_GRAPH_BATCH)
            seconds = self.runner.capture_decode_graphs(max_batch, -(-self.max_model_len // config.block_size) + 1)
            log.info("captured decode CUDA graphs for %d batch sizes up to %d in %.1f s",
                     len(self.runner.graphs.sizes), max_batch, seconds)
        self.requests: dict[str, list[Sequence]] = {}
        self.sessions: dict[str, Sequence] = {}  # streaming-input anchors not yet started
        self._pending: list[RequestDelta] = []  # deltas made between steps, returned by the next
        self._owed_prompt_logprobs: set[Sequence] = set()  # sequences still scoring their prompt
        self._pooling: set[Sequence] = set()  # pooling requests not yet answered (engine/pooling.py)
        self.live = LiveSessions(self)  # sessions with images or video: progress, rebase (live video)
        self.stats = EngineStats()

    # -- admission ----------------------------------------------------------------------------

    def _blocks_for_budget(self, kv_cache_bytes: int) -> int:
        """Blocks that fit the byte budget, but no more than max_num_seqs full-length sequences
        can use: a small model would otherwise allocate (and zero) the whole budget for nothing."""
        cfg = self.model_config
        page_bytes = self.kv_layout.page_bytes(self.config.block_size, self.kv_heads_per_rank, cfg.head_dim,
                                               cfg.dtype.itemsize)
        fit = kv_cache_bytes // page_bytes
        useful = self.config.max_num_seqs * self.max_blocks_per_seq(self.max_model_len)
        return max(1, min(fit, useful))

    def max_blocks_per_seq(self, num_tokens: int) -> int:
        """Blocks one sequence of num_tokens can hold at once (sliding windows bound theirs)."""
        return self.kv_layout.max_blocks(num_tokens, self.config.block_size, self.config.max_num_batched_tokens)

    def min_blocks_per_seq(self, num_tokens: int) -> int:
        """Blocks a sequence of num_tokens needs to make progress alone (KVLayout.min_blocks)."""
        return self.kv_layout.min_blocks(num_tokens, self.config.block_size)

    def check_fits(self, num_prompt_tokens: int, max_tokens: int | None) -> int:
        """Validate lengths; return the output budget (max_tokens capped by the model length)."""
        if num_prompt_tokens < 1:
            raise ValidationError("the prompt is empty", param="prompt")
        room = self.max_model_len - num_prompt_tokens
        if room < 1:
            raise ValidationError(
                f"this model's maximum context length is {self.max_model_len} tokens; the prompt has "
                f"{num_prompt_tokens} tokens",
                param="messages",
                code="context_length_exceeded",
            )
        if max_tokens is not None and max_tokens > room:
            raise ValidationError(
                f"this model's maximum context length is {self.max_model_len} tokens; the prompt has "
                f"{num_prompt_tokens} tokens and max_tokens is {max_tokens} ({num_prompt_tokens + max_tokens} in all)",
                param="max_tokens",
                code="context_length_exceeded",
            )
        budget = room if max_tokens is None else max_tokens
        needed = self.min_blocks_per_seq(num_prompt_tokens + budget)
        if needed > self.block_manager.num_blocks:
            raise ValidationError(
                f"the request needs {needed} KV blocks but the cache "
                f"has {self.block_manager.num_blocks}; lower max_tokens or raise the KV budget",
                param="max_tokens",
                code="kv_cache_too_small",
            )
        return budget

    def _new_sequences(self, request_id, prompt_token_ids, params, max_tokens, mm_items=(), **session,
                       ) -> list[Sequence]:
        if request_id in self.requests:
            raise ValidationError(f"request id {request_id!r} is already in use", param="request_id")
        layout = self._mm_layout(prompt_token_ids, mm_items)
        seqs = []
        for i in range(params.n):
            seed = None if params.seed is None else params.seed + i
            seqs.append(
                Sequence(
                    request_id, i, prompt_token_ids, params,
                    block_size=self.config.block_size, max_tokens=max_tokens,
                    detokenizer=self._detokenizer(prompt_token_ids, params),
                    generator=make_generator(seed), num_kv_groups=self.kv_layout.num_groups, **session,
                    matcher=None if params.grammar is None else params.grammar.new_matcher(),
                )
            )
            if mm_items:  # only then: a text sequence keeps the class defaults (Sequence.mm_items)
                seqs[-1].mm_items, seqs[-1].mrope = tuple(mm_items), layout
        self.requests[request_id] = seqs
        return seqs

    def _mm_layout(self, prompt_token_ids: list[int], mm_items) -> MRopeLayout | None:
        """Check a prompt's images and videos (expanded by self.mm_inputs); their M-RoPE layout."""
        if not mm_items:
            return None
        if self.mm_inputs is None:
            raise ValidationError("this model reads text only: images and videos are not supported",
                                  param="multi_modal_data", code="unsupported")
        for item in mm_items:
            if item.end > len(prompt_token_ids) or any(
                    t != self.mm_inputs.placeholder(item.kind) for t in prompt_token_ids[item.offset : item.end]):
                raise ValidationError(f"a {item.kind}'s placeholders are not at prompt[{item.offset}:{item.end}]",
                                      param="multi_modal_data")
        if self.model_config.mrope_section is None:  # LLaVA: plain 1-D positions, images or not
            return None
        return MRopeLayout(len(prompt_token_ids), list(mm_items), self.model_config.vision.merge_size)

    def _detokenizer(self, prompt_token_ids: list[int], params: SamplingParams) -> Detokenizer:
        return Detokenizer(
            self.tokenizer,
            prompt_token_ids,
            skip_special_tokens=params.skip_special_tokens,
            stop=params.stop,
            include_stop_str_in_output=params.include_stop_str_in_output,
        )

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    mm_items=()) -> None:
        """mm_items: the prompt's images and videos, placed (rill.multimodal: expand placeholders first)."""
        if params.pooling is not None:
            return self._add_pooling(request_id, prompt_token_ids, params)
        max_tokens = self.check_fits(len(prompt_token_ids), params.max_tokens)
        for seq in self._new_sequences(request_id, list(prompt_token_ids), params, max_tokens, mm_items):
            self.scheduler.add(seq)
            if seq.prompt_logprobs is not None:
                self._owed_prompt_logprobs.add(seq)
        self.stats.num_prompt_tokens += len(prompt_token_ids) * params.n

    def check_fits_pooling(self, num_prompt_tokens: int) -> None:
        """A pooling prompt generates nothing: it may fill the whole context, and no more."""
        if num_prompt_tokens < 1:
            raise ValidationError("the input is empty", param="input")
        if num_prompt_tokens > self.max_model_len:
            raise ValidationError(f"this model's maximum context length is {self.max_model_len} tokens; the input "
                                  f"has {num_prompt_tokens} tokens", param="input", code="context_length_exceeded")
        needed = self.min_blocks_per_seq(num_prompt_tokens)
        if needed > self.block_manager.num_blocks:
            raise ValidationError(f"the input needs {needed} KV blocks but the cache has "
                                  f"{self.block_manager.num_blocks}", param="input", code="kv_cache_too_small")

    def _add_pooling(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """A prefill-only request whose answer is its pooled hidden state (engine/pooling.py)."""
        if params.n != 1:
            raise ValidationError("a pooling request runs one sequence (n=1)", param="n")
        self.check_fits_pooling(len(prompt_token_ids))
        (seq,) = self._new_sequences(request_id, list(prompt_token_ids), params, 1)
        seq.pooler = Pooler(params.pooling)
        self._pooling.add(seq)
        self.scheduler.add(seq)
        self.stats.num_prompt_tokens += len(prompt_token_ids)

    # -- streaming-input sessions (anchor requests) ----------------------------------------------

    def open_session(
        self, request_id: str, params: SamplingParams, *, start_after_tokens: int | None = 1,
        respond_per_chunk: bool = False, prompt_token_ids: list[int] = (), mm_items=(),
    ) -> None:
        """A request whose prompt arrives in chunks. It joins the scheduler once it holds
        start_after_tokens tokens (None: only at end of input); until then it costs nothing."""
        if params.n != 1:
            raise ValidationError("streaming input supports n=1 only", param="n")
        if params.prompt_logprobs is not None:
            raise ValidationError("prompt logprobs need the whole prompt: streamed input does not support them",
                                  param="prompt_logprobs", code="unsupported")
        (seq,) = self._new_sequences(
            request_id, list(prompt_token_ids), params, params.max_tokens or self.max_model_len, mm_items,
            input_open=True, respond_per_chunk=respond_per_chunk, start_after_tokens=start_after_tokens,
        )
        self.sessions[request_id] = seq
        if mm_items:
            self.live.watch(seq)
        self._maybe_start(seq)

    def append_input(self, request_id: str, token_ids: list[int], mm_items=()) -> None:
        """mm_items: images or video pieces in token_ids, their offsets counted within token_ids."""
        seq = self._session_seq(request_id)
        if seq.num_tokens + len(token_ids) >= self.max_model_len:
            raise ValidationError(
                f"streamed input reaches {seq.num_tokens + len(token_ids)} tokens; this model's maximum "
                f"context length is {self.max_model_len}",
                param="input", code="context_length_exceeded",
            )
        if mm_items:
            self.live.watch(seq)
        self._extend(seq, token_ids, mm_items)
        self.live.on_append(seq, token_ids, mm_items)
        self.stats.num_prompt_tokens += len(token_ids)
        self._new_turn(seq)
        self._maybe_start(seq)

    def _extend(self, seq: Sequence, token_ids: list[int], mm_items=()) -> None:
        """Streamed input onto seq; its images or video placed, and the M-RoPE layout laid out again, so
        that every prompt token sits where it would in the whole prompt (text after a video included)."""
        seq.extend_input(token_ids)
        if not mm_items and seq.mrope is None:
            return
        base = seq.num_tokens - len(token_ids)
        items = seq.mm_items + tuple(item.at(base + item.offset) for item in mm_items)
        seq.mm_items, seq.mrope = items, self._mm_layout(seq.token_ids, items)
        if mm_items and self.sessions.get(seq.request_id) is not seq:
            self.scheduler.mm_seqs.add(seq)  # in the scheduler already: its steps now run the encoder

    def rebase_input(self, request_id: str, token_ids: list[int], mm_items=()) -> None:
        """Replace an open session's context by a shorter one (engine/live_sessions.py)."""
        self.live.rebase(self._session_seq(request_id), list(token_ids), tuple(mm_items))

    def finish_input(self, request_id: str, max_tokens: int | None = None) -> None:
        """End of input: the session answers (respond_at_end) or finishes its current turn."""
        seq = self.live.on_finish(self._session_seq(request_id))  # a caught-up rebase answers
        budget = self.check_fits(seq.num_tokens, max_tokens if max_tokens is not None else seq.params.max_tokens)
        seq.max_tokens = budget
        seq.input_open = False
        if seq.awaiting_input:  # respond_per_chunk, and the last chunk's answer is complete
            self._pending.append(self._delta(seq, [], "", None, FinishReason.STOP))
            self._end(seq, FinishReason.STOP)
            return
        if not seq.respond_per_chunk:
            self._new_turn(seq)
        self._maybe_start(seq)

    def _new_turn(self, seq: Sequence) -> None:
        """Output restarts after new input: fresh detokenizer, TTFT measured from now."""
        seq.output_start = seq.num_tokens
        seq.detokenizer = self._detokenizer(seq.token_ids, seq.params)
        seq.arrival_time, seq.first_token_time = time.monotonic(), None
        if seq.matcher is not None:
            seq.matcher.reset()  # each turn's answer matches the grammar on its own
        self.scheduler.unpark(seq)

    def _session_seq(self, request_id: str) -> Sequence:
        seqs = self.requests.get(request_id)
        if not seqs or not seqs[0].input_open:
            raise ValidationError(f"no open streaming session {request_id!r}", param="session_id")
        return seqs[0]

    def _maybe_start(self, seq: Sequence) -> None:
        if self.sessions.get(seq.request_id) is not seq or seq.num_tokens == 0:
            return
        threshold = seq.start_after_tokens
        if not seq.input_open or (threshold is not None and seq.num_tokens >= threshold):
            del self.sessions[seq.request_id]
            self.scheduler.add(seq)

    def abort(self, request_id: str) -> bool:
        """Idempotent: drop the request and free its KV now. Returns whether it was live."""
        self.live.forget(request_id)
        seqs = self.requests.pop(request_id, None)
        self.sessions.pop(request_id, None)
        if seqs is None:
            return False
        for seq in seqs:
            self._owed_prompt_logprobs.discard(seq)
            self._pooling.discard(seq)
            if not seq.is_finished:
                self.scheduler.remove(seq)
                seq.finish_reason = FinishReason.ABORT
        self.stats.num_aborted += 1
        return True

    @property
    def has_work(self) -> bool:
        return any(s.num_pending_tokens for s in self.scheduler.running) or bool(self.scheduler.waiting)

    # -- the step -------------------------------------------------------------------------------

    def step(self) -> list[RequestDelta]:
        t0 = time.perf_counter()
        pending, self._pending = self._pending, []
        batch = self.scheduler.schedule()
        self.stats.num_preemptions += batch.num_preempted
        if batch.is_empty:
            return pending
        if batch.has_mm:
            batch.mm = self.scheduler.vision.prepare(batch)  # runs the vision encoder for the step's images
            if self.scheduler.vision.num_step_tokens:
                self.stats.encoder_tokens.append(self.scheduler.vision.num_step_tokens)
        sampling, pooled, pools = batch.sampling, [], []
        if self._pooling:  # prefill-only requests: pooled hidden states, no token sampled for them
            pools = pool_spans(batch)
            pooled = [seq for seq in sampling if seq.pooler is not None]
            sampling = [seq for seq in sampling if seq.pooler is None] if pooled else sampling
        if self._owed_prompt_logprobs or pools:
            sampled, scored = self._execute_scoring_prompts(batch, sampling, pools)
        else:
            sampled, scored = self.runner.execute(batch, sampling), None
        self._advance(batch)
        if batch.has_mm:
            self.scheduler.vision.after_step(batch)
        if self.live.shadows:
            self.live.after_step()  # rebases whose shorter context caught up take effect
        deltas = self._on_tokens(sampling, sampled, time.monotonic())  # one clock read for the step's tokens
        if scored:
            deltas = self._with_prompt_logprobs(sampling, deltas, scored)
        deltas += [self._pooled_delta(seq) for seq in pooled]
        self.stats.record_step(time.perf_counter() - t0, sum(batch.num_new_tokens))
        return pending + deltas

    def _execute_scoring_prompts(self, batch: ScheduledBatch, sampling: list[Sequence], pools=()):
        """Run the step scoring the prompt tokens it computes for sequences that asked, and pooling
        the hidden states of `pools` (engine/pooling.py); return the sampled tokens and the sequences
        whose prompt is now fully scored and that sample now (their first token's delta carries the
        prompt logprobs)."""
        spans = prompt_spans(batch, self._owed_prompt_logprobs) if self._owed_prompt_logprobs else []
        sampled, logprobs = self.runner.execute_scoring_prompts(batch, sampling, spans, pools)
        for span, values in zip(spans, logprobs):
            span.seq.prompt_logprobs.extend(values)
        done = {seq for seq in sampling if seq in self._owed_prompt_logprobs and not seq.num_prompt_logprobs_owed}
        self._owed_prompt_logprobs -= done
        return sampled, done

    def _with_prompt_logprobs(self, sampling: list[Sequence], deltas: list[RequestDelta], done: set[Sequence],
                              ) -> list[RequestDelta]:
        for i, seq in enumerate(sampling):
            if seq in done:
                deltas[i] = msgspec.structs.replace(deltas[i], prompt_logprobs=seq.prompt_logprobs)
                seq.prompt_logprobs = None  # handed out: a recompute after preemption scores nothing again
        return deltas

    def _advance(self, batch: ScheduledBatch) -> None:
        on_computed = self.block_manager.on_computed
        if self.kv_layout.num_groups > 1:  # several windows: on_computed checks each
            for seq, n, before in zip(batch.seqs, batch.num_new_tokens, batch.num_computed):
                seq.num_computed_tokens = before + n
                on_computed(seq, before)
            return
        # Per sequence per step: BlockManager.on_computed's two checks inline, so that the call
        # is made only when a block filled up or one may have left the window (rare in decode).
        window, bs = self.window, self.config.block_size
        for seq, n, before in zip(batch.seqs, batch.num_new_tokens, batch.num_computed):
            after = seq.num_computed_tokens = before + n
            if after // bs != before // bs or (
                window is not None and (after - window + 1) // bs > seq.num_freed_blocks[0]
            ):
                on_computed(seq, before)

    def _on_tokens(self, sampling: list[Sequence], sampled: list[SampledToken], now: float) -> list[RequestDelta]:
        """Each sampled token onto its sequence: counters, finish checks, text, the step's deltas.

        The loop runs for every sampled token of every step (1,024 of them a step at 1,024 running
        requests), so it is one loop with its lookups hoisted, and the finish checks are made inline
        before any call (most tokens end nothing). A token whose bytes are whole characters, for a
        detokenizer with nothing held and no stop strings, is one table lookup (Detokenizer.whole_texts);
        any other goes through Detokenizer.add."""
        stats, eos_ids, max_len = self.stats, self.eos_token_ids, self.max_model_len
        itl = stats.itl_s.append  # per token: no method call on stats
        stats.num_generation_tokens += len(sampled)
        deltas = []
        for seq, tok in zip(sampling, sampled):
            token_id, token_ids = tok.token_id, seq.token_ids
            if seq.first_token_time is None:
                seq.first_token_time = now
                stats.record_ttft(now - seq.arrival_time)
            else:
                itl(now - seq.last_token_time)
            seq.last_token_time = now
            token_ids.append(token_id)
            params, detokenizer, matcher = seq.params, seq.detokenizer, seq.matcher
            # A grammar that is complete (or broken) ends the output: its matcher is then stopped.
            grammar_done = matcher is not None and _advance_matcher(matcher, token_id)
            num_output = len(token_ids) - seq.output_start
            min_reached = num_output > params.min_tokens
            reason = None
            # An EOS that ends the request is not text (as in vLLM); other special tokens go through
            # the detokenizer, which drops them when skip_special_tokens.
            if token_id in eos_ids and not params.ignore_eos and min_reached:
                text, reason = "", FinishReason.STOP
            else:
                texts = detokenizer.whole_texts
                text = None
                if texts is not None and not detokenizer.utf8_held and token_id < len(texts):
                    text = texts[token_id]
                if text is None:
                    text = detokenizer.add(token_id)
                elif text:
                    detokenizer.pieces.append(text)
                if (num_output >= seq.max_tokens or detokenizer.stop_reason is not None or grammar_done
                        or len(token_ids) >= max_len or token_id in params.stop_token_ids):
                    reason = self._finish_reason(seq, token_id, min_reached, num_output)
            logprobs = None
            if params.logprobs is not None:
                logprobs = [TokenLogprob(token_id, tok.logprob, tok.rank, tok.top_logprobs)]
            if reason is None:
                deltas.append(RequestDelta(seq.request_id, seq.index, [token_id], text, logprobs, None, None, None,
                                           seq.num_prompt_tokens, seq.num_cached_tokens, num_output))
                continue
            if seq.stop_reason is None or isinstance(seq.stop_reason, int):
                text += detokenizer.flush()
            deltas.append(self._delta(seq, [token_id], text, logprobs, reason))
            self._end(seq, reason)
        return deltas

    def _pooled_delta(self, seq: Sequence) -> RequestDelta:
        """The one delta of a pooling request, whose prompt is now computed: its vector, and the end."""
        self._pooling.discard(seq)
        delta = RequestDelta(seq.request_id, seq.index, [], "", finish_reason=FinishReason.STOP.value,
                             num_prompt_tokens=seq.num_prompt_tokens, num_cached_tokens=seq.num_cached_tokens,
                             embedding=seq.pooler.result())
        self._end(seq, FinishReason.STOP)
        return delta

    def _delta(self, seq, token_ids, text, logprobs, reason: FinishReason) -> RequestDelta:
        """The delta that ends the request, or the turn (mid-stream ones are built in _on_tokens)."""
        finish_reason = turn_finish_reason = None
        if self._ends_turn_only(seq):
            turn_finish_reason = reason.value
        else:
            finish_reason = reason.value
        return RequestDelta(
            seq.request_id, seq.index, token_ids, text, logprobs,
            finish_reason=finish_reason, turn_finish_reason=turn_finish_reason, stop_reason=seq.stop_reason,
            num_prompt_tokens=seq.num_prompt_tokens, num_cached_tokens=seq.num_cached_tokens,
            num_output_tokens=seq.num_output_tokens,
        )

    def _finish_reason(self, seq: Sequence, token_id: int, min_reached: bool, num_output: int) -> FinishReason | None:
        """Why seq ends after token_id (not an ending EOS: the caller checked that), or None."""
        params = seq.params
        if token_id in params.stop_token_ids and min_reached:
            seq.stop_reason = token_id
            return FinishReason.STOP
        if seq.detokenizer.stop_reason is not None:
            seq.stop_reason = seq.detokenizer.stop_reason
            return FinishReason.STOP
        if seq.matcher is not None and _matcher_done(seq.matcher):
            return FinishReason.STOP  # the output is complete: the grammar allows nothing more
        if num_output >= seq.max_tokens or len(seq.token_ids) >= self.max_model_len:
            return FinishReason.LENGTH
        return None

    def _ends_turn_only(self, seq: Sequence) -> bool:
        return seq.input_open and seq.respond_per_chunk

    def _end(self, seq: Sequence, reason: FinishReason) -> None:
        if self._ends_turn_only(seq):
            seq.awaiting_input = True  # the session lives on; its KV stays for the next chunk
            return
        seq.finish_reason = reason
        self.stats.record_e2e(time.monotonic() - seq.arrival_time)
        self.scheduler.remove(seq)
        seqs = self.requests.get(seq.request_id, [])
        if all(s.is_finished for s in seqs):
            self.requests.pop(seq.request_id, None)
            self.stats.num_finished += 1

    # -- tensor-parallel ranks ---------------------------------------------------------------------

    def watch_ranks(self, on_failure) -> None:
        """on_failure(error), from another thread, when one of a tensor-parallel engine's ranks dies."""
        if self.config.tensor_parallel_size > 1:
            self.runner.model.watch(on_failure)

    def close(self) -> None:
        """Stop the engine's other ranks (tensor parallelism); a one-process engine has none. Idempotent."""
        _close(getattr(self.runner, "model", None))

    # -- stats ------------------------------------------------------------------------------------

    def snapshot(self):
        live = self.live
        return self.stats.snapshot(self.scheduler, self.block_manager, live.progress() if live.seqs else None,
                                   live.num_rebased)


def _load(config: EngineConfig):
    """(model dir, model config, generation config, decoder). With tensor parallelism the decoder is
    rank 0's shard, which drives the other ranks (rill.distributed.driver)."""
    if config.tensor_parallel_size == 1:
        return load(config.model, config.dtype, config.device)
    from rill.distributed.driver import load_tensor_parallel

    return load_tensor_parallel(config)


def _close(model) -> None:
    close = getattr(model, "close", None)  # only a tensor-parallel driver has processes to stop
    if close is not None:
        close()


def _advance_matcher(matcher, token_id: int) -> bool:
    """Feed the committed token to the sequence's grammar matcher; True when the grammar allows nothing
    after it (complete, or in error: a token it did not allow, which the sampler's mask prevents)."""
    matcher.consume_token(token_id)
    return _matcher_done(matcher)


def _matcher_done(matcher) -> bool:
    return matcher.is_stopped() or matcher.is_error()
