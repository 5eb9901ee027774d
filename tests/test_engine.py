"""EngineCore driven directly (no thread, no socket): batching, chunked prefill, prefix cache,
preemption, sliding window, abort, admission limits, streaming-input sessions."""

import os
import random
import re

import pytest
import torch

from helpers_models import make_model_dir
from rill.config import EngineConfig, default_kv_cache_bytes
from rill.engine.core import EngineCore
from rill.engine.model_runner import zeroed_cache
from rill.errors import ValidationError
from rill.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
# The same tests on a GPU: RILL_TEST_DEVICE=cuda (and RILL_TEST_CUDA_GRAPHS=1 to replay decode steps
# from CUDA graphs); benchmarks/gpu-run.sh runs them so.
DEVICE = {"device": os.environ.get("RILL_TEST_DEVICE", "cpu"), "cuda_graphs": bool(os.environ.get("RILL_TEST_CUDA_GRAPHS"))}


@pytest.fixture(scope="module")
def mistral_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("mistral"), "mistral")  # window 24


def engine(model_dir, **kw) -> EngineCore:
    return EngineCore(EngineConfig(model=str(model_dir), **{"num_kv_blocks": 256, **DEVICE, **kw}))


def run(core: EngineCore, requests: dict[str, tuple[list[int], SamplingParams]], max_steps=2000):
    for rid, (ids, params) in requests.items():
        core.add_request(rid, ids, params)
    out = {rid: [] for rid in requests}
    done = set()
    for _ in range(max_steps):
        for d in core.step():
            out[d.request_id].extend(d.token_ids)
            if d.finished:
                done.add(d.request_id)
        if len(done) == len(requests):
            return out
    raise AssertionError("requests did not finish")


def prompts(n, seed=0, lo=3, hi=90):
    rng = random.Random(seed)
    return [[rng.randrange(3, 400) for _ in range(rng.randrange(lo, hi))] for _ in range(n)]


def alone(model_dir, ids, params=GREEDY, **kw):
    return run(engine(model_dir, **kw), {"x": (ids, params)})["x"]


def test_greedy_output_is_identical_alone_and_batched_with_31_others(mistral_dir):
    ps = prompts(32)
    core = engine(mistral_dir)
    batched = run(core, {f"r{i}": (p, GREEDY) for i, p in enumerate(ps)})
    for i in (0, 7, 31):
        assert batched[f"r{i}"] == alone(mistral_dir, ps[i])
    assert core.block_manager.num_free_blocks == core.block_manager.num_blocks


def test_chunked_prefill_under_a_small_token_budget_gives_the_same_tokens(mistral_dir):
    p = prompts(1, seed=3, lo=80, hi=90)[0]
    assert alone(mistral_dir, p, max_num_batched_tokens=7) == alone(mistral_dir, p)


def test_prefix_cache_hits_do_not_change_greedy_output(mistral_dir):
    shared = prompts(1, seed=4, lo=70, hi=71)[0]
    core = engine(mistral_dir)
    first = run(core, {"a": (shared + [5, 6], GREEDY)})["a"]
    second = run(core, {"b": (shared + [5, 6], GREEDY)})["b"]
    assert core.block_manager.num_hit_tokens >= 64
    assert first == second == alone(mistral_dir, shared + [5, 6], enable_prefix_caching=False)


def test_preemption_by_recompute_keeps_greedy_output_and_never_deadlocks(mistral_dir):
    ps = prompts(12, seed=5, lo=30, hi=60)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    tight = engine(mistral_dir, num_kv_blocks=14, enable_prefix_caching=False)
    out = run(tight, {f"r{i}": (p, params) for i, p in enumerate(ps)})
    assert tight.stats.num_preemptions > 0
    for i in (0, 11):
        assert out[f"r{i}"] == alone(mistral_dir, ps[i], params)
    assert tight.block_manager.num_free_blocks == 14


def test_seeded_sampling_is_the_same_alone_and_in_a_batch(mistral_dir):
    seeded = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=16, seed=1234, ignore_eos=True)
    noisy = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)
    ps = prompts(8, seed=6)
    batch = {"s": (ps[0], seeded)} | {f"o{i}": (p, noisy) for i, p in enumerate(ps[1:])}
    assert run(engine(mistral_dir), batch)["s"] == alone(mistral_dir, ps[0], seeded)


def test_long_sequence_holds_at_most_window_blocks_plus_two(mistral_dir):
    core = engine(mistral_dir, max_num_batched_tokens=64)
    window, bs = core.window, core.config.block_size
    params = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
    core.add_request("long", prompts(1, seed=7, lo=600, hi=601)[0], params)
    peak = 0
    while core.requests:
        core.step()
        for seq in core.scheduler.running:
            peak = max(peak, len(seq.block_table) - seq.num_freed_blocks[0])
    assert peak <= -(-window // bs) + 2 + -(-64 // bs)  # a prefill chunk may add its own blocks
    assert core.block_manager.num_free_blocks == core.block_manager.num_blocks


def test_abort_frees_kv_at_once_and_is_idempotent(mistral_dir):
    core = engine(mistral_dir)
    core.add_request("a", prompts(1)[0], SamplingParams(max_tokens=50, ignore_eos=True))
    core.step()
    core.step()
    assert core.block_manager.num_free_blocks < core.block_manager.num_blocks
    assert core.abort("a") is True
    assert core.abort("a") is False
    assert core.block_manager.num_free_blocks == core.block_manager.num_blocks
    assert core.step() == []


def test_prompt_longer_than_the_model_is_rejected_with_the_numbers(mistral_dir):
    core = engine(mistral_dir, max_model_len=100)
    with pytest.raises(ValidationError, match="100 tokens.*the prompt has 100"):
        core.add_request("a", [5] * 100, GREEDY)
    core.add_request("ok", [5] * 99, SamplingParams(max_tokens=1))


def test_prompt_plus_max_tokens_past_the_limit_is_rejected(mistral_dir):
    core = engine(mistral_dir, max_model_len=100)
    core.add_request("at-limit", [5] * 90, SamplingParams(max_tokens=10))
    with pytest.raises(ValidationError, match="max_tokens is 11") as err:
        core.add_request("past", [5] * 90, SamplingParams(max_tokens=11))
    assert err.value.param == "max_tokens"


def test_request_that_can_never_fit_the_kv_cache_fails_at_admission(tmp_path):
    d = make_model_dir(tmp_path, "llama")  # no window: memory grows with length
    core = engine(d, num_kv_blocks=4)
    core.add_request("fits", [5] * 32, SamplingParams(max_tokens=32))
    with pytest.raises(ValidationError, match="KV blocks") as err:
        core.add_request("never", [5] * 32, SamplingParams(max_tokens=33))
    assert err.value.code == "kv_cache_too_small"


def test_a_windowed_request_far_longer_than_the_cache_runs_through_it(mistral_dir):
    core = engine(mistral_dir, num_kv_blocks=core_min_blocks(mistral_dir))
    ids = prompts(1, seed=9, lo=700, hi=701)[0]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    assert run(core, {"long": (ids, params)})["long"] == alone(mistral_dir, ids, params)
    assert core.block_manager.num_free_blocks == core.block_manager.num_blocks


def test_a_windowed_request_below_its_minimum_blocks_fails_at_admission(mistral_dir):
    small = engine(mistral_dir, num_kv_blocks=core_min_blocks(mistral_dir) - 1)
    with pytest.raises(ValidationError, match="KV blocks"):
        small.add_request("x", [5] * 200, GREEDY)


def core_min_blocks(model_dir) -> int:
    core = engine(model_dir)
    return core.min_blocks_per_seq(10**6)


def test_n_samples_are_independent_sequences(mistral_dir):
    core = engine(mistral_dir)
    params = SamplingParams(n=3, temperature=1.0, seed=3, max_tokens=8, ignore_eos=True)
    core.add_request("n", prompts(1)[0], params)
    outs = {0: [], 1: [], 2: []}
    while core.requests:
        for d in core.step():
            outs[d.index].extend(d.token_ids)
    assert all(len(v) == 8 for v in outs.values())
    assert len({tuple(v) for v in outs.values()}) > 1


# -- streaming-input sessions ------------------------------------------------------------------


def stream_session(core, rid, chunks, params=GREEDY, **kw):
    core.open_session(rid, params, **kw)
    for chunk in chunks:
        core.append_input(rid, chunk)
        core.step()
    core.finish_input(rid)
    tokens = []
    while rid in core.requests:
        for d in core.step():
            tokens.extend(d.token_ids)
    return tokens


def test_session_answer_equals_the_whole_prompt_sent_at_once(mistral_dir):
    # seed 19: every greedy choice leads by >= 0.17 in logprob. Seed 8's sixth token was a tie to
    # 2.4e-6, which a GPU's other summation order broke the other way (H200, 2026-11-26).
    p = prompts(1, seed=19, lo=100, hi=101)[0]
    core = engine(mistral_dir)
    chunks = [p[i : i + 9] for i in range(0, len(p), 9)]
    assert stream_session(core, "s", chunks) == alone(mistral_dir, p)
    assert core.block_manager.num_free_blocks == core.block_manager.num_blocks


def test_idle_sessions_past_max_num_seqs_yield_their_slots_and_still_answer_exactly(mistral_dir):
    """More open sessions than max_num_seqs used to fill every slot with idle sessions, so no new
    request (nor a later session's first chunk) was ever admitted: they waited forever."""
    p = prompts(7, seed=12, lo=20, hi=21)
    core = engine(mistral_dir, max_num_seqs=4)
    for i in range(6):
        core.open_session(f"s{i}", GREEDY)
        core.append_input(f"s{i}", p[i])
    for _ in range(10):
        core.step()
    assert len(core.scheduler.running) == 4 and core.scheduler.parked  # idle ones made room
    assert run(core, {"r": (p[6], GREEDY)}, max_steps=200)["r"] == alone(mistral_dir, p[6])
    core.finish_input("s0")  # a parked session recomputes its KV and answers as if never parked
    tokens = []
    while "s0" in core.requests:
        tokens += [t for d in core.step() if d.request_id == "s0" for t in d.token_ids]
    assert tokens == alone(mistral_dir, p[0])


def test_session_prefills_while_input_arrives_and_answers_in_one_step(mistral_dir):
    p = prompts(1, seed=9, lo=100, hi=101)[0]
    core = engine(mistral_dir)
    core.open_session("s", GREEDY)
    for i in range(0, 100, 10):
        core.append_input("s", p[i : i + 10])
        core.step()
    seq = core.requests["s"][0]
    assert seq.num_computed_tokens == 99  # all but the held-back last token
    core.finish_input("s")
    deltas = core.step()
    assert len(deltas) == 1 and len(deltas[0].token_ids) == 1  # first token after one step


@pytest.mark.parametrize("policy", [None, 50])
def test_start_policies_defer_prefill(mistral_dir, policy):
    p = prompts(1, seed=10, lo=80, hi=81)[0]
    core = engine(mistral_dir)
    core.open_session("s", GREEDY, start_after_tokens=policy)
    core.append_input("s", p[:40])
    core.step()
    assert core.requests["s"][0].num_computed_tokens == 0
    core.append_input("s", p[40:])
    core.step()
    started = core.requests["s"][0].num_computed_tokens > 0
    assert started == (policy == 50)
    core.finish_input("s")
    tokens = []
    while "s" in core.requests:
        for d in core.step():
            tokens.extend(d.token_ids)
    assert tokens == alone(mistral_dir, p)


def test_respond_per_chunk_answers_each_chunk_and_keeps_generated_tokens(mistral_dir):
    core = engine(mistral_dir)
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    core.open_session("s", params, respond_per_chunk=True)
    core.append_input("s", [11, 12, 13])
    turn = []
    for _ in range(20):
        deltas = core.step()
        turn += [t for d in deltas for t in d.token_ids]
        if any(d.turn_finish_reason for d in deltas):
            break
    assert len(turn) == 5
    seq = core.requests["s"][0]
    core.append_input("s", [14, 15])
    # generated tokens that reached the KV cache stay as prompt; the last sampled one is dropped
    assert seq.token_ids == [11, 12, 13] + turn[:4] + [14, 15]
    core.finish_input("s")
    final = []
    while "s" in core.requests:
        for d in core.step():
            final.extend(d.token_ids)
    assert final == alone(mistral_dir, [11, 12, 13] + turn[:4] + [14, 15], params)


def test_idle_session_is_preempted_under_kv_pressure_and_recomputed_on_input(tmp_path):
    llama_dir = make_model_dir(tmp_path, "llama")  # no window, so the idle session's blocks add up
    core = engine(llama_dir, num_kv_blocks=8, enable_prefix_caching=False)
    p = prompts(1, seed=11, lo=60, hi=61)[0]
    core.open_session("idle", GREEDY)
    core.append_input("idle", p[:40])
    core.step()
    assert core.requests["idle"][0].block_table
    busy = run(core, {"busy": (prompts(1, seed=12, lo=100, hi=101)[0], GREEDY)})["busy"]
    assert len(busy) == 12
    assert core.scheduler.parked and core.stats.num_preemptions >= 1
    core.append_input("idle", p[40:])
    core.finish_input("idle")
    tokens = []
    while "idle" in core.requests:
        for d in core.step():
            tokens.extend(d.token_ids)
    assert tokens == alone(llama_dir, p)


def test_stats_count_tokens_requests_cache_hits_and_latencies(mistral_dir):
    core = engine(mistral_dir)
    p = prompts(1, seed=11, lo=70, hi=71)[0]
    run(core, {"a": (p, GREEDY)})
    run(core, {"b": (p, GREEDY)})  # the same prompt again: its full blocks come from the cache
    snap = core.snapshot()
    assert snap.num_finished == 2 and snap.num_generation_tokens == 24
    assert snap.num_prompt_tokens == 140
    assert snap.prefix_cache_hit_tokens == 64 and 0 < snap.prefix_cache_hit_rate < 1
    assert snap.num_running == snap.num_waiting == 0 and snap.kv_usage == 0.0
    assert len(core.stats.ttft_s) == 2 and len(core.stats.itl_s) == 22 and len(core.stats.e2e_s) == 2
    assert all(t >= 0 for t in (*core.stats.ttft_s, *core.stats.itl_s, *core.stats.e2e_s))


def test_eos_ends_the_request_without_adding_its_text(mistral_dir):
    core = engine(mistral_dir)
    p = prompts(1, seed=12)[0]
    first = alone(mistral_dir, p, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))[0]
    core.eos_token_ids = frozenset({first})  # fault injection: make the first greedy token the EOS
    params = SamplingParams(temperature=0, max_tokens=5, skip_special_tokens=False)
    core.add_request("e", p, params)
    deltas = [d for _ in range(5) for d in core.step()]
    assert deltas[-1].finish_reason == "stop" and deltas[-1].token_ids == [first]
    assert "".join(d.text for d in deltas) == ""


def test_kv_budget_in_bytes_is_capped_by_what_max_num_seqs_can_use(mistral_dir):
    core = EngineCore(EngineConfig(model=str(mistral_dir), max_num_seqs=4, **DEVICE))  # default 2 GiB budget
    assert core.block_manager.num_blocks == 4 * core.max_blocks_per_seq(core.max_model_len)
    per_block = core.model_config.kv_bytes_per_token * core.config.block_size
    small = EngineCore(EngineConfig(model=str(mistral_dir), kv_cache_bytes=10 * per_block + 1, **DEVICE))
    assert small.block_manager.num_blocks == 10


def test_default_kv_budget_is_2_gib_or_an_eighth_of_the_machine(monkeypatch):
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert default_kv_cache_bytes() == min(2 << 30, memory // 8)
    monkeypatch.setattr(os, "sysconf", lambda name: 1 << 20 if name == "SC_PHYS_PAGES" else 4096)  # 4 GiB
    assert default_kv_cache_bytes() == 512 << 20


def _rss_bytes() -> int:
    return int(re.search(r"VmRSS:\s+(\d+)", open("/proc/self/status").read())[1]) * 1024


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the resident set from /proc")
def test_cpu_kv_cache_memory_is_committed_as_blocks_are_written_not_at_start():
    shape = (4096, 16, 8, 128)  # 4096 blocks of 16 tokens, 8 heads of 128: 256 MiB in float32
    before = _rss_bytes()
    cache = zeroed_cache(shape, torch.float32, torch.device("cpu"))
    assert _rss_bytes() - before < 32 << 20
    assert cache.shape == shape and cache.dtype == torch.float32
    assert not cache[0].any() and not cache[-1].any() and not cache[2048, 5].any()
    cache[7] = 1.5  # one block written: its pages, and no others, come in
    assert float(cache[7].sum()) == 1.5 * 16 * 8 * 128 and not cache[8].any()
    assert _rss_bytes() - before < 40 << 20
    half = zeroed_cache((4, 16, 2, 8), torch.bfloat16, torch.device("cpu"))
    assert half.dtype == torch.bfloat16 and not half.any()


def deltas_of(core: EngineCore, rid, ids, params, max_steps=200):
    core.add_request(rid, ids, params)
    out = []
    for _ in range(max_steps):
        out += [d for d in core.step() if d.request_id == rid]
        if out and out[-1].finished:
            return out
    raise AssertionError("the request did not finish")


def test_stop_token_id_ends_the_request_with_its_id_as_stop_reason(mistral_dir):
    p = prompts(1, seed=13)[0]
    greedy = alone(mistral_dir, p)
    stop = greedy[3]
    cut = greedy.index(stop)  # the first time it comes up
    deltas = deltas_of(engine(mistral_dir), "s", p, SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[stop]))
    assert [t for d in deltas for t in d.token_ids] == greedy[: cut + 1]
    assert (deltas[-1].finish_reason, deltas[-1].stop_reason) == ("stop", stop)
    assert [d.num_output_tokens for d in deltas] == list(range(1, cut + 2))
    assert all(d.finish_reason is None for d in deltas[:-1])


def test_max_tokens_and_the_model_length_end_the_request_as_length(mistral_dir):
    p = prompts(1, seed=14, lo=20, hi=21)[0]
    deltas = deltas_of(engine(mistral_dir), "m", p, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert len(deltas) == 4 and deltas[-1].finish_reason == "length" and deltas[-1].num_output_tokens == 4
    short = engine(mistral_dir, max_model_len=len(p) + 3)  # room for 3 outputs, max_tokens unset
    deltas = deltas_of(short, "l", p, SamplingParams(temperature=0, max_tokens=None, ignore_eos=True))
    assert len(deltas) == 3 and deltas[-1].finish_reason == "length"
    assert short.block_manager.num_free_blocks == short.block_manager.num_blocks


def test_streamed_text_is_what_the_detokenizer_makes_of_the_ids_fast_path_and_all(mistral_dir):
    # Random ids of a ByteLevel vocabulary mix tokens of whole characters (the step's table lookup,
    # Detokenizer.whole_texts) with bytes of split characters (held in the UTF-8 decoder): the text
    # streamed must be exactly what Detokenizer.add makes of the same ids one by one, with and without
    # stop strings (which take add's path for every token).
    from rill.tokenizer.detokenizer import Detokenizer

    core = engine(mistral_dir)
    sampled = SamplingParams(temperature=1.0, seed=3, max_tokens=150, ignore_eos=True, skip_special_tokens=False)
    stopped = SamplingParams(temperature=1.0, seed=3, max_tokens=150, ignore_eos=True, stop=["\u2603\u2603"])
    requests = {f"r{i}": (ids, sampled if i % 2 else stopped) for i, ids in enumerate(prompts(6, seed=21))}
    for rid, (ids, params) in requests.items():
        core.add_request(rid, ids, params)
    tokens, text, done = {rid: [] for rid in requests}, {rid: "" for rid in requests}, set()
    for _ in range(400):
        for d in core.step():
            tokens[d.request_id] += d.token_ids
            text[d.request_id] += d.text
            done |= {d.request_id} if d.finished else set()
        if len(done) == len(requests):
            break
    assert done == set(requests)
    table, split, whole = core.tokenizer.byte_texts(True), 0, 0
    for rid, (ids, params) in requests.items():
        reference = core._detokenizer(ids, params)
        assert isinstance(reference, Detokenizer)
        expected = "".join(reference.add(t) for t in tokens[rid]) + reference.flush()
        assert text[rid] == expected
        split += sum(t < len(table) and table[t] is None for t in tokens[rid])
        whole += sum(t < len(table) and bool(table[t]) for t in tokens[rid])
    assert split > 0 and whole > 0  # both paths ran
